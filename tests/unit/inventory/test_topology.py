"""apply_topology and topology_graph: the real `topo -m` samples folded into reports."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations
from pathlib import Path

import pytest

from services.common.errors import InvalidArgument
from services.inventory.adapters.sources.nvidia_smi_xml import parse_nvidia_smi_xml
from services.inventory.adapters.sources.topo_matrix import parse_topo_matrix
from services.inventory.core.merge import topology_graph
from services.inventory.core.report import (
    CpuRange,
    Gpu,
    GpuLink,
    GpuPair,
    NodeReport,
    NvLinkPeer,
    ReportSource,
    TopologyLevel,
)
from services.inventory.core.topology import (
    TopologyMatrix,
    apply_topology,
    gpu_node,
    nic_node,
    numa_node,
)

DATA = Path(__file__).parents[2] / "data"
NV2 = GpuLink(TopologyLevel.NVLINK, 2)


def topo(name: str) -> TopologyMatrix:
    return parse_topo_matrix((DATA / "topo" / name).read_text(), name)


def a5000() -> NodeReport:
    name = "2x-rtx-a5000_drv590.44.01_telegraf.xml"
    return parse_nvidia_smi_xml((DATA / "nvidia-smi-xml" / name).read_text(), "n", name)


def node_of(count: int) -> NodeReport:
    gpus = tuple(
        Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", f"0000:{0x18 + i:02x}:00.0")
        for i in range(count)
    )
    return NodeReport("n", "2026-01-01T00:00:00Z", ReportSource.NVML, gpus)


def test_nv2_pair_folds_into_the_xml_report():
    report = apply_topology(a5000(), topo("2x-gpu_nv2_ml-engineering.txt"))
    assert report.gpu_links == (GpuPair(0, 1, NV2),)
    first, second = report.gpus
    assert first.nvlink_peers == (NvLinkPeer(2, 1, "0000:c1:00.0", second.uuid),)
    assert second.nvlink_peers == (NvLinkPeer(2, 0, "0000:81:00.0", first.uuid),)
    assert first.cpu_affinity == (CpuRange(0, 23),)
    assert first.numa_node is None  # NUMA Affinity N/A
    graph = topology_graph(report)
    assert graph.edges[gpu_node(0), gpu_node(1)] == {
        "kind": "link",
        "level": "NV",
        "rank": 1,
        "nvlinks": 2,
        "weight": 2,
    }


def test_phb_pair_has_no_nvlink():
    graph = topology_graph(a5000(), topo("2x-gpu_phb-no-nvlink_ml-engineering.txt"))
    edge = graph.edges[gpu_node(0), gpu_node(1)]
    assert (edge["level"], edge["rank"]) == ("PHB", 4)
    assert "weight" not in edge


def test_h100_all_pairs_nv18_and_numa_split():
    graph = topology_graph(node_of(8), topo("8x-h100_nv18_ml-engineering.txt"))
    gpus = [gpu_node(i) for i in range(8)]
    for a, b in combinations(gpus, 2):
        assert graph.edges[a, b]["weight"] == 18
    assert sorted(graph.neighbors(numa_node(0))) == gpus[:4]
    assert sorted(graph.neighbors(numa_node(1))) == gpus[4:]
    assert graph.nodes[gpu_node(5)]["kind"] == "gpu"
    assert graph.number_of_nodes() == 8 + 2


def test_nics_become_graph_nodes():
    text = (
        "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tSYS\tPIX\t0-7\t0\n"
        "GPU1\tSYS\t X \tSYS\t8-15\t1\n"
        "NIC0\tPIX\tSYS\t X \n\nNIC Legend:\n\n  NIC0: mlx5_0\n"
    )
    report = apply_topology(node_of(2), parse_topo_matrix(text, "t"))
    (nic,) = report.nics
    assert (nic.label, nic.name) == ("NIC0", "mlx5_0")
    assert nic.relations == {0: GpuLink(TopologyLevel.PIX), 1: GpuLink(TopologyLevel.SYS)}
    assert [g.numa_node for g in report.gpus] == [0, 1]
    graph = topology_graph(report)
    assert graph.nodes[nic_node("NIC0")]["name"] == "mlx5_0"
    assert graph.edges[nic_node("NIC0"), gpu_node(0)]["level"] == "PIX"


def test_nvml_peers_without_matrix_make_edges():
    report = node_of(2)
    gpus = (
        replace(report.gpus[0], nvlink_peers=(NvLinkPeer(12, 1),)),
        report.gpus[1],
    )
    graph = topology_graph(NodeReport("n", "t", ReportSource.NVML, gpus))
    assert graph.edges[gpu_node(0), gpu_node(1)]["nvlinks"] == 12


def test_matrix_from_another_node_is_refused():
    with pytest.raises(InvalidArgument) as caught:
        apply_topology(node_of(1), topo("2x-gpu_nv2_ml-engineering.txt"))
    assert caught.value.field_path == "topology"
    assert str(caught.value) == "topology: GPU1 is not in the report (GPU indexes [0])"
