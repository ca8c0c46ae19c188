"""Gang placements as the service answers and reserves them (the search is core/gang.py).

Reserving a gang takes one reservation per member node — plus one per pool that several nodes
share (allNodes / nodeSelector slices), holding what every member takes there, so that a pool
scope appears once per gang and its idempotency key (owner, scope, key) stays unique — all or
nothing (`ReservationStore.reserve_gang`). A retry with the same idempotency key finds the
member reservations again by (owner, key); they come back by node name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from services.allocator.app.messages import GangMember, GangSpec, LeaseOptions
from services.allocator.core import Allocated, ClusterSnapshot, Explanation
from services.allocator.reservations.holds import placement_holds
from services.allocator.reservations.model import Hold, LimitedUse, Reservation, ReserveRequest
from services.common.dra.model import AllocationResult

__all__ = ["allocated_explanation", "gang_requests", "members", "members_of_reservations"]


def members(result: Allocated) -> tuple[GangMember, ...]:
    return tuple(GangMember(p.node or "", p.allocations, p.score) for p in result.placements)


def allocated_explanation(result: Allocated, gang: GangSpec) -> Explanation:
    """Why this gang: the domain it went to and its nodes, in the order chosen."""
    where = (
        f" in {gang.group_by_label}={result.domain}"
        if gang.group_by_label and result.domain is not None
        else ""
    )
    nodes = ", ".join(p.node or "" for p in result.placements)
    return Explanation(
        summary=f"gang of {gang.node_count} nodes{where}: {nodes}",
        budget_exhausted=result.stats.budget_exhausted,
    )


@dataclass
class _Scope:
    claim_names: list[str] = field(default_factory=list)
    allocations: list[AllocationResult] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    uses: list[LimitedUse] = field(default_factory=list)


def gang_requests(
    snapshot: ClusterSnapshot,
    placement: Sequence[GangMember],
    claim_names: tuple[str, ...],
    lease: LeaseOptions,
    lease_seconds: float,
) -> list[ReserveRequest]:
    """One store request per scope of the gang: each member's node (in member order), then
    every shared pool once with what all members take there."""
    scopes: dict[str, _Scope] = {}
    for index, member in enumerate(placement):
        holds = placement_holds(
            snapshot, member.node, member.allocations, path=f"gang_placements[{index}].allocations"
        )
        for scope, hold in holds.items():
            entry = scopes.setdefault(scope, _Scope())
            entry.claim_names.extend(claim_names)
            entry.allocations.extend(member.allocations)
            entry.devices.extend(hold.devices)
            entry.uses.extend(hold.uses)
    return [
        ReserveRequest(
            owner=lease.owner,
            node=scope,
            claim_names=tuple(entry.claim_names),
            allocations=tuple(entry.allocations),
            hold=Hold(tuple(entry.devices), tuple(entry.uses)),
            lease_seconds=lease_seconds,
            idempotency_key=lease.idempotency_key,
            labels=lease.labels,
            request_digest=lease.request_digest,
            priority_class=lease.priority_class,
        )
        for scope, entry in scopes.items()
    ]


def members_of_reservations(reservations: Sequence[Reservation]) -> tuple[GangMember, ...]:
    """The members a gang's reservations hold: one per node scope (pool scopes, whose names
    hold a "/", repeat the members' allocations), by node name."""
    return tuple(
        GangMember(r.node, r.allocations)
        for r in sorted(reservations, key=lambda r: (r.node, r.id))
        if "/" not in r.node
    )
