"""Placements as the service reserves them (the search is core/gang.py and core/solver.py).

A placement is the core's NodePlacements: one for a single node, one per member for a gang.
Reserving takes one reservation per scope — the node's, then one per pool it uses outside it.
Reserving a gang takes one reservation per member node — plus one per pool that several nodes
share (allNodes / nodeSelector slices), holding what every member takes there, so that a pool
scope appears once per gang and its idempotency key (owner, scope, key) stays unique — all or
nothing (one placement of `ReservationStore.reserve`). A retry with the same idempotency key
finds the member reservations again by (owner, key); they come back by node name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from services.allocator.app.messages import LeaseOptions
from services.allocator.core import (
    ClusterSnapshot,
    NodePlacement,
)
from services.allocator.reservations.holds import placement_holds, whole_hold
from services.allocator.reservations.model import Hold, LimitedUse, Reservation, ReserveRequest
from services.common.dra.model import AllocationResult

__all__ = ["members_of_reservations", "placement_requests", "reserve_request"]


@dataclass
class _Scope:
    claim_names: list[str] = field(default_factory=list)
    allocations: list[AllocationResult] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    uses: list[LimitedUse] = field(default_factory=list)


def placement_requests(
    snapshot: ClusterSnapshot,
    placement: Sequence[NodePlacement],
    claim_names: tuple[str, ...],
    lease: LeaseOptions,
    lease_seconds: float,
) -> list[ReserveRequest]:
    """One store request per scope of the placement: each node's (in placement order), then
    every pool outside them once, with what all its nodes take there (a bad device of a
    placement on several nodes is named at `gang_placements[i]`)."""
    if len(placement) == 1:  # one node's (or no node's): each scope holds all of it
        member = placement[0]
        allocations = tuple(member.allocations)
        node = member.node
        if node and len(allocations) == 1 and len(allocations[0].results) == 1:
            # one device of the node taken whole (a batch's every item): the node's scope
            whole = whole_hold(snapshot, node, allocations[0].results[0])
            if whole is not None:
                return [
                    reserve_request(lease, lease_seconds, node, claim_names, allocations, whole)
                ]
        holds = placement_holds(snapshot, member.node or "", allocations)
        if len(holds) == 1:  # one scope: the node's (a batch's every item)
            ((scope, hold),) = holds.items()
            return [reserve_request(lease, lease_seconds, scope, claim_names, allocations, hold)]
        return [
            reserve_request(lease, lease_seconds, scope, claim_names, allocations, hold)
            for scope, hold in holds.items()
        ]
    scopes: dict[str, _Scope] = {}
    for index, member in enumerate(placement):
        path = f"gang_placements[{index}].allocations" if len(placement) > 1 else "allocations"
        holds = placement_holds(snapshot, member.node or "", member.allocations, path=path)
        for scope, hold in holds.items():
            entry = scopes.setdefault(scope, _Scope())
            entry.claim_names.extend(claim_names)
            entry.allocations.extend(member.allocations)
            entry.devices.extend(hold.devices)
            entry.uses.extend(hold.uses)
    return [
        reserve_request(
            lease,
            lease_seconds,
            scope,
            tuple(entry.claim_names),
            tuple(entry.allocations),
            Hold(tuple(entry.devices), tuple(entry.uses)),
        )
        for scope, entry in scopes.items()
    ]


def reserve_request(
    lease: LeaseOptions,
    lease_seconds: float,
    scope: str,
    claim_names: tuple[str, ...],
    allocations: tuple[AllocationResult, ...],
    hold: Hold,
) -> ReserveRequest:
    """The store request that holds `hold` on `scope` for `lease` (one per scope of a
    placement: the unary reserve's and a run's alike).

    Made as `ReserveRequest(...)` with every field given would make it, without the frozen
    dataclass's `__init__` (it sets each field through `object.__setattr__`: ~2.7 µs; this
    ~0.4, its fields' dict made at once, one per reserving item)."""
    request: ReserveRequest = object.__new__(ReserveRequest)
    object.__setattr__(  # one dict for its fields, made at once
        request,
        "__dict__",
        {
            "owner": lease.owner,
            "node": scope,
            "claim_names": claim_names,
            "allocations": allocations,
            "hold": hold,
            "lease_seconds": lease_seconds,
            "idempotency_key": lease.idempotency_key,
            "labels": lease.labels,
            "request_digest": lease.request_digest,
            "priority_class": lease.priority_class,
        },
    )
    return request


def members_of_reservations(reservations: Sequence[Reservation]) -> tuple[NodePlacement, ...]:
    """The placement a placement's reservations hold: one NodePlacement per node scope (pool
    scopes, whose names hold a "/", repeat the nodes' allocations), by node name; one on no
    node when every scope is a pool's (a fleet without nodes); reservations keep no score."""
    nodes = tuple(
        NodePlacement(r.node, r.allocations)
        for r in sorted(reservations, key=lambda r: (r.node, r.id))
        if "/" not in r.node
    )
    if nodes or not reservations:
        return nodes
    return (NodePlacement(None, reservations[0].allocations),)
