"""The quota ledger: per cohort, the entries that count against its tenants' quotas.

An entry is one grant's amounts for one tenant: a *ticket* while its grant is being made, then
one entry per reservation (named by the reservation id). A leased entry expires by the ledger's
clock; a committed one lasts until dropped. Usage = the sum of a cohort's live entries.

The ledger is a compare-and-set store, not a rule engine: `read` returns the cohort's entries and
a version; `take` adds an entry only if the version is unchanged (the version grows with every
take), so a grant checked against a read is added atomically with that check. Entries that
expire or are dropped between the read and the take only lower the usage, which keeps the
check safe. The rule itself lives in services/common/security/quota.py.

Implementations: `MemoryQuotaLedger` (here: embedded, tests) and `RedisQuotaLedger`
(adapters/redis_quota.py: one hash slot per cohort, Redis functions). One contract suite runs
against both (tests/contract/test_quota_ledger.py).
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from services.common.security.quota import Usage, add_usage

__all__ = ["LedgerRead", "MemoryQuotaLedger", "QuotaEntry", "QuotaLedger", "usage_by_tenant"]


@dataclass(frozen=True)
class QuotaEntry:
    id: str  # `ticket:<hex>` while a grant is made, then the reservation's id
    tenant: str
    amounts: Usage
    expires_at: float | None  # seconds since the epoch by the ledger's clock; None: committed


@dataclass(frozen=True)
class LedgerRead:
    version: int
    entries: tuple[QuotaEntry, ...]  # live ones only, sorted by id


class QuotaLedger(Protocol):
    def read(self, cohort: str) -> LedgerRead: ...

    def take(self, cohort: str, version: int, entry: QuotaEntry, lease_seconds: float) -> bool:
        """Add `entry` (expiring lease_seconds from now) if the cohort's version is still
        `version`; False (nothing added) when another take came first."""
        ...

    def bind(
        self, cohort: str, ticket: str, parts: Sequence[QuotaEntry], lease_seconds: float
    ) -> None:
        """Replace the ticket by `parts` (one entry per reservation of its grant), keeping the
        ticket's expiry (`lease_seconds` from now when the ticket is gone)."""
        ...

    def extend(self, cohort: str, entry_id: str, lease_seconds: float) -> bool:
        """A leased entry now expires lease_seconds from now; False if absent or committed."""
        ...

    def commit(self, cohort: str, entry_id: str) -> bool:
        """The entry no longer expires; False if absent."""
        ...

    def drop(self, cohort: str, entry_ids: Sequence[str]) -> None: ...

    def close(self) -> None: ...


class MemoryQuotaLedger:
    """The ledger in one process, behind one lock; `clock` is injectable for tests."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._cohorts: dict[str, _Cohort] = {}

    def read(self, cohort: str) -> LedgerRead:
        with self._lock:
            found = self._live(cohort)
            return LedgerRead(found.version, tuple(sorted(found.entries.values(), key=_by_id)))

    def take(self, cohort: str, version: int, entry: QuotaEntry, lease_seconds: float) -> bool:
        _check_lease(lease_seconds)
        with self._lock:
            found = self._live(cohort)
            if found.version != version:
                return False
            found.put(_with_expiry(entry, self._clock() + lease_seconds))
            found.version += 1
            return True

    def bind(
        self, cohort: str, ticket: str, parts: Sequence[QuotaEntry], lease_seconds: float
    ) -> None:
        _check_lease(lease_seconds)
        with self._lock:
            found = self._live(cohort)
            held = found.entries.pop(ticket, None)
            expires = held.expires_at if held is not None else self._clock() + lease_seconds
            for part in parts:
                if part.id not in found.entries:  # an idempotent replay keeps its entry
                    found.put(_with_expiry(part, expires))

    def extend(self, cohort: str, entry_id: str, lease_seconds: float) -> bool:
        _check_lease(lease_seconds)
        with self._lock:
            found = self._live(cohort)
            entry = found.entries.get(entry_id)
            if entry is None or entry.expires_at is None:
                return False
            found.put(_with_expiry(entry, self._clock() + lease_seconds))
            return True

    def commit(self, cohort: str, entry_id: str) -> bool:
        with self._lock:
            found = self._live(cohort)
            entry = found.entries.get(entry_id)
            if entry is None:
                return False
            found.put(_with_expiry(entry, None))
            return True

    def drop(self, cohort: str, entry_ids: Sequence[str]) -> None:
        with self._lock:
            found = self._live(cohort)
            for entry_id in entry_ids:
                found.entries.pop(entry_id, None)

    def close(self) -> None:
        pass

    def _live(self, cohort: str) -> _Cohort:
        found = self._cohorts.setdefault(cohort, _Cohort())
        found.expire(self._clock())
        return found


class _Cohort:
    def __init__(self) -> None:
        self.version = 0
        self.entries: dict[str, QuotaEntry] = {}
        self._due: list[tuple[float, str]] = []  # (expiry, id); stale items are skipped

    def put(self, entry: QuotaEntry) -> None:
        self.entries[entry.id] = entry
        if entry.expires_at is not None:
            heapq.heappush(self._due, (entry.expires_at, entry.id))

    def expire(self, now: float) -> None:
        while self._due and self._due[0][0] <= now:
            expires, entry_id = heapq.heappop(self._due)
            entry = self.entries.get(entry_id)
            if entry is not None and entry.expires_at == expires:
                del self.entries[entry_id]


def _with_expiry(entry: QuotaEntry, expires_at: float | None) -> QuotaEntry:
    return QuotaEntry(entry.id, entry.tenant, dict(entry.amounts), expires_at)


def _by_id(entry: QuotaEntry) -> str:
    return entry.id


def _check_lease(lease_seconds: float) -> None:
    if not (math.isfinite(lease_seconds) and lease_seconds > 0):
        raise ValueError(f"lease_seconds must be > 0, got {lease_seconds}")


def usage_by_tenant(entries: Sequence[QuotaEntry]) -> dict[str, dict[str, int]]:
    """tenant -> the sum of its entries' amounts."""
    total: dict[str, dict[str, int]] = {}
    for entry in entries:
        add_usage(total, entry.tenant, entry.amounts)
    return total
