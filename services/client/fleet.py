"""The fleet as an operator looks at it: each device of each node with who holds it.

`fleet_view(nodes, reservations)` joins the inventory's nodes (InventoryClient.nodes) with the
allocator's reservations (AllocatorClient.list) into DeviceState rows:

- `held`: a reservation lists the device (RESERVED until its lease expires, or COMMITTED);
- `blocked`: not held itself, but what it consumes of a shared counter set (a MIG slice's
  memory slices, a partitionable GPU's whole budget) is no longer left because of held
  devices of the same counter set — the allocator would not give it out either;
- `tainted`: a NoSchedule/NoExecute taint (unhealthy GPU) keeps it out of new allocations;
- else `free`.

GPUs group a node's devices by the physical GPU they are (or are carved from, `gpu_uuid`), so
`describe node` can draw the MIG layout GPU by GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from services.client.inventory import InventoryDevice, NodeInventory
from services.client.results import Reservation, ReservationState
from services.common.dra.model import DeviceID
from services.common.dra.quantity import Quantity

__all__ = ["DeviceState", "FleetNode", "Gpu", "Use", "fleet_view"]


class Use(StrEnum):
    FREE = "free"
    RESERVED = "reserved"
    COMMITTED = "committed"
    BLOCKED = "blocked"
    TAINTED = "tainted"


@dataclass(frozen=True)
class DeviceState:
    node: str
    device: InventoryDevice
    use: Use
    holder: Reservation | None = None
    """The reservation holding the device (held), or one of those blocking it (blocked)."""

    @property
    def id(self) -> DeviceID:
        return self.device.id

    @property
    def type(self) -> str:
        return self.device.type or "device"

    @property
    def model(self) -> str:
        return str(self.device.attribute("productName") or "")

    @property
    def memory(self) -> str:
        capacity = self.device.device.capacity.get("memory") or self.device.device.capacity.get(
            f"{self.id.driver}/memory"
        )
        return str(capacity.value) if capacity is not None else ""

    @property
    def expires_at(self) -> datetime | None:
        """The lease end of what holds it: its own reservation's, or (blocked) the one in the
        way's; None when that is committed (or nothing holds it)."""
        if self.holder is None or self.use not in (Use.RESERVED, Use.BLOCKED):
            return None
        return self.holder.expires_at


@dataclass(frozen=True)
class Gpu:
    """A physical GPU and the devices it offers: itself, and its MIG slices."""

    uuid: str
    devices: tuple[DeviceState, ...]

    @property
    def whole(self) -> DeviceState | None:
        return next((d for d in self.devices if d.type == "gpu"), None)

    @property
    def slices(self) -> tuple[DeviceState, ...]:
        return tuple(d for d in self.devices if d.type == "mig")

    @property
    def held(self) -> bool:
        return any(d.use in (Use.RESERVED, Use.COMMITTED) for d in self.devices)

    @property
    def tainted(self) -> bool:
        """Nothing on this GPU is held, but a device of it is tainted (kept out of new
        allocations): counted apart, never as free."""
        return not self.held and any(d.use is Use.TAINTED for d in self.devices)

    @property
    def free(self) -> bool:
        """Nothing on this GPU is held nor tainted (so the whole GPU can still be had)."""
        return not self.held and not self.tainted


@dataclass(frozen=True)
class FleetNode:
    inventory: NodeInventory
    devices: tuple[DeviceState, ...]
    reservations: tuple[Reservation, ...] = field(default=())

    @property
    def name(self) -> str:
        return self.inventory.name

    @property
    def labels(self) -> Mapping[str, str]:
        return self.inventory.labels

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        groups: dict[str, list[DeviceState]] = {}
        for state in self.devices:
            key = state.device.gpu_uuid or state.device.uuid or state.id.device
            groups.setdefault(key, []).append(state)
        return tuple(Gpu(uuid, tuple(states)) for uuid, states in groups.items())

    def count(self, use: Use) -> int:
        return sum(1 for d in self.devices if d.use is use)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted({d.model for d in self.devices if d.model}))


def fleet_view(
    nodes: Sequence[NodeInventory], reservations: Iterable[Reservation]
) -> list[FleetNode]:
    """Each node with its devices' states (see the module's doc), in the nodes' order."""
    by_node: dict[str, list[Reservation]] = {}
    for reservation in reservations:
        by_node.setdefault(reservation.node_name, []).append(reservation)
    return [_node(node, by_node.get(node.name, [])) for node in nodes]


def _node(node: NodeInventory, reservations: Sequence[Reservation]) -> FleetNode:
    holders = {device: r for r in reservations for device in r.devices}
    left = _counters_left(node, holders)
    states = []
    for device in node.devices:
        holder = holders.get(device.id)
        if holder is not None:
            use = Use.COMMITTED if holder.state is ReservationState.COMMITTED else Use.RESERVED
            states.append(DeviceState(node.name, device, use, holder))
        elif (blocker := _blocker(device, left, holders, node)) is not None:
            states.append(DeviceState(node.name, device, Use.BLOCKED, blocker))
        elif any(t.effect.value in ("NoSchedule", "NoExecute") for t in device.device.taints):
            states.append(DeviceState(node.name, device, Use.TAINTED))
        else:
            states.append(DeviceState(node.name, device, Use.FREE))
    return FleetNode(node, tuple(states), tuple(sorted(reservations, key=lambda r: r.id)))


_CounterKey = tuple[str, str, str]  # (driver/pool, counter set, counter)


def _counters_left(
    node: NodeInventory, holders: Mapping[DeviceID, Reservation]
) -> dict[_CounterKey, Quantity]:
    """What each shared counter has left after the held devices' consumption."""
    left: dict[_CounterKey, Quantity] = {}
    for totals in node.counter_sets:
        for counter, value in totals.counters.items():
            left[(f"{totals.driver}/{totals.pool}", totals.name, counter)] = value
    for device in node.devices:
        if device.id not in holders:
            continue
        for consumption in device.device.consumes_counters:
            for counter, value in consumption.counters.items():
                key = (f"{device.id.driver}/{device.id.pool}", consumption.counter_set, counter)
                if key in left:
                    left[key] = left[key] - value
    return left


def _blocker(
    device: InventoryDevice,
    left: Mapping[_CounterKey, Quantity],
    holders: Mapping[DeviceID, Reservation],
    node: NodeInventory,
) -> Reservation | None:
    """A reservation whose devices took counters this device needs, when it no longer fits."""
    pool = f"{device.id.driver}/{device.id.pool}"
    for consumption in device.device.consumes_counters:
        for counter, needed in consumption.counters.items():
            remaining = left.get((pool, consumption.counter_set, counter))
            if remaining is not None and remaining < needed:
                return _holder_of(pool, consumption.counter_set, holders, node)
    return None


def _holder_of(
    pool: str, counter_set: str, holders: Mapping[DeviceID, Reservation], node: NodeInventory
) -> Reservation | None:
    for other in node.devices:
        same_pool = f"{other.id.driver}/{other.id.pool}" == pool
        shares = any(c.counter_set == counter_set for c in other.device.consumes_counters)
        if other.id in holders and same_pool and shares:
            return holders[other.id]
    return None
