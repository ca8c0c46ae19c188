"""The quota guard's compare-and-set on a ledger that always loses the race: a bounded number
of attempts, then UNAVAILABLE (docs/tenancy.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import pytest

from loadtest.clusters import A100, H100, device_classes, generate
from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.adapters.store.memory_quota import MemoryQuotaLedger
from services.allocator.app.quota_grants import QuotaAsk, QuotaTally, TakeResult
from services.allocator.app.quotas import QuotaGuard, QuotaSettings
from services.allocator.core import ClusterSnapshot, SelectorCache
from services.allocator.reservations.holds import scope_of
from services.allocator.reservations.model import Hold, Reservation, ReservationState
from services.allocator.reservations.quota_ledger import QuotaEntry, Ticket
from services.common.dra.model import AllocationResult, DeviceRequestAllocationResult
from services.common.errors import Unavailable
from services.common.quota.model import (
    AdmissionFairSharing,
    CohortQuota,
    QuotaLimits,
    QuotaModel,
    QuotaResource,
    TenantQuota,
)


def _take(
    guard: QuotaGuard, owner: str, amounts: dict[str, int], lease_seconds: float = 60
) -> TakeResult:
    """Step one of one grant, as the grant path takes it (app/quota_grants.py)."""
    tally = QuotaTally(guard)
    admitted = tally.admit(QuotaAsk(owner, (amounts,), lease_seconds))
    assert not isinstance(admitted, tuple), admitted
    return tally.take()[admitted]


class AlwaysContended(MemoryQuotaLedger):
    """Another grant always comes first: every take finds the version moved."""

    def __init__(self) -> None:
        super().__init__()
        self.takes = 0

    def take(self, cohort: str, version: int, tickets: Sequence[Ticket]) -> bool:
        self.takes += 1
        return False


def test_a_contended_ledger_is_unavailable_after_the_attempts() -> None:
    model = QuotaModel(
        (QuotaResource("gpus", ("gpu.nvidia.com",)),),
        {"hpc": TenantQuota("hpc", "", {"gpus": QuotaLimits(8000)})},
    )
    ledger = AlwaysContended()
    guard = QuotaGuard(lambda: model, ledger, dict, SelectorCache(), QuotaSettings(take_attempts=3))
    with pytest.raises(Unavailable, match="3 attempts lost to other grants"):
        _take(guard, "hpc/job/1", {"gpus": 1000})
    assert ledger.takes == 3
    assert QuotaSettings().take_attempts == 32  # the documented default


def test_the_reconciler_drops_entries_of_reservations_gone_from_the_store() -> None:
    """A release whose ledger step failed leaves an entry: the reconciler drops it once the
    store no longer has the reservation, and keeps tickets (their grant may be under way)."""
    model = QuotaModel(
        (QuotaResource("gpus", ("gpu.nvidia.com",)),),
        {"hpc": TenantQuota("hpc", "", {"gpus": QuotaLimits(8000)})},
    )
    ledger = MemoryQuotaLedger()
    guard = QuotaGuard(lambda: model, ledger, dict, SelectorCache())
    store = MemoryReservationStore()
    for name in ("res-gone@n1", "ticket:under-way"):
        entry = QuotaEntry(name, "hpc", {"gpus": 1000}, None)
        assert ledger.take("tenant:hpc", ledger.read("tenant:hpc").version, [Ticket(entry, 60)])
    assert guard.reconcile(store, list, lambda reservation: {}) == (1, 0)
    assert [e.id for e in ledger.read("tenant:hpc").entries] == ["ticket:under-way"]


# --- GPU shares: one unit is one GPU on every model --------------------------------------------

SHARES = QuotaResource("gpus", ("gpu.nvidia.com", "mig.nvidia.com"), gpu_share=True)
SMS = QuotaResource("sms", ("gpu.nvidia.com", "mig.nvidia.com"), counter="multiprocessors")


def _mig_fleet() -> ClusterSnapshot:
    """One H100 node and one A100 node, every GPU in the DynamicMIG layout."""
    cluster = generate(16, seed=0, mig_every=1, partly_used=False, mix=(H100, A100))
    return ClusterSnapshot.build(cluster.slices, nodes=cluster.nodes)


@pytest.mark.parametrize(
    ("model", "device", "shares", "sms"),
    [
        pytest.param("h100", "gpu-0", 1000, 0, id="h100-whole-gpu-is-one"),
        pytest.param("h100", "gpu-0-mig-1g10gb-19-0", 125, 0, id="h100-1g-takes-one-eighth"),
        pytest.param("h100", "gpu-0-mig-3g40gb-9-0", 500, 0, id="h100-3g-takes-four-slices"),
        pytest.param("h100", "gpu-0-mig-7g80gb-0-0", 1000, 0, id="h100-7g-is-the-whole-gpu"),
        pytest.param("a100", "gpu-0", 1000, 98_000, id="a100-whole-gpu-is-one"),
        pytest.param("a100", "gpu-0-mig-2g20gb-14-0", 250, 28_000, id="a100-2g-takes-two-slices"),
    ],
)
def test_a_gpu_share_counts_the_memory_slices_a_device_takes(
    model: str, device: str, shares: int, sms: int
) -> None:
    """The H100 MIG table knows no SMs for some profiles, so a `multiprocessors` quota counts
    nothing there (sms 0); a GPU share counts the same on both models."""
    snapshot = _mig_fleet()
    (entry,) = (
        e for e in snapshot.all_devices() if e.id.pool.startswith(model) and e.id.device == device
    )
    quotas = QuotaModel((SHARES, SMS), {"hpc": TenantQuota("hpc", "", {})})
    guard = QuotaGuard(lambda: quotas, MemoryQuotaLedger(), device_classes, SelectorCache())
    result = DeviceRequestAllocationResult("r", entry.id.driver, entry.id.pool, entry.id.device)
    usage = guard.usage(snapshot, scope_of(entry), [AllocationResult((result,))], "hpc/x")
    assert usage == {"gpus": shares, "sms": sms}


# --- a reload that moves a tenant to another tree -----------------------------------------------


def _tree(parent: str) -> QuotaModel:
    """team-a in cohort research, whose parent is `parent` ("": research is a root)."""
    return QuotaModel(
        (QuotaResource("gpus", ("gpu.nvidia.com",)),),
        {
            "team-a": TenantQuota("team-a", "research", {"gpus": QuotaLimits(4000)}),
            "hpc": TenantQuota("hpc", "org", {"gpus": QuotaLimits(2000)}),
        },
        cohorts={
            "org": CohortQuota("org"),
            "research": CohortQuota("research", parent),
        },
    )


def test_a_reload_that_moves_a_tenant_moves_its_ledger_entries() -> None:
    """research joins org (one tree, one ledger): team-a's entries, leased and committed,
    move from research's ledger to org's before the guard rules on the new tree."""
    models = [_tree("")]
    ledger = MemoryQuotaLedger()
    guard = QuotaGuard(lambda: models[-1], ledger, dict, SelectorCache())
    leased = _take(guard, "team-a/job/1", {"gpus": 3000})
    assert not isinstance(leased, tuple) and leased is not None
    committed = QuotaEntry("res-held@n1", "team-a", {"gpus": 1000}, None)
    assert ledger.take(
        "cohort:research", ledger.read("cohort:research").version, [Ticket(committed, 60)]
    )
    ledger.commit("cohort:research", "res-held@n1")
    models.append(_tree("org"))
    assert guard.usage_around("team-a/job/2") == {"team-a": {"gpus": 4000}}
    moved = {e.id: e.expires_at for e in ledger.read("cohort:org").entries}
    assert moved.keys() == {leased.ticket, "res-held@n1"} and moved["res-held@n1"] is None
    assert ledger.read("cohort:research").entries == ()


def test_the_reconciler_moves_what_a_replica_missed() -> None:
    """A replica that never saw the old tree (started after research left org) finds
    team-a's committed entry in org's ledger, which hpc still uses: the reconciler backfills
    the live reservation into research's ledger and drops the stale entry, so it is counted
    once, where the rule reads it."""
    model = _tree("")
    ledger = MemoryQuotaLedger()
    guard = QuotaGuard(lambda: model, ledger, dict, SelectorCache())
    stale = QuotaEntry("res-a@n1", "team-a", {"gpus": 1000}, None)
    assert ledger.take("cohort:org", ledger.read("cohort:org").version, [Ticket(stale, 60)])
    ledger.commit("cohort:org", "res-a@n1")
    held = Reservation(
        "res-a@n1", "team-a/job/1", "n1", (), (), Hold(), ReservationState.COMMITTED, 1, 0.0, None
    )
    found = guard.reconcile(MemoryReservationStore(), lambda: [held], lambda r: {"gpus": 1000})
    assert found == (1, 1)
    assert ledger.read("cohort:org").entries == ()
    [entry] = ledger.read("cohort:research").entries
    assert (entry.id, entry.amounts, entry.expires_at) == ("res-a@n1", {"gpus": 1000}, None)


# --- usage decayed with a half-life (admission fair sharing) ------------------------------------


def test_usage_is_sampled_every_interval_with_its_half_life() -> None:
    """Two tenants of one cohort, a 10-minute half-life sampled every 5 minutes by the ledger's
    clock: the first look starts everyone at 0; team-a holds 4 GPUs; a look before 5 minutes
    samples nothing; after 5 minutes team-a's decayed usage is 4 * (1 - 0.5 ** 0.5); two
    guards (replicas) looking at once write one sample; QuotaStatus shows it, weighted."""
    now = [1_700_000_000.0]
    ledger = MemoryQuotaLedger(lambda: now[0])
    model = QuotaModel(
        (QuotaResource("gpus", ("gpu.nvidia.com",)),),
        {
            t: TenantQuota(t, "research", {"gpus": QuotaLimits(4000)}, weight=weight)
            for t, weight in (("team-a", Fraction(2)), ("team-b", Fraction(1)))
        },
        admission_fair_sharing=AdmissionFairSharing(600.0, 300.0, {"gpus": Fraction(3)}),
    )
    guard = QuotaGuard(lambda: model, ledger, dict, SelectorCache())
    replica = QuotaGuard(lambda: model, ledger, dict, SelectorCache())
    assert guard.sample_usage() == 1
    first = ledger.read_consumed("cohort:research")
    assert {t: c.amounts for t, c in first.tenants.items()} == {"team-a": {}, "team-b": {}}
    grant = _take(guard, "team-a/job/1", {"gpus": 4000}, 3600)
    assert grant is not None and not isinstance(grant, tuple)
    now[0] += 299
    assert guard.sample_usage() == 0  # not due yet
    now[0] += 1
    assert guard.sample_usage() + replica.sample_usage() == 1  # one of them wrote it
    [a, b] = guard.status()
    expected = 4000 * (1 - 0.5**0.5)
    assert a.decayed is not None and math.isclose(a.decayed, expected)
    assert a.decayed_usage is not None and math.isclose(a.decayed_usage, 3 * expected / 1000 / 2)
    assert (a.decayed_at, b.decayed, b.decayed_usage) == (now[0], 0.0, 0.0)


def test_no_decay_configured_shows_none_and_samples_nothing() -> None:
    model = QuotaModel(
        (QuotaResource("gpus", ("gpu.nvidia.com",)),),
        {"hpc": TenantQuota("hpc", "", {"gpus": QuotaLimits(8000)})},
    )
    ledger = MemoryQuotaLedger()
    guard = QuotaGuard(lambda: model, ledger, dict, SelectorCache())
    assert guard.sample_usage() == 0
    [row] = guard.status()
    assert (row.decayed, row.decayed_usage, row.decayed_at) == (None, None, None)
    assert ledger.read_consumed("tenant:hpc").tenants == {}


# --- a batch's grants: one compare-and-set per ledger -----------------------------------------


class CountingLedger(MemoryQuotaLedger):
    """Counts the compare-and-sets; `before_take` runs once before the first (another
    replica's grant racing the batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.takes = 0
        self.before_take: list[QuotaEntry] = []

    def take(self, cohort: str, version: int, tickets: Sequence[Ticket]) -> bool:
        racing, self.before_take = self.before_take, []
        for entry in racing:
            assert super().take(cohort, self.read(cohort).version, [Ticket(entry, 60)])
        self.takes += 1
        return super().take(cohort, version, tickets)


def _hpc_model(gpus: int) -> QuotaModel:
    return QuotaModel(
        (QuotaResource("gpus", ("gpu.nvidia.com",)),),
        {"hpc": TenantQuota("hpc", "", {"gpus": QuotaLimits(gpus * 1000)})},
    )


def test_a_batch_is_admitted_in_order_and_taken_in_one_compare_and_set() -> None:
    """hpc may hold 3 GPUs: of four one-GPU grants and an unlimited tenant's, the fourth is
    refused when it is admitted (before the next item would be solved); the others' tickets
    are one compare-and-set, then bound in one step."""
    ledger = CountingLedger()
    guard = QuotaGuard(lambda: _hpc_model(3), ledger, dict, SelectorCache())
    tally = QuotaTally(guard)
    admitted = [tally.admit(QuotaAsk(f"hpc/job/{i}", ({"gpus": 1000},), 60)) for i in range(4)]
    other = tally.admit(QuotaAsk("free/job/1", ({"gpus": 1000},), 60))
    assert admitted[:3] == [0, 1, 2] and other == 3
    refused = admitted[3]
    assert isinstance(refused, tuple) and refused[0].tenant == "hpc"
    taken = tally.take()
    assert ledger.takes == 1
    assert taken[3] is None  # not limited: no ticket
    grants = [g for g in taken if g is not None and not isinstance(g, tuple)]
    assert len(grants) == 3
    held = Reservation(
        "res-0@n1", "hpc/job/0", "n1", (), (), Hold(), ReservationState.RESERVED, 1, 0.0, 60.0
    )
    tally.bind([(grants[0], [held])])
    tally.abandon(grants[1:])
    assert [(e.id, e.amounts) for e in ledger.read("tenant:hpc").entries] == [
        ("res-0@n1", {"gpus": 1000})
    ]


def test_a_ledger_that_moved_is_read_again_and_the_batch_checked_again() -> None:
    """Another replica takes 2 of hpc's 3 GPUs between the batch's read and its take: the
    batch's grants are checked again on the new read, in order: the first still fits, the
    second is refused now, and nothing goes over the quota."""
    ledger = CountingLedger()
    guard = QuotaGuard(lambda: _hpc_model(3), ledger, dict, SelectorCache())
    tally = QuotaTally(guard)
    for i in range(2):
        assert tally.admit(QuotaAsk(f"hpc/job/{i}", ({"gpus": 1000},), 60)) == i
    ledger.before_take = [QuotaEntry("res-racing@n2", "hpc", {"gpus": 2000}, None)]
    first, second = tally.take()
    assert ledger.takes == 2
    assert first is not None and not isinstance(first, tuple)
    assert isinstance(second, tuple) and second[0].tenant == "hpc"
    held = sum(e.amounts["gpus"] for e in ledger.read("tenant:hpc").entries)
    assert held == 3000
