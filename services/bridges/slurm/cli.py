"""`gpualloc-slurm`: the Slurm bridge's command line (prolog, task-prolog, epilog, gres-conf).

    gpualloc-slurm prolog        # slurm.conf PrologSlurmctld= (or Prolog=): reserve + commit
    gpualloc-slurm task-prolog   # slurm.conf TaskProlog=: export CUDA_VISIBLE_DEVICES=GPU-...
    gpualloc-slurm epilog --all-nodes  # slurm.conf JobCompLoc= (jobcomp.sh; or Epilog=): release
    gpualloc-slurm gres-conf --node h100-node-1 > /etc/slurm/gres.conf
    gpualloc-slurm sync --socket /run/gpualloc-slurm.sock  # on the controller, as root:
                                 # holder jobs, leases, and the hooks' work (a service)
    gpualloc-slurm hooks --socket /run/gpualloc-slurm.sock # on a compute node: TaskProlog's
    gpualloc-slurm translate --gres=gpu:h100:4 -C nvlink   # print the claim (YAML)

The job comes from Slurm's prolog environment (SLURM_JOB_ID, SLURMD_NODENAME,
SLURM_JOB_NODELIST, SLURM_JOB_GRES / SLURM_GPUS_PER_NODE / SLURM_GPUS / SLURM_JOB_GPUS,
SLURM_JOB_CONSTRAINTS, SLURM_STEP_GPUS); as PrologSlurmctld (SLURM_SCRIPT_CONTEXT=
prolog_slurmctld) Slurm's GPU ids per node come from `scontrol show job -d` (GPUALLOC_SCONTROL,
default /usr/bin/scontrol), and a failure also writes `gpualloc: <why>` into the job's Comment
(`squeue -o %k`, `scontrol show job`). The sbatch-style flags override the environment. The
prolog reserves with a lease of GPUALLOC_SLURM_LEASE (default 10m; 0 commits instead), which
`sync` renews while the job runs (GPUALLOC_SLURM_SYNC_INTERVAL between passes, default 10s;
see services/bridges/slurm/sync.py). With --socket (env GPUALLOC_SLURM_SOCKET), sync also
does the hooks' work for examples/bridges/slurm/gpualloc-hook.py, which the Slurm scripts run
instead of this command (services/bridges/slurm/hooks.py): milliseconds per job, not a Python
start; the epilog's release then happens after it returned. The
allocator is GPUALLOC_ALLOCATOR_ADDR (default 127.0.0.1:50051), the inventory
GPUALLOC_INVENTORY_ADDR (default: the allocator's address). TLS: GPUALLOC_CLIENT_TLS_CA (the
servers' CA; any TLS variable turns TLS on), GPUALLOC_CLIENT_TLS_CERT + GPUALLOC_CLIENT_TLS_KEY
(mutual TLS: the bridge's identity), GPUALLOC_CLIENT_TLS_SERVER_NAME; GPUALLOC_CLIENT_TOKEN_FILE
(a bearer JWT, re-read when it changes, TLS only); the --tls-* and --token-file flags override
them. GPUALLOC_CLIENT_DEADLINE and GPUALLOC_CLIENT_RETRIES bound each call. Exit status:
0 done; 1 the job's GPUs cannot be placed (the reason is on standard error, which
slurmd/slurmctld log); 2 bad input (bad TLS or token settings too); 3 the allocator could not
be reached or failed; 4 (task-prolog) the job asked for GPUs and gpualloc holds none for it
(a `print` line tells the job's output why).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import io
import itertools
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TextIO

import yaml

from services.bridges.placing import slurm_owner
from services.bridges.slurm.batching import (
    SPENT,
    AllocateBatcher,
    BatchingClient,
    Reserved,
    WarmInventory,
)
from services.bridges.slurm.claims import claim_for_node
from services.bridges.slurm.commands import SlurmCommands
from services.bridges.slurm.gresconf import parse_mig_minors, render_gres_conf
from services.bridges.slurm.hooks import HookAnswer, HookServer, Releases
from services.bridges.slurm.libslurm import JobDetails
from services.bridges.slurm.prolog import (
    CLUSTER_LABEL,
    JOB_LEASE_SECONDS,
    JobGpus,
    NoReservation,
    SlurmJob,
    release_ended_holders,
    run_epilog,
    run_prolog,
    sweep,
    task_gpus,
)
from services.bridges.slurm.request import SlurmGpuRequest, request_from_options
from services.bridges.slurm.sync import HOLDER_NAME, Syncer, is_holder
from services.client.cli_flags import add_client_flags, client_settings
from services.client.client import AllocatorClient
from services.client.config import ClientSettings
from services.client.errors import Unplaceable
from services.client.inventory import InventoryClient
from services.client.results import Reservation
from services.common.config import env_duration
from services.common.console import console_main
from services.common.dra.serialize import to_dict
from services.common.errors import FailedPrecondition, GpuallocError, InvalidArgument

__all__ = ["main"]

EXIT_UNPLACEABLE = 1
EXIT_INVALID = 2
EXIT_FAILED = 3
EXIT_NO_RESERVATION = 4
log = logging.getLogger("gpualloc.slurm.cli")

SLURMCTLD_CONTEXT = "prolog_slurmctld"
COMMENT_LIMIT = 400
SYNC_INTERVAL_SECONDS = 10.0
HOOK_COMMANDS = frozenset({"prolog", "task-prolog", "epilog"})
CHANGING_HOOKS = frozenset({"prolog", "epilog"})
"""Served only to root, the service's own user and --hook-uid (SlurmUser): they change
reservations. task-prolog (the job's user) only reads."""
RELEASE_WAIT_SECONDS = 5.0
"""How long a prolog waits for the epilogs' releases queued before it."""
NODE_EPILOG_WAIT_SECONDS = 5.0
"""How long a node Epilog's answer waits for its release. Slurm keeps the node COMPLETING, and
starts no job there, until its Epilog returns, so a release done before the answer is done
before any prolog that could want those GPUs. One that takes longer goes on in the background
and the hook answers 0 all the same (Slurm drains a node whose Epilog fails): the next prolog
frees what an ended job still holds of its GPUs, and sync's sweep or the lease the rest."""
RELEASE_THREADS = 8
RELEASE_FAILURES_KEPT = 1024
PARSED_FORMS = 64
"""Argument lists whose parse a hooks service keeps."""
SWEEP_SECONDS = 5.0


def _request_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-id", help="the job (default SLURM_JOB_ID)")
    parser.add_argument("--node", help="act for this node only (default SLURMD_NODENAME)")
    parser.add_argument("--gres", help="as sbatch --gres, e.g. gpu:h100:4")
    parser.add_argument("--gpus", "-G", help="as sbatch --gpus, e.g. a100:2")
    parser.add_argument("--gpus-per-node", help="as sbatch --gpus-per-node")
    parser.add_argument("--nodes", "-N", type=int, help="as sbatch --nodes (for --gpus)")
    parser.add_argument("--constraint", "-C", help="as sbatch --constraint; `nvlink` asks for it")
    parser.add_argument("--nvlink", action="store_true", help="the GPUs must be NVLink-connected")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpualloc-slurm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--allocator", help="host:port (env GPUALLOC_ALLOCATOR_ADDR)")
    parser.add_argument(
        "--inventory", help="host:port (env GPUALLOC_INVENTORY_ADDR; default allocator)"
    )
    add_client_flags(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in (
        ("prolog", "reserve and commit the job's GPUs; print its GPU environment"),
        ("task-prolog", "print the GPU environment of the job's reservation on this node"),
    ):
        _request_flags(commands.add_parser(name, help=text))
    epilog = commands.add_parser("epilog", help="release the job's GPUs (idempotent)")
    epilog.add_argument("--job-id", help="the job (default SLURM_JOB_ID)")
    epilog.add_argument("--node", help="this node only (default SLURMD_NODENAME)")
    epilog.add_argument(
        "--all-nodes",
        action="store_true",
        help="release on every node (the job completion script, EpilogSlurmctld)",
    )
    epilog.add_argument(
        "--sweep",
        action="store_true",
        help="also release the reservations of this cluster's ended jobs (from squeue): what "
        "an earlier epilog could not release (the job completion script)",
    )
    epilog.add_argument(
        "--ignore-errors",
        action="store_true",
        help="exit 0 even when the allocator cannot be reached (Slurm drains a node whose "
        "Epilog fails)",
    )
    gres = commands.add_parser("gres-conf", help="gres.conf for a node, from the inventory")
    which = gres.add_mutually_exclusive_group(required=True)
    which.add_argument("--node", help="the node")
    which.add_argument("--all", action="store_true", help="every node of the inventory")
    gres.add_argument(
        "--mig-minors",
        metavar="PATH",
        help="the node's /proc/driver/nvidia-caps/mig-minors, to pin MIG devices' files",
    )
    sync = commands.add_parser(
        "sync",
        help="keep Slurm off the GPUs other owners hold (holder jobs) and renew the leases of "
        "running jobs; a service on the controller, as root",
    )
    sync.add_argument("--once", action="store_true", help="one pass; print what it did")
    sync.add_argument(
        "--interval",
        help="pause between passes (a duration; env GPUALLOC_SLURM_SYNC_INTERVAL, default 10s)",
    )
    sync.add_argument("--cluster", help="this Slurm's ClusterName (default: scontrol's)")
    hooks = commands.add_parser(
        "hooks",
        help="only the hooks' work on --socket (a compute node's TaskProlog); a service",
    )
    for served in (sync, hooks):
        served.add_argument(
            "--socket",
            help="do the Slurm hooks' work for gpualloc-hook.py on this Unix socket (env "
            "GPUALLOC_SLURM_SOCKET; sync: none when unset)",
        )
        served.add_argument(
            "--hook-uid",
            type=int,
            action="append",
            default=[],
            help="a uid besides root and the service's own that may run prolog and epilog "
            "through the socket (SlurmUser's; repeat for more)",
        )
    translate = commands.add_parser("translate", help="print the claim a request becomes")
    _request_flags(translate)
    return parser


def _request(args: argparse.Namespace) -> SlurmGpuRequest | None:
    """The request given by flags, or None to read it from the environment."""
    gres, gpus = getattr(args, "gres", None), getattr(args, "gpus", None)
    per_node = getattr(args, "gpus_per_node", None)
    if not (gres or gpus or per_node):
        return None
    return request_from_options(
        gres=gres,
        gpus=gpus,
        gpus_per_node=per_node,
        nodes=args.nodes or 1,
        constraint=args.constraint,
        nvlink=args.nvlink,
    )


def _slurmctld(environ: Mapping[str, str]) -> bool:
    return environ.get("SLURM_SCRIPT_CONTEXT", "") == SLURMCTLD_CONTEXT


def _live_jobs(environ: Mapping[str, str]) -> dict[str, str]:
    """Job id -> state of every job slurmctld still lists."""
    return {row.job_id: row.state for row in SlurmCommands(environ).jobs()}


def _job(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    details_of: Callable[[str], str | None] | None = None,
) -> SlurmJob:
    """The job of a hook's environment. `details_of`: `scontrol show job -d`'s text for a job
    id without starting scontrol (the service's libslurm), None to start it."""
    env = dict(environ)
    if args.job_id:
        env["SLURM_JOB_ID"] = args.job_id
    if getattr(args, "nvlink", False):
        env["GPUALLOC_NVLINK"] = "1"
    if getattr(args, "constraint", None):
        env["SLURM_JOB_CONSTRAINTS"] = args.constraint
    request = _request(args)
    details = None
    if args.command == "prolog" and request is None and not args.node and _slurmctld(env):
        job_id = env.get("SLURM_JOB_ID", "").strip()
        if job_id:
            details = details_of(job_id) if details_of is not None else None
            if details is None:
                details = SlurmCommands(env).job_details(job_id)
    step = args.command == "task-prolog"
    return SlurmJob.from_environ(env, node=args.node, request=request, details=details, step=step)


def _tell_the_job(
    args: argparse.Namespace, environ: Mapping[str, str], text: str, err: TextIO
) -> None:
    """PrologSlurmctld: put the outcome where the user sees it (the job's Comment)."""
    if args.command != "prolog" or not _slurmctld(environ):
        return
    job_id = (args.job_id or environ.get("SLURM_JOB_ID", "")).strip()
    if not job_id:
        return
    comment = re.sub(r"\s+", " ", f"gpualloc: {text}").strip()[:COMMENT_LIMIT]
    try:
        SlurmCommands(environ).set_comment(job_id, comment)
    except FailedPrecondition as error:
        print(f"gpualloc-slurm: could not set the job's Comment: {error}", file=err)


@console_main
def main(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    env = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    return _answer(args, env, out, err, lambda: _connect_and_run(args, env, out, err))


def _connect_and_run(
    args: argparse.Namespace, env: Mapping[str, str], out: TextIO, err: TextIO
) -> int:
    settings = client_settings(args, env)
    if args.command == "translate":
        return _translate(args, env, out)
    target = args.allocator or settings.target
    # the services read the inventory from a warm copy (batching.py), the commands anew
    inventory_type = WarmInventory if args.command in ("sync", "hooks") else InventoryClient
    with (
        AllocatorClient(
            target,
            tls=settings.tls,
            token_file=settings.token_file,
            deadline_seconds=settings.deadline_seconds,
            retry=settings.retry,
        ) as client,
        inventory_type(
            args.inventory or settings.inventory_target or target,
            tls=settings.tls,
            token_file=settings.token_file,
            deadline_seconds=settings.deadline_seconds,
            retry=settings.retry,
        ) as inventory,
    ):
        if args.command in ("sync", "hooks"):
            return _serve(args, env, settings, client, inventory, out)
        return _run(args, env, client, inventory, out, err)


def _answer(
    args: argparse.Namespace,
    env: Mapping[str, str],
    out: TextIO,
    err: TextIO,
    work: Callable[[], int],
) -> int:
    """`work`'s exit status, the typed errors mapped to the documented ones (module doc)."""
    try:
        return work()
    except Unplaceable as error:
        print(f"gpualloc-slurm: {error}", file=err)
        _tell_the_job(args, env, str(error), err)
        return EXIT_UNPLACEABLE
    except InvalidArgument as error:
        print(f"gpualloc-slurm: {error}", file=err)
        _tell_the_job(args, env, str(error), err)
        return EXIT_INVALID
    except NoReservation as error:
        print(f"gpualloc-slurm: {error}", file=err)
        out.write(f"print gpualloc-slurm: {error}\n")
        _tell_the_job(args, env, str(error), err)
        return EXIT_NO_RESERVATION
    except GpuallocError as error:
        if args.command == "epilog" and args.ignore_errors:
            print(f"gpualloc-slurm: epilog: {error} (ignored)", file=err)
            return 0
        print(f"gpualloc-slurm: {type(error).__name__}: {error}", file=err)
        _tell_the_job(args, env, f"{type(error).__name__}: {error}", err)
        return EXIT_FAILED


def _run(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    client: AllocatorClient,
    inventory: InventoryClient,
    out: TextIO,
    err: TextIO,
    details_of: Callable[[str], str | None] | None = None,
    settle: Callable[[], bool] | None = None,
) -> int:
    """The command. The service passes `details_of` (Slurm's job details without scontrol)
    and `settle` (wait for the epilogs' releases queued meanwhile; True when any was done)."""
    if args.command == "gres-conf":
        minors = parse_mig_minors(Path(args.mig_minors).read_text()) if args.mig_minors else None
        nodes = inventory.nodes() if args.all else [inventory.node(args.node)]
        if nodes == [None]:
            raise InvalidArgument.at("--node", f"node {args.node!r} is not in the inventory")
        out.write("\n".join(render_gres_conf(n, minors) for n in nodes if n is not None))
        return 0
    if is_holder(environ):
        job_id = environ.get("SLURM_JOB_ID", "")
        print(
            f"gpualloc-slurm: job {job_id} is a {HOLDER_NAME} holder job: nothing to do", file=err
        )
        return 0
    job = _job(args, environ, details_of)
    client.owner = job.owner
    if args.command == "epilog":
        released = run_epilog(client, job, all_nodes=args.all_nodes)
        print(
            f"gpualloc-slurm: job {job.job_id}: released {len(released)} reservation(s)", file=err
        )
        if args.sweep:
            # jobcomp/script passes no cluster's name without accounting: scontrol's
            cluster = job.cluster or _cluster(SlurmCommands(environ))
            swept = sweep(client, cluster, lambda: _live_jobs(environ), keep=job.job_id)
            if swept:
                print(
                    f"gpualloc-slurm: released {len(swept)} reservation(s) of ended jobs", file=err
                )
        return 0
    if args.command == "prolog":
        lease = env_duration(environ, "GPUALLOC_SLURM_LEASE", JOB_LEASE_SECONDS, minimum=0.0)
        found = _reserve(client, inventory, job, lease, environ, settle)
        if not found:
            print(f"gpualloc-slurm: job {job.job_id} requests no GPU", file=err)
        elif environ.get("SLURM_JOB_RESTART_COUNT", "0").strip() not in ("", "0"):
            # a requeued job's Comment still says why an earlier try failed
            held = "; ".join(f"{g.node}: {','.join(d.device for d in g.devices)}" for g in found)
            _tell_the_job(args, environ, f"reserved {held}", err)
    else:
        found = task_gpus(client, inventory, job)
    for gpus in found:
        summary = ", ".join(str(d) for d in gpus.devices) or "no device"
        print(f"gpualloc-slurm: job {job.job_id} on {gpus.node}: {summary}", file=err)
    if len(found) == 1:
        out.write("\n".join(found[0].exports()) + "\n")
    return 0


def _reserve(
    client: AllocatorClient,
    inventory: InventoryClient,
    job: SlurmJob,
    lease: float,
    environ: Mapping[str, str],
    settle: Callable[[], bool] | None = None,
) -> list[JobGpus]:
    """run_prolog. Slurm hands the GPUs a job leaves to the next job as soon as it ends,
    while that job's release may still be on its way, so when Slurm's pick is held: first
    (in the service, `settle`) the releases queued meanwhile are waited for and the prolog
    reserves again; then, when what blocks it is only jobs of this cluster that no longer
    run, those are released and it reserves once more (release_ended_holders): Slurm saw the
    GPUs free, and they are. Any other holder stays, and the job is requeued with the
    reason."""
    try:
        return run_prolog(client, inventory, job, lease_seconds=lease)
    except Unplaceable as error:
        blocked = error
    if settle is not None and settle():
        try:
            return run_prolog(client, inventory, job, lease_seconds=lease)
        except Unplaceable as error:
            blocked = error
    freed = (
        release_ended_holders(
            client, blocked.placement, job.cluster, _live_jobs(environ), keep=job.job_id
        )
        if job.cluster
        else []
    )
    if not freed:
        raise blocked
    log.info("prolog of job %s: released %d reservation(s) of ended jobs", job.job_id, len(freed))
    return run_prolog(client, inventory, job, lease_seconds=lease)


_Epilog = tuple[argparse.Namespace, Mapping[str, str], int]
"""A queued epilog: its arguments, its environment, its own key (`_Hooks._epilog`)."""


class _Hooks:
    """The Slurm scripts' commands done in this long-running process, for the hook clients
    (services/bridges/slurm/hooks.py): the same commands (`_run`) on this process's channels,
    with what a long-running process can keep: the prologs of one moment reserved in one
    AllocateBatch (`AllocateBatcher`), the inventory read from a warm copy (`WarmInventory`),
    Slurm's GPU ids read through libslurm instead of an scontrol per prolog (`JobDetails`), and
    the epilogs' releases queued (`Releases`) and answered at once."""

    def __init__(
        self,
        environ: Mapping[str, str],
        settings: ClientSettings,
        client: AllocatorClient,
        inventory: InventoryClient,
        hook_uids: Iterable[int],
        cluster: Callable[[], str] = lambda: "",
        *,
        sweeps: bool = True,
    ) -> None:
        """`sweeps`: do the epilogs' `--sweep` (not in sync, whose passes sweep anyway)."""
        self.environ = dict(environ)
        self.settings = settings
        self.client = client
        self.inventory = inventory
        self.allowed_uids = frozenset({0, os.getuid(), *hook_uids})
        self.batcher = AllocateBatcher(client)
        self.reserved = Reserved()
        self._parser = build_parser()  # once: building it costs more than a hook's work
        self._parsing = threading.Lock()
        self._parsed: dict[tuple[str, ...], argparse.Namespace] = {}
        self._client = BatchingClient(
            self.batcher,
            self.reserved,
            deadline_seconds=settings.deadline_seconds,
            retry=settings.retry,
        )
        self.details = JobDetails(environ)
        self._cluster = cluster
        self._sweeps = sweeps
        self._swept = -SWEEP_SECONDS
        self._pool = ThreadPoolExecutor(RELEASE_THREADS, thread_name_prefix="slurm-release")
        self._failed: dict[int, str] = {}  # node Epilog -> why its release failed
        self._failing = threading.Lock()
        self._epilogs = itertools.count(1)
        self.releases = Releases(self._release, then=self._sweep)

    def close(self) -> None:
        self.releases.close()
        self._pool.shutdown(wait=False)

    def warm(self) -> None:
        """What the first prolog would wait for, done at the service's start: libslurm
        loaded, the inventory read, the allocator's channel connected."""
        self.details.load()
        try:
            self.inventory.nodes(topology=False)
        except GpuallocError as error:  # the first hook reads it again
            log.warning("reading the inventory at the start: %s: %s", type(error).__name__, error)

    def answer(self, argv: Sequence[str], env: Mapping[str, str], uid: int) -> HookAnswer:
        try:
            args = self._parse(argv)
        except SystemExit:
            return HookAnswer(EXIT_INVALID, stderr=f"gpualloc-slurm: bad hook arguments {argv}\n")
        if args.command not in HOOK_COMMANDS:
            return HookAnswer(EXIT_INVALID, stderr=f"gpualloc-slurm: {args.command}: not a hook\n")
        if args.command in CHANGING_HOOKS and uid not in self.allowed_uids:
            return HookAnswer(
                EXIT_INVALID,
                stderr=f"gpualloc-slurm: uid {uid} may not run {args.command} through the "
                "socket (root, the service's user and its --hook-uid only)\n",
            )
        job_env = {k: v for k, v in env.items() if k.startswith("SLURM") or k == "GPUALLOC_NVLINK"}
        environ = {**self.environ, **job_env}
        began = time.monotonic()
        if args.command == "epilog":
            return self._epilog(args, environ, began)
        SPENT.reset()
        cpu = time.thread_time()
        with self.batcher.arriving() if args.command == "prolog" else contextlib.nullcontext():
            answer = self._run(args, environ, self._settler())
        log.info(
            "%s of job %s: exit %d in %.0f ms (%s; CPU %.1f ms)%s",
            args.command,
            environ.get("SLURM_JOB_ID", "?"),
            answer.code,
            (time.monotonic() - began) * 1000,
            SPENT.summary(),
            (time.thread_time() - cpu) * 1000,
            f": {answer.stderr.strip()}" if answer.code else "",
        )
        return answer

    def _parse(self, argv: Sequence[str]) -> argparse.Namespace:
        """The hook's arguments (SystemExit when bad), parsed once per form: the hooks send a
        few (`prolog`, `task-prolog`, `epilog --ignore-errors`, ...), one per job each."""
        key = tuple(argv)
        with self._parsing:
            parsed = self._parsed.get(key)
            if parsed is None:
                with contextlib.redirect_stderr(io.StringIO()):
                    parsed = self._parser.parse_args(argv)
                if len(self._parsed) < PARSED_FORMS:
                    self._parsed[key] = parsed
        return copy.copy(parsed)

    def _epilog(
        self, args: argparse.Namespace, environ: dict[str, str], began: float
    ) -> HookAnswer:
        """The job completion script's (--all-nodes) is answered once its release is queued;
        a node Epilog's once its release is done, or after NODE_EPILOG_WAIT_SECONDS."""
        if not environ.get("SLURM_CLUSTER_NAME", "").strip():  # jobcomp/script's, say
            environ["SLURM_CLUSTER_NAME"] = self._cluster()
        epilog = next(self._epilogs)  # its own key: a job id is not (see _release_job)
        ticket = self.releases.submit((args, environ, epilog))
        job_id = args.job_id or environ.get("SLURM_JOB_ID", "")
        node = args.node or environ.get("SLURMD_NODENAME", "")
        if args.all_nodes or not node:
            return HookAnswer(0, stderr=f"gpualloc-slurm: job {job_id}: release queued\n")
        done = self.releases.wait_for(ticket, NODE_EPILOG_WAIT_SECONDS)
        took = (time.monotonic() - began) * 1000
        with self._failing:
            failed = self._failed.pop(epilog, None)
        if done and failed is None:
            log.info("epilog of job %s on %s: released in %.0f ms", job_id, node, took)
            return HookAnswer(0, stderr=f"gpualloc-slurm: job {job_id} on {node}: released\n")
        why = failed or f"still running after {NODE_EPILOG_WAIT_SECONDS:g}s"
        log.warning("epilog of job %s on %s: release %s (%.0f ms)", job_id, node, why, took)
        return HookAnswer(  # 0 all the same: Slurm drains a node whose Epilog fails
            0,
            stderr=f"gpualloc-slurm: job {job_id} on {node}: release {why}; the next prolog on "
            "these GPUs, sync's sweep or the lease frees them\n",
        )

    def _settler(self) -> Callable[[], bool]:
        """A prolog's `settle`: waits (at most RELEASE_WAIT_SECONDS) for the releases queued
        so far; True when one was done since the prolog came (its GPUs may be free now)."""
        done = self.releases.done

        def settle() -> bool:
            began = time.monotonic()
            if not self.releases.wait_for_queued(RELEASE_WAIT_SECONDS):
                log.warning("prolog: the releases queued took over %gs", RELEASE_WAIT_SECONDS)
            log.info(
                "prolog: Slurm's pick still held; %d release(s) done after %.0f ms",
                self.releases.done - done,
                (time.monotonic() - began) * 1000,
            )
            return self.releases.done > done

        return settle

    def _run(
        self,
        args: argparse.Namespace,
        environ: Mapping[str, str],
        settle: Callable[[], bool] | None = None,
    ) -> HookAnswer:
        """The command, as `main` runs it, on a client of its own (`_run` sets the job's
        owner on it) sharing this process's channel and AllocateBatcher."""
        out, err = io.StringIO(), io.StringIO()
        client = self._client.for_job()

        def details_of(job_id: str) -> str | None:
            began = time.monotonic()
            try:
                return self.details.show(job_id)
            finally:
                SPENT.ids_ms += (time.monotonic() - began) * 1000

        def work() -> int:
            return _run(args, environ, client, self.inventory, out, err, details_of, settle)

        code = _answer(args, environ, out, err, work)
        return HookAnswer(code, out.getvalue(), err.getvalue())

    def _release(self, batch: Sequence[_Epilog]) -> None:
        """The queued epilogs' releases: each job's reservations of its cluster, on its node
        or (--all-nodes) everywhere, released, the jobs side by side (independent). A release
        that fails is logged; the sweep or the lease frees it."""
        ended: dict[str, list[tuple[str | None, str, int]]] = {}  # job -> (node, cluster, epilog)
        for args, environ, epilog in batch:
            job_id = (args.job_id or environ.get("SLURM_JOB_ID", "")).strip()
            if not job_id or is_holder(environ):
                continue
            node = None if args.all_nodes else (args.node or environ.get("SLURMD_NODENAME"))
            cluster = environ.get("SLURM_CLUSTER_NAME", "").strip()
            ended.setdefault(job_id, []).append((node, cluster, epilog))
        if len(ended) == 1:
            self._release_job(*next(iter(ended.items())))
        elif ended:
            list(self._pool.map(lambda job: self._release_job(*job), ended.items()))

    def _release_job(self, job_id: str, asked: Sequence[tuple[str | None, str, int]]) -> None:
        """One job's release: the reservations this service made for it (`Reserved`), by
        their ids; else (or when one of those was gone already: a requeued job's new one may
        be held) those listed for its owner, on its node only for a node Epilog (a List of
        one node reads that node alone). A failure is told to each node Epilog that asked,
        by its own key: a job id would be shared by the job's nodes' epilogs when one service
        serves several nodes, and by a later job when Slurm reuses ids (its state lost), so
        one epilog could take another's failure, or a stale one."""
        nodes = None if any(n is None for n, _, _ in asked) else {n for n, _, _ in asked if n}

        def releases(reservation: Reservation) -> bool:
            return any(
                (node is None or node == reservation.node_name)
                and (not cluster or reservation.labels.get(CLUSTER_LABEL, cluster) == cluster)
                for node, cluster, _ in asked
            )

        try:
            known = self.reserved.pop(job_id, nodes)
            if known is not None and all(self._release_one(r) for r in known if releases(r)):
                return
            owner = slurm_owner(job_id)
            listed = (
                [r for n in sorted(nodes) for r in self.client.list(owner=owner, node_name=n)]
                if nodes is not None
                else self.client.list(owner=owner)
            )
            for reservation in listed:
                if releases(reservation):
                    self._release_one(reservation)
        except GpuallocError as error:
            log.warning("epilog of job %s: %s: %s", job_id, type(error).__name__, error)
            with self._failing:  # the node Epilogs wait for it: tell them
                for node, _, epilog in asked:
                    if node is not None:
                        self._failed[epilog] = f"{type(error).__name__}: {error}"
                while len(self._failed) > RELEASE_FAILURES_KEPT:  # epilogs that stopped waiting
                    del self._failed[next(iter(self._failed))]

    def _release_one(self, reservation: Reservation) -> bool:
        """Release it; False when it was gone already (a failure is raised)."""
        released = self.client.release(reservation, owner=reservation.owner, allow_missing=True)
        return released is not None

    def _sweep(self, batch: Sequence[_Epilog]) -> None:
        """The epilogs' `--sweep`, after their releases (no prolog waits for it), at most
        every SWEEP_SECONDS: it lists every reservation and asks squeue. Not in sync, whose
        passes (every GPUALLOC_SLURM_SYNC_INTERVAL) do the same."""
        asked = [env for args, env, _ in batch if args.sweep and env.get("SLURM_CLUSTER_NAME")]
        if not (asked and self._sweeps) or time.monotonic() - self._swept < SWEEP_SECONDS:
            return
        self._swept = time.monotonic()
        environ = asked[-1]
        try:
            sweep(self.client, environ["SLURM_CLUSTER_NAME"].strip(), lambda: _live_jobs(environ))
        except GpuallocError as error:
            log.warning("the epilogs' sweep failed: %s: %s", type(error).__name__, error)


def _serve(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    settings: ClientSettings,
    client: AllocatorClient,
    inventory: InventoryClient,
    out: TextIO,
) -> int:
    """sync (with the hooks on --socket when given) or hooks alone, until SIGTERM/SIGINT."""
    path = args.socket or environ.get("GPUALLOC_SLURM_SOCKET", "").strip()
    if args.command == "hooks" and not path:
        raise InvalidArgument.at("--socket", "hooks needs the socket's path")
    if args.command == "sync" and args.once:
        return _sync(args, environ, client, inventory, out, None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    hooks = (
        _Hooks(
            environ,
            settings,
            client,
            inventory,
            args.hook_uid,
            _cluster_of(args, environ),
            sweeps=args.command == "hooks",  # sync's own passes sweep
        )
        if path
        else None
    )
    if hooks is not None:
        hooks.warm()
    server = HookServer(path, hooks.answer).start() if hooks is not None else None
    try:
        if args.command == "hooks":
            log.info("serving the Slurm hooks on %s", path)
            stop.wait()
            return 0
        return _sync(args, environ, client, inventory, out, stop)
    finally:
        if server is not None:
            server.close()
        if hooks is not None:
            hooks.close()


def _sync(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    client: AllocatorClient,
    inventory: InventoryClient,
    out: TextIO,
    stop: threading.Event | None,
) -> int:
    slurm = SlurmCommands(environ)
    cluster = args.cluster or environ.get("SLURM_CLUSTER_NAME", "").strip() or _cluster(slurm)
    lease = env_duration(environ, "GPUALLOC_SLURM_LEASE", JOB_LEASE_SECONDS, minimum=0.0)
    given = {"GPUALLOC_SLURM_SYNC_INTERVAL": args.interval} if args.interval else {}
    interval = env_duration(
        {**environ, **given}, "GPUALLOC_SLURM_SYNC_INTERVAL", SYNC_INTERVAL_SECONDS, minimum=0.1
    )
    if lease and interval > lease / 3:
        raise InvalidArgument.at(
            "GPUALLOC_SLURM_SYNC_INTERVAL",
            f"a pass every {interval:g}s cannot keep a {lease:g}s lease (GPUALLOC_SLURM_LEASE) "
            "renewed: make the interval at most a third of the lease",
        )
    syncer = Syncer(client, inventory, slurm, cluster, lease_seconds=lease)
    if stop is None:
        out.write("\n".join(syncer.sync_once().lines()) + "\n")
        return 0
    syncer.run(stop, interval)
    return 0


def _cluster_of(args: argparse.Namespace, environ: Mapping[str, str]) -> Callable[[], str]:
    """This Slurm's ClusterName, looked up once when first needed (an epilog from
    jobcomp/script, which passes none without accounting); "" when scontrol cannot say."""

    @functools.cache
    def cluster() -> str:
        given = getattr(args, "cluster", None) or environ.get("SLURM_CLUSTER_NAME", "").strip()
        try:
            return given or _cluster(SlurmCommands(environ))
        except FailedPrecondition as error:
            log.warning("the epilogs release without a cluster's name: %s", error)
            return ""

    return cluster


def _cluster(slurm: SlurmCommands) -> str:
    """ClusterName from `scontrol show config`."""
    for line in slurm.run("scontrol", "show", "config").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName" and value.strip():
            return value.strip()
    raise FailedPrecondition("scontrol show config names no ClusterName; pass --cluster")


def _translate(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO) -> int:
    job = _job(
        args,
        {**environ, "SLURMD_NODENAME": args.node or "node", "SLURM_JOB_ID": args.job_id or "0"},
    )
    claim = claim_for_node(job.job_id, job.request)
    out.write(f"# {job.request}\n")
    yaml.safe_dump(to_dict(claim), out, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
