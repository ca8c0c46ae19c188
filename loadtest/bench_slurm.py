"""Slurm bridge benchmark: plain Slurm (A) vs Slurm with the gpualloc bridge (B), in one run.

    python -m loadtest.bench slurm [--quick] [--json]      (make bench ARGS=slurm)

A real munged, slurmctld and two slurmd from Debian's slurm-wlm, started exactly as tests/slurm
starts them (tests/slurm/conftest.py `start_slurm`: 8 GPUs per node, gres.conf from the
inventory, examples/bridges/slurm's slurm.conf lines and scripts), with the project's gpualloc
server in this process. Modes, run one after the other for each setting (alternating), each
on a fresh Slurm:

- A: plain Slurm, examples/bridges/slurm/slurm.conf without PrologSlurmctld, TaskProlog and
  Epilog;
- B: the bridge as docs/bridges.md wires it: the compiled hook client itself in the
  PrologSlurmctld, TaskProlog and node Epilog slots (links named after the hooks), handing
  each job to `gpualloc-slurm sync --socket` (here also the compute nodes' service: one
  machine); the node Epilog answers once the job's GPUs of its node are released;
- J: B with the job completion script (`JobCompType=jobcomp/script`, the `jobcomp` link) in
  place of the node Epilog: the release answered at once and done after it, the wiring for a
  site that runs no hooks service on its compute nodes;
- D: B with an EpilogSlurmctld (the `epilog-slurmctld` link) in place of the node Epilog: the
  wiring of issue 31's first measurement;
- H: B with the portable scripts (prolog-slurmctld.sh, taskprolog.sh, epilog.sh) in the slots,
  running the compiled client: what a shell per hook adds;
- Y: H without the compiled client (the scripts run gpualloc-hook.py, a `python3 -I -S`
  start);
- S: B's slurm.conf with each slot running /bin/true: what Slurm's running any
  PrologSlurmctld, TaskProlog and node Epilog costs by itself, the floor for any client;
  N: plain Slurm with only a node Epilog (/bin/true); P and E: plain Slurm with only a
  PrologSlurmctld (/bin/true), with only an EpilogSlurmctld (/bin/true).
  GPUALLOC_BENCH_SLURM_MODES picks them (default A,S,B,J: S is the floor of what B adds, J the
  other release); GPUALLOC_BENCH_SLURM_SETTINGS picks the settings (default all four:
  1-node:default,1-node:bf_interval=1,2-node:default,2-node:bf_interval=1);
  GPUALLOC_BENCH_SLURM_ROUNDS runs the modes that many times in turn (A,B,...,A,B,...): each
  figure is then the median of the rounds, each ratio the median of the rounds' ratios.

A run ends when every job is done or after RUN_SECONDS (180 s; 90 s with --quick): jobs/s is
then the jobs done / the time, and `done` says how many. Settings: one node (partition `gpu`)
and two nodes (partition `multi`), each with Slurm's default scheduler settings and with
`SchedulerParameters=bf_interval=1`. N jobs (200; 24 with --quick) of `--gres=gpu:1`,
`--gres=gpu:4` and `--gres=gpu:h100:2` in turn, each running a one-line shell script,
submitted by sbatch as fast as one client can, after one warm-up job of each (not counted: the
first jobs of a fresh gpualloc and Slurm pay one-time costs a running cluster paid long ago).
Figures per run:

- jobs/s: the jobs done / (the last job gone from squeue, or the run's end - the first
  submission);
- start p50/p99: a job's task start (its script's `date +%s.%N`) - its submission;
- alloc->task p50/p99: its task start - slurmctld's allocation (`sched: Allocate JobId=` or
  `sched/backfill: _start_job: Started JobId=`, milliseconds in slurmctld.log): what the
  prolog chain adds;
- requeued: jobs that ran with SLURM_RESTART_COUNT > 0;
- host CPU: user+system seconds during the run of everything it started: the Slurm daemons
  and what they ran (prologs, steps: slurmstepd is reaped by this process, a subreaper),
  sync, sbatch/squeue, and this process (the gpualloc server in it).

Ratio rows `B/A` (and J/A, ...): jobs/s and CPU as ratios, alloc->task as milliseconds added.
Targets (issue 31, at N=200): jobs/s >= 0.9 x plain Slurm, 0 requeued, alloc->task added p50 <=
50 ms and p99 <= 200 ms, CPU <= 1.5 x. The machine is shared: the ratios within a run count.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from loadtest.report import BenchReport, Target, percentile
from services.bridges import local_cluster
from tests.slurm.conftest import (
    COMPILED_HOOK,
    NODE,
    NODES,
    SLOTS,
    SlurmCluster,
    TcpProxy,
    start_slurm,
)

N_JOBS = 200
N_QUICK = 24
GRES = ("gpu:1", "gpu:4", "gpu:h100:2")
SETTINGS = (("1-node", "gpu"), ("2-node", "multi"))
SCHEDULERS = ("default", "bf_interval=1")
MODES = ("A", "S", "B", "J")
PLAIN = ("A", "N", "P", "E")
"""Plain Slurm, with at most one /bin/true hook (a probe of Slurm's own costs)."""
NO_SERVICE = (*PLAIN, "S")
RUN_SECONDS = 180.0
RUN_QUICK_SECONDS = 90.0
HOOKED = ("PrologSlurmctld=", "TaskProlog=", "Epilog=", "JobCompType=", "JobCompLoc=")
TRUE = "/bin/true"
RELEASES = {"J": ("jobcomp", "JobComp"), "D": ("epilog-slurmctld", "EpilogSlurmctld=")}
"""The modes that release elsewhere than in the node Epilog: their slot and slurm.conf line."""
_PR_SET_CHILD_SUBREAPER = 36
_ALLOCATED = re.compile(
    r"^\[(\S+)\] (?:sched: Allocate|sched/backfill: _start_job: Started) JobId=(\d+)\b", re.M
)
_JOB = """#!/bin/sh
echo "$(date +%s.%N) ${{SLURM_RESTART_COUNT:-0}} ${{CUDA_VISIBLE_DEVICES-}}" \
  >> {out}/t-$SLURM_JOB_ID
"""


@dataclass(frozen=True)
class RunResult:
    jobs_per_s: float
    wall_s: float
    done: int
    start_s: list[float]
    alloc_task_s: list[float]
    cpu_s: float
    requeued: int
    without_uuids: int
    """Jobs whose CUDA_VISIBLE_DEVICES is not GPU UUIDs (gpualloc's TaskProlog writes them;
    Slurm's own, indices, is what A and S show)."""


def _settings(mode: str, scheduler: str, directory: Path, lines: list[str]) -> list[str]:
    """examples/bridges/slurm/slurm.conf's lines for the mode and scheduler (module doc)."""
    scripts = directory / "gpualloc"
    kept = list(lines)
    if mode in PLAIN:
        kept = [line for line in kept if not line.startswith(HOOKED)]
        probe = {"N": "Epilog", "P": "PrologSlurmctld", "E": "EpilogSlurmctld"}.get(mode)
        kept.append(f"{probe}={TRUE}" if probe else "")
    if mode in RELEASES:
        name, setting = RELEASES[mode]
        kept = [line for line in kept if not line.startswith("Epilog=")]
        if setting == "JobComp":
            kept += ["JobCompType=jobcomp/script", f"JobCompLoc={scripts / name}"]
        else:
            kept.append(f"{setting}{scripts / name}")
    if mode == "S":
        for slot in SLOTS:
            (scripts / slot).unlink()
            (scripts / slot).symlink_to(TRUE)
    if mode in ("H", "Y"):  # the slots run the portable scripts
        for slot in SLOTS:
            (scripts / slot).unlink()
            (scripts / slot).write_bytes((scripts / f"{slot}.sh").read_bytes())
            (scripts / slot).chmod(0o755)
    if mode == "Y":
        (scripts / COMPILED_HOOK).unlink(missing_ok=True)
    if scheduler != "default":
        kept = [
            f"{line},{scheduler}" if line.startswith("SchedulerParameters=") else line
            for line in kept
        ]
    return [line for line in kept if line]


def _proc_cpu(pid: int) -> float:
    """utime + stime + the reaped children's, of a running process, in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _reap() -> None:
    """Collect the exited orphans this subreaper inherited (slurmstepd), so their CPU counts."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _host_cpu(pids: list[int]) -> float:
    _reap()
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    return used + sum(_proc_cpu(p) for p in pids)


def _allocated(log: str) -> dict[str, float]:
    """Job id -> the time slurmctld last allocated it (local time, as slurmctld logs it)."""
    return {m[2]: datetime.fromisoformat(m[1]).timestamp() for m in _ALLOCATED.finditer(log)}


@contextlib.contextmanager
def _slurm(mode: str, scheduler: str, directory: Path) -> Iterator[tuple[SlurmCluster, list[int]]]:
    """A fresh Slurm (and gpualloc, and sync for B and C): the cluster and the pids to count."""
    with local_cluster.start() as gpualloc:
        proxy = TcpProxy(("127.0.0.1", gpualloc.port))

        def settings(lines: list[str]) -> list[str]:
            return _settings(mode, scheduler, directory, lines)

        cluster = start_slurm(directory, gpualloc, proxy, settings)
        try:
            with contextlib.ExitStack() as stack:
                pids = [p.pid for p in cluster.processes]
                if mode not in NO_SERVICE:
                    # straight to gpualloc: the tests' proxy (a Python thread per connection,
                    # there to take gpualloc away) is no part of a deployment
                    sync = stack.enter_context(
                        cluster.syncing("--interval=10s", GPUALLOC_ALLOCATOR_ADDR=gpualloc.target)
                    )
                    pids.append(sync.pid)
                yield cluster, pids
        finally:
            cluster.stop()
            proxy.close()


def run_once(
    mode: str, scheduler: str, partition: str, jobs: int, seconds: float = RUN_SECONDS
) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="gpualloc-bench-slurm-") as top:
        directory = Path(top)
        directory.chmod(0o755)
        with _slurm(mode, scheduler, directory) as (cluster, pids):
            return _measure(cluster, pids, partition, jobs, seconds)


def _measure(
    cluster: SlurmCluster, pids: list[int], partition: str, jobs: int, seconds: float
) -> RunResult:
    script = cluster.out / "job.sh"
    script.write_text(_JOB.format(out=cluster.out))
    script.chmod(0o755)
    time.sleep(1.0)  # sync's first pass
    _warm_up(cluster, partition, script)
    cpu_before = _host_cpu(pids)
    began = time.time()
    submitted: dict[str, float] = {}
    for index in range(jobs):
        at = time.time()
        done = cluster.run(
            "sbatch", "--parsable", f"--partition={partition}", f"--gres={GRES[index % 3]}",
            "--output=/dev/null", str(script),
        )  # fmt: skip
        submitted[done.stdout.strip().split(";")[0]] = at
    deadline = began + seconds
    while cluster.run("squeue", "-h", "-o", "%i").stdout.split() and time.time() < deadline:
        time.sleep(0.25)
    ended = time.time()
    time.sleep(0.5)  # the last steps' slurmstepd exit
    cpu = _host_cpu(pids) - cpu_before
    allocated = _allocated(cluster.controller_log())
    starts: list[float] = []
    alloc_task: list[float] = []
    requeued = without = 0
    for job_id, at in submitted.items():
        path = cluster.out / f"t-{job_id}"
        text = path.read_text() if path.exists() else ""
        runs = [line.split(" ", 2) for line in text.splitlines()]
        if not runs:
            continue  # not run within the run's time
        started, restarts, gpus = float(runs[-1][0]), int(runs[-1][1]), runs[-1][2:]
        if restarts > 0 or len(runs) > 1:
            requeued += 1
            why = cluster.job(job_id).get("Comment", "")
            print(f"job {job_id} was requeued: {why or '(no Comment)'}", file=sys.stderr)
        without += not (gpus and gpus[0].startswith("GPU-"))
        starts.append(started - at)
        if job_id in allocated:
            alloc_task.append(started - allocated[job_id])
    _keep_logs(cluster)
    finished = len(starts)
    return RunResult(
        finished / (ended - began), ended - began, finished, starts, alloc_task, cpu, requeued,
        without,
    )  # fmt: skip


def _warm_up(cluster: SlurmCluster, partition: str, script: Path) -> None:
    """One job of each GRES run to its end before the measured ones, in every mode: the
    first job of a fresh gpualloc and Slurm pays one-time costs (the allocator's first
    solve, slurmd's first launch) that a running cluster paid long ago. Not counted."""
    for gres in GRES:
        cluster.run(
            "sbatch", "--parsable", "--wait", f"--partition={partition}", f"--gres={gres}",
            "--output=/dev/null", str(script),
        )  # fmt: skip
    for path in cluster.out.glob("t-*"):
        path.unlink()


LOGS = Path(tempfile.gettempdir()) / "gpualloc-bench-slurm-logs"


def _keep_logs(cluster: SlurmCluster) -> None:
    """slurmctld's, slurmd's and sync's logs of the run, in LOGS/<n>/ (the run's directory
    goes)."""
    LOGS.mkdir(exist_ok=True)
    kept = LOGS / str(len(list(LOGS.iterdir())))
    kept.mkdir()
    for name in ("slurmctld.log", "sync.log", *(f"slurmd-{n}.log" for n in NODES)):
        path = cluster.directory / "log" / name
        if path.exists():
            (kept / name).write_bytes(path.read_bytes())
    print(f"logs of the run: {kept}", file=sys.stderr)


Figures = dict[str, float | int | str]


def _row(result: RunResult) -> Figures:
    return {
        "jobs_per_s": result.jobs_per_s,
        "wall_s": result.wall_s,
        "done": result.done,
        "start_p50_s": statistics.median(result.start_s or [0.0]),
        "start_p99_s": percentile(result.start_s, 0.99),
        "alloc_task_p50_ms": statistics.median(result.alloc_task_s or [0.0]) * 1000,
        "alloc_task_p99_ms": percentile(result.alloc_task_s, 0.99) * 1000,
        "cpu_s": result.cpu_s,
        "requeued": result.requeued,
        "not_uuids": result.without_uuids,
    }


def _ratios(row: Figures, plain: Figures) -> dict[str, float]:
    """A mode's row against plain Slurm's of the same round."""
    return {
        "jobs_per_s": float(row["jobs_per_s"]) / float(plain["jobs_per_s"]),
        "alloc_task_p50_ms": float(row["alloc_task_p50_ms"]) - float(plain["alloc_task_p50_ms"]),
        "alloc_task_p99_ms": float(row["alloc_task_p99_ms"]) - float(plain["alloc_task_p99_ms"]),
        "cpu_s": float(row["cpu_s"]) / float(plain["cpu_s"]),
    }


def _median(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(float(r[k]) for r in rows) for k in rows[0]}


COUNTED = ("requeued", "not_uuids")
"""Summed over the rounds, not a median."""


def run(quick: bool = False) -> BenchReport:
    jobs = N_QUICK if quick else N_JOBS
    seconds = RUN_QUICK_SECONDS if quick else RUN_SECONDS
    modes = os.environ.get("GPUALLOC_BENCH_SLURM_MODES", ",".join(MODES)).split(",")
    rounds = int(os.environ.get("GPUALLOC_BENCH_SLURM_ROUNDS", "1"))
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    report = BenchReport(
        "slurm",
        setup={
            "jobs": jobs,
            "gres": "/".join(GRES),
            "gpus_per_node": 8,
            "node": NODE,
            "modes": ",".join(modes),
            "rounds": rounds,
            "run_s_max": seconds,
        },
    )
    cases = [(f"{n}:{sched}", p, sched) for n, p in SETTINGS for sched in SCHEDULERS]
    picked = os.environ.get("GPUALLOC_BENCH_SLURM_SETTINGS", "").split(",")
    cases = [c for c in cases if c[0] in picked] if picked != [""] else cases
    for case, partition, scheduler in cases:
        rows: dict[str, list[Figures]] = {m: [] for m in modes}
        for round_ in range(rounds):
            for mode in modes:
                row = _row(run_once(mode, scheduler, partition, jobs, seconds))
                rows[mode].append(row)
                print(f"{case}:{mode}#{round_ + 1} {row}", file=sys.stderr, flush=True)
        for mode in modes:
            medians = _median([{k: float(v) for k, v in r.items() if k not in COUNTED}
                               for r in rows[mode]])  # fmt: skip
            figures: Figures = {
                k: sum(int(r[k]) for r in rows[mode]) if k in COUNTED
                else int(min(float(r[k]) for r in rows[mode])) if k == "done"
                else medians[k]
                for k in rows[mode][0]
            }  # fmt: skip
            report.add(f"{case}:{mode}", **figures)
        for mode in [m for m in modes if m != "A"]:
            name = f"{case}:{mode}/A"
            ratios = _median([_ratios(r, a) for r, a in zip(rows[mode], rows["A"], strict=True)])
            report.add(name, **ratios, **{k: sum(int(r[k]) for r in rows[mode]) for k in COUNTED})
            if mode != "B":
                continue  # a variant, or a probe of Slurm itself: shown, no target
            report.targets += [
                Target(name, "jobs_per_s", 0.9, at_least=True),
                Target(name, "requeued", 0),
                Target(name, "not_uuids", 0),
                Target(name, "alloc_task_p50_ms", 50),
                Target(name, "alloc_task_p99_ms", 200),
                Target(name, "cpu_s", 1.5),
            ]
    return report
