"""Inventory views -> `gpualloc.inventory.v1` messages (what GetInventory and watches send).

A node's message is built once per `NodeView` and kept, serialized, in the view's memo: every
watcher and every GetInventory of an unchanged node reuses it, and a changed node re-encodes only
the parts that changed (`_PartBytes`). The allocator side reads the messages back with
`slices_from_pb_node` / `slices_from_pb_cluster_pool`, so the wire format of "one node's slices"
is defined here once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime

from google.protobuf import timestamp_pb2
from google.protobuf.message import Message

from protos.common.v1 import dra_pb2, topology_pb2
from protos.inventory.v1 import inventory_pb2
from services.common.dra.model import CounterSet, Device, DeviceID, ResourceSlice
from services.common.pb._base import quantities_to_pb
from services.common.pb.dra_mapping import (
    from_pb_resource_slice,
    to_pb_device,
    to_pb_device_id,
    to_pb_device_taint,
    to_pb_node,
    to_pb_resource_slice,
)
from services.inventory.core.report import TopologyLevel
from services.inventory.core.state import CLUSTER_SCOPE, InventoryState, PoolStatus
from services.inventory.core.topology_view import NodeTopology
from services.inventory.core.view import DeviceSource, NodeView

__all__ = [
    "slices_from_pb_cluster_pool",
    "slices_from_pb_node",
    "to_pb_cluster_pools",
    "node_bytes",
    "to_pb_device_ids",
    "to_pb_device_taints",
    "to_pb_inventory_node",
    "to_pb_node_topology",
    "to_pb_pool_status",
    "to_pb_snapshot",
    "to_pb_view",
]

_SOURCES = {
    DeviceSource.RESOURCE_SLICE: inventory_pb2.DEVICE_SOURCE_RESOURCE_SLICE,
    DeviceSource.NODE_REPORT: inventory_pb2.DEVICE_SOURCE_NODE_REPORT,
}
_RELATIONS = {
    TopologyLevel.PIX: topology_pb2.PCIE_RELATION_PIX,
    TopologyLevel.PXB: topology_pb2.PCIE_RELATION_PXB,
    TopologyLevel.PHB: topology_pb2.PCIE_RELATION_PHB,
    TopologyLevel.NODE: topology_pb2.PCIE_RELATION_NODE,
    TopologyLevel.SYS: topology_pb2.PCIE_RELATION_SYS,
}
_MEMO_KEY = "pb"


def to_pb_pool_status(status: PoolStatus) -> inventory_pb2.PoolStatus:
    return inventory_pb2.PoolStatus(
        driver=status.driver,
        pool=status.pool,
        generation=status.generation,
        resource_slice_count=status.resource_slice_count,
        slices_present=status.slices,
        complete=status.complete,
    )


class _PartBytes:
    """Serialized parts (Device, NodeTopology messages) of each node's last built view.

    A report usually changes one device of a node (or none: labels, liveness); the other
    devices and the topology are the very same immutable objects as before, or equal ones
    (devices the inventory synthesizes anew from each report), so their encoding is reused.
    Parts are found by identity first, then by name and equality; entries hold the object, so
    an id is never mistaken for another's. Each node keeps only the parts of its latest view,
    which bounds the memory to the live devices."""

    def __init__(self) -> None:
        self._by_node: dict[str, _Parts] = {}

    def encoder(self, node: str) -> Callable[[object, str, Callable[[], Message]], bytes]:
        previous = self._by_node.get(node) or _Parts()
        current = _Parts()
        self._by_node[node] = current

        def encode(part: object, name: str, to_pb: Callable[[], Message]) -> bytes:
            entry = current.find(part, name) or previous.find(part, name)
            if entry is None:
                entry = (part, to_pb().SerializeToString())
            current.add(entry, name)
            return entry[1]

        return encode


class _Parts:
    def __init__(self) -> None:
        self.by_id: dict[int, tuple[object, bytes]] = {}
        self.by_name: dict[str, list[tuple[object, bytes]]] = {}

    def find(self, part: object, name: str) -> tuple[object, bytes] | None:
        entry = self.by_id.get(id(part))
        if entry is not None and entry[0] is part:
            return entry
        return next((e for e in self.by_name.get(name, ()) if e[0] == part), None)

    def add(self, entry: tuple[object, bytes], name: str) -> None:
        if id(entry[0]) not in self.by_id:
            self.by_id[id(entry[0])] = entry
            self.by_name.setdefault(name, []).append(entry)


_PART_BYTES = _PartBytes()


def node_bytes(view: NodeView) -> bytes:
    """The node's InventoryNode message (slices included), serialized once per view and kept
    in the view's memo: every watcher and every GetInventory of an unchanged node reuses it."""
    cached = view.memo.get(_MEMO_KEY)
    if isinstance(cached, bytes):
        return cached
    encoded = _build_node(view).SerializeToString()
    view.memo[_MEMO_KEY] = encoded
    return encoded


def to_pb_view(view: NodeView, *, include_slices: bool = False) -> inventory_pb2.InventoryNode:
    """A new message of the node (the caller owns it)."""
    message = inventory_pb2.InventoryNode.FromString(node_bytes(view))
    if not include_slices:
        message.ClearField("slices")
    return message


def _build_node(view: NodeView) -> inventory_pb2.InventoryNode:
    encode = _PART_BYTES.encoder(view.name)

    known: dict[int, bytes] = {}  # the slices repeat view.devices' Device objects

    def device_bytes(device: Device) -> bytes:
        encoded = known.get(id(device))
        if encoded is None:
            encoded = encode(device, device.name, lambda: to_pb_device(device))
            known[id(device)] = encoded
        return encoded

    message = inventory_pb2.InventoryNode(node=to_pb_node(view.node))
    for d in view.devices:
        entry = message.devices.add(
            driver=d.id.driver,
            pool=d.id.pool,
            pool_generation=d.pool_generation,
            source=_SOURCES[d.source],
            gpu_uuid=d.gpu_uuid or "",
        )
        entry.device.MergeFromString(device_bytes(d.device))
    message.counter_sets.extend(
        inventory_pb2.NodeCounterSet(
            driver=c.driver, pool=c.pool, counter_set=_counter_set_to_pb(c.counter_set)
        )
        for c in view.counter_sets
    )
    message.pools.extend(to_pb_pool_status(p) for p in view.pools)
    topology = view.topology
    if topology is not None:
        message.topology.MergeFromString(
            encode(topology, "", lambda: to_pb_node_topology(topology))
        )
    if view.reported_at is not None:
        stamp = _timestamp(view.reported_at)
        if stamp is not None:
            message.reported_at.CopyFrom(stamp)
    for resource_slice in view.slices:
        slice_message = message.slices.add()
        slice_message.CopyFrom(to_pb_resource_slice(replace(resource_slice, devices=())))
        for device in resource_slice.devices:
            slice_message.devices.add().MergeFromString(device_bytes(device))
    return message


def _timestamp(text: str) -> timestamp_pb2.Timestamp | None:
    """RFC 3339 text (a zone-less time counts as UTC, as nvidia-smi's local times are sent)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def to_pb_node_topology(topology: NodeTopology) -> topology_pb2.NodeTopology:
    message = topology_pb2.NodeTopology(
        nvlink=[topology_pb2.NvlinkEdge(a=e.a, b=e.b, links=e.links) for e in topology.nvlink],
        pcie=[
            topology_pb2.PcieEdge(a=e.a, b=e.b, relation=_RELATIONS[e.relation])
            for e in topology.pcie
            if e.relation in _RELATIONS
        ],
        numa=[
            topology_pb2.NumaNode(id=n.id, cpus=n.cpus, gpus=n.gpus, nics=n.nics)
            for n in topology.numa
        ],
        nics=[
            topology_pb2.TopologyNic(name=n.name, pci_bus_id=n.pci_bus_id or "")
            for n in topology.nics
        ],
    )
    for gpu in topology.gpus:
        entry = message.gpus.add(
            uuid=gpu.uuid,
            partitions=[to_pb_device_id(p) for p in gpu.partitions],
            pci_bus_id=gpu.pci_bus_id,
            pcie_root=gpu.pcie_root or "",
            cpu_affinity=gpu.cpu_affinity,
        )
        if gpu.device is not None:
            entry.device.CopyFrom(to_pb_device_id(gpu.device))
        if gpu.numa_node is not None:
            entry.numa_node = gpu.numa_node
    return message


def to_pb_device_taints(view: NodeView) -> list[inventory_pb2.DeviceTaints]:
    return [
        inventory_pb2.DeviceTaints(
            device=to_pb_device_id(device_id), taints=[to_pb_device_taint(t) for t in taints]
        )
        for device_id, taints in view.taints
    ]


def to_pb_device_ids(ids: Iterable[DeviceID]) -> list[dra_pb2.DeviceID]:
    return [to_pb_device_id(i) for i in ids]


def to_pb_inventory_node(
    state: InventoryState, node_name: str, *, include_slices: bool = False
) -> inventory_pb2.InventoryNode:
    """A copy of the node's message (safe to modify); an empty node when the key is unknown."""
    view = state.view(node_name)
    if view is None:
        return inventory_pb2.InventoryNode(node=dra_pb2.Node(name=node_name))
    return to_pb_view(view, include_slices=include_slices)


def _counter_set_to_pb(counter_set: CounterSet) -> dra_pb2.CounterSet:
    return dra_pb2.CounterSet(
        name=counter_set.name, counters=quantities_to_pb(counter_set.counters)
    )


def to_pb_cluster_pools(state: InventoryState) -> list[inventory_pb2.ClusterPool]:
    by_pool: dict[tuple[str, str], list[ResourceSlice]] = {}
    for resource_slice in state.slices_of(CLUSTER_SCOPE):
        by_pool.setdefault((resource_slice.driver, resource_slice.pool.name), []).append(
            resource_slice
        )
    pools = []
    for (driver, pool), members in sorted(by_pool.items()):
        newest = max(s.pool.generation for s in members)
        pools.append(
            inventory_pb2.ClusterPool(
                driver=driver,
                pool=pool,
                generation=newest,
                slices=[to_pb_resource_slice(s) for s in members if s.pool.generation == newest],
            )
        )
    return pools


def to_pb_snapshot(
    state: InventoryState, *, node_names: Iterable[str] | None = None, include_slices: bool = False
) -> inventory_pb2.InventorySnapshot:
    names = sorted(node_names if node_names is not None else state.node_keys() - {CLUSTER_SCOPE})
    snapshot = inventory_pb2.InventorySnapshot(
        generation=state.generation,
        cluster_pools=to_pb_cluster_pools(state) if node_names is None else [],
    )
    for name in names:
        view = state.view(name)
        if view is not None:
            node = snapshot.nodes.add()
            node.MergeFromString(node_bytes(view))
            if not include_slices:
                node.ClearField("slices")
    return snapshot


def slices_from_pb_node(message: inventory_pb2.InventoryNode) -> tuple[ResourceSlice, ...]:
    return tuple(from_pb_resource_slice(s, f"slices[{i}]") for i, s in enumerate(message.slices))


def slices_from_pb_cluster_pool(message: inventory_pb2.ClusterPool) -> tuple[ResourceSlice, ...]:
    return tuple(from_pb_resource_slice(s, f"slices[{i}]") for i, s in enumerate(message.slices))
