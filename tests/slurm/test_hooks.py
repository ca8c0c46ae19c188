"""The Slurm hooks through `gpualloc-slurm sync --socket` under a real slurmctld and slurmd
(tests/slurm/conftest.py): the hook client hands each job to the service, which reserves,
answers the TaskProlog and releases before the node Epilog returns, so the GPUs a job leaves
are free in gpualloc before Slurm offers them again; and a job whose GPUs a job that no
longer runs still holds in gpualloc runs, not requeued (docs/bridges.md, "Hooks at Slurm's
speed"). The benchmark is `make bench ARGS=slurm`."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime

import pytest

from services.bridges.slurm.request import gpu_ids_from_job_details
from services.client import AllocatorClient
from services.client.specs import RequestSpec, build_claim
from tests.slurm.conftest import HOOK, NODE, SCRIPTS, SlurmCluster
from tests.slurm.test_real_slurm import (
    assert_agree,
    assert_node_not_drained,
    held_devices,
    hold,
    lines,
    queued_at,
    report,
    wait_released,
)
from tests.unit.bridges.support import ROOT

CLUSTER = "gpualloc-test"


@contextlib.contextmanager
def without_the_command(slurm: SlurmCluster) -> Iterator[None]:
    """The hooks' fallback command is /bin/false (in the compiled client's settings and in the
    portable scripts): a job runs only if the service did its work."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(slurm.hook_settings(GPUALLOC_SLURM_CLI="/bin/false"))
        for name in SCRIPTS:
            text = re.sub(r"GPUALLOC_SLURM_CLI=\S+", "GPUALLOC_SLURM_CLI=/bin/false",
                          slurm.script_text(name))  # fmt: skip
            stack.enter_context(slurm.script(name, text))
        yield


@pytest.mark.parametrize("wiring", ["compiled-client-in-the-slots", "portable-scripts"])
def test_a_job_runs_on_exactly_its_gpus_through_the_service(slurm, wiring):
    with contextlib.ExitStack() as stack:
        if wiring == "portable-scripts":  # a site without the compiled client
            stack.enter_context(slurm.portable_wiring())
        stack.enter_context(slurm.syncing("--interval=0.5s"))
        stack.enter_context(without_the_command(slurm))
        job_id = slurm.sbatch("--gres=gpu:2", script=f"{report(slurm)} batch\n{hold(slurm)}\n")
        slurm.wait_for_file(slurm.out / f"ready-{job_id}")
        slurm_ids = list(gpu_ids_from_job_details(slurm.job_details(job_id))[NODE])
        assert held_devices(slurm, job_id) == sorted(f"gpu-{i}" for i in slurm_ids)
        (slurm.out / f"go-{job_id}").touch()
        done = slurm.wait_for(job_id, ["COMPLETED", "FAILED"])
        assert done["JobState"] == "COMPLETED" and done["Restarts"] == "0", done
        task = lines((slurm.out / f"{job_id}.out").read_text())["batch"]
        assert_agree(slurm, task, slurm_ids)
        # released by the node Epilog, before Slurm showed the job COMPLETED
        assert slurm.reservations(owner=f"slurm/job/{job_id}") == []
    assert_node_not_drained(slurm)


def hook(
    slurm: SlurmCluster, *argv: str, user: str = "", **environ: str
) -> subprocess.CompletedProcess[str]:
    run_as = ["runuser", "-u", user, "--"] if user else []
    return subprocess.run(
        [*run_as, "env", f"GPUALLOC_SLURM_SOCKET={slurm.socket}", "GPUALLOC_SLURM_CLI=/bin/false",
         *(f"{k}={v}" for k, v in environ.items()),
         "/usr/bin/python3", "-I", "-S", str(slurm.directory / "gpualloc" / HOOK), *argv],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def reserve_for_gone_job(slurm: SlurmCluster, job_id: str, cluster: str = CLUSTER) -> None:
    """What a job of `cluster` that slurmctld no longer runs still holds: all 8 GPUs."""
    with AllocatorClient(slurm.target) as client:
        placement = client.allocate(
            [build_claim(f"job-{job_id}", [RequestSpec("gpus", 8)])],
            node_name=NODE,
            reserve=True,
            owner=f"slurm/job/{job_id}",
            idempotency_key=f"slurm-{job_id}-{NODE}",
            labels={"slurm.job_id": job_id, "slurm.node": NODE, "slurm.cluster": cluster},
            lease_ttl_seconds=600,
        )
        assert placement.fits


def test_a_job_completion_scripts_release_returns_at_once_and_the_release_follows(slurm):
    reserve_for_gone_job(slurm, "900001")
    with slurm.syncing("--interval=60s"):
        began = time.monotonic()
        done = hook(slurm, "epilog", "--all-nodes", SLURM_JOB_ID="900001",
                    SLURM_CLUSTER_NAME=CLUSTER)  # fmt: skip
        took = time.monotonic() - began
        assert done.returncode == 0 and "release queued" in done.stderr, done
        print(f"epilog hook returned after {took * 1000:.0f} ms")
        wait_released(slurm, "900001", timeout=10)


def test_a_node_epilog_through_the_service_returns_once_released(slurm):
    reserve_for_gone_job(slurm, "900005")
    with slurm.syncing("--interval=60s"):
        began = time.monotonic()
        done = hook(slurm, "epilog", "--ignore-errors", SLURM_JOB_ID="900005",
                    SLURMD_NODENAME=NODE, SLURM_CLUSTER_NAME=CLUSTER)  # fmt: skip
        took = time.monotonic() - began
        assert done.returncode == 0 and f"job 900005 on {NODE}: released" in done.stderr, done
        assert slurm.reservations() == []  # already: Slurm keeps the node until it returns
        print(f"node epilog hook returned after {took * 1000:.0f} ms, released")


def test_the_gpus_a_job_leaves_are_free_in_gpualloc_before_slurm_offers_them(slurm):
    # Slurm starts no job on a node whose Epilog runs (the node is COMPLETING), and the node
    # Epilog returns once the job's GPUs of that node are released: every whole-node job's
    # prolog finds the GPUs the job before it left free at its first Allocate. No prolog waits
    # for a release, none frees an ended job's holding, none is requeued.
    with slurm.syncing("--interval=60s"), without_the_command(slurm):
        time.sleep(1.0)  # sync's first pass
        jobs = [slurm.sbatch("--gres=gpu:8", script="true\n") for _ in range(6)]
        jobs += [slurm.sbatch("-p", "multi", "-N2", "--gpus-per-node=8", script="true\n")
                 for _ in range(2)]  # fmt: skip
        jobs += [slurm.sbatch("--gres=gpu:8", script="true\n") for _ in range(2)]
        for job_id in jobs:
            done = slurm.wait_for(job_id, ["COMPLETED", "FAILED"])
            assert done["JobState"] == "COMPLETED" and done["Restarts"] == "0", done
    log = (slurm.directory / "log" / "sync.log").read_text()
    assert "still held" not in log and "of ended jobs" not in log, log
    for job_id in jobs:
        assert f"epilog of job {job_id} on {NODE}: released" in log, log
    assert slurm.reservations() == []
    assert_node_not_drained(slurm)


@pytest.mark.parametrize("command", ["prolog", "epilog"])
def test_a_job_user_cannot_reserve_or_release_through_the_socket(slurm, command):
    reserve_for_gone_job(slurm, "900002", cluster="elsewhere")  # sync's sweep leaves it
    with slurm.syncing("--interval=60s"):
        done = hook(slurm, command, user="nobody", SLURM_JOB_ID="900002",
                    SLURM_JOB_NODELIST=NODE, SLURM_CLUSTER_NAME=CLUSTER)  # fmt: skip
        assert done.returncode == 2 and f"may not run {command}" in done.stderr, done
        # the read-only TaskProlog is everyone's: it answers (no reservation of this node's
        # step GPUs here, so it says why and exits 4)
        task = hook(slurm, "task-prolog", user="nobody", SLURM_JOB_ID="900003",
                    SLURMD_NODENAME=NODE, SLURM_JOB_GPUS="0")  # fmt: skip
        assert task.returncode == 4 and task.stdout.startswith("print "), task
    assert [r.owner for r in slurm.reservations()] == ["slurm/job/900002"]


@pytest.mark.parametrize("through", ["the-service", "the-command"])
def test_a_job_whose_gpus_an_ended_job_still_holds_runs_not_requeued(slurm, through):
    # Slurm hands a finished job's GPUs to the next job before (or while) the finished job's
    # release runs. Their order used to decide: the next prolog's reservation first,
    # and the job was requeued (1-2 of 200 per run, issue 31). Now the prolog frees what a job
    # that no longer runs holds of Slurm's pick, and reserves.
    with contextlib.ExitStack() as stack:
        if through == "the-service":
            stack.enter_context(slurm.syncing("--interval=60s"))
            stack.enter_context(without_the_command(slurm))
            time.sleep(1.0)  # sync's first pass (whose sweep would free it first) is over
        reserve_for_gone_job(slurm, "900004")
        job_id = slurm.sbatch("--gres=gpu:8", script="true\n")
        # requeued, it would be PENDING with Restarts=1 for Slurm's requeue delay (minutes)
        done = slurm.wait_for(job_id, ["COMPLETED", "FAILED"])
        assert done["JobState"] == "COMPLETED" and done["Restarts"] == "0", done
        wait_released(slurm, job_id)
    assert slurm.reservations() == []
    assert_node_not_drained(slurm)


def test_libslurm_gives_the_prolog_what_scontrol_prints(slurm):
    # sync reads Slurm's GPU ids through libslurm (services/bridges/slurm/libslurm.py) instead
    # of starting scontrol per prolog: the text must be scontrol's, byte for byte. Asked in a
    # process of its own, as sync asks it (slurm_init reads this Slurm's slurm.conf once).
    # Prologs that ask together are read together (one slurm_load_jobs for all): the same
    # text for each job (but its RunTime, a second later), one RPC for the five asks.
    job_id = slurm.sbatch("-p", "multi", "-N2", "--gpus-per-node=3", script=f"{hold(slurm)}\n")
    other = slurm.sbatch("--gres=gpu:1", script=f"{hold(slurm)}\n")
    slurm.wait_for_file(slurm.out / f"ready-{job_id}")
    slurm.wait_for_file(slurm.out / f"ready-{other}")
    asked = subprocess.run(
        [sys.executable, "-c",
         "import os, sys; from services.bridges.slurm.libslurm import JobDetails; "
         "print(JobDetails(os.environ).show(sys.argv[1]), end='')", job_id],
        env=slurm.env, capture_output=True, text=True, timeout=60, check=True, cwd=ROOT,
    )  # fmt: skip
    assert asked.stdout == slurm.job_details(job_id)
    assert len(gpu_ids_from_job_details(asked.stdout)) == 2  # both nodes' GPU ids
    together = subprocess.run(
        [sys.executable, "-c", TOGETHER, job_id, other],
        env=slurm.env, capture_output=True, text=True, timeout=60, check=True, cwd=ROOT,
    )  # fmt: skip
    *texts, reads = together.stdout.split("\0")
    expected = [slurm.job_details(j) for j in (job_id, other, job_id, other, job_id)]
    assert [RUN_TIME.sub("", t) for t in texts] == [RUN_TIME.sub("", t) for t in expected]
    assert reads == "1"
    for done in (job_id, other):
        (slurm.out / f"go-{done}").touch()
        assert slurm.wait_for(done, ["COMPLETED", "FAILED"])["JobState"] == "COMPLETED"


RUN_TIME = re.compile(r"RunTime=\S+")


TOGETHER = """
import os, sys, threading
from services.bridges.slurm.libslurm import JobDetails
details = JobDetails(os.environ)
details.load()
asked = [sys.argv[1], sys.argv[2]] * 2 + [sys.argv[1]]
texts = [None] * len(asked)
with details._changed:  # held: all five queue up before the first read goes
    details._busy = True
    threads = [threading.Thread(target=lambda i=i: texts.__setitem__(i, details.show(asked[i])))
               for i in range(len(asked))]
    for thread in threads:
        thread.start()
    while len(details._queue) < len(asked):
        details._changed.wait(0.01)
    details._busy = False
    details._changed.notify_all()
for thread in threads:
    thread.join()
print("\\0".join([*texts, str(details.reads)]), end="")
"""


def test_the_service_reserves_a_job_queued_at_its_submit_time(slurm):
    # the prolog's item carries the job's SubmitTime (libslurm's text, as scontrol prints it) as
    # its queued_time: the allocator keeps it on the reservation (docs/tenancy.md)
    with slurm.syncing("--interval=0.5s"), without_the_command(slurm):
        job_id = slurm.sbatch("-H", "--gres=gpu:1", script=f"{hold(slurm)}\n")
        submitted = datetime.fromisoformat(slurm.job(job_id)["SubmitTime"]).timestamp()
        while time.time() < submitted + 2:  # started well after it was queued
            time.sleep(0.1)
        slurm.run("scontrol", "release", job_id)
        slurm.wait_for_file(slurm.out / f"ready-{job_id}")
        (held,) = slurm.reservations(owner=f"slurm/job/{job_id}")
        assert held.created_at is not None and held.created_at.timestamp() > submitted + 2
        assert queued_at(held) == submitted
        (slurm.out / f"go-{job_id}").touch()
        assert slurm.wait_for(job_id, ["COMPLETED", "FAILED"])["JobState"] == "COMPLETED"
        wait_released(slurm, job_id)
