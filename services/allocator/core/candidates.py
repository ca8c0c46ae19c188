"""Per node and alternative: the devices worth trying, found before the search starts.

Everything that does not change while searching is checked here, once per device: selectors
(class, then request), untolerated taints, and the capacity a request asks for (against the
shares other allocations already hold). What changes during the search — in use, counters,
capacity shares taken by earlier picks, constraints — is checked by `search.py`.

`All` requests get their fixed device list here (upstream's validation pass): every device of
every pool the node sees that passes the selectors and the capacity check. Taints are not part
of that selection (upstream): an untolerated taint on a listed device makes the request fail.
An `All` request on a node that sees an incomplete or invalid pool is a node error.

Within each pool the candidates are ordered by the policy's `candidate_key`; an invalid pool
keeps its place as a marker, and the search fails with an error when it reaches the marker
(upstream: `pool <pool> is invalid: <reason>` once the search iterates to the pool).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from fractions import Fraction
from typing import overload

from services.allocator.core.capacity import capacity_problem, consumed_capacity
from services.allocator.core.constraints import lookup_attribute, show_value
from services.allocator.core.explain import (
    ConstraintMiss,
    ConstraintProblem,
    Fact,
    IncompletePool,
    ReasonCode,
    Recorder,
    SelectorMiss,
    Shortage,
    ShortageKind,
    Taint,
    taint_text,
)
from services.allocator.core.fragmentation import DEFAULT_MIX, FragmentationMix, set_loss
from services.allocator.core.plan import MAX_DEVICES_PER_CLAIM, Alternative, ConstraintKind, Plan
from services.allocator.core.scoring import (
    CandidateKey,
    PlacementPolicy,
    Policy,
    counter_sets_used,
)
from services.allocator.core.selection import Equivalence, Selection
from services.allocator.core.snapshot import (
    Amount,
    ClusterSnapshot,
    DeviceEntry,
    NodeView,
    PoolView,
    SliceEntry,
)
from services.allocator.core.state import AllocatedState
from services.allocator.core.topology import NodeTopology
from services.allocator.core.topology_constraints import TopologyPlan
from services.allocator.core.topology_constraints import bound as topology_bound
from services.cel import SelectorCache
from services.common.dra.model import (
    AllocationMode,
    AttributeValue,
    DeviceID,
    DeviceTaint,
    DeviceToleration,
    TolerationOperator,
)
from services.common.dra.quantity import Quantity
from services.common.errors import FailedPrecondition, GpuallocError, InvalidArgument

__all__ = [
    "Availability",
    "Candidate",
    "InvalidPoolMarker",
    "NodeCandidates",
    "NodeError",
    "Prepared",
    "SolveContext",
    "SolveFacts",
    "taint_detail",
    "untolerated",
    "tolerates",
    "untolerated_taint",
]


class NodeError(Exception):
    """A fatal problem that exists only on one node (e.g. `All` over an incomplete pool).

    With a pinned node the wrapped error is raised to the caller; when the solver chooses the
    node, it skips the node and raises the error only if no other node fits.
    """

    def __init__(self, error: GpuallocError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True, eq=False)
class SolveContext:
    """What every node's search in one solve shares."""

    plan: Plan
    state: AllocatedState
    policy: Policy
    selection: Selection
    equivalence: Equivalence
    recorder: Recorder | None
    # Static check outcomes by (alternative, static class, taints checked): devices of one
    # static class pass or fail alike, unless other allocations hold shares of them.
    static: dict[tuple[int, int, bool], _Static] = field(default_factory=dict)
    topology: TopologyPlan | None = None  # topology constraints, when the solve has any
    mix: FragmentationMix = DEFAULT_MIX  # FRAGMENTATION_AWARE's expected requests
    snapshot: ClusterSnapshot | None = None  # for node topologies
    rules: PlacementPolicy = field(init=False, repr=False)  # the policy's rules (scoring.py)
    # What the solves in this context derive from its question alone (the question's keys,
    # per-template facts, whether node groups may stand for their nodes): worked out by the
    # first solve and read by every later one (the items of a batch, batch.py). A context
    # made with `replace` may ask another question: it starts empty.
    derived: dict[Hashable, object] = field(init=False, repr=False, default_factory=dict)
    # What its question alone decides on its snapshot (whether node groups stand for their
    # nodes, per-template facts, the question's signature and outcome memos): no walk state,
    # nothing of `state`. The dict of the caller's `SolveFacts` when it gave one (shared by
    # the later solves of the same plan), else the context's own; `replace` starts it empty.
    facts: dict[Hashable, object] = field(init=False, repr=False)
    kept: InitVar[dict[Hashable, object] | None] = None

    def __post_init__(self, kept: dict[Hashable, object] | None) -> None:
        object.__setattr__(self, "rules", self.policy.rules)
        object.__setattr__(self, "facts", {} if kept is None else kept)

    def node_topology(self, view: NodeView) -> NodeTopology | None:
        return self.snapshot.topology(view.name) if self.snapshot is not None else None


class SolveFacts:
    """What the solves of one plan work out from their question alone (SolveContext.facts),
    kept between solves by a caller that solves the same plan again (app/placing.py keeps one
    per memoised plan), so a repeated claim shape works it out once per snapshot, not per
    call. The facts answer one question on one snapshot: the plan, with one selector cache,
    policy, fragmentation mix and set of topology constraints. A solve that differs in any of
    them (a new inventory snapshot, above all) starts them afresh, so a fact is only ever
    read by the question it was worked out for. Safe to share between threads: what the
    contexts add is what each would have worked out alike, one dict entry at a time."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: tuple[Plan, ClusterSnapshot, SelectorCache, Hashable, _Facts] | None = None

    def of(
        self,
        plan: Plan,
        snapshot: ClusterSnapshot,
        selectors: SelectorCache,
        question: Hashable,
    ) -> dict[Hashable, object]:
        """The facts of `plan` for `question` (policy, mix and topology constraints) on
        `snapshot` with `selectors`: the kept ones when they are for the same, else a fresh
        dict that replaces them."""
        kept = self._kept
        if (
            kept is not None
            and kept[0] is plan
            and kept[1] is snapshot
            and kept[2] is selectors
            and (kept[3] is question or kept[3] == question)
        ):
            return kept[4]
        facts: _Facts = {}
        self._kept = (plan, snapshot, selectors, question, facts)
        return facts

    def clear(self) -> None:
        """Forget the facts (and the snapshot they hold alive)."""
        self._kept = None


_Facts = dict[Hashable, object]


_UNKNOWN = Shortage(ShortageKind.OVERDRAWN, "")  # NodeCandidates._overdrawn: not looked at yet


@dataclass(frozen=True, slots=True)
class _Static:
    problem: tuple[ReasonCode, Fact | None] | None
    consumed: dict[str, Quantity] | None


@dataclass(frozen=True, eq=False, slots=True)
class Candidate:
    entry: DeviceEntry
    consumed: dict[str, Quantity] | None  # what one allocation takes of a multi-allocatable device


@dataclass(frozen=True, eq=False, slots=True)
class InvalidPoolMarker:
    pool: PoolView


@dataclass(frozen=True)
class Availability:
    """What the existing allocations leave of an alternative's candidates on one node."""

    free: int  # candidates nobody holds (admin requests: all candidates)
    most: int  # devices it could take at most, given its matchAttribute/distinctAttribute
    unbounded: bool  # no bound known: a shared device or an invalid pool among the candidates
    busy: dict[ReasonCode, int]  # why the others are out


@dataclass(frozen=True)
class Prepared:
    """Static check outcomes known in advance for a node (from its template, nodechoice.py):
    per alternative key, the indices of the node's devices that pass, in view order, and the
    tally of the others; `pool_of` gives each device's pool ordinal."""

    lists: Mapping[int, tuple[tuple[int, ...], Mapping[ReasonCode, int]]]
    pool_of: tuple[int, ...]
    # The policy's order depends on which GPUs are in use: memoised per (alternative, in use).
    orders: dict[tuple[int, frozenset[int]], tuple[int, ...]] = field(default_factory=dict)
    _runs: dict[int, tuple[tuple[bool, tuple[int, ...]], ...]] = field(default_factory=dict)
    _sets: dict[int, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    _cliques: dict[tuple[int, tuple[int, ...]], int] = field(default_factory=dict)
    # ... and per (alternative, whether each of its counter-set numbers is fresh).
    splits: dict[tuple[int, tuple[bool, ...]], tuple[int, ...]] = field(default_factory=dict)
    _firsts: dict[int, tuple[int, ...] | None] = field(default_factory=dict)

    def runs(
        self, key: int, indices: tuple[int, ...], devices: tuple[DeviceEntry, ...]
    ) -> tuple[tuple[bool, tuple[int, ...]], ...]:
        """An alternative's candidates as runs of one pool each, with whether the policy
        sorts the run (it holds a counter-consuming device), a sorted run in (size,
        position) order: the part of candidate_key no state changes."""
        found = self._runs.get(key)
        if found is None:
            runs: list[tuple[bool, tuple[int, ...]]] = []
            run: list[int] = []
            for position, index in enumerate(indices):
                run.append(index)
                last = position + 1 == len(indices)
                if last or self.pool_of[indices[position + 1]] != self.pool_of[index]:
                    if any(devices[i].counters for i in run):
                        run.sort(key=lambda i: (float(devices[i].size), devices[i].position))
                        runs.append((True, tuple(run)))
                    else:
                        runs.append((False, tuple(run)))
                    run = []
            found = self._runs[key] = tuple(runs)
        return found

    def set_firsts(
        self,
        key: int,
        runs: tuple[tuple[bool, tuple[int, ...]], ...],
        sets: tuple[tuple[int, ...], ...],
    ) -> tuple[int, ...] | None:
        """Per counter-set number (set_ids), the index of its first candidate: whether each
        number is fresh decides the policy's order, so orders are kept per those answers.
        None when a sorted run holds a candidate without counters (its own state decides)."""
        if key in self._firsts:
            return self._firsts[key]
        firsts: dict[int, int] = {}
        found: tuple[int, ...] | None = None
        for (sorts, run), numbers in zip(runs, sets, strict=True):
            if not sorts:
                continue
            if any(number < 0 for number in numbers):
                break
            for index, number in zip(run, numbers, strict=True):
                firsts.setdefault(number, index)
        else:
            found = tuple(firsts[number] for number in range(len(firsts)))
        self._firsts[key] = found
        return found

    def clique_of(
        self,
        topology: NodeTopology,
        devices: Sequence[DeviceID],
        indices: tuple[int, ...],
        min_links: int,
    ) -> Callable[[], int]:
        """The largest NVLink clique of `devices` (the template's devices `indices` on one of
        its nodes), kept per (indices, links): every node of the template answers alike."""

        def clique() -> int:
            key = (min_links, indices)
            found = self._cliques.get(key)
            if found is None:
                if len(self._cliques) >= _ORDER_CACHE:
                    self._cliques.clear()
                found = self._cliques[key] = topology.largest_clique(devices, min_links)
            return found

        return clique

    def set_ids(
        self,
        key: int,
        runs: tuple[tuple[bool, tuple[int, ...]], ...],
        devices: tuple[DeviceEntry, ...],
    ) -> tuple[tuple[int, ...], ...]:
        """Per run, per candidate: which (slice, counter sets) it draws from, numbered (-1:
        no counters). Candidates of one number are in use or fresh together, and the numbers
        are alike on every node of the template (its signature holds each device's slice
        position and counters), so the order asks the state once per number."""
        found = self._sets.get(key)
        if found is None:
            numbers: dict[tuple[int, frozenset[str]], int] = {}
            found = self._sets[key] = tuple(
                tuple(
                    numbers.setdefault((d.slice.index, d.counter_sets), len(numbers))
                    if (d := devices[index]).counters
                    else -1
                    for index in run
                )
                for _, run in runs
            )
        return found


_ORDER_CACHE = 1024


class _Listed(Sequence[Candidate]):
    """A template node's candidate list: its devices at `order`'s indices, each made a
    Candidate when the search reaches it (a search that fits early never reaches most)."""

    __slots__ = ("_devices", "_order")

    def __init__(self, devices: tuple[DeviceEntry, ...], order: tuple[int, ...]) -> None:
        self._devices = devices
        self._order = order

    def __len__(self) -> int:
        return len(self._order)

    @overload
    def __getitem__(self, position: int) -> Candidate: ...

    @overload
    def __getitem__(self, position: slice) -> list[Candidate]: ...

    def __getitem__(self, position: int | slice) -> Candidate | list[Candidate]:
        if isinstance(position, slice):
            return [Candidate(self._devices[i], None) for i in self._order[position]]
        return Candidate(self._devices[self._order[position]], None)

    def __iter__(self) -> Iterator[Candidate]:
        devices = self._devices
        return (Candidate(devices[i], None) for i in self._order)


def tolerates(toleration: DeviceToleration, taint: DeviceTaint) -> bool:
    """Upstream `resourceclaim.ToleratesTaint`."""
    if toleration.effect is not None and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator == TolerationOperator.EXISTS:
        return True
    return toleration.operator == TolerationOperator.EQUAL and toleration.value == taint.value


def taint_detail(taint: DeviceTaint) -> str:
    return taint_text(untolerated(taint))


def untolerated(taint: DeviceTaint) -> Taint:
    """The taint as an explanation names it (its key, value and effect)."""
    return Taint(taint.key, taint.value, str(taint.effect))


def untolerated_taint(
    entry: DeviceEntry, tolerations: tuple[DeviceToleration, ...]
) -> DeviceTaint | None:
    """The first taint of the device no toleration tolerates (NoSchedule and NoExecute alike)."""
    for taint in entry.device.taints:
        if not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


class NodeCandidates:
    """Candidate lists of one node, built lazily per alternative (eagerly for `All`)."""

    def __init__(
        self,
        ctx: SolveContext,
        view: NodeView,
        prepared: Prepared | None = None,
        in_use: frozenset[int] | None = None,
    ) -> None:
        """`prepared`: known static outcomes (a template's), valid while the node's devices
        `in_use` (by index) are the ones in use."""
        self.ctx = ctx
        self.view = view
        self._prepared = prepared
        self._in_use = in_use
        self._exact: dict[int, Sequence[Candidate | InvalidPoolMarker]] = {}
        self._order_of: dict[int, tuple[int, ...]] = {}  # prepared lists, by device index
        self._all: dict[int, list[Candidate]] = {}
        self._tally: dict[int, dict[ReasonCode, int]] = {}
        self._overdrawn: dict[int, Shortage | None] = {}
        self._labels = {c.index: c.label for c in ctx.plan.claims}
        self._sets_used: dict[tuple[int, frozenset[str]], bool] = {}
        self._device_tuple: tuple[DeviceEntry, ...] | None = None
        self._free_indices: dict[int, tuple[int, ...]] = {}  # a template's node: by alternative
        self._slice_devices: dict[int, list[DeviceEntry]] | None = None
        self._slice_states: dict[int, tuple[tuple[Amount, ...], frozenset[int]]] = {}

    def prepare(self) -> None:
        """Upstream's per-node validation: `All` lists, then each claim's device minimum."""
        for claim in self.ctx.plan.claims:
            for request in claim.requests:
                for alternative in request.alternatives:
                    if alternative.mode is AllocationMode.ALL:
                        self._all[alternative.key] = self._all_list(alternative)
            minimum = sum(min(self.count(a) for a in r.alternatives) for r in claim.requests)
            if minimum > MAX_DEVICES_PER_CLAIM:
                raise NodeError(
                    InvalidArgument.at(
                        f"claims[{claim.index}].spec.devices.requests",
                        f"claim {claim.label}: number of requested devices {minimum} exceeds the "
                        f"claim limit of {MAX_DEVICES_PER_CLAIM}",
                    )
                )

    def count(self, alternative: Alternative) -> int:
        """Devices the alternative needs on this node."""
        if alternative.mode is AllocationMode.ALL:
            return len(self._all[alternative.key])
        return alternative.count

    def all_list(self, alternative: Alternative) -> list[Candidate]:
        return self._all[alternative.key]

    def exact(self, alternative: Alternative) -> Sequence[Candidate | InvalidPoolMarker]:
        found = self._exact.get(alternative.key)
        if found is None:
            found = self._exact[alternative.key] = self._exact_list(alternative)
        return found

    def overdrawn(self, slice_: SliceEntry) -> Shortage | None:
        """A counter of the slice that existing allocations already consume beyond its total
        (possible after a slice shrinks): upstream then refuses every counter-consuming device
        of the slice."""
        found = self._overdrawn.get(slice_.index, _UNKNOWN)
        if found is _UNKNOWN:
            found = None
            for counter, total in slice_.totals.items():
                if self.ctx.state.counter_amount(counter) > total:
                    found = Shortage(
                        ShortageKind.OVERDRAWN, counter.counter, counter_set=counter.counter_set
                    )
                    break
            self._overdrawn[slice_.index] = found
        return found

    def tally(self, alternative: Alternative) -> dict[ReasonCode, int]:
        """How many devices the static checks rejected, by reason (after `exact`/`prepare`)."""
        return self._tally.setdefault(alternative.key, {})

    def available(self, alternative: Alternative) -> Availability:
        """Cheap bound before searching: how many devices the alternative could take at most
        under the existing allocations, and why the others are out."""
        state, unbounded = self.ctx.state, False
        free: list[DeviceEntry] = []
        busy: dict[ReasonCode, int] = {}
        indices = self._listed_indices(alternative)
        free_indices: tuple[int, ...] | None = None
        if indices is not None and self._in_use is not None:
            in_use = () if alternative.admin else self._in_use
            free_indices = tuple([i for i in indices if i not in in_use]) if in_use else indices
            free = self._free_by_index(alternative, indices, free_indices, busy)
            if not alternative.admin:
                self._free_indices[alternative.key] = free_indices
            listed: Sequence[Candidate | InvalidPoolMarker] = []  # a template's node: no shared
            # device, no invalid pool among its candidates
        else:
            listed = self.exact(alternative)
        for candidate in listed:
            if isinstance(candidate, InvalidPoolMarker):
                unbounded = True  # only the search knows whether it reaches the pool (an error)
                continue
            entry = candidate.entry
            if entry.multi:  # a shared device may serve any number of slots
                usable = alternative.admin or not state.is_exclusive(entry.id)
                unbounded = unbounded or usable
            else:
                usable = alternative.admin or not state.in_use(entry.id)
            if usable:
                free.append(entry)
                continue
            busy[ReasonCode.IN_USE] = busy.get(ReasonCode.IN_USE, 0) + 1
            if self.ctx.recorder is not None:
                held = self.ctx.recorder.holders_of(state.owners, entry.id)
                self.ctx.recorder.reject(alternative, entry.id, ReasonCode.IN_USE, None, held)
        most = len(free)
        if not unbounded:
            most = min(
                [
                    most,
                    *(
                        self._constraint_bound(alternative, i, free)
                        for i in alternative.constraints
                    ),
                    *self._topology_bounds(alternative, free, free_indices),
                ]
            )
        return Availability(len(free), most, unbounded, busy)

    def _free_by_index(
        self,
        alternative: Alternative,
        order: tuple[int, ...],
        free_indices: tuple[int, ...],
        busy: dict[ReasonCode, int],
    ) -> list[DeviceEntry]:
        """`available`'s free candidates of a template's node, from its devices in use by
        index (the node's group key) instead of asking the state device by device:
        `free_indices`, those of `order` not in use (all of them for an admin request)."""
        devices = self._devices()
        free = [devices[i] for i in free_indices]
        taken = len(order) - len(free)
        if taken:
            in_use = self._in_use or frozenset()
            busy[ReasonCode.IN_USE] = taken
            recorder = self.ctx.recorder
            if recorder is not None:
                owners = self.ctx.state.owners
                for index in order:
                    if index in in_use:
                        device = devices[index].id
                        held = recorder.holders_of(owners, device)
                        recorder.reject(alternative, device, ReasonCode.IN_USE, None, held)
        return free

    def clique(
        self, alternative: Alternative, devices: Sequence[DeviceID], min_links: int
    ) -> Callable[[], int] | None:
        """The largest NVLink clique of the alternative's candidates nobody holds (`devices`),
        kept per template (Prepared.clique_of) when `available` listed them by index."""
        indices = self._free_indices.get(alternative.key)
        topology = self.ctx.node_topology(self.view)
        if indices is None or topology is None or self._prepared is None:
            return None
        return self._prepared.clique_of(topology, devices, indices, min_links)

    def _topology_bounds(
        self,
        alternative: Alternative,
        free: list[DeviceEntry],
        free_indices: tuple[int, ...] | None = None,
    ) -> list[int]:
        """Per required topology constraint over the alternative: how many of its free
        candidates can be in one set (the largest NVLink clique, the largest group on one
        PCIe root or NUMA node, those with a NIC close enough). A template's nodes are wired
        alike (its signature holds the topology's), so their cliques are kept per template by
        the free candidates' indices (`free_indices`, when known)."""
        plan = self.ctx.topology
        if plan is None or not plan.required:
            return []
        topology = self.ctx.node_topology(self.view)
        bounds = []
        ids = [e.id for e in free]
        for scoped in plan.covering(alternative, plan.required):
            clique = None
            if free_indices is not None and topology is not None and self._prepared is not None:
                clique = self._prepared.clique_of(
                    topology, ids, free_indices, scoped.constraint.min_nvlinks
                )
            most, why = topology_bound(scoped.constraint, topology, ids, clique)
            bounds.append(most)
            if most < alternative.count and self.ctx.recorder is not None:
                miss = scoped.constraint.miss(scoped.index, why)
                for entry in free:
                    self.ctx.recorder.reject(alternative, entry.id, ReasonCode.CONSTRAINT, miss)
        return bounds

    def _constraint_bound(
        self, alternative: Alternative, index: int, free: list[DeviceEntry]
    ) -> int:
        """Devices that can satisfy a constraint together: the largest group sharing a value
        (matchAttribute) or the number of distinct values (distinctAttribute)."""
        claim = self.ctx.plan.claims[alternative.claim_index]
        spec = claim.constraints[index]
        groups: dict[AttributeValue, list[DeviceEntry]] = {}
        lacking = []
        for entry in free:
            value = lookup_attribute(entry.device, entry.id.driver, spec.attribute)
            if value is None:
                lacking.append(entry)
            else:
                groups.setdefault(value, []).append(entry)
        if spec.kind is ConstraintKind.MATCH:
            bound = max((len(g) for g in groups.values()), default=0)
            few = ConstraintProblem.FEW_SHARE
        else:
            bound = len(groups)
            few = ConstraintProblem.FEW_DISTINCT
        recorder = self.ctx.recorder
        if recorder is not None and bound < alternative.count:
            values = [show_value(v) for v in groups]
            problem = ConstraintMiss(few, bound, alternative.count)
            missing = ConstraintMiss(ConstraintProblem.MISSING)
            for entry in lacking:
                recorder.constraint(claim.label, spec, entry.id, missing, values)
            for entry in (e for g in groups.values() for e in g):
                recorder.constraint(claim.label, spec, entry.id, problem, values)
        return bound

    # --- building the lists ---------------------------------------------------------

    def _exact_list(self, alternative: Alternative) -> Sequence[Candidate | InvalidPoolMarker]:
        prepared = self._prepared.lists.get(alternative.key) if self._prepared else None
        if prepared is not None:
            return self._prepared_list(alternative, *prepared)
        listed: list[Candidate | InvalidPoolMarker] = []
        for node_pool in self.view.pools:
            if node_pool.pool.invalid:
                listed.append(InvalidPoolMarker(node_pool.pool))
                continue
            found = []
            for entry in node_pool.devices:
                candidate = self._check(alternative, entry, taints=True)
                if candidate is not None:
                    found.append(candidate)
            if self.ctx.rules.orders_candidates and any(
                c.entry.counters or c.entry.multi for c in found
            ):
                found.sort(key=self._order_key)
            listed.extend(found)
            if found and node_pool.pool.incomplete and self.ctx.recorder is not None:
                self.ctx.recorder.note(_incomplete_note(node_pool.pool))
        return listed

    def _prepared_list(
        self,
        alternative: Alternative,
        indices: tuple[int, ...],
        tally: Mapping[ReasonCode, int],
    ) -> Sequence[Candidate | InvalidPoolMarker]:
        """The list from known static outcomes (a template's): no selector, taint or
        capacity check runs; only the policy's order within each pool is worked out, once
        per state of the node's devices."""
        assert self._prepared is not None
        self._list_statics(alternative, tally)
        devices = self._devices()
        orders = self._prepared.orders
        key = (alternative.key, self._in_use) if self._in_use is not None else None
        order = orders.get(key) if key is not None else None
        if order is None:
            order = self._order(alternative.key, indices, devices)
            if key is not None:
                if len(orders) >= _ORDER_CACHE:
                    orders.clear()
                orders[key] = order
        self._order_of[alternative.key] = order
        return _Listed(devices, order)

    def _listed_indices(self, alternative: Alternative) -> tuple[int, ...] | None:
        """A template's node: the alternative's candidates by device index, in the policy's
        order once a search has listed them, else in the template's (a count of the free
        ones needs no order: only a search does); None when the node has no template's
        static outcomes for it."""
        order = self._order_of.get(alternative.key)
        if order is not None or self._prepared is None:
            return order
        prepared = self._prepared.lists.get(alternative.key)
        if prepared is None:
            return None
        indices, tally = prepared
        self._list_statics(alternative, tally)
        return indices

    def _list_statics(self, alternative: Alternative, tally: Mapping[ReasonCode, int]) -> None:
        """The template's static outcomes stand for the node's own checks: their tally, and
        for an explanation the note that its devices' events come in bulk."""
        self._tally[alternative.key] = dict(tally)
        if self.ctx.recorder is not None:
            self.ctx.recorder.listed(alternative)

    def _order(
        self, key: int, indices: tuple[int, ...], devices: tuple[DeviceEntry, ...]
    ) -> tuple[int, ...]:
        """The policy's order of a template's candidates within each pool (candidate_key).
        Without fragmentation the key is (fresh, size, position), and only `fresh` depends on
        the state, per counter set: each pool's run is sorted by (size, position) once per
        template, then split, fresh-first or not, keeping that order; splits are kept per
        (alternative, whether each of its counter sets is fresh), alike on many nodes."""
        rules = self.ctx.rules
        if not rules.orders_candidates:
            return indices
        assert self._prepared is not None
        if rules.weighs_fragmentation:
            order: list[int] = []
            for sorts, run in self._prepared.runs(key, indices, devices):
                if sorts:
                    order.extend(
                        sorted(run, key=lambda i: self._order_key(Candidate(devices[i], None)))
                    )
                else:
                    order.extend(run)
            return tuple(order)
        runs = self._prepared.runs(key, indices, devices)
        sets = self._prepared.set_ids(key, runs, devices)
        firsts = self._prepared.set_firsts(key, runs, sets)
        if firsts is None:
            return self._split(runs, sets, devices, {})
        fresh = tuple(self._fresh(devices[index]) for index in firsts)
        memo = self._prepared.splits
        found = memo.get((key, fresh))
        if found is None:
            if len(memo) >= _ORDER_CACHE:
                memo.clear()
            found = memo[(key, fresh)] = self._split(runs, sets, devices, dict(enumerate(fresh)))
        return found

    def _split(
        self,
        runs: tuple[tuple[bool, tuple[int, ...]], ...],
        sets: tuple[tuple[int, ...], ...],
        devices: tuple[DeviceEntry, ...],
        known: dict[int, bool],
    ) -> tuple[int, ...]:
        """The order from the (size, position) runs: in each sorted run, the candidates that
        are not `fresh` first, then the others, each part in run order. `known`: fresh per
        counter-set number, where known already."""
        first: list[int] = []
        later: list[int] = []
        order: list[int] = []
        for (sorts, run), numbers in zip(runs, sets, strict=True):
            if not sorts:
                order.extend(run)
                continue
            for index, number in zip(run, numbers, strict=True):
                fresh = known.get(number) if number >= 0 else None
                if fresh is None:
                    fresh = self._fresh(devices[index])
                    if number >= 0:
                        known[number] = fresh
                (later if fresh else first).append(index)
            order.extend(first)
            order.extend(later)
            first, later = [], []
        return tuple(order)

    def _fresh(self, entry: DeviceEntry) -> bool:
        """candidate_key's `fresh` (1: tried after the others of its pool's run)."""
        if entry.counters:
            in_use = self._sets_used.get((entry.slice.index, entry.counter_sets))
            if in_use is None:
                in_use = self._set_in_use(entry)
        else:
            in_use = entry.multi and bool(self.ctx.state.share_ids(entry.id))
        return in_use != self.ctx.rules.prefers_used

    def _devices(self) -> tuple[DeviceEntry, ...]:
        if self._device_tuple is None:
            self._device_tuple = tuple(self.view.devices())
        return self._device_tuple

    def _all_list(self, alternative: Alternative) -> list[Candidate]:
        label = self._labels[alternative.claim_index]
        for node_pool in self.view.pools:
            pool = node_pool.pool
            if pool.incomplete or pool.invalid:
                state = "being updated" if pool.incomplete else "invalid"
                raise NodeError(
                    FailedPrecondition(
                        f"claim {label}, request {alternative.name}: asks for all devices, but "
                        f"resource pool {pool.id} is currently {state}"
                    )
                )
        listed = []
        for entry in self.view.devices():
            candidate = self._check(alternative, entry, taints=False)
            if candidate is not None:
                listed.append(candidate)
        return listed

    def _check(
        self, alternative: Alternative, entry: DeviceEntry, *, taints: bool
    ) -> Candidate | None:
        """The static checks; a rejected device is tallied (and recorded) with its reason."""
        label = self._labels[alternative.claim_index]
        recorder = self.ctx.recorder
        if recorder is not None:
            recorder.consider(alternative, label, entry.id)
        outcome = self._static(alternative, entry, label, taints)
        if outcome.problem is None:
            return Candidate(entry, outcome.consumed)
        code, detail = outcome.problem
        tally = self.tally(alternative)
        tally[code] = tally.get(code, 0) + 1
        if recorder is not None:
            recorder.reject(alternative, entry.id, code, detail)
        return None

    def _static(
        self, alternative: Alternative, entry: DeviceEntry, label: str, taints: bool
    ) -> _Static:
        shared = bool(self.ctx.state.consumed_capacity(entry.id))
        key = (alternative.key, self.ctx.equivalence.static_class(entry), taints)
        found = None if shared else self.ctx.static.get(key)
        if found is None:
            consumed = None
            if entry.multi:
                consumed = consumed_capacity(alternative.capacity, entry.device.capacity)
            found = _Static(self._problem(alternative, entry, label, taints), consumed)
            if not shared:
                self.ctx.static[key] = found
        return found

    def _problem(
        self, alternative: Alternative, entry: DeviceEntry, label: str, taints: bool
    ) -> tuple[ReasonCode, Fact | None] | None:
        """Binding conditions turned off (upstream checks it first), class selectors, request
        selectors, taints (unless `All`), requested capacity."""
        if entry.binding_disabled:
            return ReasonCode.BINDING_DISABLED, None
        selection = self.ctx.selection
        miss = selection.class_miss(alternative, entry)
        if miss >= 0:
            device_class = alternative.device_class
            selector = SelectorMiss(miss, device_class.selectors[miss].cel, device_class.name)
            return ReasonCode.CLASS_SELECTOR, selector
        miss = selection.request_miss(alternative, entry, label)
        if miss >= 0:
            return ReasonCode.REQUEST_SELECTOR, SelectorMiss(miss, alternative.selectors[miss].cel)
        if taints:
            taint = untolerated_taint(entry, alternative.tolerations)
            if taint is not None:
                return ReasonCode.TAINTED, untolerated(taint)
        held = self.ctx.state.consumed_capacity(entry.id)
        problem = capacity_problem(alternative.capacity, entry.device.capacity, held)
        return None if problem is None else (ReasonCode.CAPACITY, problem)

    def _order_key(self, candidate: Candidate) -> CandidateKey:
        state = self.ctx.state
        entry = candidate.entry
        return self.ctx.rules.candidate_key(
            entry,
            state.counter_amount,
            bool(state.share_ids(entry.id)),
            self._set_in_use,
            self._set_loss,
        )

    def _set_loss(self, entry: DeviceEntry) -> Fraction:
        """FRAGMENTATION_AWARE: the fragmentation taking the device adds to its GPU."""
        if self._slice_devices is None:
            self._slice_devices = {}
            for other in self.view.devices():
                self._slice_devices.setdefault(other.slice.index, []).append(other)
        state, mix = self.ctx.state, self.ctx.mix
        lost = set_loss(
            entry,
            state.counter_amount,
            state.in_use,
            self._slice_devices,
            mix,
            self._slice_states,
        )
        return lost - mix.capacity * (entry.size if entry.counters else 1)

    def _set_in_use(self, entry: DeviceEntry) -> bool:
        """Whether a counter set the device draws from is in use (memoised per slice and
        sets: on one node they answer alike)."""
        key = (entry.slice.index, entry.counter_sets)
        found = self._sets_used.get(key)
        if found is None:
            found = self._sets_used[key] = counter_sets_used(entry, self.ctx.state.counter_amount)
        return found


def _incomplete_note(pool: PoolView) -> IncompletePool:
    return IncompletePool(str(pool.id), len(pool.slices), pool.resource_slice_count)
