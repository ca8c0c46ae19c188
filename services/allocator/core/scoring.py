"""Placement policies as pure key functions: which node wins, which device is tried first.

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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

from services.allocator.core.snapshot import Amount, CounterID, DeviceEntry, SliceEntry

__all__ = [
    "NodeKey",
    "Policy",
    "Score",
    "candidate_key",
    "capacity_key",
    "counter_sets_used",
    "free_capacity",
    "measure",
    "measure_counts",
    "node_key",
]


class Policy(StrEnum):
    FIRST_FIT = "FirstFit"
    BINPACK = "BinPack"
    SPREAD = "Spread"
    FRAGMENTATION_AWARE = "FragmentationAware"


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


NodeKey = tuple[tuple[int, ...], int, int, tuple[Fraction, ...], str]


def node_key(policy: Policy, node: str | None, score: Score) -> NodeKey:
    """Smaller is better: subrequest ranks, preferred topology constraints missed (asked for,
    then the policy's own), the policy's capacity term, then the name."""
    return capacity_key(
        policy,
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
    fragmentation: Fraction = Fraction(0),
) -> NodeKey:
    """`node_key` from its inputs, for ranking before the full Score is computed."""
    name = node or ""
    term: tuple[Fraction, ...]
    if policy is Policy.BINPACK:
        term = (free_capacity,)
    elif policy is Policy.SPREAD:
        term = (-free_capacity,)
    elif policy is Policy.FRAGMENTATION_AWARE:
        term = (fragmentation, free_capacity)
    else:
        term = ()
    return (ranks, missed[0], missed[1], term, name)


def candidate_key(
    policy: Policy,
    entry: DeviceEntry,
    counter_used: Callable[[CounterID], Amount],
    has_shares: bool,
    set_in_use: Callable[[DeviceEntry], bool] | None = None,
    set_loss: Callable[[DeviceEntry], Fraction] | None = None,
) -> tuple[int, float, float, int]:
    """Order of candidates within one pool; smaller is tried first. A partition counts as
    "in use" when its GPU is, i.e. any counter of the counter sets it draws from is used
    (`set_in_use` answers that, memoised, when given)."""
    if policy is Policy.FIRST_FIT:
        return (0, 0.0, 0.0, entry.position)
    if entry.counters:
        in_use = set_in_use(entry) if set_in_use else counter_sets_used(entry, counter_used)
    else:
        in_use = has_shares
    first = 0 if in_use == (policy is not Policy.SPREAD) else 1
    added = 0.0  # FRAGMENTATION_AWARE: the fragmentation taking it adds to its GPU
    if set_loss is not None and policy is Policy.FRAGMENTATION_AWARE:
        added = float(set_loss(entry))
    return (first, added, float(entry.size), entry.position)  # floats keep the order


def counter_sets_used(entry: DeviceEntry, counter_used: Callable[[CounterID], Amount]) -> bool:
    """Whether any counter of the counter sets the device consumes from is in use."""
    sets = {counter.counter_set for counter, _ in entry.counters}
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
