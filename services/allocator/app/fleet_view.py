"""The fleet as the web view draws it: nodes x GPUs, MIG slices where they sit, who holds what.

Built from the two local reads every answer comes from — the current inventory view and the
holdings' AllocatedState over it — plus the live reservations, so what the page shows is what
the next Allocate in this process would see (pending placements included).

- A GPU is **free** when nothing holds it and none of its devices is tainted; a tainted GPU
  nothing holds is its own state (`tainted`), and its capacity is not free capacity.
- A **GPU** is a counter set (a partitionable GPU: the whole-GPU device and its MIG devices all
  draw from it), else the devices sharing a `parentUUID` attribute (MIG devices published
  without counters), else one device.
- A GPU has `columns`: its memory slices (counters named `memory-slice-<n>`, as the NVIDIA
  driver publishes them); a held device covers the columns of the memory slices it consumes,
  so a 1g slice at memory slice 6 is drawn at column 6. A counter set without memory-slice
  counters is drawn as 8 columns with its held devices side by side by their share; a GPU that
  is not partitionable has one column.
- **Holders** are what the viewer may see of each reservation (app/tenancy.py): in full, or only
  its tenant, state and expiry. A placement this process is reserving right now shows as
  `reserving`.
- **Fragmentation** of a node (FGD, core/fragmentation.py): how much less of its free capacity
  the default request mix can use than it could on the same node with nothing held, as a
  share — `1 - (usable now / free now) / (usable empty / capacity)`, 0 when nothing is free.
  A node with 3 of 8 H100s free scores 0.5 (jobs of 4 and 8 GPUs cannot use them); one free
  8-GPU node 0.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from services.allocator.app.cluster_view import ViewSnapshot
from services.allocator.app.tenancy import visible_reservation
from services.allocator.core import (
    DEFAULT_MIX,
    AllocatedState,
    CounterID,
    DeviceEntry,
    NodeView,
    free_capacity,
    node_usable,
)
from services.allocator.reservations.hold_kinds import HoldKind
from services.allocator.reservations.model import Reservation
from services.common.security.principal import Principal

__all__ = ["Fleet", "FleetGpu", "FleetHolder", "FleetNode", "FleetPlacement", "fleet_of"]

_MEMORY_SLICE = re.compile(r"memory-slice-(\d+)")
_SHARE_COLUMNS = 8  # columns of a counter set drawn by share (no memory-slice counters)
PENDING_OWNER = "reserving"
CHANGING_OWNER = "changing"


@dataclass(frozen=True)
class FleetHolder:
    """One holder of a device as the viewer may see it."""

    owner: str  # the owner, or only its tenant when `redacted`; PENDING_OWNER while reserving
    reservation_id: str  # "" when redacted or pending
    state: str  # RESERVED, COMMITTED or PENDING
    expires_at: float | None  # seconds since the epoch; None once committed
    redacted: bool = False


@dataclass(frozen=True)
class FleetPlacement:
    """A held device drawn on its GPU: columns `start` .. `start + width - 1`."""

    device: str
    profile: str  # the MIG profile (`1g.10gb`), "" for a whole GPU
    start: int
    width: int
    holders: tuple[FleetHolder, ...]


@dataclass(frozen=True)
class FleetGpu:
    name: str  # the whole-GPU device's name (else the counter set's, or the parent UUID)
    pool: str
    model: str  # productName, "" when not published
    columns: int
    placements: tuple[FleetPlacement, ...]  # held devices only
    tainted: tuple[str, ...] = ()  # taint keys on its devices (unhealthy GPUs)

    @property
    def free(self) -> bool:
        """Nothing holds it and no device of it is tainted."""
        return not self.placements and not self.tainted

    @property
    def state(self) -> str:
        """`free`, `held`, or `tainted` (nothing holds it, but a taint keeps new allocations
        off it: never counted free)."""
        if self.placements:
            return "held"
        return "tainted" if self.tainted else "free"


@dataclass(frozen=True)
class FleetNode:
    name: str
    gpus: tuple[FleetGpu, ...]
    free_capacity: float  # GPU-equivalents free (scoring.free_capacity)
    capacity: float  # GPU-equivalents in all
    fragmentation: float  # 0..1, see the module docstring

    @property
    def free_gpus(self) -> int:
        return sum(1 for gpu in self.gpus if gpu.free)

    @property
    def tainted_gpus(self) -> int:
        return sum(1 for gpu in self.gpus if gpu.state == "tainted")


@dataclass(frozen=True)
class Fleet:
    generation: int  # the inventory generation drawn
    nodes: tuple[FleetNode, ...]

    def holders(self) -> dict[str, int]:
        """Every holder shown (owner or tenant), with how many devices it holds."""
        counts: dict[str, int] = {}
        for node in self.nodes:
            for gpu in node.gpus:
                for placement in gpu.placements:
                    for holder in placement.holders:
                        counts[holder.owner] = counts.get(holder.owner, 0) + 1
        return dict(sorted(counts.items()))


def fleet_of(
    view: ViewSnapshot,
    state: AllocatedState,
    reservations: Mapping[str, Reservation],
    viewer: Principal,
) -> Fleet:
    """The fleet of `view` with `state`'s holds; `reservations` by id name the holders."""

    def holder(owner_id: str) -> FleetHolder:
        reservation = reservations.get(owner_id)
        if reservation is None:  # reserving now, or released since the state was read
            pending = HoldKind.of(owner_id) is HoldKind.PENDING
            owner = PENDING_OWNER if pending else CHANGING_OWNER
            return FleetHolder(owner, "", "PENDING", None)
        shown = visible_reservation(reservation, viewer)
        return FleetHolder(
            shown.owner, shown.id, shown.state.value, shown.expires_at, shown.redacted
        )

    nodes = tuple(
        _node(node_view, state, holder)
        for node_view in view.snapshot.views()
        if node_view.name is not None and node_view.device_count
    )
    return Fleet(view.generation, nodes)


def _node(
    node_view: NodeView, state: AllocatedState, holder: Callable[[str], FleetHolder]
) -> FleetNode:
    devices = list(node_view.devices())
    gpus = tuple(
        sorted(
            (_gpu(g, state, holder) for g in _gpu_groups(devices)), key=lambda g: _natural(g.name)
        )
    )
    free = free_capacity(
        devices, lambda e: not state.in_use(e.id) and not e.device.taints, state.counter_amount
    )
    capacity = free_capacity(devices, lambda e: True, lambda c: 0)
    return FleetNode(
        node_view.name or "",
        gpus,
        float(free),
        float(capacity),
        float(_fragmentation(devices, state, free, capacity)),
    )


def _fragmentation(
    devices: list[DeviceEntry], state: AllocatedState, free: Fraction, capacity: Fraction
) -> Fraction:
    if not free or not capacity:
        return Fraction(0)
    usable = node_usable(
        devices, lambda e: state.in_use(e.id) or bool(e.device.taints), state.counter_amount
    )
    empty = node_usable(devices, lambda e: False, lambda c: 0)
    ideal = empty.value(DEFAULT_MIX) / capacity
    if not ideal:
        return Fraction(0)
    return max(Fraction(0), 1 - (usable.value(DEFAULT_MIX) / free) / ideal)


def _gpu_groups(devices: Iterable[DeviceEntry]) -> list[list[DeviceEntry]]:
    """The node's devices by GPU, in device order (see the module docstring)."""
    groups: dict[tuple[str, ...], list[DeviceEntry]] = {}
    for entry in devices:
        groups.setdefault(_gpu_key(entry), []).append(entry)
    return list(groups.values())


def _gpu_key(entry: DeviceEntry) -> tuple[str, ...]:
    if entry.counters:
        counter = entry.counters[0][0]
        return ("counters", counter.driver, counter.pool, counter.counter_set)
    parent = _attribute(entry, "parentUUID")
    if parent:
        return ("parent", entry.id.driver, entry.id.pool, parent)
    return ("device", entry.id.driver, entry.id.pool, entry.id.device)


def _gpu(
    group: list[DeviceEntry], state: AllocatedState, holder: Callable[[str], FleetHolder]
) -> FleetGpu:
    first = group[0]
    whole = next((e for e in group if e.size >= 1 or not e.counters), None)
    slices = _memory_slices(first)
    if first.counters:
        name = whole.id.device if whole is not None else first.counters[0][0].counter_set
        columns = len(slices) or _SHARE_COLUMNS
    else:
        name = first.id.device if len(group) == 1 else _attribute(first, "parentUUID")
        columns = len(group)
    placements = []
    packed = 0  # next free column of a GPU drawn by share or by device
    for index, entry in enumerate(group):
        owners = state.owners(entry.id)
        if not owners:
            continue
        start, width = _columns(entry, slices, columns, group, index, packed)
        packed = start + width
        placements.append(
            FleetPlacement(
                entry.id.device,
                _attribute(entry, "profile") if entry is not whole else "",
                start,
                width,
                tuple(holder(owner) for owner in owners),
            )
        )
    tainted = tuple(sorted({t.key for e in group for t in e.device.taints}))
    return FleetGpu(
        name, first.id.pool, _attribute(first, "productName"), columns, tuple(placements), tainted
    )


def _columns(
    entry: DeviceEntry,
    slices: Mapping[CounterID, int],
    columns: int,
    group: list[DeviceEntry],
    index: int,
    packed: int,
) -> tuple[int, int]:
    """(first column, width) of a held device on its GPU."""
    if not entry.counters:
        return (index, 1) if len(group) > 1 else (0, 1)
    if entry.size >= 1:
        return 0, columns
    taken = sorted(slices[c] for c, _ in entry.counters if c in slices)
    if taken:
        return taken[0], taken[-1] - taken[0] + 1
    width = max(1, min(columns, round(float(entry.size) * columns)))
    return min(packed, columns - width), width


def _memory_slices(entry: DeviceEntry) -> dict[CounterID, int]:
    """The memory-slice counters of the entry's counter set -> their column."""
    if not entry.counters:
        return {}
    counter_set = entry.counters[0][0].counter_set
    found = {}
    for counter in entry.slice.counter_totals:
        match = _MEMORY_SLICE.fullmatch(counter.counter)
        if counter.counter_set == counter_set and match:
            found[counter] = int(match.group(1))
    ordered = sorted(found.items(), key=lambda item: item[1])
    return {counter: column for column, (counter, _) in enumerate(ordered)}


def _natural(name: str) -> tuple[tuple[int, str], ...]:
    """`gpu-2` before `gpu-10`."""
    return tuple((int(p), "") if p.isdigit() else (0, p) for p in re.split(r"(\d+)", name))


def _attribute(entry: DeviceEntry, name: str) -> str:
    attributes = entry.device.attributes
    value = attributes.get(name) or attributes.get(f"{entry.id.driver}/{name}")
    return str(value.value) if value is not None else ""
