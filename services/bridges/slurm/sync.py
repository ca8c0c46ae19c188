"""`gpualloc-slurm sync`: keep Slurm off the GPUs other systems hold, keep Slurm jobs' leases.

Slurm picks a job's GPUs itself, from the ones it believes free; the prolog can only refuse a
pick that another owner holds (and Slurm then requeues the job). So Slurm must believe the GPUs
other systems hold are busy. Slurm 22.05 has no interface to mark particular GPUs busy:

- a Slurm reservation of GPUs (`TRES=gres/gpu=2`) needs gres/gpu as an accounted TRES, which
  slurmctld refuses to run without slurmdbd, and it takes a count: Slurm would choose which
  GPU ids it covers;
- `scontrol update NodeName=… Gres=gpu:h100:6` is refused for a node whose gres.conf names
  device files ("Invalid generic resource (gres) specification"), and it is a count too.

What does name particular GPUs is a running job: Slurm never gives a GPU id that a job holds to
another job. So for every GPU another owner holds, `sync` keeps a *holder job* running on that
GPU: a one-GPU batch job named `gpualloc-held`, submitted by root, running `sleep infinity`
(its Comment names the device and its owner). Slurm picks a holder's GPU itself, so `sync`
takes the ids it wants by submitting one-GPU holders for every GPU of the node at once (those
beyond the free GPUs wait), keeping the ones that landed on the wanted ids as soon as they
cover them and cancelling the rest; when the other owner lets go, the holder is cancelled and
Slurm offers the GPU again. The bridge's own prologs let holder jobs through without a
reservation (they hold GPUs that gpualloc has already given to someone else). "Another
owner" is every reservation that is not a `slurm/job/*` reservation of this cluster
(`slurm.cluster` label): Kueue workloads, other Slurm clusters, anything reserved by hand.

Leases. The prolog reserves a job's GPUs with a lease (GPUALLOC_SLURM_LEASE) instead of
committing them. Each pass renews the leases of this cluster's jobs that Slurm lists as
started and not ended (once a third of the lease has passed), and releases those of ended jobs
(`sweep`). A reservation whose epilog was lost is released by the next pass, or, if `sync` is
not running either, comes back when its lease expires; a pending (requeued) job's old
reservation is not renewed.

Preemption. A job's reservation that gpualloc revoked for a preemption (docs/tenancy.md)
disappears from List. Each pass remembers this cluster's job reservations; a started job whose
remembered reservation is gone is asked about it (a Renew), and when gpualloc answers that it
was preempted (ErrorInfo RESERVATION_PREEMPTED), the job is requeued (`scontrol requeue`) with
a Comment naming who took its GPUs, so it runs again when it fits. Memory of one `sync`
process: a reservation revoked while no `sync` ran is found by the job's next step or epilog.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from services.bridges.placing import slurm_job_of
from services.bridges.preemptions import PreemptionFollower
from services.bridges.slurm.commands import SlurmCommands, SlurmJobRow
from services.bridges.slurm.gresconf import gres_entries
from services.bridges.slurm.prolog import CLUSTER_LABEL, ENDED_STATES, sweep
from services.bridges.slurm.request import gpu_ids_from_job_details
from services.client.client import AllocatorClient
from services.client.inventory import InventoryClient
from services.client.results import Reservation, ReservationState
from services.common.errors import FailedPrecondition, GpuallocError, NotFound, Preempted

__all__ = ["HOLDER_NAME", "SyncReport", "Syncer", "is_holder", "outside_holdings"]

log = logging.getLogger("gpualloc.slurm.sync")

HOLDER_NAME = "gpualloc-held"
HOLDER_USER = "root"
HOLDER_UID = "0"
START_TIMEOUT_SECONDS = 10.0
_POLL_SECONDS = 0.2
_STARTED = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"})
_HOLDING = _STARTED - {"COMPLETING"}  # a cancelled holder is COMPLETING until its epilog ran


def is_holder(environ: Mapping[str, str]) -> bool:
    """A prolog's job is one of sync's holder jobs (its name, submitted by root)."""
    return (
        environ.get("SLURM_JOB_NAME", "") == HOLDER_NAME
        and environ.get("SLURM_JOB_UID", "").strip() == HOLDER_UID
    )


def _is_holder_row(row: SlurmJobRow) -> bool:
    return row.name == HOLDER_NAME and row.user == HOLDER_USER


def is_ours(reservation: Reservation, cluster: str) -> bool:
    """A reservation of this cluster's Slurm jobs (unlabelled ones count as ours)."""
    return slurm_job_of(reservation.owner) is not None and (
        reservation.labels.get(CLUSTER_LABEL, cluster) == cluster
    )


def outside_holdings(
    reservations: Sequence[Reservation], cluster: str
) -> dict[str, dict[str, str]]:
    """Per node, device name -> owner of every device held by anyone but this cluster's jobs."""
    held: dict[str, dict[str, str]] = {}
    for reservation in reservations:
        if is_ours(reservation, cluster):
            continue
        owner = reservation.owner or "another tenant"  # whose owner the allocator does not show
        for device in reservation.devices:
            held.setdefault(reservation.node_name, {})[device.device] = owner
    return held


@dataclass
class SyncReport:
    """What one pass did."""

    held: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Per node, the Slurm GPU ids kept away from Slurm (by running holder jobs)."""
    missing: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Per node, ids another owner holds that no holder could take (Slurm jobs run there, or
    the node has no CPU left for a holder): the prolog still refuses them."""
    submitted: int = 0
    cancelled: int = 0
    renewed: int = 0
    released: int = 0
    requeued: list[str] = field(default_factory=list)
    """Jobs requeued because a preemption revoked their reservation."""

    def lines(self) -> list[str]:
        shown = [
            f"held {node}: {','.join(map(str, ids)) or '-'}"
            for node, ids in sorted(self.held.items())
        ]
        shown += [
            f"not held {node}: {','.join(map(str, ids))}"
            for node, ids in sorted(self.missing.items())
        ]
        shown.append(
            f"holders submitted {self.submitted}, cancelled {self.cancelled}; "
            f"leases renewed {self.renewed}, released {self.released}"
        )
        shown += [f"requeued {job} (preempted)" for job in self.requeued]
        return shown


@dataclass
class _Holder:
    job_id: str
    node: str
    gpu_id: int | None
    """None while pending (Slurm has not picked its GPU yet)."""
    pending: bool = False


class Syncer:
    """One `gpualloc-slurm sync` over a Slurm cluster and gpualloc."""

    def __init__(
        self,
        client: AllocatorClient,
        inventory: InventoryClient,
        slurm: SlurmCommands,
        cluster: str,
        *,
        lease_seconds: float,
        start_timeout: float = START_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.inventory = inventory
        self.slurm = slurm
        self.cluster = cluster
        self.lease_seconds = lease_seconds
        self.start_timeout = start_timeout
        self._clock = clock
        self._known: dict[str, Reservation] = {}  # this cluster's job reservations, last pass
        self.watching = threading.Event()  # run(): set while preemptions wake it (see there)

    def run(self, stop: threading.Event, interval: float) -> None:
        """Pass after pass until `stop`; a pass that fails is logged and tried again. A pass
        also comes as soon as gpualloc revokes one of this cluster's jobs' reservations
        (WatchReservations, bridges/preemptions.py), so the job is requeued at once."""
        woken = threading.Event()
        ours = PreemptionFollower(
            self.client, lambda o: slurm_job_of(o) is not None, woken.set, watching=self.watching
        )
        ours.start()
        try:
            while not stop.is_set():
                woken.clear()
                try:
                    for line in self.sync_once().lines():
                        log.info("%s", line)
                except GpuallocError as error:
                    log.warning("sync pass failed: %s: %s", type(error).__name__, error)
                _wait_for_either(stop, woken, interval)
        finally:
            ours.close()

    def sync_once(self) -> SyncReport:
        report = SyncReport()
        jobs = self.slurm.jobs()
        self._requeue_preempted(jobs, report)
        self._keep_leases(jobs, report)
        self._reflect(self.client.list(), jobs, report)
        return report

    # --- preemption -----------------------------------------------------------------------

    def _requeue_preempted(self, jobs: Sequence[SlurmJobRow], report: SyncReport) -> None:
        states = {row.job_id: row.state for row in jobs}
        current = {r.id: r for r in self.client.list() if is_ours(r, self.cluster)}
        for reservation_id, reservation in sorted(self._known.items()):
            job_id = slurm_job_of(reservation.owner) or ""
            if reservation_id in current or states.get(job_id) not in _STARTED:
                continue
            try:  # gone from List: ask the allocator what became of it
                self.client.renew(
                    reservation,
                    lease_ttl_seconds=self.lease_seconds or 60.0,
                    owner=reservation.owner,
                )
            except Preempted as preempted:
                self._requeue(job_id, preempted.by, report)
            except (NotFound, FailedPrecondition):
                pass  # released or expired: the job's next step or its epilog says so
        self._known = current

    def _requeue(self, job_id: str, by: str, report: SyncReport) -> None:
        try:
            self.slurm.set_comment(job_id, f"gpualloc: GPUs preempted by {by}; requeued")
            self.slurm.requeue(job_id)
        except FailedPrecondition as error:
            log.warning(
                "job %s was preempted by %s but could not be requeued: %s", job_id, by, error
            )
            return
        log.info("job %s requeued: its GPUs were preempted by %s", job_id, by)
        report.requeued.append(job_id)

    # --- leases ---------------------------------------------------------------------------

    def _keep_leases(self, jobs: Sequence[SlurmJobRow], report: SyncReport) -> None:
        states = {row.job_id: row.state for row in jobs}
        report.released = len(sweep(self.client, self.cluster, self._live_jobs))
        if not self.lease_seconds:
            return
        now = datetime.now(UTC)
        for reservation in self.client.list():
            job_id = slurm_job_of(reservation.owner) or ""
            if (
                not is_ours(reservation, self.cluster)
                or reservation.state is not ReservationState.RESERVED
                or states.get(job_id) not in _STARTED
            ):
                continue
            expires = reservation.expires_at
            if expires is not None and (expires - now).total_seconds() > self.lease_seconds * 2 / 3:
                continue
            try:
                self.client.renew(
                    reservation,
                    lease_ttl_seconds=self.lease_seconds,
                    owner=reservation.owner,
                    fencing_token=reservation.fencing_token,
                )
                report.renewed += 1
            except (NotFound, FailedPrecondition) as error:  # released or committed meanwhile
                log.info("lease of %s not renewed: %s", reservation.owner, error)

    def _live_jobs(self) -> dict[str, str]:
        return {row.job_id: row.state for row in self.slurm.jobs()}

    # --- outside holdings -> holder jobs ----------------------------------------------------

    def _reflect(
        self, reservations: Sequence[Reservation], jobs: Sequence[SlurmJobRow], report: SyncReport
    ) -> None:
        outside = outside_holdings(reservations, self.cluster)
        holders = self._holders(jobs)
        if not outside and not holders:
            return  # nothing held outside, no holder job: no need to ask Slurm for its nodes
        slurm_nodes = {n.name: n.partitions for n in self.slurm.nodes()}
        pending = [h.job_id for h in holders if h.pending]  # left by a pass cut short
        self.slurm.cancel(pending)
        report.cancelled += len(pending)
        holders = [h for h in holders if h.gpu_id is not None]  # started, its GPU known
        for node in sorted(slurm_nodes.keys() & (outside.keys() | {h.node for h in holders})):
            wanted, gpu_lines = self._wanted_ids(node, outside.get(node, {}))
            mine = [h for h in holders if h.node == node]
            kept = {h.gpu_id: h.job_id for h in mine if h.gpu_id in wanted}
            stale = [h.job_id for h in mine if h.gpu_id not in wanted]
            self.slurm.cancel(stale)
            report.cancelled += len(stale)
            missing = set(wanted) - set(kept)
            if missing:
                room = gpu_lines - len(kept)  # at most this many GPUs can be free
                taken = self._take(node, slurm_nodes[node], room, missing, wanted, report)
                missing -= set(taken)
                kept.update(taken)
            report.held[node] = tuple(sorted(i for i in kept if i is not None))
            if missing:
                report.missing[node] = tuple(sorted(missing))

    def _wanted_ids(self, node: str, devices: Mapping[str, str]) -> tuple[dict[int, str], int]:
        """Slurm GPU id -> `<device> held by <owner>` for the node's outside-held devices,
        and how many GPU lines the node's gres.conf has."""
        found = self.inventory.node(node, topology=False) if devices else None
        if found is None:
            return {}, 0
        entries, _ = gres_entries(found)
        wanted = {
            i: f"{e.device} held by {devices[e.device]}"
            for i, e in enumerate(entries)
            if e.device in devices
        }
        return wanted, len(entries)

    def _holders(self, jobs: Sequence[SlurmJobRow]) -> list[_Holder]:
        holders = []
        for row in jobs:
            if not _is_holder_row(row) or row.state in ENDED_STATES or row.state == "COMPLETING":
                continue
            ids: tuple[int, ...] = ()
            node = row.nodes
            if row.state in _HOLDING:
                picked = gpu_ids_from_job_details(self.slurm.job_details(row.job_id))
                node, ids = next(iter(picked.items()), (row.nodes, ()))
            holders.append(
                _Holder(row.job_id, node, ids[0] if ids else None, pending=row.state == "PENDING")
            )
        return holders

    def _take(
        self,
        node: str,
        partitions: Sequence[str],
        room: int,
        missing: set[int],
        wanted: Mapping[int, str],
        report: SyncReport,
    ) -> dict[int, str]:
        """Take every free GPU of `node` with one-GPU holders at once (`room` of them: the
        ones beyond the free GPUs just wait), keep those that landed on `missing` ids, cancel
        the rest; returns id -> holder job of the ones kept. Slurm picks each holder's GPU,
        so only taking them all is sure to cover the wanted ones in one scheduling pass."""
        taken: dict[int, str] = {}
        submitted: list[str] = []
        try:
            submitted = [self._submit(node, partitions) for _ in range(room)]
            report.submitted += len(submitted)
            for job_id, gpu_id in self._wait_started(submitted, missing).items():
                if gpu_id in missing and gpu_id not in taken:
                    taken[gpu_id] = job_id
                    self.slurm.set_comment(job_id, f"gpualloc: {wanted[gpu_id]}")
        finally:
            strays = [j for j in submitted if j not in taken.values()]
            self.slurm.cancel(strays)
            report.cancelled += len(strays)
        return taken

    def _submit(self, node: str, partitions: Sequence[str]) -> str:
        options = [
            f"--job-name={HOLDER_NAME}",
            f"--nodelist={node}",
            "--nodes=1",
            "--ntasks=1",
            "--gres=gpu:1",
            "--mem=1M",
            "--no-requeue",
            "--chdir=/",
            "--output=/dev/null",
            f"--comment=gpualloc: holding a GPU of {node} for another owner",
        ]
        if partitions:
            options.append(f"--partition={','.join(partitions)}")
        return self.slurm.submit(*options, wrap="exec sleep infinity")

    def _wait_started(self, job_ids: Sequence[str], wanted: set[int]) -> dict[str, int]:
        """Job id -> the GPU id Slurm gave it, for those that started; waits until the
        started ones cover `wanted`, or every job started or ended, at most the start timeout
        (a job still pending then had no GPU free for it)."""
        deadline = self._clock() + self.start_timeout
        started: dict[str, int] = {}
        waiting = set(job_ids)
        while waiting and not wanted <= set(started.values()):
            states = {row.job_id: row.state for row in self.slurm.jobs()}
            for job_id in sorted(waiting):
                if states.get(job_id) in _HOLDING:
                    picked = gpu_ids_from_job_details(self.slurm.job_details(job_id))
                    ids = next(iter(picked.values()), ())
                    if ids:
                        started[job_id] = ids[0]
                        waiting.discard(job_id)
                elif states.get(job_id, "COMPLETED") in ENDED_STATES | {"COMPLETING"}:
                    waiting.discard(job_id)
            if self._clock() > deadline:
                break
            time.sleep(_POLL_SECONDS)
        return started


def _wait_for_either(stop: threading.Event, woken: threading.Event, seconds: float) -> None:
    """Until `seconds` pass, `woken` is set or `stop` is (checked every 0.2 s)."""
    deadline = time.monotonic() + seconds
    while not (stop.is_set() or woken.is_set()):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        woken.wait(min(left, 0.2))
