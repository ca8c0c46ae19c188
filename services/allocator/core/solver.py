"""solve(): claims + snapshot + allocated state -> Allocated | Unsatisfiable, or a typed error.

1. Validate the claims once (plan.py): unknown class, empty selector, bad mode, constraint
   type, more than 32 devices -> InvalidArgument with a field path; resolve the topology
   constraints (topology_constraints.py).
2. For the pinned node, or the nodes worth searching: build a node's candidate lists, drop it
   early if some request cannot have enough free candidates, else search it (search.py), the
   preferred topology constraints first (preferences.py). Without a pinned node the nodes come
   as groups of equal nodes, best-first (nodechoice.py); with `explain` (per-node reasons), an
   `All` request or selectors that read device identities, every node in name order.
   Node-only errors (an `All` request over an incomplete pool, an invalid pool reached by the
   search) are raised for a pinned node; while choosing a node they skip the node, and are
   raised only when no node fits. With `nodes` (the nodes a node selector matches, at most
   max_nodes of them), only those are candidates: each in name order, its static checks from
   its template as for a pinned node, the budget checked before each; FIRST_FIT stops at a fit
   no later node can beat.
3. Pick the node with the smallest key (scoring.node_key: subrequest ranks, preferences missed,
   the policy's term, the name).
4. Build one AllocationResult per claim (results.py) and, on request, the explanation.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import partial

from services.allocator.core.candidates import (
    NodeCandidates,
    NodeError,
    Prepared,
    SolveContext,
    SolveFacts,
)
from services.allocator.core.explain import (
    Explanation,
    NodeChoice,
    NodeMiss,
    OtherNodes,
    ReasonCode,
    Recorder,
    Summary,
    SummaryKind,
    tally_reasons,
)
from services.allocator.core.fragmentation import (
    DEFAULT_MIX,
    FragmentationMix,
)
from services.allocator.core.made import check_made, made
from services.allocator.core.nodechoice import GroupedChoice, template_plan, usable
from services.allocator.core.outcome import (
    Allocated,
    NodePlacement,
    SearchBudget,
    SolveResult,
    Stats,
    Unsatisfiable,
)
from services.allocator.core.outcomes import (
    NodeOutcome,
    OutcomeMemo,
    kept_memo,
    question_memo,
    signature,
)
from services.allocator.core.plan import Alternative, Plan, build_plan
from services.allocator.core.preferences import (
    TopologyFit,
    added_fragmentation,
    preference_phases,
    topology_fit,
)
from services.allocator.core.replay import Group, GroupTape, NodeTape, Replays, taping
from services.allocator.core.results import (
    KeptResults,
    ResultParts,
    ShareIdFactory,
    allocation_result,
    default_share_id,
)
from services.allocator.core.scoring import NodeKey, Policy, Score, free_capacity
from services.allocator.core.search import BudgetExhausted, NodeSearch, StepCounter
from services.allocator.core.selection import (
    Equivalence,
    EquivalenceSources,
    Selection,
    equivalence_sources,
)
from services.allocator.core.snapshot import ClusterSnapshot, DeviceEntry, NodeView
from services.allocator.core.state import AllocatedState
from services.allocator.core.templates import NodeTemplate, NodeTemplates, node_templates
from services.allocator.core.topology_constraints import (
    TopologyConstraint,
    TopologyPlan,
)
from services.cel import CelMeter, SelectorCache
from services.common.dra.model import (
    AllocationMode,
    AllocationResult,
    DeviceClass,
    ResourceClaim,
)
from services.common.errors import GpuallocError

__all__ = [
    "DEFAULT_BUDGET",
    "LastChoice",
    "NodeRun",
    "feasible_nodes",
    "solve",
    "solve_context",
    "solve_in",
]

DEFAULT_BUDGET = SearchBudget()

# What a solve's answer is made of, field by field (made.py): their fields, in order.
check_made(NodePlacement, ("node", "allocations", "score"))
check_made(Allocated, ("placements", "stats", "explanation", "domain"))


def solve(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: Mapping[str, DeviceClass],
    claims: Sequence[ResourceClaim],
    *,
    node: str | None = None,
    policy: Policy = Policy.BINPACK,
    selectors: SelectorCache,
    budget: SearchBudget = DEFAULT_BUDGET,
    explain: bool = False,
    share_id: ShareIdFactory = default_share_id,
    topology_constraints: Sequence[TopologyConstraint] = (),
    fragmentation_mix: FragmentationMix = DEFAULT_MIX,
    nodes: Collection[str] | None = None,
    plan: Plan | None = None,
    facts: SolveFacts | None = None,
) -> SolveResult:
    """Allocate all `claims` together on one node, all or nothing (claims' own `allocation`
    fields are ignored: pass what is held in `state`). `topology_constraints` relate the
    devices of requests (topology_constraints.py); node topologies come from the snapshot.
    `fragmentation_mix`: the requests FRAGMENTATION_AWARE keeps room for (fragmentation.py).
    `nodes`: the only candidates (names without devices or not in the snapshot are none);
    not with a pinned `node`. `plan`: `build_plan(claims, classes)` when the caller has it
    already (a value: the same claims and classes always make the same plan). `facts`: where
    the caller keeps what solves of this plan work out from the question alone (SolveFacts;
    with `plan`, the same plan each time)."""
    if node is not None and nodes is not None:
        raise ValueError("solve takes a pinned node or candidate nodes, not both")
    recorder = Recorder() if explain else None
    ctx = solve_context(
        snapshot,
        state,
        classes,
        claims,
        policy,
        selectors,
        recorder,
        topology_constraints,
        budget,
        plan=plan,
        mix=fragmentation_mix,
        facts=facts,
    )
    return solve_in(ctx, budget, node=node, nodes=nodes, share_id=share_id)


def solve_in(
    ctx: SolveContext,
    budget: SearchBudget,
    *,
    node: str | None = None,
    nodes: Collection[str] | None = None,
    share_id: ShareIdFactory = default_share_id,
    cel_before: tuple[int, int] = (0, 0),
    last: LastChoice | None = None,
) -> SolveResult:
    """`solve` in a context built already (solve_context): the one node loop every question
    goes through — pinned, among named nodes, by node groups, or node by node for an
    explanation. `cel_before`: the context's CEL counts before this solve (a context shared
    by the items of a batch counts for all of them). `last`: what the walk over node groups
    of the same question found on this context's state before the caller held that answer's
    placement (solve_many; LastChoice), updated with what this solve chooses."""
    snapshot, recorder = ctx.snapshot, ctx.recorder
    assert snapshot is not None
    run = NodeRun(ctx, StepCounter(budget.max_steps, budget.max_steps_per_node, budget.cancelled))
    if node is not None:
        view = snapshot.view(node)
        run.pinned(view, snapshot)
        if recorder is not None and not run.found:
            _record_other_nodes(ctx, snapshot, view, recorder)
    elif nodes is not None:
        allowed = set(nodes)
        views = [v for v in snapshot.views() if v.device_count > 0 and v.name in allowed]
        run.restricted(views, snapshot)
    elif recorder is not None or not run.choose_by_groups(snapshot, last):
        views = list(snapshot.views()) if snapshot.node_names else [snapshot.nil_view]
        run.choose([v for v in views if v.device_count > 0] or views[:1])
    result = run.result(share_id, cel_before)
    if last is not None:  # the answer is on the node `last` carries, if it carries one
        last.answered(ctx.state, snapshot, run)
    return result


def feasible_nodes(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: Mapping[str, DeviceClass],
    claims: Sequence[ResourceClaim],
    *,
    policy: Policy = Policy.BINPACK,
    selectors: SelectorCache,
    budget: SearchBudget = DEFAULT_BUDGET,
    topology_constraints: Sequence[TopologyConstraint] = (),
    fragmentation_mix: FragmentationMix = DEFAULT_MIX,
) -> tuple[list[tuple[NodeKey, Sequence[str]]], Stats]:
    """Every node where `claims` fit on their own, as groups of nodes that score alike: each
    group's node key (scoring.node_key) is its first node's, and a later node's is the same
    key under its own name. One search per node group, not per node. For gangs (gang.py)."""
    ctx = solve_context(
        snapshot,
        state,
        classes,
        claims,
        policy,
        selectors,
        None,
        topology_constraints,
        budget,
        mix=fragmentation_mix,
    )
    run = NodeRun(ctx, StepCounter(budget.max_steps, budget.max_steps_per_node, budget.cancelled))
    groups = run.all_feasible(snapshot)
    return groups, run.stats(0)


def solve_context(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: Mapping[str, DeviceClass],
    claims: Sequence[ResourceClaim],
    policy: Policy,
    selectors: SelectorCache,
    recorder: Recorder | None,
    topology_constraints: Sequence[TopologyConstraint],
    budget: SearchBudget = DEFAULT_BUDGET,
    *,
    plan: Plan | None = None,
    mix: FragmentationMix = DEFAULT_MIX,
    facts: SolveFacts | None = None,
) -> SolveContext:
    """The context every node's search of one solve shares. `plan`: build_plan(claims,
    classes), when the caller has it; `facts`: the caller's SolveFacts of that plan (the
    context reads and adds to them when they are for the same question on `snapshot`)."""
    plan = build_plan(claims, classes) if plan is None else plan
    kept = None
    if facts is not None:
        question = (policy, mix, tuple(topology_constraints))
        kept = facts.of(plan, snapshot, selectors, question)
    topology = kept.get(_TOPOLOGY) if kept is not None else None
    if not isinstance(topology, TopologyPlan):
        implicit = policy.rules.implicit_topology and bool(snapshot.topologies)
        topology = TopologyPlan(plan, topology_constraints, implicit_nvlink=implicit)
        if kept is not None:
            kept[_TOPOLOGY] = topology
    found = kept.get(_SOURCES) if kept is not None else None
    sources: EquivalenceSources
    if isinstance(found, tuple):
        sources = found
    else:
        sources = equivalence_sources(plan)
        if kept is not None:
            kept[_SOURCES] = sources
    selection = Selection(selectors, CelMeter(budget.max_cel_cost, budget.cancelled))
    return SolveContext(
        plan,
        state,
        policy,
        selection,
        Equivalence(selection, plan, distinct=not topology.empty, sources=sources),
        recorder,
        topology=None if topology.empty else topology,
        mix=mix,
        snapshot=snapshot,
        kept=kept,
    )


# Among a context's facts: its TopologyPlan, and what its Equivalence reads of the plan.
_TOPOLOGY = "solver.topology"
_SOURCES = "solver.equivalence_sources"


@dataclass
class LastChoice:
    """The node a walk over node groups chose (its key), carried to the next item of a batch
    of identical items once the caller has held that placement (solve_many).

    Why the next item may skip its walk: a node's key depends only on that node and the
    devices in use on it (the premise of node groups, outcomes.py), the key names the node, so
    keys of different nodes never tie, and a walk that did not run out of budget answers the
    node with the smallest key of all (nodechoice.py). Holding the placement changes only
    the chosen node, so every other node keeps the key it had, which was larger than the
    chosen node's then. If the chosen node, searched again with the placement held, still
    fits with a key no larger, it is the smallest again: the walk would answer it too. The
    walk's own steps can only shrink (it stops at a smaller key, so it pops no group it did
    not pop before, but the chosen node's new one), so when the last walk's steps plus the new
    search's stay under the budget, the walk would not have run out either.

    The holds of answers read from kept outcomes whose picks all hold their device whole
    wait in `pending` (`deferred`) until the caller holds them at once (`hold`): before the
    next walk reads the state, and at the end. Until then `used` counts them: the chosen
    node's devices in use as the state will have them (a kept outcome's picks are devices
    not in use, each taken by its hold: the node's in-use indices grow by exactly those)."""

    # the chosen node and its key now; None: no walk to carry (none yet, or out of budget)
    view: NodeView | None = None
    key: NodeKey | None = None
    steps: int = 0  # the steps the walk that made the choice took
    feasible: int = 0  # the nodes that walk knew to fit (all still fit: Stats)
    nodes_total: int = 0  # the nodes that walk chose among
    # the chosen node's template and the outcomes kept for the question on it (None: ungrouped)
    template: NodeTemplate | None = None
    memo: OutcomeMemo[NodeOutcome] | None = None
    # whether the last answer's holds wait in `pending` (else the caller holds its allocations)
    deferred: bool = False
    # the chosen node's device indices answered and not held yet, and its devices in use
    # counting them (None: read from the state)
    pending: tuple[int, ...] = ()
    used: frozenset[int] | None = None
    # what `again` reads alike for every item on the chosen node (_OnNode), from its first
    _on: _OnNode | None = None

    def chose(
        self,
        view: NodeView,
        key: NodeKey,
        steps: int,
        feasible: int,
        nodes_total: int,
        template: NodeTemplate | None,
        memo: OutcomeMemo[NodeOutcome] | None,
    ) -> None:
        """A walk chose `view` (its `key`) in `steps`, knowing `feasible` of `nodes_total`
        nodes to fit (nothing pending: the caller held it before the walk)."""
        assert not self.pending, "held before a walk"
        self.view, self.key, self.steps, self.feasible = view, key, steps, feasible
        self.nodes_total, self.template, self.memo = nodes_total, template, memo
        self.used = self._on = None

    def forget(self) -> None:
        """No walk to carry: the next item walks."""
        assert not self.pending, "held before a walk"
        self.view = self.key = self.used = None

    def answered(self, state: AllocatedState, snapshot: ClusterSnapshot, run: NodeRun) -> None:
        """A solve with this choice answered on the chosen node (if any) as `run` did."""
        taken, view = run.taken, self.view
        self.deferred = taken is not None and view is not None
        if taken is not None and view is not None:
            self.pending = tuple(taken)
            self.used = state.node_in_use(snapshot, view).union(taken)
        else:  # the caller holds its allocations: read from the state again
            self.used = None

    def hold(self, held: AllocatedState, snapshot: ClusterSnapshot) -> None:
        """Hold what is pending on `held` (the state the answers were made on)."""
        if self.pending:
            assert self.view is not None
            held.hold_whole_in_place(snapshot, self.view, self.pending)
            self.pending = ()

    def again(
        self, ctx: SolveContext, budget: SearchBudget, share_id: ShareIdFactory
    ) -> Allocated | None:
        """What `solve_in(ctx, budget, last=self, ...)` answers when it takes the last node
        again from the outcome kept for the node's devices in use now (NodeRun._again, then
        NodeRun.result), made without a NodeRun; its holds deferred when its picks all hold
        their device whole. It evaluates no CEL: its Stats count none. None, with nothing
        changed, where solve_in must decide: no kept outcome for the node's state, one that
        does not fit or ranks worse, the budget, or a kept fit no solve scored yet (solve_in
        scores it for the next)."""
        view, memo, snapshot = self.view, self.memo, ctx.snapshot
        if view is None or memo is None or snapshot is None:
            return None
        used = self.used
        if used is None:
            used = ctx.state.node_in_use(snapshot, view)
        kept = memo.get(used)
        if kept is None or kept.key is None or kept.score is None:
            return None
        steps = kept.steps  # _again's: NodeRun._affordable, the walk's budget left
        if steps > budget.max_steps_per_node or self.steps + steps >= budget.max_steps:
            return None
        key = kept.key.named(view.name or "")
        assert self.key is not None
        if key > self.key:
            return None
        self.key = key
        on = self._on
        if on is None:
            on = self._on = _OnNode(ctx, view)
        stats = on.stats.get(steps)
        if stats is None:
            total = self.nodes_total
            values = (steps, 0, total, total - 1, 1, self.feasible, False, 0)
            stats = on.stats[steps] = _shared_stats(ctx, values)
        found = on.results.get(id(kept))
        results = found[1] if found is not None else _kept_results(ctx, kept, on.parts)
        taken: list[int] = []
        allocations, whole = results.on(on.devices, view.name, share_id, on.parts, taken)
        if whole:
            self.pending += tuple(taken)
            self.used = used.union(taken)
        else:  # the caller holds its allocations, after what is pending
            self.used = None
        self.deferred = whole
        placement = made(
            NodePlacement, {"node": view.name, "allocations": allocations, "score": kept.score}
        )
        return made(
            Allocated,
            {"placements": (placement,), "stats": stats, "explanation": None, "domain": None},
        )


class _OnNode:
    """What LastChoice.again reads alike for every item on one chosen node: its devices,
    the context's result parts and kept outcomes' results (_kept_results), Stats by steps."""

    __slots__ = ("devices", "parts", "results", "stats")

    def __init__(self, ctx: SolveContext, view: NodeView) -> None:
        self.devices = view.devices()
        self.parts = _result_parts(ctx)
        self.results = _kept_results_of(ctx)
        self.stats: dict[int, Stats] = {}


@dataclass
class _Found:
    """A node that fits: its key, and the placement found there, from this solve's search or
    from a kept outcome of a node of its group (outcomes.py)."""

    view: NodeView
    key: NodeKey  # from the placement's ranks and free capacity: cheap, enough to rank nodes
    topology: TopologyFit
    fragmentation: Fraction
    search: NodeSearch | None = None
    outcome: NodeOutcome | None = None  # kept for its group; its Score is filled in once known
    rescore: Callable[[], Score] | None = None  # searches the node again when nothing knows it
    _score: Score | None = None

    @property
    def score(self) -> Score:
        """The full score (free devices need a per-device check): only for nodes shown."""
        if self._score is None:
            kept = self.outcome.score if self.outcome is not None else None
            if kept is not None:
                self._score = kept
            elif self.search is not None:
                fit = self.topology
                self._score = replace(
                    self.search.score(),
                    preferred_missed=fit.preferred_missed,
                    implicit_missed=fit.implicit_missed,
                    nvlink_links=fit.nvlink_links,
                    numa_nodes=fit.numa_nodes,
                    fragmentation=self.fragmentation,
                )
            else:
                assert self.rescore is not None
                self._score = self.rescore()
            if self.outcome is not None:
                self.outcome.score = self._score
        return self._score


def _rescore(
    ctx: SolveContext,
    steps: StepCounter,
    view: NodeView,
    prepared: Prepared | NodeTemplate,
    used: frozenset[int],
) -> Score:
    """The Score of a kept outcome nobody scored yet: the node searched again, apart from the
    bookkeeping of the solve that found it. (A _Found's `rescore` is this with its arguments
    bound, not a closure over its NodeRun: the run keeps its _Founds, so a closure would make
    a reference cycle per node move, left for the cyclic collector.)"""
    if isinstance(prepared, NodeTemplate):
        assert ctx.snapshot is not None
        prepared = template_plan(ctx, ctx.snapshot, prepared).prepared
    again = NodeRun(ctx, replace(steps, steps=0))
    found = again._node(view, None, prepared, used, keep=False)
    assert found is not None, "a kept fit must fit again"
    return found.score


def _quiet_rescore(
    ctx: SolveContext,
    steps: StepCounter,
    view: NodeView,
    template: NodeTemplate,
    used: frozenset[int],
) -> Score:
    """A kept fit's Score, searching the node again with nothing recorded."""
    assert ctx.snapshot is not None
    with taping(ctx, None):
        facts = template_plan(ctx, ctx.snapshot, template)
        return _rescore(ctx, steps, view, facts.prepared, used)


class NodeRun:
    """One solve's bookkeeping across nodes."""

    # Until a solve sets its own (a batch makes one run per item: only what every run
    # changes is set in __init__).
    feasible: int | None = None  # nodes known to fit, when groups stand for nodes
    exhausted = False
    eligible_only = False  # the candidates were restricted to named nodes
    _question: Hashable | None = None  # outcomes.signature, once a kept one is read
    _replays: Replays | None = None  # explaining by node groups (replay.py)
    _no_replays = False
    _unreplayable: frozenset[int] | set[int] = frozenset()
    # the answer's device indices on its node, each held whole, when read from a kept outcome
    taken: list[int] | None = None

    def __init__(self, ctx: SolveContext, steps: StepCounter) -> None:
        self.ctx = ctx
        self.steps = steps
        self.found: list[_Found] = []
        self.misses: list[NodeMiss] = []
        self.errors: list[GpuallocError] = []
        self.nodes_total = self.pruned = self.searched = 0

    def pinned(self, view: NodeView, snapshot: ClusterSnapshot) -> None:
        self.nodes_total = 1
        try:
            self._node(view, prepared=self._prepared(view, snapshot))
        except NodeError as err:
            raise err.error from None

    def _prepared(self, view: NodeView, snapshot: ClusterSnapshot) -> Prepared | None:
        """A pinned node's static checks from its template, when they may stand for it (not
        when explaining: the per-device reasons come from the checks themselves)."""
        if self.ctx.recorder is not None or view.name is None:
            return None
        templates = node_templates(snapshot)
        template = templates.of_node.get(view.name)
        if template is None or not usable(self.ctx.plan, self.ctx, templates):
            return None
        return template_plan(self.ctx, snapshot, template).prepared

    def choose(self, views: Sequence[NodeView]) -> None:
        self.nodes_total = len(views)
        try:
            for view in views:
                found = None
                try:
                    found = self._visit(view)
                except NodeError as err:
                    self.errors.append(err.error)
                    self.misses.append(_error_miss(view, err.error))
                if found is not None and self.ctx.rules.final(found.key):
                    return  # nodes come by name: no later one can beat it
                if self.steps.steps >= self.steps.max_steps:
                    self.exhausted = True
                    return
        finally:
            self._finish_replays()
        if not self.found and self.errors:
            raise self.errors[0]

    def restricted(self, views: Sequence[NodeView], snapshot: ClusterSnapshot) -> None:
        """Only `views` (the named nodes), each as if pinned; the budget is checked before
        each node, so a last node's search that used it up leaves the answer complete."""
        self.eligible_only = True
        self.nodes_total = len(views)
        try:
            for view in views:
                if self.steps.steps >= self.steps.max_steps:
                    self.exhausted = True
                    break
                try:
                    found = self._visit(view, prepared=self._prepared(view, snapshot))
                except NodeError as err:
                    self.errors.append(err.error)
                    self.misses.append(_error_miss(view, err.error))
                    continue
                if found is not None and self.ctx.rules.final(found.key):
                    break  # nodes come by name: no later one can beat it
        finally:
            self._finish_replays()
        if not self.found and self.errors:
            raise self.errors[0]  # node-only errors count only when no node fits

    def all_feasible(self, snapshot: ClusterSnapshot) -> list[tuple[NodeKey, Sequence[str]]]:
        """Every feasible node, by groups of nodes that score alike (each group with the key
        of its first node) when groups may stand for their nodes, else one by one."""
        templates = node_templates(snapshot)
        if usable(self.ctx.plan, self.ctx, templates):
            choice = GroupedChoice(
                self.ctx,
                snapshot,
                self.ctx.state.node_groups(snapshot),
                self._evaluate,
                self._out_of_steps,
                exhaustive=True,
            )
            choice.run()
            self.nodes_total = len(templates.of_node) + len(templates.ungrouped)
            self.searched, self.feasible = choice.searched, choice.feasible
            self.pruned = self.nodes_total - choice.searched
            return choice.feasible_groups
        found: list[tuple[NodeKey, Sequence[str]]] = []
        views = [v for v in snapshot.views() if v.device_count > 0]
        self.nodes_total = len(views)
        for view in views:
            key = self._evaluate(view, None, None, None, None)
            if key is not None and view.name is not None:
                found.append((key, (view.name,)))
            if self._out_of_steps():
                break
        return found

    def choose_by_groups(self, snapshot: ClusterSnapshot, last: LastChoice | None = None) -> bool:
        """Best-first over node groups (nodechoice.py); False when groups cannot stand for
        their nodes in this solve (the caller then searches every node). With `last`: the
        last item's node again when it is still the best (LastChoice), else the walk; either
        way `last` then holds this solve's choice."""
        templates = node_templates(snapshot)
        if not usable(self.ctx.plan, self.ctx, templates):
            return False
        if last is not None:
            if last.view is not None and self._again(snapshot, templates, last):
                return True
            last.forget()
        choice = GroupedChoice(
            self.ctx,
            snapshot,
            self.ctx.state.node_groups(snapshot),
            self._evaluate,
            self._out_of_steps,
        )
        choice.run()
        self.nodes_total = len(templates.of_node) + len(templates.ungrouped)
        self.searched = choice.searched
        self.pruned = self.nodes_total - choice.searched
        self.feasible = choice.feasible
        if last is not None and self.found and not self.exhausted:
            best = min(self.found, key=_key_of)
            template = templates.of_node.get(best.view.name or "")
            memo = None if template is None else question_memo(self.ctx, template)
            last.chose(
                best.view,
                best.key,
                self.steps.steps,
                choice.feasible,
                self.nodes_total,
                template,
                memo,
            )
        if not self.found and self.errors:
            raise self.errors[0]
        return True

    def _again(self, snapshot: ClusterSnapshot, templates: NodeTemplates, last: LastChoice) -> bool:
        """The last item's node, searched with its placement held, when it is still the best
        node (LastChoice); False, with nothing counted, when the walk must decide."""
        assert last.view is not None and last.key is not None
        view, template = last.view, last.template
        try:
            if template is None or last.memo is None:
                found = self._node(view)
            else:
                used = self.ctx.state.node_in_use(snapshot, view)
                kept = last.memo.get(used)
                if kept is None or kept.key is None or not self._affordable(kept.steps):
                    # no kept outcome for its new state (a walk searches it once), or one that
                    # does not fit there: the node is no longer the best (a full node: eight-gpus)
                    return False
                found = self._reuse(view, kept, template, used)
        except NodeError:
            found = None
        steps = self.steps.steps
        if (
            found is None
            or self.exhausted
            or found.key > last.key
            or last.steps + steps >= self.steps.max_steps
        ):
            self._forget()
            return False
        self.nodes_total = len(templates.of_node) + len(templates.ungrouped)
        self.searched, self.pruned = 1, self.nodes_total - 1
        self.feasible = last.feasible
        last.key = found.key
        return True

    def _forget(self) -> None:
        """Back to a run that has searched nothing (_again's search did not decide)."""
        self.found.clear()
        self.misses.clear()
        self.errors.clear()
        self.searched = self.pruned = self.steps.steps = 0
        self.exhausted = False

    def _evaluate(
        self,
        view: NodeView,
        before: Fraction | None,
        prepared: Prepared | None,
        in_use: frozenset[int] | None,
        template: NodeTemplate | None,
    ) -> NodeKey | None:
        try:
            found = self._node(view, before, prepared, in_use, template=template)
        except NodeError as err:
            self.errors.append(err.error)
            self.misses.append(_error_miss(view, err.error))
            return None
        return None if found is None else found.key

    def _available(self, entry: DeviceEntry) -> bool:
        state = self.ctx.state
        return not (state.is_exclusive(entry.id) if entry.multi else state.in_use(entry.id))

    def _out_of_steps(self) -> bool:
        self.exhausted = self.exhausted or self.steps.steps >= self.steps.max_steps
        return self.exhausted

    def _node(
        self,
        view: NodeView,
        before: Fraction | None = None,
        prepared: Prepared | None = None,
        in_use: frozenset[int] | None = None,
        *,
        keep: bool = True,
        template: NodeTemplate | None = None,
    ) -> _Found | None:
        """Search one node; `before` is its free capacity and `prepared` its static check
        outcomes when the caller knows them (node groups, with the devices `in_use` and the
        node's `template`). A node of a template, outside an explanation, reads the outcome
        kept for its group when one is (outcomes.py), else searches and keeps what it found
        (`keep` False: neither)."""
        kept = self._kept(view, prepared, in_use, template) if keep else None
        if kept is not None:
            memo, used = kept
            outcome = memo.get(used)
            if outcome is not None and self._affordable(outcome.steps):
                assert prepared is not None
                return self._reuse(view, outcome, prepared, used)
        started = self.steps.steps
        cands = NodeCandidates(self.ctx, view, prepared, in_use)
        cands.prepare()
        search = NodeSearch(self.ctx, cands, self.steps)
        miss = _cheap_miss(self.ctx.plan, cands, search)
        if miss is not None:
            self.pruned += 1
            self.misses.append(miss)
            if kept is not None:
                kept[0].put(kept[1], self._missed(self.steps.steps - started, True, miss))
            return None
        self.searched += 1
        try:
            fits = False
            for active in preference_phases(self.ctx, cands):
                attempt = (
                    search if active is None else NodeSearch(self.ctx, cands, self.steps, active)
                )
                if attempt.run():
                    search, fits = attempt, True
                    break
        except BudgetExhausted:
            self.exhausted = True
            self.misses.append(_budget_miss(view, search))
            return None
        steps = self.steps.steps - started
        if fits:
            if before is None:
                state = self.ctx.state
                before = free_capacity(view.devices(), self._available, state.counter_amount)
            capacity = before - search.capacity_taken()
            fit = topology_fit(self.ctx, search)
            missed = (fit.preferred_missed, fit.implicit_missed)
            added = added_fragmentation(self.ctx, search, before - capacity)
            key = self.ctx.rules.node_key(view.name, search.ranks(), capacity, missed, added)
            outcome = None
            if kept is not None:
                outcome = _fitted(steps, key, search, fit, added)
                kept[0].put(kept[1], outcome)
            found = _Found(view, key, fit, added, search=search, outcome=outcome)
            self.found.append(found)
            return found
        if search.miss is not None:
            self.misses.append(search.miss)
        if kept is not None:
            kept[0].put(kept[1], self._missed(steps, False, search.miss))
        return None

    def search_node(
        self, view: NodeView, before: Fraction, prepared: Prepared, in_use: frozenset[int]
    ) -> _Found | None:
        """One node of a template with the devices `in_use` (its free capacity `before`), as
        a pinned solve searches it; its outcome is kept for its group (outcomes.py)."""
        self.nodes_total += 1
        return self._node(view, before, prepared, in_use)

    # --- explaining by node groups (replay.py) ---------------------------------------------

    def _visit(self, view: NodeView, prepared: Prepared | None = None) -> _Found | None:
        """One node of a choice over nodes by name: explained by its group's tape when it
        can be (replay.py), else searched on its own."""
        replays = self._replaying()
        if replays is None or view.name is None:
            return self._node(view, prepared=prepared)
        snapshot = replays.snapshot
        template = replays.of_node.get(view.name)
        if template is None or template.id in self._unreplayable:
            return self._node(view, prepared=prepared)
        used = self.ctx.state.node_in_use(snapshot, view)
        group = replays.groups.get((template.id, used))
        if group is None:
            kept = self._tapes(template).get(used)
            if kept is not None and self._affordable(kept.steps):
                group = replays.start(template, used, kept)
        if group is not None and self._affordable(group.tape.steps):
            return self._replayed(view, group, template, used)
        return self._taped(view, template, used, replays)

    def _tapes(self, template: NodeTemplate) -> OutcomeMemo[GroupTape]:
        """The explaining searches kept for this question on the template."""
        if self._question is None:
            self._question = signature(self.ctx)
        return kept_memo(template, ("tapes", self._question), _TAPES)

    def _replaying(self) -> Replays | None:
        """The solve's group tapes, when it explains and its plan lets groups stand for
        their nodes (templates.py)."""
        if self._replays is None and self.ctx.recorder is not None and not self._no_replays:
            snapshot = self.ctx.snapshot
            templates = node_templates(snapshot) if snapshot is not None else None
            if (
                snapshot is None
                or templates is None
                or not usable(self.ctx.plan, self.ctx, templates)
            ):
                self._no_replays = True
                return None
            self._replays = Replays(self.ctx, snapshot)
            self._unreplayable = {
                t.id
                for t in templates.templates
                if any(p.pool.incomplete for p in snapshot.view(t.nodes[0]).pools)
            }  # their searches note their own pools: every node explains itself
        return self._replays

    def _taped(
        self, view: NodeView, template: NodeTemplate, used: frozenset[int], replays: Replays
    ) -> _Found | None:
        """Search the node with its template's candidate lists, its events on a tape that
        its group's other nodes replay (when the search was complete), kept for later
        explanations of the same question."""
        facts = replays.facts.get(template.id)
        if facts is None:
            with taping(self.ctx, None):  # the template's own checks are not this node's events
                facts = replays.facts[template.id] = template_plan(
                    self.ctx, replays.snapshot, template
                )
        tape = NodeTape()
        started, misses = self.steps.steps, len(self.misses)
        pruned, searched, exhausted = self.pruned, self.searched, self.exhausted
        error: GpuallocError | None = None
        found = None
        with taping(self.ctx, tape):
            try:
                found = self._node(
                    view, template.free_capacity(used), facts.prepared, used, keep=False
                )
            except NodeError as err:
                error = err.error
        assert not tape.considered, "a template's candidate lists consider no device"
        labels = replays.labels
        group = GroupTape.of(tape, replays.slot, labels)
        group.steps = self.steps.steps - started
        group.pruned, group.searched = self.pruned - pruned, self.searched - searched
        group.misses = tuple(
            (miss, labels.index(miss.claim) if miss.claim in labels else -1)
            for miss in self.misses[misses:]
        )
        group.complete = not (self.exhausted and not exhausted)
        group.error = error
        if found is not None:
            assert found.search is not None
            group.outcome = found.outcome = _fitted(
                group.steps, found.key, found.search, found.topology, found.fragmentation
            )
        replays.start(template, used, group).members.append(view.name or "")
        if group.complete and error is None:
            self._tapes(template).put(used, group)
        if error is not None:
            raise NodeError(error)
        return found

    def _replayed(
        self, view: NodeView, group: Group, template: NodeTemplate, used: frozenset[int]
    ) -> _Found | None:
        """A node of a group explained already: its answer is the group's, under its name."""
        name = view.name or ""
        tape = group.tape
        group.members.append(name)
        self.steps.steps += tape.steps
        self.pruned += tape.pruned
        self.searched += tape.searched
        if tape.misses:
            self.misses.extend(tape.misses_on(name, self._replays.labels if self._replays else []))
        if tape.error is not None:
            self.errors.append(tape.error)
            self.misses.append(_error_miss(view, tape.error))
            return None
        outcome = tape.outcome
        if outcome is None or outcome.key is None:
            return None
        found = _Found(
            view,
            outcome.key.named(name),
            outcome.topology,
            outcome.fragmentation,
            outcome=outcome,
            rescore=partial(_quiet_rescore, self.ctx, self.steps, view, template, used),
        )
        self.found.append(found)
        return found

    def _finish_replays(self) -> None:
        if self._replays is not None and self.ctx.recorder is not None:
            self._replays.finish(self.ctx.recorder)

    # --- outcomes kept per node group (outcomes.py) ----------------------------------------

    def _kept(
        self,
        view: NodeView,
        prepared: Prepared | None,
        in_use: frozenset[int] | None,
        template: NodeTemplate | None,
    ) -> tuple[OutcomeMemo[NodeOutcome], frozenset[int]] | None:
        """The memo of this question for the node's template (found by name unless given),
        and the node's devices in use; None when the node's search cannot stand for its
        group's (no template's static checks, or an explanation, whose per-device reasons
        come from the search itself)."""
        snapshot = self.ctx.snapshot
        if prepared is None or self.ctx.recorder is not None or snapshot is None:
            return None
        if template is None:
            template = node_templates(snapshot).of_node.get(view.name or "")
            if template is None:
                return None
        used = in_use if in_use is not None else self.ctx.state.node_in_use(snapshot, view)
        return question_memo(self.ctx, template), used

    def _affordable(self, steps: int) -> bool:
        """Whether the budget allows the steps a kept search took (else search again, and
        run out of budget where the search itself would)."""
        counter = self.steps
        return steps <= counter.max_steps_per_node and counter.steps + steps <= counter.max_steps

    def _reuse(
        self,
        view: NodeView,
        outcome: NodeOutcome,
        prepared: Prepared | NodeTemplate,
        used: frozenset[int],
    ) -> _Found | None:
        """A kept outcome for the node (`prepared`: its static checks, or its template's for
        the rare rescore to work them out)."""
        self.steps.steps += outcome.steps
        if outcome.pruned:
            self.pruned += 1
        else:
            self.searched += 1
        if outcome.key is None:
            miss = outcome.miss_on(view.name, self.ctx.plan)
            if miss is not None:
                self.misses.append(miss)
            return None
        found = _Found(
            view,
            outcome.key.named(view.name or ""),
            outcome.topology,
            outcome.fragmentation,
            outcome=outcome,
            rescore=partial(_rescore, self.ctx, self.steps, view, prepared, used),
        )
        self.found.append(found)
        return found

    def _missed(self, steps: int, pruned: bool, miss: NodeMiss | None) -> NodeOutcome:
        labels = [claim.label for claim in self.ctx.plan.claims]
        claim = labels.index(miss.claim) if miss is not None and miss.claim in labels else -1
        return NodeOutcome(steps, pruned, miss=miss, miss_claim=claim)

    def stats(self, cel_evaluations: int, cel_profile_hits: int = 0) -> Stats:
        """This run's Stats; the solves of one context (a batch's items) that count alike
        share one (a value)."""
        values = (
            self.steps.steps,
            cel_evaluations,
            self.nodes_total,
            self.pruned,
            self.searched,
            len(self.found) if self.feasible is None else self.feasible,
            self.exhausted,
            cel_profile_hits,
        )
        return _shared_stats(self.ctx, values)

    def result(self, share_id: ShareIdFactory, cel_before: tuple[int, int] = (0, 0)) -> SolveResult:
        """The solve's answer; its CEL counts are this solve's own (its meter's, less
        `cel_before`)."""
        selection = self.ctx.selection
        evaluations = selection.cel_evaluations - cel_before[0]
        stats = self.stats(evaluations, selection.cel_profile_hits - cel_before[1])
        if not self.found:
            return Unsatisfiable(self._unsatisfiable_explanation(), stats, self.exhausted)
        found = self.found
        # the best and the runner-up
        ranked = found if len(found) == 1 else heapq.nsmallest(2, found, key=_key_of)
        best = ranked[0]
        allocations = self._allocations(best, share_id)
        explanation = self._choice_explanation(ranked) if self.ctx.recorder is not None else None
        placement = made(
            NodePlacement,
            {"node": best.view.name, "allocations": allocations, "score": best.score},
        )
        return made(
            Allocated,
            {
                "placements": (placement,),
                "stats": stats,
                "explanation": explanation,
                "domain": None,
            },
        )

    def _allocations(self, found: _Found, share_id: ShareIdFactory) -> tuple[AllocationResult, ...]:
        name = found.view.name
        if found.search is None:
            outcome = found.outcome
            assert outcome is not None
            parts = _result_parts(self.ctx)
            taken: list[int] = []
            allocations, whole = _kept_results(self.ctx, outcome, parts).on(
                found.view.devices(), name, share_id, parts, taken
            )
            self.taken = taken if whole else None
            return allocations
        picks, chosen = found.search.picks, found.search.chosen
        parts = _result_parts(self.ctx)
        return tuple(
            [
                allocation_result(
                    claim, picks[claim.index], chosen[claim.index], name, share_id, parts
                )
                for claim in self.ctx.plan.claims
            ]
        )

    def _unsatisfiable_explanation(self) -> Explanation:
        misses = tuple(sorted(self.misses, key=NodeMiss.rank))
        if misses:
            kind = SummaryKind.NO_NODE_FITS
        elif self.eligible_only:
            kind = SummaryKind.NO_ELIGIBLE_NODE
        else:
            kind = SummaryKind.NO_DEVICES
        summary = Summary(
            kind,
            closest=misses[0] if misses else None,
            eligible=self.eligible_only,
            budget_exhausted=self.exhausted,
        )
        recorder = self.ctx.recorder
        return Explanation(
            summary=summary,
            nodes=misses,
            requests=recorder.requests() if recorder else (),
            constraints=recorder.constraints() if recorder else (),
            notes=recorder.notes() if recorder else (),
            budget_exhausted=self.exhausted,
        )

    def _choice_explanation(self, ranked: Sequence[_Found]) -> Explanation:
        best = ranked[0]
        runner_up = ranked[1] if len(ranked) > 1 else None
        choice = NodeChoice(
            node=best.view.name,
            score=best.score,
            feasible_nodes=len(self.found),
            runner_up=runner_up.view.name if runner_up else None,
            runner_up_score=runner_up.score if runner_up else None,
            policy=str(self.ctx.policy),
        )
        recorder = self.ctx.recorder
        assert recorder is not None
        return Explanation(
            summary=Summary(SummaryKind.ALLOCATED, node=best.view.name),
            nodes=tuple(sorted(self.misses, key=NodeMiss.rank)),
            choice=choice,
            requests=recorder.requests(),
            constraints=recorder.constraints(),
            notes=recorder.notes(),
            budget_exhausted=self.exhausted,
        )


def _cheap_miss(plan: Plan, cands: NodeCandidates, search: NodeSearch) -> NodeMiss | None:
    """A node where some request cannot get enough free candidates for any alternative (or not
    enough that agree on its constraints) cannot fit; say how close it came, without a search."""
    for claim in plan.claims:
        for request in claim.requests:
            closest = _closest(request.alternatives, cands)
            if closest is None:
                continue
            placed, needed, tally = closest
            only = request.alternatives[0] if len(request.alternatives) == 1 else None
            return NodeMiss(
                node=cands.view.name,
                placed=placed,
                needed=search.needed(),
                claim=claim.label,
                request=only.result_name if only else request.name,
                request_placed=placed,
                request_needed=needed,
                reasons=tally_reasons(tally, needed - placed),
            )
    return None


def _closest(
    alternatives: Sequence[Alternative], cands: NodeCandidates
) -> tuple[int, int, dict[ReasonCode, int]] | None:
    """None if some alternative may fit; else the best (placed, needed, reasons)."""
    best: tuple[int, int, dict[ReasonCode, int]] | None = None
    for alternative in alternatives:
        if alternative.mode is AllocationMode.ALL:
            if cands.count(alternative) > 0:
                return None
            continue
        room = cands.available(alternative)
        if room.unbounded or room.most >= alternative.count:
            return None
        if best is None or room.most > best[0]:
            tally = dict(cands.tally(alternative))
            for code, count in room.busy.items():
                tally[code] = tally.get(code, 0) + count
            if room.most < room.free:
                tally[ReasonCode.CONSTRAINT] = room.free - room.most
            best = (room.most, alternative.count, tally)
    return best if best is not None else (0, 1, {})


def _record_other_nodes(
    ctx: SolveContext, snapshot: ClusterSnapshot, view: NodeView, recorder: Recorder
) -> None:
    """For a pinned node that does not fit: the matching devices it cannot use."""
    here = {entry.id for entry in view.devices()}
    elsewhere = [e for e in snapshot.all_devices() if e.id not in here]
    for claim in ctx.plan.claims:
        for alternative in (a for r in claim.requests for a in r.alternatives):
            for entry in elsewhere:
                try:
                    matches = ctx.selection.matches(alternative, entry, claim.label)
                except GpuallocError:
                    continue  # a selector failing elsewhere is no concern of this node
                if matches:
                    other = OtherNodes(view.name)
                    recorder.reject(alternative, entry.id, ReasonCode.OTHER_NODE, other)


def _error_miss(view: NodeView, error: GpuallocError) -> NodeMiss:
    return NodeMiss(view.name, 0, 0, "", "", 0, 0, (), error=error.message)


def _budget_miss(view: NodeView, search: NodeSearch) -> NodeMiss:
    placed = search.miss.placed if search.miss else 0
    return NodeMiss(view.name, placed, search.needed(), "", "", 0, 0, (), budget_exhausted=True)


_TAPES = 2048  # explaining searches kept per (template, question)
_RESULT_PARTS = "results.parts"  # the context's ResultParts
_STATS = "solver.stats"  # the context's Stats by their values


def _shared_stats(
    ctx: SolveContext, values: tuple[int, int, int, int, int, int, bool, int]
) -> Stats:
    """The Stats of these values, one per context (NodeRun.stats)."""
    made = ctx.derived.get(_STATS)
    if not isinstance(made, dict):
        made = ctx.derived[_STATS] = {}
    found = made.get(values)
    if found is None:
        found = made[values] = Stats(*values)
    assert isinstance(found, Stats)
    return found


def _result_parts(ctx: SolveContext) -> ResultParts | None:
    """What the context's results share, kept from its second result on (a batch's later
    items; a unary solve makes one result and keeps nothing). Not among the facts a caller
    keeps (SolveFacts): its node selectors grow with the nodes placed on."""
    parts = ctx.derived.get(_RESULT_PARTS)
    if not isinstance(parts, ResultParts):
        ctx.derived[_RESULT_PARTS] = ResultParts()
        return None
    return parts


_KEPT_RESULTS = "solver.kept_results"  # the context's KeptResults by their outcome's identity


def _kept_results(
    ctx: SolveContext, outcome: NodeOutcome, parts: ResultParts | None
) -> KeptResults:
    """What the results of a kept outcome share on every node of its template, made once per
    context (a batch makes them for each free state of its nodes once, not per node);
    `parts`: the context's (_result_parts; None: its first result, kept nowhere)."""
    if parts is None:  # a unary solve's one result: nothing to share it with
        return KeptResults(ctx.plan.claims, outcome.picks, outcome.chosen, ctx.plan.by_key, None)
    made = _kept_results_of(ctx)
    found = made.get(id(outcome))
    if found is None:  # the outcome, kept with its results: its id is not reused meanwhile
        results = KeptResults(
            ctx.plan.claims, outcome.picks, outcome.chosen, ctx.plan.by_key, parts
        )
        found = made[id(outcome)] = (outcome, results)
    return found[1]


def _kept_results_of(ctx: SolveContext) -> dict[int, tuple[NodeOutcome, KeptResults]]:
    """The context's KeptResults by their outcome's identity (_kept_results)."""
    made = ctx.derived.get(_KEPT_RESULTS)
    if not isinstance(made, dict):
        made = ctx.derived[_KEPT_RESULTS] = {}
    return made


def _key_of(found: _Found) -> NodeKey:
    return found.key


def _fitted(
    steps: int, key: NodeKey, search: NodeSearch, fit: TopologyFit, added: Fraction
) -> NodeOutcome:
    """The outcome of a search that fits on a node of a template, its picks by device index
    on the node."""
    slot = node_templates(search.ctx.snapshot).slot if search.ctx.snapshot else {}
    picks = tuple(
        tuple((pick.alternative.key, slot[pick.entry.id][1]) for pick in claim)
        for claim in search.picks
    )
    chosen = tuple(
        tuple((request, alternative.key) for request, alternative in sorted(claim.items()))
        for claim in search.chosen
    )
    return NodeOutcome(steps, False, key, picks, chosen, fit, added)
