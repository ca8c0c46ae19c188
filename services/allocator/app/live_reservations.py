"""Holdings: this process's view of the live reservations, as the solver's AllocatedState.

The reservation store is the truth; every allocator process (worker or replica) keeps a local
copy so that Allocate never waits for Redis:

- at start, `store.live()`;
- then the store's change events (other replicas' reserves, releases, expiries), applied on
  the subscription's thread as they come: releases and expiries drop ids, commits mark them;
  the events of this process's own changes stop at a dictionary lookup (the Redis store an
  allocator builds does not deliver its own reserves' at all: `quiet_own_reserves`, while no
  WatchReservations stream is open). Reserves of unknown ids are left to a fetch thread —
  after `_FETCH_GRACE` on a node where this process has a placement pending (its own
  reserve's event usually arrives before the reservation is settled here), fetched only if
  still unknown then;
- and this process's own operations (`added` / `removed`), at once, so that the next Allocate
  in this process already avoids what it just reserved;
- placements this process is reserving right now (`hold_pending`, then `settle_pending` or
  `drop_pending`; a run's placements of one allocation each as the items of one PendingRun:
  `hold_in_run`, then `settle_run`): concurrent solves in this process avoid them while the
  store decides, so callers of one process do not race each other for the same devices (they
  would all pick the same best devices, and all but one would lose at the store and solve
  again);
- a janitor thread runs `store.expire()` every `expire_interval` (freeing due leases and
  publishing their expiry) and a full `refresh()` every `refresh_interval`, because pub/sub
  is at-most-once; after the store was unreachable it refreshes at the first success.

The copy may lag; that is safe: reserving re-checks everything atomically in the store, and a
Conflict makes the service `refresh(node)` and solve again (what the node's refresh finds is
applied like the events it stands for; a conflict the refreshed state does not explain
rebuilds it).
Ids removed locally are remembered for a while (tombstones), so a late event or fetch cannot
resurrect a released reservation.

`state_for(view)` turns the copy (and the pending placements) into an AllocatedState over a
view's snapshot, owners being reservation ids (Explain names them; a pending placement is owned
by `pending:<n>`). It is cached per (view, version); a new view rebases the cached state, the
changes since are applied incrementally (to one copy, or to a run's offered solve state itself:
`offer`) while they are fewer than half the holdings (a batch's placements and their settling
are a few hundred changes: cheaper applied than a rebuild over every reservation), anything
bigger rebuilds.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from services.allocator.app.cluster_view import ViewSnapshot
from services.allocator.core import AllocatedState
from services.allocator.reservations.hold_kinds import HoldKind
from services.allocator.reservations.model import (
    Reservation,
    ReservationEvent,
    ReservationEventOp,
    ReservationState,
    ReservationStore,
    Subscription,
)
from services.common.dra.model import AllocationResult
from services.common.errors import GpuallocError, NotFound, Unavailable

__all__ = ["Holdings", "PendingRun"]

log = logging.getLogger(__name__)

_TOMBSTONE_SECONDS = 300.0
# More steps than this (or than half the holdings): rebuild the state. Two runs of 64 pending
# placements and their settling fit; a rebuild also drops the node groups, which the next solve
# builds again over every node.
_INCREMENTAL_LIMIT = 256
_FETCH_GRACE = 0.05  # seconds an unknown id reserved on a node with a pending placement waits


@dataclass(frozen=True)
class _Change:
    added: Reservation | None  # None: `removed` was dropped
    removed: Reservation | None


Step = tuple[str | None, str | None, AllocationResult]
"""One `(old owner, new owner, allocation)` of the journal, as `AllocatedState.with_changes`
takes them; `(None, None, allocation)` changes nothing (a pending placement's addition taken
back before any state applied it)."""
_PENDING = HoldKind.PENDING.id("")  # a pending placement's token is this and a number


class _Pending(NamedTuple):
    """A pending placement (`Holdings.hold_pending`): what it holds, on which nodes, and where
    its addition is in the journal (`journal[start:end]`; None: the journal was dropped)."""

    allocations: tuple[AllocationResult, ...]
    nodes: tuple[str, ...]
    journal: list[Step] | None
    start: int
    end: int


class PendingRun:
    """Placements of one allocation each that a run holds pending under one token
    (`Holdings.pending_run`, `hold_in_run`, `settle_run`): item i is the i-th held."""

    __slots__ = ("allocations", "nodes", "positions", "spans", "token")

    def __init__(self, token: str) -> None:
        self.token = token
        self.allocations: list[AllocationResult] = []
        self.nodes: list[str] = []
        self.positions: list[int] = []  # each item's addition's index in its journal
        # (journal, first item) where the items' journal changed: the items of the current
        # journal's span are not applied to a state yet (None: the journal was dropped)
        self.spans: list[tuple[list[Step] | None, int]] = []

    def __len__(self) -> int:
        return len(self.allocations)


@dataclass(frozen=True, eq=False)
class _Cached:
    view: ViewSnapshot
    version: int
    state: AllocatedState


@dataclass(frozen=True, eq=False)
class _Offered:
    """A run's solve state (`Holdings.offer`): `held` is `base` with `placed` added, owner ""."""

    base: AllocatedState
    held: AllocatedState
    placed: dict[int, AllocationResult]  # by id(): the journal's steps name these objects


class Holdings:
    """Thread-safe. `on_event` sees every store event (telemetry counts expiries)."""

    def __init__(
        self,
        store: ReservationStore,
        *,
        expire_interval: float = 1.0,
        refresh_interval: float = 30.0,
        on_event: Callable[[ReservationEvent], None] | None = None,
        on_sweep: Callable[[], None] | None = None,
    ) -> None:
        """`on_sweep`: called by the janitor after each `store.expire()` (the service's
        binding timeouts)."""
        self._store = store
        self._on_sweep = on_sweep
        self._expire_interval = expire_interval
        self._refresh_interval = refresh_interval
        self._on_event = on_event
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()  # one refresh at a time
        self._by_id: dict[str, Reservation] = {}
        self._version = 0
        self._commits = 0  # commits applied: they change states, not what is held
        self._journal: list[Step] | None = []  # since the cached state
        self._pending: dict[str, _Pending] = {}  # by token
        self._runs: dict[str, PendingRun] = {}  # runs with items pending, by token
        self._pending_on: dict[str, int] = {}  # node -> pending placements there (_unknown)
        self._pending_tokens = itertools.count(1)
        self._recording: list[_Change] | None = None  # changes made while a refresh reads
        self._tombstones: dict[str, float] = {}
        self._cached: _Cached | None = None
        self._offered: _Offered | None = None  # a run's solve state, for the next state
        self._synced = False
        self._waiting: dict[str, float] = {}  # unknown reserved ids -> when to fetch them
        self._reported: set[str] = set()  # known ids to fetch again: conditions were reported
        self._wake: queue.SimpleQueue[bool | None] = queue.SimpleQueue()  # None: close
        self._closed = threading.Event()
        self._subscription: Subscription | None = None
        self._threads: list[threading.Thread] = []

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Subscribe, load what is live (a store that is down now is retried by the janitor)
        and start the background threads."""
        self._subscribe()
        try:
            self.refresh()
        except Unavailable as error:
            log.warning("reservations not loaded yet: %s", error)
        for target, name in ((self._sync, "holdings-fetch"), (self._janitor, "holdings-janitor")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _subscribe(self) -> bool:
        """Follow the store's events; False when the store cannot be reached now (the
        janitor tries again: until then only refreshes keep the copy current)."""
        try:
            self._subscription = self._store.subscribe(self._receive)
        except Exception as error:  # the store's client error types are its own business
            log.warning("cannot follow reservation events yet: %s", error)
            return False
        return True

    def close(self) -> None:
        self._closed.set()
        self._wake.put(None)
        if self._subscription is not None:
            self._subscription.close()
        for thread in self._threads:
            thread.join(timeout=5.0)

    @property
    def synced(self) -> bool:
        """Whether the live reservations were loaded at least once."""
        return self._synced

    def require_synced(self) -> None:
        if not self._synced:
            raise Unavailable("reservations not loaded yet: the reservation store is unreachable")

    # --- reads ----------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def commits(self) -> int:
        return self._commits

    def get(self, reservation_id: str) -> Reservation | None:
        return self._by_id.get(reservation_id)

    def owner_of(self, reservation_id: str) -> str | None:
        """The owner of a live reservation known here (None: unknown), for app/tenancy.py."""
        found = self._by_id.get(reservation_id)
        return found.owner if found is not None else None

    def reservations(self) -> list[Reservation]:
        with self._lock:
            return list(self._by_id.values())

    def find_idempotent(self, owner: str, idempotency_key: str) -> list[Reservation]:
        """Live reservations this copy knows for (owner, key), sorted by node."""
        with self._lock:
            found = [
                r
                for r in self._by_id.values()
                if r.owner == owner and r.idempotency_key == idempotency_key
            ]
        return sorted(found, key=lambda r: (r.node, r.id))

    def state_for(self, view: ViewSnapshot) -> AllocatedState:
        """The holdings as an AllocatedState over `view` (cached; see the module docstring)."""
        with self._lock:
            cached = self._cached
            if cached is not None and cached.view is view and cached.version == self._version:
                return cached.state
            journal = self._journal
            offered, self._offered = self._offered, None
            limit = max(_INCREMENTAL_LIMIT, len(self._by_id) // 2)
            if cached is None or journal is None or len(journal) > limit:
                held = ((r.id, a) for r in self._by_id.values() for a in r.allocations)
                pending = ((t, a) for t, p in self._pending.items() for a in p.allocations)
                runs = ((t, a) for t, run in self._runs.items() for a in run.allocations)
                state = AllocatedState.build(view.snapshot, itertools.chain(held, pending, runs))
            elif cached.view is not view:
                state = cached.state.rebase(view.snapshot)
                if journal:
                    state = state.with_changes(journal)
            else:
                state = cached.state
                steps = None
                if offered is not None and offered.base is state and journal:
                    steps = _from_offered(journal, offered.placed)
                if offered is not None and steps is not None:
                    state = offered.held.changed_in_place(steps)  # offered: no other reference
                elif journal:
                    state = state.with_changes(journal)
            self._cached = _Cached(view, self._version, state)
            self._journal = []
            return state

    def offer(
        self, base: AllocatedState, held: AllocatedState, placed: Sequence[AllocationResult]
    ) -> None:
        """A run's solve state: `held` is `base` (a state `state_for` returned) with `placed`
        added for owner "" (core solve_many), handed over: the caller keeps no reference to it
        (the next `state_for` may change it in place and return it). While `base` is still
        the cached state, the next `state_for` starts from `held` instead of applying the
        run's pending placements again: the journal's additions of `placed` (by identity: the
        pending holds, or the reservations that took them over) become renames of the ""
        holds, and what the run placed but did not hold (not taken, dropped) is removed."""
        with self._lock:
            cached = self._cached
            if cached is not None and cached.state is base and placed:
                self._offered = _Offered(base, held, {id(a): a for a in placed})

    # --- writes ---------------------------------------------------------------------------

    def added(self, reservations: Iterable[Reservation]) -> None:
        """Reservations this process made (or fetched): visible to the next solve."""
        with self._lock:
            self._add(reservations)

    def _add(self, reservations: Iterable[Reservation]) -> None:
        journal = self._journal
        for reservation in self._admit(reservations):
            if journal is not None:
                journal.extend((None, reservation.id, a) for a in reservation.allocations)

    def _admit(self, reservations: Iterable[Reservation]) -> list[Reservation]:
        """With the lock: `reservations` into the copy (not the journal); the new ones."""
        new: list[Reservation] = []
        for reservation in reservations:
            if reservation.id in self._tombstones:
                continue
            previous = self._by_id.get(reservation.id)
            self._by_id[reservation.id] = reservation
            if previous is None:
                new.append(reservation)
                self._version += 1
                if self._recording is not None:
                    self._recording.append(_Change(reservation, None))
        return new

    def removed(self, reservation_ids: Iterable[str]) -> None:
        """Reservations released or expired: their devices are free for the next solve."""
        now = time.monotonic()
        with self._lock:
            for reservation_id in reservation_ids:
                self._tombstones[reservation_id] = now
                reservation = self._by_id.pop(reservation_id, None)
                if reservation is not None:
                    self._record(_Change(None, reservation))

    def hold_pending(self, nodes: Sequence[str], allocations: Sequence[AllocationResult]) -> str:
        """A placement this process is about to reserve on `nodes`: held for its own solves
        until `settle_pending` or `drop_pending` (call one of them, always). Returns a token."""
        held = tuple(allocations)
        on = tuple(nodes)
        with self._lock:
            token = f"{_PENDING}{next(self._pending_tokens)}"
            pending_on = self._pending_on
            for node in on:
                pending_on[node] = pending_on.get(node, 0) + 1
            self._version += 1
            journal = self._journal
            if journal is None:
                self._pending[token] = _Pending(held, on, None, 0, 0)
            else:
                start = len(journal)
                if len(held) == 1:
                    journal.append((None, token, held[0]))
                else:
                    journal += [(None, token, allocation) for allocation in held]
                self._pending[token] = _Pending(held, on, journal, start, len(journal))
            return token

    def settle_pending(self, token: str, reservations: Iterable[Reservation]) -> None:
        """The store granted the placement: the reservations replace it (one step, so no
        solve sees the devices free in between)."""
        with self._lock:
            self._settle(token, reservations)

    def drop_pending(self, token: str) -> None:
        """The store refused the placement (or failed): it holds nothing any more."""
        with self._lock:
            self._drop(token)

    def pending_run(self) -> PendingRun:
        """A run's pending placements of one allocation each, under one token: `hold_in_run`
        each, then `settle_run` once (always)."""
        with self._lock:
            return PendingRun(f"{_PENDING}{next(self._pending_tokens)}")

    def hold_in_run(self, run: PendingRun, node: str, allocation: AllocationResult) -> int:
        """`hold_pending([node], [allocation])` as the next item of `run`: its index there."""
        with self._lock:
            journal = self._journal
            spans = run.spans
            if not spans or spans[-1][0] is not journal:
                spans.append((journal, len(run.allocations)))
                self._runs[run.token] = run  # at its first item (a later span: already in)
            if journal is None:
                run.positions.append(-1)
            else:
                run.positions.append(len(journal))
                journal.append((None, run.token, allocation))
            run.allocations.append(allocation)
            run.nodes.append(node)
            pending_on = self._pending_on
            pending_on[node] = pending_on.get(node, 0) + 1
            self._version += 1
            return len(run.allocations) - 1

    def settle_run(self, run: PendingRun, outcomes: Sequence[Sequence[Reservation] | None]) -> None:
        """`settle_all` of every item of `run`, in one step: item i's reservations are
        `outcomes[i]` (None: dropped). The common case, one new reservation holding the item's
        allocation, takes it over; any other frees the item and adds the reservations."""
        with self._lock:
            if self._runs.pop(run.token, None) is None:
                return  # held nothing, or settled already
            token, journal, by_id = run.token, self._journal, self._by_id
            tombstones, recording = self._tombstones, self._recording
            spans, positions = run.spans, run.positions
            fresh = len(run.allocations)  # the first item not applied to a state yet
            if journal is not None and spans[-1][0] is journal:
                fresh = spans[-1][1]
            later: list[Step] = []  # after the current journal's steps
            self._version += 1
            for index, allocation in enumerate(run.allocations):
                reservations = outcomes[index]
                new: str | None = None
                if reservations is not None:
                    if len(reservations) == 1:
                        reservation = reservations[0]
                        held = reservation.allocations
                        new = reservation.id
                        if (
                            len(held) == 1
                            and (held[0] is allocation or held[0] == allocation)
                            and new not in by_id
                            and new not in tombstones
                        ):  # the common case: one new reservation takes the item over
                            by_id[new] = reservation
                            self._version += 1
                            if recording is not None:
                                recording.append(_Change(reservation, None))
                        else:
                            new = None
                    if new is None:  # freed below; the reservations added as they are
                        later += [
                            (None, r.id, a)
                            for r in self._admit(reservations)
                            for a in r.allocations
                        ]
                if journal is None:
                    continue
                if index >= fresh:
                    journal[positions[index]] = (None, new, allocation)
                else:
                    journal.append((token, new, allocation))
            pending_on = self._pending_on
            for node in run.nodes:  # `_forget_node`, inline: one per item
                left = pending_on[node] - 1
                if left:
                    pending_on[node] = left
                else:
                    del pending_on[node]
            if journal is not None:
                journal += later

    def settle_all(self, outcomes: Iterable[tuple[str, Sequence[Reservation] | None]]) -> None:
        """`settle_pending` (reservations) or `drop_pending` (None) for each pending placement
        of a run, in one step."""
        with self._lock:
            journal, pendings, by_id = self._journal, self._pending, self._by_id
            for token, reservations in outcomes:
                if reservations is None:
                    self._drop(token)
                    continue
                pending = pendings.get(token)
                if (
                    pending is not None
                    and isinstance(reservations, Sequence)
                    and len(reservations) == 1
                ):
                    reservation = reservations[0]
                    reservation_id = reservation.id
                    if (
                        reservation.allocations == pending.allocations
                        and reservation_id not in by_id
                        and reservation_id not in self._tombstones
                    ):  # the common case: one new reservation takes the placement over
                        del pendings[token]
                        by_id[reservation_id] = reservation
                        if self._recording is not None:
                            self._recording.append(_Change(reservation, None))
                        self._version += 2  # admitted, and no longer pending
                        self._forget_nodes(pending.nodes)
                        if journal is None:
                            continue
                        if pending.journal is journal:  # not applied yet: the addition's
                            for index in range(pending.start, pending.end):
                                journal[index] = (None, reservation_id, journal[index][2])
                        else:  # a state holds it for the token: renamed
                            journal += [(token, reservation_id, a) for a in pending.allocations]
                        continue
                self._settle(token, reservations)

    def _settle(self, token: str, reservations: Iterable[Reservation]) -> None:
        """With the lock: the allocations of the placement that a new reservation carries
        change hands (the first such reservation takes each over: nothing is freed or taken),
        the rest of the placement is freed, the rest of the reservations added. While no state
        has applied the placement's addition yet, that addition becomes the reservations' in
        place (a batch settles a few hundred at once: half the changes for the next state)."""
        pending = self._pending.pop(token, None)
        journal = self._journal
        if pending is None:  # not pending (any more): plain additions
            added = self._admit(reservations)
            if journal is not None:
                journal.extend((None, r.id, a) for r in added for a in r.allocations)
            return
        self._forget_nodes(pending.nodes)
        self._version += 1
        allocations = pending.allocations
        added = self._admit(reservations)
        if journal is None:
            return
        if len(added) == 1 and added[0].allocations == allocations:  # the common case
            takes = {id(a): added[0].id for a in allocations}
            adds: list[Step] = []
        else:
            placed = {id(a) for a in allocations}
            takes = {}
            adds = []
            for reservation in added:
                for allocation in reservation.allocations:
                    key = id(allocation)
                    if key in placed and key not in takes:
                        takes[key] = reservation.id
                    else:
                        adds.append((None, reservation.id, allocation))
        if pending.journal is journal:  # not applied yet: the addition changes
            for index in range(pending.start, pending.end):
                allocation = journal[index][2]
                journal[index] = (None, takes.get(id(allocation)), allocation)
        else:
            journal.extend((token, None, a) for a in allocations if id(a) not in takes)
            journal.extend((token, takes[id(a)], a) for a in allocations if id(a) in takes)
        journal.extend(adds)

    def _drop(self, token: str) -> None:
        pending = self._pending.pop(token, None)
        if pending is None:
            return
        self._forget_nodes(pending.nodes)
        self._version += 1
        journal = self._journal
        if journal is None:
            return
        if pending.journal is journal:  # not applied yet: taken back
            for index in range(pending.start, pending.end):
                journal[index] = (None, None, journal[index][2])
        else:
            journal.extend((token, None, a) for a in pending.allocations)

    def _forget_nodes(self, nodes: tuple[str, ...]) -> None:
        """With the lock: a pending placement on `nodes` no longer counts there."""
        for node in nodes:
            self._forget_node(node)

    def _forget_node(self, node: str) -> None:
        left = self._pending_on[node] - 1
        if left:
            self._pending_on[node] = left
        else:
            del self._pending_on[node]

    def committed(self, reservation: Reservation) -> None:
        """A state change that holds the same devices: no new version (`commits` counts it)."""
        with self._lock:
            if reservation.id in self._by_id:
                self._by_id[reservation.id] = reservation
                self._commits += 1

    def refresh(self, node: str = "") -> bool:
        """Replace the copy (of one node's reservations, or all) with the store's. A node's
        refresh (after a conflict) applies what differs incrementally and returns whether
        anything did; the full one rebuilds the state (how any drift of the incremental state
        heals) and returns True."""
        with self._refreshing:
            with self._lock:
                self._recording = []
            try:
                fresh = self._store.list(node=node) if node else self._store.live()
            except BaseException:
                with self._lock:
                    self._recording = None
                raise
            with self._lock:
                recorded, self._recording = self._recording or [], None
                changed = self._replace(fresh, node, recorded)
                if not node:
                    self._synced = True
                self._prune_tombstones()
                return changed

    def rebuild(self) -> None:
        """Rebuild the state at the next solve instead of applying changes to it: after a
        conflict that the refreshed copy does not explain (the state still shows free what the
        store holds: it drifted from the copy)."""
        with self._lock:
            self._version += 1
            self._journal = None

    def _replace(self, fresh: Sequence[Reservation], node: str, recorded: list[_Change]) -> bool:
        merged = {r.id: r for r in fresh if r.id not in self._tombstones}
        if node:
            merged.update({i: r for i, r in self._by_id.items() if r.node != node})
        for change in recorded:  # what this process did while the store was read
            if change.added is not None and change.added.id not in self._tombstones:
                merged[change.added.id] = change.added
            if change.removed is not None:
                merged.pop(change.removed.id, None)
        previous, self._by_id = self._by_id, merged
        self._version += 1
        if not node:
            self._journal = None  # the periodic resync rebuilds: any drift heals here
            return True
        # A node's refresh follows a conflict, usually an event not applied yet: what it finds
        # goes in like the events it stands for (a rebuild would cost a solve the whole
        # cluster's holdings, under the lock, on every conflict).
        changes = _differences(previous, merged)
        if self._journal is not None:
            self._journal.extend(step for change in changes for step in _steps(change))
        return bool(changes)

    def _record(self, change: _Change) -> None:
        """Called with the lock held, for every change of the id set."""
        self._version += 1
        if self._journal is not None:
            self._journal.extend(_steps(change))
        if self._recording is not None:
            self._recording.append(change)

    def _prune_tombstones(self) -> None:
        horizon = time.monotonic() - _TOMBSTONE_SECONDS
        self._tombstones = {i: t for i, t in self._tombstones.items() if t > horizon}

    # --- background -----------------------------------------------------------------------

    def _receive(self, event: ReservationEvent) -> None:
        """A store event, on the subscription's thread: applied here at once, except that a
        reserved id this copy does not know is left to the fetch thread. Events of what this
        process just did (its reserves, once settled, its releases and commits) change
        nothing and stop at a dictionary lookup."""
        try:
            if self._on_event is not None:
                self._on_event(event)
            op, reservation_id = event.op, event.id
            if op is ReservationEventOp.RESERVE:
                if reservation_id not in self._by_id and reservation_id not in self._tombstones:
                    self._unknown(event)
            elif op is ReservationEventOp.RELEASE or op is ReservationEventOp.EXPIRE:
                if reservation_id in self._by_id or reservation_id not in self._tombstones:
                    self.removed([reservation_id])
            elif op is ReservationEventOp.CONDITIONS:
                if reservation_id in self._by_id:  # reported, maybe on another replica
                    with self._lock:
                        self._reported.add(reservation_id)
                    self._unknown(event)
            elif op is ReservationEventOp.COMMIT:
                known = self._by_id.get(reservation_id)
                if known is not None and known.state is not ReservationState.COMMITTED:
                    self.committed(
                        dataclasses.replace(
                            known, state=ReservationState.COMMITTED, expires_at=None
                        )
                    )
        except Exception:
            log.exception("reservation event %s could not be applied; refreshing later", event)

    def _unknown(self, event: ReservationEvent) -> None:
        """Fetch a reserved id later: at once, or after `_FETCH_GRACE` on a node where this
        process has a placement pending (its own reserve's event usually arrives before the
        reservation is settled here). The fetch thread is woken only when it has no earlier
        fetch to wake up for anyway."""
        with self._lock:
            pending = event.node in self._pending_on
            wake = not pending or not self._waiting
            self._waiting.setdefault(
                event.id, time.monotonic() + (_FETCH_GRACE if pending else 0.0)
            )
        if wake:
            self._wake.put(True)

    def _sync(self) -> None:
        """Fetch the reserved ids `_unknown` left here, each when it is due."""
        while True:
            with self._lock:
                now = time.monotonic()
                due = [i for i, at in self._waiting.items() if at <= now]
                for reservation_id in due:
                    del self._waiting[reservation_id]
                # Not sooner than `_FETCH_GRACE` from now: under load ids fall due one by one,
                # and a wake-up for each would cost more than the fetches it skips.
                timeout = (
                    max(min(self._waiting.values()) - now, _FETCH_GRACE) if self._waiting else None
                )
            try:
                self._fetch(due)
            except Exception:
                log.exception("reservations could not be fetched; refreshing later")
            try:
                if self._wake.get(timeout=timeout) is None or self._closed.is_set():
                    return
            except queue.Empty:
                pass
            while not self._wake.empty():  # several wake-ups: one look at what is due
                if self._wake.get() is None:
                    return

    def _fetch(self, reservation_ids: Sequence[str]) -> None:
        for reservation_id in reservation_ids:
            # Read without the lock first (most ids were never reported): an id is put there
            # before it is queued again, so a report made meanwhile is fetched next time.
            if reservation_id in self._reported:
                with self._lock:
                    reported = reservation_id in self._reported
                    self._reported.discard(reservation_id)
                if reported:
                    self._fetch_conditions(reservation_id)
                    continue
            if reservation_id in self._by_id or reservation_id in self._tombstones:
                continue  # this process made it, or it is gone already
            try:
                self.added([self._store.get(reservation_id)])
            except NotFound:
                continue
            except GpuallocError as error:
                log.warning("cannot fetch reservation %s: %s", reservation_id, error)

    def _fetch_conditions(self, reservation_id: str) -> None:
        """Take a known reservation's reported conditions from the store (its binding phase,
        reservations/binding.py), so that this replica's answers show them before the next
        refresh. Only the conditions: a commit or release seen meanwhile stays as applied."""
        try:
            fresh = self._store.get(reservation_id)
        except GpuallocError:  # gone (its event removes it) or unreachable (refresh heals)
            return
        with self._lock:
            known = self._by_id.get(reservation_id)
            if known is not None:
                self._by_id[reservation_id] = dataclasses.replace(
                    known, conditions=fresh.conditions
                )

    def _janitor(self) -> None:
        last_refresh = time.monotonic()
        healthy = self._synced
        while not self._closed.wait(self._expire_interval):
            if self._subscription is None and self._subscribe():
                healthy = False  # events were missed until now: reload everything
            try:
                self._store.expire()
                if self._on_sweep is not None:
                    self._on_sweep()
                due = time.monotonic() - last_refresh >= self._refresh_interval
                if not healthy or due:
                    self.refresh()
                    last_refresh = time.monotonic()
                healthy = True
            except GpuallocError as error:
                if healthy:
                    log.warning("reservation store: %s", error)
                healthy = False
            except Exception:
                log.exception("reservation janitor failed")
                healthy = False


def _differences(before: dict[str, Reservation], after: dict[str, Reservation]) -> list[_Change]:
    """From `before` to `after`: the reservations dropped, then those added (an id whose
    allocations differ counts as both)."""
    dropped = [r for i, r in before.items() if not _same_holding(r, after.get(i))]
    added = [r for i, r in after.items() if not _same_holding(r, before.get(i))]
    return [_Change(None, r) for r in dropped] + [_Change(r, None) for r in added]


def _same_holding(reservation: Reservation, other: Reservation | None) -> bool:
    return other is not None and (
        other is reservation or other.allocations == reservation.allocations
    )


def _from_offered(journal: list[Step], placed: dict[int, AllocationResult]) -> list[Step] | None:
    """The journal's steps as applied to a run's solve state (`Holdings.offer`), which holds
    `placed` for owner "": the first addition of each (to a pending token, a reservation, or
    taken back: None) renames its "" hold; the ones never added are freed. None: a step
    frees or renames one of `placed` (not expected: apply the journal as it is)."""
    left = dict(placed)
    steps: list[Step] = []
    for step in journal:
        old, new, allocation = step
        if id(allocation) not in left:
            steps.append(step)
        elif old is None:
            del left[id(allocation)]
            steps.append(("", new, allocation))
        else:
            return None
    steps.extend(("", None, allocation) for allocation in left.values())
    return steps


def _steps(change: _Change) -> Iterator[Step]:
    """One change of the copy as journal steps."""
    if change.added is not None:
        for allocation in change.added.allocations:
            yield None, change.added.id, allocation
    if change.removed is not None:
        for allocation in change.removed.allocations:
            yield change.removed.id, None, allocation
