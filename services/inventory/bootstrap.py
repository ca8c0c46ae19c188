"""Composition root of the inventory: settings -> repository -> service -> gRPC registration.

No I/O at import; `build_inventory` connects (Redis) and loads the saved state;
`start_kube_watch` starts mirroring the cluster's ResourceSlices when GPUALLOC_KUBE_WATCH asks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from protos.inventory.v1 import inventory_pb2_grpc
from services.common.dra.limits import DocumentLimits
from services.common.dra.model import Node, ResourceSlice
from services.common.gc_policy import GcPolicy
from services.common.grpc_server import ServiceRegistration
from services.common.health import Health
from services.common.manifests import load_manifests
from services.inventory.adapters.grpc.servicer import ACCESS, SERVICE_NAME, InventoryServicer
from services.inventory.adapters.sources.kube_slices import (
    KubeSliceWatch,
    ResourceSliceApi,
    api_client_from_settings,
)
from services.inventory.adapters.store.embedded import EmbeddedInventoryRepository
from services.inventory.adapters.store.redis_repository import RedisInventoryRepository
from services.inventory.app.service import InventoryService
from services.inventory.cli.inputs import read_inputs
from services.inventory.config import InventorySettings
from services.inventory.core.checks import MAX_OBJECTS_PER_APPLY
from services.inventory.core.repository import InventoryRepository
from services.inventory.core.state import refresh_observed

log = logging.getLogger("gpualloc.inventory")

__all__ = [
    "KUBE_WATCH_HEALTH_NAME",
    "InventoryApp",
    "build_inventory",
    "build_repository",
    "seed_inventory",
    "start_kube_watch",
]

# SERVING once the cluster's ResourceSlices are listed and while the watch runs without failing.
KUBE_WATCH_HEALTH_NAME = f"{SERVICE_NAME}/resourceslices"


@dataclass(frozen=True)
class InventoryApp:
    service: InventoryService
    registration: ServiceRegistration
    gc_policy: GcPolicy | None = None
    restored_slices: frozenset[str] = frozenset()  # slice names loaded from the repository
    background: list[Callable[[], None]] = field(default_factory=list, compare=False)  # close()

    def close(self) -> None:
        """Stop the background inputs (the Kubernetes watch), the service (sweeper, watches,
        repository) and the GC policy."""
        for stop in self.background:
            stop()
        self.service.close()
        if self.gc_policy is not None:
            self.gc_policy.stop()


def build_repository(settings: InventorySettings) -> InventoryRepository:
    """Redis when GPUALLOC_REDIS_URL is set, else embedded (with the snapshot file, if any)."""
    if settings.redis_url:
        return RedisInventoryRepository(
            settings.redis_url,
            socket_timeout=settings.redis_timeout,
            wait_replicas=settings.redis_wait_replicas,
            wait_timeout=settings.redis_wait_timeout,
        )
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
    and the GC policy (services/common/gc_policy.py) start (unless `sweep` is false). Without,
    an in-memory service (tests)."""
    gc_policy = None
    restored: frozenset[str] = frozenset()
    if service is None and settings is not None:
        repository = repository or build_repository(settings)
        state = repository.load()
        if state is not None:
            state = refresh_observed(state, time.time())
            restored = frozenset(state.slice_keys)
        service = InventoryService(
            state,
            repository=repository,
            report_ttl=settings.report_ttl,
            max_nodes=settings.max_nodes,
        )
        if sweep:
            service.start_sweeper(settings.sweep_interval)
            gc_policy = GcPolicy(name="inventory-gc").start()
    service = service or InventoryService()
    if settings is None:
        servicer = InventoryServicer(service, heartbeat_seconds=None)
    else:
        servicer = InventoryServicer(
            service,
            heartbeat_seconds=settings.watch_heartbeat,
            watch_min_interval=settings.watch_min_interval,
            document_limits=settings.documents,
        )
    registration = ServiceRegistration(
        SERVICE_NAME, inventory_pb2_grpc.add_InventoryServicer_to_server, servicer, ACCESS
    )
    return InventoryApp(service, registration, gc_policy, restored)


def start_kube_watch(
    app: InventoryApp,
    settings: InventorySettings,
    health: Health | None = None,
    seeded: Iterable[str] = (),
) -> KubeSliceWatch | None:
    """With GPUALLOC_KUBE_WATCH on, mirror the cluster's ResourceSlices into `app.service`
    (adapters/sources/kube_slices.py) until `app.close()`. It owns the slices the app restored from
    its repository, except those `seeded` (GPUALLOC_SEED applies them again at every start: they
    are not the cluster's unless it publishes the same names). Raises InvalidArgument or
    FailedPrecondition when the client or its configuration
    cannot be loaded; the API server itself is only contacted by the watch's thread."""
    if settings.kube_watch == "off":
        return None
    api_client = api_client_from_settings(
        settings.kube_watch, settings.kubeconfig, settings.kube_context
    )

    def on_serving(serving: bool) -> None:
        if health is not None:
            if serving:
                health.set_serving(KUBE_WATCH_HEALTH_NAME)
            else:
                health.set_not_serving(KUBE_WATCH_HEALTH_NAME)

    adopted = app.restored_slices - frozenset(seeded)
    watch = KubeSliceWatch(
        app.service, ResourceSliceApi(api_client), adopt=adopted, on_serving=on_serving
    )
    app.background.append(watch.stop)
    log.info(
        "watching the cluster's ResourceSlices (%s, %d restored slices adopted)",
        settings.kube_watch,
        len(adopted),
    )
    return watch.start()


def seed_inventory(
    service: InventoryService,
    paths: list[str] | tuple[str, ...],
    limits: DocumentLimits | None = None,
) -> list[str]:
    """Apply the ResourceSlices and Nodes found in `paths` (other kinds are skipped: a seed
    directory may hold DeviceClasses and claims too), in as few generations as the request size
    limit allows; each file within `limits`. Returns the slices' names."""
    objects = load_manifests(paths, limits=limits)
    nodes = [o for o in objects if isinstance(o, Node)]
    slices = [o for o in objects if isinstance(o, ResourceSlice)]
    for start in range(0, max(len(nodes), 1), MAX_OBJECTS_PER_APPLY):
        service.apply((), nodes[start : start + MAX_OBJECTS_PER_APPLY])
    for start in range(0, len(slices), MAX_OBJECTS_PER_APPLY):
        service.apply(slices[start : start + MAX_OBJECTS_PER_APPLY])
    return [s.name for s in slices]


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
