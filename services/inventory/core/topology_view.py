"""A node's topology as the inventory publishes it: GPUs by UUID, NVLink and PCIe edges, NUMA
nodes and NICs (the shape of `gpualloc.common.v1.NodeTopology`).

Built directly from a NodeReport (a `topo -m` matrix is folded into the report before, by
`apply_topology`), plus which DRA devices each GPU backs, so an allocator can go from a device to
its GPU and from there to its neighbours without a graph library. `topology_graph` builds the
networkx graph from the same report when a caller wants graph algorithms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.common.dra.model import DeviceID
from services.inventory.core.report import (
    NodeReport,
    TopologyLevel,
    format_cpu_list,
)

__all__ = [
    "NodeTopology",
    "NumaNode",
    "NvlinkEdge",
    "PcieEdge",
    "TopologyGpu",
    "TopologyNic",
    "node_topology",
]


@dataclass(frozen=True)
class TopologyGpu:
    uuid: str
    index: int  # NVML index: `GPU<index>` in `nvidia-smi topo -m`
    device: DeviceID | None  # the full-GPU DRA device, when one is published
    partitions: tuple[DeviceID, ...]  # MIG devices carved from it
    pci_bus_id: str
    pcie_root: str | None = None
    numa_node: int | None = None
    cpu_affinity: str = ""


@dataclass(frozen=True)
class NvlinkEdge:
    """Between two GPUs by UUID, a < b."""

    a: str
    b: str
    links: int


@dataclass(frozen=True)
class PcieEdge:
    """GPU-GPU (b is a UUID) or GPU-NIC (b is the NIC's name); `relation` is PIX..SYS."""

    a: str
    b: str
    relation: TopologyLevel


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: str
    gpus: tuple[str, ...]
    nics: tuple[str, ...] = ()


@dataclass(frozen=True)
class TopologyNic:
    name: str
    pci_bus_id: str | None = None


@dataclass(frozen=True)
class NodeTopology:
    gpus: tuple[TopologyGpu, ...]
    nvlink: tuple[NvlinkEdge, ...]
    pcie: tuple[PcieEdge, ...]
    numa: tuple[NumaNode, ...]
    nics: tuple[TopologyNic, ...]


def node_topology(
    report: NodeReport,
    full_devices: Mapping[str, DeviceID],
    partitions: Mapping[str, Sequence[DeviceID]],
) -> NodeTopology:
    """The topology of `report`; `full_devices` and `partitions` map GPU UUIDs to the DRA
    devices that stand for them (applied or synthesized)."""
    uuid_by_index = {g.index: g.uuid for g in report.gpus}
    gpus = tuple(
        sorted(
            (
                TopologyGpu(
                    uuid=g.uuid,
                    index=g.index,
                    device=full_devices.get(g.uuid),
                    partitions=tuple(sorted(partitions.get(g.uuid, ()))),
                    pci_bus_id=g.pci_bus_id,
                    pcie_root=g.pcie_root,
                    numa_node=g.numa_node,
                    cpu_affinity=format_cpu_list(g.cpu_affinity),
                )
                for g in report.gpus
            ),
            key=lambda g: g.uuid,
        )
    )
    nvlink, pcie = _edges(report, uuid_by_index)
    return NodeTopology(
        gpus=gpus,
        nvlink=tuple(NvlinkEdge(a, b, n) for (a, b), n in sorted(nvlink.items())),
        pcie=tuple(PcieEdge(a, b, level) for (a, b), level in sorted(pcie.items())),
        numa=_numa_nodes(report),
        nics=tuple(
            sorted((TopologyNic(n.name, n.pci_bus_id) for n in report.nics), key=lambda n: n.name)
        ),
    )


def _edges(
    report: NodeReport, uuid_by_index: Mapping[int, str]
) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], TopologyLevel]]:
    """NVLink link counts by GPU pair, PCIe relations by GPU pair and GPU-NIC pair."""
    nvlink: dict[tuple[str, str], int] = {}
    pcie: dict[tuple[str, str], TopologyLevel] = {}
    for pair in report.gpu_links:
        a, b = uuid_by_index.get(pair.a), uuid_by_index.get(pair.b)
        if a is None or b is None:
            continue
        key = (min(a, b), max(a, b))
        if pair.link.level is TopologyLevel.NVLINK:
            nvlink[key] = pair.link.nvlinks
        elif pair.link.level is not TopologyLevel.SELF:
            pcie[key] = pair.link.level
    for gpu in report.gpus:
        for peer in gpu.nvlink_peers:
            other = peer.peer_uuid or uuid_by_index.get(
                peer.peer_index if peer.peer_index is not None else -1
            )
            if other is not None and other != gpu.uuid:
                nvlink.setdefault((min(gpu.uuid, other), max(gpu.uuid, other)), peer.links)
    for nic in report.nics:
        for index, link in nic.relations.items():
            uuid = uuid_by_index.get(index)
            if uuid is not None and link.level is not TopologyLevel.SELF:
                pcie[(uuid, nic.name)] = link.level
    return nvlink, pcie


def _numa_nodes(report: NodeReport) -> tuple[NumaNode, ...]:
    """NUMA nodes of the GPUs; a NIC belongs to the NUMA node of the GPUs it shares a PCIe
    switch or host bridge with (PIX, PXB, PHB), as `topo -m` implies."""
    by_node: dict[int, list[str]] = {}
    cpus: dict[int, str] = {}
    numa_of_index: dict[int, int] = {}
    for gpu in report.gpus:
        if gpu.numa_node is None:
            continue
        by_node.setdefault(gpu.numa_node, []).append(gpu.uuid)
        cpus.setdefault(gpu.numa_node, format_cpu_list(gpu.cpu_affinity))
        numa_of_index[gpu.index] = gpu.numa_node
    near = (TopologyLevel.PIX, TopologyLevel.PXB, TopologyLevel.PHB)
    nics: dict[int, set[str]] = {}
    for nic in report.nics:
        for index, link in nic.relations.items():
            if link.level in near and index in numa_of_index:
                nics.setdefault(numa_of_index[index], set()).add(nic.name)
    return tuple(
        NumaNode(node, cpus[node], tuple(sorted(gpus)), tuple(sorted(nics.get(node, ()))))
        for node, gpus in sorted(by_node.items())
    )
