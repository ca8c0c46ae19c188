"""What a solve returns: Allocated or Unsatisfiable (bad input raises instead), with Stats."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from services.allocator.core.explain import Explanation
from services.allocator.core.scoring import Score
from services.common.dra.model import AllocationResult

__all__ = ["Allocated", "NodePlacement", "SearchBudget", "SolveResult", "Stats", "Unsatisfiable"]


@dataclass(frozen=True)
class SearchBudget:
    """Bounds on one solve. A step is one attempt at a choice point (upstream counts
    `allocateOne` calls the same way). `cancelled` is polled every 1,024 steps and during
    long CEL evaluations — the service passes a deadline and cancellation check there, since
    the core reads no clock — and raises DeadlineExceeded when it returns True. `max_cel_cost`
    bounds the CEL cost units of all the request's evaluations together (ResourceExhausted
    past it)."""

    max_steps: int = 1_000_000
    max_steps_per_node: int = 100_000
    cancelled: Callable[[], bool] | None = None
    max_cel_cost: int = 2_000_000  # cel.DEFAULT_REQUEST_COST


@dataclass(frozen=True)
class Stats:
    steps: int
    cel_evaluations: int  # real CEL evaluations (per device profile, not per device)
    nodes_total: int  # nodes with at least one device, or 1 for a pinned node
    nodes_pruned: int  # ruled out by the cheap free-device check, without a search
    nodes_searched: int
    nodes_feasible: int
    budget_exhausted: bool  # some node's search stopped early
    cel_profile_hits: int = 0  # CEL outcomes taken from a selector's per-profile memo


@dataclass(frozen=True)
class NodePlacement:
    """One node's part of a placement: the claims' allocations there, and how the node scores
    with them (a solve scores every placement; one read back from reservations has no score)."""

    node: str | None  # None only when the snapshot has no nodes (network-attached devices)
    allocations: tuple[AllocationResult, ...]  # one per claim, in claim order
    score: Score | None = None


@dataclass(frozen=True)
class Allocated:
    """A placement: one NodePlacement per node, best first — a single node's solve is a gang
    of one; a gang's (gang.py) has one per member, all in `domain`."""

    placements: tuple[NodePlacement, ...]
    stats: Stats
    explanation: Explanation | None = None
    domain: str | None = None  # the label value a gang's members share (None without a label)

    @property
    def node(self) -> str | None:
        """The first (for a single-node solve: the only) placement's node."""
        return self.placements[0].node

    @property
    def allocations(self) -> tuple[AllocationResult, ...]:
        return self.placements[0].allocations

    @property
    def score(self) -> Score:
        score = self.placements[0].score
        assert score is not None  # a solve scores every placement
        return score


@dataclass(frozen=True)
class Unsatisfiable:
    explanation: Explanation
    stats: Stats
    budget_exhausted: bool  # True: not proven impossible, the search was cut short


SolveResult = Allocated | Unsatisfiable
