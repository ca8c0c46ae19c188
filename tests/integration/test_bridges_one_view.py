"""One view, proven: Slurm prologs and the Kueue admission controller take GPUs from one
allocator at the same time, on NVLink and MIG nodes, and nothing is ever held twice."""

from __future__ import annotations

import copy
import io
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from services.bridges import demo, local_cluster
from services.bridges.audit import audit
from services.bridges.kueue.controller import AdmissionController
from services.bridges.kueue.memory_api import KueueStandIn, MemoryKueueApi, workload_for_job
from services.bridges.kueue.objects import CheckState, Workload
from services.bridges.placing import Placer
from services.bridges.slurm import cli
from services.client import AllocatorClient, InventoryClient, claim_from_spec
from tests.unit.bridges.support import ROOT, documents, release_everything

EXAMPLES = ROOT / "examples" / "bridges" / "kueue"


@pytest.fixture(scope="module")
def cluster() -> Iterator[local_cluster.LocalCluster]:
    with local_cluster.start() as started:
        yield started


def slurm_prolog(target: str, job: str, node: str, gres: str) -> int:
    env = {"GPUALLOC_ALLOCATOR_ADDR": target, "SLURM_JOB_ID": job, "SLURMD_NODENAME": node,
           "SLURM_JOB_GRES": gres}  # fmt: skip
    return cli.main(["prolog"], env, io.StringIO(), io.StringIO())


def kueue_workloads(api: MemoryKueueApi, count: int) -> list[str]:
    for path in (ROOT / "deploy" / "k8s" / "kueue" / "admission-check.yaml",
                 EXAMPLES / "cluster-queue.yml"):  # fmt: skip
        for document in documents(path):
            api.apply(document)
    names = []
    (nvlink_job,) = documents(EXAMPLES / "h100-nvlink-job.yml")
    (mig_job,) = documents(EXAMPLES / "mig-inference-job.yml")
    for i in range(count):
        job = copy.deepcopy(nvlink_job if i % 2 == 0 else mig_job)
        job["metadata"]["name"] = f"{job['metadata']['name']}-{i}"
        names.append(api.apply(workload_for_job(job))["metadata"]["name"])
    return names


def test_slurm_and_kueue_never_hold_a_device_twice(cluster):
    api = MemoryKueueApi()
    names = kueue_workloads(api, 6)  # 3 x (4 NVLink H100) and 3 x (3 MIG 1g.10gb)
    slurm_jobs = [
        *((str(100 + i), f"h100-node-{1 + i % 2}", "gpu:h100:2") for i in range(6)),
        *((str(200 + i), "a100-node-1", "gpu:a100_3g.20gb:1") for i in range(4)),
    ]  # 12 H100s and 4 x 3g.20gb from Slurm, 12 H100s and 9 x 1g.10gb from Kueue
    stop = threading.Event()
    findings: list[list[str]] = []
    with (
        AllocatorClient(cluster.target, owner="test") as client,
        InventoryClient(cluster.target) as inventory,
    ):
        controller = AdmissionController(api, Placer(client, inventory), lease_ttl_seconds=30)
        kueue = KueueStandIn(api)

        def play_kueue() -> None:
            while not stop.wait(0.02):
                kueue.step()

        def watch() -> None:  # the invariant, checked again and again while both run
            nodes = inventory.nodes()
            while not stop.wait(0.02):
                report = audit(client.list(), nodes)
                if not report.clean:
                    findings.append(report.lines())

        threads = [
            threading.Thread(target=controller.run, args=(stop, 0.05)),
            threading.Thread(target=play_kueue),
            threading.Thread(target=watch),
        ]
        for thread in threads:
            thread.start()
        try:
            with ThreadPoolExecutor(4) as pool:
                codes = list(pool.map(lambda j: slurm_prolog(cluster.target, *j), slurm_jobs))
            time.sleep(1.0)  # let Kueue's retries settle
        finally:
            stop.set()
            for thread in threads:
                thread.join()

        assert findings == []
        assert set(codes) <= {0, cli.EXIT_UNPLACEABLE}
        held = client.list()
        report = audit(held, inventory.nodes())
        assert report.clean, report.lines()
        h100 = [d for r in held for d in r.devices if d.pool.startswith("h100")]
        assert len(h100) == len(set(h100)) <= 16
        admitted = [
            n for n in names if Workload.from_dict(api.get("Workload", "team-a", n)).admitted
        ]
        for name in admitted:  # every admitted Workload holds its devices where its pods go
            (reservation,) = client.list(owner=f"kueue/team-a/{name}")
            check = Workload.from_dict(api.get("Workload", "team-a", name)).check("gpualloc")
            assert check is not None and check.state is CheckState.READY
            (update,) = check.pod_set_updates
            assert update.node_selector["kubernetes.io/hostname"] == reservation.node_name
        owners = {r.owner.split("/")[0] for r in held}
        assert owners == {"slurm", "kueue"}

        # Explain, asked for every whole GPU of a node where something is held, names every
        # holder there: of GPUs (in use) and of MIG slices (their counters)
        whole = {n.name: sum(d.type == "gpu" for d in n.devices) for n in inventory.nodes()}
        for node in sorted({r.node_name for r in held}):
            claim = claim_from_spec(f"{whole[node]} x gpu", name="all")
            explained = client.explain([claim], node_name=node)
            owners_there = {r.owner for r in held if r.node_name == node}
            assert {h.owner for h in explained.holders} == owners_there, explained.reason()
    release_everything(cluster.target)


def test_make_demo_passes():
    out = io.StringIO()
    assert demo.main([], out) == 0, out.getvalue()
    text = out.getvalue()
    assert "no device or counter is held twice" in text
    assert "held: slurm/job/101" in text and "kueue/team-a/" in text
    assert text.rstrip().endswith("DEMO PASSED")
