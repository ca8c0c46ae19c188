"""Allocator protobuf messages <-> the client's values: the only client module that reads them.

Server answers are trusted (they come from our own allocator), so conversions here do not
re-validate; DRA values go through services.common.pb.dra_mapping both ways.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from google.protobuf import duration_pb2, timestamp_pb2

from protos.allocator.v1 import allocator_pb2 as pb
from protos.common.v1 import dra_pb2
from services.client.results import (
    Capacity,
    ClaimAllocation,
    Explanation,
    Holder,
    NodeMiss,
    NodePlacement,
    Outcome,
    Placement,
    Reservation,
    ReservationChange,
    ReservationState,
)
from services.common.dra.model import DeviceID
from services.common.pb.dra_mapping import (
    from_pb_allocation_result,
    from_pb_device_id,
    to_pb_allocation_result,
)

__all__ = [
    "capacity_from_pb",
    "duration_to_pb",
    "placement_from_pb",
    "reservation_change_from_pb",
    "reservation_from_pb",
    "state_to_pb",
    "to_pb_claim_allocations",
]

_OUTCOMES = {
    pb.OUTCOME_ALLOCATED: Outcome.ALLOCATED,
    pb.OUTCOME_UNSATISFIABLE: Outcome.UNSATISFIABLE,
    pb.OUTCOME_BUDGET_EXHAUSTED: Outcome.BUDGET_EXHAUSTED,
    pb.OUTCOME_QUOTA_EXCEEDED: Outcome.QUOTA_EXCEEDED,
}
_STATES = {
    pb.RESERVATION_STATE_RESERVED: ReservationState.RESERVED,
    pb.RESERVATION_STATE_COMMITTED: ReservationState.COMMITTED,
}
_BINDING = {pb.BINDING_PHASE_BINDING: "binding", pb.BINDING_PHASE_BOUND: "bound"}


def duration_to_pb(seconds: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(round(seconds * 1e9))
    return duration


def _time(message: timestamp_pb2.Timestamp, present: bool) -> datetime | None:
    return message.ToDatetime(tzinfo=UTC) if present else None


def state_to_pb(state: ReservationState | None) -> pb.ReservationState.ValueType:
    if state is None:
        return pb.RESERVATION_STATE_UNSPECIFIED
    return (
        pb.RESERVATION_STATE_COMMITTED
        if state is ReservationState.COMMITTED
        else (pb.RESERVATION_STATE_RESERVED)
    )


def _devices(messages: Iterable[dra_pb2.DeviceID]) -> tuple[DeviceID, ...]:
    return tuple(from_pb_device_id(m) for m in messages)


def _claim_allocation(message: pb.ClaimAllocation) -> ClaimAllocation:
    return ClaimAllocation(
        namespace=message.namespace,
        name=message.name,
        uid=message.uid,
        allocation=from_pb_allocation_result(message.allocation),
    )


def to_pb_claim_allocations(allocations: Sequence[ClaimAllocation]) -> list[pb.ClaimAllocation]:
    return [
        pb.ClaimAllocation(
            namespace=a.namespace,
            name=a.name,
            uid=a.uid,
            allocation=to_pb_allocation_result(a.allocation),
        )
        for a in allocations
    ]


def reservation_change_from_pb(message: pb.WatchReservationsResponse) -> ReservationChange:
    known = message.kind in pb.ReservationChangeKind.values()  # a newer server's: unspecified
    name = pb.ReservationChangeKind.Name(message.kind) if known else "UNSPECIFIED"
    return ReservationChange(
        kind=name.removeprefix("RESERVATION_CHANGE_KIND_").lower(),
        reservation_id=message.reservation_id,
        node_name=message.node_name,
        owner=message.owner,
        fencing_token=message.fencing_token,
        preempted_by=message.preempted_by,
    )


def reservation_from_pb(message: pb.Reservation) -> Reservation:
    return Reservation(
        id=message.id,
        owner=message.owner,
        node_name=message.node_name,
        state=_STATES.get(message.state, ReservationState.RESERVED),
        allocations=tuple(_claim_allocation(a) for a in message.allocations),
        devices=_devices(message.devices),
        fencing_token=message.fencing_token,
        expires_at=_time(message.expires_at, message.HasField("expires_at")),
        idempotency_key=message.idempotency_key,
        labels=dict(sorted(message.labels.items())),
        created_at=_time(message.created_at, message.HasField("created_at")),
        committed_at=_time(message.committed_at, message.HasField("committed_at")),
        tenant=message.tenant,
        binding=_BINDING.get(message.binding, ""),
    )


def _holder(message: pb.Holder) -> Holder:
    return Holder(
        reservation_id=message.reservation_id,
        owner=message.owner,
        node_name=message.node_name,
        state=_STATES.get(message.state, ReservationState.RESERVED),
        devices=_devices(message.devices),
        expires_at=_time(message.expires_at, message.HasField("expires_at")),
        tenant=message.tenant,
    )


def _explanation(message: pb.Explanation, present: bool) -> Explanation | None:
    if not present:
        return None
    return Explanation(
        messages=tuple(message.messages),
        nodes=tuple(NodeMiss(n.node_name, n.message, n.missing_devices) for n in message.nodes),
    )


def placement_from_pb(message: pb.AllocateResponse | pb.ExplainResponse) -> Placement:
    """Allocate's and Explain's answers share this shape (Explain never reserves)."""
    reservations: tuple[Reservation, ...] = ()
    score = 0.0
    if isinstance(message, pb.AllocateResponse):
        reservations = tuple(reservation_from_pb(r) for r in message.reservations)
        score = message.score
    return Placement(
        outcome=_OUTCOMES.get(message.outcome, Outcome.UNSATISFIABLE),
        node_name=message.node_name,
        allocations=tuple(_claim_allocation(a) for a in message.allocations),
        reservations=reservations,
        explanation=_explanation(message.explanation, message.HasField("explanation")),
        holders=tuple(_holder(h) for h in message.holders),
        inventory_generation=message.inventory_generation,
        score=score,
        gang=tuple(
            NodePlacement(p.node_name, tuple(_claim_allocation(a) for a in p.allocations), p.score)
            for p in message.gang_placements
        ),
        quota_refusals=tuple(_quota_refusal(r) for r in message.quota_refusals),
        preemption=tuple(_victim(v) for v in message.preemption.victims),
        flavors=tuple(_flavor(f) for f in message.flavors),
    )


_FLAVOR_MODES = {
    pb.FLAVOR_MODE_NO_FIT: "NoFit",
    pb.FLAVOR_MODE_NO_CANDIDATES: "NoCandidates",
    pb.FLAVOR_MODE_PREEMPT: "Preempt",
    pb.FLAVOR_MODE_RECLAIM: "Reclaim",
    pb.FLAVOR_MODE_FIT: "Fit",
}


def _flavor(attempt: pb.FlavorAttempt) -> str:
    """`gpus/hopper: Preempt, borrowing (taken): <why>`, as Kueue names the modes."""
    mode = _FLAVOR_MODES.get(attempt.mode, "unspecified")
    borrowing = ", borrowing" if attempt.borrowing else ""
    taken = " (taken)" if attempt.chosen else ""
    why = f": {attempt.message}" if attempt.message else ""
    return f"{attempt.resource}/{attempt.flavor}: {mode}{borrowing}{taken}{why}"


def _victim(victim: pb.PreemptionVictim) -> str:
    held = victim.holder
    who = held.reservation_id or f"a reservation of tenant {held.tenant}"
    priority = victim.priority_class_name or "default"
    moved = ""
    if victim.moved_to_node:
        into = victim.replacement_reservation_id
        moved = f", moved to {into + ' on ' if into else ''}{victim.moved_to_node}"
    return f"{victim.reason}: {who} on {held.node_name} (priority {priority}{moved})"


UNCOUNTED = "(uncounted)"  # the server's name for devices no quota resource counts


def _quota_refusal(refusal: pb.QuotaRefusal) -> str:
    if refusal.resource == UNCOUNTED:
        return (
            f"tenant {refusal.tenant}: requested {refusal.requested} devices no quota resource "
            "counts (never granted to a tenant with quotas: spec.quota.uncountedDevices)"
        )
    where = f" in cohort {refusal.cohort}" if refusal.cohort else ""
    return (
        f"tenant {refusal.tenant} quota {refusal.resource}{where}: requested "
        f"{refusal.requested}, used {refusal.used} of nominal {refusal.nominal} "
        f"(borrowed {refusal.borrowed}), {refusal.left} left"
    )


def capacity_from_pb(message: pb.CapacityResponse) -> Capacity:
    return Capacity(
        total=message.total,
        exact=message.accuracy == pb.COUNT_ACCURACY_EXACT,
        nodes={n.node_name: n.count for n in message.nodes},
        models={m.product_name: m.count for m in message.models},
        inventory_generation=message.inventory_generation,
    )
