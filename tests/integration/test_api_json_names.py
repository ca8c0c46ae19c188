"""docs/api.md, "gRPC JSON and Kubernetes JSON": each documented difference, checked on a real
allocator and inventory (port 0, answers through protobuf's JSON mapping as grpcurl prints
them) against the CLI's answer to the same question on the same files."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format

from protos.allocator.v1 import allocator_pb2
from protos.inventory.v1 import inventory_pb2, inventory_pb2_grpc
from services.allocator.adapters.grpc.mapping import _REASONS
from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.cli.solve import run_solve
from services.inventory.bootstrap import build_inventory
from services.inventory.cli import inventory as inventory_cli
from tests.e2e.allocator_harness import serve_allocator

ROOT = Path(__file__).resolve().parents[2]
API_DOC = (ROOT / "docs" / "api.md").read_text()
CLUSTER = [str(ROOT / "examples" / "cluster"), str(ROOT / "examples" / "deviceclasses.yaml")]
MEMORY = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'


def grpc_claim(name: str, count: int) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": str(count)}
    if count == 2:
        exactly["selectors"] = [{"cel": MEMORY}]  # `{"cel": "<expression>"}`
    return {"name": name, "requests": [{"name": "gpus", "exactly": exactly}]}


def kube_claim(name: str, count: int) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": count}
    if count == 2:
        exactly["selectors"] = [{"cel": {"expression": MEMORY}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}},
    }


def solve(tmp_path: Path, name: str, count: int, **options: Any) -> dict[str, Any]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(kube_claim(name, count)))
    out = io.StringIO()
    run_solve([*CLUSTER, str(path)], output="json", stdout=out, stderr=io.StringIO(), **options)
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


@pytest.fixture
def allocator(grpc_channel_factory):
    served = serve_allocator(grpc_channel_factory, MemoryReservationStore())
    yield served
    served.app.close()


def call(stub_method, request_type, body: dict[str, Any]) -> dict[str, Any]:
    request = json_format.Parse(json.dumps(body), request_type())
    answer: dict[str, Any] = json_format.MessageToDict(stub_method(request, timeout=10))
    return answer


def test_an_allocation_is_results_over_grpc_and_devices_results_in_the_cli(allocator, tmp_path):
    answer = call(
        allocator.stub.Allocate, allocator_pb2.AllocateRequest, {"claims": [grpc_claim("t", 2)]}
    )
    report = solve(tmp_path, "t", 2)
    emitted = solve(tmp_path, "t", 2, emit="claims")["items"][0]

    [placed] = answer["allocations"]
    assert (placed["name"], placed["namespace"]) == ("t", "default")  # metadata, flattened
    over_grpc = placed["allocation"]["results"]
    assert over_grpc == report["claims"][0]["allocation"]["devices"]["results"]
    assert over_grpc == emitted["status"]["allocation"]["devices"]["results"]
    assert placed["allocation"]["nodeSelector"] == emitted["status"]["allocation"]["nodeSelector"]


def test_rejections_name_the_same_devices_under_the_documented_fields(allocator, tmp_path):
    answer = call(
        allocator.stub.Explain, allocator_pb2.ExplainRequest, {"claims": [grpc_claim("huge", 16)]}
    )
    report = solve(tmp_path, "huge", 16)

    [over_grpc] = answer["explanation"]["requests"]
    [in_cli] = report["explanation"]["requests"]
    assert over_grpc["request"] == {"claim": "huge", "request": "gpus"}
    assert (in_cli["claim"], in_cli["request"]) == ("default/huge", "gpus")
    assert over_grpc["considered"] == str(in_cli["considered"])  # int64: a JSON string
    reasons = documented_reasons()
    assert len(over_grpc["rejections"]) == len(in_cli["rejections"]) >= 1
    for grpc_group, cli_group in zip(over_grpc["rejections"], in_cli["rejections"], strict=True):
        assert grpc_group["reason"] == "REJECTION_REASON_" + reasons[cli_group["reason"]]
        assert grpc_group["count"] == str(cli_group["count"])
        assert grpc_group["message"] == f"{cli_group['count']} {cli_group['detail']}" + (
            f" (e.g. {', '.join(cli_group['examples'])})"
        )
        examples = ["/".join(d.values()) for d in grpc_group["exampleDevices"]]
        assert examples == cli_group["examples"]


def test_a_device_capacity_is_value_value_over_grpc_and_value_in_the_cli(grpc_channel_factory):
    app = build_inventory()
    served = grpc_channel_factory([app.registration])
    try:
        slices = ROOT / "examples" / "cluster" / "l40s-node.yaml"
        stub = inventory_pb2_grpc.InventoryStub(served.channel)
        stub.ApplyResourceSlices(
            inventory_pb2.ApplyResourceSlicesRequest(manifest=slices.read_text())
        )
        answer = call(
            stub.GetInventory, inventory_pb2.GetInventoryRequest, {"nodeName": "l40s-node-1"}
        )
    finally:
        app.service.close()
    out = io.StringIO()
    inventory_cli.run_inventory([str(slices)], output="json", stdout=out)
    [kube_slice] = [i for i in json.loads(out.getvalue())["items"] if i["kind"] == "ResourceSlice"]

    over_grpc = answer["inventory"]["nodes"][0]["devices"][0]["device"]
    in_cli = kube_slice["spec"]["devices"][0]
    assert over_grpc["name"] == in_cli["name"] == "gpu-0"
    assert over_grpc["capacity"]["memory"]["value"]["value"] == "46068Mi"
    assert in_cli["capacity"]["memory"]["value"] == "46068Mi"


def documented_reasons() -> dict[str, str]:
    section = API_DOC[API_DOC.index("Rejection reasons, the CLI's string") :]
    return dict(re.findall(r"^\| `(\w+)` \| `([A-Z_]+)` \|$", section, re.MULTILINE))


def test_the_reason_table_is_the_servers_mapping() -> None:
    mapping = {
        str(code): allocator_pb2.RejectionReason.Name(value).removeprefix("REJECTION_REASON_")
        for code, value in _REASONS.items()
    }
    assert documented_reasons() == mapping
