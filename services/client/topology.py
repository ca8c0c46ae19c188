"""Topology constraints as the client sends them: the claim annotation, as request fields.

A DRA ResourceClaim cannot say "these GPUs must be NVLink-connected"; gpualloc's extension is
the claim annotation `gpualloc.io/topology-constraints` (its schema, shared with the allocator's
`gpualloc solve`, is services/common/dra/topology_annotation.py):

    [{"kind": "NVLinkConnected", "requests": ["gpus"], "minNVLinks": 1}]

Annotations do not travel over gRPC (the proto claim has no annotations), so the client turns
the annotation of each claim it sends into `AllocateRequest.topology_constraints`, naming the
claim's requests. `claim_from_spec("4 x H100 nvlink")` writes the annotation, so one claim value
works with both `gpualloc solve` and the service.
"""

from __future__ import annotations

from collections.abc import Sequence

from protos.allocator.v1 import allocator_pb2 as pb
from protos.common.v1 import topology_pb2
from services.common.dra.model import ResourceClaim
from services.common.dra.topology_annotation import (
    ANNOTATION,
    TopologyConstraint,
    TopologyKind,
    annotated,
    format_annotation,
    parse_annotation,
)

__all__ = [
    "ANNOTATION",
    "TopologyConstraint",
    "TopologyKind",
    "constraints_of",
    "format_annotation",
    "parse_annotation",
    "to_pb_topology_constraints",
]

_KIND_TO_PB = {
    TopologyKind.NVLINK_CONNECTED: pb.TOPOLOGY_CONSTRAINT_KIND_NVLINK_CONNECTED,
    TopologyKind.SAME_PCIE_ROOT: pb.TOPOLOGY_CONSTRAINT_KIND_SAME_PCIE_ROOT,
    TopologyKind.SAME_NUMA_NODE: pb.TOPOLOGY_CONSTRAINT_KIND_SAME_NUMA_NODE,
    TopologyKind.GPU_NIC_AFFINITY: pb.TOPOLOGY_CONSTRAINT_KIND_GPU_NIC_AFFINITY,
}
_RELATIONS = {
    "PIX": topology_pb2.PCIE_RELATION_PIX,
    "PXB": topology_pb2.PCIE_RELATION_PXB,
    "PHB": topology_pb2.PCIE_RELATION_PHB,
    "NODE": topology_pb2.PCIE_RELATION_NODE,
    "SYS": topology_pb2.PCIE_RELATION_SYS,
}


def constraints_of(claim: ResourceClaim) -> tuple[TopologyConstraint, ...]:
    """The claim's topology constraints (none without the annotation)."""
    return annotated(claim.annotations)


def to_pb_topology_constraints(claims: Sequence[ResourceClaim]) -> list[pb.TopologyConstraint]:
    """Every claim's annotation as AllocateRequest.topology_constraints (requests qualified by
    the claim's name; an empty request list means all of the claim's requests)."""
    messages = []
    for claim in claims:
        for constraint in constraints_of(claim):
            names = constraint.requests or tuple(r.name for r in claim.requests)
            messages.append(
                pb.TopologyConstraint(
                    requests=[pb.RequestRef(claim=claim.name, request=name) for name in names],
                    kind=_KIND_TO_PB[constraint.kind],
                    enforcement=(
                        pb.ENFORCEMENT_REQUIRED if constraint.required else pb.ENFORCEMENT_PREFERRED
                    ),
                    min_nvlink_links=constraint.min_nvlinks,
                    max_nic_relation=(
                        _RELATIONS[constraint.max_nic_relation]
                        if constraint.kind is TopologyKind.GPU_NIC_AFFINITY
                        else topology_pb2.PCIE_RELATION_UNSPECIFIED
                    ),
                )
            )
    return messages
