"""Both bridges start a job only on bound devices (DRA binding conditions): a real gpualloc
(inventory + allocator on a free port, examples/cluster plus a fabric pool of composable GPUs
with binding conditions, reachable from node composable-1), the node's agent reporting device
conditions while the bridge waits (docs/bridges.md, "Binding conditions").
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.bridges import local_cluster
from services.bridges.kueue.controller import AdmissionController
from services.bridges.kueue.memory_api import KueueStandIn, MemoryKueueApi, workload_for_job
from services.bridges.kueue.objects import CheckState, Workload
from services.bridges.placing import Placer
from services.bridges.slurm import cli as slurm_cli
from services.client import AllocatorClient, InventoryClient, ReservationState
from services.client.results import Reservation
from services.common.dra.model import DeviceID
from tests.fabric import ATTACHED, FAILED, fabric_manifest
from tests.unit.bridges.support import ROOT, documents, release_everything

PRODUCT = "Composable B200"
FABRIC = fabric_manifest(product=PRODUCT)
JOB = f"""\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{namespace: team-a, name: composable}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
          selectors:
          - cel: {{expression: "device.attributes['gpu.nvidia.com'].productName == '{PRODUCT}'"}}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: composed
  namespace: team-a
  labels: {{kueue.x-k8s.io/queue-name: gpu-queue}}
spec:
  template:
    spec:
      containers:
      - name: main
        image: registry.k8s.io/e2e-test-images/agnhost:2.53
        resources:
          claims: [{{name: gpu}}]
      resourceClaims:
      - {{name: gpu, resourceClaimTemplateName: composable}}
      restartPolicy: Never
"""
FABRIC_GPU = DeviceID("gpu.nvidia.com", "fabric", "gpu-0")


def wait_until(condition: Callable[[], bool], timeout: float) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_cluster.LocalCluster]:
    fabric = tmp_path_factory.mktemp("fabric")
    (fabric / "fabric.yaml").write_text(FABRIC)
    with local_cluster.start((local_cluster.EXAMPLE_CLUSTER, fabric)) as started:
        yield started


@pytest.fixture
def client(cluster: local_cluster.LocalCluster) -> Iterator[AllocatorClient]:
    with AllocatorClient(cluster.target, owner="agent") as made:
        yield made
    release_everything(cluster.target)


def binding_reservation(client: AllocatorClient, owner: str) -> Reservation:
    """The owner's reservation that binds (the node's; the fabric pool's never waits)."""
    for reservation in client.list(owner=owner):
        if reservation.binding:
            return reservation
    raise AssertionError(f"no binding reservation of {owner}")


def report(client: AllocatorClient, reservation: Reservation, condition: str) -> str:
    _, released = client.report_device_conditions(reservation, [(FABRIC_GPU, condition, True)])
    return released


# --- Slurm: the prolog returns (the job starts) once bound ------------------------------------


def prolog(target: str, job: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    environ = {
        "GPUALLOC_ALLOCATOR_ADDR": target,
        "SLURM_JOB_ID": job,
        "SLURMD_NODENAME": "composable-1",
        "SLURM_JOB_GRES": "gpu:1",
        "GPUALLOC_SLURM_LEASE": "0",
    }
    code = slurm_cli.main(["prolog"], environ, out, err)
    return code, out.getvalue(), err.getvalue()


def in_thread(call: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    answer: list[Any] = []
    thread = threading.Thread(target=lambda: answer.append(call(*args)), daemon=True)
    thread.start()
    return thread, answer


@pytest.mark.parametrize(
    ("condition", "exit_ok", "state"),
    [
        pytest.param(ATTACHED, True, ReservationState.COMMITTED, id="bound-the-job-starts"),
        pytest.param(FAILED, False, None, id="failed-the-prolog-fails-nothing-held"),
    ],
)
def test_the_slurm_prolog_waits_for_the_binding(
    cluster: local_cluster.LocalCluster,
    client: AllocatorClient,
    condition: str,
    exit_ok: bool,
    state: ReservationState | None,
) -> None:
    job = "slurm-bind-1" if exit_ok else "slurm-bind-2"
    owner = f"slurm/job/{job}"
    thread, answer = in_thread(prolog, cluster.target, job)
    wait_until(lambda: any(r.binding for r in client.list(owner=owner)), timeout=30)
    assert thread.is_alive()  # not started: its GPU is not attached yet

    report(client, binding_reservation(client, owner), condition)
    thread.join(timeout=30)

    [(code, out, err)] = answer
    assert (code == 0) is exit_ok, err
    held = client.list(owner=owner)
    if state is None:
        assert held == [] and "binding failed" in err
    else:
        assert {r.state for r in held} == {state}
        assert "gpu-0" in out


# --- Kueue: Ready (and so admitted) only once bound -------------------------------------------


class Kueue:
    def __init__(self, target: str, inventory: InventoryClient, client: AllocatorClient) -> None:
        self.api = MemoryKueueApi()
        self.kueue = KueueStandIn(self.api)
        self.controller = AdmissionController(
            self.api, Placer(client, inventory), lease_ttl_seconds=30
        )
        examples = ROOT / "examples" / "bridges" / "kueue"
        check = ROOT / "deploy" / "k8s" / "kueue" / "admission-check.yaml"
        for path in (check, examples / "cluster-queue.yml"):
            for document in documents(path):
                self.api.apply(document)

    def submit(self, path: Path) -> str:
        name = ""
        for document in documents(path):
            if document["kind"] == "Job":
                name = self.api.apply(workload_for_job(document))["metadata"]["name"]
            else:
                self.api.apply(document)
        return name

    def cycle(self, times: int = 3) -> None:
        for _ in range(times):
            self.kueue.step()
            self.controller.reconcile_all()

    def workload(self, name: str) -> Workload:
        return Workload.from_dict(self.api.get("Workload", "team-a", name))


@pytest.mark.parametrize(
    ("condition", "after"),
    [
        pytest.param(ATTACHED, CheckState.READY, id="bound-admitted"),
        pytest.param(FAILED, CheckState.PENDING, id="failed-placed-again-not-admitted"),
    ],
)
def test_kueue_admits_only_once_bound(
    cluster: local_cluster.LocalCluster,
    client: AllocatorClient,
    tmp_path: Path,
    condition: str,
    after: CheckState,
) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    with InventoryClient(cluster.target) as inventory:
        kueue = Kueue(cluster.target, inventory, client)
        name = kueue.submit(tmp_path / "job.yaml")
        kueue.cycle()
        workload = kueue.workload(name)
        check = workload.check("gpualloc")
        assert check is not None and check.state is CheckState.PENDING, check
        assert "waiting for the binding of" in check.message
        assert not workload.admitted
        owner = f"kueue/team-a/{name}"

        first = binding_reservation(client, owner)
        report(client, first, condition)
        kueue.cycle()

        workload = kueue.workload(name)
        check = workload.check("gpualloc")
        assert check is not None and check.state is after, check
        if after is CheckState.READY:
            kueue.cycle()
            assert kueue.workload(name).admitted
            assert {r.state for r in client.list(owner=owner)} == {ReservationState.COMMITTED}
        else:  # released: the next pass placed it anew, and waits again (it never started)
            assert "waiting for the binding of" in check.message
            assert binding_reservation(client, owner).id != first.id
            assert not kueue.workload(name).admitted
