"""Consolidation: preemption rule 3, beyond Kueue (KAI Scheduler's Consolidate action).

A grant within its tenant's nominal quota may find the free devices spread over nodes, none
with room. Reservations of a movable priority class are then *moved* to equivalent free devices
on other nodes rather than revoked: a move takes nothing from anyone's quota (the holder keeps
what it counts, on other devices), it costs the holder a restart, which `movable` declares
acceptable. The planner here chooses the node and who moves; core/moves.py the devices they
move to. The application layer only executes the plan (app/service.py: reserve each
replacement, then revoke the original).

Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from services.allocator.core.moves import Move, device_group, movable_device, place_moves
from services.allocator.core.preemption import (
    Candidate,
    PreemptionContext,
    PreemptionReason,
    _minimal,
    _within_nominal,
)
from services.allocator.core.quota.rule import admit
from services.allocator.core.snapshot import ClusterSnapshot
from services.allocator.core.state import AllocatedState
from services.common.dra.model import AllocationResult
from services.common.quota.model import Usage

__all__ = [
    "ConsolidationPlan",
    "consolidation_order",
    "fewest_moves",
    "movable_candidates",
    "plan_consolidation",
]


def movable_candidates(context: PreemptionContext) -> list[Candidate]:
    """Rule 3, *consolidate*, for when revoking what the passes allow cannot make room
    (the free devices are spread over nodes, as KAI Scheduler's Consolidate action finds
    them): when the grant keeps the tenant within its nominal quota, reservations of a movable
    priority class of any tenant of its cohort (its own too, of any priority) may be moved to
    an equivalent free device on another node. A move takes nothing from anyone's quota: the
    holder keeps what it counts, on other devices; it does cost the holder a restart. Newest
    first. Which of them make room on a node, and whether each finds a device elsewhere, the
    caller decides (only holdings it can re-place are candidates)."""
    if not context.priority.preempts:
        return []
    quota = context.model.quota_of(context.tenant)
    used = context.usage.get(context.tenant, {})
    if quota is None or not _within_nominal(quota, context.amounts, used):
        return []
    members = set(context.model.members(quota))
    movable = [
        h
        for h in context.holdings
        if h.tenant in members and h.priority.preemptible and h.priority.movable
    ]
    movable.sort(key=lambda h: (-h.created_at, h.id))
    return [Candidate(h, PreemptionReason.CONSOLIDATE) for h in movable]


@dataclass(frozen=True)
class ConsolidationPlan:
    """A consolidation: the node the grant goes to, who moves (reason CONSOLIDATE) and the
    device each moves to."""

    node: str
    victims: tuple[Candidate, ...]
    moves: tuple[Move, ...]


# PlaceOn(node, chosen): what the grant counts and its allocations when placed on `node` once
# `chosen` are gone from it; None when it is not placed there
PlaceOn = Callable[[str, Sequence[Candidate]], tuple[Usage, Sequence[AllocationResult]] | None]

_GRANT = "(the grant)"  # the grant's allocations in a trial state: no reservation holds them yet


def plan_consolidation(
    context: PreemptionContext,
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    place_on: PlaceOn,
    *,
    nodes: Iterable[str] | None = None,
    max_nodes: int = 16,
) -> ConsolidationPlan | None:
    """Rule 3: on the nodes holding the fewest movable reservations first (of `nodes`, when
    given; at most `max_nodes`), the fewest moves, emptiest GPUs first, after which the grant
    fits there (devices and quota: a move takes nothing from anyone's quota), each to an
    equivalent free device on another node (`place_moves`, the grant placed); the first node
    where every move finds one. Only holdings with a `move` (the caller's: one device, not a
    gang's member) whose device is movable are candidates."""
    model, tenant, usage = context.model, context.tenant, context.usage
    devices = {
        c.holding.id: movable_device(snapshot, c.holding.move)
        for c in movable_candidates(context)
        if c.holding.move is not None
    }
    candidates = [c for c in movable_candidates(context) if devices.get(c.holding.id)]
    on: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        assert candidate.holding.move is not None
        on.setdefault(candidate.holding.move.node, []).append(candidate)
    allowed = list(on) if nodes is None else [n for n in nodes if n in on]

    def held(node: str) -> tuple[int, str]:
        return (sum(a for c in on[node] for a in c.holding.amounts.values()), node)

    groups = {i: device_group(e) for i, e in devices.items() if e is not None}
    for node in sorted(allowed, key=held)[:max_nodes]:

        def fits(chosen: Sequence[Candidate], node: str = node) -> bool:
            placed = place_on(node, chosen)
            return placed is not None and not admit(model, tenant, placed[0], usage)

        chosen = fewest_moves(consolidation_order(on[node], groups), fits)
        if chosen is None:
            continue
        placed = place_on(node, chosen)
        assert placed is not None
        moving = [c.holding.move for c in chosen if c.holding.move is not None]
        trial = state.with_changes(
            [(m.id, None, a) for m in moving for a in m.allocations]
            + [(None, _GRANT, a) for a in placed[1]]
        )
        moves = place_moves(snapshot, trial, moving, away_from=node)
        if moves is None:
            continue
        return ConsolidationPlan(node, tuple(chosen), tuple(moves))
    return None


def consolidation_order(
    candidates: Sequence[Candidate], group_of: Mapping[str, str]
) -> list[Candidate]:
    """One node's movable candidates in the order consolidation frees them: group by group
    (`group_of`: holding id -> its GPU, the counter set its device consumes), the groups
    holding the least first, so that the shortest run that makes room empties the emptiest
    GPUs; within a group, in the candidates' order."""
    held: dict[str, int] = {}
    for candidate in candidates:
        group = group_of.get(candidate.holding.id, candidate.holding.id)
        held[group] = held.get(group, 0) + sum(candidate.holding.amounts.values())
    index = {id(c): i for i, c in enumerate(candidates)}

    def key(candidate: Candidate) -> tuple[int, str, int]:
        group = group_of.get(candidate.holding.id, candidate.holding.id)
        return (held[group], group, index[id(candidate)])

    return sorted(candidates, key=key)


def fewest_moves(
    candidates: Sequence[Candidate], fits: Callable[[Sequence[Candidate]], bool]
) -> list[Candidate] | None:
    """The shortest run of `candidates` (in consolidation_order) that makes the grant fit,
    pruned so that no move can be spared; None when moving all of them is not enough."""
    return _minimal(candidates, fits)
