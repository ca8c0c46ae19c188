"""gpualloc.inventory.v1.Inventory over the InventoryService: translate, call, translate back.

No logic and no try/except here: the service raises typed errors and the server's error
interceptor maps them to status codes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import grpc

from protos.common.v1 import dra_pb2
from protos.inventory.v1 import inventory_pb2, inventory_pb2_grpc
from services.common.dra.model import AttributeValue, Node, ResourceSlice
from services.common.dra.parse import load_objects
from services.common.errors import InvalidArgument
from services.common.pb.dra_mapping import from_pb_device_attribute, from_pb_resource_slice
from services.inventory.adapters.pb_mapping import (
    to_pb_cluster_pools,
    to_pb_inventory_node,
    to_pb_pool_status,
    to_pb_snapshot,
)
from services.inventory.core.state import CLUSTER_SCOPE
from services.inventory.service import InventoryService, WatchEvent

__all__ = ["SERVICE_NAME", "InventoryServicer"]

SERVICE_NAME = "gpualloc.inventory.v1.Inventory"


class InventoryServicer(inventory_pb2_grpc.InventoryServicer):
    def __init__(self, service: InventoryService, heartbeat_seconds: float = 15.0) -> None:
        self._service = service
        self._heartbeat_seconds = heartbeat_seconds

    def ApplyResourceSlices(
        self, request: inventory_pb2.ApplyResourceSlicesRequest, context: grpc.ServicerContext
    ) -> inventory_pb2.ApplyResourceSlicesResponse:
        slices = [from_pb_resource_slice(s, f"slices[{i}]") for i, s in enumerate(request.slices)]
        nodes: list[Node] = []
        if request.manifest:
            for obj in load_objects(request.manifest, source="manifest"):
                if isinstance(obj, ResourceSlice):
                    slices.append(obj)
                elif isinstance(obj, Node):
                    nodes.append(obj)
                else:
                    raise InvalidArgument.at(
                        "manifest",
                        f"can only apply ResourceSlice and Node objects, not {type(obj).__name__}",
                    )
        if nodes and not request.dry_run:
            self._service.apply_nodes(nodes)
        result = self._service.apply_slices(slices, dry_run=request.dry_run)
        return inventory_pb2.ApplyResourceSlicesResponse(
            generation=result.generation,
            applied=result.applied,
            unchanged=result.unchanged,
            pools=[to_pb_pool_status(p) for p in result.pools],
        )

    def DeleteResourceSlices(
        self, request: inventory_pb2.DeleteResourceSlicesRequest, context: grpc.ServicerContext
    ) -> inventory_pb2.DeleteResourceSlicesResponse:
        state = self._service.snapshot()
        names = set(request.names)
        if request.driver or request.pool or request.node_name:
            names |= {
                s.name
                for s in state.slices.values()
                if (not request.driver or s.driver == request.driver)
                and (not request.pool or s.pool.name == request.pool)
                and (not request.node_name or s.node_name == request.node_name)
            }
        if request.allow_missing:
            names &= set(state.slices)
        generation = self._service.delete_slices(sorted(names))
        return inventory_pb2.DeleteResourceSlicesResponse(
            generation=generation, deleted=sorted(names)
        )

    def ReportNode(
        self, request: inventory_pb2.ReportNodeRequest, context: grpc.ServicerContext
    ) -> inventory_pb2.ReportNodeResponse:
        raise InvalidArgument.at("report", "node reports are not accepted by this inventory yet")

    def GetInventory(
        self, request: inventory_pb2.GetInventoryRequest, context: grpc.ServicerContext
    ) -> inventory_pb2.GetInventoryResponse:
        state = self._service.snapshot()
        filters = {
            f.name: from_pb_device_attribute(f.value, f"attributes[{i}].value")
            for i, f in enumerate(request.attributes)
        }
        names = sorted(state.node_keys() - {CLUSTER_SCOPE})
        if request.node_name:
            names = [n for n in names if n == request.node_name]
        snapshot = to_pb_snapshot(state, node_names=names, include_slices=request.include_slices)
        if request.driver or filters:
            kept = []
            for node in snapshot.nodes:
                devices = [
                    d
                    for d in node.devices
                    if (not request.driver or d.driver == request.driver)
                    and all(
                        _attribute_matches(d.device.attributes, name, value)
                        for name, value in filters.items()
                    )
                ]
                if devices:
                    del node.devices[:]
                    node.devices.extend(devices)
                    kept.append(node)
            del snapshot.nodes[:]
            snapshot.nodes.extend(kept)
        if request.omit_topology:
            for node in snapshot.nodes:
                node.ClearField("topology")
        return inventory_pb2.GetInventoryResponse(inventory=snapshot)

    def WatchInventory(
        self, request: inventory_pb2.WatchInventoryRequest, context: grpc.ServicerContext
    ) -> Iterator[inventory_pb2.WatchInventoryResponse]:
        since = request.since_generation if request.since_generation > 0 else -1
        first = True
        for event in self._service.watch(since, wait_seconds=1.0, is_active=context.is_active):
            yield _watch_response(event, first=first)
            first = False


def _attribute_matches(
    attributes: Mapping[str, dra_pb2.DeviceAttribute], name: str, value: AttributeValue
) -> bool:
    return name in attributes and from_pb_device_attribute(attributes[name]) == value


def _watch_response(event: WatchEvent, *, first: bool) -> inventory_pb2.WatchInventoryResponse:
    state = event.state
    if event.reset:
        kind = (
            inventory_pb2.WATCH_EVENT_TYPE_SNAPSHOT
            if first
            else inventory_pb2.WATCH_EVENT_TYPE_RESET
        )
        return inventory_pb2.WatchInventoryResponse(
            type=kind,
            generation=state.generation,
            snapshot=to_pb_snapshot(state, include_slices=True),
        )
    delta = inventory_pb2.InventoryDelta()
    live = state.node_keys()
    for name in sorted(event.nodes):
        if name == CLUSTER_SCOPE:
            continue
        if name in live:
            delta.upserted_nodes.append(to_pb_inventory_node(state, name, include_slices=True))
        else:
            delta.deleted_nodes.append(name)
    if CLUSTER_SCOPE in event.nodes:
        delta.upserted_cluster_pools.extend(to_pb_cluster_pools(state))
    return inventory_pb2.WatchInventoryResponse(
        type=inventory_pb2.WATCH_EVENT_TYPE_DELTA, generation=state.generation, delta=delta
    )
