"""Inventory state -> `gpualloc.inventory.v1` messages (the view GetInventory and watches send).

The allocator side reads the same messages back with `slices_from_pb_node` /
`slices_from_pb_cluster_pool`, so the wire format of "one node's slices" is defined here once.
"""

from __future__ import annotations

from collections.abc import Iterable

from protos.common.v1 import dra_pb2
from protos.inventory.v1 import inventory_pb2
from services.common.dra.model import CounterSet, Node, ResourceSlice
from services.common.pb._base import quantities_to_pb
from services.common.pb.dra_mapping import (
    from_pb_resource_slice,
    to_pb_device,
    to_pb_node,
    to_pb_resource_slice,
)
from services.inventory.core.state import CLUSTER_SCOPE, InventoryState, PoolStatus, pool_status

__all__ = [
    "slices_from_pb_cluster_pool",
    "slices_from_pb_node",
    "to_pb_cluster_pools",
    "to_pb_inventory_node",
    "to_pb_pool_status",
    "to_pb_snapshot",
]


def to_pb_pool_status(status: PoolStatus) -> inventory_pb2.PoolStatus:
    return inventory_pb2.PoolStatus(
        driver=status.driver,
        pool=status.pool,
        generation=status.generation,
        resource_slice_count=status.resource_slice_count,
        slices_present=status.slices,
        complete=status.complete,
    )


def to_pb_inventory_node(
    state: InventoryState, node_name: str, *, include_slices: bool = False
) -> inventory_pb2.InventoryNode:
    slices = state.slices_of(node_name)
    node = state.nodes.get(node_name) or Node(node_name)
    message = inventory_pb2.InventoryNode(node=to_pb_node(node))
    newest = {(p.driver, p.pool): p.generation for p in pool_status(slices)}
    for resource_slice in slices:
        generation = resource_slice.pool.generation
        if newest.get((resource_slice.driver, resource_slice.pool.name)) != generation:
            continue  # an older generation: the allocator ignores it, so does the view
        for device in resource_slice.devices:
            uuid = device.attributes.get("uuid")
            message.devices.append(
                inventory_pb2.NodeDevice(
                    driver=resource_slice.driver,
                    pool=resource_slice.pool.name,
                    device=to_pb_device(device),
                    pool_generation=generation,
                    source=inventory_pb2.DEVICE_SOURCE_RESOURCE_SLICE,
                    gpu_uuid=str(uuid.value) if uuid is not None else "",
                )
            )
        for counter_set in resource_slice.shared_counters:
            message.counter_sets.append(
                inventory_pb2.NodeCounterSet(
                    driver=resource_slice.driver,
                    pool=resource_slice.pool.name,
                    counter_set=_counter_set_to_pb(counter_set),
                )
            )
    message.pools.extend(to_pb_pool_status(p) for p in pool_status(slices))
    if include_slices:
        message.slices.extend(to_pb_resource_slice(s) for s in slices)
    return message


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
        pools.append(
            inventory_pb2.ClusterPool(
                driver=driver,
                pool=pool,
                generation=max(s.pool.generation for s in members),
                slices=[to_pb_resource_slice(s) for s in members],
            )
        )
    return pools


def to_pb_snapshot(
    state: InventoryState, *, node_names: Iterable[str] | None = None, include_slices: bool = False
) -> inventory_pb2.InventorySnapshot:
    names = sorted(node_names if node_names is not None else state.node_keys() - {CLUSTER_SCOPE})
    return inventory_pb2.InventorySnapshot(
        generation=state.generation,
        nodes=[to_pb_inventory_node(state, n, include_slices=include_slices) for n in names],
        cluster_pools=to_pb_cluster_pools(state) if node_names is None else [],
    )


def slices_from_pb_node(message: inventory_pb2.InventoryNode) -> tuple[ResourceSlice, ...]:
    return tuple(from_pb_resource_slice(s, f"slices[{i}]") for i, s in enumerate(message.slices))


def slices_from_pb_cluster_pool(message: inventory_pb2.ClusterPool) -> tuple[ResourceSlice, ...]:
    return tuple(from_pb_resource_slice(s, f"slices[{i}]") for i, s in enumerate(message.slices))
