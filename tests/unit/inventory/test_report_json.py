"""The agent's JSON: round trips on the real samples and a full report, and validation errors that
name the JSON path."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from services.common.errors import InvalidArgument
from services.inventory.adapters.sources.nvidia_smi_xml import parse_nvidia_smi_xml
from services.inventory.adapters.sources.report_json import from_json, to_json
from services.inventory.adapters.sources.topo_matrix import parse_topo_matrix
from services.inventory.core.mig import KNOWN_PROFILE_TABLES
from services.inventory.core.report import (
    CpuRange,
    EccCounts,
    Gpu,
    GpuHealth,
    MigDevice,
    MigMode,
    NodeReport,
    NvLinkPeer,
    Placement,
    RemappedRows,
    ReportSource,
    RetiredPages,
    XidEvent,
)
from services.inventory.core.topology import apply_topology

DATA = Path(__file__).parents[2] / "data"
SAMPLES = sorted((DATA / "nvidia-smi-xml").glob("*.xml"))


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem.split("_")[0]) for p in SAMPLES])
def test_samples_round_trip(path):
    report = parse_nvidia_smi_xml(path.read_text(), "node-a", path.name)
    data = json.loads(json.dumps(to_json(report)))
    assert from_json(data) == report


def full_report() -> NodeReport:
    """Every field set, as an NVML report of an HGX node would have them."""
    h100 = KNOWN_PROFILE_TABLES["0x233010DE"]
    mig = MigDevice(
        1, 0, "MIG-1", 0, "1g.10gb", 19, Placement(0, 1), 10 * 2**30, 16, 1, 1, 0, 1, 0
    )  # fmt: skip
    health = GpuHealth(
        ecc_enabled=True,
        ecc=EccCounts(1, 0, 7, 0),
        retired_pages=RetiredPages(0, 0, False),
        remapped_rows=RemappedRows(1, 0, pending=False, failure=False),
        xid_events=(XidEvent(63, "2026-01-01T00:00:00Z", 2),),
    )
    gpus = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{i}",
            product_name="NVIDIA H100 80GB HBM3",
            pci_bus_id=f"0000:{0x18 + i:02x}:00.0",
            minor=i,
            brand="Nvidia",
            architecture="Hopper",
            pci_device_id="0x233010DE",
            pcie_root="pci0000:10",
            memory_bytes=81559 * 2**20,
            cuda_compute_capability="9.0",
            addressing_mode="None",
            mig_mode=MigMode(i == 0, i == 0),
            mig_profiles=h100,
            mig_devices=(mig,) if i == 0 else (),
            nvlink_peers=(NvLinkPeer(18, 1 - i, f"0000:{0x19 - i:02x}:00.0", f"GPU-{1 - i}"),),
            numa_node=0,
            cpu_affinity=(CpuRange(0, 51), CpuRange(104, 155)),
            health=health,
        )
        for i in range(2)
    )
    report = NodeReport(
        "node-a", "2026-01-01T00:00:00Z", ReportSource.NVML, gpus, "590.48.01", "13.1", {"z": "a"}
    )
    topo = "\tGPU0\tGPU1\tNIC0\nGPU0\t X \tNV18\tPIX\nGPU1\tNV18\t X \tSYS\nNIC0\tPIX\tSYS\t X \n"
    return apply_topology(report, parse_topo_matrix(topo + "\nNIC0: mlx5_0\n", "t"))


def test_full_report_round_trips():
    report = full_report()
    data = to_json(report)
    assert from_json(json.loads(json.dumps(data))) == report
    assert data["gpuLinks"] == [{"a": 0, "b": 1, "link": "NV18"}]
    assert data["nics"] == [
        {"label": "NIC0", "name": "mlx5_0", "relations": {"0": "PIX", "1": "SYS"}}
    ]
    gpu = data["gpus"][0]
    assert gpu["cpuAffinity"] == "0-51,104-155"
    assert gpu["migDevices"][0]["placement"] == {"start": 0, "size": 1}
    assert gpu["migProfiles"][0]["placements"][6] == {"start": 6, "size": 1}
    assert gpu["health"]["xidEvents"] == [
        {"code": 63, "timestamp": "2026-01-01T00:00:00Z", "count": 2}
    ]


def test_bus_ids_are_normalised_on_the_way_in():
    data = to_json(full_report())
    data["gpus"][0]["pciBusID"] = "00000000:18:00.0"
    data["gpus"][1]["nvlinkPeers"][0]["peerPciBusID"] = "00000000:18:00.0"
    report = from_json(data)
    assert report.gpus[0].pci_bus_id == "0000:18:00.0"
    assert report.gpus[1].nvlink_peers[0].peer_pci_bus_id == "0000:18:00.0"


def edit(path: str, value: object) -> Any:
    """The full report's JSON with the value at a dotted path (list items as [i]) replaced;
    value `...` deletes the key."""
    data = copy.deepcopy(to_json(full_report()))
    *parents, last = path.replace("[", ".").replace("]", "").split(".")
    target = data
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if value is ...:
        del target[last]
    else:
        target[int(last) if isinstance(target, list) else last] = value
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param([], "<root>: must be an object, got list", id="not-an-object"),
        pytest.param(
            edit("apiVersion", "v2"),
            "apiVersion: must be 'gpualloc.io/v1', got 'v2'",
            id="api-version",
        ),
        pytest.param(edit("kind", "Node"), "kind: must be 'NodeReport', got 'Node'", id="kind"),
        pytest.param(edit("node", ...), "node: required", id="missing-node"),
        pytest.param(
            edit("source", "dcgm"),
            "source: must be one of nvml, nvidia-smi-xml, got 'dcgm'",
            id="source",
        ),
        pytest.param(edit("labels.z", 1), "labels.z: must be string, got number", id="label-value"),
        pytest.param(edit("gpus", {}), "gpus: must be a list, got object", id="gpus-not-list"),
        pytest.param(
            edit("gpus[1].index", "1"), "gpus[1].index: must be int, got string", id="index-string"
        ),
        pytest.param(
            edit("gpus[1].index", True), "gpus[1].index: must be int, got boolean", id="index-bool"
        ),
        pytest.param(
            edit("gpus[0].memoryBytes", -1),
            "gpus[0].memoryBytes: must not be negative, got -1",
            id="negative",
        ),
        pytest.param(
            edit("gpus[1].pciBusID", "3b"),
            "gpus[1].pciBusID: '3b' is not a PCI bus id like 0000:3b:00.0",
            id="bad-bus-id",
        ),
        pytest.param(
            edit("gpus[0].migDevices[0].placement.start", "0"),
            "gpus[0].migDevices[0].placement.start: must be int, got string",
            id="placement-start",
        ),
        pytest.param(
            edit("gpus[0].migDevices[0].placement.size", 0),
            "gpus[0].migDevices[0].placement.size: must be at least 1, got 0",
            id="placement-size",
        ),
        pytest.param(
            edit("gpus[0].migProfiles[2].placements[1]", 3),
            "gpus[0].migProfiles[2].placements[1]: must be an object, got number",
            id="placement-not-object",
        ),
        pytest.param(
            edit("gpus[0].migMode.current", "Enabled"),
            "gpus[0].migMode.current: must be bool, got string",
            id="mig-mode",
        ),
        pytest.param(
            edit("gpus[0].cpuAffinity", "0-x"),
            "gpus[0].cpuAffinity: '0-x' is not a CPU list like 0-51,104-155",
            id="cpu-affinity",
        ),
        pytest.param(
            edit("gpus[1].health.remappedRows.failure", ...),
            "gpus[1].health.remappedRows.failure: required",
            id="remapped-rows-incomplete",
        ),
        pytest.param(
            edit("gpus[0].health.xidEvents[0].count", 0),
            "gpus[0].health.xidEvents[0].count: must be at least 1",
            id="xid-count",
        ),
        pytest.param(
            edit("nics[0].relations.0", "NV"),
            "nics[0].relations.0: 'NV' is not a topology cell (X, NV#, PIX, PXB, PHB, NODE, SYS)",
            id="nic-relation",
        ),
        pytest.param(
            edit("nics[0].relations", {"GPU0": "PIX"}),
            'nics[0].relations.GPU0: keys must be GPU indexes like "0"',
            id="nic-relation-key",
        ),
        pytest.param(edit("gpuLinks[0].link", None), "gpuLinks[0].link: required", id="gpu-link"),
    ],
)
def test_validation_names_the_json_path(data, message):
    with pytest.raises(InvalidArgument) as caught:
        from_json(data)
    assert str(caught.value) == message
    assert caught.value.field_path == message.split(": ")[0]


def test_unknown_fields_are_ignored():
    data = to_json(full_report())
    data["gpus"][0]["fabric"] = {"cliqueId": 3}
    assert from_json(data) == full_report()
