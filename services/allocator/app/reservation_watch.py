"""WatchReservations: the store's change events, fanned out to this process's streams.

A holder whose reservation a preemption revokes learns it here at once (a PREEMPTED change
naming the preemptor), rather than on its next Commit, Renew or Release. Every allocator
process receives every replica's changes (the store's events, which `Holdings` subscribes to),
so a watcher connected to any replica sees them all.

- `publish(event)` is called on the store subscription's thread for every event; it only
  hands the change to each watcher's bounded queue, never blocks, and never filters.
- `watch(wants, ...)` is one stream: the changes `wants` accepts (the edge's filter: the
  caller's tenant, an owner, a node), a HEARTBEAT after `heartbeat_seconds` without one (a
  quiet stream is told from a dead one), until `is_active()` turns false or the watch closes.
- Changes are hints, as the store's events are (pub/sub is at-most-once): a client that must
  not miss one lists its reservations after the stream opens. A watcher that falls
  `queue_size` changes behind loses the oldest it had not read and gets a RESYNC (list again)
  in their place.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from services.allocator.reservations.model import ReservationEvent, ReservationEventOp

__all__ = ["ChangeKind", "ReservationChange", "ReservationWatch"]


class ChangeKind(StrEnum):
    RESERVED = "reserved"
    COMMITTED = "committed"
    RENEWED = "renewed"
    RELEASED = "released"
    EXPIRED = "expired"
    PREEMPTED = "preempted"  # revoked by a preemption: `preempted_by` names the preemptor
    HEARTBEAT = "heartbeat"  # nothing to send for a while: the stream is alive
    RESYNC = "resync"  # changes were lost (a slow reader): list the reservations again


_KINDS = {
    ReservationEventOp.RESERVE: ChangeKind.RESERVED,
    ReservationEventOp.COMMIT: ChangeKind.COMMITTED,
    ReservationEventOp.RENEW: ChangeKind.RENEWED,
    ReservationEventOp.RELEASE: ChangeKind.RELEASED,
    ReservationEventOp.EXPIRE: ChangeKind.EXPIRED,
}


@dataclass(frozen=True)
class ReservationChange:
    kind: ChangeKind
    reservation_id: str = ""
    node: str = ""
    owner: str = ""  # "" from a store version that did not publish owners
    fencing_token: int = 0
    preempted_by: str = ""

    @classmethod
    def of(cls, event: ReservationEvent) -> ReservationChange:
        kind = ChangeKind.PREEMPTED if event.preempted_by else _KINDS[event.op]
        return cls(kind, event.id, event.node, event.owner, event.fencing_token, event.preempted_by)


HEARTBEAT = ReservationChange(ChangeKind.HEARTBEAT)
RESYNC = ReservationChange(ChangeKind.RESYNC)


class _Watcher:
    """One stream's queue: the newest `size` changes; `lost` once older ones were dropped."""

    def __init__(self, size: int) -> None:
        self.changes: collections.deque[ReservationChange] = collections.deque(maxlen=size)
        self.lost = False
        self.ready = threading.Condition()


class ReservationWatch:
    def __init__(self, *, queue_size: int = 1024) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        self._queue_size = queue_size
        self._lock = threading.Lock()
        self._watchers: list[_Watcher] = []
        self._closed = False

    @property
    def watchers(self) -> int:
        with self._lock:
            return len(self._watchers)

    def publish(self, event: ReservationEvent) -> None:
        change = ReservationChange.of(event)
        with self._lock:
            watchers = tuple(self._watchers)
        for watcher in watchers:
            with watcher.ready:
                if len(watcher.changes) == watcher.changes.maxlen:
                    watcher.lost = True  # the deque drops the oldest
                watcher.changes.append(change)
                watcher.ready.notify()

    def watch(
        self,
        wants: Callable[[ReservationChange], bool],
        *,
        heartbeat_seconds: float | None = None,
        wait_seconds: float = 1.0,
        is_active: Callable[[], bool] = lambda: True,
    ) -> Iterator[ReservationChange]:
        """The changes `wants` accepts, as they come (see the module docstring). Checks
        `is_active` at least every `wait_seconds`."""
        watcher = _Watcher(self._queue_size)
        with self._lock:
            if self._closed:
                return
            self._watchers.append(watcher)
        try:
            last_sent = time.monotonic()
            while is_active():
                due = None if heartbeat_seconds is None else last_sent + heartbeat_seconds
                batch, lost = self._next(watcher, due, wait_seconds)
                if self._closed:
                    return
                if lost:
                    yield RESYNC
                    last_sent = time.monotonic()
                for change in batch:
                    if wants(change):
                        yield change
                        last_sent = time.monotonic()
                quiet = time.monotonic() - last_sent
                if heartbeat_seconds is not None and quiet >= heartbeat_seconds:
                    yield HEARTBEAT
                    last_sent = time.monotonic()
        finally:
            with self._lock:
                if watcher in self._watchers:
                    self._watchers.remove(watcher)

    def _next(
        self, watcher: _Watcher, heartbeat_due: float | None, wait_seconds: float
    ) -> tuple[list[ReservationChange], bool]:
        """What the watcher has (and whether it lost any), once it has something, the
        heartbeat is due, `wait_seconds` passed, or the watch closed."""
        until = time.monotonic() + wait_seconds
        if heartbeat_due is not None:
            until = min(until, heartbeat_due)
        with watcher.ready:
            while not watcher.changes and not watcher.lost and not self._closed:
                left = until - time.monotonic()
                if left <= 0:
                    break
                watcher.ready.wait(left)
            batch, lost = list(watcher.changes), watcher.lost
            watcher.changes.clear()
            watcher.lost = False
        return batch, lost

    def close(self) -> None:
        """End every stream (each returns after its current wait)."""
        with self._lock:
            self._closed = True
            watchers = tuple(self._watchers)
        for watcher in watchers:
            with watcher.ready:
                watcher.ready.notify_all()
