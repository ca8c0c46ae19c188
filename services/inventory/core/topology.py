"""A node's topology: the `nvidia-smi topo -m` matrix as a value, and the networkx graph.

`TopologyMatrix` is what the text says, cell by cell (parsed by adapters/sources/topo_matrix.py).
`apply_topology` folds a matrix into a NodeReport (GPU pairs, NICs, NUMA, CPU affinity, NVLink
peers where NVML did not already say), and `topology_graph` turns a report into the graph the
allocator scores placements with: GPU nodes, NVLink edges weighted by link count, PCIe relations
between GPUs and to NICs, NUMA nodes and PCIe roots.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import networkx as nx

from services.common.errors import InvalidArgument
from services.inventory.core.report import (
    CpuRange,
    Gpu,
    GpuLink,
    GpuPair,
    Nic,
    NodeReport,
    NvLinkPeer,
    TopologyLevel,
)

__all__ = [
    "TopologyMatrix",
    "TopologyRow",
    "apply_topology",
    "gpu_node",
    "nic_node",
    "numa_node",
    "topology_graph",
]

_GPU_LABEL = re.compile(r"^GPU(\d+)$")


@dataclass(frozen=True)
class TopologyRow:
    """One device row: cells aligned with TopologyMatrix.columns (None for `N/A`)."""

    label: str
    cells: tuple[GpuLink | None, ...]
    cpu_affinity: tuple[CpuRange, ...] = ()
    numa_affinity: tuple[CpuRange, ...] = ()
    gpu_numa_id: int | None = None


@dataclass(frozen=True)
class TopologyMatrix:
    """`columns` are the device columns in printed order (GPU0.., NIC0.. or mlx5_0..)."""

    columns: tuple[str, ...]
    rows: tuple[TopologyRow, ...]
    nic_names: Mapping[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0 (legend)

    def row(self, label: str) -> TopologyRow | None:
        return next((r for r in self.rows if r.label == label), None)

    def link(self, a: str, b: str) -> GpuLink | None:
        """The cell in row `a`, column `b`; None when absent or `N/A`."""
        row = self.row(a)
        if row is None or b not in self.columns:
            return None
        return row.cells[self.columns.index(b)]

    @property
    def gpu_labels(self) -> tuple[str, ...]:
        return tuple(c for c in self.columns if _GPU_LABEL.match(c))

    @property
    def nic_labels(self) -> tuple[str, ...]:
        return tuple(c for c in self.columns if not _GPU_LABEL.match(c))


def _gpu_index(label: str) -> int:
    match = _GPU_LABEL.match(label)
    assert match is not None
    return int(match[1])


# --- matrix -> report ------------------------------------------------------------------------


def apply_topology(report: NodeReport, matrix: TopologyMatrix) -> NodeReport:
    """The report with the matrix's facts added; facts the report already has are kept.

    Raises InvalidArgument when the matrix names a GPU the report does not have (a `topo -m`
    from another node).
    """
    known = {g.index for g in report.gpus}
    for label in matrix.gpu_labels:
        if _gpu_index(label) not in known:
            raise InvalidArgument.at(
                "topology", f"{label} is not in the report (GPU indexes {sorted(known)})"
            )
    gpu_links = report.gpu_links or _gpu_pairs(matrix)
    nics = report.nics or _nics(matrix)
    gpus = tuple(_with_matrix(report, gpu, matrix) for gpu in report.gpus)
    return replace(report, gpus=gpus, gpu_links=gpu_links, nics=nics)


def _gpu_pairs(matrix: TopologyMatrix) -> tuple[GpuPair, ...]:
    labels = matrix.gpu_labels
    pairs = []
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            link = matrix.link(a, b)
            if link is not None and link.level is not TopologyLevel.SELF:
                ia, ib = sorted((_gpu_index(a), _gpu_index(b)))
                pairs.append(GpuPair(ia, ib, link))
    return tuple(pairs)


def _nics(matrix: TopologyMatrix) -> tuple[Nic, ...]:
    nics = []
    for label in matrix.nic_labels:
        relations = {
            _gpu_index(gpu): link
            for gpu in matrix.gpu_labels
            if (link := matrix.link(label, gpu)) is not None
        }
        nics.append(Nic(label, matrix.nic_names.get(label, label), relations=relations))
    return tuple(nics)


def _with_matrix(report: NodeReport, gpu: Gpu, matrix: TopologyMatrix) -> Gpu:
    label = f"GPU{gpu.index}"
    row = matrix.row(label)
    if row is None:
        return gpu
    numa = gpu.numa_node
    if numa is None:
        numa = row.gpu_numa_id
    if (
        numa is None
        and len(row.numa_affinity) == 1
        and row.numa_affinity[0].first == (row.numa_affinity[0].last)
    ):
        numa = row.numa_affinity[0].first
    peers = gpu.nvlink_peers or _peers_from_matrix(report, label, matrix)
    return replace(
        gpu,
        numa_node=numa,
        cpu_affinity=gpu.cpu_affinity or row.cpu_affinity,
        nvlink_peers=peers,
    )


def _peers_from_matrix(
    report: NodeReport, label: str, matrix: TopologyMatrix
) -> tuple[NvLinkPeer, ...]:
    peers = []
    for other in matrix.gpu_labels:
        link = matrix.link(label, other)
        if link is None or link.level is not TopologyLevel.NVLINK:
            continue
        peer = report.gpu_by_index(_gpu_index(other))
        peers.append(
            NvLinkPeer(
                links=link.nvlinks,
                peer_index=_gpu_index(other),
                peer_pci_bus_id=peer.pci_bus_id if peer else None,
                peer_uuid=peer.uuid if peer else None,
            )
        )
    return tuple(peers)


# --- report -> graph -------------------------------------------------------------------------


def gpu_node(index: int) -> str:
    return f"gpu:{index}"


def nic_node(label: str) -> str:
    return f"nic:{label}"


def numa_node(node: int) -> str:
    return f"numa:{node}"


def topology_graph(report: NodeReport, matrix: TopologyMatrix | None = None) -> nx.Graph:
    """The node's graph. Node keys: `gpu:<index>`, `nic:<label>`, `numa:<n>`, `pcie-root:<root>`,
    each with a `kind` attribute. GPU-GPU edges carry `level` (TopologyLevel value), `rank`
    (0 closest) and, over NVLink, `nvlinks` and `weight` = link count."""
    if matrix is not None:
        report = apply_topology(report, matrix)
    graph = nx.Graph(node=report.node)
    for gpu in report.gpus:
        _add_gpu(graph, gpu)
    for pair in report.gpu_links:
        _add_link(graph, gpu_node(pair.a), gpu_node(pair.b), pair.link)
    for gpu in report.gpus:
        for peer in gpu.nvlink_peers:
            if peer.peer_index is not None and peer.peer_index != gpu.index:
                nvlink = GpuLink(TopologyLevel.NVLINK, peer.links)
                if not graph.has_edge(gpu_node(gpu.index), gpu_node(peer.peer_index)):
                    _add_link(graph, gpu_node(gpu.index), gpu_node(peer.peer_index), nvlink)
    for nic in report.nics:
        graph.add_node(nic_node(nic.label), kind="nic", name=nic.name, pci_bus_id=nic.pci_bus_id)
        for index, link in sorted(nic.relations.items()):
            _add_link(graph, nic_node(nic.label), gpu_node(index), link)
    return graph


def _add_gpu(graph: nx.Graph, gpu: Gpu) -> None:
    key = gpu_node(gpu.index)
    graph.add_node(
        key,
        kind="gpu",
        index=gpu.index,
        uuid=gpu.uuid,
        pci_bus_id=gpu.pci_bus_id,
        product_name=gpu.product_name,
    )
    if gpu.numa_node is not None:
        graph.add_node(numa_node(gpu.numa_node), kind="numa", numa=gpu.numa_node)
        graph.add_edge(key, numa_node(gpu.numa_node), kind="numa")
    if gpu.pcie_root is not None:
        root = f"pcie-root:{gpu.pcie_root}"
        graph.add_node(root, kind="pcie-root", pcie_root=gpu.pcie_root)
        graph.add_edge(key, root, kind="pcie-root")


def _add_link(graph: nx.Graph, a: str, b: str, link: GpuLink) -> None:
    if link.level is TopologyLevel.SELF or a not in graph or b not in graph:
        return
    attrs: dict[str, object] = {"kind": "link", "level": link.level.value, "rank": link.rank}
    if link.level is TopologyLevel.NVLINK:
        attrs.update(nvlinks=link.nvlinks, weight=link.nvlinks)
    graph.add_edge(a, b, **attrs)
