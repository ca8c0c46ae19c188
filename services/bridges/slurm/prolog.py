"""Slurm prolog / task prolog / epilog: a job's GPUs come from gpualloc, on the job's nodes.

One GPU choice: Slurm picks the GPUs (its ids index the node's gres.conf GPU lines, which
`gpualloc-slurm gres-conf` writes from the inventory, one line per device, so id -> line ->
inventory device), and gpualloc reserves exactly those devices or nothing. Slurm's cgroups
(ConstrainDevices), its variables (SLURM_JOB_GPUS, SLURM_STEP_GPUS, GPU_DEVICE_ORDINAL) and
the CUDA_VISIBLE_DEVICES the task prolog writes then name the same devices.

- prolog: for each node the prolog acts for (SLURMD_NODENAME in slurmd's Prolog; every node of
  SLURM_JOB_NODELIST in PrologSlurmctld, Slurm's ids per node from `scontrol show job -d`),
  reserve the devices Slurm picked (or, given sbatch-style flags instead of Slurm's ids,
  allocate the request on that node), owner `slurm/job/<id>`, idempotency key
  `slurm-<id>-<node>` (a re-run returns the same devices), with the job's lease
  (GPUALLOC_SLURM_LEASE): `gpualloc-slurm sync` renews it while Slurm lists the job as
  started, so the devices are the job's until the epilog, and come back by themselves when the
  epilog is lost (lease 0: commit instead, held until released). All nodes or none: when one
  node cannot be placed, the others are released and `Unplaceable` carries Explain's reason
  (which names who holds the devices: `slurm/job/...` or `kueue/...`).
- task prolog: maps the step's Slurm ids (SLURM_STEP_GPUS, else SLURM_JOB_GPUS) to devices,
  checks the job's reservation holds them (`NoReservation` otherwise: no task runs without its
  GPUs) and says which GPUs the task may use. A job that asked for no GPU gets nothing.
- epilog: releases every reservation of the job (on this node, or on all nodes), idempotently.

The job's GPU environment is CUDA_VISIBLE_DEVICES with the devices' UUIDs (`GPU-…`, `MIG-…`,
from the inventory's `uuid` attributes) in Slurm's id order, written as Slurm's TaskProlog
reads its standard output: `export NAME=value` lines (and `print ...` for messages to the
task's output).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace

from services.bridges.placing import Placer, slurm_job_of, slurm_owner
from services.bridges.slurm.claims import claim_for_node, pinned_claim
from services.bridges.slurm.gresconf import GresEntry, gpu_type, gres_entries
from services.bridges.slurm.hostlist import expand_hostlist
from services.bridges.slurm.request import (
    SlurmGpuRequest,
    gpu_ids_from_job_details,
    parse_gpu_ids,
    request_from_environ,
    submit_time_from_job_details,
    with_types,
)
from services.client.client import AllocatorClient
from services.client.errors import Unplaceable
from services.client.inventory import InventoryClient, InventoryDevice, NodeInventory
from services.client.lease import Lease
from services.client.results import Placement, Reservation
from services.common.dra.model import DeviceID, ResourceClaim
from services.common.errors import FailedPrecondition, InvalidArgument, NotFound

__all__ = [
    "JobGpus",
    "NoReservation",
    "SlurmJob",
    "gres_types",
    "idempotency_key",
    "job_gpus",
    "release_ended_holders",
    "run_epilog",
    "run_prolog",
    "slurm_devices",
    "sweep",
    "task_gpus",
]

PROLOG_LEASE_SECONDS = 120.0
JOB_LEASE_SECONDS = 600.0
BINDING_WAIT_SECONDS = 600.0  # as the allocator's default GPUALLOC_BINDING_TIMEOUT
CLUSTER_LABEL = "slurm.cluster"
ENDED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)

NOT_RUNNING_STATES = ENDED_STATES | {
    "COMPLETING",
    "PENDING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
}
"""A job in one of these uses no GPU (a requeued job waits, pending, to start again)."""


class NoReservation(FailedPrecondition):
    """The job asked for GPUs but gpualloc holds none (or not those Slurm gave) for it."""


@dataclass(frozen=True)
class SlurmJob:
    """The job a prolog runs for: its id, the nodes this invocation acts for, its request, and
    the GPU ids Slurm picked per node (empty when the prolog was given flags instead)."""

    job_id: str
    nodes: tuple[str, ...]
    request: SlurmGpuRequest
    gpu_ids: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    cluster: str = ""
    """SLURM_CLUSTER_NAME: labels the reservations, so a sweep touches its own cluster's only."""
    submitted: float | None = None
    """When Slurm queued the job (its SubmitTime, seconds since the epoch; Slurm resets it on
    a requeue), sent as each reservation's `queued_time`; None where the prolog has no job
    details (slurmd's node Prolog, flags): the allocator then takes the call's time."""

    @property
    def owner(self) -> str:
        return slurm_owner(self.job_id)

    @property
    def asks_for_gpus(self) -> bool:
        return bool(self.request.per_node) or any(self.gpu_ids.values())

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str],
        *,
        node: str | None = None,
        request: SlurmGpuRequest | None = None,
        details: str | None = None,
        step: bool = False,
    ) -> SlurmJob:
        """The job of a prolog's environment. `details`: `scontrol show job -d` (Slurm's GPU ids
        per node, for PrologSlurmctld); `step`: a TaskProlog (the step's ids, SLURM_STEP_GPUS,
        win over the job's). A `request` (from flags) overrides the environment entirely."""
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
        cluster = environ.get("SLURM_CLUSTER_NAME", "").strip()
        if request is not None:
            return cls(job_id.strip(), nodes, request, cluster=cluster)
        gpu_ids: dict[str, tuple[int, ...]] = {}
        submitted = None
        if details is not None:
            gpu_ids = {n: ids for n, ids in gpu_ids_from_job_details(details).items() if n in nodes}
            submitted = submit_time_from_job_details(details)
        elif len(nodes) == 1:
            stepped = step and environ.get("SLURM_STEP_GPUS")
            name = "SLURM_STEP_GPUS" if stepped else "SLURM_JOB_GPUS"
            ids = parse_gpu_ids(environ.get(name, ""), name)
            gpu_ids = {nodes[0]: ids} if ids else {}
        return cls(
            job_id.strip(), nodes, request_from_environ(environ), gpu_ids, cluster, submitted
        )


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


def gres_types(inventory: InventoryClient) -> list[str]:
    """Every GRES type the inventory's devices have, as gres.conf names them: `h100` for whole
    GPUs, `a100_3g.20gb` for MIG devices (created or not), sorted."""
    types: set[str] = set()
    for node in inventory.nodes():
        for device in node.devices:
            model = gpu_type(str(device.attribute("productName") or ""))
            if device.type == "gpu":
                types.add(model)
            elif device.type == "mig" and device.attribute("profile"):
                types.add(f"{model}_{device.attribute('profile')}")
    return sorted(types)


def _check_types(request: SlurmGpuRequest, inventory: InventoryClient) -> None:
    """InvalidArgument naming the known types when the request names a type no device has
    (types match exactly, as in Slurm: `a10` is not `a100`)."""
    typed = [g for g in request.per_node if g.type is not None]
    if not typed:
        return
    known = gres_types(inventory)
    profiles = {t.rsplit("_", 1)[1] for t in known if "_" in t}
    for gres in typed:
        if gres.mig_profile is not None and gres.model is None:
            ok = gres.mig_profile in profiles
        elif gres.mig_profile is not None:
            ok = f"{gres.model}_{gres.mig_profile}" in known
        else:
            ok = gres.model in known
        if not ok:
            raise InvalidArgument.at(
                "gres", f"unknown GPU type {gres.type!r}: the known types are {', '.join(known)}"
            )


_LINES_KEPT = 1024
_lines: dict[int, tuple[NodeInventory, list[GresEntry], dict[str, InventoryDevice]]] = {}
"""id(node) -> (node, its gres.conf GPU lines, its devices by name), see `_gres_lines`."""


def _gres_lines(node: NodeInventory) -> tuple[list[GresEntry], dict[str, InventoryDevice]]:
    """gres_entries(node)'s GPU lines and the node's devices by name, computed once per node
    object: the hooks service's warm inventory hands the same objects to every prolog and
    task prolog for up to 10 s, and the lines cost more than the rest of a hook's Python. The
    entry keeps its node, so an id is never another node's."""
    found = _lines.get(id(node))
    if found is not None and found[0] is node:
        return found[1], found[2]
    entries, _ = gres_entries(node)
    by_name = {d.id.device: d for d in node.devices}
    if len(_lines) >= _LINES_KEPT:
        _lines.clear()
    _lines[id(node)] = (node, entries, by_name)
    return entries, by_name


def slurm_devices(node: NodeInventory, ids: Sequence[int]) -> list[InventoryDevice]:
    """The inventory devices Slurm's GPU ids name on a node: id i is the node's i-th GPU line
    of the gres.conf `gpualloc-slurm gres-conf` writes from this inventory."""
    entries, by_name = _gres_lines(node)
    devices = []
    for gpu_id in ids:
        if gpu_id >= len(entries):
            raise InvalidArgument.at(
                "SLURM_JOB_GPUS",
                f"Slurm's GPU id {gpu_id} on {node.name}: the inventory gives the node "
                f"{len(entries)} gres.conf GPU line(s); regenerate gres.conf with "
                "`gpualloc-slurm gres-conf`",
            )
        devices.append(by_name[entries[gpu_id].device])
    return devices


def _node(inventory: InventoryClient, name: str) -> NodeInventory:
    found = inventory.node(name, topology=False)
    if found is None:
        raise InvalidArgument.at("node", f"node {name!r} is not in the gpualloc inventory")
    return found


def _claim(job: SlurmJob, inventory: InventoryClient, node: str) -> ResourceClaim | None:
    """The node's claim: Slurm's own devices when known (typed by gres.conf when a device has
    no UUID to pin, e.g. a MIG device not created yet), else the request; None: no GPU here."""
    ids = job.gpu_ids.get(node, ())
    if ids:
        found = _node(inventory, node)
        devices = slurm_devices(found, ids)
        if all(d.uuid is not None for d in devices):
            return pinned_claim(job.job_id, devices, nvlink=job.request.nvlink)
        entries, _ = _gres_lines(found)
        typed = with_types(replace(job.request, gpu_ids=tuple(ids)), [e.type for e in entries])
        return claim_for_node(job.job_id, typed)
    if not job.request.per_node:
        return None
    _check_types(job.request, inventory)
    return claim_for_node(job.job_id, job.request)


def _labels(job: SlurmJob, node: str) -> dict[str, str]:
    labels = {"slurm.job_id": job.job_id, "slurm.node": node}
    if job.cluster:
        labels[CLUSTER_LABEL] = job.cluster
    return labels


def run_prolog(
    client: AllocatorClient,
    inventory: InventoryClient,
    job: SlurmJob,
    *,
    lease_seconds: float = JOB_LEASE_SECONDS,
    binding_wait_seconds: float = BINDING_WAIT_SECONDS,
) -> list[JobGpus]:
    """Reserve the job's GPUs on each of its nodes (all or none) with a lease of
    `lease_seconds` (0: commit them); [] when the job asks for no GPU. Raises Unplaceable with
    the allocator's reason when a node has no room (or, with Slurm's ids, when another owner
    holds one of the GPUs Slurm picked). Devices with binding conditions are waited for, up to
    `binding_wait_seconds`, before the job may start: a binding that fails raises Preempted,
    one that does not come raises NotBound (the prolog fails, nothing stays held)."""
    if not job.asks_for_gpus:
        return []
    ttl = lease_seconds or PROLOG_LEASE_SECONDS
    placer = Placer(client, inventory)
    leases: list[tuple[str, Lease]] = []
    with ExitStack() as stack:
        for node in job.nodes:
            claim = _claim(job, inventory, node)
            if claim is None:
                continue

            def place(node: str = node, claim: ResourceClaim = claim) -> Placement:
                return placer.allocate(
                    [claim],
                    owner=job.owner,
                    idempotency_key=idempotency_key(job.job_id, node),
                    node_name=node,
                    lease_ttl_seconds=ttl,
                    labels=_labels(job, node),
                    queued_at=job.submitted,
                )

            lease = Lease(client, place, owner=job.owner, lease_ttl_seconds=ttl)
            try:
                stack.enter_context(lease)
            except Unplaceable as error:
                ids = job.gpu_ids.get(node, ())
                picked = f" (Slurm's GPU ids {','.join(map(str, ids))})" if ids else ""
                raise Unplaceable(error.placement, f"job {job.job_id} on {node}{picked}") from None
            leases.append((node, lease))
        for _, lease in leases:  # the job starts on bound devices only (DRA binding conditions)
            lease.wait_bound(binding_wait_seconds)
        for _, lease in leases:
            if lease_seconds:
                lease.keep()
            else:
                lease.commit()
        stack.pop_all()  # the job's now: nothing to release on the way out
    return [
        _job_gpus(job, inventory.node(node, topology=False), node, lease.reservations)
        for node, lease in leases
    ]


def _job_gpus(
    job: SlurmJob, node: NodeInventory | None, node_name: str, held: Sequence[Reservation]
) -> JobGpus:
    """The GPUs of the job on the node, in Slurm's id order when Slurm's ids are known."""
    ids = job.gpu_ids.get(node_name, ())
    if not ids or node is None:
        return job_gpus(node, node_name, held)
    wanted = slurm_devices(node, ids)
    held_ids = {d for r in held for d in r.devices}
    missing = [d.id for d in wanted if d.id not in held_ids]
    if missing:
        holds = ", ".join(str(d.device) for d in sorted(held_ids, key=str)) or "nothing"
        raise NoReservation(
            f"job {job.job_id} on {node_name}: Slurm gave it GPU ids "
            f"{','.join(map(str, ids))} ({', '.join(d.id.device for d in wanted)}) but gpualloc "
            f"holds {holds} for {job.owner}; not running it without its GPUs (did the "
            "PrologSlurmctld run? see slurmctld's log)"
        )
    gpus = job_gpus(node, node_name, held)
    uuids = tuple(d.uuid for d in wanted if d.uuid is not None)
    without = tuple(d.id for d in wanted if d.uuid is None)
    return replace(gpus, devices=tuple(d.id for d in wanted), uuids=uuids, without_uuid=without)


def task_gpus(client: AllocatorClient, inventory: InventoryClient, job: SlurmJob) -> list[JobGpus]:
    """What the prolog holds for the job (its step's GPUs) on each of its nodes (read only);
    [] when the job asked for no GPU. NoReservation when it asked and gpualloc holds none."""
    if not job.asks_for_gpus:
        return []
    # a TaskProlog's job is its node's: a List of one node reads that node alone
    held = client.list(owner=job.owner, node_name=job.nodes[0] if len(job.nodes) == 1 else "")
    found = []
    for node in job.nodes:
        mine = [r for r in held if r.node_name == node]
        if not mine:
            raise NoReservation(
                f"job {job.job_id} asked for GPUs on {node} but gpualloc holds none for "
                f"{job.owner}; not running it without its GPUs (did the PrologSlurmctld run? "
                "see slurmctld's log)"
            )
        found.append(_job_gpus(job, inventory.node(node, topology=False), node, mine))
    return found


def run_epilog(client: AllocatorClient, job: SlurmJob, *, all_nodes: bool = False) -> list[str]:
    """Release the job's reservations (on the job's nodes, or everywhere); returns their ids.
    Idempotent: what is already gone is fine."""
    released = []
    listed = (
        client.list(owner=job.owner)
        if all_nodes
        else [r for node in job.nodes for r in client.list(owner=job.owner, node_name=node)]
    )
    for reservation in listed:
        if all_nodes or reservation.node_name in job.nodes:
            client.release(reservation, owner=job.owner, allow_missing=True)
            released.append(reservation.id)
    return released


def sweep(
    client: AllocatorClient,
    cluster: str,
    live_jobs: Callable[[], Mapping[str, str]],
    *,
    keep: str = "",
) -> list[str]:
    """Release the reservations of this cluster's Slurm jobs that have ended: those an epilog
    could not release (gpualloc was unreachable then). `live_jobs()`: job id -> state, as
    `squeue -t all` shows them; a job slurmctld no longer lists has ended. It is asked after
    the reservations are listed: a job that reserved before the list was submitted before it,
    so Slurm lists it unless it ended (asked before, a job submitted and started in between
    would look ended and lose its GPUs). Reservations without this cluster's label are left
    alone (another cluster may share the allocator)."""
    ours = [
        r
        for r in client.list()
        if slurm_job_of(r.owner) is not None and r.labels.get(CLUSTER_LABEL) == cluster
    ]
    live = live_jobs() if ours else {}
    released = []
    for reservation in ours:
        owner = reservation.owner
        job_id = slurm_job_of(owner)
        if job_id is None or job_id == keep or live.get(job_id, "COMPLETED") not in ENDED_STATES:
            continue
        client.release(reservation, owner=owner, allow_missing=True)
        released.append(reservation.id)
    return released


def release_ended_holders(
    client: AllocatorClient,
    placement: Placement,
    cluster: str,
    live_jobs: Mapping[str, str],
    *,
    keep: str,
) -> list[str]:
    """Release the reservations in `placement`'s holders (what blocked a job's GPUs) of this
    cluster's Slurm jobs that have ended or are completing (`live_jobs` as in `sweep`):
    Slurm hands a job's GPUs to the next job as soon as the job ends, before (or while) its
    EpilogSlurmctld runs, so the next job's prolog can find them still held by the job that
    just left them (or by a requeued job whose epilog has not run yet). Slurm gave those GPUs
    to the new job, so such a holder uses none of them: a running one is a real conflict and
    stays. The prolog then reserves again. Returns the ids released (none: the holders run,
    or are another owner's)."""
    released = []
    for holder in placement.holders:
        job_id = slurm_job_of(holder.owner)
        if not holder.reservation_id or job_id is None or job_id == keep:
            continue
        if live_jobs.get(job_id, "COMPLETED") not in NOT_RUNNING_STATES:
            continue
        try:
            held = client.get(holder.reservation_id)
        except NotFound:
            released.append(holder.reservation_id)  # released meanwhile (its epilog)
            continue
        if held.labels.get(CLUSTER_LABEL) != cluster:
            continue
        client.release(held, owner=held.owner, allow_missing=True)
        released.append(held.id)
    return released
