"""`InventoryClient`: the inventory's GPU view as small values, for the bridges.

The Slurm bridge needs what the allocator does not return: each allocated device's `uuid`
(for CUDA_VISIBLE_DEVICES), and each node's GPUs, minor numbers and NVLink links (for
gres.conf). The audit needs every device's counter consumption and the counter totals. All of
it comes from GetInventory, read with the same deadline and retry rules as the allocator.
"""

from __future__ import annotations

import random as random_module
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import grpc

from protos.common.v1 import dra_pb2
from protos.inventory.v1 import inventory_pb2 as pb
from protos.inventory.v1 import inventory_pb2_grpc
from services.client.calls import Caller, open_channel
from services.client.config import RetryPolicy, TlsConfig
from services.common.dra.model import AttributeType, Device, DeviceID
from services.common.dra.quantity import Quantity
from services.common.errors import NotFound
from services.common.pb.dra_mapping import from_pb_device, from_pb_device_id, from_pb_quantity

__all__ = [
    "CounterTotals",
    "InventoryClient",
    "InventoryDevice",
    "NodeInventory",
    "NvLink",
    "TopologyGpu",
]


@dataclass(frozen=True)
class InventoryDevice:
    """A device local to a node, with the physical GPU it is (or is carved from)."""

    id: DeviceID
    device: Device
    gpu_uuid: str = ""

    def attribute(self, name: str) -> str | int | bool | None:
        """A bare attribute name is in the device's driver domain, as in CEL."""
        value = self.device.attributes.get(name)
        if value is None:
            value = self.device.attributes.get(f"{self.id.driver}/{name}")
        return None if value is None else value.value

    @property
    def uuid(self) -> str | None:
        """`GPU-…` or `MIG-…`; None for a MIG device that does not exist yet (dynamic MIG)."""
        value = self.device.attributes.get("uuid")
        if value is None or value.type is not AttributeType.STRING:
            return None
        return str(value.value)

    @property
    def type(self) -> str:
        return str(self.attribute("type") or "")


@dataclass(frozen=True)
class NvLink:
    """NVLinks between two GPUs of a node (by UUID)."""

    a: str
    b: str
    links: int


@dataclass(frozen=True)
class TopologyGpu:
    uuid: str
    device: DeviceID | None = None
    pci_bus_id: str = ""
    pcie_root: str = ""
    numa_node: int | None = None
    partitions: tuple[DeviceID, ...] = ()


@dataclass(frozen=True)
class CounterTotals:
    """A counter set of a node's pool with its totals (what partitionable devices share)."""

    driver: str
    pool: str
    name: str
    counters: Mapping[str, Quantity] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeInventory:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[InventoryDevice, ...] = ()
    counter_sets: tuple[CounterTotals, ...] = ()
    gpus: tuple[TopologyGpu, ...] = ()
    nvlinks: tuple[NvLink, ...] = ()

    def device(self, device_id: DeviceID) -> InventoryDevice | None:
        return next((d for d in self.devices if d.id == device_id), None)

    def nvlink_count(self, a: str, b: str) -> int:
        """Links between two GPUs (0 when not linked)."""
        for link in self.nvlinks:
            if {link.a, link.b} == {a, b}:
                return link.links
        return 0


class InventoryClient:
    """A synchronous reader of `gpualloc.inventory.v1.Inventory`; close it (or use `with`)."""

    def __init__(
        self,
        target: str,
        *,
        tls: TlsConfig | None = None,
        token_file: Path | str | None = None,
        deadline_seconds: float = 10.0,
        retry: RetryPolicy | None = None,
        channel: grpc.Channel | None = None,
        sleep: Callable[[float], None] = time.sleep,
        random: Callable[[], float] = random_module.random,
    ) -> None:
        self._owns_channel = channel is None
        self._channel = (
            channel if channel is not None else open_channel(target, tls, token_file=token_file)
        )
        self._stub = inventory_pb2_grpc.InventoryStub(self._channel)
        self._caller = Caller(
            self._channel,
            deadline_seconds=deadline_seconds,
            retry=retry or RetryPolicy(),
            sleep=sleep,
            random=random,
        )

    def close(self) -> None:
        if self._owns_channel:
            self._channel.close()

    def __enter__(self) -> InventoryClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def nodes(self, node_name: str = "", *, topology: bool = True) -> list[NodeInventory]:
        """Every node (or one), sorted by name."""
        request = pb.GetInventoryRequest(node_name=node_name, omit_topology=not topology)
        response = self._caller.call(self._stub.GetInventory, request, read=True)
        return [_node(n) for n in response.inventory.nodes]

    def node(self, node_name: str, *, topology: bool = True) -> NodeInventory | None:
        """The node, or None when the inventory does not hold it (NOT_FOUND)."""
        try:
            found = [n for n in self.nodes(node_name, topology=topology) if n.name == node_name]
        except NotFound:
            return None
        return found[0] if found else None


def _ids(messages: Iterable[dra_pb2.DeviceID]) -> tuple[DeviceID, ...]:
    return tuple(from_pb_device_id(m) for m in messages)


def _node(message: pb.InventoryNode) -> NodeInventory:
    topology = message.topology
    return NodeInventory(
        name=message.node.name,
        labels=dict(message.node.labels),
        devices=tuple(
            InventoryDevice(
                DeviceID(d.driver, d.pool, d.device.name), from_pb_device(d.device), d.gpu_uuid
            )
            for d in message.devices
        ),
        counter_sets=tuple(
            CounterTotals(
                c.driver,
                c.pool,
                c.counter_set.name,
                {k: from_pb_quantity(v) for k, v in sorted(c.counter_set.counters.items())},
            )
            for c in message.counter_sets
        ),
        gpus=tuple(
            TopologyGpu(
                uuid=g.uuid,
                device=from_pb_device_id(g.device) if g.HasField("device") else None,
                pci_bus_id=g.pci_bus_id,
                pcie_root=g.pcie_root,
                numa_node=g.numa_node if g.HasField("numa_node") else None,
                partitions=_ids(g.partitions),
            )
            for g in topology.gpus
        ),
        nvlinks=tuple(NvLink(e.a, e.b, e.links) for e in topology.nvlink),
    )
