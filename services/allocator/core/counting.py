"""Capacity: how many more units (claims placed together on one node) fit now.

A Capacity count is a batch of identical items placed until one does not fit (batch.py), per
node: each node takes units one after another, each placed as a pinned solve would place it,
until the next one does not fit. The count is exact for the solver's packing; it is a lower
bound (`cut`) when a bound stopped it: the step budget, the deadline (`SearchBudget.cancelled`),
or `max_units` per node.

It is counted per node group, not per node. A node of a template in one free state (groups.py)
takes the same units as every node of its group, and after a unit it is in the group of its new
free state: so a count is a chain of groups, (template, in use) -> (template, in use + the
unit's devices) -> ..., and every link is one kept search (outcomes.py) shared with every node
and every later question that passes there. Nodes whose chains meet share the rest.

A unit of one device (one claim, one request, one device for each alternative; no constraint
between devices) is counted per counter set instead: such a unit only ever touches the counter
set of the one device it takes (a GPU's MIG layout), so a node's count is the sum of what each
of its counter sets takes on its own, and a GPU in one free state counts alike on every node
(`_parts`). A node whose devices answer for other nodes too (shared devices, capacity shares) is
counted on its own, on a copy of the state, as a run of pinned solves.

Each unit is attributed to the product name of its first device (`productName` of the device's
driver domain, as the NVIDIA driver publishes it), `unknown` without one.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from services.allocator.core.candidates import NodeError, Prepared, SolveContext
from services.allocator.core.fragmentation import DEFAULT_MIX, FragmentationMix, set_loss
from services.allocator.core.nodechoice import TemplatePlan, template_plan, usable
from services.allocator.core.outcome import Allocated, SearchBudget
from services.allocator.core.outcomes import NodeOutcome, outcome_memo, signature
from services.allocator.core.plan import Alternative
from services.allocator.core.scoring import CandidateKey, Policy, counter_sets_used
from services.allocator.core.search import StepCounter
from services.allocator.core.snapshot import (
    Amount,
    ClusterSnapshot,
    CounterID,
    DeviceEntry,
    NodeView,
)
from services.allocator.core.solver import DEFAULT_BUDGET, NodeRun, solve, solve_context
from services.allocator.core.state import AllocatedState
from services.allocator.core.templates import NodeTemplate, node_templates
from services.allocator.core.topology_constraints import TopologyConstraint
from services.cel import SelectorCache
from services.common.dra.model import (
    AllocationMode,
    AllocationResult,
    DeviceClass,
    DeviceID,
    ResourceClaim,
)
from services.common.errors import DeadlineExceeded, GpuallocError

__all__ = ["UNKNOWN_MODEL", "NodeUnits", "UnitCount", "count_units", "gangs_that_fit"]

UNKNOWN_MODEL = "unknown"
_OWNER = "capacity"


@dataclass(frozen=True)
class NodeUnits:
    """`count` units fit on `node`; `cut`: a bound stopped the count (a lower bound)."""

    node: str
    count: int
    cut: bool = False


@dataclass(frozen=True)
class UnitCount:
    """Units per node (nodes where some fit, in the order asked), per model, and whether a
    bound cut the count short anywhere."""

    nodes: tuple[NodeUnits, ...]
    models: Mapping[str, int]
    cut: bool

    @property
    def total(self) -> int:
        return sum(n.count for n in self.nodes)


@dataclass(frozen=True)
class _Chain:
    """What a free state takes from here on: units, per model, steps, cut short or not."""

    count: int
    models: Mapping[str, int]
    steps: int
    cut: bool


_EMPTY = _Chain(0, {}, 0, False)


def count_units(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: Mapping[str, DeviceClass],
    claims: Sequence[ResourceClaim],
    nodes: Sequence[str],
    *,
    pinned: bool = False,
    policy: Policy = Policy.BINPACK,
    selectors: SelectorCache,
    budget: SearchBudget = DEFAULT_BUDGET,
    topology_constraints: Sequence[TopologyConstraint] = (),
    fragmentation_mix: FragmentationMix = DEFAULT_MIX,
    max_units: int = 1024,
) -> UnitCount:
    """Units per node of `nodes`, in order. The steps of every unit's search count against
    `budget.max_steps` (checked between nodes); `budget.cancelled` stops the count between
    nodes and units (the count so far, `cut`). A node's own error (an `All` request over an
    incomplete pool) skips it — raised for a `pinned` node, and raised when no node counts
    any unit (an error of every node is the question's). An error first met by a later unit
    (its pinned solve raises once earlier units hold their devices) ends the node's count
    there, as a unit that does not fit: the units before it stand."""
    counting = _Counting(
        snapshot,
        state,
        classes,
        claims,
        policy,
        selectors,
        budget,
        tuple(topology_constraints),
        fragmentation_mix,
        max_units,
    )
    return counting.run(nodes, pinned)


class _Counting:
    def __init__(
        self,
        snapshot: ClusterSnapshot,
        state: AllocatedState,
        classes: Mapping[str, DeviceClass],
        claims: Sequence[ResourceClaim],
        policy: Policy,
        selectors: SelectorCache,
        budget: SearchBudget,
        topology_constraints: tuple[TopologyConstraint, ...],
        fragmentation_mix: FragmentationMix,
        max_units: int,
    ) -> None:
        self.snapshot = snapshot
        self.state = state
        self.classes = classes
        self.claims = claims
        self.policy = policy
        self.selectors = selectors
        self.budget = budget
        self.topology_constraints = topology_constraints
        self.mix = fragmentation_mix
        self.max_units = max_units
        self.steps = 0
        self.models: dict[str, int] = {}
        self._grouped: _Grouped | None = None
        self._ungrouped = False  # groups cannot stand for their nodes in this count

    def run(self, nodes: Sequence[str], pinned: bool) -> UnitCount:
        counted: list[NodeUnits] = []
        errors: list[GpuallocError] = []
        cut = False
        for node in nodes:
            if self._cancelled() or self.steps >= self.budget.max_steps:
                cut = True
                break
            try:
                chain = self._node(node)
            except DeadlineExceeded:
                cut = True
                break
            except GpuallocError as error:
                if pinned:
                    raise  # a pinned node's problem is the caller's to see
                errors.append(error)  # as Allocate: a node-only error skips the node
                continue
            self.steps += chain.steps
            for model, units in chain.models.items():
                self.models[model] = self.models.get(model, 0) + units
            cut = cut or chain.cut
            if chain.count:
                counted.append(NodeUnits(node, chain.count, chain.cut))
        if errors and not counted:
            raise errors[0]  # as Allocate: an error of every node is the request's
        return UnitCount(tuple(counted), dict(sorted(self.models.items())), cut)

    def _cancelled(self) -> bool:
        cancelled = self.budget.cancelled
        return cancelled is not None and cancelled()

    def _node(self, node: str) -> _Chain:
        view = self.snapshot.view(node)
        grouped = self._grouping()
        template = node_templates(self.snapshot).of_node.get(node)
        if grouped is None or template is None:
            return self._alone(view)
        return grouped.chain(view, template)

    def _grouping(self) -> _Grouped | None:
        """The count by node groups, when groups may stand for their nodes (nodechoice.usable)."""
        if self._grouped is None and not self._ungrouped:
            ctx = solve_context(
                self.snapshot,
                self.state.detached(),
                self.classes,
                self.claims,
                self.policy,
                self.selectors,
                None,
                self.topology_constraints,
                self.budget,
            )
            ctx = replace(ctx, mix=self.mix)
            templates = node_templates(self.snapshot)
            if usable(ctx.plan, ctx, templates):
                self._grouped = _Grouped(self, ctx)
            else:
                self._ungrouped = True
        return self._grouped

    def _alone(self, view: NodeView) -> _Chain:
        """Pinned solves on a copy of the state, one unit after another (a node whose
        devices other nodes see, or a question groups cannot answer)."""
        state = self.state.detached()
        count, steps = 0, 0
        models: dict[str, int] = {}
        ids = itertools.count()

        def share_id(claim: ResourceClaim, request: str, device: DeviceID, position: int) -> str:
            return f"capacity-{next(ids)}"  # units on one shared device are distinct shares

        while count < self.max_units:
            if count and self._cancelled():
                raise DeadlineExceeded("capacity count cancelled")
            try:
                result = solve(
                    self.snapshot,
                    state,
                    self.classes,
                    self.claims,
                    node=view.name,
                    policy=self.policy,
                    selectors=self.selectors,
                    budget=self.budget,
                    share_id=share_id,
                    topology_constraints=self.topology_constraints,
                    fragmentation_mix=self.mix,
                )
            except DeadlineExceeded:
                raise
            except GpuallocError:
                if not count:
                    raise  # the node's own error
                return _Chain(count, models, steps, False)  # the next unit errs: it does not fit
            steps += result.stats.steps
            if not isinstance(result, Allocated):
                return _Chain(count, models, steps, result.budget_exhausted)
            count += 1
            model = _model(self.snapshot, result.allocations)
            models[model] = models.get(model, 0) + 1
            for allocation in result.allocations:
                state = state.with_allocation(allocation, _OWNER)
        return _Chain(count, models, steps, True)


class _Grouped:
    """Chains of node groups, on one scratch state that every chain adds its units to (nodes
    of templates see only their own devices: the units of one do not touch another)."""

    def __init__(self, counting: _Counting, ctx: SolveContext) -> None:
        self.counting = counting
        self.ctx = ctx
        self.work = ctx.state  # detached: changed in place
        self.question = signature(ctx)
        self.alternatives = {a.key: a for a in ctx.plan.alternatives()}
        self.chains: dict[tuple[int, frozenset[int]], _Chain] = {}
        self.parts = _Parts(ctx, counting.budget) if _Parts.fit(ctx, counting.budget) else None

    def chain(self, view: NodeView, template: NodeTemplate) -> _Chain:
        used = self.counting.state.node_in_use(self.counting.snapshot, view)
        known = self.chains.get((template.id, used))
        if known is not None:
            return known
        facts = template_plan(self.ctx, self.counting.snapshot, template)
        if self.parts is not None and facts.ranks is not None:
            by_parts = self.parts.count(template, facts, used)
            if by_parts is not None and by_parts.count < self.counting.max_units:
                self.chains[(template.id, used)] = by_parts
                return by_parts
        devices = tuple(view.devices())
        path: list[tuple[frozenset[int], str, int]] = []  # (state, model, steps) per unit
        end = _EMPTY
        while True:
            known = self.chains.get((template.id, used))
            if known is not None and len(path) + known.count <= self.counting.max_units:
                end = known
                break
            if len(path) >= self.counting.max_units:
                end = _Chain(0, {}, 0, True)
                break
            if path and self.counting._cancelled():
                raise DeadlineExceeded("capacity count cancelled")
            try:
                outcome, steps, cut = self._unit(view, template, facts.prepared, used)
            except NodeError as error:
                if not path:
                    raise error.error from None  # the node's own error
                break  # the next unit errs: it does not fit (this state keeps no chain)
            if outcome is None or outcome.key is None:
                end = _Chain(0, {}, steps, cut)
                if not cut:
                    self.chains[(template.id, used)] = end
                break
            held = _held(outcome, self.alternatives)
            path.append((used, _model_of(outcome, devices), steps))
            self.work.take_in_place((devices[i].id for i in held), _OWNER)
            used = used | frozenset(held)
        return self._unwind(template, path, end)

    def _unwind(
        self, template: NodeTemplate, path: Sequence[tuple[frozenset[int], str, int]], end: _Chain
    ) -> _Chain:
        """The chain of every state on the path, from its end back to where it started: kept
        for the nodes that pass there (unless a bound cut it short: those count again)."""
        chain = end
        for used, model, steps in reversed(path):
            models = dict(chain.models)
            models[model] = models.get(model, 0) + 1
            chain = _Chain(chain.count + 1, models, chain.steps + steps, chain.cut)
            if not chain.cut:
                self.chains[(template.id, used)] = chain
        return chain

    def _unit(
        self, view: NodeView, template: NodeTemplate, prepared: Prepared, used: frozenset[int]
    ) -> tuple[NodeOutcome | None, int, bool]:
        """(the kept outcome of one more unit on the node, its steps, cut by the budget): a
        pinned solve's search of the node, read back when its group's was kept. Raises the
        node's NodeError."""
        budget = self.counting.budget
        counter = StepCounter(budget.max_steps, budget.max_steps_per_node, budget.cancelled)
        run = NodeRun(self.ctx, counter)
        run.search_node(view, template.free_capacity(used), prepared, used)
        return outcome_memo(template, self.question).get(used), counter.steps, run.exhausted


class _Parts:
    """Counting a one-device unit per counter set (the module docstring): a node's count is the
    sum of its slices' (a slice's devices share no counter with other slices), each slice's
    the greedy run a pinned solve makes there — the first alternative whose first candidate
    in the policy's order is free and fits the slice's counters, until none does — kept per
    (template, slice, devices in use there). The steps charged are the pinned solves' (two per
    alternative tried, and for the unit that does not fit, one more, or none when no
    alternative has a free candidate left: the cheap check rules the node out)."""

    def __init__(self, ctx: SolveContext, budget: SearchBudget) -> None:
        self.ctx = ctx
        self.alternatives = ctx.plan.claims[0].requests[0].alternatives
        self.known: dict[tuple[int, int, frozenset[int]], _PartCount] = {}
        self._shapes: dict[int, _Shape | None] = {}

    @staticmethod
    def fit(ctx: SolveContext, budget: SearchBudget) -> bool:
        """Whether units are one device each, with nothing relating devices, and no pinned
        solve of one could run out of budget."""
        plan = ctx.plan
        if len(plan.claims) != 1 or len(plan.claims[0].requests) != 1:
            return False
        claim = plan.claims[0]
        alternatives = claim.requests[0].alternatives
        most = 2 * len(alternatives) + 1  # the steps of a pinned solve of one unit, at most
        return (
            not claim.constraints
            and ctx.topology is None
            and all(
                a.mode is AllocationMode.EXACT_COUNT and a.count == 1 and not a.admin
                for a in alternatives
            )
            and most <= budget.max_steps_per_node
            and most <= budget.max_steps
        )

    def count(
        self, template: NodeTemplate, facts: TemplatePlan, used: frozenset[int]
    ) -> _Chain | None:
        shape = self._shape(template, facts)
        if shape is None:
            return None
        per_part: dict[int, set[int]] = {}
        for index in used:
            per_part.setdefault(shape.part_of[index], set()).add(index)
        counts = [0] * len(self.alternatives)
        models: dict[str, int] = {}
        free_left = False
        for part in range(len(shape.parts)):
            taken = frozenset(per_part.get(part, ()))
            key = (template.id, part, taken)
            found = self.known.get(key)
            if found is None:
                found = self.known[key] = self._greedy(template, shape, part, taken)
            by_alternative, picked, left = found
            for k, n in enumerate(by_alternative):
                counts[k] += n
            for model in picked:
                models[model] = models.get(model, 0) + 1
            free_left = free_left or left
        steps = sum(n * 2 * (k + 1) for k, n in enumerate(counts))
        steps += 2 * len(self.alternatives) + 1 if free_left else 0
        return _Chain(sum(counts), models, steps, False)

    def _shape(self, template: NodeTemplate, facts: TemplatePlan) -> _Shape | None:
        found = self._shapes.get(template.id, _MISSING)
        if found is _MISSING:
            found = self._shapes[template.id] = _Shape.of(self.ctx, template, facts)
        return found  # type: ignore[return-value]

    def _greedy(
        self, template: NodeTemplate, shape: _Shape, part: int, taken: frozenset[int]
    ) -> _PartCount:
        """(units per alternative, their models, a free candidate left) of one slice from the
        devices `taken` there."""
        devices = template.devices
        used = set(taken)
        usage: dict[CounterID, Amount] = {}
        for index in taken:
            entry = devices[index]
            for (counter, _), amount in zip(entry.counters, entry.amounts, strict=True):
                usage[counter] = usage.get(counter, 0) + amount
        slice_ = devices[shape.parts[part][0]].slice
        overdrawn = any(usage.get(c, 0) > total for c, total in slice_.totals.items())
        ids = {devices[i].id: i for i in shape.parts[part]}
        by_alternative: list[int] = []
        picked: list[str] = []
        for position, _ in enumerate(self.alternatives):
            candidates = shape.candidates[position][part]
            n = 0
            while True:
                order = self._order(shape, position, part, candidates, usage, used, ids)
                pick = next(
                    (i for i in order if i not in used and _fits(devices[i], usage, overdrawn)),
                    None,
                )
                if pick is None:
                    break
                entry = devices[pick]
                used.add(pick)
                for (counter, _), amount in zip(entry.counters, entry.amounts, strict=True):
                    usage[counter] = usage.get(counter, 0) + amount
                picked.append(_product(entry))
                n += 1
            by_alternative.append(n)
        left = any(
            i not in used
            for position in range(len(self.alternatives))
            for i in shape.candidates[position][part]
        )
        return tuple(by_alternative), tuple(picked), left

    def _order(
        self,
        shape: _Shape,
        position: int,
        part: int,
        candidates: Sequence[int],
        usage: Mapping[CounterID, Amount],
        used: set[int],
        ids: Mapping[DeviceID, int],
    ) -> Sequence[int]:
        """The candidates in the policy's order (NodeCandidates._order, for this slice)."""
        if not shape.sorted[position][part]:
            return candidates
        rules, template_devices = self.ctx.rules, shape.devices

        def counter_used(counter: CounterID) -> Amount:
            return usage.get(counter, 0)

        def in_use(device: DeviceID) -> bool:
            index = ids.get(device)
            return index is not None and index in used

        def set_in_use(entry: DeviceEntry) -> bool:
            return counter_sets_used(entry, counter_used)

        def loss(entry: DeviceEntry) -> Fraction:
            lost = set_loss(entry, counter_used, in_use, shape.slice_devices, self.ctx.mix)
            return lost - self.ctx.mix.capacity * (entry.size if entry.counters else 1)

        def key(index: int) -> CandidateKey:
            entry = template_devices[index]
            return rules.candidate_key(entry, counter_used, False, set_in_use, loss)

        return sorted(candidates, key=key)


@dataclass(frozen=True)
class _Shape:
    """A template's slices as parts: per device its part; per alternative and part the
    candidates (index order) and whether the policy sorts them (NodeCandidates._order sorts a
    pool's run of candidates that holds a counter-consuming device)."""

    devices: tuple[DeviceEntry, ...]
    part_of: tuple[int, ...]
    parts: tuple[tuple[int, ...], ...]
    candidates: tuple[tuple[tuple[int, ...], ...], ...]
    sorted: tuple[tuple[bool, ...], ...]
    slice_devices: Mapping[int, Sequence[DeviceEntry]]

    @classmethod
    def of(cls, ctx: SolveContext, template: NodeTemplate, facts: TemplatePlan) -> _Shape | None:
        devices = template.devices
        number: dict[int, int] = {}
        part_of = tuple(number.setdefault(id(e.slice), len(number)) for e in devices)
        parts: list[list[int]] = [[] for _ in number]
        for index, part in enumerate(part_of):
            parts[part].append(index)
        slice_devices: dict[int, list[DeviceEntry]] = {}
        for entry in devices:
            slice_devices.setdefault(entry.slice.index, []).append(entry)
        candidates, sorts = [], []
        for alternative, listed in zip(ctx.plan.alternatives(), facts.candidates, strict=True):
            if listed is None:
                return None  # an invalid pool: only the search says what happens there
            del alternative
            per_part: list[list[int]] = [[] for _ in parts]
            for index in sorted(listed):
                per_part[part_of[index]].append(index)
            candidates.append(tuple(tuple(p) for p in per_part))
            runs: dict[int, bool] = {}
            for index in listed:
                pool = template.pool_of[index]
                runs[pool] = runs.get(pool, False) or bool(devices[index].counters)
            ordering = ctx.rules.orders_candidates
            sorts.append(
                tuple(
                    ordering and bool(p) and runs.get(template.pool_of[p[0]], False)
                    for p in per_part
                )
            )
        return cls(
            devices,
            part_of,
            tuple(tuple(p) for p in parts),
            tuple(candidates),
            tuple(sorts),
            slice_devices,
        )


_MISSING: object = object()
_PartCount = tuple[tuple[int, ...], tuple[str, ...], bool]


def _fits(entry: DeviceEntry, usage: Mapping[CounterID, Amount], overdrawn: bool) -> bool:
    """search.NodeSearch._counter_problem for a free device of a slice with `usage`."""
    if not entry.counters:
        return True
    if overdrawn:
        return False
    totals = entry.slice.totals
    return all(
        usage.get(counter, 0) + amount <= totals[counter]
        for (counter, _), amount in zip(entry.counters, entry.amounts, strict=True)
    )


def _held(outcome: NodeOutcome, alternatives: Mapping[int, Alternative]) -> list[int]:
    """The indices of the devices a unit holds (adminAccess picks hold nothing)."""
    return [index for claim in outcome.picks for key, index in claim if not alternatives[key].admin]


def _model_of(outcome: NodeOutcome, devices: Sequence[DeviceEntry]) -> str:
    for claim in outcome.picks:
        for _, index in claim:
            return _product(devices[index])
    return UNKNOWN_MODEL


def _model(snapshot: ClusterSnapshot, allocations: Sequence[AllocationResult]) -> str:
    for allocation in allocations:
        for result in allocation.results:
            entry = snapshot.device(result.device_id)
            if entry is not None:
                return _product(entry)
    return UNKNOWN_MODEL


def _product(entry: DeviceEntry) -> str:
    attributes = entry.device.attributes
    value = attributes.get("productName") or attributes.get(f"{entry.id.driver}/productName")
    return str(value.value) if value is not None else UNKNOWN_MODEL


def gangs_that_fit(units: Sequence[int], node_count: int) -> int:
    """The most gangs of `node_count` distinct nodes that nodes holding `units` units each can
    take: the largest k with sum(min(u, k)) >= k * node_count (that sum minus k * node_count is
    concave in k and 0 at k = 0, so the k that satisfy it are 0..answer)."""
    low, high = 0, sum(units) // node_count
    while low < high:
        k = (low + high + 1) // 2
        if sum(min(u, k) for u in units) >= k * node_count:
            low = k
        else:
            high = k - 1
    return low
