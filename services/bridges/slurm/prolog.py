"""Slurm prolog / task prolog / epilog: a job's GPUs come from gpualloc, on the job's nodes.

- prolog: for each node the prolog acts for (SLURMD_NODENAME in slurmd's Prolog; every node of
  SLURM_JOB_NODELIST in PrologSlurmctld), allocate and reserve the job's claim pinned to that
  node, owner `slurm/job/<id>`, idempotency key `slurm-<id>-<node>` (a re-run returns the same
  devices), then commit: the devices are the job's until the epilog. All nodes or none: when
  one node cannot be placed, the others are released and `Unplaceable` carries Explain's
  reason (which names who holds the devices: `slurm/job/...` or `kueue/...`).
- task prolog: reads the job's reservation on this node (no allocation) and says which GPUs
  the task may use.
- epilog: releases every reservation of the job (on this node, or on all nodes), idempotently.

The job's GPU environment is CUDA_VISIBLE_DEVICES with the devices' UUIDs (`GPU-…`, `MIG-…`,
from the inventory's `uuid` attributes), written as Slurm's TaskProlog reads its standard
output: `export NAME=value` lines (and `print ...` for messages to the task's output).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from services.bridges.placing import Placer, slurm_owner
from services.bridges.slurm.claims import claim_for_node
from services.bridges.slurm.gresconf import gres_entries
from services.bridges.slurm.hostlist import expand_hostlist
from services.bridges.slurm.request import SlurmGpuRequest, request_from_environ, with_types
from services.client.client import AllocatorClient
from services.client.errors import Unplaceable
from services.client.inventory import InventoryClient, NodeInventory
from services.client.lease import Lease
from services.client.results import Placement, Reservation
from services.common.dra.model import DeviceID, ResourceClaim
from services.common.errors import InvalidArgument

__all__ = [
    "JobGpus",
    "SlurmJob",
    "idempotency_key",
    "job_gpus",
    "run_epilog",
    "run_prolog",
    "task_gpus",
]

PROLOG_LEASE_SECONDS = 120.0


@dataclass(frozen=True)
class SlurmJob:
    """The job a prolog runs for: its id, the nodes this invocation acts for, its request."""

    job_id: str
    nodes: tuple[str, ...]
    request: SlurmGpuRequest

    @property
    def owner(self) -> str:
        return slurm_owner(self.job_id)

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str],
        *,
        node: str | None = None,
        request: SlurmGpuRequest | None = None,
    ) -> SlurmJob:
        job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or ""
        if not job_id.strip():
            raise InvalidArgument.at("SLURM_JOB_ID", "not set: run from a Slurm prolog or epilog")
        here = node or environ.get("SLURMD_NODENAME", "").strip()
        if here:
            nodes: tuple[str, ...] = (here,)
        else:
            nodelist = environ.get("SLURM_JOB_NODELIST", "").strip()
            if not nodelist:
                raise InvalidArgument.at(
                    "SLURMD_NODENAME", "neither SLURMD_NODENAME nor SLURM_JOB_NODELIST is set"
                )
            nodes = tuple(expand_hostlist(nodelist))
        return cls(job_id.strip(), nodes, request or request_from_environ(environ))


def idempotency_key(job_id: str, node: str) -> str:
    return f"slurm-{job_id}-{node}"


@dataclass(frozen=True)
class JobGpus:
    """The job's devices on one node and the environment that exposes them to its tasks."""

    node: str
    reservation_ids: tuple[str, ...]
    devices: tuple[DeviceID, ...]
    uuids: tuple[str, ...]
    without_uuid: tuple[DeviceID, ...] = ()

    def exports(self) -> list[str]:
        """TaskProlog output: `export` lines, plus a `print` for devices without a UUID."""
        lines = [
            f"export CUDA_VISIBLE_DEVICES={','.join(self.uuids)}",
            f"export GPUALLOC_RESERVATIONS={','.join(self.reservation_ids)}",
            f"export GPUALLOC_DEVICES={','.join(str(d) for d in self.devices)}",
        ]
        if self.without_uuid:
            missing = ", ".join(str(d) for d in self.without_uuid)
            lines.append(
                f"print gpualloc: no UUID yet for {missing} (a MIG device created on demand); "
                "it is reserved for this job but not in CUDA_VISIBLE_DEVICES"
            )
        return lines


def job_gpus(node: NodeInventory | None, node_name: str, held: Sequence[Reservation]) -> JobGpus:
    """The devices of `held` on `node_name`, with their UUIDs from the inventory."""
    devices = tuple(d for r in held for d in r.devices)
    uuids: list[str] = []
    missing: list[DeviceID] = []
    for device_id in devices:
        found = node.device(device_id) if node is not None else None
        uuid = found.uuid if found is not None else None
        if uuid is None:
            missing.append(device_id)
        else:
            uuids.append(uuid)
    return JobGpus(node_name, tuple(r.id for r in held), devices, tuple(uuids), tuple(missing))


def run_prolog(client: AllocatorClient, inventory: InventoryClient, job: SlurmJob) -> list[JobGpus]:
    """Reserve and commit the job's GPUs on each of its nodes (all or none); [] when the job
    asks for no GPU. Raises Unplaceable with the allocator's reason when a node has no room."""
    if not job.request.per_node:
        return []
    placer = Placer(client, inventory)
    leases: list[tuple[str, Lease]] = []
    with ExitStack() as stack:
        for node in job.nodes:
            claim = claim_for_node(job.job_id, _typed(job.request, inventory, node))

            def place(node: str = node, claim: ResourceClaim = claim) -> Placement:
                return placer.allocate(
                    [claim],
                    owner=job.owner,
                    idempotency_key=idempotency_key(job.job_id, node),
                    node_name=node,
                    lease_ttl_seconds=PROLOG_LEASE_SECONDS,
                    labels={"slurm.job_id": job.job_id, "slurm.node": node},
                )

            lease = Lease(client, place, owner=job.owner, lease_ttl_seconds=PROLOG_LEASE_SECONDS)
            try:
                stack.enter_context(lease)
            except Unplaceable as error:
                raise Unplaceable(error.placement, f"job {job.job_id} on {node}") from None
            leases.append((node, lease))
        for _, lease in leases:
            lease.commit()
        stack.pop_all()  # committed: nothing to release on the way out
    return [
        job_gpus(inventory.node(node, topology=False), node, lease.reservations)
        for node, lease in leases
    ]


def _typed(request: SlurmGpuRequest, inventory: InventoryClient, node: str) -> SlurmGpuRequest:
    """Slurm's GPU ids made typed by the node's gres.conf, as generated from the inventory."""
    if not request.gpu_ids:
        return request
    found = inventory.node(node, topology=True)
    if found is None:
        return request
    entries, _ = gres_entries(found)
    return with_types(request, [e.type for e in entries])


def task_gpus(client: AllocatorClient, inventory: InventoryClient, job: SlurmJob) -> list[JobGpus]:
    """What the prolog holds for the job on each of its nodes (read only)."""
    held = client.list(owner=job.owner)
    return [
        job_gpus(
            inventory.node(node, topology=False),
            node,
            [r for r in held if r.node_name == node],
        )
        for node in job.nodes
    ]


def run_epilog(client: AllocatorClient, job: SlurmJob, *, all_nodes: bool = False) -> list[str]:
    """Release the job's reservations (on the job's nodes, or everywhere); returns their ids.
    Idempotent: what is already gone is fine."""
    released = []
    for reservation in client.list(owner=job.owner):
        if all_nodes or reservation.node_name in job.nodes:
            client.release(reservation, owner=job.owner, allow_missing=True)
            released.append(reservation.id)
    return released
