"""The embedded reservation store: the whole port in one process, behind one lock.

It is the reference for the Redis store (one contract suite runs against both), the store of
`make run`, and the store of single-replica deployments that can lose their leases on restart.

Every operation first frees the leases that have expired by the injected clock (a heap ordered
by expiry, entries made stale by commit/renew/release are skipped), so an expired lease never
blocks a reserve and is never returned by a read. Holds are scoped to the reservation's node, as
in Redis where one node's keys share a hash slot: `device:<driver/pool/device>` and every limited
use key are taken per node.

A revocation (`revoke`) is remembered for `preempted_memory_seconds`: who preempted the id, and,
until its owner is answered 'preempted', that it is *pending* for the owner's tenant
(`pending_preemptions`).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from services.allocator.reservations.binding import BINDING_REVOKED_BY, merge_conditions
from services.allocator.reservations.model import (
    PENDING_IDS_SHOWN,
    PREEMPTED_MEMORY_SECONDS,
    DeviceCondition,
    DeviceTaken,
    Hold,
    PendingPreemptions,
    Reservation,
    ReservationEvent,
    ReservationEventOp,
    ReservationState,
    ReserveOutcome,
    ReserveRequest,
    UseExceeded,
    conflict_error,
    new_reservation_id,
    node_reservation_id,
    preempted_error,
    validate_placement,
)
from services.common.errors import (
    Conflict,
    FailedPrecondition,
    GpuallocError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    clip,
)
from services.common.security.principal import tenant_of_owner

__all__ = ["MemoryReservationStore", "MemorySubscription"]

EventCallback = Callable[[ReservationEvent], None]


@dataclass(frozen=True)
class MemorySubscription:
    """Returned by `subscribe`; `close()` stops the deliveries."""

    _unsubscribe: Callable[[], None]

    def close(self) -> None:
        self._unsubscribe()


@dataclass
class _NodeHolds:
    """What one node's live reservations hold: device -> holder, use key -> {holder: amount}."""

    devices: dict[str, str] = field(default_factory=dict)
    uses: dict[str, dict[str, int]] = field(default_factory=dict)
    fence: int = 0


class MemoryReservationStore:
    """Thread-safe in-process store. `clock` returns seconds since the epoch (tests pass a fake).

    Fencing tokens count grants per node: every successful reserve takes the next one (the
    first one on a node is the clock in milliseconds plus one, so a restarted process does not
    reissue old tokens); commit and renew keep the token of the grant (the holder does not
    change), so a batch system can compare the token it saw at reserve time with a later one.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        id_factory: Callable[[], str] = new_reservation_id,
        preempted_memory_seconds: float = PREEMPTED_MEMORY_SECONDS,
    ) -> None:
        self._clock = clock
        self._memory_seconds = preempted_memory_seconds
        self._id_factory = id_factory
        self._lock = threading.Lock()
        self._reservations: dict[str, Reservation] = {}
        self._nodes: dict[str, _NodeHolds] = {}
        self._idempotency: dict[tuple[str, str, str], str] = {}  # (owner, node, key) -> id
        self._leases: list[tuple[float, str]] = []  # heap of (expires_at, id), stale allowed
        self._callbacks: list[EventCallback] = []
        self._pending: list[ReservationEvent] = []
        self._preempted: dict[str, tuple[str, float]] = {}  # id -> (by whom, until)
        self._untold: dict[str, tuple[str, float]] = {}  # id -> (its owner, until): pending

    # --- the port ------------------------------------------------------------------------

    def reserve(self, placements: Sequence[Sequence[ReserveRequest]]) -> list[ReserveOutcome]:
        """Every placement under the lock, in order, each all or nothing: nobody, not even a
        reader, sees part of one."""
        holds = [validate_placement(requests) for requests in placements]
        outcomes: list[ReserveOutcome] = []
        with self._lock:
            now = self._expire_due()
            for requests, checked in zip(placements, holds, strict=True):
                if isinstance(checked, GpuallocError):
                    outcomes.append(checked)
                    continue
                outcomes.append(self._reserve_all(requests, checked, now))
        self._deliver()
        return outcomes

    def commit(self, reservation_id: str, owner: str, fencing_token: int = 0) -> Reservation:
        with self._lock:
            self._expire_due()
            current = self._owned(reservation_id, owner, fencing_token)
            if current.state is ReservationState.COMMITTED:
                return current
            committed = dataclasses.replace(
                current, state=ReservationState.COMMITTED, expires_at=None
            )
            self._reservations[reservation_id] = committed
            self._emit(ReservationEventOp.COMMIT, committed)
        self._deliver()
        return committed

    def renew(self, reservation_id: str, owner: str, lease_seconds: float) -> Reservation:
        if not (math.isfinite(lease_seconds) and lease_seconds > 0):
            raise InvalidArgument.at("lease_seconds", f"must be > 0, got {lease_seconds}")
        with self._lock:
            now = self._expire_due()
            current = self._owned(reservation_id, owner, 0)
            if current.state is ReservationState.COMMITTED:
                raise FailedPrecondition(f"reservation {reservation_id} is committed: no lease")
            renewed = dataclasses.replace(current, expires_at=now + lease_seconds)
            self._reservations[reservation_id] = renewed
            heapq.heappush(self._leases, (now + lease_seconds, reservation_id))
            self._emit(ReservationEventOp.RENEW, renewed)
        self._deliver()
        return renewed

    def report_conditions(
        self, reservation_id: str, fencing_token: int, conditions: Sequence[DeviceCondition]
    ) -> Reservation:
        with self._lock:
            self._expire_due()
            current = self._reservations.get(reservation_id)
            if current is None:
                preempted = self._preempted.get(reservation_id)
                if preempted is not None and preempted[1] > self._clock():
                    raise preempted_error(reservation_id, preempted[0])
                raise NotFound(
                    f"reservation {clip(reservation_id)} not found (released or expired)"
                )
            if fencing_token and fencing_token != current.fencing_token:
                raise FailedPrecondition(
                    f"reservation {reservation_id}: fencing token {fencing_token} is stale "
                    f"(current {current.fencing_token})"
                )
            reported = dataclasses.replace(
                current, conditions=merge_conditions(current.conditions, conditions)
            )
            self._reservations[reservation_id] = reported
            self._emit(ReservationEventOp.CONDITIONS, reported)
        self._deliver()
        return reported

    def release(self, reservation_id: str, owner: str, fencing_token: int = 0) -> None:
        with self._lock:
            self._expire_due()
            self._free(
                self._owned(reservation_id, owner, fencing_token), ReservationEventOp.RELEASE
            )
        self._deliver()

    def get(self, reservation_id: str) -> Reservation:
        with self._lock:
            self._expire_due()
            reservation = self._reservations.get(reservation_id)
        self._deliver()
        if reservation is None:
            raise NotFound(f"reservation {clip(reservation_id)} not found (released or expired)")
        return reservation

    def list(self, owner: str = "", node: str = "") -> Sequence[Reservation]:
        with self._lock:
            self._expire_due()
            found = [
                reservation
                for reservation in self._reservations.values()
                if (not owner or reservation.owner == owner)
                and (not node or reservation.node == node)
            ]
        self._deliver()
        return sorted(found, key=lambda reservation: (reservation.node, reservation.id))

    def live(self) -> Sequence[Reservation]:
        return self.list()

    def expire(self) -> int:
        with self._lock:
            before = len(self._reservations)
            self._expire_due()
            freed = before - len(self._reservations)
        self._deliver()
        return freed

    def close(self) -> None:
        with self._lock:
            self._callbacks.clear()

    def subscribe(self, callback: EventCallback) -> MemorySubscription:
        """Call `callback` after every change (from the thread that made it, outside the lock)."""
        with self._lock:
            self._callbacks.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return MemorySubscription(unsubscribe)

    # --- inside the lock -----------------------------------------------------------------

    def _reserve_all(
        self, requests: Sequence[ReserveRequest], holds: Sequence[Hold], now: float
    ) -> ReserveOutcome:
        """One placement: every request, or none (the ones this call created are freed)."""
        taken: list[Reservation] = []
        created: list[Reservation] = []  # not those an idempotency key returned
        try:
            for request, hold in zip(requests, holds, strict=True):
                key = (request.owner, request.node, request.idempotency_key)
                earlier = bool(request.idempotency_key) and key in self._idempotency
                reservation = self._reserve(request, hold, now)
                taken.append(reservation)
                if not earlier:
                    created.append(reservation)
        except Conflict as conflict:
            for reservation in reversed(created):
                self._free(reservation, ReservationEventOp.RELEASE)
            return conflict
        return taken

    def _reserve(self, request: ReserveRequest, hold: Hold, now: float) -> Reservation:
        idempotency = (request.owner, request.node, request.idempotency_key)
        if request.idempotency_key and idempotency in self._idempotency:
            return self._reservations[self._idempotency[idempotency]]
        holds = self._nodes.setdefault(request.node, _NodeHolds())
        problems: list[DeviceTaken | UseExceeded] = [
            DeviceTaken(device, holds.devices[device])
            for device in hold.devices
            if device in holds.devices
        ]
        for use in hold.uses:
            used = sum(holds.uses.get(use.key, {}).values())
            if used + use.amount > use.limit:
                problems.append(UseExceeded(use.key, use.amount, use.limit - used))
        if problems:
            raise conflict_error(problems)
        # Seeded from the clock in ms (as in Redis): a restarted process never reissues a token.
        holds.fence = holds.fence + 1 if holds.fence else int(now * 1000) + 1
        reservation = Reservation(
            id=node_reservation_id(self._id_factory(), request.node),
            owner=request.owner,
            node=request.node,
            claim_names=request.claim_names,
            allocations=request.allocations,
            hold=hold,
            state=ReservationState.RESERVED,
            fencing_token=holds.fence,
            created_at=now,
            expires_at=now + request.lease_seconds,
            idempotency_key=request.idempotency_key,
            labels=request.labels,
            request_digest=request.request_digest,
            priority_class=request.priority_class,
        )
        for device in hold.devices:
            holds.devices[device] = reservation.id
        for use in hold.uses:
            holds.uses.setdefault(use.key, {})[reservation.id] = use.amount
        self._reservations[reservation.id] = reservation
        if request.idempotency_key:
            self._idempotency[idempotency] = reservation.id
        heapq.heappush(self._leases, (now + request.lease_seconds, reservation.id))
        self._emit(ReservationEventOp.RESERVE, reservation)
        return reservation

    def revoke(self, reservation_id: str, fencing_token: int, by: str) -> None:
        with self._lock:
            now = self._expire_due()
            current = self._reservations.get(reservation_id)
            if current is None:
                raise NotFound(
                    f"reservation {clip(reservation_id)} not found (released or expired)"
                )
            if fencing_token != current.fencing_token:
                raise FailedPrecondition(
                    f"reservation {reservation_id}: fencing token {fencing_token} is stale "
                    f"(current {current.fencing_token})"
                )
            binding = by.startswith(BINDING_REVOKED_BY)
            if binding and current.state is ReservationState.COMMITTED:
                raise FailedPrecondition(f"reservation {reservation_id} is committed: no lease")
            self._free(current, ReservationEventOp.RELEASE, by)
            until = now + self._memory_seconds
            self._preempted[reservation_id] = (by, until)
            self._preempted = {k: v for k, v in self._preempted.items() if v[1] > now}
            if not binding:  # a failed binding preempts nobody
                self._untold[reservation_id] = (current.owner, until)
            self._untold = {k: v for k, v in self._untold.items() if v[1] > now}
        self._deliver()

    def pending_preemptions(
        self, tenants: Sequence[str], max_ids: int = PENDING_IDS_SHOWN
    ) -> dict[str, PendingPreemptions]:
        with self._lock:
            now = self._clock()
            found: dict[str, list[tuple[float, str]]] = {tenant: [] for tenant in tenants}
            for reservation_id, (owner, until) in self._untold.items():
                ids = found.get(tenant_of_owner(owner))
                if ids is not None and until > now:
                    ids.append((until, reservation_id))
        shown = max(0, max_ids)
        return {
            tenant: PendingPreemptions(len(ids), tuple(i for _, i in sorted(ids)[:shown]))
            for tenant, ids in found.items()
        }

    def _owned(self, reservation_id: str, owner: str, fencing_token: int) -> Reservation:
        reservation = self._reservations.get(reservation_id)
        if reservation is None:
            preempted = self._preempted.get(reservation_id)
            if preempted is not None and preempted[1] > self._clock():
                if self._untold.get(reservation_id, ("", 0.0))[0] == owner:
                    del self._untold[reservation_id]  # its holder is told now: not pending
                raise preempted_error(reservation_id, preempted[0])
            raise NotFound(f"reservation {clip(reservation_id)} not found (released or expired)")
        if reservation.owner != owner:
            raise PermissionDenied(f"reservation {reservation_id} belongs to another owner")
        if fencing_token and fencing_token != reservation.fencing_token:
            raise FailedPrecondition(
                f"reservation {reservation_id}: fencing token {fencing_token} is stale "
                f"(current {reservation.fencing_token})"
            )
        return reservation

    def _free(self, reservation: Reservation, op: ReservationEventOp, by: str = "") -> None:
        holds = self._nodes[reservation.node]
        for device in reservation.hold.devices:
            if holds.devices.get(device) == reservation.id:
                del holds.devices[device]
        for use in reservation.hold.uses:
            holders = holds.uses.get(use.key, {})
            holders.pop(reservation.id, None)
            if not holders:
                holds.uses.pop(use.key, None)
        key = (reservation.owner, reservation.node, reservation.idempotency_key)
        if self._idempotency.get(key) == reservation.id:
            del self._idempotency[key]
        del self._reservations[reservation.id]
        self._emit(op, reservation, by)

    def _expire_due(self) -> float:
        """Free every lease whose expiry is <= now; returns now (one clock read per step)."""
        now = self._clock()
        while self._leases and self._leases[0][0] <= now:
            expires_at, reservation_id = heapq.heappop(self._leases)
            reservation = self._reservations.get(reservation_id)
            if reservation is not None and reservation.expires_at == expires_at:
                self._free(reservation, ReservationEventOp.EXPIRE)
        return now

    def _emit(self, op: ReservationEventOp, reservation: Reservation, by: str = "") -> None:
        if self._callbacks:
            self._pending.append(
                ReservationEvent(
                    op,
                    reservation.id,
                    reservation.node,
                    reservation.fencing_token,
                    reservation.owner,
                    by,
                )
            )

    def _deliver(self) -> None:
        with self._lock:
            events, self._pending = self._pending, []
            callbacks = list(self._callbacks)
        for event in events:
            for callback in callbacks:
                callback(event)
