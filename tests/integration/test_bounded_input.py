"""Bad input over real gRPC answers its own code, at sizes that used to hurt (issue 15): huge or
deep manifests are INVALID_ARGUMENT, made-up nodes stop at the node limit with
RESOURCE_EXHAUSTED, and an error that echoes an 8,000-character value still fits the trailers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf import timestamp_pb2

from protos.allocator.v1 import allocator_pb2 as apb
from protos.inventory.v1 import inventory_pb2 as pb
from protos.inventory.v1 import inventory_pb2_grpc
from services.common.grpc_errors import MAX_MESSAGE_CHARS
from services.inventory.adapters.grpc.servicer import InventoryServicer
from services.inventory.bootstrap import InventoryApp, build_inventory
from services.inventory.config import InventorySettings
from tests.e2e.allocator_harness import allocate_request

LONG = "x" * 8000
NODE = "apiVersion: v1\nkind: Node\nmetadata: {name: NAME}\n"


@dataclass
class Served:
    app: InventoryApp
    stub: inventory_pb2_grpc.InventoryStub


@pytest.fixture
def inventory(grpc_channel_factory) -> Iterator[Callable[[dict[str, str]], Served]]:
    apps: list[InventoryApp] = []

    def start(environ: dict[str, str]) -> Served:
        app = build_inventory(settings=InventorySettings.from_env(environ), sweep=False)
        apps.append(app)
        served = grpc_channel_factory([app.registration])
        return Served(app, inventory_pb2_grpc.InventoryStub(served.channel))

    yield start
    for app in apps:
        app.close()


def _error(call: Callable[..., object], request: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=30)
    return caught.value


def _alias_bomb() -> str:
    lines = [f"a0: &a0 [{', '.join(['x'] * 10)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        pytest.param("[" * 985 + "]" * 985, "nested deeper than 100", id="json-985-brackets"),
        pytest.param('{"a":' * 3000 + "1" + "}" * 3000, "nested deeper", id="json-deep-object"),
        pytest.param(_alias_bomb(), "more than 1,000,000 values", id="yaml-alias-bomb"),
        pytest.param("#" * (80 * 1024), "GPUALLOC_MAX_DOCUMENT_BYTES", id="over-max-bytes"),
    ],
)
def test_bad_manifests_are_invalid_argument_naming_the_limit(inventory, manifest, message):
    served = inventory({"GPUALLOC_MAX_DOCUMENT_BYTES": "64Ki"})
    request = pb.ApplyResourceSlicesRequest(manifest=manifest, dry_run=True)
    error = _error(served.stub.ApplyResourceSlices, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert message in (error.details() or "")


def _report(node: str) -> pb.ReportNodeRequest:
    observed = timestamp_pb2.Timestamp(seconds=1_700_000_000)
    return pb.ReportNodeRequest(report=pb.NodeReport(node_name=node, observed_at=observed))


def test_made_up_nodes_stop_at_the_node_limit(inventory):
    served = inventory({"GPUALLOC_INVENTORY_MAX_NODES": "5"})
    for index in range(5):
        served.stub.ReportNode(_report(f"made-up-{index}"), timeout=10)
    served.stub.ReportNode(_report("made-up-0"), timeout=10)  # a known node still reports
    for request, call in (
        (_report("made-up-5"), served.stub.ReportNode),
        (
            pb.ApplyResourceSlicesRequest(manifest=NODE.replace("NAME", "made-up-6")),
            served.stub.ApplyResourceSlices,
        ),
    ):
        error = _error(call, request)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "at most 5 nodes (GPUALLOC_INVENTORY_MAX_NODES)" in (error.details() or "")
    assert served.app.service.snapshot().node_count == 5


def test_gpu_caches_only_for_accepted_reports(inventory):
    served = inventory({"GPUALLOC_INVENTORY_MAX_NODES": "3"})
    for index in range(50):
        with pytest.raises(grpc.RpcError):
            served.stub.ReportNode(pb.ReportNodeRequest(), timeout=10)  # no report: refused
        if index < 3:
            served.stub.ReportNode(_report(f"n{index}"), timeout=10)
        else:
            _error(served.stub.ReportNode, _report(f"n{index}"))
    servicer = served.app.registration.servicer
    assert isinstance(servicer, InventoryServicer)
    assert sorted(servicer._gpu_caches) == ["n0", "n1", "n2"]


@pytest.mark.parametrize(
    ("method", "request_", "code"),
    [
        pytest.param(
            "GetReservation",
            apb.GetReservationRequest(reservation_id=LONG),
            grpc.StatusCode.NOT_FOUND,
            id="get-reservation-8000-char-id",
        ),
        pytest.param(
            "Release",
            apb.ReleaseRequest(reservation_id=LONG),
            grpc.StatusCode.NOT_FOUND,
            id="release-8000-char-id",
        ),
        pytest.param(
            "Allocate",
            allocate_request("one-h100", node_name=LONG),
            grpc.StatusCode.NOT_FOUND,
            id="allocate-on-an-8000-char-node",
        ),
    ],
)
def test_errors_echoing_long_values_keep_their_code(allocator, method, request_, code):
    error = _error(getattr(allocator.stub, method), request_)
    assert error.code() == code, error.details()
    assert len(error.details() or "") <= MAX_MESSAGE_CHARS + 40
    assert "characters)" in (error.details() or "")  # clipped, with the full length
