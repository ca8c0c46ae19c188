"""Fragmentation-aware placement: what a placement costs the requests that come after it.

In the spirit of Fragmentation Gradient Descent (Weng et al., ATC'23): a node's free capacity is
only worth what an expected mix of requests can still use, and the best placement is the one
that adds the least fragmentation (free capacity the mix cannot use). The mix (`FragmentationMix`,
weights as FGD's task popularity; the caller knows its workload, the default is a guess):

- whole GPUs, k on one node: usable W when W >= k, else 0, where W counts the node's free whole
  GPUs (devices without counters nobody holds, and counter sets nobody draws from): as in FGD, a
  node that can take the job wastes none of its free GPUs on it, one that cannot wastes all;
- partitions of a share of a GPU (1/8 for a 1g MIG slice, ...): every distinct `size` among the
  devices drawing from one counter set (a MIG profile; the whole-GPU device aside) takes the
  weight of the nearest share; usable: size * the number of such partitions that still fit on
  the GPU, packed greedily in device order (exact for MIG, whose placements of one profile
  never overlap).

The fragmentation a placement adds = weighted usable capacity lost - capacity it takes itself
(FGD's delta). It is negative when a slice fills a hole nothing else could use, and large when a
slice breaks a whole GPU, or a GPU is taken from a free 8-GPU node. Within a node the same
measure orders the candidates (`set_loss`): slices go to partitioned GPUs first, at the placement
that leaves the most partitions of the other sizes placeable.

All counter arithmetic is on one slice at a time, memoised on the slice by its counter use, so
states seen before cost a dictionary lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from services.allocator.core.scoring import free_capacity
from services.allocator.core.snapshot import Amount, CounterID, DeviceEntry, SliceEntry, by_slice
from services.common.dra.model import DeviceID

__all__ = [
    "DEFAULT_MIX",
    "FragmentationMix",
    "Usable",
    "node_fragmentation",
    "node_usable",
    "node_usable_change",
    "placement_loss",
    "set_loss",
]
_ZERO = Fraction(0)
_ONE = Fraction(1)
_MEMO_LIMIT = 4096


@dataclass(frozen=True)
class _Shape:
    """One slice's counters in a fixed order and its devices' consumption as vectors."""

    counters: tuple[CounterID, ...]
    totals: tuple[Amount, ...]
    devices: tuple[DeviceEntry, ...]
    vectors: tuple[tuple[Amount, ...], ...]  # per device, aligned with `counters`
    sets: tuple[tuple[int, ...], ...]  # device indices per counter set (devices with counters)
    whole: tuple[int, ...]  # per set: index of a device taking all of it, or -1
    classes: tuple[tuple[tuple[Fraction, tuple[int, ...]], ...], ...]  # per set: size, devices
    index_of: dict[int, int]  # id(device entry) -> its index
    set_of: tuple[int, ...]  # per device: its set's number (-1: none)
    memo: dict[Any, Any] = field(default_factory=dict, compare=False)


def _shape(slice_: SliceEntry, devices: Sequence[DeviceEntry]) -> _Shape:
    key = ("fragmentation-shape", tuple(e.position for e in devices))
    found = slice_.memo.get(key)
    if isinstance(found, _Shape):
        return found
    counters = tuple(slice_.totals)
    position = {c: i for i, c in enumerate(counters)}
    vectors = []
    by_set: dict[str, list[int]] = {}
    for index, entry in enumerate(devices):
        vector: list[Amount] = [0] * len(counters)
        for (counter, _), amount in zip(entry.counters, entry.amounts, strict=True):
            vector[position[counter]] += amount
        vectors.append(tuple(vector))
        if entry.counters:
            by_set.setdefault(entry.counters[0][0].counter_set, []).append(index)
    sets, wholes, classes = [], [], []
    for members in by_set.values():
        sets.append(tuple(members))
        whole = next((i for i in members if devices[i].size >= 1), -1)
        wholes.append(whole)
        sizes: dict[Fraction, list[int]] = {}
        for i in members:
            if i != whole and devices[i].size > 0:
                sizes.setdefault(devices[i].size, []).append(i)
        classes.append(tuple((size, tuple(ids)) for size, ids in sorted(sizes.items())))
    set_of = [-1] * len(devices)
    for number, group in enumerate(sets):
        for i in group:
            set_of[i] = number
    shape = _Shape(
        counters,
        tuple(slice_.totals[c] for c in counters),
        tuple(devices),
        tuple(vectors),
        tuple(sets),
        tuple(wholes),
        tuple(classes),
        {id(e): i for i, e in enumerate(devices)},
        tuple(set_of),
    )
    slice_.memo[key] = shape
    return shape


@dataclass(frozen=True)
class FragmentationMix:
    """The expected requests, as weights (FGD's task popularity): whole-GPU jobs by GPUs per
    node; partitions by share of a GPU (a size on a GPU takes the weight of the nearest share;
    no shares: every size weighs 1); `capacity`: the weight of the capacity a placement takes.
    The default weighs every kind alike, which measured best when the mix is unknown."""

    whole: tuple[tuple[int, Fraction], ...] = ((1, _ONE), (2, _ONE), (4, _ONE), (8, _ONE))
    partitions: tuple[tuple[Fraction, Fraction], ...] = ()
    capacity: Fraction = _ONE
    _weights: dict[Fraction, Fraction] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def partition_weight(self, size: Fraction) -> Fraction:
        """The weight of the share nearest to `size` (by ratio)."""
        found = self._weights.get(size)
        if found is None:
            found = self._weights[size] = self._nearest(size)
        return found

    def _nearest(self, size: Fraction) -> Fraction:
        if size <= 0:
            return _ZERO
        if not self.partitions:
            return _ONE
        best = min(self.partitions, key=lambda item: max(item[0] / size, size / item[0]))
        return best[1]

    def whole_value(self, free: int) -> Fraction:
        """Usable capacity of `free` whole GPUs on one node: all of them, for every job size k
        they can hold. A GPU taken from exactly k free costs most: the node loses that size."""
        return sum((w * free for k, w in self.whole if free >= k), _ZERO)


DEFAULT_MIX = FragmentationMix()


def _fits(shape: _Shape, usage: Sequence[Amount], index: int) -> bool:
    return all(
        u + a <= t for u, a, t in zip(usage, shape.vectors[index], shape.totals, strict=True)
    )


def _set_usable(
    shape: _Shape, number: int, usage: tuple[Amount, ...], blocked: frozenset[int]
) -> tuple[bool, tuple[tuple[Fraction, int], ...]]:
    """(the whole GPU is free, (partition size, how many more fit) per size) of one set."""
    key = (number, usage, blocked)
    memo = shape.memo
    found: tuple[bool, tuple[tuple[Fraction, int], ...]] | None = memo.get(key)
    if found is not None:
        return found
    members = shape.sets[number]
    whole = shape.whole[number]
    untouched = all(usage[c] == 0 for i in members for c, a in enumerate(shape.vectors[i]) if a)
    whole_free = whole >= 0 and untouched and whole not in blocked
    counts = []
    for size, indices in shape.classes[number]:
        packed = list(usage)
        count = 0
        for i in indices:
            if i not in blocked and _fits(shape, packed, i):
                count += 1
                packed = [u + a for u, a in zip(packed, shape.vectors[i], strict=True)]
        counts.append((size, count))
    found = (whole_free, tuple(counts))
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = found
    return found


def _weighted(mix: FragmentationMix, counts: Iterable[tuple[Fraction, int]]) -> Fraction:
    return sum((mix.partition_weight(size) * size * n for size, n in counts), _ZERO)


def _set_value(
    shape: _Shape,
    number: int,
    usage: tuple[Amount, ...],
    blocked: frozenset[int],
    mix: FragmentationMix,
) -> tuple[bool, Fraction]:
    """(the whole GPU is free, the mix-weighted partition capacity) of one set, memoised."""
    key = ("value", id(mix), number, usage, blocked)
    found = shape.memo.get(key)
    if found is not None and found[0] is mix:
        return found[1], found[2]
    whole_free, counts = _set_usable(shape, number, usage, blocked)
    value = _weighted(mix, counts)
    if len(shape.memo) >= _MEMO_LIMIT:
        shape.memo.clear()
    shape.memo[key] = (mix, whole_free, value)
    return whole_free, value


@dataclass(frozen=True)
class Usable:
    """What the mix can still use on a node: free whole GPUs, and partition capacity."""

    whole: int
    partitions: Fraction  # weighted by the mix already

    def value(self, mix: FragmentationMix) -> Fraction:
        return self.partitions + mix.whole_value(self.whole)


def node_usable(
    devices: Iterable[DeviceEntry],
    taken: Callable[[DeviceEntry], bool],
    counter_used: Callable[[CounterID], Amount],
    mix: FragmentationMix = DEFAULT_MIX,
) -> Usable:
    """The node's usable capacity for the mix; `taken`: held or picked (dedicated)."""
    whole = 0
    partitions = _ZERO
    for slice_, entries in by_slice(devices):
        whole += sum(1 for e in entries if not e.counters and not taken(e))
        if not slice_.totals:
            continue
        shape = _shape(slice_, entries)
        usage = tuple(counter_used(c) for c in shape.counters)
        blocked = frozenset(i for i, e in enumerate(entries) if taken(e))
        for number in range(len(shape.sets)):
            whole_free, value = _set_value(shape, number, usage, blocked, mix)
            whole += whole_free
            partitions += value
    return Usable(whole, partitions)


def node_usable_change(
    devices: Iterable[DeviceEntry],
    taken: Callable[[DeviceEntry], bool],
    counter_used: Callable[[CounterID], Amount],
    picked: Collection[DeviceID],
    added: Mapping[CounterID, Amount],
    mix: FragmentationMix = DEFAULT_MIX,
) -> tuple[Usable, Usable]:
    """`node_usable` before and after a placement that takes the `picked` devices (none of
    them `taken`) and adds `added` counter use; a slice it does not touch is worked out once."""
    whole_before = whole_after = 0
    before = after = _ZERO
    for slice_, entries in by_slice(devices):
        plain = sum(1 for e in entries if not e.counters and not taken(e))
        whole_before += plain
        whole_after += plain - sum(1 for e in entries if not e.counters and e.id in picked)
        if not slice_.totals:
            continue
        shape = _shape(slice_, entries)
        usage = tuple(counter_used(c) for c in shape.counters)
        blocked = frozenset(i for i, e in enumerate(entries) if taken(e))
        values = [_set_value(shape, n, usage, blocked, mix) for n in range(len(shape.sets))]
        for whole_free, value in values:
            whole_before += whole_free
            before += value
        if any(e.id in picked for e in entries) or any(c in added for c in shape.counters):
            usage = tuple(u + added.get(c, 0) for u, c in zip(usage, shape.counters, strict=True))
            blocked |= {i for i, e in enumerate(entries) if e.id in picked}
            values = [_set_value(shape, n, usage, blocked, mix) for n in range(len(shape.sets))]
        for whole_free, value in values:
            whole_after += whole_free
            after += value
    return Usable(whole_before, before), Usable(whole_after, after)


def placement_loss(before: Usable, after: Usable, mix: FragmentationMix = DEFAULT_MIX) -> Fraction:
    """Usable capacity the mix loses (never below 0)."""
    return max(_ZERO, before.value(mix) - after.value(mix))


def set_loss(
    entry: DeviceEntry,
    counter_used: Callable[[CounterID], Amount],
    in_use: Callable[[DeviceID], bool],
    slice_devices: Mapping[int, Sequence[DeviceEntry]],
    mix: FragmentationMix = DEFAULT_MIX,
    states: dict[int, tuple[tuple[Amount, ...], frozenset[int]]] | None = None,
) -> Fraction:
    """What taking `entry` costs its own GPU (counter set): weighted usable partition capacity
    lost, plus the single-GPU weight if it breaks a whole free GPU. 0 without counters.
    `states`: a cache of each slice's counter use and held devices, for one allocated state."""
    if not entry.counters:
        return _ZERO
    entries = slice_devices[entry.slice.index]
    shape = _shape(entry.slice, entries)
    index = shape.index_of.get(id(entry), -1)
    if index < 0 or shape.devices[index] is not entry:
        index = next(i for i, e in enumerate(entries) if e is entry)
    number = shape.set_of[index]
    found = states.get(entry.slice.index) if states is not None else None
    if found is None:
        usage = tuple(counter_used(c) for c in shape.counters)
        blocked = frozenset(i for i, e in enumerate(entries) if in_use(e.id))
        found = (usage, blocked)
        if states is not None:
            states[entry.slice.index] = found
    usage, blocked = found
    whole_before, before = _set_value(shape, number, usage, blocked, mix)
    after_usage = tuple(u + a for u, a in zip(usage, shape.vectors[index], strict=True))
    whole_after, after = _set_value(shape, number, after_usage, blocked | {index}, mix)
    lost = before - after
    if whole_before and not whole_after:
        lost += mix.whole_value(1)
    return max(_ZERO, lost)


def node_fragmentation(
    devices: Sequence[DeviceEntry],
    taken: Callable[[DeviceEntry], bool],
    counter_used: Callable[[CounterID], Amount],
) -> Fraction:
    """How fragmented a node's free capacity is, 0..1: the share of it (scoring's device
    equivalents: a free GPU is 1, a partitioned one its free share) that is not in free whole
    GPUs (`node_usable`'s `whole`), so a whole-GPU request cannot use it. 0 with nothing free:
    a full node is not fragmented."""
    free = free_capacity(devices, lambda entry: not taken(entry), counter_used)
    if free <= 0:
        return _ZERO
    whole = node_usable(devices, taken, counter_used).whole
    return max(_ZERO, 1 - Fraction(whole) / free)
