"""Reservations: the values and the store port that every reservation store implements.

A reservation holds a placement (one AllocationResult per claim, all on one node) under a lease.
Reserving checks and takes, in one atomic step, everything the placement uses:

- every *exclusive* device (not adminAccess, not allowMultipleAllocations),
- every counter it consumes (partitionable devices: MIG memory/compute slices), up to the limit
  the counter set publishes,
- every capacity share it consumes on multi-allocatable devices, up to the device's capacity.

If anything is no longer free the store raises `Conflict` listing what moved; the client
re-allocates. Leases expire unless committed; an expired lease frees its holds without racing a
concurrent reserve (stores check expiry inside the same atomic step). Each grant carries a
fencing token that increases per node.

Amounts are integers in milli-units (a Quantity times 1000, rounded up) so that every store —
including Redis, whose Lua numbers are doubles — adds them exactly (exact up to 2^53 milli-units,
i.e. about 9 PB of memory).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from math import ceil
from typing import Protocol

from services.common.dra.model import AllocationResult
from services.common.dra.quantity import Quantity
from services.common.errors import (
    Conflict,
    GpuallocError,
    InvalidArgument,
    Preempted,
)

__all__ = [
    "DeviceCondition",
    "DeviceTaken",
    "Hold",
    "LimitedUse",
    "Reservation",
    "ReservationEvent",
    "ReservationEventOp",
    "ReservationState",
    "ReservationStore",
    "ReserveRequest",
    "Subscription",
    "UseExceeded",
    "conflict_error",
    "device_conflict_key",
    "milli",
    "NODE_SEPARATOR",
    "PENDING_IDS_SHOWN",
    "PREEMPTED_MEMORY_SECONDS",
    "PendingPreemptions",
    "Preempted",
    "new_reservation_id",
    "node_reservation_id",
    "preempted_error",
    "ReserveOutcome",
    "reserve_placement",
    "reserved",
    "validate_placement",
    "validate_reserve_request",
]


def milli(quantity: Quantity) -> int:
    """A quantity in integer milli-units, rounded up (a request never rounds down to fit)."""
    return ceil(quantity.value * 1000)


@dataclass(frozen=True, order=True)
class LimitedUse:
    """`amount` of a shared, limited resource `key` whose total is `limit` (both milli-units).

    Keys: `counter:<driver>/<pool>/<counterSet>/<counter>` or
    `capacity:<driver>/<pool>/<device>/<capacity>`.
    """

    key: str
    amount: int
    limit: int


@dataclass(frozen=True)
class Hold:
    """Everything a placement takes. Device keys are `driver/pool/device`."""

    devices: tuple[str, ...] = ()
    uses: tuple[LimitedUse, ...] = ()

    def is_empty(self) -> bool:
        return not self.devices and not self.uses


@dataclass(frozen=True)
class DeviceCondition:
    """A condition reported for a held device (`driver/pool/device`), as a ResourceClaim's
    `status.devices[].conditions` entry: its type and whether it is True."""

    device: str
    type: str
    status: bool


class ReservationState(StrEnum):
    RESERVED = "RESERVED"  # leased: expires at `expires_at` unless committed or renewed
    COMMITTED = "COMMITTED"  # permanent until released


@dataclass(frozen=True)
class ReserveRequest:
    owner: str
    node: str
    claim_names: tuple[str, ...]
    allocations: tuple[AllocationResult, ...]
    hold: Hold
    lease_seconds: float
    idempotency_key: str = ""
    labels: tuple[tuple[str, str], ...] = ()  # free-form (e.g. ("slurm.job", "1234"))
    request_digest: str = ""  # what the idempotency key was first used for (app/messages.py)
    priority_class: str = ""  # "" : the policy's default (docs/tenancy.md)


@dataclass(frozen=True)
class Reservation:
    id: str
    owner: str
    node: str
    claim_names: tuple[str, ...]
    allocations: tuple[AllocationResult, ...]
    hold: Hold
    state: ReservationState
    fencing_token: int
    created_at: float  # seconds since the epoch, from the store's clock
    expires_at: float | None  # None once committed
    idempotency_key: str = ""
    labels: tuple[tuple[str, str], ...] = field(default=())
    request_digest: str = ""  # of the Allocate request that made it ("" for Reserve)
    priority_class: str = ""
    redacted: bool = False  # another tenant's, as a caller may see it (app/tenancy.py)
    conditions: tuple[DeviceCondition, ...] = ()  # reported for its devices (binding.py)


ReserveOutcome = list[Reservation] | GpuallocError
"""What `ReservationStore.reserve` answers per placement: its reservations or its error."""

PENDING_IDS_SHOWN = 20  # ids of pending revocations a read returns per tenant, at most


@dataclass(frozen=True)
class PendingPreemptions:
    """A tenant's reservations revoked by a preemption whose holders have not been told yet
    (their jobs may still run on the GPUs): how many, and the oldest ones' ids."""

    count: int = 0
    ids: tuple[str, ...] = ()


class Subscription(Protocol):
    def close(self) -> None:
        """Stop the deliveries."""
        ...


class ReservationStore(Protocol):
    """The port. Implementations: embedded (in process) and Redis; one contract suite covers both.

    Errors: `Conflict` (something in the hold is taken; `.conflicts` lists the keys),
    `NotFound` (unknown or expired reservation id), `PermissionDenied` (another owner),
    `FailedPrecondition` (renewing a committed reservation, fencing token mismatch),
    `Unavailable` (the backing store cannot be reached).
    """

    def reserve(self, placements: Sequence[Sequence[ReserveRequest]]) -> list[ReserveOutcome]:
        """Take each placement — its requests, one per scope (a node's, a shared pool's; a
        gang's member nodes) — all or nothing, in order, each seeing the ones before it.
        One outcome per placement: its reservations (in request order), or the typed error that
        refused it (`Conflict` naming what is taken, `InvalidArgument` for a bad request,
        `Unavailable` when its store could not be reached); a placement that fails leaves
        nothing reserved, and never fails another. Each scope's hold is checked and taken
        atomically; one round trip per shard for the whole call. Same (owner, node,
        idempotency key) while that reservation lives -> the same reservation, even when two
        calls race, and within one call."""
        ...

    def commit(self, reservation_id: str, owner: str, fencing_token: int = 0) -> Reservation:
        """Make the lease permanent. A fencing_token other than 0 must match."""
        ...

    def renew(self, reservation_id: str, owner: str, lease_seconds: float) -> Reservation:
        """Extend a lease to now + lease_seconds."""
        ...

    def report_conditions(
        self, reservation_id: str, fencing_token: int, conditions: Sequence[DeviceCondition]
    ) -> Reservation:
        """Record device conditions on a live reservation, whoever owns it (the caller is the
        driver's agent): the newest status of a (device, type) wins. A fencing_token other
        than 0 must match. Publishes a CONDITIONS event."""
        ...

    def release(self, reservation_id: str, owner: str, fencing_token: int = 0) -> None:
        """Free the hold now."""
        ...

    def revoke(self, reservation_id: str, fencing_token: int, by: str) -> None:
        """Free a reservation for a preemption, whoever owns it, if its fencing token is still
        `fencing_token` (else FailedPrecondition: it changed hands since it was chosen). For a
        day after, commit/renew/release of it answer FailedPrecondition naming `by`. In the
        same atomic step the revocation becomes *pending* for the owner's tenant: until the
        owner itself is answered 'preempted' (by commit, renew or release with that owner), or
        the day is over. A failed binding's revocation (`by` starts with `binding:`) takes only
        a leased reservation: a committed one was bound, and stays (FailedPrecondition)."""
        ...

    def pending_preemptions(
        self, tenants: Sequence[str], max_ids: int = PENDING_IDS_SHOWN
    ) -> dict[str, PendingPreemptions]:
        """Per tenant asked (tenant_of_owner of the victim's owner), its pending revocations:
        how many, and the ids of the oldest `max_ids` (oldest first, then by id). Every tenant
        asked has an entry."""
        ...

    def get(self, reservation_id: str) -> Reservation: ...

    def list(self, owner: str = "", node: str = "") -> Sequence[Reservation]:
        """Live reservations, filtered by owner and/or node, sorted by (node, id)."""
        ...

    def live(self) -> Sequence[Reservation]:
        """Every live (unexpired) reservation: the allocator's view of what is held."""
        ...

    def expire(self) -> int:
        """Free every lease that has expired; returns how many. Stores also expire lazily."""
        ...

    def subscribe(self, callback: Callable[[ReservationEvent], None]) -> Subscription:
        """Call `callback` after every change (possibly from another thread, possibly made by
        another replica). Events are hints: a subscriber rebuilds its view with `live()`."""
        ...

    def close(self) -> None: ...


# --- shared by every store (additive: events, validation, conflicts) ------------------------


class ReservationEventOp(StrEnum):
    RESERVE = "reserve"
    COMMIT = "commit"
    RENEW = "renew"
    RELEASE = "release"
    EXPIRE = "expire"
    CONDITIONS = "conditions"  # device conditions were reported (binding.py)


@dataclass(frozen=True)
class ReservationEvent:
    """One change, as published to other allocator replicas so they refresh their view, and
    to WatchReservations streams. `owner`: the reservation's ("" from a store version that did
    not publish it); `preempted_by`: set on the RELEASE of a revocation, who preempted it."""

    op: ReservationEventOp
    id: str
    node: str
    fencing_token: int
    owner: str = ""
    preempted_by: str = ""


NODE_SEPARATOR = "@"  # reservation id = <minted>@<node>

PREEMPTED_MEMORY_SECONDS = 86_400.0  # how long a revoked id answers "preempted by ..."


def preempted_error(reservation_id: str, by: str) -> Preempted:
    """What a change of a revoked reservation answers. A failed binding (`by` starts with
    `binding:`, reservations/binding.py) is a revocation too, worded as such."""
    if by.startswith("binding:"):
        why = by.removeprefix("binding:").strip()
        return Preempted(reservation_id, by, f"reservation {reservation_id} was released: {why}")
    return Preempted(reservation_id, by)


def new_reservation_id() -> str:
    """Random, unguessable and unique without coordination (ids are minted by the client)."""
    return "res-" + secrets.token_hex(16)  # 128 random bits, as 32 hex digits


def new_reservation_ids(count: int) -> list[str]:
    """`count` ids as `new_reservation_id` mints them (128 random bits each), from one read of
    the system's random source for all of them (a batch's)."""
    digits = secrets.token_hex(16 * count)
    return ["res-" + digits[at : at + 32] for at in range(0, 32 * count, 32)]


def node_reservation_id(minted: str, node: str) -> str:
    """The id every store hands out: `<minted>@<node>` (`res-<32 hex>@<node>`), so an id says
    which node holds it (docs/reservations.md, "Ids")."""
    if NODE_SEPARATOR in minted:
        raise ValueError(f"id_factory minted {minted!r}: ids must not contain {NODE_SEPARATOR!r}")
    return minted + NODE_SEPARATOR + node


def validate_reserve_request(request: ReserveRequest) -> Hold:
    """Check a request and return its hold normalized: uses of the same key are summed (their
    limits must agree), so that every store adds exactly the same numbers."""
    if not request.owner:
        raise InvalidArgument.at("owner", "must not be empty")
    if not request.node:
        raise InvalidArgument.at("node", "must not be empty")
    if not (math.isfinite(request.lease_seconds) and request.lease_seconds > 0):
        raise InvalidArgument.at("lease_seconds", f"must be > 0, got {request.lease_seconds}")
    if len(request.claim_names) != len(request.allocations):
        raise InvalidArgument.at(
            "allocations",
            f"{len(request.allocations)} allocations for {len(request.claim_names)} claims",
        )
    devices = request.hold.devices
    if len(set(devices)) != len(devices) or not all(devices):  # which one, where
        seen: set[str] = set()
        for index, device in enumerate(devices):
            if not device or device in seen:
                reason = "must not be empty" if not device else f"{device!r} appears twice"
                raise InvalidArgument.at(f"hold.devices[{index}]", reason)
            seen.add(device)
    if not request.hold.uses:
        return request.hold
    merged: dict[str, LimitedUse] = {}
    for index, use in enumerate(request.hold.uses):
        path = f"hold.uses[{index}]"
        if not use.key:
            raise InvalidArgument.at(f"{path}.key", "must not be empty")
        if use.amount < 0 or use.limit < 0:
            raise InvalidArgument.at(path, f"amount and limit must be >= 0 ({use.key})")
        previous = merged.get(use.key)
        if previous is not None and previous.limit != use.limit:
            raise InvalidArgument.at(
                f"{path}.limit", f"{use.key}: limit {use.limit} != {previous.limit}"
            )
        merged[use.key] = (
            LimitedUse(use.key, use.amount + previous.amount, use.limit) if previous else use
        )
    if len(merged) == len(request.hold.uses):  # no key twice: already normal
        return request.hold
    return Hold(request.hold.devices, tuple(merged.values()))


def validate_placement(requests: Sequence[ReserveRequest]) -> list[Hold] | InvalidArgument:
    """A placement's holds, each normalized (`validate_reserve_request`), or why it is invalid
    (as a value: one bad placement fails alone)."""
    if not requests:
        return InvalidArgument.at("requests", "a placement needs at least one request")
    if len(requests) == 1:  # the common request, checked as below in one expression
        request = requests[0]
        hold = request.hold
        devices = hold.devices
        if (
            request.owner
            and request.node
            and 0 < request.lease_seconds < math.inf  # False for NaN too
            and len(request.claim_names) == len(request.allocations)
            and len(devices) == 1
            and devices[0]
            and not hold.uses
        ):  # what validate_reserve_request accepts as it is
            return [hold]
    try:
        return [validate_reserve_request(request) for request in requests]
    except InvalidArgument as error:
        return error


def device_conflict_key(device: str) -> str:
    """The Conflict key of a hold's device (`driver/pool/device`) that another reservation
    holds: `device:<driver>/<pool>/<device>`."""
    return f"device:{device}"


@dataclass(frozen=True)
class DeviceTaken:
    """An exclusive device of the hold that another live reservation holds."""

    device: str
    holder: str

    @property
    def key(self) -> str:
        return device_conflict_key(self.device)

    def __str__(self) -> str:
        return f"{self.key} held by reservation {self.holder}"


@dataclass(frozen=True)
class UseExceeded:
    """A limited use that does not fit: `amount` wanted, `free` left (may be < 0 if the limit
    shrank under existing holds)."""

    key: str
    amount: int
    free: int

    def __str__(self) -> str:
        return f"{self.key} needs {self.amount} has {self.free} free"


def conflict_error(items: Sequence[DeviceTaken | UseExceeded]) -> Conflict:
    """The one Conflict every store raises: `.conflicts` are the keys, in the hold's order."""
    return Conflict(
        "reservation conflict: " + "; ".join(str(item) for item in items),
        [item.key for item in items],
        {item.key: item.holder for item in items if isinstance(item, DeviceTaken)},
    )


def reserved(outcome: ReserveOutcome) -> list[Reservation]:
    """A placement's reservations, or the error that refused it, raised."""
    if isinstance(outcome, GpuallocError):
        raise outcome
    return outcome


def reserve_placement(
    store: ReservationStore, requests: Sequence[ReserveRequest]
) -> list[Reservation]:
    """One placement through `store.reserve`: its reservations, or its error raised."""
    return reserved(store.reserve([requests])[0])
