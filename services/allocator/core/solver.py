"""solve(): claims + snapshot + allocated state -> Allocated | Unsatisfiable, or a typed error.

1. Validate the claims once (plan.py): unknown class, empty selector, bad mode, constraint
   type, more than 32 devices -> InvalidArgument with a field path.
2. For the pinned node, or for every node that has devices (in node-name order): build its
   candidate lists, drop it early if some request cannot have enough free candidates, else
   search it (search.py). Node-only errors (an `All` request over an incomplete pool, an
   invalid pool reached by the search) are raised for a pinned node; while choosing a node they
   skip the node, and are raised only when no node fits.
3. Pick the node: FIRST_FIT stops at the first that fits (upstream-like); BINPACK and SPREAD
   rank every feasible node by scoring.py's pure keys. Ties break by node name.
4. Build one AllocationResult per claim (results.py) and, on request, the explanation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.allocator.core.candidates import NodeCandidates, NodeError, SolveContext
from services.allocator.core.cel import SelectorCache
from services.allocator.core.explain import (
    Explanation,
    NodeChoice,
    NodeMiss,
    ReasonCode,
    Recorder,
    tally_reasons,
)
from services.allocator.core.outcome import (
    Allocated,
    SearchBudget,
    SolveResult,
    Stats,
    Unsatisfiable,
)
from services.allocator.core.plan import Alternative, Plan, build_plan
from services.allocator.core.results import ShareIdFactory, allocation_result, default_share_id
from services.allocator.core.scoring import Policy, Score, node_key
from services.allocator.core.search import BudgetExhausted, NodeSearch, StepCounter
from services.allocator.core.selection import Equivalence, Selection
from services.allocator.core.snapshot import ClusterSnapshot, NodeView
from services.allocator.core.state import AllocatedState
from services.common.dra.model import AllocationMode, AllocationResult, DeviceClass, ResourceClaim
from services.common.errors import GpuallocError

__all__ = ["DEFAULT_BUDGET", "solve"]

DEFAULT_BUDGET = SearchBudget()


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
) -> SolveResult:
    """Allocate all `claims` together on one node, all or nothing (claims' own `allocation`
    fields are ignored: pass what is held in `state`)."""
    evaluations_before = selectors.evaluations
    plan = build_plan(claims, classes)
    selection = Selection(selectors)
    recorder = Recorder() if explain else None
    ctx = SolveContext(plan, state, policy, selection, Equivalence(selection, plan), recorder)
    run = _Run(ctx, StepCounter(budget.max_steps, budget.max_steps_per_node, budget.cancelled))
    if node is not None:
        view = snapshot.view(node)
        run.pinned(view)
        if recorder is not None and not run.found:
            _record_other_nodes(ctx, snapshot, view, recorder)
    else:
        views = list(snapshot.views()) if snapshot.node_names else [snapshot.nil_view]
        run.choose([v for v in views if v.device_count > 0] or views[:1])
    return run.result(selectors.evaluations - evaluations_before, share_id)


@dataclass
class _Found:
    view: NodeView
    search: NodeSearch
    score: Score


class _Run:
    """One solve's bookkeeping across nodes."""

    def __init__(self, ctx: SolveContext, steps: StepCounter) -> None:
        self.ctx = ctx
        self.steps = steps
        self.found: list[_Found] = []
        self.misses: list[NodeMiss] = []
        self.errors: list[GpuallocError] = []
        self.nodes_total = self.pruned = self.searched = 0
        self.exhausted = False

    def pinned(self, view: NodeView) -> None:
        self.nodes_total = 1
        try:
            self._node(view)
        except NodeError as err:
            raise err.error from None

    def choose(self, views: Sequence[NodeView]) -> None:
        self.nodes_total = len(views)
        for view in views:
            try:
                self._node(view)
            except NodeError as err:
                self.errors.append(err.error)
                self.misses.append(_error_miss(view, err.error))
            if self.found and self.ctx.policy is Policy.FIRST_FIT:
                return
            if self.steps.steps >= self.steps.max_steps:
                self.exhausted = True
                return
        if not self.found and self.errors:
            raise self.errors[0]

    def _node(self, view: NodeView) -> None:
        cands = NodeCandidates(self.ctx, view)
        cands.prepare()
        search = NodeSearch(self.ctx, cands, self.steps)
        miss = _cheap_miss(self.ctx.plan, cands, search)
        if miss is not None:
            self.pruned += 1
            self.misses.append(miss)
            return
        self.searched += 1
        try:
            fits = search.run()
        except BudgetExhausted:
            self.exhausted = True
            self.misses.append(_budget_miss(view, search))
            return
        if fits:
            self.found.append(_Found(view, search, search.score()))
        elif search.miss is not None:
            self.misses.append(search.miss)

    def result(self, cel_evaluations: int, share_id: ShareIdFactory) -> SolveResult:
        stats = Stats(
            steps=self.steps.steps,
            cel_evaluations=cel_evaluations,
            nodes_total=self.nodes_total,
            nodes_pruned=self.pruned,
            nodes_searched=self.searched,
            nodes_feasible=len(self.found),
            budget_exhausted=self.exhausted,
        )
        if not self.found:
            return Unsatisfiable(self._unsatisfiable_explanation(), stats, self.exhausted)
        ranked = sorted(self.found, key=lambda f: node_key(self.ctx.policy, f.view.name, f.score))
        best = ranked[0]
        allocations = self._allocations(best, share_id)
        explanation = self._choice_explanation(ranked) if self.ctx.recorder is not None else None
        return Allocated(best.view.name, allocations, best.score, stats, explanation)

    def _allocations(self, found: _Found, share_id: ShareIdFactory) -> tuple[AllocationResult, ...]:
        search = found.search
        return tuple(
            allocation_result(
                claim,
                search.picks[claim.index],
                search.chosen[claim.index],
                found.view.name,
                share_id,
            )
            for claim in self.ctx.plan.claims
        )

    def _unsatisfiable_explanation(self) -> Explanation:
        misses = tuple(sorted(self.misses, key=NodeMiss.rank))
        if misses:
            summary = f"no node fits the claims; closest: {misses[0].message()}"
        else:
            summary = "no node has any device"
        if self.exhausted:
            summary += " (search budget exhausted: a fit may exist)"
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
            feasible_nodes=len(ranked),
            runner_up=runner_up.view.name if runner_up else None,
            runner_up_score=runner_up.score if runner_up else None,
            policy=str(self.ctx.policy),
        )
        recorder = self.ctx.recorder
        assert recorder is not None
        return Explanation(
            summary=f"allocated on {best.view.name or '<any node>'}",
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
                    detail = f"usable only from other nodes than {view.name}"
                    recorder.reject(alternative, entry.id, ReasonCode.OTHER_NODE, detail)


def _error_miss(view: NodeView, error: GpuallocError) -> NodeMiss:
    return NodeMiss(view.name, 0, 0, "", "", 0, 0, (), error=error.message)


def _budget_miss(view: NodeView, search: NodeSearch) -> NodeMiss:
    placed = search.miss.placed if search.miss else 0
    return NodeMiss(view.name, placed, search.needed(), "", "", 0, 0, (), budget_exhausted=True)
