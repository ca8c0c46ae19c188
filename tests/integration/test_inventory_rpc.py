"""The inventory over real gRPC (server on port 0): apply, get, watch, delete, bad input."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from protos.common.v1 import dra_pb2
from protos.inventory.v1 import inventory_pb2, inventory_pb2_grpc
from services.common.errors import InvalidArgument, NotFound
from services.common.grpc_errors import error_from_rpc
from services.inventory.bootstrap import build_inventory

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "cluster"
T4_SLICE = Path(__file__).resolve().parents[1] / "data" / "resourceslices"


@pytest.fixture
def inventory(grpc_channel_factory):
    app = build_inventory()
    served = grpc_channel_factory([app.registration])
    yield app, inventory_pb2_grpc.InventoryStub(served.channel)
    app.service.close()


def _manifest(name: str) -> str:
    return (EXAMPLES / name).read_text()


def test_apply_manifest_then_get_returns_nodes_devices_and_pools(inventory):
    _, stub = inventory
    applied = stub.ApplyResourceSlices(
        inventory_pb2.ApplyResourceSlicesRequest(manifest=_manifest("h100-node-1.yaml"))
    )
    assert applied.generation == 1
    assert [p.complete for p in applied.pools] == [True]
    got = stub.GetInventory(inventory_pb2.GetInventoryRequest(include_slices=True))
    assert got.inventory.generation == 1
    [node] = got.inventory.nodes
    assert node.node.name == "h100-node-1"
    assert len(node.devices) == 8
    assert {d.driver for d in node.devices} == {"gpu.nvidia.com"}
    assert len(node.slices) == 1


def test_reapplying_the_same_slices_does_not_bump_the_generation(inventory):
    _, stub = inventory
    request = inventory_pb2.ApplyResourceSlicesRequest(manifest=_manifest("l40s-node.yaml"))
    first = stub.ApplyResourceSlices(request)
    second = stub.ApplyResourceSlices(request)
    assert (first.generation, second.generation) == (1, 1)
    assert list(second.unchanged) == list(first.applied)


def test_get_inventory_filters_by_attribute(inventory):
    _, stub = inventory
    for name in ("h100-node-1.yaml", "l40s-node.yaml"):
        stub.ApplyResourceSlices(inventory_pb2.ApplyResourceSlicesRequest(manifest=_manifest(name)))
    got = stub.GetInventory(
        inventory_pb2.GetInventoryRequest(
            attributes=[
                inventory_pb2.AttributeFilter(
                    name="productName", value=dra_pb2.DeviceAttribute(string="NVIDIA L40S")
                )
            ]
        )
    )
    assert [n.node.name for n in got.inventory.nodes] == ["l40s-node-1"]
    assert len(got.inventory.nodes[0].devices) == 4


def test_watch_sends_a_snapshot_then_a_delta_per_change(inventory):
    app, stub = inventory
    stub.ApplyResourceSlices(
        inventory_pb2.ApplyResourceSlicesRequest(manifest=_manifest("h100-node-1.yaml"))
    )
    stream = stub.WatchInventory(inventory_pb2.WatchInventoryRequest(), timeout=10)
    first = next(stream)
    assert first.type == inventory_pb2.WATCH_EVENT_TYPE_SNAPSHOT
    assert [n.node.name for n in first.snapshot.nodes] == ["h100-node-1"]
    stub.ApplyResourceSlices(
        inventory_pb2.ApplyResourceSlicesRequest(manifest=_manifest("l40s-node.yaml"))
    )
    second = next(stream)
    assert second.type == inventory_pb2.WATCH_EVENT_TYPE_DELTA
    assert second.generation == 2
    assert [n.node.name for n in second.delta.upserted_nodes] == ["l40s-node-1"]
    assert len(second.delta.upserted_nodes[0].slices) == 1
    stub.DeleteResourceSlices(inventory_pb2.DeleteResourceSlicesRequest(node_name="l40s-node-1"))
    third = next(stream)
    assert list(third.delta.deleted_nodes) == ["l40s-node-1"]
    stream.cancel()


def test_watch_resumes_from_a_generation_without_a_snapshot(inventory):
    _, stub = inventory
    for name in ("h100-node-1.yaml", "l40s-node.yaml"):
        stub.ApplyResourceSlices(inventory_pb2.ApplyResourceSlicesRequest(manifest=_manifest(name)))
    stream = stub.WatchInventory(
        inventory_pb2.WatchInventoryRequest(since_generation=1), timeout=10
    )
    event = next(stream)
    assert event.type == inventory_pb2.WATCH_EVENT_TYPE_DELTA
    assert [n.node.name for n in event.delta.upserted_nodes] == ["l40s-node-1"]
    stream.cancel()


@pytest.mark.parametrize(
    ("manifest", "path_fragment"),
    [
        pytest.param(
            "kind: ResourceSlice\napiVersion: resource.k8s.io/v1\nmetadata: {name: x}\n"
            "spec: {driver: gpu.nvidia.com, nodeName: n, pool: {name: p, generation: 1, "
            "resourceSliceCount: 1}, devices: [{name: gpu-0, capacity: {memory: {value: 1XB}}}]}",
            'spec.devices[0].capacity["memory"].value',
            id="bad-quantity",
        ),
        pytest.param("kind: Pod\napiVersion: v1\nmetadata: {name: x}\n", "kind", id="unknown-kind"),
        pytest.param("spec: [unclosed\n", "manifest", id="malformed-yaml"),
    ],
)
def test_bad_manifests_are_invalid_argument_and_nothing_is_applied(
    inventory, manifest, path_fragment
):
    app, stub = inventory
    with pytest.raises(grpc.RpcError) as info:
        stub.ApplyResourceSlices(inventory_pb2.ApplyResourceSlicesRequest(manifest=manifest))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = error_from_rpc(info.value)
    assert isinstance(error, InvalidArgument)
    assert path_fragment in str(error)
    assert app.service.generation == 0


def test_deleting_a_missing_slice_is_not_found_and_deletes_nothing(inventory):
    app, stub = inventory
    stub.ApplyResourceSlices(
        inventory_pb2.ApplyResourceSlicesRequest(manifest=_manifest("l40s-node.yaml"))
    )
    existing = next(iter(app.service.snapshot().slices))
    with pytest.raises(grpc.RpcError) as info:
        stub.DeleteResourceSlices(
            inventory_pb2.DeleteResourceSlicesRequest(names=[existing, "nope"])
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert isinstance(error_from_rpc(info.value), NotFound)
    assert existing in app.service.snapshot().slices


@pytest.mark.parametrize(
    ("node", "message"),
    [
        pytest.param(
            "l40s-nod-1",
            'node l40s-nod-1 is not in the inventory (did you mean "l40s-node-1"?)',
            id="typo-gets-the-closest-node",
        ),
        pytest.param("zz", "node zz is not in the inventory", id="nothing-close"),
    ],
)
def test_get_inventory_of_an_unknown_node_is_not_found(inventory, node, message):
    """Not an empty inventory: a typo'd node name must not read as "no GPUs there"."""
    _, stub = inventory
    stub.ApplyResourceSlices(
        inventory_pb2.ApplyResourceSlicesRequest(manifest=_manifest("l40s-node.yaml"))
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.GetInventory(inventory_pb2.GetInventoryRequest(node_name=node))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == message
    found = stub.GetInventory(inventory_pb2.GetInventoryRequest(node_name="l40s-node-1"))
    assert [n.node.name for n in found.inventory.nodes] == ["l40s-node-1"]
