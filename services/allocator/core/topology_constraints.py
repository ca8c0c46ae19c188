"""Topology constraints: relations the devices of some requests must (or should) have.

A gpualloc extension of DRA constraints (the proto's `TopologyConstraint`), over the requests of
one or several claims allocated together:

- NVLINK_CONNECTED: every pair of the devices is linked by >= `min_nvlinks` NVLinks. An NVSwitch
  system is one clique; partial meshes and 2-GPU bridges are not. Only whole GPUs qualify.
- SAME_PCIE_ROOT / SAME_NUMA_NODE: all devices hang off one PCIe root complex / NUMA node.
- GPU_NIC_AFFINITY: every device's GPU has a NIC at `max_nic_relation` or closer (PXB: under
  the same PCIe switch tree, as GPUDirect RDMA wants).

Required constraints are checked while searching, device by device, like matchAttribute: each
check only looks at the devices already in the set, so a failure is final for that set
(`TopologyState`). Preferred ones are searched for first and count in the node's score when
missed. A device the node's topology does not know never satisfies a constraint (a missing
attribute, in matchAttribute's terms).

For `gpualloc solve` the constraints ride on a claim annotation (`ANNOTATION`), a JSON list:

    [{"kind": "NVLinkConnected", "requests": ["gpus"], "enforcement": "Required",
      "minNVLinks": 2, "maxNICRelation": "PXB"}]

`requests` name requests of that claim (empty or absent: all of them); the rest is optional.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from services.allocator.core.plan import Alternative, Plan
from services.allocator.core.topology import NodeTopology, PcieRelation
from services.common.dra.model import DeviceID, ResourceClaim
from services.common.errors import InvalidArgument

__all__ = [
    "ANNOTATION",
    "Scoped",
    "bound",
    "numa_nodes",
    "nvlink_links",
    "RequestRef",
    "TopologyConstraint",
    "TopologyKind",
    "TopologyPlan",
    "TopologyState",
    "constraints_from_annotations",
    "format_annotation",
    "parse_annotation",
]

ANNOTATION = "gpualloc.io/topology-constraints"
_FIELDS = frozenset({"kind", "requests", "enforcement", "minNVLinks", "maxNICRelation"})


class TopologyKind(StrEnum):
    NVLINK_CONNECTED = "NVLinkConnected"
    SAME_PCIE_ROOT = "SamePCIeRoot"
    SAME_NUMA_NODE = "SameNUMANode"
    GPU_NIC_AFFINITY = "GPUNICAffinity"


@dataclass(frozen=True)
class RequestRef:
    """One request of one claim: `claim` is `name` or `namespace/name` (empty: the request
    name in every claim); an empty `request` is every request of the claim."""

    request: str
    claim: str = ""


@dataclass(frozen=True)
class TopologyConstraint:
    kind: TopologyKind
    requests: tuple[RequestRef, ...] = ()  # empty: every request of every claim
    required: bool = True
    min_nvlinks: int = 1
    max_nic_relation: PcieRelation = PcieRelation.PXB

    def describe(self) -> str:
        if self.kind is TopologyKind.NVLINK_CONNECTED and self.min_nvlinks > 1:
            return f"{self.kind} (>= {self.min_nvlinks} links)"
        if self.kind is TopologyKind.GPU_NIC_AFFINITY:
            return f"{self.kind} (NIC at {self.max_nic_relation.name} or closer)"
        return str(self.kind)


# --- the annotation -------------------------------------------------------------------------


def parse_annotation(claim: ResourceClaim, path: str = "") -> tuple[TopologyConstraint, ...]:
    """The claim's annotation as constraints scoped to its own requests; InvalidArgument with
    the annotation's field path when it is malformed."""
    text = claim.annotations.get(ANNOTATION)
    if text is None:
        return ()
    where = f'{path}metadata.annotations["{ANNOTATION}"]'
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidArgument.at(where, f"not JSON: {err.msg}") from None
    if not isinstance(raw, list):
        raise InvalidArgument.at(where, "must be a JSON list of constraints")
    owner = f"{claim.namespace}/{claim.name}"
    return tuple(_constraint(item, owner, f"{where}[{i}]") for i, item in enumerate(raw))


def _constraint(item: Any, owner: str, where: str) -> TopologyConstraint:
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
    if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
        raise InvalidArgument.at(f"{where}.requests", "must be a list of request names")
    enforcement = item.get("enforcement", "Required")
    if enforcement not in ("Required", "Preferred"):
        raise InvalidArgument.at(f"{where}.enforcement", "must be Required or Preferred")
    links = item.get("minNVLinks", 1)
    if not isinstance(links, int) or isinstance(links, bool) or links < 1:
        raise InvalidArgument.at(f"{where}.minNVLinks", "must be an integer >= 1")
    try:
        relation = PcieRelation.parse(str(item.get("maxNICRelation", "PXB")))
    except ValueError as err:
        raise InvalidArgument.at(f"{where}.maxNICRelation", str(err)) from None
    refs = tuple(RequestRef(r, owner) for r in requests) or (RequestRef("", owner),)
    return TopologyConstraint(kind, refs, enforcement == "Required", links, relation)


def format_annotation(constraints: Iterable[TopologyConstraint]) -> str:
    """The annotation's JSON for constraints of one claim (request names only)."""
    items = []
    for constraint in constraints:
        item: dict[str, Any] = {"kind": str(constraint.kind)}
        names = [r.request for r in constraint.requests if r.request]
        if names:
            item["requests"] = names
        if not constraint.required:
            item["enforcement"] = "Preferred"
        if constraint.min_nvlinks != 1:
            item["minNVLinks"] = constraint.min_nvlinks
        if constraint.max_nic_relation is not PcieRelation.PXB:
            item["maxNICRelation"] = constraint.max_nic_relation.name
        items.append(item)
    return json.dumps(items, separators=(",", ":"))


def constraints_from_annotations(claims: Sequence[ResourceClaim]) -> tuple[TopologyConstraint, ...]:
    return tuple(
        c for i, claim in enumerate(claims) for c in parse_annotation(claim, f"claims[{i}].")
    )


# --- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scoped:
    index: int
    constraint: TopologyConstraint
    implicit: bool  # added by the default policy, not asked for
    requests: frozenset[tuple[int, int]]  # (claim index, request index)


class TopologyPlan:
    """Which constraint covers which request; the preferred ones in the order they are tried."""

    def __init__(
        self,
        plan: Plan,
        constraints: Sequence[TopologyConstraint],
        *,
        implicit_nvlink: bool = False,
    ) -> None:
        self.scoped: list[Scoped] = []
        for i, constraint in enumerate(constraints):
            requests = _resolve(plan, constraint, f"topologyConstraints[{i}]")
            self.scoped.append(Scoped(i, constraint, False, requests))
        if implicit_nvlink:
            self._add_implicit(plan)
        self.required = [s for s in self.scoped if s.constraint.required]
        self.preferred = [s for s in self.scoped if not s.constraint.required]

    def _add_implicit(self, plan: Plan) -> None:
        """The default policy's taste: the devices of one multi-device request NVLink-connected."""
        for claim in plan.claims:
            for request in claim.requests:
                if any(a.count >= 2 for a in request.alternatives):
                    constraint = TopologyConstraint(TopologyKind.NVLINK_CONNECTED, required=False)
                    scope = frozenset({(claim.index, request.alternatives[0].request_index)})
                    self.scoped.append(Scoped(len(self.scoped), constraint, True, scope))

    @property
    def empty(self) -> bool:
        return not self.scoped

    def covering(self, alternative: Alternative, active: Iterable[Scoped]) -> list[Scoped]:
        where = (alternative.claim_index, alternative.request_index)
        return [s for s in active if where in s.requests]


def _resolve(plan: Plan, constraint: TopologyConstraint, path: str) -> frozenset[tuple[int, int]]:
    if not constraint.requests:
        return frozenset((c.index, r) for c in plan.claims for r in range(len(c.requests)))
    found: set[tuple[int, int]] = set()
    for j, ref in enumerate(constraint.requests):
        matched = False
        for claim in plan.claims:
            if ref.claim and ref.claim not in (claim.label, claim.claim.name):
                continue
            for r, request in enumerate(claim.requests):
                if ref.request in ("", request.name):
                    found.add((claim.index, r))
                    matched = True
        if not matched:
            raise InvalidArgument.at(
                f"{path}.requests[{j}]",
                f"no request {ref.request!r} in "
                + (f"claim {ref.claim}" if ref.claim else "the claims"),
            )
    return frozenset(found)


# --- checking ---------------------------------------------------------------------------------


class TopologyState:
    """The devices picked so far for one constraint on one node; `add`/`remove` pair up."""

    __slots__ = ("constraint", "members", "topology", "values")

    def __init__(self, constraint: TopologyConstraint, topology: NodeTopology | None) -> None:
        self.constraint = constraint
        self.topology = topology
        self.members: list[DeviceID] = []
        self.values: dict[object, int] = {}

    def problem(self, device: DeviceID) -> str | None:
        topology, constraint = self.topology, self.constraint
        if topology is None:
            return "the node's topology is not known"
        kind = constraint.kind
        if kind is TopologyKind.NVLINK_CONNECTED:
            if not topology.is_whole_gpu(device):
                return "not a whole GPU of the node's NVLink topology"
            for member in self.members:
                links = topology.links(member, device)
                if links < constraint.min_nvlinks:
                    return f"{links} NVLinks to {member.device} (needs {constraint.min_nvlinks})"
            return None
        if kind is TopologyKind.GPU_NIC_AFFINITY:
            relation = topology.nic_relation(device)
            if relation is None:
                return "no NIC known for its GPU"
            if relation > constraint.max_nic_relation:
                return (
                    f"closest NIC is {relation.name} "
                    f"(needs {constraint.max_nic_relation.name} or closer)"
                )
            return None
        value = _value(kind, topology, device)
        if value is None:
            return f"{_what(kind)} not known"
        if self.values and value not in self.values:
            return f"{_what(kind)} {value} differs from {next(iter(self.values))}"
        return None

    def add(self, device: DeviceID) -> None:
        self.members.append(device)
        if self.topology is not None:
            value = _value(self.constraint.kind, self.topology, device)
            if value is not None:
                self.values[value] = self.values.get(value, 0) + 1

    def remove(self, device: DeviceID) -> None:
        self.members.remove(device)
        if self.topology is not None:
            value = _value(self.constraint.kind, self.topology, device)
            if value is not None:
                left = self.values[value] - 1
                if left:
                    self.values[value] = left
                else:
                    del self.values[value]


def _value(kind: TopologyKind, topology: NodeTopology, device: DeviceID) -> object | None:
    place = topology.place(device)
    if place is None:
        return None
    if kind is TopologyKind.SAME_PCIE_ROOT:
        return place.pcie_root
    if kind is TopologyKind.SAME_NUMA_NODE:
        return place.numa
    return None


def _what(kind: TopologyKind) -> str:
    return "PCIe root" if kind is TopologyKind.SAME_PCIE_ROOT else "NUMA node"


def bound(
    constraint: TopologyConstraint, topology: NodeTopology | None, devices: Sequence[DeviceID]
) -> tuple[int, str]:
    """How many of `devices` can be in the constraint's set together, and why not more."""
    if topology is None:
        return 0, "the node's topology is not known"
    kind = constraint.kind
    if kind is TopologyKind.NVLINK_CONNECTED:
        most = topology.largest_clique(devices, constraint.min_nvlinks)
        return most, f"largest free NVLink-connected set is {most}"
    if kind is TopologyKind.GPU_NIC_AFFINITY:
        limit = constraint.max_nic_relation
        good = sum(1 for d in devices if (r := topology.nic_relation(d)) is not None and r <= limit)
        return good, f"{good} have a NIC at {limit.name} or closer"
    counts: dict[object, int] = {}
    for device in devices:
        value = _value(kind, topology, device)
        if value is not None:
            counts[value] = counts.get(value, 0) + 1
    most = max(counts.values(), default=0)
    return most, f"at most {most} share a {_what(kind)}"


def nvlink_links(topology: NodeTopology | None, devices: Iterable[DeviceID]) -> int:
    return topology.nvlink_bandwidth(devices) if topology is not None else 0


def numa_nodes(topology: NodeTopology | None, devices: Iterable[DeviceID]) -> int:
    if topology is None:
        return 0
    return len({p.numa for d in devices if (p := topology.place(d)) is not None})
