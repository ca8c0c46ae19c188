"""Outputs that read back: `gpualloc inventory -o yaml|json` prints Kubernetes objects that
`gpualloc solve -f` allocates on as on the original files, and `gpualloc apply -f` sends to a
real inventory server (port 0), which then holds exactly those slices."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from protos.inventory.v1 import inventory_pb2, inventory_pb2_grpc
from services.allocator.cli.solve import EXIT_ALLOCATED, run_solve
from services.inventory.adapters.grpc.mapping import slices_from_pb_node
from services.inventory.bootstrap import build_inventory
from services.inventory.cli import apply as apply_cli
from services.inventory.cli import inventory as inventory_cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CLASSES = str(EXAMPLES / "deviceclasses.yaml")
DATA = ROOT / "tests" / "data"
A5000_XML = str(DATA / "nvidia-smi-xml" / "2x-rtx-a5000_drv590.44.01_telegraf.xml")


def inventory(*args: str, output: str = "yaml", node: str | None = None) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = inventory_cli.run_inventory(list(args), node, output, stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


def solve(*paths: str) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    code = run_solve([*paths, CLASSES], output="json", stdout=out, stderr=err)
    assert code == EXIT_ALLOCATED, err.getvalue()
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


def placement(report: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    results = report["claims"][0]["allocation"]["devices"]["results"]
    return report["node"], [(r["pool"], r["device"]) for r in results]


@pytest.mark.parametrize(
    "claim",
    [
        "one-h100.yaml",
        "all-l40s.yaml",
        "mig-small-else-medium.yaml",
        "two-gpus-same-pcie-root.yaml",
    ],
)
def test_solve_on_the_printed_inventory_places_as_on_the_files(tmp_path, claim):
    """Same node, same number of devices; the printed slices are sorted by name (as an API
    server lists them), so among equal devices another may be picked."""
    printed = tmp_path / "inventory.yaml"
    printed.write_text(inventory(str(EXAMPLES / "cluster"), str(EXAMPLES / "nvml")))
    claim_path = str(EXAMPLES / "claims" / claim)

    node, devices = placement(solve(str(printed), claim_path))
    expected_node, expected_devices = placement(solve(str(EXAMPLES / "cluster"), claim_path))

    assert (node, len(devices)) == (expected_node, len(expected_devices))


def test_the_printed_inventory_reads_back_as_itself(tmp_path):
    printed = tmp_path / "inventory.yaml"
    printed.write_text(inventory(str(EXAMPLES / "cluster"), A5000_XML, node="a5000-node"))
    assert inventory(str(printed)) == printed.read_text()


def test_yaml_and_json_print_the_same_kubernetes_objects():
    as_yaml = yaml.safe_load(inventory(str(EXAMPLES / "cluster")))
    as_json = json.loads(inventory(str(EXAMPLES / "cluster"), output="json"))
    assert as_yaml == as_json
    assert (as_yaml["apiVersion"], as_yaml["kind"]) == ("v1", "List")
    kinds = [(i["apiVersion"], i["kind"]) for i in as_yaml["items"]]
    assert kinds.count(("v1", "Node")) == 4
    assert kinds.count(("resource.k8s.io/v1", "ResourceSlice")) == 7  # 1 + 1 + 4 + 1
    assert all(i["metadata"]["name"] for i in as_yaml["items"])


def test_gpus_only_nvml_knows_are_printed_as_slices_that_solve_allocates(tmp_path):
    """An XML report with no slice: its GPUs are the inventory's `<node>-nvml` pool."""
    printed = tmp_path / "inventory.yaml"
    printed.write_text(inventory(A5000_XML, node="a5000-node"))
    claim = tmp_path / "claim.yaml"
    claim.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: two}\n"
        "spec: {devices: {requests: [{name: gpus, exactly: "
        "{deviceClassName: gpu.nvidia.com, count: 2}}]}}\n"
    )

    node, devices = placement(solve(str(printed), str(claim)))

    assert node == "a5000-node"
    assert devices == [("a5000-node-nvml", "gpu-0"), ("a5000-node-nvml", "gpu-1")]


def test_apply_of_the_printed_inventory_gives_the_server_those_slices(
    tmp_path, grpc_channel_factory
):
    app = build_inventory()
    served = grpc_channel_factory([app.registration])
    try:
        printed = tmp_path / "inventory.yaml"
        printed.write_text(inventory(str(EXAMPLES / "cluster")))
        out, err = io.StringIO(), io.StringIO()
        code = apply_cli.run_apply([str(printed)], served.target, stdout=out, stderr=err)
        assert code == 0, err.getvalue()

        stub = inventory_pb2_grpc.InventoryStub(served.channel)
        answer = stub.GetInventory(inventory_pb2.GetInventoryRequest(include_slices=True))
        held = {s.name for n in answer.inventory.nodes for s in slices_from_pb_node(n)}
        listed = yaml.safe_load(printed.read_text())["items"]
        printed_slices = {i["metadata"]["name"] for i in listed if i["kind"] == "ResourceSlice"}
        assert held == printed_slices
        labels = {n.node.name: dict(n.node.labels) for n in answer.inventory.nodes}
        nodes = {i["metadata"]["name"]: i["metadata"].get("labels", {}) for i in listed}
        assert labels == {k: v for k, v in nodes.items() if k in labels}
    finally:
        app.service.close()
