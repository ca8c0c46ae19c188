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

For `gpualloc solve` the constraints ride on a claim annotation (`ANNOTATION`, its schema in
services/common/dra/topology_annotation.py), scoped here to the annotated claim's requests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from services.allocator.core.explain import TopologyMiss, TopologyProblem, TopologyProblemKind
from services.allocator.core.plan import Alternative, Plan
from services.allocator.core.topology import NodeTopology, PcieRelation
from services.common.dra import topology_annotation as annotation
from services.common.dra.model import DeviceID, ResourceClaim
from services.common.dra.topology_annotation import (
    ANNOTATION,
    TopologyKind,
    annotated,
    annotation_path,
)
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

    def miss(self, index: int, problem: TopologyProblem) -> TopologyMiss:
        """The rejection fact for this constraint (its index in the plan) and a problem."""
        return TopologyMiss(index, self.kind, self.min_nvlinks, self.max_nic_relation.name, problem)


# --- the annotation (schema: services/common/dra/topology_annotation.py) ----------------------


def parse_annotation(claim: ResourceClaim, path: str = "") -> tuple[TopologyConstraint, ...]:
    """The claim's annotation as constraints scoped to its own requests; InvalidArgument with
    the annotation's field path when it is malformed."""
    owner = f"{claim.namespace}/{claim.name}"
    return tuple(
        TopologyConstraint(
            entry.kind,
            tuple(RequestRef(r, owner) for r in entry.requests) or (RequestRef("", owner),),
            entry.required,
            entry.min_nvlinks,
            PcieRelation.parse(entry.max_nic_relation),
        )
        for entry in annotated(claim.annotations, annotation_path(path))
    )


def format_annotation(constraints: Iterable[TopologyConstraint]) -> str:
    """The annotation's JSON for constraints of one claim (request names only)."""
    return annotation.format_annotation(
        annotation.TopologyConstraint(
            c.kind,
            tuple(r.request for r in c.requests if r.request),
            c.required,
            c.min_nvlinks,
            c.max_nic_relation.name,
        )
        for c in constraints
    )


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

    def problem(self, device: DeviceID) -> TopologyProblem | None:
        topology, constraint = self.topology, self.constraint
        if topology is None:
            return TopologyProblem(TopologyProblemKind.UNKNOWN)
        kind = constraint.kind
        if kind is TopologyKind.NVLINK_CONNECTED:
            if not topology.is_whole_gpu(device):
                return TopologyProblem(TopologyProblemKind.NOT_WHOLE_GPU)
            for member in self.members:
                links = topology.links(member, device)
                if links < constraint.min_nvlinks:
                    return TopologyProblem(
                        TopologyProblemKind.FEW_LINKS, count=links, device=member.device
                    )
            return None
        if kind is TopologyKind.GPU_NIC_AFFINITY:
            relation = topology.nic_relation(device)
            if relation is None:
                return TopologyProblem(TopologyProblemKind.NO_NIC)
            if relation > constraint.max_nic_relation:
                return TopologyProblem(TopologyProblemKind.NIC_TOO_FAR, value=relation.name)
            return None
        value = _value(kind, topology, device)
        if value is None:
            return TopologyProblem(TopologyProblemKind.PLACE_UNKNOWN)
        if self.values and value not in self.values:
            other = str(next(iter(self.values)))
            return TopologyProblem(TopologyProblemKind.PLACE_DIFFERS, value=str(value), other=other)
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


def bound(
    constraint: TopologyConstraint,
    topology: NodeTopology | None,
    devices: Sequence[DeviceID],
    clique: Callable[[], int] | None = None,
) -> tuple[int, TopologyProblem]:
    """How many of `devices` can be in the constraint's set together, and why not more;
    `clique`, when given, knows their largest NVLink clique (kept for nodes wired alike)."""
    if topology is None:
        return 0, TopologyProblem(TopologyProblemKind.UNKNOWN)
    kind = constraint.kind
    if kind is TopologyKind.NVLINK_CONNECTED:
        most = clique() if clique else topology.largest_clique(devices, constraint.min_nvlinks)
        return most, TopologyProblem(TopologyProblemKind.CLIQUE, count=most)
    if kind is TopologyKind.GPU_NIC_AFFINITY:
        limit = constraint.max_nic_relation
        good = sum(1 for d in devices if (r := topology.nic_relation(d)) is not None and r <= limit)
        return good, TopologyProblem(TopologyProblemKind.NICS, count=good)
    counts: dict[object, int] = {}
    for device in devices:
        value = _value(kind, topology, device)
        if value is not None:
            counts[value] = counts.get(value, 0) + 1
    most = max(counts.values(), default=0)
    return most, TopologyProblem(TopologyProblemKind.SHARE_PLACE, count=most)


def nvlink_links(topology: NodeTopology | None, devices: Iterable[DeviceID]) -> int:
    return topology.nvlink_bandwidth(devices) if topology is not None else 0


def numa_nodes(topology: NodeTopology | None, devices: Iterable[DeviceID]) -> int:
    if topology is None:
        return 0
    return len({p.numa for d in devices if (p := topology.place(d)) is not None})
