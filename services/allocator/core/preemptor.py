"""The preemptor: one planner for a grant that does not fit, as Kueue's Preemptor is one object
with one context value.

`preemption_targets` takes the context (the tenant's quota and policy, the live holdings, the
usage: `PreemptionContext`), the callbacks that place the grant on a trial state without the
chosen holdings, and, for a grant consolidation may serve, the snapshot and state it moves
reservations on. It returns the targets, each with its typed reason, or None:

1. Kueue's passes (preemption.py's `plan_preemption`: within the tenant, reclaim and borrow
   within the cohort, or fair sharing's order), fleet-wide, then node by node;
2. only when no pass finds victims, and only for a grant that is not a gang's (a gang's
   members are never moved: `consolidating` is None), consolidation (consolidation.py's
   `plan_consolidation`): the fewest reservations moved to equivalent free devices elsewhere,
   each a target of reason CONSOLIDATE with the device it moves to. This goes beyond Kueue,
   which only evicts (docs/tenancy.md says why).

Whether a flavor's attempt is a reclaim or a preemption (Kueue's flavor assigner modes) is the
plan's too: `Targets.reclaims_only`. The application layer only executes the targets (revoke
by fencing token, reserve the replacements: app/service.py).

Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.allocator.core.consolidation import PlaceOn, plan_consolidation
from services.allocator.core.moves import Move
from services.allocator.core.preemption import (
    Candidate,
    Place,
    PreemptionContext,
    PreemptionReason,
    plan_preemption,
)
from services.allocator.core.snapshot import ClusterSnapshot
from services.allocator.core.state import AllocatedState

__all__ = ["Consolidating", "Target", "Targets", "preemption_targets"]

# the reasons of a reclaim (Kueue's flavor assigner mode Reclaim): quota the preemptor's
# cohort lent is taken back; any other reason preempts (mode Preempt)
RECLAIMS = frozenset({PreemptionReason.RECLAIM, PreemptionReason.RECLAIM_WHILE_BORROWING})


@dataclass(frozen=True)
class Target:
    """A reservation the grant takes: revoked, or, with `move`, moved to the device `move`
    names (its replacement is reserved before it is revoked)."""

    candidate: Candidate
    move: Move | None = None

    @property
    def id(self) -> str:
        return self.candidate.holding.id

    @property
    def reason(self) -> PreemptionReason:
        return PreemptionReason.CONSOLIDATE if self.move is not None else self.candidate.reason


@dataclass(frozen=True)
class Targets:
    """The plan: its targets, and the node the grant was found on ("" for any)."""

    targets: tuple[Target, ...]
    node: str = ""

    @property
    def reclaims_only(self) -> bool:
        """Whether every target is a reclaim (Kueue's mode Reclaim, else Preempt)."""
        return all(t.reason in RECLAIMS for t in self.targets)


@dataclass(frozen=True)
class Consolidating:
    """What consolidation moves reservations on: the snapshot, the live state, the grant
    placed on one node without the chosen holdings, and how many nodes it looks at."""

    snapshot: ClusterSnapshot
    state: AllocatedState
    place_on: PlaceOn
    max_nodes: int = 16


def preemption_targets(
    context: PreemptionContext,
    place: Place,
    *,
    node_of: Mapping[str, str] | None = None,
    nodes: Sequence[str] | None = None,
    consolidating: Consolidating | None = None,
) -> Targets | None:
    """The targets whose revocation (or move) makes the grant fit, or None: Kueue's passes
    (with `node_of`, reservation id -> node, also node by node, on `nodes` when given), then,
    with `consolidating`, the fewest moves."""
    found = plan_preemption(context, place, node_of=node_of, nodes=nodes)
    if found is not None:
        return Targets(tuple(Target(c) for c in found.victims), found.node)
    if consolidating is None:
        return None
    moved = plan_consolidation(
        context,
        consolidating.snapshot,
        consolidating.state,
        consolidating.place_on,
        nodes=nodes,
        max_nodes=consolidating.max_nodes,
    )
    if moved is None:
        return None
    to = {m.id: m for m in moved.moves}
    return Targets(tuple(Target(c, to[c.holding.id]) for c in moved.victims), moved.node)
