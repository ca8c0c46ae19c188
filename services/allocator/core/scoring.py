"""Placement policies: which node wins, which device is tried first, which gang domain.

Upstream has no scoring (first fit; KEP-4970 is open). We keep first fit as `FIRST_FIT` and add:

- `BINPACK` (default): fill what is already in use. Among nodes that fit, the one left with the
  least free capacity wins; within a pool, partitions of GPUs that are already partly used are
  tried first, smallest partition first, and multi-allocatable devices that already have shares
  before fresh ones.
- `SPREAD`: the opposite node order (most free capacity left), fresh GPUs first.
- `FRAGMENTATION_AWARE`: the placement that adds the least fragmentation (usable capacity an
  expected request mix loses, less the capacity the placement itself takes; fragmentation.py),
  then BINPACK's order; within a GPU, the partition that strands the least.

Free capacity counts device-equivalents: 1 per allocatable device that consumes no counters,
plus, per counter set (one per GPU in the MIG layout), the mean free share of its counters. A
whole GPU is 1 either way; a MIG node does not look 26 times bigger than it is.

Before any policy: `firstAvailable` ranks. A node where a request gets its first subrequest
beats every node where it gets a later one (the vector of chosen subrequest indices, claim and
request order, compares first), so a worse-ranked subrequest is never chosen while a better one
fits anywhere. Ties always break by node name, then by the snapshot's device order.

Each policy is one class (`PlacementPolicy`: BinPack, Spread, FragmentationAware, FirstFit) that
holds all its rules: its node key and, next to it, the key's lower bound over a node group with
the order its groups come in (nodechoice.py's best-first walk), its candidate order, its gang
domain key (gang.py), and what it asks of the search (candidate order or snapshot order, its own
NVLink preferences, the fragmentation a placement adds, stopping at the first unbeatable fit).
`Policy` is the public name (API, config, CLI); `Policy.X.rules` is the policy. Keys are
NamedTuples with named fields: they compare as tuples, at C speed.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import NamedTuple

from services.allocator.core.groups import OrderEntry
from services.allocator.core.snapshot import Amount, CounterID, DeviceEntry, SliceEntry

__all__ = [
    "CandidateKey",
    "DomainKey",
    "GroupFacts",
    "KnownBounds",
    "NodeKey",
    "PlacementPolicy",
    "Policy",
    "Score",
    "candidate_key",
    "capacity_key",
    "counter_sets_used",
    "free_capacity",
    "measure",
    "measure_counts",
    "node_key",
    "node_key_of",
]

_ZERO = Fraction(0)  # one object: equal terms of keys compare by identity, no Fraction.__eq__


class Policy(StrEnum):
    """The policies' public names (API, config, CLI); `rules` is the policy itself."""

    FIRST_FIT = "FirstFit"
    BINPACK = "BinPack"
    SPREAD = "Spread"
    FRAGMENTATION_AWARE = "FragmentationAware"

    @property
    def rules(self) -> PlacementPolicy:
        return _RULES[self]


@dataclass(frozen=True)
class Score:
    """What a placement leaves free on its node; the policy ranks nodes by it."""

    free_devices: int  # devices on the node still allocatable after the placement
    total_devices: int
    free_counters: Fraction  # mean free share of the node's counters after it (1 if none)
    free_capacity: Fraction = Fraction(0)  # device-equivalents free after it (module doc)
    ranks: tuple[int, ...] = ()  # chosen subrequest per request (0 for `exactly`)
    preferred_missed: int = 0  # preferred topology constraints the placement does not meet
    implicit_missed: int = 0  # the default policy's NVLink preferences it does not meet
    nvlink_links: int = 0  # NVLinks among the GPUs of each claim, summed
    numa_nodes: int = 0  # NUMA nodes the placement spans (0: no topology known)
    fragmentation: Fraction = Fraction(0)  # fragmentation the placement adds (FRAGMENTATION_AWARE)

    def __str__(self) -> str:
        share = f"{float(self.free_counters):.0%}"
        devices = f"{self.free_devices} of {self.total_devices} devices"
        capacity = f"{float(self.free_capacity):.2f} GPU-equivalents"
        text = f"{devices} ({capacity}) free after placement, {share} of counters free"
        if self.numa_nodes:
            text += f"; {self.nvlink_links} NVLinks, {self.numa_nodes} NUMA nodes"
        if self.preferred_missed:
            text += f"; {self.preferred_missed} preferred constraints missed"
        if self.fragmentation:
            text += f"; adds {float(self.fragmentation):.3f} fragmentation"
        return text


class NodeKey(NamedTuple):
    """A placement's rank among nodes; smaller is better, compared field by field.

    Each Fraction term comes right after its float (`*_order`: float() of it, made by
    `node_key_of`). A correctly rounded float() never inverts an order, so the pair orders
    exactly as the Fraction alone: the floats decide at C speed and the Fractions are
    compared only when their floats tie."""

    ranks: tuple[int, ...]  # chosen subrequest per request
    preferred_missed: int  # preferred topology constraints asked for and missed
    implicit_missed: int  # the policy's own NVLink preferences missed
    fragmentation_order: float  # float(fragmentation)
    fragmentation: Fraction  # FRAGMENTATION_AWARE: fragmentation added; 0 for the others
    capacity_order: float  # float(capacity)
    capacity: Fraction  # the policy's capacity term (free capacity after; module doc)
    name: str  # the node; "" for none

    def named(self, name: str) -> NodeKey:
        """The same key for another node of its group."""
        return NodeKey(
            self.ranks,
            self.preferred_missed,
            self.implicit_missed,
            self.fragmentation_order,
            self.fragmentation,
            self.capacity_order,
            self.capacity,
            name,
        )


def node_key_of(
    ranks: tuple[int, ...],
    preferred_missed: int,
    implicit_missed: int,
    fragmentation: Fraction,
    capacity: Fraction,
    name: str,
) -> NodeKey:
    """The NodeKey of these terms, with the floats of its Fractions (NodeKey); the
    capacity's as int true division a/b, correctly rounded (what float() of it computes)."""
    return NodeKey(
        ranks,
        preferred_missed,
        implicit_missed,
        0.0 if fragmentation is _ZERO else float(fragmentation),
        fragmentation,
        0.0 if capacity is _ZERO else capacity.numerator / capacity.denominator,
        capacity,
        name,
    )


class CandidateKey(NamedTuple):
    """Order of candidates within one pool; smaller is tried first."""

    fresh: int  # 0: its GPU is in use (SPREAD: not in use), 1: otherwise
    added: float  # FRAGMENTATION_AWARE: the fragmentation taking it adds to its GPU
    size: float  # the partition's size (floats keep the order)
    position: int  # the snapshot's device order


class DomainKey(NamedTuple):
    """A gang domain's rank from its chosen members' node keys; smaller is better."""

    ranks: tuple[int, ...]  # the worst member's subrequest ranks
    preferred_missed: int  # summed over the members
    implicit_missed: int  # summed over the members
    capacity: Fraction  # the members' capacity terms, summed
    room: int  # the domain's feasible nodes, signed by the policy (PlacementPolicy.room_sign)
    label: str


class GroupFacts(NamedTuple):
    """What the bounds of one template's node groups start from (nodechoice.py)."""

    ranks: tuple[int, ...]  # the best subrequest ranks any node of the template can get
    implicit_missed: int  # the policy's NVLink preferences no node of it can meet
    most: Fraction  # most capacity a placement with `ranks` takes
    least: Fraction  # least capacity any placement takes
    loss_weight: Fraction  # FRAGMENTATION_AWARE: the mix's weight of capacity taken (>= 0)


class PlacementPolicy:
    """One placement policy, all its rules in one class: its node key and, next to it, the
    lower bound of that key over a node group (nodechoice.py's A*), the order of its groups,
    its candidate and gang domain keys, and what it asks of the search.

    A bound is admissible: no placement on a node of the group has a smaller node key
    (tests/unit/allocator/test_policy_bounds.py checks it for every policy). This base class
    is BINPACK's; the others override what differs."""

    __slots__ = ()
    policy: Policy
    orders_candidates = True  # False: candidates are tried in the snapshot's order
    implicit_topology = True  # adds its own NVLink preferences when topologies are known
    weighs_fragmentation = False  # weighs the fragmentation a placement (a device) adds
    prefers_used = True  # within a pool, partitions of GPUs in use first (else fresh ones)
    room_sign = 1  # gang domains: +1 fewest feasible nodes first, -1 most first, 0 neither
    scores_free_share = False  # the answer's score: the node's used share after it (else free)

    def node_key(
        self,
        node: str | None,
        ranks: tuple[int, ...],
        free_capacity: Fraction,
        missed: tuple[int, int],
        fragmentation: Fraction,
    ) -> NodeKey:
        """Smaller is better: subrequest ranks, preferred topology constraints missed (asked
        for, then the policy's own), the policy's terms, then the name."""
        return node_key_of(ranks, missed[0], missed[1], _ZERO, free_capacity, node or "")

    def bound(self, facts: GroupFacts, entry: OrderEntry) -> NodeKey:
        """A placement with the best ranks takes at most `most`: the free capacity after it
        is >= the group's free capacity - `most`."""
        capacity = entry.capacity - facts.most
        return node_key_of(facts.ranks, 0, facts.implicit_missed, _ZERO, capacity, entry.node)

    def groups(
        self,
        facts: GroupFacts,
        order: Sequence[OrderEntry],
        by_name: Callable[[], Iterator[OrderEntry]],
        known: KnownBounds | None = None,
    ) -> Iterator[tuple[NodeKey, OrderEntry]]:
        """One template's groups that may fit, with their bounds, in bound order. `order`:
        its groups by free capacity; `by_name`: by first node, one per free state; `known`:
        the bounds worked out already for these `facts` (KnownBounds)."""
        entries = itertools.islice(order, _first_at_least(order, facts.least), None)
        return _bounded(entries, functools.partial(self.bound, facts), known)

    def candidate_key(
        self,
        entry: DeviceEntry,
        counter_used: Callable[[CounterID], Amount],
        has_shares: bool,
        set_in_use: Callable[[DeviceEntry], bool] | None = None,
        set_loss: Callable[[DeviceEntry], Fraction] | None = None,
    ) -> CandidateKey:
        """A partition counts as "in use" when its GPU is, i.e. any counter of the counter
        sets it draws from is used (`set_in_use` answers that, memoised, when given)."""
        if entry.counters:
            in_use = set_in_use(entry) if set_in_use else counter_sets_used(entry, counter_used)
        else:
            in_use = has_shares
        fresh = 0 if in_use == self.prefers_used else 1
        added = 0.0  # FRAGMENTATION_AWARE: the fragmentation taking it adds to its GPU
        if set_loss is not None and self.weighs_fragmentation:
            added = float(set_loss(entry))
        return CandidateKey(fresh, added, float(entry.size), entry.position)

    def final(self, key: NodeKey) -> bool:
        """Whether no node searched after this one (nodes come by name) can beat `key`."""
        return False

    def domain_key(
        self, label: str | None, members: Sequence[str], chosen: Sequence[NodeKey]
    ) -> DomainKey:
        """The domain's rank from its chosen members' node keys (smaller is better), then how
        many of its nodes fit (BINPACK: fewest, keeping roomy domains whole)."""
        return DomainKey(
            max(k.ranks for k in chosen),
            sum(k.preferred_missed for k in chosen),
            sum(k.implicit_missed for k in chosen),
            sum((k.capacity for k in chosen), _ZERO),
            self.room_sign * len(members),
            label or "",
        )


class BinPack(PlacementPolicy):
    """Fill what is in use: the node left with the least free capacity wins."""

    __slots__ = ()
    policy = Policy.BINPACK


class Spread(PlacementPolicy):
    """The node left with the most free capacity wins; fresh GPUs first."""

    __slots__ = ()
    policy = Policy.SPREAD
    prefers_used = False
    room_sign = -1
    scores_free_share = True

    def node_key(
        self,
        node: str | None,
        ranks: tuple[int, ...],
        free_capacity: Fraction,
        missed: tuple[int, int],
        fragmentation: Fraction,
    ) -> NodeKey:
        return node_key_of(ranks, missed[0], missed[1], _ZERO, -free_capacity, node or "")

    def bound(self, facts: GroupFacts, entry: OrderEntry) -> NodeKey:
        """A placement takes at least `least`: the negated free capacity after it is >=
        `least` - the group's free capacity."""
        capacity = facts.least - entry.capacity
        return node_key_of(facts.ranks, 0, facts.implicit_missed, _ZERO, capacity, entry.node)

    def groups(
        self,
        facts: GroupFacts,
        order: Sequence[OrderEntry],
        by_name: Callable[[], Iterator[OrderEntry]],
        known: KnownBounds | None = None,
    ) -> Iterator[tuple[NodeKey, OrderEntry]]:
        """Most free capacity first; among equals, by first node."""
        return _bounded(self._most_first(facts, order), functools.partial(self.bound, facts), known)

    def _most_first(self, facts: GroupFacts, order: Sequence[OrderEntry]) -> Iterator[OrderEntry]:
        high = len(order)
        while high > 0 and order[high - 1].capacity >= facts.least:
            low = _first_at_least(order, order[high - 1].capacity)
            yield from order[low:high]
            high = low


class FragmentationAware(PlacementPolicy):
    """The placement that adds the least fragmentation wins, then BINPACK's order."""

    __slots__ = ()
    policy = Policy.FRAGMENTATION_AWARE
    weighs_fragmentation = True

    def node_key(
        self,
        node: str | None,
        ranks: tuple[int, ...],
        free_capacity: Fraction,
        missed: tuple[int, int],
        fragmentation: Fraction,
    ) -> NodeKey:
        return node_key_of(ranks, missed[0], missed[1], fragmentation, free_capacity, node or "")

    def bound(self, facts: GroupFacts, entry: OrderEntry) -> NodeKey:
        return self._bound(facts, entry, floor=-facts.loss_weight * facts.most)

    def _bound(self, facts: GroupFacts, entry: OrderEntry, *, floor: Fraction) -> NodeKey:
        """The fragmentation a placement adds is its usable-capacity loss (never negative)
        less `loss_weight` x the capacity it takes (at most `most`): >= `floor`, the least
        `-loss_weight * most`. Then BINPACK's bound."""
        capacity = entry.capacity - facts.most
        return node_key_of(facts.ranks, 0, facts.implicit_missed, floor, capacity, entry.node)

    def groups(
        self,
        facts: GroupFacts,
        order: Sequence[OrderEntry],
        by_name: Callable[[], Iterator[OrderEntry]],
        known: KnownBounds | None = None,
    ) -> Iterator[tuple[NodeKey, OrderEntry]]:
        floor = -facts.loss_weight * facts.most  # once per template, not per group
        entries = itertools.islice(order, _first_at_least(order, facts.least), None)
        return _bounded(entries, functools.partial(self._bound, facts, floor=floor), known)


class FirstFit(PlacementPolicy):
    """Upstream's: the first node by name that fits, devices in the snapshot's order."""

    __slots__ = ()
    policy = Policy.FIRST_FIT
    orders_candidates = False
    implicit_topology = False
    room_sign = 0

    def node_key(
        self,
        node: str | None,
        ranks: tuple[int, ...],
        free_capacity: Fraction,
        missed: tuple[int, int],
        fragmentation: Fraction,
    ) -> NodeKey:
        return node_key_of(ranks, missed[0], missed[1], _ZERO, _ZERO, node or "")

    def bound(self, facts: GroupFacts, entry: OrderEntry) -> NodeKey:
        """The group's first node by name."""
        return node_key_of(facts.ranks, 0, facts.implicit_missed, _ZERO, _ZERO, entry.node)

    def groups(
        self,
        facts: GroupFacts,
        order: Sequence[OrderEntry],
        by_name: Callable[[], Iterator[OrderEntry]],
        known: KnownBounds | None = None,
    ) -> Iterator[tuple[NodeKey, OrderEntry]]:
        return _bounded(by_name(), functools.partial(self.bound, facts), known)

    def candidate_key(
        self,
        entry: DeviceEntry,
        counter_used: Callable[[CounterID], Amount],
        has_shares: bool,
        set_in_use: Callable[[DeviceEntry], bool] | None = None,
        set_loss: Callable[[DeviceEntry], Fraction] | None = None,
    ) -> CandidateKey:
        return CandidateKey(0, 0.0, 0.0, entry.position)

    def final(self, key: NodeKey) -> bool:
        """First subrequests everywhere and every preference met."""
        return not any(key.ranks) and not key.preferred_missed and not key.implicit_missed


_RULES: dict[Policy, PlacementPolicy] = {
    rules.policy: rules for rules in (FirstFit(), BinPack(), Spread(), FragmentationAware())
}


class KnownBounds:
    """The bounds of one template's groups worked out already for one GroupFacts (the walks
    of one solve context: the items of a batch see mostly the same groups). Kept by the
    group's OrderEntry itself: entries are immutable, and an entry kept here stays alive, so
    no other entry can be taken for it."""

    __slots__ = ("_bounds",)

    def __init__(self) -> None:
        self._bounds: dict[int, tuple[OrderEntry, NodeKey]] = {}

    def get(self, entry: OrderEntry) -> NodeKey | None:
        kept = self._bounds.get(id(entry))
        return kept[1] if kept is not None and kept[0] is entry else None

    def put(self, entry: OrderEntry, bound: NodeKey) -> None:
        self._bounds[id(entry)] = (entry, bound)


def _bounded(
    entries: Iterable[OrderEntry],
    bound: Callable[[OrderEntry], NodeKey],
    known: KnownBounds | None,
) -> Iterator[tuple[NodeKey, OrderEntry]]:
    """Each entry with its bound, read from `known` when it holds it."""
    for entry in entries:
        found = known.get(entry) if known is not None else None
        if found is None:
            found = bound(entry)
            if known is not None:
                known.put(entry, found)
        yield found, entry


def _first_at_least(order: Sequence[OrderEntry], capacity: Fraction) -> int:
    """The first entry with at least `capacity`, by bisection; a/b < c/d compared as
    a*d < c*b (denominators are positive): exact, without Fraction's comparison."""
    numerator, denominator = capacity.numerator, capacity.denominator
    low, high = 0, len(order)
    while low < high:
        middle = (low + high) // 2
        found = order[middle].capacity
        if found.numerator * denominator < numerator * found.denominator:
            low = middle + 1
        else:
            high = middle
    return low


def node_key(policy: Policy, node: str | None, score: Score) -> NodeKey:
    """The policy's node key of a scored placement."""
    return policy.rules.node_key(
        node,
        score.ranks,
        score.free_capacity,
        (score.preferred_missed, score.implicit_missed),
        score.fragmentation,
    )


def capacity_key(
    policy: Policy,
    node: str | None,
    ranks: tuple[int, ...],
    free_capacity: Fraction,
    missed: tuple[int, int] = (0, 0),
    fragmentation: Fraction = _ZERO,
) -> NodeKey:
    """`node_key` from its inputs, for ranking before the full Score is computed."""
    return policy.rules.node_key(node, ranks, free_capacity, missed, fragmentation)


def candidate_key(
    policy: Policy,
    entry: DeviceEntry,
    counter_used: Callable[[CounterID], Amount],
    has_shares: bool,
    set_in_use: Callable[[DeviceEntry], bool] | None = None,
    set_loss: Callable[[DeviceEntry], Fraction] | None = None,
) -> CandidateKey:
    """The policy's order of candidates within one pool (PlacementPolicy.candidate_key)."""
    return policy.rules.candidate_key(entry, counter_used, has_shares, set_in_use, set_loss)


def counter_sets_used(entry: DeviceEntry, counter_used: Callable[[CounterID], Amount]) -> bool:
    """Whether any counter of the counter sets the device consumes from is in use."""
    sets = entry.counter_sets or {counter.counter_set for counter, _ in entry.counters}
    return any(
        counter_used(counter) > 0
        for counter in entry.slice.counter_totals
        if counter.counter_set in sets
    )


def measure(
    devices: Iterable[DeviceEntry],
    available: Callable[[DeviceEntry], bool],
    counter_used: Callable[[CounterID], Amount],
    ranks: tuple[int, ...] = (),
) -> Score:
    """Score a node from its devices and what is still available after a placement."""
    entries = list(devices)
    free = plain = 0
    for entry in entries:
        if available(entry):
            free += 1
            plain += not entry.counters
    return measure_counts(entries, free, plain, counter_used, ranks)


def measure_counts(
    devices: Iterable[DeviceEntry],
    free: int,
    plain: int,
    counter_used: Callable[[CounterID], Amount],
    ranks: tuple[int, ...] = (),
) -> Score:
    """`measure` when the available devices (`free`, `plain` of them without counters) are
    already counted."""
    entries = list(devices)
    counters = capacity = Fraction(0)
    count = 0
    for untouched, partial in _set_shares(entries, counter_used):
        size = untouched + len(partial)
        total = sum(partial, Fraction(untouched))
        counters += total
        capacity += total / size
        count += size
    free_counters = counters / count if count else Fraction(1)
    return Score(free, len(entries), free_counters, capacity + plain, ranks)


def free_capacity(
    devices: Iterable[DeviceEntry],
    available: Callable[[DeviceEntry], bool],
    counter_used: Callable[[CounterID], Amount],
) -> Fraction:
    """Device-equivalents free: 1 per available device that consumes no counters, plus per
    counter set the mean free share of its counters (those with a total)."""
    entries = list(devices)
    plain = sum(1 for entry in entries if not entry.counters and available(entry))
    capacity = Fraction(plain)
    for untouched, partial in _set_shares(entries, counter_used):
        capacity += sum(partial, Fraction(untouched)) / (untouched + len(partial))
    return capacity


def _set_shares(
    entries: Iterable[DeviceEntry], counter_used: Callable[[CounterID], Amount]
) -> list[tuple[int, list[Fraction]]]:
    """Per counter set of the devices' slices: how many of its counters (with a total) nobody
    uses, and the free share of each of the others."""
    sets: list[tuple[int, list[Fraction]]] = []
    for slice_ in _slices(entries):
        per_set: dict[str, tuple[list[int], list[Fraction]]] = {}
        for counter, limit in slice_.totals.items():
            if limit > 0:
                untouched, partial = per_set.setdefault(counter.counter_set, ([0], []))
                used = counter_used(counter)
                if used:
                    partial.append(Fraction(max(0, limit - used), limit))
                else:
                    untouched[0] += 1
        sets.extend((untouched[0], partial) for untouched, partial in per_set.values())
    return sets


def _slices(entries: Iterable[DeviceEntry]) -> list[SliceEntry]:
    seen: dict[int, SliceEntry] = {}
    for entry in entries:
        seen.setdefault(entry.slice.index, entry.slice)
    return list(seen.values())
