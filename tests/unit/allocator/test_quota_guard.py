"""The quota guard's compare-and-set on a ledger that always loses the race: a bounded number
of attempts, then UNAVAILABLE (docs/tenancy.md)."""

from __future__ import annotations

import pytest

from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.adapters.store.memory_quota import MemoryQuotaLedger
from services.allocator.app.quotas import QuotaGuard, QuotaSettings
from services.allocator.core import SelectorCache
from services.allocator.reservations.quota_ledger import QuotaEntry
from services.common.errors import Unavailable
from services.common.security.quota import QuotaLimits, QuotaModel, QuotaResource, TenantQuota


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
