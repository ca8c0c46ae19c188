"""Composition root of the inventory: settings -> service -> gRPC registration. No I/O at import."""

from __future__ import annotations

from dataclasses import dataclass

from protos.inventory.v1 import inventory_pb2_grpc
from services.common.dra.model import Node, ResourceSlice
from services.common.grpc_server import ServiceRegistration
from services.common.manifests import load_manifests
from services.inventory.adapters.grpc_servicer import SERVICE_NAME, InventoryServicer
from services.inventory.service import InventoryService

__all__ = ["InventoryApp", "build_inventory", "seed_inventory"]


@dataclass(frozen=True)
class InventoryApp:
    service: InventoryService
    registration: ServiceRegistration


def build_inventory(service: InventoryService | None = None) -> InventoryApp:
    service = service or InventoryService()
    servicer = InventoryServicer(service)
    registration = ServiceRegistration(
        SERVICE_NAME, inventory_pb2_grpc.add_InventoryServicer_to_server, servicer
    )
    return InventoryApp(service, registration)


def seed_inventory(service: InventoryService, paths: list[str] | tuple[str, ...]) -> int:
    """Apply the ResourceSlices and Nodes found in `paths` (other kinds are skipped: a seed
    directory may hold DeviceClasses and claims too). Returns the number of slices applied."""
    objects = load_manifests(paths)
    nodes = [o for o in objects if isinstance(o, Node)]
    slices = [o for o in objects if isinstance(o, ResourceSlice)]
    if nodes:
        service.apply_nodes(nodes)
    service.apply_slices(slices)
    return len(slices)
