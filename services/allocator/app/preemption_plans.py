"""Preemption proposals: the planner (core/preemptor.py's `preemption_targets`) run for one
call's query.

The core decides who goes, in which order, where the grant then lands and where moved
reservations go; this module gives it the call's values — the live reservations of the
caller's tenant and cohort as `Holding`s, the quota's usage, and a `place` callback that solves
the query on a trial state without the chosen victims — and turns the plan into a `Proposal`
the service executes (revoke by fencing token, reserve replacements: app/service.py).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from services.allocator.app.cluster_view import ViewSnapshot
from services.allocator.app.holders import holder
from services.allocator.app.messages import Answer, LeaseOptions, Outcome, Query, Victim
from services.allocator.app.placing import eligible_nodes
from services.allocator.core import (
    AllocatedState,
    Candidate,
    Consolidating,
    Holding,
    Movable,
    Move,
    PreemptionContext,
    PreemptionReason,
    preemption_targets,
)
from services.allocator.reservations.model import Reservation
from services.allocator.reservations.queued import queued_at
from services.allocator.reservations.quota_ledger import QuotaEntry, usage_by_tenant
from services.common.deadline import Deadline
from services.common.dra.model import AllocationResult
from services.common.quota.model import QuotaModel, Usage
from services.common.security.principal import tenant_of_owner

__all__ = ["Proposal", "Relocation", "Standing", "Trials", "propose"]


@dataclass(frozen=True)
class Relocation:
    """A consolidation's move as the service executes it: the reservation revoked, and the
    node and allocation its replacement holds."""

    reservation: Reservation
    node: str
    allocation: AllocationResult


@dataclass(frozen=True)
class Proposal:
    """A preemption: the victims as answers show them, and the reservations to revoke."""

    victims: tuple[Victim, ...]
    reservations: tuple[Reservation, ...]
    moves: tuple[Relocation, ...] = ()  # consolidation: the victims moved, not only revoked
    # every victim is reclaimed (Kueue's flavor mode Reclaim; else Preempt): the plan's word
    reclaims_only: bool = False


@dataclass(frozen=True)
class Trials:
    """One call's means of trying placements on its view: `solve` a query on a state (no
    explanation), what a placement `counts` against the caller's tenant's quota, and what it
    is `charged` on the flavors a flavor search assigned (flavored resource -> flavor)."""

    view: ViewSnapshot
    state: AllocatedState
    solve: Callable[[Query, AllocatedState], Answer]
    counts: Callable[[Answer], dict[str, int]]
    deadline: Deadline
    charged: Callable[[Answer, Mapping[str, str]], dict[str, int]] | None = None

    def counts_on(self, assigned: Mapping[str, str]) -> Callable[[Answer], dict[str, int]]:
        """What a placement counts when its flavors are `assigned` (`counts` when none are)."""
        charged = self.charged
        if charged is None or not assigned:
            return self.counts
        kept = dict(assigned)
        return lambda answer: charged(answer, kept)

    def without(self, query: Query, gone: Sequence[Reservation]) -> Answer | None:
        """`query`'s placement once `gone` are revoked (their devices free), or None."""
        trial = self.state.with_changes((r.id, None, a) for r in gone for a in r.allocations)
        found = self.solve(query, trial)
        return found if found.outcome is Outcome.ALLOCATED else None

    def on_empty_fleet(self, query: Query) -> Answer | None:
        """`query`'s placement with nothing held, or None: no victim can make it fit."""
        found = self.solve(query, AllocatedState(self.view.snapshot))
        return found if found.outcome is Outcome.ALLOCATED else None


class Standing:
    """The quota around the caller, read when first needed: the model, the cohort's ledger
    entries and usage (one ledger read), and the live reservations of the caller's tenant and
    cohort with what each counts: the amounts its ledger entry holds (what its grant was
    charged, on the flavors assigned it), else (no entry: granted before quotas, say) what
    `usage_of` counts now. Only the caller's tenant and its cohort can lose reservations to
    it (the planner's rules): nobody else's reservations are looked at."""

    def __init__(
        self,
        model: QuotaModel,
        owner: str,
        entries: Callable[[], Sequence[QuotaEntry]],
        reservations: Callable[[], Sequence[Reservation]],
        usage_of: Callable[[Reservation], Usage],
    ) -> None:
        self.model = model
        self._owner = owner
        self._entries = entries
        self._reservations = reservations
        self._usage_of = usage_of

    @functools.cached_property
    def entries(self) -> Sequence[QuotaEntry]:
        return self._entries()

    @functools.cached_property
    def usage(self) -> Mapping[str, Usage]:
        return usage_by_tenant(self.entries)

    @functools.cached_property
    def live(self) -> Mapping[str, Reservation]:
        tenant = tenant_of_owner(self._owner)
        quota = self.model.quota_of(tenant)
        eligible = {tenant, *(self.model.members(quota) if quota is not None else ())}
        return {r.id: r for r in self._reservations() if tenant_of_owner(r.owner) in eligible}

    @functools.cached_property
    def amounts(self) -> Mapping[str, Usage]:
        recorded = {entry.id: entry.amounts for entry in self.entries}
        return {
            i: recorded[i] if i in recorded else self._usage_of(r) for i, r in self.live.items()
        }


def propose(
    trials: Trials,
    query: Query,
    lease: LeaseOptions,
    around: Standing,
    *,
    now: float,
    max_consolidation_nodes: int,
    empty: Answer | None = None,
) -> Proposal | None:
    """The fewest reservations whose revocation (or move) makes `query` fit for `lease.owner`
    (its work queued at `now`), or None: the planner's passes, then consolidation (a single
    node's query only). `empty`: the query's placement on an empty fleet, when the caller has
    it (else solved here)."""
    model = around.model
    priority = model.priority(lease.priority_class)
    if not priority.preempts:
        return None
    empty = empty or trials.on_empty_fleet(query)
    if empty is None:
        return None  # it does not fit an empty fleet: no victim helps
    live = around.live
    keyed = collections.Counter((r.owner, r.idempotency_key) for r in live.values())
    context = PreemptionContext(
        model,
        tenant_of_owner(lease.owner),
        priority,
        trials.counts(empty),
        [_holding(model, r, around.amounts[r.id], keyed) for r in live.values()],
        around.usage,
        created_at=now,
    )
    placing = _Placing(trials, query, live)
    # the candidates in one fleet-wide order rarely free one node (a whole-GPU grant needs
    # every slice of its GPUs gone): the planner also tries node by node, as kube-scheduler
    # does, on the nodes the query may use; a gang's members are never moved
    nodes = _nodes(trials, query)
    single = query.gang is None
    consolidating = (
        Consolidating(trials.view.snapshot, trials.state, placing.place_on, max_consolidation_nodes)
        if single
        else None
    )
    plan = preemption_targets(
        context,
        placing.place,
        node_of={r.id: r.node for r in live.values()} if single else None,
        nodes=nodes,
        consolidating=consolidating,
    )
    if plan is None:
        return None
    gone = tuple(live[t.id] for t in plan.targets)
    return Proposal(
        tuple(
            _victim(r, t.reason, t.move.node if t.move is not None else "")
            for r, t in zip(gone, plan.targets, strict=True)
        ),
        gone,
        tuple(
            _relocation(r, t.move)
            for r, t in zip(gone, plan.targets, strict=True)
            if t.move is not None
        ),
        reclaims_only=plan.reclaims_only,
    )


class _Placing:
    """The planner's callbacks for one query: where it lands once chosen reservations go."""

    def __init__(self, trials: Trials, query: Query, live: Mapping[str, Reservation]) -> None:
        self.trials, self.query, self.live = trials, query, live
        self._pinned: dict[str, Query] = {}

    def on(self, node: str) -> Query:
        """The query pinned to `node` ("" : as it is)."""
        if not node:
            return self.query
        return self._pinned.setdefault(node, replace(self.query, node=node, node_selector=None))

    def place(self, chosen: Sequence[Candidate], node: str) -> Usage | None:
        """What the query counts when placed (on `node`, "" anywhere) once `chosen` are
        revoked; None when it is not placed."""
        found = self.trials.without(self.on(node), [self.live[c.holding.id] for c in chosen])
        return None if found is None else self.trials.counts(found)

    def place_on(
        self, node: str, chosen: Sequence[Candidate]
    ) -> tuple[Usage, Sequence[AllocationResult]] | None:
        """What it counts and its allocations on `node` once `chosen` are gone from it."""
        found = self.trials.without(self.on(node), [self.live[c.holding.id] for c in chosen])
        if found is None:
            return None
        return self.trials.counts(found), [a for p in found.placements for a in p.allocations]


def _nodes(trials: Trials, query: Query) -> Sequence[str] | None:
    """The nodes the query may use, when it restricts them (None: any)."""
    if query.node:
        return (query.node,)
    if query.node_selector is not None or query.max_nodes > 0:
        return eligible_nodes(trials.view.snapshot, query)
    return None


def _holding(
    model: QuotaModel,
    reservation: Reservation,
    amounts: Usage,
    keyed: Mapping[tuple[str, str], int],
) -> Holding:
    """The reservation as the planner sees it; movable unless it is a gang's member (its
    owner's idempotency key is on other reservations too)."""
    key = (reservation.owner, reservation.idempotency_key)
    in_gang = bool(reservation.idempotency_key) and keyed.get(key, 0) > 1
    return Holding(
        reservation.id,
        tenant_of_owner(reservation.owner),
        model.priority(reservation.priority_class),
        reservation.created_at,
        amounts,
        move=None if in_gang else _movable(reservation),
        queued_at=queued_at(reservation),
    )


def _movable(reservation: Reservation) -> Movable:
    return Movable(reservation.id, reservation.owner, reservation.node, reservation.allocations)


def _victim(reservation: Reservation, reason: PreemptionReason, moved_to: str = "") -> Victim:
    return Victim(holder(reservation), reservation.priority_class, reason, moved_to_node=moved_to)


def _relocation(reservation: Reservation, move: Move) -> Relocation:
    return Relocation(reservation, move.node, move.allocation)
