"""Topology constraints as the client sends them, and the claim annotation that carries them.

A DRA ResourceClaim cannot say "these GPUs must be NVLink-connected": the NVIDIA driver publishes
no NVLink attribute. gpualloc's extension is a claim annotation, `gpualloc.io/topology-constraints`,
a JSON list that `gpualloc solve` reads from files (see services/allocator/core/
topology_constraints.py for the server's reading of it):

    [{"kind": "NVLinkConnected", "requests": ["gpus"], "enforcement": "Required", "minNVLinks": 1}]

Annotations do not travel over gRPC (the proto claim has no annotations), so the client turns
the annotation of each claim it sends into `AllocateRequest.topology_constraints`, naming the
claim's requests. `claim_from_spec("4 x H100 nvlink")` writes the annotation, so one claim value
works with both `gpualloc solve` and the service.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from protos.allocator.v1 import allocator_pb2 as pb
from protos.common.v1 import topology_pb2
from services.common.dra.model import ResourceClaim
from services.common.errors import InvalidArgument

__all__ = [
    "ANNOTATION",
    "TopologyConstraint",
    "TopologyKind",
    "constraints_of",
    "format_annotation",
    "parse_annotation",
    "to_pb_topology_constraints",
]

ANNOTATION = "gpualloc.io/topology-constraints"


class TopologyKind(StrEnum):
    NVLINK_CONNECTED = "NVLinkConnected"
    SAME_PCIE_ROOT = "SamePCIeRoot"
    SAME_NUMA_NODE = "SameNUMANode"
    GPU_NIC_AFFINITY = "GPUNICAffinity"


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
_FIELDS = frozenset({"kind", "requests", "enforcement", "minNVLinks", "maxNICRelation"})


@dataclass(frozen=True)
class TopologyConstraint:
    """A relation the devices of some requests of one claim must (or should) have."""

    kind: TopologyKind
    requests: tuple[str, ...] = ()  # empty: every request of the claim
    required: bool = True
    min_nvlinks: int = 1
    max_nic_relation: str = "PXB"

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {"kind": self.kind.value}
        if self.requests:
            data["requests"] = list(self.requests)
        data["enforcement"] = "Required" if self.required else "Preferred"
        if self.kind is TopologyKind.NVLINK_CONNECTED and self.min_nvlinks != 1:
            data["minNVLinks"] = self.min_nvlinks
        if self.kind is TopologyKind.GPU_NIC_AFFINITY:
            data["maxNICRelation"] = self.max_nic_relation
        return data


def format_annotation(constraints: Sequence[TopologyConstraint]) -> str:
    return json.dumps([c.to_json() for c in constraints], separators=(", ", ": "))


def parse_annotation(
    text: str, path: str = f"metadata.annotations[{ANNOTATION!r}]"
) -> list[TopologyConstraint]:
    """The annotation's constraints; InvalidArgument naming the annotation when malformed."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidArgument.at(path, f"not JSON: {error.msg}") from None
    if not isinstance(data, list):
        raise InvalidArgument.at(path, "must be a JSON list of constraints")
    return [_constraint(item, f"{path}[{i}]") for i, item in enumerate(data)]


def _constraint(item: object, path: str) -> TopologyConstraint:
    if not isinstance(item, dict):
        raise InvalidArgument.at(path, "must be an object")
    unknown = set(item) - _FIELDS
    if unknown:
        raise InvalidArgument.at(path, f"unknown field {sorted(unknown)[0]!r}")
    try:
        kind = TopologyKind(str(item.get("kind")))
    except ValueError:
        kinds = ", ".join(k.value for k in TopologyKind)
        raise InvalidArgument.at(f"{path}.kind", f"must be one of {kinds}") from None
    requests = item.get("requests", [])
    if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
        raise InvalidArgument.at(f"{path}.requests", "must be a list of request names")
    enforcement = item.get("enforcement", "Required")
    if enforcement not in ("Required", "Preferred"):
        raise InvalidArgument.at(f"{path}.enforcement", "must be Required or Preferred")
    min_nvlinks = item.get("minNVLinks", 1)
    if not isinstance(min_nvlinks, int) or min_nvlinks < 1:
        raise InvalidArgument.at(f"{path}.minNVLinks", "must be an integer >= 1")
    relation = item.get("maxNICRelation", "PXB")
    if relation not in _RELATIONS:
        raise InvalidArgument.at(
            f"{path}.maxNICRelation", f"must be one of {', '.join(_RELATIONS)}"
        )
    return TopologyConstraint(
        kind, tuple(requests), enforcement == "Required", min_nvlinks, relation
    )


def constraints_of(claim: ResourceClaim) -> list[TopologyConstraint]:
    """The claim's topology constraints (none without the annotation)."""
    text = claim.annotations.get(ANNOTATION)
    return parse_annotation(text) if text else []


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
