"""`gpualloc-slurm` end to end: prologs, task prologs, epilogs and gres.conf against a real
gpualloc (inventory + allocator on a free port, examples/cluster with its NVLink topology),
with the environment slurmd gives its Prolog/TaskProlog/Epilog."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from services.bridges import local_cluster
from services.bridges.slurm import cli
from services.client import AllocatorClient, InventoryClient, ReservationState
from services.client.specs import DeviceChoice, RequestSpec, build_claim
from tests.unit.bridges.support import ROOT, release_everything


@pytest.fixture(scope="module")
def cluster() -> Iterator[local_cluster.LocalCluster]:
    with local_cluster.start() as started:
        yield started


@pytest.fixture
def target(cluster) -> Iterator[str]:
    yield cluster.target
    release_everything(cluster.target)


def slurm(target: str, *argv: str, **environ: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), {"GPUALLOC_ALLOCATOR_ADDR": target, **environ}, out, err)
    return code, out.getvalue(), err.getvalue()


def exports(text: str) -> dict[str, str]:
    return dict(re.findall(r"^export (\w+)=(.*)$", text, flags=re.M))


def uuids(target: str, node: str) -> dict[str, str]:
    with InventoryClient(target) as inventory:
        found = inventory.node(node)
        assert found is not None
        return {d.id.device: d.uuid or "" for d in found.devices}


LEASE = "GPUALLOC_SLURM_LEASE"


@pytest.mark.parametrize(
    ("lease", "state", "expires_in"),
    [
        pytest.param({}, ReservationState.RESERVED, 600, id="default-lease-10m"),
        pytest.param({LEASE: "90s"}, ReservationState.RESERVED, 90, id="lease-90s"),
        pytest.param({LEASE: "0"}, ReservationState.COMMITTED, None, id="lease-0-commits"),
    ],
)
def test_prolog_reserves_with_the_jobs_lease_and_exports_uuids(target, lease, state, expires_in):
    code, out, err = slurm(
        target, "prolog", SLURM_JOB_ID="17", SLURMD_NODENAME="h100-node-1",
        SLURM_JOB_GRES="gpu:h100:4", SLURM_JOB_CONSTRAINTS="nvlink", **lease,
    )  # fmt: skip
    assert code == 0, err
    env = exports(out)
    devices = [d.rsplit("/", 1)[1] for d in env["GPUALLOC_DEVICES"].split(",")]
    by_name = uuids(target, "h100-node-1")
    assert env["CUDA_VISIBLE_DEVICES"].split(",") == [by_name[d] for d in devices]
    assert len(devices) == 4
    with AllocatorClient(target) as client:
        (held,) = client.list(owner="slurm/job/17")
    assert held.state is state and held.node_name == "h100-node-1"
    if expires_in is None:
        assert held.expires_at is None
    else:
        assert held.expires_at is not None
        left = (held.expires_at - datetime.now(UTC)).total_seconds()
        assert expires_in - 30 < left <= expires_in
    assert held.idempotency_key == "slurm-17-h100-node-1"
    assert held.labels == {"slurm.job_id": "17", "slurm.node": "h100-node-1"}


def test_prolog_again_is_the_same_job(target):
    environ = {"SLURM_JOB_ID": "18", "SLURMD_NODENAME": "l40s-node-1", "SLURM_JOB_GPUS": "0,1"}
    first = slurm(target, "prolog", **environ)
    again = slurm(target, "prolog", **environ)
    task = slurm(target, "task-prolog", **environ)
    assert first[0] == again[0] == task[0] == 0
    assert exports(first[1]) == exports(again[1]) == exports(task[1])


def test_mig_type_gets_mig_devices(target):
    code, out, err = slurm(
        target, "prolog", "--gres=gpu:a100_3g.20gb:2",
        SLURM_JOB_ID="19", SLURMD_NODENAME="a100-node-1",
    )  # fmt: skip
    assert code == 0, err
    devices = exports(out)["GPUALLOC_DEVICES"].split(",")
    assert len(devices) == 2 and all("-mig-3g20gb-" in d for d in devices)
    # dynamic MIG devices have no UUID until created: reserved, but not exported
    assert exports(out)["CUDA_VISIBLE_DEVICES"] == ""
    assert "print gpualloc: no UUID yet" in out


def test_slurm_gpu_ids_are_typed_by_the_generated_gres_conf(target):
    code, out, err = slurm(
        target, "prolog", SLURM_JOB_ID="24", SLURMD_NODENAME="a100-node-1", SLURM_JOB_GPUS="2,3"
    )
    assert code == 0, err
    with AllocatorClient(target) as client:
        (held,) = client.list(owner="slurm/job/24")
    (claim,) = held.allocations
    assert {d.device for d in held.devices} <= {"gpu-0", "gpu-1", "gpu-2", "gpu-3"}
    assert len(held.devices) == 2 and claim.name == "slurm-job-24"


def test_a_job_without_gpus_needs_nothing(target):
    code, out, err = slurm(target, "prolog", SLURM_JOB_ID="20", SLURMD_NODENAME="h100-node-1")
    assert (code, out) == (0, "")
    assert "requests no GPU" in err


def test_unplaceable_job_gets_explains_reason_naming_the_holder(target):
    assert slurm(target, "prolog", SLURM_JOB_ID="21", SLURMD_NODENAME="h100-node-2",
                 SLURM_JOB_GRES="gpu:h100:6")[0] == 0  # fmt: skip
    code, out, err = slurm(
        target, "prolog", SLURM_JOB_ID="22", SLURMD_NODENAME="h100-node-2",
        SLURM_JOB_GRES="gpu:h100:4",
    )  # fmt: skip
    assert code == cli.EXIT_UNPLACEABLE and out == ""
    assert "job 22 on h100-node-2 cannot be placed" in err
    assert "held: slurm/job/21 holds gpu-0" in err
    with AllocatorClient(target) as client:
        assert client.list(owner="slurm/job/22") == []


def test_nvlink_on_a_node_without_nvlink_is_refused(target):
    code, _, err = slurm(
        target, "prolog", "--gres=gpu:l40s:2", "--constraint=nvlink",
        SLURM_JOB_ID="23", SLURMD_NODENAME="l40s-node-1",
    )  # fmt: skip
    assert code == cli.EXIT_UNPLACEABLE
    assert "l40s-node-1" in err and "NVLink" in err


def test_prolog_slurmctld_places_every_node_or_none(target):
    # two H100 nodes with 4 free GPUs each, then a job wanting 6 per node on both: all or none
    environ = {"SLURM_JOB_NODELIST": "h100-node-[1-2]", "SLURM_JOB_NUM_NODES": "2"}
    code, _, err = slurm(target, "prolog", "--gpus-per-node=h100:4", SLURM_JOB_ID="30", **environ)
    assert code == 0, err
    with AllocatorClient(target) as client:
        assert sorted(r.node_name for r in client.list(owner="slurm/job/30")) == [
            "h100-node-1", "h100-node-2"]  # fmt: skip
        slurm(target, "prolog", "--gres=gpu:h100:4", SLURM_JOB_ID="31",
              SLURMD_NODENAME="h100-node-2")  # fmt: skip
        code, _, err = slurm(target, "prolog", "--gpus-per-node=h100:4", SLURM_JOB_ID="32",
                             SLURM_JOB_NODELIST="h100-node-[1-2]")  # fmt: skip
        assert code == cli.EXIT_UNPLACEABLE
        assert client.list(owner="slurm/job/32") == []  # node 1 was released again
        code, _, err = slurm(target, "epilog", "--all-nodes", SLURM_JOB_ID="30",
                             SLURM_JOB_NODELIST="h100-node-[1-2]")  # fmt: skip
        assert code == 0 and "released 2 reservation(s)" in err
        assert client.list(owner="slurm/job/30") == []


def test_epilog_releases_and_is_idempotent(target):
    environ = {"SLURM_JOB_ID": "40", "SLURMD_NODENAME": "h100-node-1"}
    assert slurm(target, "prolog", "--gres=gpu:2", **environ)[0] == 0
    assert slurm(target, "epilog", **environ)[0] == 0
    code, _, err = slurm(target, "epilog", **environ)
    assert code == 0 and "released 0 reservation(s)" in err


def test_epilog_without_an_allocator(target):
    environ = {"SLURM_JOB_ID": "41", "SLURMD_NODENAME": "h100-node-1",
               "GPUALLOC_CLIENT_RETRIES": "1", "GPUALLOC_CLIENT_DEADLINE": "200ms"}  # fmt: skip
    assert slurm("127.0.0.1:1", "epilog", **environ)[0] == cli.EXIT_FAILED
    assert slurm("127.0.0.1:1", "epilog", "--ignore-errors", **environ)[0] == 0


def test_bad_request_is_exit_two(target):
    code, _, err = slurm(target, "prolog", "--gpus=h100:3", "--nodes=2", SLURM_JOB_ID="42",
                         SLURM_JOB_NODELIST="h100-node-[1-2]")  # fmt: skip
    assert code == cli.EXIT_INVALID and "--gpus" in err


def test_gres_conf_for_every_node(target):
    code, out, _ = slurm(target, "gres-conf", "--all")
    assert code == 0
    gres = dict(re.findall(r"#   NodeName=(\S+) Gres=(\S+)", out))
    assert gres == {"a100-node-1": "gpu:a100:4", "h100-node-1": "gpu:h100:8",
                    "h100-node-2": "gpu:h100:8", "l40s-node-1": "gpu:l40s:4"}  # fmt: skip
    assert out.count("Links=-1,18,18,18,18,18,18,18") == 2
    code, _, err = slurm(target, "gres-conf", "--node", "nowhere")
    assert code == cli.EXIT_INVALID and "nowhere" in err


def test_example_gres_conf_is_what_the_bridge_writes(target):
    code, out, _ = slurm(target, "gres-conf", "--all")
    assert code == 0
    example = ROOT / "examples" / "bridges" / "slurm" / "gres.conf"
    assert example.read_text() == out, "regenerate it with `gpualloc-slurm gres-conf --all`"
    slurm_conf = (ROOT / "examples" / "bridges" / "slurm" / "slurm.conf").read_text()
    for node, gres in re.findall(r"#   NodeName=(\S+) Gres=(\S+)", out):
        assert re.search(rf"^NodeName=\S*\s.*Gres={re.escape(gres)}", slurm_conf, re.M), node


def test_translate_needs_no_server():
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["translate", "--gres=gpu:a100_3g.20gb:1,gpu:a100:1"], {}, out, err)
    assert code == 0
    assert "deviceClassName: mig.nvidia.com" in out.getvalue()
    assert "deviceClassName: gpu.nvidia.com" in out.getvalue()


def test_runs_as_a_module(cluster):
    done = subprocess.run(
        [sys.executable, "-m", "services.bridges.slurm.cli", "--allocator", cluster.target,
         "gres-conf", "--node", "l40s-node-1"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Type=l40s File=/dev/nvidia3" in done.stdout


def devices_of(out: str) -> list[str]:
    return [d.rsplit("/", 1)[1] for d in exports(out)["GPUALLOC_DEVICES"].split(",")]


@pytest.mark.parametrize(
    ("job_gpus", "devices"),
    [
        pytest.param("0,6,7", ["gpu-0", "gpu-6", "gpu-7"], id="slurms-ids-not-the-solvers"),
        pytest.param("3", ["gpu-3"], id="one-gpu"),
        pytest.param("7,2", ["gpu-7", "gpu-2"], id="slurms-order-kept"),
    ],
)
def test_prolog_reserves_exactly_the_gpus_slurm_picked(target, job_gpus, devices):
    environ = {"SLURM_JOB_ID": "50", "SLURMD_NODENAME": "h100-node-1", "SLURM_JOB_GPUS": job_gpus}
    code, out, err = slurm(target, "prolog", **environ)
    assert code == 0, err
    assert devices_of(out) == devices
    by_name = uuids(target, "h100-node-1")
    assert exports(out)["CUDA_VISIBLE_DEVICES"].split(",") == [by_name[d] for d in devices]
    with AllocatorClient(target) as client:
        (held,) = client.list(owner="slurm/job/50")
    assert sorted(d.device for d in held.devices) == sorted(devices)


def test_a_gpu_slurm_picked_that_another_owner_holds_is_refused(target):
    with AllocatorClient(target) as client:
        # another system (Kueue, say) holds gpu-0 and gpu-1 of h100-node-1
        placed = slurm(target, "prolog", "--gres=gpu:h100:2", SLURM_JOB_ID="60",
                       SLURMD_NODENAME="h100-node-1")  # fmt: skip
        assert placed[0] == 0 and devices_of(placed[1]) == ["gpu-0", "gpu-1"]
        code, out, err = slurm(target, "prolog", SLURM_JOB_ID="61",
                               SLURMD_NODENAME="h100-node-1", SLURM_JOB_GPUS="1,2")  # fmt: skip
        assert code == cli.EXIT_UNPLACEABLE and out == ""
        assert "job 61 on h100-node-1 (Slurm's GPU ids 1,2) cannot be placed" in err
        assert "slurm/job/60" in err
        assert client.list(owner="slurm/job/61") == []


def test_an_id_beyond_the_gres_conf_is_bad_input(target):
    code, _, err = slurm(target, "prolog", SLURM_JOB_ID="62", SLURMD_NODENAME="l40s-node-1",
                         SLURM_JOB_GPUS="4")  # fmt: skip
    assert code == cli.EXIT_INVALID
    assert "Slurm's GPU id 4 on l40s-node-1" in err and "4 gres.conf GPU line(s)" in err


def test_task_prolog_exports_only_the_steps_gpus(target):
    job = {"SLURM_JOB_ID": "70", "SLURMD_NODENAME": "h100-node-1"}
    assert slurm(target, "prolog", SLURM_JOB_GPUS="2,3", **job)[0] == 0
    code, out, err = slurm(target, "task-prolog", SLURM_JOB_GPUS="2,3", SLURM_STEP_GPUS="3", **job)
    assert code == 0, err
    assert devices_of(out) == ["gpu-3"]
    assert exports(out)["CUDA_VISIBLE_DEVICES"] == uuids(target, "h100-node-1")["gpu-3"]
    code, out, _ = slurm(target, "task-prolog", SLURM_JOB_GPUS="2,3", **job)  # the batch step
    assert devices_of(out) == ["gpu-2", "gpu-3"]


@pytest.mark.parametrize(
    ("environ", "holds"),
    [
        pytest.param({"SLURM_JOB_GPUS": "0,1"}, "holds none", id="no-reservation"),
        pytest.param({"SLURM_GPUS_PER_NODE": "2"}, "holds none", id="no-reservation-no-ids"),
    ],
)
def test_task_prolog_refuses_a_gpu_job_without_a_reservation(target, environ, holds):
    code, out, err = slurm(target, "task-prolog", SLURM_JOB_ID="71",
                           SLURMD_NODENAME="h100-node-1", **environ)  # fmt: skip
    assert code == cli.EXIT_NO_RESERVATION
    assert "CUDA_VISIBLE_DEVICES" not in out
    assert out.startswith("print gpualloc-slurm: job 71") and holds in out
    assert "not running it without its GPUs" in err


def test_task_prolog_refuses_when_the_reservation_lacks_slurms_gpu(target):
    job = {"SLURM_JOB_ID": "72", "SLURMD_NODENAME": "h100-node-1"}
    assert slurm(target, "prolog", SLURM_JOB_GPUS="0", **job)[0] == 0
    code, out, _ = slurm(target, "task-prolog", SLURM_STEP_GPUS="5", SLURM_JOB_GPUS="0", **job)
    assert code == cli.EXIT_NO_RESERVATION
    assert "Slurm gave it GPU ids 5 (gpu-5) but gpualloc holds gpu-0" in out


def test_a_job_without_gpus_gets_no_gpu_variable(target):
    code, out, err = slurm(target, "task-prolog", SLURM_JOB_ID="73", SLURMD_NODENAME="h100-node-1")
    assert (code, out, err) == (0, "", "")


@pytest.mark.parametrize(
    ("gres", "node", "outcome"),
    [
        pytest.param("gpu:a10:1", "a100-node-1", "unknown GPU type 'a10'", id="a10-is-not-a100"),
        pytest.param("gpu:l4:1", "l40s-node-1", "unknown GPU type 'l4'", id="l4-is-not-l40s"),
        pytest.param("gpu:h10:4", "h100-node-1", "unknown GPU type 'h10'", id="h10-is-not-h100"),
        pytest.param("gpu:H100:1", "h100-node-1", "", id="case-does-not-matter"),
        pytest.param("gpu:l40s:1", "l40s-node-1", "", id="exact-type"),
        pytest.param("gpu:a100_1g.5gb:1", "a100-node-1", "", id="mig-type"),
        pytest.param("gpu:a100_9g.99gb:1", "a100-node-1", "unknown GPU type", id="unknown-mig"),
    ],
)
def test_gpu_types_match_exactly(target, gres, node, outcome):
    code, _, err = slurm(target, "prolog", f"--gres={gres}", SLURM_JOB_ID="74",
                         SLURMD_NODENAME=node)  # fmt: skip
    if outcome:
        assert code == cli.EXIT_INVALID and outcome in err
        assert "the known types are a100, a100_1g.10gb, " in err and ", h100, l40s" in err
    else:
        assert code == 0, err


@pytest.mark.parametrize(
    ("model", "node", "fits"),
    [
        pytest.param("a10", "a100-node-1", False, id="a10-selects-no-a100"),
        pytest.param("a100", "a100-node-1", True, id="a100-selects-a100"),
        pytest.param("l4", "l40s-node-1", False, id="l4-selects-no-l40s"),
        pytest.param("l40s", "l40s-node-1", True, id="l40s-selects-l40s"),
        pytest.param("h10", "h100-node-1", False, id="h10-selects-no-h100"),
        pytest.param("hbm3", "h100-node-1", True, id="any-whole-word-of-the-name"),
    ],
)
def test_exact_type_selector_on_the_real_allocator(target, model, node, fits):
    choice = DeviceChoice(model=model, exact_model=True)
    claim = build_claim("c", [RequestSpec("gpus", 1, (choice,))], namespace="slurm")
    with AllocatorClient(target) as client:
        assert client.allocate([claim], node_name=node).fits is fits


@pytest.mark.parametrize(
    ("command", "uid", "held"),
    [
        pytest.param("prolog", "0", 0, id="roots-holder-job-reserves-nothing"),
        pytest.param("task-prolog", "0", 0, id="roots-holder-job-task-gets-no-gpu-variable"),
        pytest.param("prolog", "1000", 1, id="same-name-by-another-user-is-an-ordinary-job"),
    ],
)
def test_syncs_holder_jobs_pass_the_prologs(target, command, uid, held):
    code, out, err = slurm(
        target, command, SLURM_JOB_ID="60", SLURMD_NODENAME="l40s-node-1", SLURM_JOB_GPUS="0",
        SLURM_JOB_NAME="gpualloc-held", SLURM_JOB_UID=uid,
    )  # fmt: skip
    assert code == 0, err
    assert ("CUDA_VISIBLE_DEVICES" in out) == bool(held)
    with AllocatorClient(target) as client:
        assert len(client.list(owner="slurm/job/60")) == held


def test_sync_refuses_an_interval_that_cannot_keep_the_lease(target):
    code, _, err = slurm(
        target, "sync", "--once", "--interval=30s",
        GPUALLOC_SLURM_LEASE="1m", SLURM_CLUSTER_NAME="c1",
    )  # fmt: skip
    assert code == 2
    assert "a pass every 30s cannot keep a 60s lease" in err and "Traceback" not in err
