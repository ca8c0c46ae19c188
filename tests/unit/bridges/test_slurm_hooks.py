"""The Slurm hooks at Slurm's speed (services/bridges/slurm/hooks.py): the stdlib-only client
examples/bridges/slurm/gpualloc-hook.py against a real HookServer on a Unix socket, the
epilogs' release queue, and the two races between a finished job's release and the next job's
reservation (services/bridges/slurm/prolog.py: `sweep`, `release_ended_holders`) against the
project's gpualloc server. tests/slurm runs the same through a real Slurm."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from services.bridges import local_cluster
from services.bridges.placing import Placer
from services.bridges.slurm.hooks import HookAnswer, HookServer, Releases
from services.bridges.slurm.prolog import release_ended_holders, sweep
from services.client import AllocatorClient, Reservation
from services.client.inventory import InventoryClient
from services.client.results import Placement
from services.client.specs import RequestSpec, build_claim
from tests.peers import peer
from tests.unit.bridges.support import ROOT, release_everything

HOOK = ROOT / "examples" / "bridges" / "slurm" / "gpualloc-hook.py"
NODE = "h100-node-1"
CLUSTER = "c1"


@pytest.fixture(params=["compiled", "portable"])
def hook_client(request: pytest.FixtureRequest) -> list[str]:
    """The hook client's command: the compiled one or gpualloc-hook.py (the same protocol)."""
    if request.param == "portable":
        return ["/usr/bin/python3", "-I", "-S", str(HOOK)]
    return [str(peer("gpualloc-hook"))]


def run_hook(
    client: list[str], path: Path, *argv: str, **environ: str
) -> subprocess.CompletedProcess[str]:
    env = {"GPUALLOC_SLURM_SOCKET": str(path), "PATH": "/usr/bin:/bin", **environ}
    return subprocess.run(
        [*client, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, list[tuple[list[str], dict[str, str], int]]]]:
    """A HookServer whose handler records each request and echoes it back."""
    seen: list[tuple[list[str], dict[str, str], int]] = []

    def handler(argv: Sequence[str], env: Mapping[str, str], uid: int) -> HookAnswer:
        seen.append((list(argv), dict(env), uid))
        return HookAnswer(5, stdout=f"export SEEN={' '.join(argv)}\n", stderr="said\n")

    path = tmp_path / "hooks.sock"
    with HookServer(path, handler):
        yield path, seen


def test_the_client_hands_over_argv_and_the_jobs_environment_and_prints_the_answer(
    served, hook_client
):
    path, seen = served
    done = run_hook(
        hook_client, path, "epilog", "--all-nodes", SLURM_JOB_ID="17", GPUALLOC_NVLINK="1",
        HOME="/root",
    )  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (
        5,
        "export SEEN=epilog --all-nodes\n",
        "said\n",
    )
    ((argv, env, uid),) = seen
    assert argv == ["epilog", "--all-nodes"]
    # the job's SLURM_* (and the NVLink flag) only, never the rest
    assert env == {"SLURM_JOB_ID": "17", "GPUALLOC_NVLINK": "1"}
    assert uid == os.getuid()  # from the socket's peer credentials, not from the request


def test_the_socket_is_for_every_job_user(served):
    path, _ = served
    assert path.stat().st_mode & 0o777 == 0o666  # the handler decides who may do what


def test_without_a_service_the_client_runs_the_command_itself(tmp_path, hook_client):
    done = run_hook(
        hook_client, tmp_path / "nobody-listens.sock", "prolog", "--job-id=3",
        GPUALLOC_SLURM_CLI="/bin/echo",
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "prolog --job-id=3\n")


def test_without_a_service_or_command_the_hook_fails_and_says_why(tmp_path, hook_client):
    done = run_hook(
        hook_client, tmp_path / "none.sock", "prolog", GPUALLOC_SLURM_CLI="/nonexistent/cli"
    )
    assert done.returncode == 3 and "does not answer" in done.stderr, done


# --- the compiled client in slurm.conf's slots: the hook by the link's name --------------------


def slot(tmp_path: Path, name: str, settings: str | None = None) -> Path:
    """A link `name` to the compiled client, as slurm.conf's slots name it, beside a
    gpualloc-hook.conf holding `settings` (none: no file)."""
    directory = tmp_path / "gpualloc"
    directory.mkdir(exist_ok=True)
    link = directory / name
    link.symlink_to(peer("gpualloc-hook"))
    if settings is not None:
        (directory / "gpualloc-hook.conf").write_text(settings)
    return link


def run_slot(link: Path, **environ: str) -> subprocess.CompletedProcess[str]:
    """As Slurm runs a hook: its path alone, no argument, an environment of Slurm's."""
    return subprocess.run(
        [str(link)], env={"PATH": "/usr/bin:/bin", **environ}, capture_output=True, text=True,
        timeout=30, check=False,
    )  # fmt: skip


JOBCOMP = {"JOBID": "7", "JOBNAME": "train", "NODES": "h100-node-[1-2]", "USERNAME": "alice",
           "CLUSTER": "c1"}  # fmt: skip
"""jobcomp/script's variables (slurmctld's own names)."""


@pytest.mark.parametrize(
    ("name", "environ", "argv", "job_env", "code"),
    [
        pytest.param("prolog-slurmctld", {"SLURM_JOB_ID": "7"}, ["prolog"],
                     {"SLURM_JOB_ID": "7"}, 5, id="prolog-slurmctld"),
        pytest.param("taskprolog", {"SLURM_JOB_ID": "7", "SLURM_STEP_GPUS": "0"},
                     ["task-prolog"], {"SLURM_JOB_ID": "7", "SLURM_STEP_GPUS": "0"}, 5,
                     id="taskprolog"),
        pytest.param("epilog", {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": NODE},
                     ["epilog", "--ignore-errors"], {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": NODE},
                     0, id="node-epilog-exits-0-whatever-the-answer"),
        pytest.param("epilog-slurmctld", {"SLURM_JOB_ID": "7"},
                     ["epilog", "--all-nodes", "--sweep"], {"SLURM_JOB_ID": "7"}, 5,
                     id="epilog-slurmctld"),
        pytest.param("jobcomp", JOBCOMP, ["epilog", "--all-nodes", "--sweep"],
                     {"SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "train",
                      "SLURM_JOB_NODELIST": "h100-node-[1-2]", "SLURM_CLUSTER_NAME": "c1"}, 5,
                     id="jobcomp-variables-as-an-epilogs"),
    ],
)  # fmt: skip
def test_a_slot_is_the_hook_its_link_names(served, tmp_path, name, environ, argv, job_env, code):
    path, seen = served
    # the settings file names the socket, and wins over the hook's environment
    link = slot(tmp_path, name, f"# the site's\nGPUALLOC_SLURM_SOCKET={path}\n")
    done = run_slot(link, GPUALLOC_SLURM_SOCKET="/nonexistent.sock", **environ)
    assert (done.returncode, done.stderr) == (code, "said\n"), done
    assert seen == [(argv, job_env, os.getuid())]


@pytest.mark.parametrize(
    ("name", "environ"),
    [
        pytest.param("prolog-slurmctld", {"SLURM_JOB_NAME": "gpualloc-held", "SLURM_JOB_UID": "0"},
                     id="prolog"),
        pytest.param("taskprolog", {"SLURM_JOB_NAME": "gpualloc-held", "SLURM_JOB_UID": "0"},
                     id="taskprolog"),
        pytest.param("epilog", {"SLURM_JOB_NAME": "gpualloc-held", "SLURM_JOB_UID": "0"},
                     id="epilog"),
        pytest.param("jobcomp", {**JOBCOMP, "JOBNAME": "gpualloc-held", "USERNAME": "root"},
                     id="jobcomp"),
    ],
)  # fmt: skip
def test_syncs_holder_jobs_pass_without_asking(served, tmp_path, name, environ):
    path, seen = served
    link = slot(tmp_path, name, f"GPUALLOC_SLURM_SOCKET={path}\n")
    assert run_slot(link, **environ).returncode == 0
    assert seen == []
    # the same name by another user is an ordinary job
    other = {**environ, "SLURM_JOB_UID": "1000", "USERNAME": "alice"}
    run_slot(link, **other)
    assert len(seen) == 1


def test_without_a_service_a_slot_runs_the_command_with_the_sites_settings(tmp_path):
    command = tmp_path / "cli.sh"
    command.write_text('#!/bin/sh\necho "$GPUALLOC_ALLOCATOR_ADDR $SLURM_CONF $*"\nexit 4\n')
    command.chmod(0o755)
    settings = (
        f"GPUALLOC_SLURM_SOCKET={tmp_path}/none.sock\nGPUALLOC_SLURM_CLI={command}\n"
        "GPUALLOC_ALLOCATOR_ADDR=gpualloc.test:50051\nSLURM_CONF=/etc/slurm/slurm.conf\n"
    )
    done = run_slot(slot(tmp_path, "taskprolog", settings), SLURM_JOB_ID="7")
    assert (done.returncode, done.stdout) == (4, "gpualloc.test:50051 /etc/slurm/slurm.conf "
                                              "task-prolog\n")  # fmt: skip


@pytest.mark.parametrize(
    ("command", "prolog_code"),
    [
        pytest.param("/bin/false", 1, id="the-command-fails"),
        pytest.param("/nonexistent/gpualloc-slurm", 3, id="no-command"),
    ],
)
def test_the_node_epilog_exits_0_whatever_happens(tmp_path, command, prolog_code):
    # Slurm drains a node whose Epilog fails; the PrologSlurmctld's failure requeues the job
    settings = f"GPUALLOC_SLURM_SOCKET={tmp_path}/none.sock\nGPUALLOC_SLURM_CLI={command}\n"
    epilog = run_slot(slot(tmp_path, "epilog", settings), SLURM_JOB_ID="7")
    assert epilog.returncode == 0 and command in epilog.stderr, epilog
    prolog = run_slot(slot(tmp_path, "prolog-slurmctld"), SLURM_JOB_ID="7")
    assert prolog.returncode == prolog_code, prolog


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b'{"argv": ["prolog"], "env": {}}', id="json-not-the-protocol"),
        pytest.param(b"gpualloc-hook 1\nprolog", id="no-nul"),
        pytest.param(b"gpualloc-hook 1\nprolog\0", id="no-separator"),
        pytest.param(b"gpualloc-hook 1\nprolog\0\0NOEQUALS\0", id="env-not-name-value"),
        pytest.param(b"gpualloc-hook 1\n\xff\0\0", id="not-utf-8"),
    ],
)
def test_a_bad_request_is_answered_and_never_reaches_the_handler(served, request_bytes):
    path, seen = served
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        sock.sendall(request_bytes)
        sock.shutdown(socket.SHUT_WR)
        code, _, err = sock.makefile("rb").read().decode().split("\0", 2)
    assert code == "2" and "bad hook request" in err
    assert seen == []


def test_a_prolog_waits_for_the_releases_queued_before_it():
    done: list[str] = []
    gate = threading.Event()

    def release(batch: Sequence[str]) -> None:
        gate.wait(5)
        done.extend(batch)

    releases = Releases(release)
    try:
        releases.submit("job-1")
        releases.submit("job-2")
        assert not releases.wait_for_queued(0.1)  # still being released
        gate.set()
        assert releases.wait_for_queued(5)
        assert done == ["job-1", "job-2"]  # in arrival order
    finally:
        releases.close()


def test_what_follows_the_releases_holds_no_prolog_up():
    # the epilogs' sweep lists every reservation and asks squeue: no prolog waits for it
    gate, swept = threading.Event(), threading.Event()

    def then(batch: Sequence[str]) -> None:
        gate.wait(5)
        swept.set()

    releases = Releases(lambda batch: None, then=then)
    try:
        releases.submit("job-1")
        assert releases.wait_for_queued(5) and not swept.is_set()
        gate.set()
        assert swept.wait(5)
    finally:
        releases.close()


def test_a_release_that_raises_does_not_stop_the_queue():
    done: list[str] = []

    def release(batch: Sequence[str]) -> None:
        if "bad" in batch:
            raise RuntimeError("a bug")
        done.extend(batch)

    releases = Releases(release)
    try:
        releases.submit("bad")
        assert releases.wait_for_queued(5)
        releases.submit("good")
        assert releases.wait_for_queued(5)
        assert done == ["good"]
    finally:
        releases.close()


# --- a finished job's release vs the next job's reservation ---------------------------------


@pytest.fixture(scope="module")
def gpualloc() -> Iterator[str]:
    with local_cluster.start() as started:
        yield started.target


@pytest.fixture
def client(gpualloc: str) -> Iterator[AllocatorClient]:
    release_everything(gpualloc)
    with AllocatorClient(gpualloc) as opened:
        yield opened
    release_everything(gpualloc)


def reserve_for_job(
    client: AllocatorClient, job_id: str, count: int = 8, cluster: str = CLUSTER
) -> Reservation:
    owner = f"slurm/job/{job_id}"
    placement = client.allocate(
        [build_claim(f"job-{job_id}", [RequestSpec("gpus", count)])],
        node_name=NODE,
        reserve=True,
        owner=owner,
        idempotency_key=f"slurm-{job_id}-{NODE}",
        labels={"slurm.job_id": job_id, "slurm.node": NODE, "slurm.cluster": cluster},
        lease_ttl_seconds=600,
    )
    assert placement.fits
    (reservation,) = placement.reservations
    return reservation


def test_the_sweep_asks_slurm_after_listing_so_a_job_started_meanwhile_keeps_its_gpus(client):
    # job 77 ended (slurmctld lists it no more); job 78 starts between the sweep's List and its
    # squeue. Asked before the List (as the sweep did), Slurm would not list 78 yet and the
    # sweep would release the GPUs a running job just reserved.
    ended = reserve_for_job(client, "77", count=4)

    def squeue() -> dict[str, str]:
        reserve_for_job(client, "78", count=4)  # its prolog, while squeue runs
        return {"78": "RUNNING"}

    assert sweep(client, CLUSTER, squeue) == [ended.id]
    assert [r.owner for r in client.list()] == ["slurm/job/78"]


def refused_for(client: AllocatorClient, job_id: str) -> Placement:
    """The next job's reservation of the node's 8 GPUs (Slurm's pick), refused: who holds them."""
    with InventoryClient(client.target) as inventory:
        placement = Placer(client, inventory).allocate(
            [build_claim(f"job-{job_id}", [RequestSpec("gpus", 8)])],
            owner=f"slurm/job/{job_id}",
            idempotency_key=f"slurm-{job_id}-{NODE}",
            node_name=NODE,
        )
    assert not placement.fits and placement.holders
    return placement


@pytest.mark.parametrize(
    ("state", "cluster", "released"),
    [
        pytest.param("COMPLETING", CLUSTER, True, id="completing-its-epilog-not-done-released"),
        pytest.param(None, CLUSTER, True, id="no-longer-listed-released"),
        pytest.param("COMPLETED", CLUSTER, True, id="completed-released"),
        pytest.param("PENDING", CLUSTER, True, id="requeued-pending-released"),
        pytest.param("RUNNING", CLUSTER, False, id="running-kept-a-real-conflict"),
        pytest.param("COMPLETING", "c2", False, id="another-clusters-job-kept"),
    ],
)
def test_a_prolog_frees_what_a_job_that_no_longer_runs_still_holds(
    client, state, cluster, released
):
    held = reserve_for_job(client, "90", cluster=cluster)
    refused = refused_for(client, "91")
    live = {"91": "CONFIGURING"} | ({"90": state} if state else {})
    got = release_ended_holders(client, refused, CLUSTER, live, keep="91")
    assert got == ([held.id] if released else [])
    assert [r.id for r in client.list()] == ([] if released else [held.id])


def test_a_holder_that_is_not_a_slurm_job_is_never_released(client):
    placement = client.allocate(
        [build_claim("train", [RequestSpec("gpus", 8)], namespace="team-a")],
        node_name=NODE,
        reserve=True,
        owner="kueue/team-a/train",
        idempotency_key="train",
    )
    assert placement.fits
    refused = refused_for(client, "92")
    assert release_ended_holders(client, refused, CLUSTER, {}, keep="92") == []
    assert [r.owner for r in client.list()] == ["kueue/team-a/train"]


def test_a_served_hook_starts_no_gpualloc_command(served, hook_client, tmp_path):
    # the whole point: no start of gpualloc's Python (0.6-0.8 s) per hook; what a hook costs
    # is measured by `make bench ARGS=slurm` (docs/bridges.md), not timed here
    path, seen = served
    started = tmp_path / "command-started"
    command = tmp_path / "gpualloc-slurm"
    command.write_text(f"#!/bin/sh\ntouch {started}\nexit 1\n")
    command.chmod(0o755)
    for _ in range(5):
        done = run_hook(hook_client, path, "task-prolog", GPUALLOC_SLURM_CLI=str(command))
        assert done.returncode == 5, done
    assert len(seen) == 5 and not started.exists()


def test_an_answer_that_is_not_the_protocol_fails_the_hook(tmp_path, hook_client):
    path = tmp_path / "odd.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen()

        def answer_badly() -> None:
            conn, _ = listener.accept()
            with conn:
                while conn.recv(65536):
                    pass
                conn.sendall(b"not a status")

        serving = threading.Thread(target=answer_badly)
        serving.start()
        done = run_hook(hook_client, path, "prolog")
        serving.join()
    assert done.returncode == 3 and "no answer" in done.stderr, done
