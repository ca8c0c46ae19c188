"""The `gpualloc.io/topology-constraints` claim annotation: gpualloc's topology extension of DRA.

A DRA ResourceClaim cannot say "these GPUs must be NVLink-connected" (the NVIDIA driver publishes
no NVLink attribute), so a claim carries its topology constraints as an annotation, a JSON list:

    [{"kind": "NVLinkConnected", "requests": ["gpus"], "enforcement": "Required",
      "minNVLinks": 2, "maxNICRelation": "PXB"}]

`requests` name requests of that claim (empty or absent: all of them); the rest is optional,
defaults as shown except `minNVLinks` (1). This module is the annotation's one schema: the
allocator reads it for `gpualloc solve` (core/topology_constraints.py), the client turns it into
`AllocateRequest.topology_constraints` (annotations do not travel over gRPC).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from services.common.dra.limits import checked_json_loads
from services.common.errors import InvalidArgument, ParseError

__all__ = [
    "ANNOTATION",
    "NIC_RELATIONS",
    "TopologyConstraint",
    "TopologyKind",
    "annotated",
    "annotation_path",
    "format_annotation",
    "parse_annotation",
]

ANNOTATION = "gpualloc.io/topology-constraints"
# `nvidia-smi topo -m` relations between a GPU and a NIC, closest first.
NIC_RELATIONS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_FIELDS = frozenset({"kind", "requests", "enforcement", "minNVLinks", "maxNICRelation"})


class TopologyKind(StrEnum):
    NVLINK_CONNECTED = "NVLinkConnected"
    SAME_PCIE_ROOT = "SamePCIeRoot"
    SAME_NUMA_NODE = "SameNUMANode"
    GPU_NIC_AFFINITY = "GPUNICAffinity"


@dataclass(frozen=True)
class TopologyConstraint:
    """One annotation entry: a relation the devices of some requests of the claim must
    (`required`) or should have."""

    kind: TopologyKind
    requests: tuple[str, ...] = ()  # empty: every request of the claim
    required: bool = True
    min_nvlinks: int = 1
    max_nic_relation: str = "PXB"  # one of NIC_RELATIONS

    def to_json(self) -> dict[str, Any]:
        """The entry as the annotation writes it (defaults left out)."""
        item: dict[str, Any] = {"kind": str(self.kind)}
        if self.requests:
            item["requests"] = list(self.requests)
        if not self.required:
            item["enforcement"] = "Preferred"
        if self.min_nvlinks != 1:
            item["minNVLinks"] = self.min_nvlinks
        if self.max_nic_relation != "PXB":
            item["maxNICRelation"] = self.max_nic_relation
        return item


def annotation_path(prefix: str = "") -> str:
    """The field path of the annotation in a claim (`prefix`: the claim's own path, with dot)."""
    return f'{prefix}metadata.annotations["{ANNOTATION}"]'


def format_annotation(constraints: Iterable[TopologyConstraint]) -> str:
    return json.dumps([c.to_json() for c in constraints], separators=(",", ":"))


def parse_annotation(text: str, where: str = "") -> tuple[TopologyConstraint, ...]:
    """The annotation's entries; InvalidArgument with the field path (below `where`, by default
    the annotation's own path) when it is malformed."""
    where = where or annotation_path()
    try:
        raw = checked_json_loads(text, where)
    except json.JSONDecodeError as err:
        raise InvalidArgument.at(where, f"not JSON: {err.msg}") from None
    except ParseError as err:  # too large or too deep: the field path, not a source and line
        raise InvalidArgument.at(where, err.message.removeprefix(f"{where}: ")) from None
    if not isinstance(raw, list):
        raise InvalidArgument.at(where, "must be a JSON list of constraints")
    return tuple(_entry(item, f"{where}[{i}]") for i, item in enumerate(raw))


def annotated(annotations: Mapping[str, str], where: str = "") -> tuple[TopologyConstraint, ...]:
    """The entries of a claim's annotations (none without the annotation)."""
    text = annotations.get(ANNOTATION)
    return parse_annotation(text, where) if text is not None else ()


def _entry(item: Any, where: str) -> TopologyConstraint:
    if not isinstance(item, dict):
        raise InvalidArgument.at(where, "must be an object")
    unknown = sorted(set(item) - _FIELDS)
    if unknown:
        raise InvalidArgument.at(f"{where}.{unknown[0]}", "unknown field")
    try:
        kind = TopologyKind(str(item.get("kind")))
    except ValueError:
        kinds = ", ".join(k.value for k in TopologyKind)
        raise InvalidArgument.at(f"{where}.kind", f"must be one of {kinds}") from None
    requests = item.get("requests", [])
    if not isinstance(requests, list) or not all(isinstance(r, str) and r for r in requests):
        raise InvalidArgument.at(f"{where}.requests", "must be a list of request names")
    enforcement = item.get("enforcement", "Required")
    if enforcement not in ("Required", "Preferred"):
        raise InvalidArgument.at(f"{where}.enforcement", "must be Required or Preferred")
    links = item.get("minNVLinks", 1)
    if not isinstance(links, int) or isinstance(links, bool) or links < 1:
        raise InvalidArgument.at(f"{where}.minNVLinks", "must be an integer >= 1")
    relation = item.get("maxNICRelation", "PXB")
    if not isinstance(relation, str) or relation.upper() not in NIC_RELATIONS:
        raise InvalidArgument.at(
            f"{where}.maxNICRelation", f"must be one of {', '.join(NIC_RELATIONS)}"
        )
    return TopologyConstraint(
        kind, tuple(requests), enforcement == "Required", links, relation.upper()
    )
