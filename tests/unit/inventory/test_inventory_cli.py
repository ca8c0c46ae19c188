"""`gpualloc inventory`: offline merge of real sample files, its three outputs, and exit 2 with
the file, line or field on bad input."""

from __future__ import annotations

import argparse
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from services.inventory.adapters.sources.nvidia_smi_xml import parse_nvidia_smi_xml
from services.inventory.adapters.sources.report_json import to_json
from services.inventory.cli import inventory as inventory_cli
from services.inventory.core.report import XidEvent

DATA = Path(__file__).parents[2] / "data"
T4_SLICE = DATA / "resourceslices" / "openshift-v1.35_2x-tesla-t4_condensed.yaml"
T4_NODE = "harpatil4220c-g9kfm-gpu-c-rd8r8"
T4_XML = DATA / "nvidia-smi-xml" / "tesla-t4_turing_drv515_telegraf.xml"
A5000_XML = DATA / "nvidia-smi-xml" / "2x-rtx-a5000_drv590.44.01_telegraf.xml"
NV2_TOPO = DATA / "topo" / "2x-gpu_nv2_ml-engineering.txt"
PHB_TOPO = DATA / "topo" / "2x-gpu_phb-no-nvlink_ml-engineering.txt"


def run(*args: str, stdin: str = "") -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    inventory_cli.register(parser.add_subparsers())
    parsed = parser.parse_args(["inventory", *args])
    out, err = io.StringIO(), io.StringIO()
    code = inventory_cli.run_inventory(
        parsed.filename, parsed.node, parsed.output, io.StringIO(stdin), out, err
    )
    return code, out.getvalue(), err.getvalue()


def agent_report_file(tmp_path: Path) -> Path:
    """What `gpualloc-agent --stdout` prints for the sliced node: its gpu-0 (by PCI bus id, the
    UUID masked differently) with XID 79."""
    report = parse_nvidia_smi_xml(T4_XML.read_text(), T4_NODE, str(T4_XML))
    gpu = report.gpus[0]
    health = replace(gpu.health, xid_events=(XidEvent(79, "2026-01-01T00:00:00Z"),))
    report = replace(report, gpus=(replace(gpu, pci_bus_id="0000:00:04.0", health=health),))
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(to_json(report)))
    return path


def test_slices_print_as_nodes_with_resource_slice_style_devices() -> None:
    code, out, _ = run("-f", str(T4_SLICE))
    assert code == 0
    data = json.loads(out)
    assert data["generation"] == 1
    [node] = data["nodes"]
    assert (node["name"], len(node["devices"])) == (T4_NODE, 2)
    gpu0 = node["devices"][0]
    assert gpu0["driver"] == "gpu.nvidia.com" and gpu0["pool"] == T4_NODE
    assert gpu0["attributes"]["productName"] == {"string": "Tesla T4"}
    assert gpu0["capacity"]["memory"] == {"value": "15Gi"}


def test_an_agent_report_joins_the_slice_and_taints_the_device(tmp_path: Path) -> None:
    code, out, _ = run("-f", str(T4_SLICE), "-f", str(agent_report_file(tmp_path)))
    assert code == 0
    [node] = json.loads(out)["nodes"]
    taints = {d["name"]: d.get("taints", []) for d in node["devices"]}
    assert taints["gpu-0"] == [
        {
            "key": "gpu.nvidia.com/xid",
            "value": "79-fell-off-bus",
            "effect": "NoExecute",
            "timeAdded": "2026-01-01T00:00:00Z",
        }
    ]
    assert taints["gpu-1"] == []
    assert any("by PCI bus id 0000:00:04.0" in w for w in node["warnings"])


def test_xml_and_topology_give_devices_and_an_nvlink_edge_in_the_view() -> None:
    code, out, _ = run("-f", str(A5000_XML), "-f", str(NV2_TOPO), "--node", "n1", "-o", "view")
    assert code == 0
    [node] = json.loads(out)["nodes"]
    assert [d["name"] for d in node["devices"]] == ["gpu-0", "gpu-1"]
    assert {d["pool"] for d in node["devices"]} == {"n1-nvml"}
    assert node["topology"]["nvlink"] == [
        {"a": "gpu.nvidia.com/n1-nvml/gpu-0", "b": "gpu.nvidia.com/n1-nvml/gpu-1", "links": 2}
    ]


def test_text_output_is_a_table_with_a_topology_matrix(tmp_path: Path) -> None:
    ansi_topo = tmp_path / "topo.txt"
    ansi_topo.write_text("\x1b[4m" + NV2_TOPO.read_text().replace("\n", "\x1b[0m\n", 1))
    code, out, _ = run("-f", str(A5000_XML), "-f", str(ansi_topo), "--node", "n1", "-o", "text")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "generation 1"
    assert "NODE n1" in lines
    assert any(line.split()[:3] == ["GPU0", "X", "NV2"] for line in lines)
    assert any("NVIDIA RTX A5000" in line and "24564Mi" in line for line in lines)


def test_a_topology_hangs_on_the_gpus_of_the_nodes_slices(tmp_path: Path) -> None:
    """No report for the node: `GPU<n>` of the matrix is the slice's `gpu-<n>`; the file's name
    names the node."""
    topo = tmp_path / f"{T4_NODE}.topo.txt"
    topo.write_text(PHB_TOPO.read_text())
    code, out, _ = run("-f", str(T4_SLICE), "-f", str(topo))
    assert code == 0
    [node] = json.loads(out)["nodes"]
    assert [d["source"] for d in node["devices"]] == ["resource-slice", "resource-slice"]
    prefix = f"gpu.nvidia.com/{T4_NODE}/"
    assert node["topology"]["pcie"] == [
        {"a": prefix + "gpu-0", "b": prefix + "gpu-1", "relation": "PHB"}
    ]
    assert node["topology"]["nvlink"] == []


def test_a_directory_and_stdin_are_read_like_kubectl(tmp_path: Path) -> None:
    (tmp_path / "slices.yaml").write_text(T4_SLICE.read_text())
    node = f"apiVersion: v1\nkind: Node\nmetadata: {{name: {T4_NODE}, labels: {{zone: a}}}}\n"
    code, out, _ = run("-f", str(tmp_path), "-f", "-", stdin=node)
    assert code == 0
    [printed] = json.loads(out)["nodes"]
    assert printed["labels"] == {"zone": "a"} and len(printed["devices"]) == 2


BAD_INPUT = {
    "malformed-yaml": ("bad.yaml", "spec: [unclosed\n", (), "bad.yaml:"),
    "malformed-xml": ("smi.xml", "<nvidia_smi_log>\n<gpu>\n", ("--node", "n1"), "smi.xml:"),
    "malformed-json-report": (
        "report.json",
        '{"apiVersion": "gpualloc.io/v1", "kind": "NodeReport", "node": "n1", "timestamp": "t",'
        ' "source": "nvml", "gpus": [{"index": "zero"}]}',
        (),
        "report.json: gpus[0]",
    ),
    "unknown-kind": ("pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", (), "kind"),
    "unknown-version": (
        "v9.yaml",
        "apiVersion: resource.k8s.io/v9\nkind: ResourceSlice\nmetadata: {name: s}\n",
        (),
        "apiVersion",
    ),
    "invalid-quantity": (
        "q.yaml",
        T4_SLICE.read_text().replace("15Gi", "15XB", 1),
        (),
        'capacity["memory"]',
    ),
    "xml-without-node": ("smi.xml", A5000_XML.read_text(), (), "--node"),
    "topology-without-a-report": ("topo.txt", NV2_TOPO.read_text(), ("--node", "n1"), "needs"),
}


@pytest.mark.parametrize(
    ("name", "text", "flags", "fragment"), BAD_INPUT.values(), ids=BAD_INPUT.keys()
)
def test_bad_input_exits_2_naming_the_file_line_or_field(
    tmp_path: Path, name: str, text: str, flags: tuple[str, ...], fragment: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    code, out, err = run("-f", str(path), *flags)
    assert (code, out) == (2, "")
    assert err.startswith("gpualloc inventory: ") and fragment in err


def test_two_reports_for_one_node_conflict(tmp_path: Path) -> None:
    code, _, err = run("-f", str(A5000_XML), "-f", str(A5000_XML), "--node", "n1")
    assert code == 2 and "a second report for node 'n1'" in err


def test_a_missing_file_exits_2() -> None:
    code, _, err = run("-f", "/nonexistent/slices.yaml")
    assert code == 2 and "no such file" in err
