"""gpualloc.inventory.v1.Inventory over the InventoryService: translate, call, translate back.

No logic and no try/except for status codes here: the service raises typed errors and the
server's error interceptor maps them to status codes. `ACCESS` says what each method needs (the
auth interceptor checks it first: an agent reports only its own node); every write is an audit
event.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import grpc

from protos.inventory.v1 import inventory_pb2, inventory_pb2_grpc
from services.common.dra.limits import DocumentLimits
from services.common.dra.model import AttributeValue, Node, ResourceSlice
from services.common.dra.parse import load_objects
from services.common.dra.suggest import did_you_mean
from services.common.errors import InvalidArgument, NotFound, PermissionDenied, clip
from services.common.pb.dra_mapping import from_pb_device_attribute, from_pb_resource_slice
from services.common.security.edge import AccessRule, audit_call, current_principal, rule
from services.common.security.policy import Access
from services.common.security.principal import Permission
from services.inventory.adapters.grpc.mapping import (
    node_bytes,
    to_pb_cluster_pools,
    to_pb_device_ids,
    to_pb_device_taints,
    to_pb_pool_status,
    to_pb_snapshot,
)
from services.inventory.adapters.grpc.report_pb import GpuCache, from_pb_node_report
from services.inventory.app.service import InventoryService, WatchEvent
from services.inventory.core.state import CLUSTER_SCOPE, InventoryState
from services.inventory.core.view import NodeView, ViewDevice

__all__ = ["ACCESS", "SERVICE_NAME", "SNAPSHOT_PART_BYTES", "InventoryServicer"]

SERVICE_NAME = "gpualloc.inventory.v1.Inventory"


def _reporting(request: inventory_pb2.ReportNodeRequest) -> Access:
    return Access("", Permission.INVENTORY_REPORT_OWN, node=request.report.node_name)


_PREFIX = f"/{SERVICE_NAME}/"
ACCESS: dict[str, AccessRule] = {
    _PREFIX + "ApplyResourceSlices": rule(Permission.INVENTORY_WRITE),
    _PREFIX + "DeleteResourceSlices": rule(Permission.INVENTORY_WRITE),
    _PREFIX + "ReportNode": _reporting,
    _PREFIX + "GetInventory": rule(Permission.INVENTORY_READ),
    _PREFIX + "WatchInventory": rule(Permission.INVENTORY_READ),
}
"""What each method needs (a method missing here is denied under a policy)."""
SNAPSHOT_PART_BYTES = 4 * 2**20  # well under the default 16 MiB message limit
_CACHE_SLACK = 64  # GPU caches of deleted nodes kept before they are swept out


class InventoryServicer(inventory_pb2_grpc.InventoryServicer):
    def __init__(
        self,
        service: InventoryService,
        heartbeat_seconds: float | None = 15.0,
        snapshot_part_bytes: int = SNAPSHOT_PART_BYTES,
        watch_min_interval: float = 0.0,
        document_limits: DocumentLimits | None = None,
    ) -> None:
        self._service = service
        self._document_limits = document_limits or DocumentLimits()
        self._heartbeat_seconds = heartbeat_seconds
        self._watch_min_interval = watch_min_interval
        self._snapshot_part_bytes = snapshot_part_bytes
        self._gpu_caches: dict[str, GpuCache] = {}  # node -> its last report's decoded GPUs
        # Generations are comparable only within one run: a restarted inventory that counts
        # from 0 again must not let a watcher resume against its old numbers.
        self.incarnation = uuid.uuid4().hex

    def ApplyResourceSlices(
        self, request: inventory_pb2.ApplyResourceSlicesRequest, context: grpc.ServicerContext
    ) -> inventory_pb2.ApplyResourceSlicesResponse:
        slices = [from_pb_resource_slice(s, f"slices[{i}]") for i, s in enumerate(request.slices)]
        nodes: list[Node] = []
        if request.manifest:
            for obj in load_objects(request.manifest, "manifest", self._document_limits):
                if isinstance(obj, ResourceSlice):
                    slices.append(obj)
                elif isinstance(obj, Node):
                    nodes.append(obj)
                else:
                    raise InvalidArgument.at(
                        "manifest",
                        f"can only apply ResourceSlice and Node objects, not {type(obj).__name__}",
                    )
        result = self._service.apply(slices, nodes, dry_run=request.dry_run)
        if not request.dry_run:
            audit_call(
                context,
                "inventory.apply",
                slices=sorted(s.name for s in slices),
                nodes=sorted(n.name for n in nodes),
                generation=result.generation,
            )
        return inventory_pb2.ApplyResourceSlicesResponse(
            generation=result.generation,
            applied=result.applied,
            unchanged=result.unchanged,
            pools=[to_pb_pool_status(p) for p in result.pools],
            warnings=result.warnings,
            unchanged_nodes=result.unchanged_nodes,
        )

    def DeleteResourceSlices(
        self, request: inventory_pb2.DeleteResourceSlicesRequest, context: grpc.ServicerContext
    ) -> inventory_pb2.DeleteResourceSlicesResponse:
        if request.pool and not request.driver:
            raise InvalidArgument.at("driver", "required when pool is set")
        state = self._service.snapshot()
        names = set(request.names)
        if request.driver or request.node_name:
            names |= {
                s.name
                for s in state.slices.values()
                if (not request.driver or s.driver == request.driver)
                and (not request.pool or s.pool.name == request.pool)
                and (not request.node_name or s.node_name == request.node_name)
            }
        if request.allow_missing:
            names &= set(state.slice_keys)
        generation = self._service.delete_slices(sorted(names))
        audit_call(context, "inventory.delete", slices=sorted(names), generation=generation)
        return inventory_pb2.DeleteResourceSlicesResponse(
            generation=generation, deleted=sorted(names)
        )

    def ReportNode(
        self, request: inventory_pb2.ReportNodeRequest, context: grpc.ServicerContext
    ) -> inventory_pb2.ReportNodeResponse:
        if not request.HasField("report"):
            raise InvalidArgument.at("report", "required")
        principal = current_principal(context)
        most = principal.max_reported_gpus
        if most is not None and len(request.report.gpus) > most:
            raise PermissionDenied(
                f"node {request.report.node_name}: {len(request.report.gpus)} GPUs reported, "
                f"this agent may report at most {most} (its binding's reportedGpus)"
            )
        cache = self._gpu_caches.get(request.report.node_name) or GpuCache()
        try:
            report = from_pb_node_report(request.report, cache)
        except ValueError as error:
            raise InvalidArgument.at("report", str(error)) from None
        result = self._service.report(report, published_only=principal.published_gpus_only)
        self._remember(request.report.node_name, cache)
        view = result.view
        audit_call(
            context,
            "inventory.report",
            node=request.report.node_name,
            gpus=len(request.report.gpus),
            tainted_devices=len(view.taints),
            generation=result.generation,
        )
        return inventory_pb2.ReportNodeResponse(
            generation=result.generation,
            matched_devices=to_pb_device_ids(view.matched),
            synthesized_devices=to_pb_device_ids(view.synthesized),
            taints=to_pb_device_taints(view),
            warnings=view.warnings,
            unchanged=result.unchanged,
        )

    def _remember(self, node: str, cache: GpuCache) -> None:
        """Keep the cache of a node whose report was accepted; when nodes were deleted since,
        drop theirs, so the caches never outnumber the (bounded) nodes by much."""
        self._gpu_caches[node] = cache
        state = self._service.snapshot()
        if len(self._gpu_caches) > state.node_count + _CACHE_SLACK:
            kept = state.entries
            self._gpu_caches = {n: c for n, c in self._gpu_caches.items() if n in kept}

    def GetInventory(
        self, request: inventory_pb2.GetInventoryRequest, context: grpc.ServicerContext
    ) -> inventory_pb2.GetInventoryResponse:
        state = self._service.snapshot()
        filters = {
            f.name: from_pb_device_attribute(f.value, f"attributes[{i}].value")
            for i, f in enumerate(request.attributes)
        }
        if request.node_name and state.view(request.node_name) is None:
            known = state.node_keys() - {CLUSTER_SCOPE}
            raise NotFound(
                f"node {clip(request.node_name)} is not in the inventory"
                + did_you_mean(request.node_name, known)
            )
        whole = not request.node_name and not request.driver and not filters
        if whole:
            snapshot = to_pb_snapshot(state, include_slices=request.include_slices)
        else:
            snapshot = _filtered(state, request, filters)
        if request.omit_topology:
            for node in snapshot.nodes:
                node.ClearField("topology")
        return inventory_pb2.GetInventoryResponse(inventory=snapshot)

    def WatchInventory(
        self, request: inventory_pb2.WatchInventoryRequest, context: grpc.ServicerContext
    ) -> Iterator[inventory_pb2.WatchInventoryResponse]:
        since = request.since_generation if request.since_generation > 0 else -1
        if request.incarnation and request.incarnation != self.incarnation:
            since = -1  # numbered by another run of the inventory: start over
        first = True
        pools: set[tuple[str, str]] = set()  # cluster pools this stream has sent
        if since > 0:
            pools = {(p.driver, p.pool) for p in to_pb_cluster_pools(self._service.snapshot())}
        for event in self._service.watch(
            since,
            wait_seconds=1.0,
            heartbeat_seconds=self._heartbeat_seconds,
            min_interval=self._watch_min_interval,
            is_active=context.is_active,
        ):
            for response in _watch_responses(
                event, first=first, pools=pools, part_bytes=self._snapshot_part_bytes
            ):
                response.incarnation = self.incarnation
                yield response
            first = False


# --- GetInventory filters --------------------------------------------------------------------


def _filtered(
    state: InventoryState,
    request: inventory_pb2.GetInventoryRequest,
    filters: dict[str, AttributeValue],
) -> inventory_pb2.InventorySnapshot:
    snapshot = inventory_pb2.InventorySnapshot(generation=state.generation)
    keys = [request.node_name] if request.node_name else sorted(state.node_keys())
    for key in keys:
        view = state.view(key)
        if key == CLUSTER_SCOPE or view is None:
            continue
        kept = [
            d
            for d in view.devices
            if (not request.driver or d.id.driver == request.driver)
            and all(_attribute_matches(d, name, value) for name, value in filters.items())
        ]
        if (request.driver or filters) and not kept:
            continue
        node = snapshot.nodes.add()
        node.MergeFromString(node_bytes(view))
        if not request.include_slices:
            node.ClearField("slices")
        if len(kept) != len(view.devices):
            _keep_devices(node, view, kept)
    return snapshot


def _keep_devices(
    node: inventory_pb2.InventoryNode, view: NodeView, kept: list[ViewDevice]
) -> None:
    wanted = {d.id for d in kept}
    copies = []
    for message, device in zip(node.devices, view.devices, strict=True):
        if device.id in wanted:
            copy = inventory_pb2.NodeDevice()
            copy.CopyFrom(message)
            copies.append(copy)
    del node.devices[:]
    node.devices.extend(copies)


def _attribute_matches(device: ViewDevice, name: str, value: AttributeValue) -> bool:
    """`name` as written in the device, or qualified by / stripped of the device's driver."""
    attributes = device.device.attributes
    domain, _, bare = name.rpartition("/")
    if not domain:
        found = attributes.get(name) or attributes.get(f"{device.id.driver}/{name}")
    else:
        found = attributes.get(name) or (
            attributes.get(bare) if domain == device.id.driver else None
        )
    return found == value


# --- WatchInventory --------------------------------------------------------------------------


def _watch_responses(
    event: WatchEvent, *, first: bool, pools: set[tuple[str, str]], part_bytes: int
) -> Iterator[inventory_pb2.WatchInventoryResponse]:
    """The event as messages (a large snapshot in parts); `pools` (the cluster pools the
    receiver holds) is updated, so that a pool that disappears is sent as deleted."""
    state = event.state
    if event.heartbeat:
        yield inventory_pb2.WatchInventoryResponse(
            type=inventory_pb2.WATCH_EVENT_TYPE_HEARTBEAT, generation=state.generation
        )
    elif event.reset:
        kind = (
            inventory_pb2.WATCH_EVENT_TYPE_SNAPSHOT
            if first
            else inventory_pb2.WATCH_EVENT_TYPE_RESET
        )
        cluster_pools = to_pb_cluster_pools(state)
        pools.clear()
        pools.update((p.driver, p.pool) for p in cluster_pools)
        parts = _snapshot_parts(state, cluster_pools, part_bytes)
        for index, snapshot in enumerate(parts):
            yield inventory_pb2.WatchInventoryResponse(
                type=kind,
                generation=state.generation,
                snapshot=snapshot,
                more=index < len(parts) - 1,
            )
    else:
        yield inventory_pb2.WatchInventoryResponse(
            type=inventory_pb2.WATCH_EVENT_TYPE_DELTA,
            generation=state.generation,
            delta=_delta(state, event.nodes, pools),
        )


def _snapshot_parts(
    state: InventoryState, cluster_pools: list[inventory_pb2.ClusterPool], part_bytes: int
) -> list[inventory_pb2.InventorySnapshot]:
    """Every node with its effective slices, in parts of about `part_bytes` (at least one node
    each); the cluster pools go in the first part."""
    parts = [inventory_pb2.InventorySnapshot(generation=state.generation)]
    parts[0].cluster_pools.extend(cluster_pools)
    size = parts[0].ByteSize()
    for key in sorted(state.node_keys() - {CLUSTER_SCOPE}):
        view = state.view(key)
        if view is None:
            continue
        encoded = node_bytes(view)
        if size + len(encoded) > part_bytes and len(parts[-1].nodes) > 0:
            parts.append(inventory_pb2.InventorySnapshot(generation=state.generation))
            size = 0
        parts[-1].nodes.add().MergeFromString(encoded)
        size += len(encoded)
    return parts


def _delta(
    state: InventoryState, nodes: frozenset[str], pools: set[tuple[str, str]]
) -> inventory_pb2.InventoryDelta:
    delta = inventory_pb2.InventoryDelta()
    for name in sorted(nodes):
        if name == CLUSTER_SCOPE:
            continue
        view = state.view(name)
        if view is not None:
            delta.upserted_nodes.add().MergeFromString(node_bytes(view))
        else:
            delta.deleted_nodes.append(name)
    if CLUSTER_SCOPE in nodes:
        current = to_pb_cluster_pools(state)
        delta.upserted_cluster_pools.extend(current)
        now = {(p.driver, p.pool) for p in current}
        delta.deleted_cluster_pools.extend(
            inventory_pb2.PoolRef(driver=d, pool=p) for d, p in sorted(pools - now)
        )
        pools.clear()
        pools.update(now)
    return delta
