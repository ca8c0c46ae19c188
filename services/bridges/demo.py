"""`make demo`: Slurm and Kueue share one GPU view through gpualloc, at the same time.

    python -m services.bridges.demo                  # its own gpualloc on a free port
    python -m services.bridges.demo --target HOST:PORT   # a running `gpualloc serve --demo`

On the example cluster (two 8 x H100 NVLink nodes, an A100 node with MIG, an L40S node):

1. the Slurm bridge writes gres.conf for an H100 node from the inventory;
2. concurrently, Slurm prologs (`gpualloc-slurm prolog`, as slurmd would run them) reserve
   GPUs for four jobs, while the Kueue admission controller admits Workloads made from the
   Jobs in examples/bridges/kueue (a stand-in plays Kueue's own part: no API server here);
3. the audit checks that no device and no MIG counter is held twice, and lists who holds what;
4. a Slurm job that no longer fits is refused with Explain's reason, naming the holders
   (`slurm/job/<id>`, `kueue/<namespace>/<workload>`);
5. epilogs and finished Workloads give everything back; the audit shows an empty cluster.

Exit status 0 when every check held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import io
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

import yaml

from services.bridges import local_cluster
from services.bridges.audit import audit
from services.bridges.kueue.controller import AdmissionController
from services.bridges.kueue.memory_api import KueueStandIn, MemoryKueueApi, workload_for_job
from services.bridges.placing import Placer
from services.bridges.slurm import cli as slurm_cli
from services.bridges.slurm.gresconf import render_gres_conf
from services.client.client import AllocatorClient
from services.client.inventory import InventoryClient
from services.client.specs import claim_from_spec

__all__ = ["SLURM_JOBS", "main"]

_ROOT = Path(__file__).resolve().parents[2]
KUEUE_EXAMPLES = _ROOT / "examples" / "bridges" / "kueue"
ADMISSION_CHECK = _ROOT / "deploy" / "k8s" / "kueue" / "admission-check.yaml"

SLURM_JOBS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("101", "h100-node-1", {"SLURM_JOB_GRES": "gpu:h100:4", "SLURM_JOB_CONSTRAINTS": "nvlink"}),
    ("102", "h100-node-2", {"SLURM_GPUS_PER_NODE": "h100:2"}),
    ("103", "a100-node-1", {"SLURM_JOB_GRES": "gpu:a100_3g.20gb:1"}),
    ("104", "l40s-node-1", {"SLURM_JOB_GPUS": "0,1"}),
)
"""(job id, node, request environment): what slurmd's Prolog would see for four jobs."""


def _slurm(
    command: str, job: str, node: str, extra: dict[str, str], target: str
) -> tuple[int, str]:
    env = {"SLURM_JOB_ID": job, "SLURMD_NODENAME": node, "GPUALLOC_ALLOCATOR_ADDR": target, **extra}
    out, err = io.StringIO(), io.StringIO()
    code = slurm_cli.main([command], env, out, err)
    return code, (out.getvalue() + err.getvalue()).strip()


def _kueue_objects(api: MemoryKueueApi) -> list[str]:
    """Our AdmissionCheck, the example ClusterQueue, and a Workload per example Job."""
    names = []
    for path in [ADMISSION_CHECK, *sorted(KUEUE_EXAMPLES.glob("*.yml"))]:
        for document in yaml.safe_load_all(path.read_text()):
            if document["kind"] == "Job":
                names.append(api.apply(workload_for_job(document))["metadata"]["name"])
            else:
                api.apply(document)
    return names


@contextmanager
def _kueue_running(api: MemoryKueueApi, controller: AdmissionController) -> Iterator[None]:
    """The controller and the Kueue stand-in, each in its own thread."""
    stop = threading.Event()
    kueue = KueueStandIn(api)

    def play_kueue() -> None:
        while not stop.wait(0.05):
            kueue.step()

    threads = [
        threading.Thread(target=controller.run, args=(stop, 0.1), name="kueue-admission"),
        threading.Thread(target=play_kueue, name="kueue-stand-in"),
    ]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def _settled(api: MemoryKueueApi, names: Sequence[str], timeout: float = 20.0) -> dict[str, str]:
    """Each Workload's outcome once it is admitted or rejected: `admitted`/`rejected`."""
    deadline = time.monotonic() + timeout
    outcome: dict[str, str] = {}
    while time.monotonic() < deadline and len(outcome) < len(names):
        for workload in api.list_workloads():
            name = workload["metadata"]["name"]
            status = workload.get("status", {})
            admitted = any(
                c["type"] == "Admitted" and c["status"] == "True"
                for c in status.get("conditions", [])
            )
            rejected = any(c.get("state") == "Rejected" for c in status.get("admissionChecks", []))
            if admitted or rejected:
                outcome[name] = "admitted" if admitted else "rejected"
        time.sleep(0.05)
    return outcome


def run(target: str, out: TextIO) -> bool:
    ok = True

    def say(text: str = "") -> None:
        print(text, file=out)

    with (
        AllocatorClient(target, owner="demo") as client,
        InventoryClient(target) as inventory,
    ):
        say("== 1. gres.conf for h100-node-1, from the inventory (gpualloc-slurm gres-conf)")
        node = inventory.node("h100-node-1")
        say(render_gres_conf(node).rstrip() if node else "(no such node)")

        say("\n== 2. Slurm prologs and Kueue admission, at the same time")
        api = MemoryKueueApi()
        names = _kueue_objects(api)
        controller = AdmissionController(api, Placer(client, inventory), lease_ttl_seconds=30)
        with _kueue_running(api, controller), ThreadPoolExecutor(4) as pool:
            prologs = [
                (job, node_name, pool.submit(_slurm, "prolog", job, node_name, extra, target))
                for job, node_name, extra in SLURM_JOBS
            ]
            outcome = _settled(api, names)
            for job, node_name, future in prologs:
                code, text = future.result()
                ok &= code == 0
                cuda = next((x for x in text.splitlines() if "CUDA_VISIBLE_DEVICES" in x), "")
                say(f"slurm job {job} on {node_name}: exit {code} {cuda}")
            for name in names:
                say(f"kueue workload team-a/{name}: {outcome.get(name, 'pending')}")
            ok &= sum(1 for v in outcome.values() if v == "admitted") == len(names) - 1
            ok &= list(outcome.values()).count("rejected") == 1

            say("\n== 3. Audit: every reservation against the inventory")
            report = audit(client.list(), inventory.nodes())
            for line in report.lines():
                say(line)
            for reservation in client.list():
                devices = ", ".join(d.device for d in reservation.devices)
                say(f"  {reservation.owner:<40} {reservation.node_name:<12} {devices}")
            ok &= report.clean

            say("\n== 4. A Slurm job that no longer fits: Explain names the holders")
            code, text = _slurm(
                "prolog", "105", "h100-node-1", {"SLURM_JOB_GRES": "gpu:h100:8"}, target
            )
            say(f"slurm job 105 on h100-node-1: exit {code}")
            say("\n".join(f"  {line}" for line in text.splitlines()[:12]))
            ok &= code == slurm_cli.EXIT_UNPLACEABLE
            ok &= "slurm/job/101" in text  # job 105's node: 101 holds half of it
            explained = client.explain([claim_from_spec("8 x h100", name="whole-node")])
            say("who holds the H100s:")
            for holder in explained.holders:
                say(f"  {holder}")
            # Kueue's 4-H100 Workload lands on either H100 node (it is placed while the Slurm
            # prologs run): the fleet-wide Explain names it wherever it is
            ok &= any("kueue/" in str(holder) for holder in explained.holders)

            say("\n== 5. Jobs end: Slurm epilogs, Kueue Workloads finish")
            for job, node_name, _ in SLURM_JOBS:
                _slurm("epilog", job, node_name, {}, target)
            stand_in = KueueStandIn(api)
            for name in names:
                stand_in.finish("team-a", name)
            deadline = time.monotonic() + 10
            while client.list() and time.monotonic() < deadline:
                time.sleep(0.05)
        final = audit(client.list(), inventory.nodes())
        for line in final.lines():
            say(line)
        ok &= final.reservations == 0 and final.clean
    say("\nDEMO " + ("PASSED" if ok else "FAILED"))
    return ok


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpualloc-demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--target", help="a running gpualloc (default: start one here)")
    args = parser.parse_args(argv)
    stream = out or sys.stdout
    if args.target:
        return 0 if run(args.target, stream) else 1
    with local_cluster.start() as cluster:
        print(f"gpualloc (inventory + allocator) on {cluster.target}, example cluster", file=stream)
        return 0 if run(cluster.target, stream) else 1


if __name__ == "__main__":
    sys.exit(main())
