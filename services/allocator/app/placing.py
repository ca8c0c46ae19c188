"""Running the core solver for a Query: budgets, deadlines, node restrictions, share ids.

The core chooses among all nodes, among the nodes it is given, or searches one pinned node. A
Query may restrict the candidates (`node_selector`, `max_nodes`): the core then gets the
eligible nodes (`eligible_nodes`) and considers only those.

A gang query (`Query.gang`) runs the core's `solve_gang`, with members only among the eligible
nodes when the query restricts them. Explained, an unsatisfiable gang also carries the
per-node detail of the same claims on the nodes it could use (those with the gang's label):
which requests were short where, and so which reservations were in the way.

The core reads no clock: a deadline reaches it as `SearchBudget.cancelled`, which turns true a
little before the call's deadline so that the answer (BUDGET_EXHAUSTED) still reaches the
client, instead of the client's own DEADLINE_EXCEEDED.

A solve's plan (the core's `build_plan`: the claims checked against the device classes, ~20 us
for one claim) is a value of the claims and the classes, and the servicer's ClaimReader hands
out the same claim objects for the same claim bytes: `PlanMemo` keeps the plans of the last
claim tuples by identity, so a queue of alike jobs builds its plan once. With each plan it
keeps the core's SolveFacts: what the solves of the plan work out from the question alone on
the current snapshot (whether node groups stand for their nodes, the per-template facts, the
question's signature and outcome memos), so such a queue works those out once per snapshot,
not once per call.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from services.allocator.app.messages import GangSpec, Query
from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    Explanation,
    NodeAccess,
    Plan,
    Policy,
    SearchBudget,
    SelectorCache,
    SolveFacts,
    SolveResult,
    Summary,
    SummaryKind,
    TopologyConstraint,
    Unsatisfiable,
    build_plan,
    constraints_from_annotations,
    solve,
    solve_gang,
    solve_many,
)
from services.cel import DEFAULT_REQUEST_COST
from services.common.deadline import Deadline
from services.common.dra.model import DeviceClass, DeviceID, ResourceClaim
from services.common.errors import GpuallocError

__all__ = ["Deadline", "PlacementSearch", "eligible_nodes", "unique_share_id"]


def allocated_explanation(result: Allocated, gang: GangSpec) -> Explanation:
    """Why this gang: the domain it went to and its nodes, in the order chosen."""
    labelled = bool(gang.group_by_label) and result.domain is not None
    summary = Summary(
        SummaryKind.GANG_ALLOCATED,
        count=gang.node_count,
        label=gang.group_by_label if labelled else None,
        domain=str(result.domain) if labelled else None,
        nodes=tuple(p.node or "" for p in result.placements),
    )
    return Explanation(
        summary=summary,
        budget_exhausted=result.stats.budget_exhausted,
    )


def unique_share_id(claim: ResourceClaim, request: str, device: DeviceID, position: int) -> str:
    """A fresh share id per result: two callers allocating claims of the same name on one
    multi-allocatable device must not get the same share (the core's default is deterministic)."""
    return str(uuid.uuid4())


class PlacementSearch:
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
        self.plans = PlanMemo()

    def budget(self, query: Query, deadline: Deadline) -> SearchBudget:
        steps = min(query.max_steps, self.max_steps) if query.max_steps > 0 else self.max_steps
        return SearchBudget(
            max_steps=steps,
            max_steps_per_node=min(steps, self.max_steps_per_node),
            cancelled=deadline.passed if deadline.bounded else None,
            max_cel_cost=self.max_cel_cost,
        )

    def place(
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
        """Solve `query`: one node's placement, or its gang's (`query.gang`: one placement per
        member); raises DeadlineExceeded when the deadline cut the search short."""
        if query.gang is not None:
            return self._place_gang(
                snapshot, state, classes, query, query.gang, deadline, explain, share_id
            )
        restricted = not query.node and (query.node_selector is not None or query.max_nodes > 0)
        return self._solve(
            snapshot,
            state,
            classes,
            query,
            self.budget(query, deadline),
            query.topology_constraints or self.plans.annotated(query.claims),
            explain=explain,
            share_id=share_id,
            node=query.node or None,
            nodes=eligible_nodes(snapshot, query) if restricted else None,
        )

    def place_many(
        self,
        snapshot: ClusterSnapshot,
        state: AllocatedState,
        classes: Mapping[str, DeviceClass],
        query: Query,
        count: int,
        deadline: Deadline,
        *,
        explain: bool = False,
        keep: Callable[[AllocatedState], None] | None = None,
    ) -> list[SolveResult]:
        """`count` identical queries, each placed on `state` with the ones before it held
        (the core's `solve_many`: one shared feasibility and scoring pass); the list ends with
        the first one not placed. A gang's is `place`'s one result. Raises DeadlineExceeded
        when the deadline cut a search short. `keep`: given the state the placements were
        held in (`state` plus the allocations of every Allocated result, owner ""), when they
        were (not for a gang's or a single query's)."""
        if query.gang is not None or count <= 1:
            return [self.place(snapshot, state, classes, query, deadline, explain=explain)]
        restricted = not query.node and (query.node_selector is not None or query.max_nodes > 0)
        if not query.node:
            # The batch solves on a detached copy of `state`, which would build the node
            # groups afresh for itself; built on `state` (the holdings' shared state, as an
            # unpinned unary solve builds them), the copy takes them over and the states
            # derived from `state` keep them up to date: one build per snapshot, not per batch.
            state.node_groups(snapshot)
        holding = state.detached(groups=True)
        plan, facts = self.plans.question(query.claims, classes, snapshot)
        results = solve_many(
            snapshot,
            state,
            classes,
            query.claims,
            count,
            node=query.node or None,
            nodes=eligible_nodes(snapshot, query) if restricted else None,
            policy=query.policy or self.policy,
            selectors=self.selectors,
            budget=self.budget(query, deadline),
            explain=explain,
            share_id=unique_share_id,
            topology_constraints=topology_constraints(query),
            holding=holding,
            plan=plan,
            facts=facts,
        )
        if keep is not None:
            keep(holding)
        return results

    def _solve(
        self,
        snapshot: ClusterSnapshot,
        state: AllocatedState,
        classes: Mapping[str, DeviceClass],
        query: Query,
        budget: SearchBudget,
        topology: Sequence[TopologyConstraint],
        *,
        explain: bool,
        share_id: Callable[[ResourceClaim, str, DeviceID, int], str],
        node: str | None = None,
        nodes: Sequence[str] | None = None,
    ) -> SolveResult:
        """The core's solve of `query`'s claims on the pinned `node`, among `nodes`, or
        among all nodes."""
        plan, facts = self.plans.question(query.claims, classes, snapshot)
        return solve(
            snapshot,
            state,
            classes,
            query.claims,
            plan=plan,
            facts=facts,
            node=node,
            policy=query.policy or self.policy,
            selectors=self.selectors,
            budget=budget,
            explain=explain,
            share_id=share_id,
            topology_constraints=topology,
            nodes=nodes,
        )

    def _place_gang(
        self,
        snapshot: ClusterSnapshot,
        state: AllocatedState,
        classes: Mapping[str, DeviceClass],
        query: Query,
        gang: GangSpec,
        deadline: Deadline,
        explain: bool,
        share_id: Callable[[ResourceClaim, str, DeviceID, int], str],
    ) -> SolveResult:
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
        if explain and isinstance(result, Unsatisfiable):
            detail = self._gang_detail(snapshot, state, classes, query, gang, deadline, topology)
            if detail is not None:
                result = replace(result, explanation=_with_detail(result.explanation, detail))
        elif isinstance(result, Allocated):  # why this gang: its domain and nodes, when asked
            explained = allocated_explanation(result, gang) if explain else None
            result = replace(result, explanation=explained)
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
                result = self.place(snapshot, state, classes, single, deadline, explain=True)
                return result.explanation
            nodes = [n for n in eligible_nodes(snapshot, query) if label in _labels(snapshot, n)]
            result = self._solve(
                snapshot,
                state,
                classes,
                single,
                self.budget(single, deadline),
                topology,
                explain=True,
                share_id=unique_share_id,
                nodes=nodes,
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


def topology_constraints(query: Query) -> tuple[TopologyConstraint, ...]:
    """The request's topology constraints; without any, those of the claims'
    `gpualloc.io/topology-constraints` annotations (as `gpualloc solve` reads them). Clients
    that send both (services/client does) state the same constraints twice: the request wins."""
    return query.topology_constraints or constraints_from_annotations(query.claims)


class PlanMemo:
    """The plans of the last `limit` claim tuples, found by the identity of the claims and of
    the classes (kept alive by the memo, so an identity is never another object's while its
    entry lives), each with its SolveFacts: what the solves of that plan work out from their
    question alone (the core's, checked by the core against the snapshot, policy and
    constraints of each solve). Claims and classes are immutable values, so a plan found is
    the plan `build_plan` would make now; a claim that does not fit the classes raises every
    time (nothing kept). A new snapshot clears every entry's facts, so an old snapshot is
    not kept alive by them. Safe to share between threads."""

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self._plans: OrderedDict[tuple[int, ...], tuple[tuple[object, ...], Plan, SolveFacts]]
        self._plans = OrderedDict()
        self._snapshot: ClusterSnapshot | None = None
        self._annotated: OrderedDict[
            tuple[int, ...], tuple[tuple[object, ...], tuple[TopologyConstraint, ...]]
        ] = OrderedDict()
        self._lock = threading.Lock()

    def annotated(self, claims: Sequence[ResourceClaim]) -> tuple[TopologyConstraint, ...]:
        """`constraints_from_annotations(claims)` (the claims' topology annotations, a value
        of the claims), kept like the plans; a bad annotation raises every time."""
        key = tuple(map(id, claims))
        with self._lock:
            found = self._annotated.get(key)
            if found is not None:
                self._annotated.move_to_end(key)
                return found[1]
        constraints = constraints_from_annotations(claims)
        with self._lock:
            self._annotated[key] = (tuple(claims), constraints)
            while len(self._annotated) > self.limit:
                self._annotated.popitem(last=False)
        return constraints

    def plan(self, claims: Sequence[ResourceClaim], classes: Mapping[str, DeviceClass]) -> Plan:
        return self._entry(claims, classes)[1]

    def question(
        self,
        claims: Sequence[ResourceClaim],
        classes: Mapping[str, DeviceClass],
        snapshot: ClusterSnapshot,
    ) -> tuple[Plan, SolveFacts]:
        """The plan of `claims` and its facts, for a solve on `snapshot`."""
        if snapshot is not self._snapshot:
            with self._lock:
                if snapshot is not self._snapshot:
                    self._snapshot = snapshot
                    for _, _, facts in self._plans.values():
                        facts.clear()
        _, plan, facts = self._entry(claims, classes)
        return plan, facts

    def _entry(
        self, claims: Sequence[ResourceClaim], classes: Mapping[str, DeviceClass]
    ) -> tuple[tuple[object, ...], Plan, SolveFacts]:
        key = (id(classes), *map(id, claims))
        with self._lock:
            found = self._plans.get(key)
            if found is not None:
                self._plans.move_to_end(key)
                return found
        entry = ((classes, *claims), build_plan(claims, classes), SolveFacts())
        with self._lock:
            self._plans[key] = entry
            while len(self._plans) > self.limit:
                self._plans.popitem(last=False)
        return entry
