"""A ReservationStore that times every operation of the store it wraps, for the metrics.

`gpualloc.store.duration` (ms) per `operation` (reserve, commit, live, expire, ...) and
`outcome`: `ok`, the typed error's name for answers the store gives (`Conflict`, `NotFound`,
...), `Unavailable` when the store cannot be reached; `gpualloc.store.errors` counts the calls
that failed for the store's own reasons (Unavailable, DeadlineExceeded, or a bug), not the
answers about a caller's request. Built only when telemetry is on (no cost otherwise).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from services.allocator.app.telemetry import AllocatorMetrics
from services.allocator.reservations.model import (
    PENDING_IDS_SHOWN,
    DeviceCondition,
    PendingPreemptions,
    Reservation,
    ReservationEvent,
    ReservationStore,
    ReserveOutcome,
    ReserveRequest,
    Subscription,
)
from services.common.errors import DeadlineExceeded, GpuallocError, Unavailable

__all__ = ["MeteredStore"]

T = TypeVar("T")
_STORE_FAULTS = (Unavailable, DeadlineExceeded)


class MeteredStore:
    """Every ReservationStore call goes to `store`, timed."""

    def __init__(self, store: ReservationStore, metrics: AllocatorMetrics) -> None:
        self.inner = store
        self._metrics = metrics

    def _timed(self, operation: str, call: Callable[[], T]) -> T:
        started = time.perf_counter()
        outcome = "ok"
        try:
            return call()
        except GpuallocError as error:
            outcome = type(error).__name__
            if isinstance(error, _STORE_FAULTS):
                self._metrics.store_errors.add(1, {"operation": operation, "outcome": outcome})
            raise
        except Exception:
            outcome = "error"
            self._metrics.store_errors.add(1, {"operation": operation, "outcome": outcome})
            raise
        finally:
            self._metrics.store_duration.record(
                time.perf_counter() - started, {"operation": operation, "outcome": outcome}
            )

    def reserve(self, placements: Sequence[Sequence[ReserveRequest]]) -> list[ReserveOutcome]:
        return self._timed("reserve", lambda: self.inner.reserve(placements))

    def commit(self, reservation_id: str, owner: str, fencing_token: int = 0) -> Reservation:
        return self._timed(
            "commit", lambda: self.inner.commit(reservation_id, owner, fencing_token)
        )

    def renew(self, reservation_id: str, owner: str, lease_seconds: float) -> Reservation:
        return self._timed("renew", lambda: self.inner.renew(reservation_id, owner, lease_seconds))

    def release(self, reservation_id: str, owner: str, fencing_token: int = 0) -> None:
        self._timed("release", lambda: self.inner.release(reservation_id, owner, fencing_token))

    def revoke(self, reservation_id: str, fencing_token: int, by: str) -> None:
        self._timed("revoke", lambda: self.inner.revoke(reservation_id, fencing_token, by))

    def report_conditions(
        self, reservation_id: str, fencing_token: int, conditions: Sequence[DeviceCondition]
    ) -> Reservation:
        return self._timed(
            "report_conditions",
            lambda: self.inner.report_conditions(reservation_id, fencing_token, conditions),
        )

    def pending_preemptions(
        self, tenants: Sequence[str], max_ids: int = PENDING_IDS_SHOWN
    ) -> dict[str, PendingPreemptions]:
        return self._timed("pending", lambda: self.inner.pending_preemptions(tenants, max_ids))

    def get(self, reservation_id: str) -> Reservation:
        return self._timed("get", lambda: self.inner.get(reservation_id))

    def list(self, owner: str = "", node: str = "") -> Sequence[Reservation]:
        return self._timed("list", lambda: self.inner.list(owner, node))

    def live(self) -> Sequence[Reservation]:
        return self._timed("live", self.inner.live)

    def expire(self) -> int:
        return self._timed("expire", self.inner.expire)

    def subscribe(self, callback: Callable[[ReservationEvent], None]) -> Subscription:
        return self.inner.subscribe(callback)

    def close(self) -> None:
        self.inner.close()
