"""How both bridges ask for devices: Allocate with reserve, NVLink-aware, with one owner naming.

Owners say which system holds what, in every reservation and every Explain: `slurm/job/<id>`
for Slurm jobs, `kueue/<namespace>/<workload>` for Kueue workloads.

NVLink. A claim asking for NVLink-connected GPUs carries the `gpualloc.io/topology-constraints`
annotation, which the client sends as a topology constraint. An allocator that does not support
topology constraints yet refuses it (INVALID_ARGUMENT on `topology_constraints`); then the
bridges fall back to a rule that is never wrong, only sometimes stricter: the claim may only
use nodes whose GPUs are *all* pairwise NVLink-connected (NVSwitch systems such as HGX H100),
as the inventory's topology shows. On such a node every set of its GPUs is NVLink-connected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

import grpc

from services.client.client import AllocateItem, AllocatorClient
from services.client.inventory import InventoryClient, NodeInventory
from services.client.results import Explanation, Outcome, Placement
from services.client.topology import ANNOTATION, TopologyKind, constraints_of
from services.common.dra.model import (
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceClaim,
)
from services.common.errors import GpuallocError, InvalidArgument
from services.common.grpc_errors import RemoteError

__all__ = [
    "Placer",
    "kueue_owner",
    "kueue_owner_of",
    "needs_nvlink",
    "nvlink_meshed_nodes",
    "slurm_job_of",
    "slurm_owner",
]

log = logging.getLogger("gpualloc.bridges")


_SLURM_JOB = "slurm/job/"
_KUEUE = "kueue/"


def slurm_owner(job_id: str) -> str:
    return f"{_SLURM_JOB}{job_id}"


def slurm_job_of(owner: str) -> str | None:
    """The Slurm job id of a reservation owner: `slurm/job/<id>`, or `<tenant>/slurm/job/<id>`
    as a server under an access policy stores and lists it; None for any other owner."""
    ours = _bridge_owner(owner, _SLURM_JOB)
    return (ours.removeprefix(_SLURM_JOB) or None) if ours is not None else None


def kueue_owner(namespace: str, workload: str) -> str:
    return f"{_KUEUE}{namespace}/{workload}"


def kueue_owner_of(owner: str) -> str | None:
    """The Kueue controller's owner (`kueue/<ns>/<workload>`) of a reservation owner, which a
    server under an access policy stores and lists as `<tenant>/kueue/<ns>/<workload>`; None
    for any other owner."""
    return _bridge_owner(owner, _KUEUE)


def _bridge_owner(owner: str, head: str) -> str | None:
    """`owner` as a bridge names it (it starts with `head`), its tenant prefix dropped."""
    if owner.startswith(head):
        return owner
    _, slash, rest = owner.partition("/")
    return rest if slash and rest.startswith(head) else None


def needs_nvlink(claims: Sequence[ResourceClaim]) -> bool:
    return any(
        c.kind is TopologyKind.NVLINK_CONNECTED and c.required
        for claim in claims
        for c in constraints_of(claim)
    )


def nvlink_meshed_nodes(nodes: Sequence[NodeInventory]) -> list[str]:
    """Nodes with at least two whole GPUs, every pair of them linked by NVLink."""
    meshed = []
    for node in nodes:
        uuids = [g.uuid for g in node.gpus if g.device is not None]
        if len(uuids) >= 2 and all(node.nvlink_count(a, b) > 0 for a, b in combinations(uuids, 2)):
            meshed.append(node.name)
    return sorted(meshed)


def _without_topology(claims: Sequence[ResourceClaim]) -> list[ResourceClaim]:
    return [
        replace(c, annotations={k: v for k, v in c.annotations.items() if k != ANNOTATION})
        for c in claims
    ]


def _restrict(selector: NodeSelector | None, names: Sequence[str]) -> NodeSelector:
    """`selector` AND "the node is one of `names`". A `metadata.name` field requirement takes
    exactly one value (as in Kubernetes), so each name gets its own term (terms are ORed)."""
    terms = selector.node_selector_terms if selector is not None else (NodeSelectorTerm(),)
    return NodeSelector(
        tuple(
            NodeSelectorTerm(
                match_expressions=term.match_expressions,
                match_fields=(
                    *term.match_fields,
                    NodeSelectorRequirement("metadata.name", "In", (name,)),
                ),
            )
            for term in terms
            for name in names
        )
    )


@dataclass
class Placer:
    """Allocate/Explain for a bridge, with the NVLink fallback of the module docstring."""

    client: AllocatorClient
    inventory: InventoryClient

    def for_tenant(self, tenant: str) -> Placer:
        """This placer with every allocator call acting for `tenant` (AllocatorClient's
        for_tenant; "": the caller's own tenant)."""
        if tenant == self.client.tenant:
            return self
        return replace(self, client=self.client.for_tenant(tenant))

    def allocate(
        self,
        claims: Sequence[ResourceClaim],
        *,
        owner: str,
        idempotency_key: str,
        node_name: str = "",
        node_selector: NodeSelector | None = None,
        lease_ttl_seconds: float | None = None,
        labels: Mapping[str, str] | None = None,
        priority_class: str = "",
        preempt: bool = False,
        queued_at: float | None = None,
    ) -> Placement:
        """Allocate and reserve (preempting, with `preempt`, as the server's rules allow); an
        unsatisfiable answer comes with Explain's reasons. A fitting answer always holds the
        reservation: when Explain finds the devices free (released since the Allocate), the
        Allocate is made once more. `queued_at`: when the job was queued in its batch system
        (its Workload's creation)."""

        def call(sent: Sequence[ResourceClaim], selector: NodeSelector | None) -> Placement:
            return self.client.allocate(
                sent,
                node_name=node_name,
                node_selector=selector,
                reserve=True,
                explain=False,
                lease_ttl_seconds=lease_ttl_seconds,
                owner=owner,
                idempotency_key=idempotency_key,
                labels=labels,
                priority_class=priority_class,
                preempt=preempt,
                queued_at=queued_at,
            )

        placement = self._with_fallback(claims, node_name, node_selector, call)
        if placement.fits:
            return placement
        explained = self.explain(claims, node_name=node_name, node_selector=node_selector)
        if not explained.fits:
            return explained
        # Freed between the two calls (a release raced the Allocate): Explain's "fits" reserved
        # nothing, so it must not stand for the answer. Reserve again, once.
        placement = self._with_fallback(claims, node_name, node_selector, call)
        if placement.fits:
            return placement
        explained = self.explain(claims, node_name=node_name, node_selector=node_selector)
        return placement if explained.fits else explained

    def allocate_many(self, items: Sequence[AllocateItem]) -> list[Placement | GpuallocError]:
        """Many reserving `allocate`s in one AllocateBatch (a bridge's pass: docs/api.md), in
        order, each seeing the reservations of the ones before it; per item its Placement, or
        the typed error it alone failed with. What `allocate` adds is added per item: an
        unsatisfiable answer comes with Explain's reasons (and is allocated once more when
        Explain finds it fits now), an item refused for its NVLink topology constraint takes
        the fallback. An allocator without AllocateBatch gets one Allocate per item."""
        sent = [replace(item, reserve=True, explain=False) for item in items]
        try:
            results = self.client.allocate_many(sent)
        except RemoteError as error:
            if error.code is not grpc.StatusCode.UNIMPLEMENTED:
                raise
            results = [self._one(item) for item in sent]
        return [self._finished(item, result) for item, result in zip(sent, results, strict=True)]

    def _finished(
        self, item: AllocateItem, result: Placement | GpuallocError
    ) -> Placement | GpuallocError:
        """A batch item's result as `allocate` would have answered it."""
        if isinstance(result, Placement):
            if result.fits:
                return result
            explained = self.explain(
                item.claims, node_name=item.node_name, node_selector=item.node_selector
            )
            return self._one(item) if explained.fits else explained  # fits now: once more
        nvlink = isinstance(result, InvalidArgument) and result.field_path == "topology_constraints"
        return self._one(item) if nvlink and needs_nvlink(item.claims) else result

    def _one(self, item: AllocateItem) -> Placement | GpuallocError:
        try:
            return self.allocate(
                item.claims,
                owner=item.owner or self.client.owner,
                idempotency_key=item.idempotency_key,
                node_name=item.node_name,
                node_selector=item.node_selector,
                lease_ttl_seconds=item.lease_ttl_seconds,
                labels=item.labels,
                priority_class=item.priority_class,
                preempt=item.preempt,
                queued_at=item.queued_at,
            )
        except GpuallocError as error:
            return error

    def explain(
        self,
        claims: Sequence[ResourceClaim],
        *,
        node_name: str = "",
        node_selector: NodeSelector | None = None,
    ) -> Placement:
        def call(sent: Sequence[ResourceClaim], selector: NodeSelector | None) -> Placement:
            return self.client.explain(sent, node_name=node_name, node_selector=selector)

        return self._with_fallback(claims, node_name, node_selector, call)

    def fits_anywhere(
        self, claims: Sequence[ResourceClaim], node_selector: NodeSelector | None = None
    ) -> bool:
        """Whether the claims fit some node of the cluster at all (reservations ignored)."""

        def call(sent: Sequence[ResourceClaim], selector: NodeSelector | None) -> Placement:
            capacity = self.client.capacity(sent, node_selector=selector, ignore_reservations=True)
            return Placement(Outcome.ALLOCATED if capacity.total > 0 else Outcome.UNSATISFIABLE)

        return self._with_fallback(claims, "", node_selector, call).fits

    def _with_fallback(
        self,
        claims: Sequence[ResourceClaim],
        node_name: str,
        node_selector: NodeSelector | None,
        call: Callable[[Sequence[ResourceClaim], NodeSelector | None], Placement],
    ) -> Placement:
        try:
            return call(claims, node_selector)
        except InvalidArgument as error:
            if error.field_path != "topology_constraints" or not needs_nvlink(claims):
                raise
        meshed = nvlink_meshed_nodes(self.inventory.nodes())
        log.info("allocator has no topology constraints; NVLink via fully meshed nodes %s", meshed)
        if not meshed or (node_name and node_name not in meshed):
            where = f"node {node_name}: its GPUs are not" if node_name else "no node has GPUs"
            message = f"{where} all NVLink-connected, as the claims require"
            return Placement(Outcome.UNSATISFIABLE, explanation=Explanation((message,)))
        return call(_without_topology(claims), _restrict(node_selector, meshed))
