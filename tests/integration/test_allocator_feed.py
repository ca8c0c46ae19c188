"""The allocator following a real inventory server over WatchInventory.

Snapshot, deltas, deletes; the inventory going away (the allocator keeps its view and says it
is disconnected) and coming back empty on the same port (a RESET replaces the view).
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from protos.inventory.v1 import inventory_pb2, inventory_pb2_grpc
from services.allocator.adapters.inventory.watch_client import InventoryClient
from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.app.cluster_view import ClusterView
from services.allocator.app.inventory_feed import InventoryUpdate
from services.allocator.config import AllocatorSettings
from services.common.config import ServerSettings
from services.common.dra.model import ResourceSlice
from services.common.dra.parse import load_objects
from services.common.grpc_server import ServiceRegistration, create_server
from services.inventory.adapters.grpc.servicer import SERVICE_NAME, InventoryServicer
from services.inventory.bootstrap import InventoryApp, build_inventory, seed_inventory
from tests.e2e.allocator_harness import allocate_request, serve_allocator

CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "cluster"


def _apply(stub, *files: str) -> int:
    manifest = "\n---\n".join((CLUSTER / f).read_text() for f in files)
    request = inventory_pb2.ApplyResourceSlicesRequest(manifest=manifest)
    return int(stub.ApplyResourceSlices(request, timeout=10).generation)


def _until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


class Inventory:
    """An inventory server that can be stopped and started again on the same port."""

    server: grpc.Server
    app: InventoryApp

    def __init__(self) -> None:
        self.port = 0
        self.start()

    def start(self) -> None:
        self.app = build_inventory()
        self.server, self.port = create_server(
            f"127.0.0.1:{self.port}", [self.app.registration], ServerSettings()
        )
        self.server.start()

    def stop(self) -> None:
        self.app.service.close()
        self.server.stop(None).wait()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def inventory(grpc_channel_factory):
    served = Inventory()
    yield served, inventory_pb2_grpc.InventoryStub(grpc_channel_factory.channel(served.target))
    served.stop()


@pytest.fixture
def following(inventory):
    served, _ = inventory
    view = ClusterView(min_interval=0.01)
    client = InventoryClient(served.target, initial_backoff=0.05, max_backoff=0.2)
    client.follow(view.apply)
    yield view, client
    client.close()
    view.close()


def _nodes(view: ClusterView) -> list[str]:
    current = view.current()
    if current is None:
        return []
    return [v.name for v in current.snapshot.views() if v.name and v.device_count]


def test_snapshot_then_deltas_then_a_delete_reach_the_view(inventory, following):
    _, stub = inventory
    view, client = following
    generation = _apply(stub, "h100-node-1.yaml")
    view.require(generation, timeout=10)
    assert _nodes(view) == ["h100-node-1"]
    generation = _apply(stub, "a100-mig-node.yaml", "l40s-node.yaml")
    view.require(generation, timeout=10)
    assert _nodes(view) == ["a100-node-1", "h100-node-1", "l40s-node-1"]
    deleted = stub.DeleteResourceSlices(
        inventory_pb2.DeleteResourceSlicesRequest(node_name="l40s-node-1"), timeout=10
    ).generation
    view.require(deleted, timeout=10)
    assert _nodes(view) == ["a100-node-1", "h100-node-1"]
    assert client.status().connected


def test_an_inventory_outage_keeps_the_view_and_a_restart_resets_it(inventory, following):
    served, stub = inventory
    view, client = following
    view.require(_apply(stub, "h100-node-1.yaml", "h100-node-2.yaml"), timeout=10)
    served.stop()
    _until(lambda: not client.status().connected)  # the channel state may lead the error
    _until(lambda: bool(client.status().last_error))  # why it broke, for logs and metrics
    assert _nodes(view) == ["h100-node-1", "h100-node-2"]  # still serving the last view
    served.start()  # same port, empty state at generation 0: older than ours, so a RESET
    _until(lambda: client.status().connected)
    _until(lambda: _nodes(view) == [])
    _apply(stub, "l40s-node.yaml")  # the test's channel reconnects too
    _until(lambda: _nodes(view) == ["l40s-node-1"])
    assert client.status().reconnects >= 1


def test_allocate_waits_for_the_generation_an_apply_returned(inventory, grpc_channel_factory):
    served_inventory, stub = inventory
    _apply(stub, "l40s-node.yaml")
    client = InventoryClient(served_inventory.target, initial_backoff=0.05)
    served = serve_allocator(
        grpc_channel_factory,
        MemoryReservationStore(),
        settings=AllocatorSettings(reindex_interval=0.2),
        feed=client,
    )
    try:
        generation = _apply(stub, "h100-node-1.yaml")
        response = served.stub.Allocate(
            allocate_request("one-h100", min_inventory_generation=generation), timeout=10
        )
        assert response.outcome == pb.OUTCOME_ALLOCATED
        assert response.inventory_generation >= generation
    finally:
        served.app.close()
        client.close()


def test_a_snapshot_in_parts_replaces_the_view_once_whole(grpc_channel_factory):
    """Big inventories send SNAPSHOT in parts (`more`); applying each part as a reset would
    leave the allocator seeing only the last part's nodes."""
    app = build_inventory()
    seed_inventory(app.service, [str(CLUSTER)])
    small_parts = InventoryServicer(app.service, heartbeat_seconds=None, snapshot_part_bytes=1)
    served = grpc_channel_factory(
        [
            ServiceRegistration(
                SERVICE_NAME, inventory_pb2_grpc.add_InventoryServicer_to_server, small_parts
            )
        ]
    )
    stub = inventory_pb2_grpc.InventoryStub(served.channel)
    parts = []
    for event in stub.WatchInventory(inventory_pb2.WatchInventoryRequest(), timeout=10):
        parts.append(event)
        if not event.more:
            break
    assert len(parts) == 4  # one node per part at this size
    seen: list[InventoryUpdate] = []
    view = ClusterView(min_interval=0.01)
    client = InventoryClient(served.target, initial_backoff=0.05, max_backoff=0.2)
    try:

        def record(update: InventoryUpdate) -> None:
            seen.append(update)
            view.apply(update)

        client.follow(record)
        _until(lambda: _nodes(view) != [])
        assert _nodes(view) == ["a100-node-1", "h100-node-1", "h100-node-2", "l40s-node-1"]
        assert [u.reset for u in seen] == [True]
    finally:
        client.close()
        view.close()
        app.close()


def test_a_restarted_inventory_at_the_same_generation_still_resets_the_view(inventory):
    """Generations restart at 0 with a fresh inventory; a watcher that resumed by number alone
    would take the new run's generation 2 for the old one and keep a stale view."""
    served, stub = inventory
    view = ClusterView(min_interval=0.01)
    client = InventoryClient(served.target, initial_backoff=1.0, max_backoff=1.0)
    client.follow(view.apply)
    try:
        _apply(stub, "h100-node-1.yaml")
        view.require(_apply(stub, "h100-node-2.yaml"), timeout=10)
        assert _nodes(view) == ["h100-node-1", "h100-node-2"]
        served.stop()
        _until(lambda: not client.status().connected)
        served.start()  # a new run: apply two changes before the client is back (>= 0.5 s)
        for name in ("l40s-node.yaml", "a100-mig-node.yaml"):
            manifest = (CLUSTER / name).read_text()
            served.app.service.apply(
                [o for o in load_objects(manifest) if isinstance(o, ResourceSlice)]
            )
        assert served.app.service.generation == 2
        _until(lambda: _nodes(view) == ["a100-node-1", "l40s-node-1"])
    finally:
        client.close()
        view.close()
