"""The ReservationStore contract: one suite, run against the embedded and the Redis store."""

from __future__ import annotations

import functools
import random
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from dataclasses import replace as dataclass_replace

import pytest

from services.allocator.reservations.model import (
    DeviceCondition,
    LimitedUse,
    PendingPreemptions,
    Reservation,
    ReservationEvent,
    ReservationState,
    ReserveRequest,
    reserve_placement,
    reserved,
)
from services.allocator.reservations.model import ReservationEventOp as Op
from services.common.dra.model import (
    AllocationResult,
    ConfigSource,
    DeviceAllocationConfiguration,
    DeviceRequestAllocationResult,
    DeviceToleration,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    OpaqueDeviceConfiguration,
    TaintEffect,
    TolerationOperator,
)
from services.common.dra.quantity import Quantity
from services.common.errors import (
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Preempted,
)
from tests.contract.conftest import (
    PAST_SHORT_LEASE,
    SHORT_LEASE,
    Store,
    StoreUnderTest,
    capacity,
    counter,
    device,
    mem,
    reserve_request,
)

GPU0, GPU1, GPU2 = device("gpu-0"), device("gpu-1"), device("gpu-2")


# --- reserve / get / list -------------------------------------------------------------------


def test_reserve_round_trips_every_field(store: Store) -> None:
    allocation = AllocationResult(
        results=(
            DeviceRequestAllocationResult(
                "gpu", "gpu.nvidia.com", "node-1", "gpu-0", admin_access=False,
                tolerations=(DeviceToleration("maintenance", TolerationOperator.EXISTS,
                                              effect=TaintEffect.NO_SCHEDULE),),
                share_id="4b6f1c3e-1f0a-4e7a-9a43-3d0c2b1f9e10",
                consumed_capacity={"memory": Quantity.parse("10Gi")},
            ),
        ),
        config=(DeviceAllocationConfiguration(
            ConfigSource.FROM_CLAIM, ("gpu",),
            OpaqueDeviceConfiguration("gpu.nvidia.com", {"sharing": {"strategy": "TimeSlicing"}}),
        ),),
        node_selector=NodeSelector((NodeSelectorTerm(match_fields=(
            NodeSelectorRequirement("metadata.name", "In", ("node-1",)),)),)),
    )  # fmt: skip
    request = ReserveRequest(
        owner="slurm/job-1234",
        node="node-1",
        claim_names=("claim-a",),
        allocations=(allocation,),
        hold=reserve_request(GPU0, uses=[mem(1000, key=capacity())]).hold,
        lease_seconds=30.0,
        idempotency_key="attempt-1",
        labels=(("slurm.job", "1234"),),
        request_digest="d1g3st",
        priority_class="batch-low",
    )

    reservation = reserve_placement(store, [request])[0]

    assert reservation.state is ReservationState.RESERVED
    assert (reservation.owner, reservation.node) == ("slurm/job-1234", "node-1")
    assert (reservation.claim_names, reservation.allocations) == (("claim-a",), (allocation,))
    assert (reservation.hold, reservation.labels) == (request.hold, request.labels)
    assert (reservation.idempotency_key, reservation.request_digest) == ("attempt-1", "d1g3st")
    assert reservation.priority_class == "batch-low"
    assert reservation.fencing_token >= 1
    assert reservation.expires_at is not None
    assert reservation.expires_at - reservation.created_at == pytest.approx(30.0, abs=0.002)
    assert store.get(reservation.id) == reservation
    assert store.live() == [reservation]


RESERVATION_ID = re.compile(r"res-[0-9a-f]{32}@(?P<node>.+)")


@pytest.mark.parametrize(
    "node",
    [pytest.param("node-1", id="short-node"), pytest.param("a100-node-1.rack-2", id="dotted-node")],
)
def test_ids_are_res_hex_at_node_in_every_store(store: Store, node: str) -> None:
    """docs/reservations.md, "Ids": `res-<32 random hex>@<node>`, whichever store mints it."""
    reservation = reserve_placement(
        store, [reserve_request(device("gpu-0", pool=node), node=node)]
    )[0]

    match = RESERVATION_ID.fullmatch(reservation.id)
    assert match is not None, reservation.id
    assert match["node"] == node
    assert store.get(reservation.id) == reservation


def test_list_filters_by_owner_and_node_sorted_by_node_then_id(store: Store) -> None:
    made = [
        reserve_placement(
            store, [reserve_request(device("gpu-0", "node-b"), node="node-b", owner="bob")]
        )[0],
        reserve_placement(
            store, [reserve_request(device("gpu-0", "node-a"), node="node-a", owner="alice")]
        )[0],
        reserve_placement(
            store, [reserve_request(device("gpu-1", "node-a"), node="node-a", owner="bob")]
        )[0],
    ]
    by_key = sorted(made, key=lambda r: (r.node, r.id))

    assert [r.id for r in store.list()] == [r.id for r in by_key]
    assert [r.id for r in store.live()] == [r.id for r in by_key]
    assert [r.id for r in store.list(owner="bob")] == [r.id for r in by_key if r.owner == "bob"]
    assert [r.id for r in store.list(node="node-a")] == [r.id for r in by_key[:2]]
    assert [r.id for r in store.list(owner="bob", node="node-a")] == [made[2].id]
    assert store.list(node="node-z") == []


# --- conflicts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConflictCase:
    first: ReserveRequest
    second: ReserveRequest
    conflicts: tuple[str, ...]  # () means the second fits
    message_parts: tuple[str, ...] = ()


CONFLICT_CASES = [
    pytest.param(ConflictCase(
        reserve_request(GPU0), reserve_request(GPU0, owner="bob"),
        ("device:gpu.nvidia.com/node-1/gpu-0",), ("held by reservation {first}",),
    ), id="same-device"),
    pytest.param(ConflictCase(
        reserve_request(GPU0), reserve_request(GPU1, owner="bob"), (),
    ), id="another-device-fits"),
    pytest.param(ConflictCase(
        reserve_request(GPU0, GPU2), reserve_request(GPU2, GPU1, GPU0),
        ("device:gpu.nvidia.com/node-1/gpu-2", "device:gpu.nvidia.com/node-1/gpu-0"),
    ), id="every-taken-device-listed-in-hold-order"),
    pytest.param(ConflictCase(
        reserve_request(uses=[mem(3000)]), reserve_request(uses=[mem(4000)]), (),
    ), id="counter-filled-exactly-to-its-limit"),
    pytest.param(ConflictCase(
        reserve_request(uses=[mem(3000)]), reserve_request(uses=[mem(4001)]),
        (counter(),), ("needs 4001 has 4000 free",),
    ), id="counter-one-milli-over"),
    pytest.param(ConflictCase(
        reserve_request(uses=[mem(40_000, 80_000, capacity())]),
        reserve_request(uses=[mem(50_000, 80_000, capacity())]),
        (capacity(),), ("needs 50000 has 40000 free",),
    ), id="capacity-share-over-device-capacity"),
    pytest.param(ConflictCase(
        reserve_request(GPU0, uses=[mem(5000)]),
        reserve_request(GPU1, GPU0, uses=[mem(1000, key=counter("compute")), mem(3000)]),
        ("device:gpu.nvidia.com/node-1/gpu-0", counter()),
    ), id="device-and-counter-devices-first"),
    pytest.param(ConflictCase(
        reserve_request(GPU0, uses=[mem(7000)]),
        reserve_request(GPU0, uses=[mem(7000)], node="node-2"), (),
    ), id="holds-are-scoped-to-the-node"),
    pytest.param(ConflictCase(
        reserve_request(uses=[mem(0)]), reserve_request(uses=[mem(7000)]), (),
    ), id="zero-amount-takes-nothing"),
]  # fmt: skip


@pytest.mark.parametrize("case", CONFLICT_CASES)
def test_reserve_conflicts(store: Store, case: ConflictCase) -> None:
    first = reserve_placement(store, [case.first])[0]

    if not case.conflicts:
        assert reserve_placement(store, [case.second])[0].id != first.id
        return
    with pytest.raises(Conflict) as raised:
        reserve_placement(store, [case.second])[0]

    assert raised.value.conflicts == case.conflicts
    for part in case.message_parts:
        assert part.format(first=first.id) in raised.value.message
    assert [r.id for r in store.live()] == [first.id]  # nothing of the loser was taken


def test_counter_fills_to_its_limit_then_frees_on_release(store: Store) -> None:
    taken = [
        reserve_placement(store, [reserve_request(uses=[mem(1000)], owner=f"o{i}")])[0]
        for i in range(7)
    ]

    with pytest.raises(Conflict) as raised:
        reserve_placement(store, [reserve_request(uses=[mem(1000)])])[0]
    assert "needs 1000 has 0 free" in raised.value.message

    store.release(taken[3].id, "o3")
    assert reserve_placement(store, [reserve_request(uses=[mem(1000)])])[0].hold.uses == (
        mem(1000),
    )


def test_uses_of_one_key_in_a_hold_are_summed(store: Store) -> None:
    reservation = reserve_placement(store, [reserve_request(uses=[mem(3000), mem(3000)])])[0]

    assert reservation.hold.uses == (mem(6000),)
    with pytest.raises(Conflict):
        reserve_placement(store, [reserve_request(uses=[mem(1001)])])[0]


INVALID_REQUESTS = [
    pytest.param(reserve_request(GPU0, owner=""), "owner", id="empty-owner"),
    pytest.param(reserve_request(GPU0, node=""), "node", id="empty-node"),
    pytest.param(reserve_request(GPU0, lease=0), "lease_seconds", id="zero-lease"),
    pytest.param(reserve_request(GPU0, lease=float("nan")), "lease_seconds", id="nan-lease"),
    pytest.param(reserve_request(GPU0, GPU0), "hold.devices[1]", id="device-twice"),
    pytest.param(reserve_request(uses=[mem(-1)]), "hold.uses[0]", id="negative-amount"),
    pytest.param(
        reserve_request(uses=[mem(1, 7000), mem(1, 8000)]),
        "hold.uses[1].limit",
        id="one-key-two-limits",
    ),
]


@pytest.mark.parametrize(("request_", "path"), INVALID_REQUESTS)
def test_invalid_requests_name_the_field(store: Store, request_: ReserveRequest, path: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        reserve_placement(store, [request_])[0]

    assert raised.value.field_path == path
    assert store.live() == []


# --- leases -----------------------------------------------------------------------------------


def test_expired_lease_frees_its_holds(store_under_test: StoreUnderTest) -> None:
    store = store_under_test.store
    short = reserve_placement(store, [reserve_request(GPU0, uses=[mem(7000)], lease=SHORT_LEASE)])[
        0
    ]
    with pytest.raises(Conflict):
        reserve_placement(store, [reserve_request(GPU0, owner="bob")])[0]

    store_under_test.wait(PAST_SHORT_LEASE)

    assert store.live() == []
    with pytest.raises(NotFound):
        store.get(short.id)
    taken = reserve_placement(store, [reserve_request(GPU0, uses=[mem(7000)], owner="bob")])[0]
    assert taken.owner == "bob"
    with pytest.raises(NotFound):
        store.commit(short.id, "alice")


def test_expire_counts_the_leases_it_frees(store_under_test: StoreUnderTest) -> None:
    store = store_under_test.store
    reserve_placement(store, [reserve_request(GPU0, lease=SHORT_LEASE)])[0]
    reserve_placement(
        store, [reserve_request(device("gpu-0", "node-2"), node="node-2", lease=SHORT_LEASE)]
    )[0]
    kept = reserve_placement(store, [reserve_request(GPU1)])[0]

    store_under_test.wait(PAST_SHORT_LEASE)

    assert store.expire() == 2
    assert store.expire() == 0
    assert store.live() == [kept]


def test_commit_makes_the_lease_permanent(store_under_test: StoreUnderTest) -> None:
    store = store_under_test.store
    reserved = reserve_placement(store, [reserve_request(GPU0, lease=SHORT_LEASE)])[0]

    committed = store.commit(reserved.id, "alice", reserved.fencing_token)
    store_under_test.wait(PAST_SHORT_LEASE)

    assert committed.state is ReservationState.COMMITTED
    assert committed.expires_at is None
    assert committed.fencing_token == reserved.fencing_token
    assert store.get(reserved.id) == committed
    assert store.commit(reserved.id, "alice") == committed  # committing twice is harmless
    assert store.expire() == 0
    with pytest.raises(Conflict):
        reserve_placement(store, [reserve_request(GPU0, owner="bob")])[0]


def test_renew_extends_the_lease(store_under_test: StoreUnderTest) -> None:
    store = store_under_test.store
    reserved = reserve_placement(store, [reserve_request(GPU0, lease=SHORT_LEASE)])[0]

    renewed = store.renew(reserved.id, "alice", 30.0)
    store_under_test.wait(PAST_SHORT_LEASE)

    assert renewed.expires_at is not None and reserved.expires_at is not None
    assert renewed.expires_at > reserved.expires_at
    assert renewed.fencing_token == reserved.fencing_token
    assert store.get(reserved.id).expires_at == renewed.expires_at
    store.commit(reserved.id, "alice")
    with pytest.raises(FailedPrecondition):
        store.renew(reserved.id, "alice", 30.0)


# --- owners, tokens, unknown ids ------------------------------------------------------------

Call = Callable[[Store, Reservation], object]

REFUSALS = [
    pytest.param(lambda s, r: s.commit(r.id, "eve"), PermissionDenied, id="commit-other-owner"),
    pytest.param(lambda s, r: s.renew(r.id, "eve", 5), PermissionDenied, id="renew-other-owner"),
    pytest.param(lambda s, r: s.release(r.id, "eve"), PermissionDenied, id="release-other-owner"),
    pytest.param(lambda s, r: s.commit(r.id, "alice", r.fencing_token + 1), FailedPrecondition,
                 id="commit-stale-fencing-token"),
    pytest.param(lambda s, r: s.release(r.id, "alice", r.fencing_token + 1), FailedPrecondition,
                 id="release-stale-fencing-token"),
    pytest.param(lambda s, r: s.renew(r.id, "alice", 0), InvalidArgument, id="renew-zero-lease"),
    pytest.param(lambda s, r: s.get("res-unknown"), NotFound, id="get-unknown-id"),
    pytest.param(lambda s, r: s.commit("res-unknown", "alice"), NotFound, id="commit-unknown-id"),
    pytest.param(lambda s, r: s.renew("res-unknown", "alice", 5), NotFound, id="renew-unknown-id"),
    pytest.param(lambda s, r: s.release("res-unknown", "alice"), NotFound,
                 id="release-unknown-id"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error"), REFUSALS)
def test_refusals_change_nothing(store: Store, call: Call, error: type[Exception]) -> None:
    reservation = reserve_placement(store, [reserve_request(GPU0)])[0]

    with pytest.raises(error):
        call(store, reservation)

    assert store.get(reservation.id) == reservation


def test_release_frees_once(store: Store) -> None:
    reservation = reserve_placement(store, [reserve_request(GPU0, key="k")])[0]

    store.release(reservation.id, "alice", reservation.fencing_token)

    with pytest.raises(NotFound):
        store.release(reservation.id, "alice")
    with pytest.raises(NotFound):
        store.get(reservation.id)
    assert reserve_placement(store, [reserve_request(GPU0, owner="bob")])[0].owner == "bob"


@pytest.mark.parametrize("op", ["commit", "renew", "release"])
def test_revoke_frees_and_later_changes_say_who_preempted(store: Store, op: str) -> None:
    reservation = reserve_placement(store, [reserve_request(GPU0, owner="alice")])[0]
    with pytest.raises(FailedPrecondition, match="stale"):
        store.revoke(reservation.id, reservation.fencing_token + 1, by="team-b/job/9")
    assert store.get(reservation.id) == reservation  # a stale token revokes nothing

    store.revoke(reservation.id, reservation.fencing_token, by="team-b/job/9")

    assert reserve_placement(store, [reserve_request(GPU0, owner="bob")])[0].owner == "bob"
    with pytest.raises(NotFound):
        store.get(reservation.id)
    with pytest.raises(FailedPrecondition, match="was preempted by team-b/job/9"):
        if op == "commit":
            store.commit(reservation.id, "alice")
        elif op == "renew":
            store.renew(reservation.id, "alice", 30)
        else:
            store.release(reservation.id, "alice")
    with pytest.raises(NotFound):
        store.revoke(reservation.id, reservation.fencing_token, by="again")


# --- pending preemptions: revoked, the holder not told yet -----------------------------------

# After team-a/alice's reservation was revoked: the calls made (each with the error it answers)
# and how many revocations are then pending for team-a.
PENDING_CASES = [
    pytest.param([], 1, id="revoked-is-pending"),
    pytest.param([(lambda s, r: s.renew(r.id, r.owner, 30), Preempted)], 0,
                 id="the-owners-renew-tells-it"),
    pytest.param([(lambda s, r: s.commit(r.id, r.owner), Preempted)], 0,
                 id="the-owners-commit-tells-it"),
    pytest.param([(lambda s, r: s.release(r.id, r.owner, r.fencing_token), Preempted)], 0,
                 id="the-owners-release-tells-it"),
    pytest.param([(lambda s, r: s.renew(r.id, r.owner, 30), Preempted)] * 2, 0,
                 id="told-twice-stays-told"),
    pytest.param([(lambda s, r: s.renew(r.id, "team-a/bob", 30), Preempted)], 1,
                 id="another-owner-of-the-tenant-does-not-tell-it"),
    pytest.param([(lambda s, r: s.commit(r.id, "team-b/eve"), Preempted)], 1,
                 id="another-tenants-owner-does-not-tell-it"),
    pytest.param([(lambda s, r: s.get(r.id), NotFound)], 1, id="a-read-does-not-tell-it"),
    pytest.param([(lambda s, r: s.revoke(r.id, r.fencing_token, "x"), NotFound)], 1,
                 id="a-second-revoke-changes-nothing"),
]  # fmt: skip


@pytest.mark.parametrize(("calls", "pending"), PENDING_CASES)
def test_a_revocation_is_pending_until_its_owner_is_told(
    store: Store, calls: list[tuple[Call, type[Exception]]], pending: int
) -> None:
    victim = reserve_placement(store, [reserve_request(GPU0, owner="team-a/alice")])[0]
    kept = reserve_placement(store, [reserve_request(GPU1, owner="team-a/carol")])[
        0
    ]  # live: never pending
    store.revoke(victim.id, victim.fencing_token, by="team-b/job/9")

    for call, error in calls:
        with pytest.raises(error):
            call(store, victim)

    assert store.pending_preemptions(["team-a", "team-b"]) == {
        "team-a": PendingPreemptions(pending, (victim.id,) * pending),
        "team-b": PendingPreemptions(),
    }
    assert store.get(kept.id) == kept


def test_pending_revocations_count_per_tenant_across_nodes(
    store_under_test: StoreUnderTest,
) -> None:
    """The tenant is the owner's part before the first `/` (all of it without one); the
    counts add up over nodes (on Redis Cluster: over slots on every shard); the ids shown are
    the oldest first, at most `max_ids`."""
    store = store_under_test.store
    owners = ["team-a/job/1", "tools", "team-a/job/2", "team-b/slurm/job/3", "team-a/job/4"]
    revoked = []
    for index, owner in enumerate(owners):
        node = f"node-{index % 3 + 1}"
        held = reserve_placement(
            store, [reserve_request(device(f"gpu-{index}", node), owner=owner, node=node)]
        )[0]
        store.revoke(held.id, held.fencing_token, by="hpc/urgent")
        revoked.append(held)
        store_under_test.wait(0.01)  # distinct revocation times: "oldest first" is defined
    stale = reserve_placement(
        store, [reserve_request(device("gpu-9", "node-2"), owner="team-b/x", node="node-2")]
    )[0]
    with pytest.raises(FailedPrecondition, match="stale"):
        store.revoke(stale.id, stale.fencing_token + 1, by="hpc/urgent")  # revokes nothing
    with pytest.raises(Preempted):
        store.renew(revoked[2].id, "team-a/job/2", 30)  # its owner is told

    shown = store.pending_preemptions(["team-a", "tools", "team-b", "team-a/job", "hpc"], 1)
    assert shown == {
        "team-a": PendingPreemptions(2, (revoked[0].id,)),
        "tools": PendingPreemptions(1, (revoked[1].id,)),
        "team-b": PendingPreemptions(1, (revoked[3].id,)),
        "team-a/job": PendingPreemptions(),
        "hpc": PendingPreemptions(),  # the preemptor's tenant loses nothing
    }
    assert store.pending_preemptions(["team-a"])["team-a"].ids == (revoked[0].id, revoked[4].id)
    assert store.pending_preemptions(["team-a"], 0) == {"team-a": PendingPreemptions(2)}
    assert store.pending_preemptions([]) == {}


def test_a_pending_revocation_ends_with_its_memory(store_under_test: StoreUnderTest) -> None:
    store = store_under_test.remembering(SHORT_LEASE)
    victim = reserve_placement(store, [reserve_request(GPU0, owner="team-a/alice")])[0]
    store.revoke(victim.id, victim.fencing_token, by="team-b/job/9")
    assert store.pending_preemptions(["team-a"]) == {"team-a": PendingPreemptions(1, (victim.id,))}

    store_under_test.wait(PAST_SHORT_LEASE)

    assert store.pending_preemptions(["team-a"]) == {"team-a": PendingPreemptions()}
    with pytest.raises(NotFound):  # forgotten: neither preempted nor pending
        store.renew(victim.id, victim.owner, 30)


# --- fencing ----------------------------------------------------------------------------------


def test_fencing_tokens_increase_per_node_with_every_grant(store: Store) -> None:
    def on(node: str, name: str) -> Reservation:
        return reserve_placement(store, [reserve_request(device(name, node), node=node)])[0]

    a1 = on("node-1", "gpu-0")
    b1 = on("node-2", "gpu-0")
    store.release(a1.id, "alice")
    a2 = on("node-1", "gpu-0")  # the same device, a new grant
    a3 = on("node-1", "gpu-1")
    store.commit(a3.id, "alice")
    store.renew(a2.id, "alice", 30)
    a4 = on("node-1", "gpu-2")
    b2 = on("node-2", "gpu-1")

    assert [a1.fencing_token, a2.fencing_token, a3.fencing_token, a4.fencing_token] == [
        a1.fencing_token + n for n in range(4)
    ]
    assert b2.fencing_token == b1.fencing_token + 1  # node-1's grants do not move node-2
    assert store.get(a3.id).fencing_token == a3.fencing_token  # commit/renew keep the token
    assert store.get(a2.id).fencing_token == a2.fencing_token


# --- idempotency ------------------------------------------------------------------------------


def test_idempotency_key_returns_the_live_reservation(store_under_test: StoreUnderTest) -> None:
    store = store_under_test.store
    first = reserve_placement(store, [reserve_request(GPU0, key="attempt-1", lease=SHORT_LEASE)])[0]

    again = reserve_placement(store, [reserve_request(GPU0, key="attempt-1")])[0]
    other_owner = reserve_placement(store, [reserve_request(GPU1, key="attempt-1", owner="bob")])[0]
    store_under_test.wait(PAST_SHORT_LEASE)
    after_expiry = reserve_placement(store, [reserve_request(GPU0, key="attempt-1")])[0]
    committed = store.commit(after_expiry.id, "alice")
    after_commit = reserve_placement(store, [reserve_request(GPU0, key="attempt-1")])[0]
    store.release(after_expiry.id, "alice")
    after_release = reserve_placement(store, [reserve_request(GPU0, key="attempt-1")])[0]

    assert again == first
    assert other_owner.id != first.id
    assert after_expiry.id != first.id
    assert after_commit == committed
    assert after_release.id not in {first.id, after_expiry.id}
    assert after_release.fencing_token > after_expiry.fencing_token


def test_concurrent_retries_with_one_key_make_one_reservation(store: Store) -> None:
    threads = 8
    barrier = threading.Barrier(threads)
    ids: list[str] = []

    def retry() -> None:
        barrier.wait()
        ids.append(
            reserve_placement(store, [reserve_request(GPU0, uses=[mem(4000)], key="once")])[0].id
        )

    run_threads([retry] * threads)

    assert len(ids) == threads
    assert len(set(ids)) == 1
    assert [r.id for r in store.live()] == ids[:1]


# --- gangs ------------------------------------------------------------------------------------


def test_gang_is_all_or_nothing(store: Store) -> None:
    blocker = reserve_placement(
        store, [reserve_request(device("gpu-0", "node-3"), node="node-3", owner="bob")]
    )[0]
    gang = [reserve_request(device("gpu-0", f"node-{n}"), node=f"node-{n}") for n in (1, 2, 3)]

    with pytest.raises(Conflict) as raised:
        reserve_placement(store, gang)

    assert raised.value.conflicts == ("device:gpu.nvidia.com/node-3/gpu-0",)
    assert store.live() == [blocker]
    store.release(blocker.id, "bob")
    taken = reserve_placement(store, gang)
    assert [r.node for r in taken] == ["node-1", "node-2", "node-3"]
    assert store.live() == taken


def test_a_failed_gang_leaves_an_earlier_calls_reservation_of_the_same_key(store: Store) -> None:
    """A retry with the same idempotency key gets the first call's reservation back for a
    member; when another member then conflicts, only what the retry created is released."""
    first = reserve_placement(
        store, [reserve_request(device("gpu-0", "node-1"), node="node-1", key="job-7")]
    )[0]
    reserve_placement(
        store, [reserve_request(device("gpu-0", "node-2"), node="node-2", owner="bob")]
    )[0]
    retry = [
        reserve_request(device("gpu-1", "node-1"), node="node-1", key="job-7"),
        reserve_request(device("gpu-9", "node-3"), node="node-3", key="job-7"),
        reserve_request(device("gpu-0", "node-2"), node="node-2", key="job-7"),
    ]

    with pytest.raises(Conflict):
        reserve_placement(store, retry)

    assert store.get(first.id) == first
    assert sorted(r.node for r in store.live()) == ["node-1", "node-2"]


def test_gang_with_an_invalid_member_takes_nothing(store: Store) -> None:
    gang = [reserve_request(GPU0), reserve_request(GPU1, lease=-1)]

    with pytest.raises(InvalidArgument):
        reserve_placement(store, gang)

    assert store.live() == []


# --- many placements in one call ----------------------------------------------------------------


def test_placements_of_one_call_fail_alone_and_see_the_ones_before_them(store: Store) -> None:
    """One call, four placements on two nodes: the second wants the first's device (the first
    wins: in order), the third is invalid, the fourth takes two nodes; each gets its own
    outcome, and only the refused ones hold nothing."""
    node2 = device("gpu-0", "node-2")
    outcomes = store.reserve(
        [
            [reserve_request(GPU0)],
            [reserve_request(GPU0, owner="bob")],
            [reserve_request(GPU1, lease=-1)],
            [reserve_request(GPU1), reserve_request(node2, node="node-2")],
        ]
    )

    first, second, third, fourth = outcomes
    assert isinstance(first, list) and [r.hold.devices for r in first] == [(GPU0,)]
    assert isinstance(second, Conflict)
    assert second.conflicts == (f"device:{GPU0}",)
    assert second.holders == {f"device:{GPU0}": first[0].id}
    assert isinstance(third, InvalidArgument) and third.field_path == "lease_seconds"
    assert isinstance(fourth, list) and [r.node for r in fourth] == ["node-1", "node-2"]
    assert sorted(r.id for r in store.live()) == sorted(r.id for r in [*first, *fourth])


def test_a_placement_that_conflicts_on_one_node_leaves_the_others_of_the_call_held(
    store: Store,
) -> None:
    """Three gangs in one call, all on node-1 and node-2; node-2's gpu-1 is taken, so the
    middle gang (which wants it) fails whole, releasing its node-1 part, and the others hold."""
    reserve_placement(store, [reserve_request(device("gpu-1", "node-2"), node="node-2", owner="x")])

    def gang(index: int) -> list[ReserveRequest]:
        return [
            reserve_request(device(f"gpu-{index}", "node-1"), owner=f"job-{index}"),
            reserve_request(device(f"gpu-{index}", "node-2"), node="node-2", owner=f"job-{index}"),
        ]

    zero, one, two = store.reserve([gang(0), gang(1), gang(2)])

    assert isinstance(zero, list) and isinstance(two, list)
    assert isinstance(one, Conflict) and one.conflicts == ("device:gpu.nvidia.com/node-2/gpu-1",)
    assert sorted(r.owner for r in store.list(node="node-1")) == ["job-0", "job-2"]
    assert sorted(r.owner for r in store.list(node="node-2")) == ["job-0", "job-2", "x"]


def test_one_idempotency_key_twice_in_a_call_is_one_reservation(store: Store) -> None:
    first, again, other = store.reserve(
        [
            [reserve_request(GPU0, key="job-1")],
            [reserve_request(GPU0, key="job-1")],
            [reserve_request(GPU1, key="job-2")],
        ]
    )

    assert isinstance(first, list) and isinstance(again, list) and isinstance(other, list)
    assert again == first
    assert len(store.live()) == 2


def test_a_call_of_no_placements_and_a_placement_of_no_request(store: Store) -> None:
    assert store.reserve([]) == []
    [empty] = store.reserve([[]])
    assert isinstance(empty, InvalidArgument)


def test_every_reservation_of_a_call_is_announced(store_under_test: StoreUnderTest) -> None:
    """Grants of one call on one node reach subscribers as one event each (Redis sends them
    in one message), with their own ids, tokens and owners, in order."""
    store = store_under_test.store
    events: list[ReservationEvent] = []
    subscription = store.subscribe(events.append)
    time.sleep(0.05)  # Redis: let the subscriber thread subscribe
    node2 = device("gpu-0", "node-2")
    outcomes = store.reserve(
        [
            [reserve_request(GPU0, owner="a")],
            [reserve_request(GPU1, owner="b")],
            [reserve_request(node2, node="node-2", owner="c")],
            [reserve_request(GPU2, owner="d")],
        ]
    )
    made = [r for outcome in outcomes for r in reserved(outcome)]
    wait_for(lambda: len(events) >= 4)
    subscription.close()

    announced = {(e.op, e.id, e.node, e.fencing_token, e.owner) for e in events}
    assert announced == {(Op.RESERVE, r.id, r.node, r.fencing_token, r.owner) for r in made}
    on_node1 = [e.owner for e in events if e.node == "node-1"]
    assert on_node1 == ["a", "b", "d"]


# --- races ------------------------------------------------------------------------------------


def test_racing_overlapping_reserves_never_double_book(store: Store) -> None:
    nodes, devices, limit = ("node-1", "node-2"), ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], 5000
    threads, attempts = 6, 15
    barrier = threading.Barrier(threads)
    granted: list[str] = []
    refused: list[Conflict] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        barrier.wait()
        for _ in range(attempts):
            node = rng.choice(nodes)
            picked = [device(d, node) for d in rng.sample(devices, rng.randint(0, 2))]
            uses = [LimitedUse(counter(pool=node), rng.choice((1000, 2000)), limit)]
            try:
                granted.append(
                    reserve_placement(store, [reserve_request(*picked, uses=uses, node=node)])[0].id
                )
            except Conflict as conflict:
                refused.append(conflict)

    run_threads([functools.partial(worker, seed) for seed in range(threads)])

    live = store.live()
    held: Counter[tuple[str, str]] = Counter((r.node, d) for r in live for d in r.hold.devices)
    used: dict[tuple[str, str], int] = defaultdict(int)
    for r in live:
        for use in r.hold.uses:
            used[(r.node, use.key)] += use.amount
    assert sorted(r.id for r in live) == sorted(granted)
    assert all(count == 1 for count in held.values()), held
    assert all(total <= limit for total in used.values()), used
    assert len(granted) + len(refused) == threads * attempts
    assert len(granted) >= 2 and refused  # the race really was contested


# --- device conditions (binding: reservations/binding.py) -------------------------------------


def test_reported_conditions_merge_newest_per_device_and_type_and_outlive_commit(
    store: Store,
) -> None:
    reservation = reserve_placement(store, [reserve_request(GPU0, GPU1)])[0]
    attached, failed = "dra.example.com/attached", "dra.example.com/failed"

    first = store.report_conditions(
        reservation.id,
        0,
        [DeviceCondition(GPU0, attached, False), DeviceCondition(GPU1, failed, False)],
    )
    again = store.report_conditions(
        reservation.id, reservation.fencing_token, [DeviceCondition(GPU0, attached, True)]
    )

    assert first.conditions == (
        DeviceCondition(GPU0, attached, False),
        DeviceCondition(GPU1, failed, False),
    )
    assert again.conditions == (
        DeviceCondition(GPU0, attached, True),
        DeviceCondition(GPU1, failed, False),
    )
    assert again == dataclass_replace(reservation, conditions=again.conditions)
    assert store.get(reservation.id).conditions == again.conditions
    assert store.commit(reservation.id, "alice").conditions == again.conditions
    assert (
        store.renew(reserve_placement(store, [reserve_request(GPU2)])[0].id, "alice", 30).conditions
        == ()
    )


CONDITION = DeviceCondition(GPU0, "dra.example.com/attached", True)
REPORT_REFUSALS = [
    pytest.param(lambda s, r: s.report_conditions(r.id, r.fencing_token + 1, [CONDITION]),
                 FailedPrecondition, id="stale-token"),
    pytest.param(lambda s, r: s.report_conditions("res-0@node-1", 0, [CONDITION]), NotFound,
                 id="unknown-id"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error"), REPORT_REFUSALS)
def test_condition_reports_refused_change_nothing(
    store: Store, call: Call, error: type[Exception]
) -> None:
    reservation = reserve_placement(store, [reserve_request(GPU0)])[0]

    with pytest.raises(error):
        call(store, reservation)

    assert store.get(reservation.id) == reservation


def test_a_binding_revocation_is_answered_as_such_and_is_no_pending_preemption(
    store: Store,
) -> None:
    """A failed binding is a revocation by `binding: ...`: changes answer Preempted with the
    reason, reports too, and the tenant has no preemption pending."""
    reservation = reserve_placement(store, [reserve_request(GPU0, owner="team-a/alice")])[0]
    why = "binding: binding failed: device gpu.nvidia.com/node-1/gpu-0 reported Failed"

    store.revoke(reservation.id, reservation.fencing_token, by=why)

    assert store.pending_preemptions(["team-a"]) == {"team-a": PendingPreemptions()}
    with pytest.raises(Preempted, match="was released: binding failed: device") as raised:
        store.commit(reservation.id, "team-a/alice")
    assert raised.value.by == why
    with pytest.raises(Preempted):
        store.report_conditions(reservation.id, 0, [CONDITION])


def test_a_binding_revocation_leaves_a_committed_reservation_alone(store: Store) -> None:
    """A commit that lands between a binding sweep's read and its revoke was bound: the revoke
    is refused and the committed reservation stays, holds and all."""
    reservation = reserve_placement(store, [reserve_request(GPU0, owner="team-a/alice")])[0]
    committed = store.commit(reservation.id, "team-a/alice")

    with pytest.raises(FailedPrecondition, match="committed"):
        store.revoke(committed.id, committed.fencing_token, by="binding: binding timed out")

    assert store.get(committed.id) == committed
    with pytest.raises(Conflict):
        reserve_placement(store, [reserve_request(GPU0, owner="team-b/bob")])[0]


# --- events -----------------------------------------------------------------------------------


def test_every_change_is_announced(store_under_test: StoreUnderTest) -> None:
    """Each change names its reservation's owner (WatchReservations filters on it); a
    revocation is a RELEASE that says who preempted it."""
    store = store_under_test.store
    events: list[ReservationEvent] = []
    subscription = store.subscribe(events.append)
    time.sleep(0.05)  # Redis: let the subscriber thread subscribe

    reservation = reserve_placement(store, [reserve_request(GPU0)])[0]
    store.commit(reservation.id, "alice")
    store.release(reservation.id, "alice")
    lapsing = reserve_placement(store, [reserve_request(GPU0, owner="bob", lease=SHORT_LEASE)])[0]
    store.renew(lapsing.id, "bob", SHORT_LEASE)
    store_under_test.wait(PAST_SHORT_LEASE)
    store.expire()
    revoked = reserve_placement(store, [reserve_request(GPU0, owner="team-a/carol")])[0]
    store.report_conditions(revoked.id, 0, [CONDITION])
    store.revoke(revoked.id, revoked.fencing_token, by="team-b/job/9")
    wait_for(lambda: len(events) >= 9)
    subscription.close()

    def event(op: Op, of: Reservation, owner: str, by: str = "") -> ReservationEvent:
        return ReservationEvent(op, of.id, "node-1", of.fencing_token, owner, by)

    assert events == [
        event(Op.RESERVE, reservation, "alice"),
        event(Op.COMMIT, reservation, "alice"),
        event(Op.RELEASE, reservation, "alice"),
        event(Op.RESERVE, lapsing, "bob"),
        event(Op.RENEW, lapsing, "bob"),
        event(Op.EXPIRE, lapsing, "bob"),
        event(Op.RESERVE, revoked, "team-a/carol"),
        event(Op.CONDITIONS, revoked, "team-a/carol"),
        event(Op.RELEASE, revoked, "team-a/carol", by="team-b/job/9"),
    ]


# --- helpers ----------------------------------------------------------------------------------


def run_threads(targets: Sequence[Callable[[], None]]) -> None:
    """Run each target in its own thread; re-raise the first failure in the test's thread."""
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            errors.append(error)

    workers = [threading.Thread(target=guarded, args=(target,)) for target in targets]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    if errors:
        raise errors[0]


def wait_for(condition: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
