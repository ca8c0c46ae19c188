"""Running the core solver for a Query: budgets, deadlines, node restrictions, share ids.

The core chooses among all nodes or searches one pinned node. A Query may also restrict the
candidates (`node_selector`, `max_nodes`); then each eligible node is solved pinned, in name
order, and the feasible ones are ranked by the same pure key the core uses, so the answer is the
one the core would give on a cluster of just those nodes. Explanations of the per-node solves
are merged (closest misses sorted by the core's rank, rejection groups summed).

A gang query (`Query.gang`) runs the core's `solve_gang`, with members only among the eligible
nodes when the query restricts them. Explained, an unsatisfiable gang also carries the
per-node detail of the same claims on the nodes it could use (those with the gang's label):
which requests were short where, and so which reservations were in the way.

The core reads no clock: a deadline reaches it as `SearchBudget.cancelled`, which turns true a
little before the call's deadline so that the answer (BUDGET_EXHAUSTED) still reaches the
client, instead of the client's own DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from services.allocator.answers import GangSpec, Query
from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    Explanation,
    NodeMiss,
    Policy,
    RejectionGroup,
    RequestExplanation,
    SearchBudget,
    SelectorCache,
    SolveResult,
    Stats,
    Unsatisfiable,
    solve,
)
from services.allocator.core.cel import DEFAULT_REQUEST_COST
from services.allocator.core.explain import rejection_order
from services.allocator.core.gang import GangResult, GangUnsatisfiable, solve_gang
from services.allocator.core.groups import GroupKey
from services.allocator.core.nodeselect import NodeAccess
from services.allocator.core.scoring import node_key
from services.allocator.core.solver import node_groups_of
from services.allocator.core.topology_constraints import (
    TopologyConstraint,
    constraints_from_annotations,
)
from services.common.deadline import Deadline
from services.common.dra.model import DeviceClass, DeviceID, ResourceClaim
from services.common.errors import DeadlineExceeded, GpuallocError

__all__ = ["Deadline", "Solver", "eligible_nodes", "unique_share_id"]

_EXAMPLES = 3


def unique_share_id(claim: ResourceClaim, request: str, device: DeviceID, position: int) -> str:
    """A fresh share id per result: two callers allocating claims of the same name on one
    multi-allocatable device must not get the same share (the core's default is deterministic)."""
    return str(uuid.uuid4())


class Solver:
    """The core solver with the server's defaults and one shared selector cache."""

    def __init__(
        self,
        selectors: SelectorCache,
        *,
        policy: Policy = Policy.BINPACK,
        max_steps: int = 1_000_000,
        max_steps_per_node: int = 100_000,
        max_cel_cost: int = DEFAULT_REQUEST_COST,
    ) -> None:
        self.selectors = selectors
        self.policy = policy
        self.max_steps = max_steps
        self.max_steps_per_node = max_steps_per_node
        self.max_cel_cost = max_cel_cost

    def budget(self, query: Query, deadline: Deadline) -> SearchBudget:
        steps = min(query.max_steps, self.max_steps) if query.max_steps > 0 else self.max_steps
        return SearchBudget(
            max_steps=steps,
            max_steps_per_node=min(steps, self.max_steps_per_node),
            cancelled=deadline.passed if deadline.bounded else None,
            max_cel_cost=self.max_cel_cost,
        )

    def run(
        self,
        snapshot: ClusterSnapshot,
        state: AllocatedState,
        classes: Mapping[str, DeviceClass],
        query: Query,
        deadline: Deadline,
        *,
        explain: bool = False,
        share_id: Callable[[ResourceClaim, str, DeviceID, int], str] = unique_share_id,
    ) -> SolveResult:
        """Solve `query`; raises DeadlineExceeded when the deadline cut the search short."""
        policy = query.policy or self.policy
        budget = self.budget(query, deadline)
        topology = topology_constraints(query)  # annotations parsed once, not once per node
        restricted = not query.node and (query.node_selector is not None or query.max_nodes > 0)
        if not restricted:
            return solve(
                snapshot,
                state,
                classes,
                query.claims,
                node=query.node or None,
                policy=policy,
                selectors=self.selectors,
                budget=budget,
                explain=explain,
                share_id=share_id,
                topology_constraints=topology,
            )
        nodes = eligible_nodes(snapshot, query)
        return _solve_each(
            snapshot, state, classes, query, nodes, policy, budget, explain, self, topology
        )

    def node_groups(
        self,
        snapshot: ClusterSnapshot,
        state: AllocatedState,
        classes: Mapping[str, DeviceClass],
        query: Query,
    ) -> dict[str, GroupKey]:
        """Per node, the key of the nodes that answer `query`'s claims alike (core
        node_groups_of); empty when they cannot stand for each other, or when the claims are
        in error (each node's own solve then reports it)."""
        try:
            return node_groups_of(
                snapshot,
                state,
                classes,
                query.claims,
                policy=query.policy or self.policy,
                selectors=self.selectors,
                topology_constraints=topology_constraints(query),
            )
        except GpuallocError:
            return {}

    def run_gang(
        self,
        snapshot: ClusterSnapshot,
        state: AllocatedState,
        classes: Mapping[str, DeviceClass],
        query: Query,
        deadline: Deadline,
        *,
        explain: bool = False,
        share_id: Callable[[ResourceClaim, str, DeviceID, int], str] = unique_share_id,
    ) -> GangResult:
        """Solve the gang `query` (`query.gang` set); raises DeadlineExceeded as `run` does."""
        gang = query.gang
        if gang is None:
            raise ValueError("run_gang needs a query with a gang")
        policy = query.policy or self.policy
        topology = topology_constraints(query)
        restricted = query.node_selector is not None or query.max_nodes > 0
        result = solve_gang(
            snapshot,
            state,
            classes,
            query.claims,
            node_count=gang.node_count,
            group_by_label=gang.group_by_label or None,
            policy=policy,
            selectors=self.selectors,
            budget=self.budget(query, deadline),
            share_id=share_id,
            topology_constraints=topology,
            nodes=eligible_nodes(snapshot, query) if restricted else None,
        )
        if explain and isinstance(result, GangUnsatisfiable):
            detail = self._gang_detail(snapshot, state, classes, query, gang, deadline, topology)
            if detail is not None:
                result = replace(result, explanation=_with_detail(result.explanation, detail))
        return result

    def _gang_detail(
        self,
        snapshot: ClusterSnapshot,
        state: AllocatedState,
        classes: Mapping[str, DeviceClass],
        query: Query,
        gang: GangSpec,
        deadline: Deadline,
        topology: Sequence[TopologyConstraint],
    ) -> Explanation | None:
        """The single-node explanation of the gang's claims over the nodes the gang may use
        (None when it cannot be had: the gang's answer does not wait for its detail)."""
        label = gang.group_by_label
        single = replace(query, gang=None)
        try:
            if not label:  # the nodes a single-node query considers: the solver's own search
                result = self.run(snapshot, state, classes, single, deadline, explain=True)
                return result.explanation
            nodes = [n for n in eligible_nodes(snapshot, query) if label in _labels(snapshot, n)]
            result = _solve_each(
                snapshot,
                state,
                classes,
                single,
                nodes,
                query.policy or self.policy,
                self.budget(single, deadline),
                True,
                self,
                topology,
            )
        except GpuallocError:  # the deadline, or a node-only problem everywhere: the gang's
            return None  # own answer stands, with its summary only
        return result.explanation


def eligible_nodes(snapshot: ClusterSnapshot, query: Query) -> list[str]:
    """Nodes with devices that the query's node selector matches, by name, at most max_nodes."""
    access = NodeAccess(node_selector=query.node_selector) if query.node_selector else None
    names = [
        view.name
        for view in snapshot.views()
        if view.name is not None
        and view.device_count > 0
        and (access is None or access.matches(view.node))
    ]
    return names[: query.max_nodes] if query.max_nodes > 0 else names


def _solve_each(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: Mapping[str, DeviceClass],
    query: Query,
    nodes: Sequence[str],
    policy: Policy,
    budget: SearchBudget,
    explain: bool,
    solver: Solver,
    topology: Sequence[TopologyConstraint],
) -> SolveResult:
    found: list[Allocated] = []
    missed: list[Unsatisfiable] = []
    errors: list[GpuallocError] = []
    steps_left = budget.max_steps
    exhausted = False
    for node in nodes:
        if steps_left <= 0:
            exhausted = True
            break
        node_budget = SearchBudget(
            steps_left, min(steps_left, budget.max_steps_per_node), budget.cancelled
        )
        try:
            result = solve(
                snapshot,
                state,
                classes,
                query.claims,
                node=node,
                policy=policy,
                selectors=solver.selectors,
                budget=node_budget,
                explain=explain,
                share_id=unique_share_id,
                topology_constraints=topology,
            )
        except DeadlineExceeded:
            raise
        except GpuallocError as error:  # a node-only problem (an All request, incomplete pool)
            errors.append(error)
            missed.append(_error_miss(node, error))
            continue
        steps_left -= result.stats.steps
        if isinstance(result, Allocated):
            found.append(result)
            if policy is Policy.FIRST_FIT and _unbeatable(result):
                break
        else:
            missed.append(result)
            exhausted = exhausted or result.budget_exhausted
    if not found and errors:
        raise errors[0]  # as the core: node-only errors count only when no node fits
    return _merge(found, missed, policy, exhausted, len(nodes))


def _labels(snapshot: ClusterSnapshot, name: str) -> Mapping[str, str]:
    node = snapshot.view(name).node
    return node.labels if node is not None else {}


def _with_detail(gang: Explanation, detail: Explanation) -> Explanation:
    """The gang's summary with the per-node detail (closest misses, requests, constraints)."""
    return Explanation(
        summary=gang.summary,
        nodes=detail.nodes,
        requests=detail.requests,
        constraints=detail.constraints,
        notes=detail.notes,
        budget_exhausted=gang.budget_exhausted or detail.budget_exhausted,
    )


def _error_miss(node: str, error: GpuallocError) -> Unsatisfiable:
    miss = NodeMiss(node, 0, 0, "", "", 0, 0, (), error=error.message)
    stats = Stats(0, 0, 1, 0, 0, 0, False)
    return Unsatisfiable(Explanation(summary=miss.message(), nodes=(miss,)), stats, False)


def _merge(
    found: Sequence[Allocated],
    missed: Sequence[Unsatisfiable],
    policy: Policy,
    exhausted: bool,
    eligible: int,
) -> SolveResult:
    results: list[Allocated | Unsatisfiable] = [*found, *missed]
    stats = Stats(
        steps=sum(r.stats.steps for r in results),
        cel_evaluations=sum(r.stats.cel_evaluations for r in results),
        nodes_total=eligible,
        nodes_pruned=sum(r.stats.nodes_pruned for r in results),
        nodes_searched=sum(r.stats.nodes_searched for r in results),
        nodes_feasible=len(found),
        budget_exhausted=exhausted,
        cel_profile_hits=sum(r.stats.cel_profile_hits for r in results),
    )
    misses = tuple(sorted((n for m in missed for n in m.explanation.nodes), key=NodeMiss.rank))
    explanations = [r.explanation for r in results if r.explanation is not None]
    requests = _merge_requests(e.requests for e in explanations)
    notes = tuple(sorted({n for e in explanations for n in e.notes}))
    constraints = tuple(c for e in explanations for c in e.constraints)
    if found:
        best = min(found, key=lambda a: node_key(policy, a.node, a.score))
        explanation = None
        if best.explanation is not None:
            explanation = Explanation(
                summary=best.explanation.summary,
                nodes=misses,
                requests=requests,
                constraints=constraints,
                choice=best.explanation.choice,
                notes=notes,
                budget_exhausted=exhausted,
            )
        return Allocated(best.node, best.allocations, best.score, stats, explanation)
    if misses:
        summary = f"no eligible node fits the claims; closest: {misses[0].message()}"
    else:
        summary = "no node with devices matches the node selector"
    if exhausted:
        summary += " (search budget exhausted: a fit may exist)"
    explanation = Explanation(
        summary=summary,
        nodes=misses,
        requests=requests,
        constraints=constraints,
        notes=notes,
        budget_exhausted=exhausted,
    )
    return Unsatisfiable(explanation, stats, exhausted)


def _merge_requests(
    groups: Iterable[Sequence[RequestExplanation]],
) -> tuple[RequestExplanation, ...]:
    """One RequestExplanation per (claim, request) with counts summed over the nodes."""
    considered: dict[tuple[str, str], int] = {}
    rejections: dict[tuple[str, str], dict[object, RejectionGroup]] = {}
    for requests in groups:
        for request in requests:
            key = (request.claim, request.request)
            considered[key] = considered.get(key, 0) + request.considered
            merged = rejections.setdefault(key, {})
            for group in request.rejections:
                have = merged.get(group.key)
                if have is None:
                    merged[group.key] = group
                    continue
                examples = tuple(sorted({*have.examples, *group.examples}))[:_EXAMPLES]
                merged[group.key] = replace(
                    group, count=have.count + group.count, examples=examples
                )
    return tuple(
        RequestExplanation(
            claim=claim,
            request=request,
            considered=considered[(claim, request)],
            rejections=tuple(
                sorted(
                    rejections[(claim, request)].values(),
                    key=rejection_order,
                )
            ),
        )
        for claim, request in sorted(considered)
    )


def topology_constraints(query: Query) -> tuple[TopologyConstraint, ...]:
    """The request's topology constraints; without any, those of the claims'
    `gpualloc.io/topology-constraints` annotations (as `gpualloc solve` reads them). Clients
    that send both (services/client does) state the same constraints twice: the request wins."""
    return query.topology_constraints or constraints_from_annotations(query.claims)


def _unbeatable(result: Allocated) -> bool:
    """FIRST_FIT may stop at a fit no later node can beat: first subrequests everywhere and
    every topology preference met (the core's node key ranks those before node order)."""
    score = result.score
    return not any(score.ranks) and not score.preferred_missed and not score.implicit_missed
