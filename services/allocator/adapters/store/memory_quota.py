"""The quota ledger in one process, behind one lock: embedded servers and tests.

The port and its rules are services/allocator/reservations/quota_ledger.py; one contract suite runs
against this ledger and the Redis one (tests/contract/test_quota_ledger.py).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from services.allocator.core import ConsumedUsage
from services.allocator.reservations.quota_ledger import (
    ConsumedRead,
    LedgerRead,
    QuotaEntry,
    Ticket,
    TicketBinding,
    check_lease,
)

__all__ = ["MemoryQuotaLedger"]


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

    def take(self, cohort: str, version: int, tickets: Sequence[Ticket]) -> bool:
        for ticket in tickets:
            check_lease(ticket.lease_seconds)
        with self._lock:
            found = self._live(cohort)
            if found.version != version:
                return False
            now = self._clock()
            for ticket in tickets:
                found.put(_with_expiry(ticket.entry, now + ticket.lease_seconds))
            found.version += 1
            return True

    def bind(self, cohort: str, bindings: Sequence[TicketBinding]) -> None:
        for binding in bindings:
            check_lease(binding.lease_seconds)
        with self._lock:
            found = self._live(cohort)
            for binding in bindings:
                held = found.entries.pop(binding.ticket, None)
                expires = (
                    held.expires_at if held is not None else self._clock() + binding.lease_seconds
                )
                for part in binding.parts:
                    if part.id not in found.entries:  # an idempotent replay keeps its entry
                        found.put(_with_expiry(part, expires))

    def extend(self, cohort: str, entry_id: str, lease_seconds: float) -> bool:
        check_lease(lease_seconds)
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

    def read_consumed(self, cohort: str) -> ConsumedRead:
        with self._lock:
            found = self._live(cohort)
            return ConsumedRead(found.consumed_version, self._clock(), dict(found.consumed))

    def put_consumed(self, cohort: str, version: int, tenants: Mapping[str, ConsumedUsage]) -> bool:
        with self._lock:
            found = self._live(cohort)
            if found.consumed_version != version:
                return False
            found.consumed = dict(tenants)
            found.consumed_version += 1
            return True

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
        self.consumed: dict[str, ConsumedUsage] = {}
        self.consumed_version = 0
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
