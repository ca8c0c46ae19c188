"""Composition root of the inventory: settings -> repository -> service -> gRPC registration.

No I/O at import; `build_inventory` connects (Redis) and loads the saved state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from protos.inventory.v1 import inventory_pb2_grpc
from services.common.dra.model import Node, ResourceSlice
from services.common.grpc_server import ServiceRegistration
from services.common.manifests import load_manifests
from services.inventory.adapters.embedded_repository import EmbeddedInventoryRepository
from services.inventory.adapters.grpc_servicer import SERVICE_NAME, InventoryServicer
from services.inventory.adapters.redis_repository import RedisInventoryRepository
from services.inventory.config import InventorySettings
from services.inventory.core.checks import MAX_OBJECTS_PER_APPLY
from services.inventory.core.repository import InventoryRepository
from services.inventory.core.state import refresh_observed
from services.inventory.gc_policy import GcPolicy
from services.inventory.inputs import read_inputs
from services.inventory.service import InventoryService

__all__ = ["InventoryApp", "build_inventory", "build_repository", "seed_inventory"]


@dataclass(frozen=True)
class InventoryApp:
    service: InventoryService
    registration: ServiceRegistration
    gc_policy: GcPolicy | None = None

    def close(self) -> None:
        """Stop the service (sweeper, watches, repository) and the GC policy."""
        self.service.close()
        if self.gc_policy is not None:
            self.gc_policy.stop()


def build_repository(settings: InventorySettings) -> InventoryRepository:
    """Redis when GPUALLOC_REDIS_URL is set, else embedded (with the snapshot file, if any)."""
    if settings.redis_url:
        return RedisInventoryRepository(settings.redis_url)
    return EmbeddedInventoryRepository(settings.snapshot_path or None)


def build_inventory(
    service: InventoryService | None = None,
    settings: InventorySettings | None = None,
    *,
    repository: InventoryRepository | None = None,
    sweep: bool = True,
) -> InventoryApp:
    """The inventory app. With `settings`, the state is loaded from the repository they name
    (or `repository`), every node gets a full report TTL from now, and the staleness sweeper
    and the GC policy (gc_policy.py) start (unless `sweep` is false). Without, an in-memory
    service (tests)."""
    gc_policy = None
    if service is None and settings is not None:
        repository = repository or build_repository(settings)
        state = repository.load()
        if state is not None:
            state = refresh_observed(state, time.time())
        service = InventoryService(state, repository=repository, report_ttl=settings.report_ttl)
        if sweep:
            service.start_sweeper(settings.sweep_interval)
            gc_policy = GcPolicy().start()
    service = service or InventoryService()
    if settings is None:
        servicer = InventoryServicer(service, heartbeat_seconds=None)
    else:
        servicer = InventoryServicer(
            service,
            heartbeat_seconds=settings.watch_heartbeat,
            watch_min_interval=settings.watch_min_interval,
        )
    registration = ServiceRegistration(
        SERVICE_NAME, inventory_pb2_grpc.add_InventoryServicer_to_server, servicer
    )
    return InventoryApp(service, registration, gc_policy)


def seed_inventory(service: InventoryService, paths: list[str] | tuple[str, ...]) -> int:
    """Apply the ResourceSlices and Nodes found in `paths` (other kinds are skipped: a seed
    directory may hold DeviceClasses and claims too), in as few generations as the request size
    limit allows. Returns the number of slices."""
    objects = load_manifests(paths)
    nodes = [o for o in objects if isinstance(o, Node)]
    slices = [o for o in objects if isinstance(o, ResourceSlice)]
    for start in range(0, max(len(nodes), 1), MAX_OBJECTS_PER_APPLY):
        service.apply((), nodes[start : start + MAX_OBJECTS_PER_APPLY])
    for start in range(0, len(slices), MAX_OBJECTS_PER_APPLY):
        service.apply(slices[start : start + MAX_OBJECTS_PER_APPLY])
    return len(slices)


def seed_reports(service: InventoryService, paths: list[str] | tuple[str, ...]) -> int:
    """Apply node reports found in `paths` — nvidia-smi XML, agent JSON, and `topo -m` text named
    after a node the inventory holds (`h100-node-1.topo.txt`) — as `gpualloc apply` would.
    Returns the number of reports."""
    state = service.snapshot()

    def slices_of(node: str) -> tuple[ResourceSlice, ...]:
        view = state.view(node)
        return view.slices if view is not None else ()

    inputs = read_inputs(paths, lookup=slices_of)
    for report in inputs.reports:
        service.report(report)
    return len(inputs.reports)
