"""`gpualloc.common.v1.NodeTopology` (what the inventory publishes) -> the solver's NodeTopology.

The inventory names GPUs by UUID and says which DRA devices each one backs (the full GPU and its
partitions); the solver works on DRA device ids. GPUs without a published full-GPU device are
left out (nothing to allocate there); their partitions still point at nothing, so they get no
NVLink and no NUMA/PCIe facts.
"""

from __future__ import annotations

from protos.common.v1 import topology_pb2
from services.allocator.core import GpuPlace, NodeTopology, PcieRelation
from services.common.dra.model import DeviceID

__all__ = ["topology_from_pb"]

_RELATIONS = {
    topology_pb2.PCIE_RELATION_INTERNAL: PcieRelation.INTERNAL,
    topology_pb2.PCIE_RELATION_PIX: PcieRelation.PIX,
    topology_pb2.PCIE_RELATION_PXB: PcieRelation.PXB,
    topology_pb2.PCIE_RELATION_PHB: PcieRelation.PHB,
    topology_pb2.PCIE_RELATION_NODE: PcieRelation.NODE,
    topology_pb2.PCIE_RELATION_SYS: PcieRelation.SYS,
}


def _device_id(message: topology_pb2.TopologyGpu) -> DeviceID | None:
    ref = message.device
    if not (ref.driver and ref.pool and ref.device):
        return None
    return DeviceID(ref.driver, ref.pool, ref.device)


def topology_from_pb(message: topology_pb2.NodeTopology) -> NodeTopology | None:
    """The node's topology over its DRA devices; None when it names no allocatable GPU."""
    by_uuid: dict[str, DeviceID] = {}
    gpus: dict[DeviceID, GpuPlace] = {}
    parents: dict[DeviceID, DeviceID] = {}
    for gpu in message.gpus:
        device = _device_id(gpu)
        if device is None:
            continue
        by_uuid[gpu.uuid] = device
        gpus[device] = GpuPlace(
            numa=gpu.numa_node if gpu.HasField("numa_node") else None,
            pcie_root=gpu.pcie_root or None,
        )
        for part in gpu.partitions:
            parents[DeviceID(part.driver, part.pool, part.device)] = device
    if not gpus:
        return None
    nvlinks: dict[frozenset[DeviceID], int] = {}
    for edge in message.nvlink:
        a, b = by_uuid.get(edge.a), by_uuid.get(edge.b)
        if a is not None and b is not None and a != b and edge.links > 0:
            nvlinks[frozenset((a, b))] = edge.links
    nic_names = {nic.name for nic in message.nics}
    relations: dict[DeviceID, dict[str, PcieRelation]] = {}
    for pcie in message.pcie:
        relation = _RELATIONS.get(pcie.relation)
        gpu_id = by_uuid.get(pcie.a)
        if relation is None or gpu_id is None or pcie.b not in nic_names:
            continue
        relations.setdefault(gpu_id, {})[pcie.b] = relation
    return NodeTopology(gpus=gpus, nvlinks=nvlinks, nic_relations=relations, parents=parents)
