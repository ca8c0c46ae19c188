"""ClusterSnapshot: ResourceSlices and Nodes indexed once, then read by many solves.

Upstream gathers pools per `Allocate` call (`GatherPools`): the slices a node can see, grouped
by (driver, pool), keeping only the highest generation seen, with an incomplete flag (kept
slices != resourceSliceCount) and an invalid flag (a device name repeats). We do the same work
once per node when the snapshot is built, so a solve only looks up its node (O(1)).

Deterministic order (a deliberate difference from upstream, whose pool order comes from a Go
map): pools sorted by (driver, pool name), slices in a pool by slice name, devices in slice
order; as upstream, pools and slices with devices that have binding conditions come after those
without, so first fit prefers devices that need no binding step. Each device is projected once
into what CEL sees (`CelDevice`) and interned by content: devices with the same driver,
attributes, capacities and allowMultipleAllocations share one projection and one `profile`
number, so a selector is evaluated once per profile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

from services.allocator.core.nodeselect import InvalidNodeSelector, NodeAccess, check_node_selector
from services.cel import CelDevice
from services.common.dra.model import Device, DeviceID, Node, NodeSelector, ResourceSlice
from services.common.dra.suggest import did_you_mean
from services.common.errors import NotFound

if TYPE_CHECKING:
    from services.allocator.core.topology import NodeTopology

__all__ = [
    "Amount",
    "ClusterSnapshot",
    "CounterID",
    "DeviceEntry",
    "NodePool",
    "NodeView",
    "PoolView",
    "SliceEntry",
    "by_slice",
    "exact",
]

_T = TypeVar("_T")

Amount = int | Fraction
"""A counter amount as the solver computes with it: an int when whole (fast), else a Fraction."""


def exact(value: Fraction) -> Amount:
    """`value` as an int when it is whole; Fractions cost ten times more per operation."""
    return value.numerator if value.denominator == 1 else value


class CounterID(NamedTuple):
    """One counter of a counter set: what partitionable devices consume."""

    driver: str
    pool: str
    counter_set: str
    counter: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.counter_set}/{self.counter}"


@dataclass(frozen=True, eq=False)
class SliceEntry:
    slice: ResourceSlice
    index: int  # position in the snapshot's input
    counter_totals: Mapping[CounterID, Fraction]  # every counter of every set in this slice
    # The same totals as `exact` amounts (ints where whole): what the solver computes with.
    totals: Mapping[CounterID, Amount] = field(default_factory=dict)
    # Pure results about this slice's devices, memoised by the solver (search.score).
    memo: dict[Any, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, eq=False)
class DeviceEntry:
    """A device with everything the solver needs precomputed."""

    id: DeviceID
    device: Device
    slice: SliceEntry
    access: NodeAccess  # the device's own (perDeviceNodeSelection) or its slice's
    cel: CelDevice  # shared by every device of the same profile
    profile: int  # same number <=> same CEL-visible content
    shape: int  # same number <=> same capacities (with policies), taints and sharing mode
    consumption: int  # same number <=> the very same counters and amounts (0: none)
    counters: tuple[tuple[CounterID, Fraction], ...]  # consumption in its own slice, scarcest first
    position: int  # global order, for stable tie-breaks
    size: Fraction  # share of its counter sets it takes (scoring.free_capacity): 1 = a whole GPU
    amounts: tuple[Amount, ...] = ()  # `counters`' amounts as `exact` amounts, in order
    # It has binding conditions and the snapshot has them turned off: usable for no request.
    binding_disabled: bool = False
    counter_sets: frozenset[str] = frozenset()  # the counter sets `counters` draw from

    @property
    def multi(self) -> bool:
        return self.device.allow_multiple_allocations

    def __repr__(self) -> str:
        return f"DeviceEntry({self.id})"


def by_slice(entries: Iterable[DeviceEntry]) -> Iterator[tuple[SliceEntry, list[DeviceEntry]]]:
    """Consecutive devices of one slice (a node's devices come slice by slice)."""
    current: SliceEntry | None = None
    run: list[DeviceEntry] = []
    for entry in entries:
        if current is not None and entry.slice is not current:
            yield current, run
            run = []
        current = entry.slice
        run.append(entry)
    if current is not None:
        yield current, run


@dataclass(frozen=True, eq=False)
class PoolView:
    """A gathered pool: only the slices of its highest generation that a node can see."""

    driver: str
    name: str
    generation: int
    resource_slice_count: int
    slices: tuple[SliceEntry, ...]
    devices: tuple[DeviceEntry, ...]  # every device of the kept slices, in order
    invalid_reason: str | None

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.name}"

    @property
    def incomplete(self) -> bool:
        return len(self.slices) != self.resource_slice_count

    @property
    def invalid(self) -> bool:
        return self.invalid_reason is not None


@dataclass(frozen=True, eq=False)
class NodePool:
    pool: PoolView
    devices: tuple[DeviceEntry, ...]  # the pool's devices usable from the node


@dataclass(frozen=True, eq=False)
class NodeView:
    """What one node sees: pools in deterministic order and the devices usable there."""

    name: str | None
    node: Node | None
    pools: tuple[NodePool, ...]
    all_devices: tuple[DeviceEntry, ...] = ()  # every pool's devices, in order (set below)

    def __post_init__(self) -> None:
        devices = tuple(entry for node_pool in self.pools for entry in node_pool.devices)
        object.__setattr__(self, "all_devices", devices)

    @property
    def device_count(self) -> int:
        return len(self.all_devices)

    def devices(self) -> tuple[DeviceEntry, ...]:
        """The devices usable here, pool by pool (one tuple, kept: views are immutable)."""
        return self.all_devices


@dataclass
class _Interner:
    """Gives equal content one number and (for CEL) one shared projection."""

    profiles: dict[tuple[Any, ...], tuple[int, CelDevice]] = field(default_factory=dict)
    shapes: dict[tuple[Any, ...], int] = field(default_factory=dict)
    consumptions: dict[tuple[tuple[CounterID, Fraction], ...], int] = field(
        default_factory=lambda: {(): 0}
    )

    def consumption(self, counters: tuple[tuple[CounterID, Fraction], ...]) -> int:
        return self.consumptions.setdefault(counters, len(self.consumptions))

    def profile(self, driver: str, device: Device) -> tuple[int, CelDevice]:
        capacity = {name: cap.value for name, cap in device.capacity.items()}
        key = (
            driver,
            tuple(sorted(device.attributes.items(), key=_first)),
            tuple(sorted(capacity.items())),
            device.allow_multiple_allocations,
        )
        found = self.profiles.get(key)
        if found is None:
            cel = CelDevice(driver, device.attributes, capacity, device.allow_multiple_allocations)
            found = self.profiles[key] = (len(self.profiles), cel)
        return found

    def shape(self, device: Device) -> int:
        key = (
            tuple(sorted(device.capacity.items(), key=_first)),
            tuple(sorted((t.key, t.value, str(t.effect)) for t in device.taints)),
            device.allow_multiple_allocations,
            (device.binding_conditions, device.binding_failure_conditions, device.binds_to_node),
        )
        return self.shapes.setdefault(key, len(self.shapes))


_ZERO = Fraction(0)


def _first(item: tuple[str, object]) -> str:
    return item[0]


class ClusterSnapshot:
    """Immutable index of slices and nodes; build with `ClusterSnapshot.build`."""

    def __init__(
        self,
        views: Mapping[str, NodeView],
        nil_view: NodeView,
        devices: Mapping[DeviceID, DeviceEntry],
        warnings: Sequence[str],
        topologies: Mapping[str, NodeTopology] | None = None,
    ) -> None:
        self._views = dict(views)
        self._names = tuple(sorted(self._views))
        self.nil_view = nil_view
        self._devices = dict(devices)
        self.warnings: tuple[str, ...] = tuple(warnings)
        self._topologies = dict(topologies or {})
        self._derived: dict[Callable[[ClusterSnapshot], object], object] = {}

    @classmethod
    def build(
        cls,
        slices: Iterable[ResourceSlice],
        nodes: Iterable[Node] = (),
        *,
        topologies: Mapping[str, NodeTopology] | None = None,
        binding_conditions: bool = True,
    ) -> ClusterSnapshot:
        """Index `slices` for `nodes`. Nodes only named by a slice's or device's nodeName are
        added with no labels, so node-local devices are always reachable. `topologies` (by
        node name) say how each node's GPUs are wired, for topology constraints and scores.
        `binding_conditions=False` is upstream's DRADeviceBindingConditions gate off: devices
        with binding conditions are then selected by no request (`binding_disabled`)."""
        snapshot = _Builder(list(slices), list(nodes), binding_conditions).build()
        snapshot._topologies = dict(topologies or {})
        return snapshot

    def topology(self, node_name: str | None) -> NodeTopology | None:
        """The node's wiring, if known."""
        return self._topologies.get(node_name) if node_name is not None else None

    @property
    def topologies(self) -> Mapping[str, NodeTopology]:
        return self._topologies

    def derived(self, build: Callable[[ClusterSnapshot], _T]) -> _T:
        """`build(self)`, built on first use and kept with this (immutable) snapshot: an index
        a higher module derives from it (templates.node_templates) without this module
        knowing it."""
        found = self._derived.get(build)
        if found is None:
            found = self._derived[build] = build(self)
        return cast(_T, found)

    @property
    def node_names(self) -> tuple[str, ...]:
        return self._names

    def view(self, node_name: str) -> NodeView:
        found = self._views.get(node_name)
        if found is None:
            raise NotFound(f"node {node_name} not found{did_you_mean(node_name, self._views)}")
        return found

    def views(self) -> Iterator[NodeView]:
        for name in self._names:
            yield self._views[name]

    def device(self, device_id: DeviceID) -> DeviceEntry | None:
        """The device of the newest pool generation with this id, wherever it is usable."""
        return self._devices.get(device_id)

    def all_devices(self) -> Iterator[DeviceEntry]:
        yield from self._devices.values()


class _Builder:
    def __init__(
        self, slices: list[ResourceSlice], nodes: list[Node], binding_conditions: bool = True
    ) -> None:
        self.slices = slices
        self.binding_conditions = binding_conditions
        self.binding = [any(d.binding_conditions for d in s.devices) for s in slices]
        self.nodes = {node.name: node for node in nodes}
        self.warnings: list[str] = []
        self.interner = _Interner()
        self.slice_entries: list[SliceEntry] = []
        self.entries: list[tuple[DeviceEntry, ...]] = []
        self.pool_cache: dict[tuple[tuple[str, str], tuple[int, ...]], PoolView] = {}
        self.by_node_name: dict[str, list[int]] = {}
        self.everywhere: list[int] = []
        self.by_selector: list[tuple[int, NodeSelector]] = []
        self.per_device: list[int] = []

    def build(self) -> ClusterSnapshot:
        position = 0
        for index, slice_ in enumerate(self.slices):
            entry = self._slice_entry(index, slice_)
            self.slice_entries.append(entry)
            devices = []
            for device in slice_.devices:
                devices.append(self._device_entry(entry, device, position))
                position += 1
            self.entries.append(tuple(devices))
            self._index_access(index, slice_)
        for name in sorted(self.by_node_name):
            self.nodes.setdefault(name, Node(name))
        views = {name: self._view(node) for name, node in self.nodes.items()}
        return ClusterSnapshot(views, self._view(None), self._newest_devices(), self.warnings)

    # --- per slice and device -------------------------------------------------------

    def _slice_entry(self, index: int, slice_: ResourceSlice) -> SliceEntry:
        totals = {
            CounterID(slice_.driver, slice_.pool.name, counter_set.name, name): quantity.value
            for counter_set in slice_.shared_counters
            for name, quantity in counter_set.counters.items()
        }
        return SliceEntry(slice_, index, totals, {c: exact(v) for c, v in totals.items()})

    def _device_entry(self, entry: SliceEntry, device: Device, position: int) -> DeviceEntry:
        slice_ = entry.slice
        if slice_.per_device_node_selection:
            access = NodeAccess(device.node_name or None, device.node_selector, device.all_nodes)
            self._check_selector(
                access.node_selector, f"device {device.name} in slice {slice_.name}"
            )
        else:
            access = NodeAccess.of_slice(slice_)
        if device.binds_to_node and self.binding_conditions:  # a gated field upstream
            access = replace(access, binds_to_node=True)
        profile, cel = self.interner.profile(slice_.driver, device)
        totals = entry.counter_totals
        consumption: dict[CounterID, Fraction] = {}
        for use in device.consumes_counters:
            for name, quantity in use.counters.items():
                counter = CounterID(slice_.driver, slice_.pool.name, use.counter_set, name)
                if counter in totals:  # upstream ignores unknown counters
                    consumption[counter] = consumption.get(counter, _ZERO) + quantity.value
        # Scarcest first (largest share of its total), so counter checks fail fast.
        counters = tuple(
            sorted(
                consumption.items(),
                key=lambda item: (-(item[1] / totals[item[0]]) if totals[item[0]] else 0, item[0]),
            )
        )
        return DeviceEntry(
            id=DeviceID(slice_.driver, slice_.pool.name, device.name),
            device=device,
            slice=entry,
            access=access,
            cel=cel,
            profile=profile,
            shape=self.interner.shape(device),
            consumption=self.interner.consumption(counters),
            counters=counters,
            position=position,
            size=_size(counters, totals),
            amounts=tuple(exact(amount) for _, amount in counters),
            binding_disabled=bool(device.binding_conditions) and not self.binding_conditions,
            counter_sets=frozenset(counter.counter_set for counter, _ in counters),
        )

    def _check_selector(self, selector: NodeSelector | None, what: str) -> bool:
        if selector is None:
            return True
        try:
            check_node_selector(selector)
        except InvalidNodeSelector as err:
            self.warnings.append(f"{what}: invalid node selector, ignored: {err}")
            return False
        return True

    def _index_access(self, index: int, slice_: ResourceSlice) -> None:
        if slice_.node_name:
            self.by_node_name.setdefault(slice_.node_name, []).append(index)
        elif slice_.all_nodes:
            self.everywhere.append(index)
        elif slice_.node_selector is not None:
            if self._check_selector(slice_.node_selector, f"slice {slice_.name}"):
                self.by_selector.append((index, slice_.node_selector))
        elif slice_.per_device_node_selection:
            self.per_device.append(index)
            for device in slice_.devices:
                if device.node_name:
                    self.by_node_name.setdefault(device.node_name, []).append(index)
        # A slice with no node access at all is some future extension: ignored, as upstream.

    # --- per node -------------------------------------------------------------------

    def _visible(self, node: Node | None) -> list[int]:
        visible = set(self.everywhere)
        if node is not None:
            visible.update(self.by_node_name.get(node.name, ()))
            visible.update(
                i for i, sel in self.by_selector if NodeAccess(node_selector=sel).matches(node)
            )
        for index in self.per_device:
            if index not in visible and any(e.access.matches(node) for e in self.entries[index]):
                visible.add(index)
        return sorted(visible)

    def _view(self, node: Node | None) -> NodeView:
        kept: dict[tuple[str, str], list[int]] = {}
        for index in self._visible(node):
            generation = self.slices[index].pool.generation
            key = (self.slices[index].driver, self.slices[index].pool.name)
            have = kept.get(key)
            if have is None or generation > self.slices[have[0]].pool.generation:
                kept[key] = [index]
            elif generation == self.slices[have[0]].pool.generation:
                have.append(index)
        node_pools = []
        for key in sorted(kept):
            indices = sorted(kept[key], key=lambda i: (self.binding[i], self.slices[i].name, i))
            pool = self._pool(key, tuple(indices))
            devices = pool.devices
            if any(self.slices[i].per_device_node_selection for i in indices):
                devices = tuple(e for e in devices if e.access.matches(node))
            node_pools.append(NodePool(pool, devices))
        # Pools with binding conditions last (a stable sort keeps (driver, pool) order).
        node_pools.sort(key=lambda p: any(self.binding[s.index] for s in p.pool.slices))
        return NodeView(node.name if node else None, node, tuple(node_pools))

    def _pool(self, key: tuple[str, str], indices: tuple[int, ...]) -> PoolView:
        cached = self.pool_cache.get((key, indices))
        if cached is not None:
            return cached
        first = self.slices[indices[0]]
        devices = tuple(e for i in indices for e in self.entries[i])
        pool = PoolView(
            driver=key[0],
            name=key[1],
            generation=first.pool.generation,
            resource_slice_count=first.pool.resource_slice_count,
            slices=tuple(self.slice_entries[i] for i in indices),
            devices=devices,
            invalid_reason=_duplicate_name(devices),
        )
        self.pool_cache[(key, indices)] = pool
        return pool

    def _newest_devices(self) -> dict[DeviceID, DeviceEntry]:
        newest: dict[tuple[str, str], int] = {}
        for slice_ in self.slices:
            key = (slice_.driver, slice_.pool.name)
            newest[key] = max(newest.get(key, slice_.pool.generation), slice_.pool.generation)
        devices: dict[DeviceID, DeviceEntry] = {}
        for index, slice_ in enumerate(self.slices):
            if slice_.pool.generation == newest[(slice_.driver, slice_.pool.name)]:
                for entry in self.entries[index]:
                    devices.setdefault(entry.id, entry)
        return devices


def _size(
    counters: Sequence[tuple[CounterID, Fraction]], totals: Mapping[CounterID, Fraction]
) -> Fraction:
    """How much of the free capacity (scoring.free_capacity) taking the device uses: per
    counter set it consumes, the mean over the set's counters (those with a total) of the share
    it takes, summed over sets. A whole GPU that consumes all of its set is 1."""
    per_set: dict[tuple[str, str, str], int] = {}
    for counter, total in totals.items():
        if total > 0:
            key = (counter.driver, counter.pool, counter.counter_set)
            per_set[key] = per_set.get(key, 0) + 1
    size = _ZERO
    for counter, amount in counters:
        total = totals[counter]
        if total > 0:
            members = per_set[(counter.driver, counter.pool, counter.counter_set)]
            size += amount / total / members
    return size


def _duplicate_name(devices: Sequence[DeviceEntry]) -> str | None:
    seen: set[str] = set()
    for entry in devices:
        if entry.id.device in seen:
            return f"duplicate device name {entry.id.device}"
        seen.add(entry.id.device)
    return None
