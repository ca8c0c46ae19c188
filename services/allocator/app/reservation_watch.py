"""WatchReservations: the store's change events, fanned out to this process's streams.

A holder whose reservation a preemption revokes learns it here at once (a PREEMPTED change
naming the preemptor), rather than on its next Commit, Renew or Release. Every allocator
process receives every replica's changes (the store's events, which `Holdings` subscribes to),
so a watcher connected to any replica sees them all.

- `watch(view, ...)` is one stream. Its first change is a HEARTBEAT, sent once the stream is
  registered: every change published from then on reaches it, so a client that lists its
  reservations after that first message misses nothing. Then the changes as `view` shows them
  (the edge's filter: the caller's tenant, an owner, a node; None: not sent), and a HEARTBEAT
  after `heartbeat_seconds` without anything (a quiet stream is told from a dead one), until
  `is_active()` turns false or the watch closes.
- `publish(event)` is called on the store subscription's thread for every event; it applies
  each stream's `view` and hands what is shown to the stream's bounded queue, never blocking.
- Changes are hints, as the store's events are (pub/sub is at-most-once). A stream that falls
  `queue_size` of its own changes behind loses the oldest it had not read and gets a RESYNC
  (list again) in their place. An event without an owner (published by a replica from before
  owners were published, during a rolling upgrade) is sent to a stream that sees it (a reader
  of every tenant), and is a RESYNC for the others, which cannot tell whether it was theirs.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import StrEnum

from services.allocator.reservations.binding import BINDING_REVOKED_BY
from services.allocator.reservations.model import ReservationEvent, ReservationEventOp

__all__ = ["ChangeKind", "ReservationChange", "ReservationWatch", "View"]

log = logging.getLogger(__name__)


class ChangeKind(StrEnum):
    RESERVED = "reserved"
    COMMITTED = "committed"
    RENEWED = "renewed"
    RELEASED = "released"
    EXPIRED = "expired"
    PREEMPTED = "preempted"  # revoked by a preemption: `preempted_by` names the preemptor
    CONDITIONS = "conditions"  # device conditions were reported: read it for its binding
    BINDING_FAILED = "binding-failed"  # released: `preempted_by` is `binding: <why>`
    HEARTBEAT = "heartbeat"  # nothing to send for a while: the stream is alive
    RESYNC = "resync"  # changes were lost (a slow reader): list the reservations again


_KINDS = {
    ReservationEventOp.RESERVE: ChangeKind.RESERVED,
    ReservationEventOp.COMMIT: ChangeKind.COMMITTED,
    ReservationEventOp.RENEW: ChangeKind.RENEWED,
    ReservationEventOp.RELEASE: ChangeKind.RELEASED,
    ReservationEventOp.EXPIRE: ChangeKind.EXPIRED,
    ReservationEventOp.CONDITIONS: ChangeKind.CONDITIONS,
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
        kind = _KINDS[event.op]
        if event.preempted_by:
            failed = event.preempted_by.startswith(BINDING_REVOKED_BY)
            kind = ChangeKind.BINDING_FAILED if failed else ChangeKind.PREEMPTED
        return cls(kind, event.id, event.node, event.owner, event.fencing_token, event.preempted_by)


HEARTBEAT = ReservationChange(ChangeKind.HEARTBEAT)
RESYNC = ReservationChange(ChangeKind.RESYNC)


View = Callable[[ReservationChange], ReservationChange | None]
"""A stream's filter: the change as its caller is shown it, or None when it is not sent."""


class _Watcher:
    """One stream: its view, and a queue of the newest `size` changes it is shown; `lost` once
    older ones were dropped (or one it could not tell was its own came)."""

    def __init__(self, view: View, size: int) -> None:
        self.view = view
        self.changes: collections.deque[ReservationChange] = collections.deque(maxlen=size)
        self.lost = False
        self.ready = threading.Condition()

    def offer(self, change: ReservationChange) -> None:
        try:
            shown = self.view(change)
        except Exception:  # a filter's bug must not cost the other streams their change
            log.exception("reservation watch: the filter failed on %s", change)
            shown, change = None, replace(change, owner="")
        with self.ready:
            if shown is None and change.owner:
                return
            if shown is None:
                self.lost = True  # whose it was is unknown: the stream lists again
            else:
                if len(self.changes) == self.changes.maxlen:
                    self.lost = True  # the deque drops the oldest
                self.changes.append(shown)
            self.ready.notify()


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

    @property
    def watching(self) -> bool:
        """Whether a stream is open (read without the lock, as `publish` reads it)."""
        return bool(self._watchers)

    def publish(self, event: ReservationEvent) -> None:
        # The common case: no stream open, nothing to build. Read without the lock (once per
        # store event): a stream registered before this call is in the list already.
        if not self._watchers:
            return
        with self._lock:
            watchers = tuple(self._watchers)
        change = ReservationChange.of(event)
        for watcher in watchers:
            watcher.offer(change)

    def watch(
        self,
        view: View,
        *,
        heartbeat_seconds: float | None = None,
        wait_seconds: float = 1.0,
        is_active: Callable[[], bool] = lambda: True,
    ) -> Iterator[ReservationChange]:
        """The changes as `view` shows them, after a first HEARTBEAT (see the module
        docstring). Checks `is_active` at least every `wait_seconds`."""
        watcher = _Watcher(view, self._queue_size)
        with self._lock:
            if self._closed:
                return
            self._watchers.append(watcher)
        try:
            yield HEARTBEAT  # registered: nothing published from here on is missed
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
