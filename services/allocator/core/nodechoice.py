"""Choosing the node without searching every node: best-first over node groups.

Nodes of one template in one free state (groups.py) give the same answer, so one search per
group is enough. Groups are visited best-first by a lower bound of their node key
(scoring.node_key), and the choice stops as soon as a searched group's real key is no worse than
every bound left — A* with an admissible heuristic, so the answer is the node the full scan
would pick, found after a handful of searches:

- ranks: no group can do better than the best subrequest ranks its template offers at all
  (per request, the first alternative with enough matching devices);
- preferences missed: >= 0 for the asked-for ones; for the policy's NVLink taste, >= the
  requests no node of the template can give NVLink-connected GPUs (too small a clique);
- capacity: a placement with those ranks takes at most `most` device-equivalents (count x the
  largest candidate), any placement at least `least`; what each policy's term makes of that
  (and of fragmentation, and FIRST_FIT's node names) is its `bound`, next to its node key
  (scoring.PlacementPolicy; tests/unit/allocator/test_policy_bounds.py checks each is
  admissible).

Per template, the policy's `groups` gives the groups in bound order from the index's capacity
order (FIRST_FIT: the template's nodes by name), merged across templates by a heap. Groups that
cannot hold what the plan needs (too little free capacity, too few free matching devices) are
skipped unsearched. Nodes outside every template are searched one by one, first. In
`exhaustive` mode (gangs) every group that may fit is searched and each feasible group is listed
with its key and nodes.

The per-template facts (matching devices per alternative) come from static checks on the
template's first node and are cached on the template by the alternatives' content, so a repeated
request kind costs no CEL and no per-device work.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from services.allocator.core.candidates import (
    Candidate,
    NodeCandidates,
    Prepared,
    SolveContext,
)
from services.allocator.core.explain import ReasonCode
from services.allocator.core.groups import GroupIndex, OrderEntry
from services.allocator.core.plan import Alternative, ConstraintKind, Plan
from services.allocator.core.scoring import GroupFacts, KnownBounds, NodeKey, Policy
from services.allocator.core.snapshot import ClusterSnapshot, NodeView
from services.allocator.core.templates import NodeTemplate, NodeTemplates, split_name
from services.common.dra.model import AllocationMode

__all__ = ["GroupedChoice", "TemplatePlan", "template_plan", "usable"]

_CACHE_LIMIT = 256
Evaluate = Callable[
    [
        NodeView,
        "Fraction | None",
        "Prepared | None",
        "frozenset[int] | None",
        "NodeTemplate | None",
    ],
    "NodeKey | None",
]


@dataclass(frozen=True)
class TemplatePlan:
    """What a plan can get from one template, ignoring what is in use."""

    candidates: tuple[frozenset[int] | None, ...]  # per alternative; None: no bound known
    prepared: Prepared  # the static check outcomes, for the search of any node of it
    ranks: tuple[int, ...] | None  # best subrequest ranks; None: no node of it can fit
    most: Fraction  # most capacity a placement with `ranks` takes
    least: Fraction  # least capacity any placement takes
    implicit_missed: int = 0  # NVLink preferences of the policy no node of it can meet


def usable(plan: Plan, ctx: SolveContext, templates: NodeTemplates) -> bool:
    """Whether groups answer for their nodes: no `All` request (its device list is per node)
    and no selector or constraint reads an attribute the templates abstract away. Worked out
    once per templates among the context's facts (SolveContext.facts)."""
    if plan is not ctx.plan:
        return _usable(plan, ctx, templates)
    found = ctx.facts.get(_USABLE)
    if not isinstance(found, tuple) or found[0] is not templates:
        found = ctx.facts[_USABLE] = (templates, _usable(plan, ctx, templates))
    return bool(found[1])


_USABLE = "nodechoice.usable"


def _usable(plan: Plan, ctx: SolveContext, templates: NodeTemplates) -> bool:
    if not templates.templates:
        return False
    names: list[tuple[str, str] | None] = []
    for alternative in plan.alternatives():
        if alternative.mode is AllocationMode.ALL:
            return False
        selectors = (*alternative.device_class.selectors, *alternative.selectors)
        for selector in selectors:
            try:
                reads = ctx.selection.compiled(selector.cel, "", "").reads
            except Exception:  # noqa: BLE001 - the search reports it with its field path
                return False
            if reads.whole_device or reads.attributes_all or reads.attribute_domains:
                names.append(None)
            names.extend(reads.attribute_ids)
    for claim in plan.claims:
        for spec in claim.constraints:
            if spec.kind in (ConstraintKind.MATCH, ConstraintKind.DISTINCT):
                if "/" in spec.attribute:
                    names.append(split_name(spec.attribute, ""))
                elif any(ident == spec.attribute for _, ident in templates.abstracted):
                    return False
    return not templates.reads_abstracted(names)


class GroupedChoice:
    """One unpinned solve's walk over the groups."""

    def __init__(
        self,
        ctx: SolveContext,
        snapshot: ClusterSnapshot,
        groups: GroupIndex,
        evaluate: Evaluate,
        out_of_steps: Callable[[], bool],
        *,
        exhaustive: bool = False,
    ) -> None:
        """`exhaustive`: search every group that may fit instead of stopping at the best, and
        collect the feasible groups in `feasible_groups` (what gangs need)."""
        self.ctx = ctx
        self.snapshot = snapshot
        self.groups = groups
        self.evaluate = evaluate
        self.out_of_steps = out_of_steps
        self.exhaustive = exhaustive
        # exhaustive: (key of the group's first node, the group's nodes) per feasible group
        self.feasible_groups: list[tuple[NodeKey, Sequence[str]]] = []
        self.searched = 0
        self.feasible = 0
        self._heap: list[tuple[NodeKey, int, Any]] = []
        self._seq = itertools.count()

    def run(self) -> None:
        templates = self.groups.templates
        for name in templates.ungrouped:
            self._search(self.snapshot.view(name), None, None, None, [name], None)
            if self.out_of_steps():
                return
        for reach in _reachable(self.ctx, self.snapshot, templates):
            order = self.groups.order[reach.template.id]
            by_name = functools.partial(self._by_name, reach)
            cursor = self.ctx.rules.groups(reach.bounds, order, by_name, reach.known_bounds())
            self._advance(cursor, reach)
        heap, members = self._heap, self.groups.members
        while heap:
            _, _, item = heapq.heappop(heap)
            if item is None:
                if self.exhaustive:
                    continue
                return  # a searched group beats every bound left
            cursor, reach, entry = item
            self._advance(cursor, reach)
            if reach.fits(entry):
                template = reach.template
                view = self.snapshot.view(entry.node)
                found = members[template.id, entry.used]
                prepared = reach.facts.prepared
                self._search(view, entry.capacity, prepared, entry.used, found, template)
                if self.out_of_steps():
                    return

    def _search(
        self,
        view: NodeView,
        before: Fraction | None,
        prepared: Prepared | None,
        in_use: frozenset[int] | None,
        members: Sequence[str],
        template: NodeTemplate | None,
    ) -> None:
        self.searched += 1
        key = self.evaluate(view, before, prepared, in_use, template)
        if key is not None:
            self.feasible += len(members)
            heapq.heappush(self._heap, (key, next(self._seq), None))
            if self.exhaustive:  # every member scores alike, under its own name
                self.feasible_groups.append((key, members))

    def _advance(self, cursor: Iterator[tuple[NodeKey, OrderEntry]], reach: _Reachable) -> None:
        step = next(cursor, None)
        if step is not None:
            bound, entry = step
            heapq.heappush(self._heap, (bound, next(self._seq), (cursor, reach, entry)))

    def _by_name(self, reach: _Reachable) -> Iterator[OrderEntry]:
        """The template's groups by first node name."""
        seen: set[frozenset[int]] = set()
        template = reach.template
        for node in template.nodes:
            used = self.groups.node_in_use(node)
            if used not in seen:
                seen.add(used)
                yield OrderEntry(template.free_capacity(used), node, used)


@dataclass(eq=False, slots=True)
class _Reachable:
    """A template some node of which may fit the plan, with what the walks of one context
    read of it for every group: its facts, its bounds' inputs, per request its alternatives
    with their candidates (the cheap check, listed at its first use) and, from the context's
    second walk on (a batch's later items; a unary solve walks once), its groups' bounds."""

    template: NodeTemplate
    facts: TemplatePlan
    bounds: GroupFacts
    plan: Plan
    rooms: _Rooms | None = None
    walks: int = 0
    known: KnownBounds | None = None
    shared: _Known | None = None  # what the contexts of one SolveFacts know of the template

    def known_bounds(self) -> KnownBounds | None:
        """The bounds kept for this walk to read and add to; None on the first walk."""
        self.walks += 1
        if self.walks > 1 and self.known is None:
            self.known = KnownBounds()
        return self.known

    def fits(self, entry: OrderEntry) -> bool:
        """Cheap necessary conditions: enough free capacity, and per request an alternative
        with enough matching devices that nobody holds."""
        if entry.capacity < self.facts.least:
            return False
        used = entry.used
        rooms = self.rooms
        if rooms is None:
            rooms = self.rooms = _rooms(self.plan, self.facts)
            if self.shared is not None:  # for the later contexts of the same facts
                self.shared.rooms = rooms
        for request in rooms:
            for alternative, candidates in request:
                if _room(alternative, candidates, used):
                    break
            else:
                return False
        return True


_Rooms = tuple[tuple[tuple[Alternative, frozenset[int] | None], ...], ...]


@dataclass(eq=False, slots=True)
class _Known:
    """A reachable template as the context's facts keep it (no walk state): its facts, its
    bounds' inputs and, once some walk listed them, its rooms (_Reachable.fits)."""

    template: NodeTemplate
    facts: TemplatePlan
    bounds: GroupFacts
    rooms: _Rooms | None = None


def _rooms(plan: Plan, facts: TemplatePlan) -> _Rooms:
    """Per request of `plan`, its alternatives with their candidates on the template."""
    pairs = iter(zip(plan.alternatives(), facts.candidates, strict=True))
    return tuple(
        tuple(itertools.islice(pairs, len(request.alternatives)))
        for claim in plan.claims
        for request in claim.requests
    )


def _reachable(
    ctx: SolveContext, snapshot: ClusterSnapshot, templates: NodeTemplates
) -> tuple[_Reachable, ...]:
    """The templates, in order, where the plan may fit (template_plan has ranks), worked out
    once per templates among the context's facts; each context walks them with its own
    walk state (_Reachable)."""
    found = ctx.derived.get(_REACHABLE)
    if isinstance(found, tuple) and found[0] is templates:
        reachable: tuple[_Reachable, ...] = found[1]
        return reachable
    known = ctx.facts.get(_REACHABLE)
    if not isinstance(known, tuple) or known[0] is not templates:
        every: list[_Known] = []
        for template in templates.templates:
            facts = template_plan(ctx, snapshot, template)
            if facts.ranks is None:
                continue
            bounds = GroupFacts(
                facts.ranks, facts.implicit_missed, facts.most, facts.least, ctx.mix.capacity
            )
            every.append(_Known(template, facts, bounds))
        known = ctx.facts[_REACHABLE] = (templates, tuple(every))
    walked = tuple(
        _Reachable(k.template, k.facts, k.bounds, ctx.plan, k.rooms, shared=k) for k in known[1]
    )
    ctx.derived[_REACHABLE] = (templates, walked)
    return walked


_REACHABLE = "nodechoice.reachable"


def _room(
    alternative: Alternative, candidates: frozenset[int] | None, used: frozenset[int]
) -> bool:
    if candidates is None or alternative.count == 0:
        return True
    if alternative.admin:
        return len(candidates) >= alternative.count
    free = len(candidates) - len(candidates & used) if used else len(candidates)
    return free >= alternative.count


# --- per-template facts -------------------------------------------------------------------


def template_plan(
    ctx: SolveContext, snapshot: ClusterSnapshot, template: NodeTemplate
) -> TemplatePlan:
    """The plan's facts on `template`: kept on the template by the plan's content (a later
    solve of the same request kind reads them) and among the context's facts (its later
    solves, and those of contexts sharing its SolveFacts, do not even work out that key)."""
    derived = ctx.facts.get(_TEMPLATE_PLANS)
    if not isinstance(derived, dict):
        derived = ctx.facts[_TEMPLATE_PLANS] = {}
    found = derived.get(template)
    if found is None:
        key = _plan_key(ctx.plan, ctx.policy)
        found = template.caches.get(key)
        if found is None:
            if len(template.caches) >= _CACHE_LIMIT:
                template.caches.clear()
            found = template.caches[key] = _template_plan(ctx, snapshot, template)
        derived[template] = found
    assert isinstance(found, TemplatePlan)
    return found


_TEMPLATE_PLANS = "nodechoice.template_plan"


def _template_plan(
    ctx: SolveContext, snapshot: ClusterSnapshot, template: NodeTemplate
) -> TemplatePlan:
    cands = NodeCandidates(ctx, snapshot.view(template.nodes[0]))
    position = {id(entry): i for i, entry in enumerate(template.devices)}
    # What taking a device lowers free capacity by, at most (scoring.free_capacity); admin
    # picks only consume counters, which `size` already bounds.
    units = [e.size + (0 if e.counters else 1) for e in template.devices]
    candidates: list[frozenset[int] | None] = []
    lists: dict[int, tuple[tuple[int, ...], Mapping[ReasonCode, int]]] = {}
    for alternative in ctx.plan.alternatives():
        listed = cands.exact(alternative)
        indices = [position[id(c.entry)] for c in listed if isinstance(c, Candidate)]
        if len(indices) < len(listed):  # an invalid pool: the search must reach it to fail
            candidates.append(None)
            continue
        candidates.append(frozenset(indices))
        lists[alternative.key] = (tuple(sorted(indices)), dict(cands.tally(alternative)))
    ranks: list[int] = []
    most = least = Fraction(0)
    reachable = True
    indexed = dict(zip((a.key for a in ctx.plan.alternatives()), candidates, strict=True))
    for claim in ctx.plan.claims:
        for request in claim.requests:
            fitting = [a for a in request.alternatives if _enough(a, indexed[a.key])]
            if not fitting:
                reachable = False
                continue
            best = fitting[0]
            ranks.append(best.sub_index or 0)
            most += _taken(best, indexed[best.key], units, max)
            least += min(_taken(a, indexed[a.key], units, min) for a in fitting)
    prepared = Prepared(lists, template.pool_of)
    implicit = _implicit_missed(ctx, snapshot, template, indexed, ranks) if reachable else 0
    return TemplatePlan(
        tuple(candidates), prepared, tuple(ranks) if reachable else None, most, least, implicit
    )


def _implicit_missed(
    ctx: SolveContext,
    snapshot: ClusterSnapshot,
    template: NodeTemplate,
    candidates: Mapping[int, frozenset[int] | None],
    ranks: Sequence[int],
) -> int:
    """The default policy's NVLink preferences no node of the template can meet with the best
    ranks: fewer NVLink-connected candidates than the request's count."""
    plan = ctx.topology
    if plan is None:
        return 0
    topology = snapshot.topology(template.nodes[0])
    requests = [
        (c.index, r, request) for c in ctx.plan.claims for r, request in enumerate(c.requests)
    ]
    missed = 0
    for scoped in plan.preferred:
        if not scoped.implicit:
            continue
        for (claim, r, request), rank in zip(requests, ranks, strict=True):
            if (claim, r) not in scoped.requests:
                continue
            alternative = next(a for a in request.alternatives if (a.sub_index or 0) == rank)
            found = candidates[alternative.key]
            if found is None or topology is None:
                missed += topology is None
                continue
            devices = [template.devices[i].id for i in found]
            if topology.largest_clique(devices) < alternative.count:
                missed += 1
    return missed


def _enough(alternative: Alternative, candidates: frozenset[int] | None) -> bool:
    return candidates is None or len(candidates) >= alternative.count


def _taken(
    alternative: Alternative,
    candidates: frozenset[int] | None,
    units: Sequence[Fraction],
    pick: Callable[[Sequence[Fraction]], Fraction],
) -> Fraction:
    if alternative.count == 0 or (alternative.admin and pick is min):
        return Fraction(0)
    values = [units[i] for i in candidates] if candidates is not None else list(units)
    if candidates is None and pick is min:
        return Fraction(0)
    return alternative.count * pick(values) if values else Fraction(0)


def _plan_key(plan: Plan, plan_policy: Policy) -> Any:
    return tuple(
        (
            plan_policy,
            a.claim_index,
            a.request_index,
            a.sub_index,
            a.device_class.name,
            tuple(s.cel for s in a.device_class.selectors),
            tuple(s.cel for s in a.selectors),
            a.mode,
            a.count,
            a.admin,
            a.tolerations,
            tuple(sorted(a.capacity.items())),
        )
        for a in plan.alternatives()
    )
