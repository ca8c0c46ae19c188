"""The quota guard's compare-and-set on a ledger that always loses the race: a bounded number
of attempts, then UNAVAILABLE (docs/tenancy.md)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from loadtest.clusters import A100, H100, device_classes, generate
from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.adapters.store.memory_quota import MemoryQuotaLedger
from services.allocator.app.quotas import QuotaGuard, QuotaSettings
from services.allocator.core import ClusterSnapshot, SelectorCache
from services.allocator.reservations.holds import scope_of
from services.allocator.reservations.model import Hold, Reservation, ReservationState
from services.allocator.reservations.quota_ledger import QuotaEntry
from services.common.dra.model import AllocationResult, DeviceRequestAllocationResult
from services.common.errors import Unavailable
from services.common.security.fair_sharing import AdmissionFairSharing
from services.common.security.quota import (
    CohortQuota,
    QuotaLimits,
    QuotaModel,
    QuotaResource,
    TenantQuota,
)


class AlwaysContended(MemoryQuotaLedger):
    """Another grant always comes first: every take finds the version moved."""

    def __init__(self) -> None:
        super().__init__()
        self.takes = 0

    def take(self, cohort: str, version: int, entry: QuotaEntry, lease_seconds: float) -> bool:
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
        guard.take("hpc/job/1", [{"gpus": 1000}], 60)
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
        assert ledger.take("tenant:hpc", ledger.read("tenant:hpc").version, entry, 60)
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
    usage = guard.usage(snapshot, scope_of(entry), [AllocationResult((result,))])
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
    leased = guard.take("team-a/job/1", [{"gpus": 3000}], 60)
    assert not isinstance(leased, tuple) and leased is not None
    committed = QuotaEntry("res-held@n1", "team-a", {"gpus": 1000}, None)
    assert ledger.take("cohort:research", ledger.read("cohort:research").version, committed, 60)
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
    assert ledger.take("cohort:org", ledger.read("cohort:org").version, stale, 60)
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
    grant = guard.take("team-a/job/1", [{"gpus": 4000}], 3600)
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
