"""The quota ledger's contract, on the embedded ledger and on Redis (standalone, Sentinel,
Cluster): compare-and-set takes, tickets bound to reservations, leases, commits and drops, and
a race where many threads take one cohort's quota at once without overrunning it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.adapters.store.memory_quota import MemoryQuotaLedger
from services.allocator.adapters.store.redis_quota import RedisQuotaLedger
from services.allocator.adapters.store.redis_store import RedisReservationStore
from services.allocator.core import ConsumedUsage
from services.allocator.reservations.model import PREEMPTED_MEMORY_SECONDS, reserve_placement
from services.allocator.reservations.quota_ledger import (
    QuotaEntry,
    QuotaLedger,
    Ticket,
    TicketBinding,
    usage_by_tenant,
)
from services.common.errors import NotFound, Preempted, Unavailable
from tests.conftest import RedisServerFactory
from tests.contract.conftest import (
    REDIS_URL_FIXTURES,
    STORE_KINDS,
    FakeClock,
    device,
    reserve_request,
)

SHORT = 0.5
PAST_SHORT = 0.6


@dataclass
class LedgerUnderTest:
    ledger: QuotaLedger
    wait: Callable[[float], None]


@pytest.fixture(params=STORE_KINDS)
def under_test(request: pytest.FixtureRequest) -> Iterator[LedgerUnderTest]:
    if request.param == "memory":
        clock = FakeClock()
        yield LedgerUnderTest(MemoryQuotaLedger(clock), clock.advance)
        return
    url: str = request.getfixturevalue(REDIS_URL_FIXTURES[request.param])
    prefix = f"quota-test-{time.monotonic_ns()}"  # a fresh keyspace per test on shared servers
    store = RedisReservationStore(url, key_prefix=prefix, socket_timeout=2.0)
    try:
        yield LedgerUnderTest(RedisQuotaLedger(store), time.sleep)
    finally:
        store.close()


def entry(entry_id: str, tenant: str = "a", gpus: int = 1000) -> QuotaEntry:
    return QuotaEntry(entry_id, tenant, {"gpus": gpus}, None)


def test_take_is_a_compare_and_set_on_the_version(under_test: LedgerUnderTest) -> None:
    ledger = under_test.ledger
    first = ledger.read("cohort:x")
    assert first.entries == ()
    assert ledger.take("cohort:x", first.version, [Ticket(entry("ticket:1"), 60)])
    assert not ledger.take("cohort:x", first.version, [Ticket(entry("ticket:2"), 60)])  # stale
    second = ledger.read("cohort:x")
    assert second.version > first.version
    assert [e.id for e in second.entries] == ["ticket:1"]
    assert ledger.read("cohort:y").entries == ()  # cohorts are apart


def test_bind_replaces_the_ticket_and_keeps_its_expiry(under_test: LedgerUnderTest) -> None:
    ledger = under_test.ledger
    ledger.take("c", ledger.read("c").version, [Ticket(entry("ticket:t", gpus=3000), SHORT)])
    parts = (entry("res-1@n1", gpus=2000), entry("res-2@pool", gpus=1000))
    ledger.bind("c", [TicketBinding("ticket:t", parts, 60)])
    found = ledger.read("c").entries
    assert [(e.id, e.amounts["gpus"]) for e in found] == [("res-1@n1", 2000), ("res-2@pool", 1000)]
    under_test.wait(PAST_SHORT)
    assert ledger.read("c").entries == ()  # the ticket's short expiry, not the fallback


def test_bind_leaves_an_existing_entry_alone(under_test: LedgerUnderTest) -> None:
    ledger = under_test.ledger
    ledger.take("c", ledger.read("c").version, [Ticket(entry("ticket:t1"), 60)])
    ledger.bind("c", [TicketBinding("ticket:t1", (entry("res-1@n"),), 60)])
    assert ledger.commit("c", "res-1@n")
    ledger.take(
        "c", ledger.read("c").version, [Ticket(entry("ticket:t2"), SHORT)]
    )  # a replay's ticket
    ledger.bind("c", [TicketBinding("ticket:t2", (entry("res-1@n"),), SHORT)])
    under_test.wait(PAST_SHORT)
    assert [(e.id, e.expires_at) for e in ledger.read("c").entries] == [("res-1@n", None)]


def test_a_batch_of_tickets_is_one_compare_and_set(under_test: LedgerUnderTest) -> None:
    """A batch's grants: every ticket added at once (the version grows once), or none when
    the version moved; then all bound in one step, each keeping its own expiry."""
    ledger = under_test.ledger
    first = ledger.read("c")
    batch = [Ticket(entry("ticket:1"), SHORT), Ticket(entry("ticket:2", "b", 2000), 60)]
    assert ledger.take("c", first.version, batch)
    assert not ledger.take("c", first.version, [Ticket(entry("ticket:3"), 60)])
    second = ledger.read("c")
    assert [e.id for e in second.entries] == ["ticket:1", "ticket:2"]
    assert second.version > first.version
    assert ledger.take("c", second.version, [])  # nothing to add: still a compare-and-set
    ledger.bind(
        "c",
        [
            TicketBinding("ticket:1", (entry("res-1@n1"),), 60),
            TicketBinding("ticket:2", (entry("res-2@n1", "b"), entry("res-3@pool", "b")), 60),
        ],
    )
    assert [e.id for e in ledger.read("c").entries] == ["res-1@n1", "res-2@n1", "res-3@pool"]
    under_test.wait(PAST_SHORT)
    assert [e.id for e in ledger.read("c").entries] == ["res-2@n1", "res-3@pool"]


def test_leases_extend_commit_and_drop(under_test: LedgerUnderTest) -> None:
    ledger = under_test.ledger
    for name in ("ticket:a", "ticket:b", "ticket:c"):
        assert ledger.take("c", ledger.read("c").version, [Ticket(entry(name), SHORT)])
    assert ledger.extend("c", "ticket:a", 60)
    assert ledger.commit("c", "ticket:b")
    assert not ledger.extend("c", "ticket:b", 60)  # committed: no lease to extend
    under_test.wait(PAST_SHORT)
    live = {e.id: e for e in ledger.read("c").entries}
    assert sorted(live) == ["ticket:a", "ticket:b"]  # c expired
    assert live["ticket:b"].expires_at is None
    assert not ledger.extend("c", "ticket:c", 60) and not ledger.commit("c", "ticket:c")
    ledger.drop("c", ["ticket:a", "ticket:b", "ticket:unknown"])
    assert ledger.read("c").entries == ()


def test_usage_sums_per_tenant(under_test: LedgerUnderTest) -> None:
    ledger = under_test.ledger
    for name, tenant, gpus in [("t:1", "a", 2000), ("t:2", "b", 1000), ("t:3", "a", 500)]:
        ledger.take("c", ledger.read("c").version, [Ticket(entry(name, tenant, gpus), 60)])
    assert usage_by_tenant(ledger.read("c").entries) == {"a": {"gpus": 2500}, "b": {"gpus": 1000}}


def test_racing_takes_never_overrun_a_limit(under_test: LedgerUnderTest) -> None:
    """16 threads each try to take 1 of 10 units by read-check-take: exactly 10 succeed."""
    ledger = under_test.ledger
    limit, won = 10_000, []
    lock = threading.Lock()

    def worker(index: int) -> None:
        while True:
            read = ledger.read("race")
            held = sum(e.amounts["gpus"] for e in read.entries)
            if held + 1000 > limit:
                return
            if ledger.take("race", read.version, [Ticket(entry(f"ticket:{index}"), 60)]):
                with lock:
                    won.append(index)
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 10
    assert sum(e.amounts["gpus"] for e in ledger.read("race").entries) == limit


def test_decayed_usage_is_a_compare_and_set_by_the_ledgers_clock(
    under_test: LedgerUnderTest,
) -> None:
    """The decayed usage starts empty at version 0 with the ledger's clock; a put with the
    version read replaces it (fractional milli-units kept) and bumps the version; a put with an
    old version (another replica sampled first) writes nothing; it lives beside the entries,
    in the same tree's keys, and entries do not move its version."""
    ledger = under_test.ledger
    first = ledger.read_consumed("tree")
    assert (first.version, dict(first.tenants)) == (0, {})
    assert abs(first.now - time.time()) < 3600 * 24 * 365 * 60  # seconds since the epoch
    sample = {
        "a": ConsumedUsage({"gpus": 1234.5, "gpus/hopper": 0.25}, 1_700_000_000.125),
        "b": ConsumedUsage({}, 1_700_000_000.0),
    }
    assert ledger.put_consumed("tree", 0, sample)
    assert not ledger.put_consumed("tree", 0, {"a": ConsumedUsage({"gpus": 1.0}, 1.0)})
    ledger.take("tree", ledger.read("tree").version, [Ticket(entry("ticket:x"), 60)])
    read = ledger.read_consumed("tree")
    assert read.version == 1 and dict(read.tenants) == sample
    assert read.now >= first.now
    assert ledger.put_consumed("tree", 1, {"b": ConsumedUsage({"gpus": 2.0}, 1_700_000_300.0)})
    assert dict(ledger.read_consumed("tree").tenants) == {
        "b": ConsumedUsage({"gpus": 2.0}, 1_700_000_300.0)
    }
    assert ledger.read_consumed("other").tenants == {}


@pytest.mark.redis
def test_ledger_writes_wait_for_replicas_like_the_store(
    redis_server_factory: RedisServerFactory,
) -> None:
    """With GPUALLOC_REDIS_WAIT_REPLICAS, a quota take that no replica confirms is
    UNAVAILABLE (the step happened on the primary), as a reserve is."""
    server = redis_server_factory()
    store = RedisReservationStore(server.url, wait_replicas=1, wait_timeout=0.05)
    try:
        ledger = RedisQuotaLedger(store)
        with pytest.raises(Unavailable, match="confirmed by 0 of 1"):
            ledger.take("c", ledger.read("c").version, [Ticket(entry("ticket:w"), 60)])
        assert [e.id for e in ledger.read("c").entries] == ["ticket:w"]
    finally:
        store.close()


def test_a_revocation_is_remembered_for_a_day() -> None:
    """Commit of a revoked reservation: 'preempted' for PREEMPTED_MEMORY_SECONDS, then
    NOT_FOUND (the embedded store's clock; Redis sets the same expiry on its marker)."""
    clock = FakeClock()
    store = MemoryReservationStore(clock=clock)
    held = reserve_placement(store, [reserve_request(device("gpu-0"))])[0]
    store.revoke(held.id, held.fencing_token, by="team-b/job/1")
    clock.advance(PREEMPTED_MEMORY_SECONDS - 1)
    with pytest.raises(Preempted):
        store.commit(held.id, "alice")
    clock.advance(2)
    with pytest.raises(NotFound):
        store.commit(held.id, "alice")
