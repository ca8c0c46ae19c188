"""One quota across batch systems: a Kueue workload reclaims, through the bridges, the quota its
tenant lent to a Slurm job.

Real mTLS servers under a policy where `hpc` (the Slurm bridge's tenant) and `team-c` (the Kueue
sidecar's, by its service-account token) share a cohort with 4 GPUs of nominal quota each. The
Slurm bridge's prolog takes all 8 GPUs of an H100 node for a job (4 of them borrowed from
team-c); then a Kueue Workload of team-c asking for 4 H100 GPUs runs through the admission
controller with preemption on: gpualloc revokes the Slurm job's reservation (team-c is within
its nominal quota, hpc borrows), the Workload is Ready on an H100 node, and the Slurm
job's next Commit learns who preempted it.
"""

from __future__ import annotations

import copy
import io
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from protos.common.v1 import dra_pb2
from services.bridges.kueue.controller import AdmissionController
from services.bridges.kueue.memory_api import KueueStandIn, MemoryKueueApi, workload_for_job
from services.bridges.kueue.objects import AdmissionCheckState, CheckState, Workload
from services.bridges.placing import Placer
from services.bridges.slurm import cli as slurm_cli
from services.bridges.slurm.commands import SlurmCommands, SlurmJobRow, SlurmNodeRow
from services.bridges.slurm.sync import Syncer
from services.client import AllocatorClient, InventoryClient
from services.client.config import ClientSettings
from tests.integration.test_bridges_slurm import exports
from tests.security_fixtures import SecuredFleet, policy_with, secured_fleet
from tests.unit.bridges.support import ROOT, documents

pytestmark = pytest.mark.timeout(180)

EXAMPLES = ROOT / "examples" / "bridges" / "kueue"
OUR_CHECK = ROOT / "deploy" / "k8s" / "kueue" / "admission-check.yaml"
SHARED = """\
  quota:
    resources: [{name: gpus, deviceClassNames: [gpu.nvidia.com]}]
  tenants:
  - name: team-a
  - name: team-b
  - {name: team-c, cohort: shared, quotas: [{resource: gpus, nominal: 4}]}
  - name: tools
    allowAdminAccess: true
  - {name: hpc, cohort: shared, quotas: [{resource: gpus, nominal: 4}]}
"""
JOB = {
    "SLURM_JOB_ID": "7001",
    "SLURMD_NODENAME": "h100-node-1",
    "SLURM_JOB_GRES": "gpu:h100:8",
    "SLURM_CLUSTER_NAME": "quota-test",
}


@dataclass(frozen=True)
class SlurmStandIn(SlurmCommands):
    """Slurm as `gpualloc-slurm sync` sees it: job 7001 running, no node to hold GPUs on, and
    a record of the commands sync runs. A stand-in only here: tests/slurm/test_real_slurm.py
    runs sync's requeue of a preempted job on a real slurmctld."""

    ran: list[tuple[str, ...]] = field(default_factory=list)

    def jobs(self) -> list[SlurmJobRow]:
        return [SlurmJobRow("7001", "train", "RUNNING", "alice", "h100-node-1")]

    def nodes(self) -> list[SlurmNodeRow]:
        return []

    def run(self, program: str, *argv: str) -> str:
        self.ran.append((program, *argv))
        return ""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredFleet]:
    with secured_fleet(
        tmp_path_factory.mktemp("pki-quota-bridges"), policy=policy_with(SHARED)
    ) as made:
        yield made


def slurm(fleet: SecuredFleet, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = slurm_cli.main(list(argv), {**fleet.client_environ("slurm-bridge"), **JOB}, out, err)
    return code, out.getvalue(), err.getvalue()


def kueue_settings(fleet: SecuredFleet, token_file: Path) -> ClientSettings:
    token_file.write_text(fleet.token())  # the sidecar's service-account token: team-c
    target = f"127.0.0.1:{fleet.tls_port}"
    return ClientSettings.from_env(
        {
            "GPUALLOC_ALLOCATOR_ADDR": target,
            "GPUALLOC_INVENTORY_ADDR": target,
            "GPUALLOC_CLIENT_TLS_CA": str(fleet.directory / "ca.crt"),
            "GPUALLOC_CLIENT_TOKEN_FILE": str(token_file),
        }
    )


@contextmanager
def kueue_placer(settings: ClientSettings) -> Iterator[Placer]:
    """The sidecar's allocator and inventory clients, as `gpualloc-kueue` makes them."""
    with (
        AllocatorClient(
            settings.target, tls=settings.tls, token_file=settings.token_file
        ) as client,
        InventoryClient(
            settings.inventory, tls=settings.tls, token_file=settings.token_file
        ) as inventory,
    ):
        yield Placer(client, inventory)


def kueue_with_our_check() -> MemoryKueueApi:
    """Kueue with the example ClusterQueue, whose admission check is gpualloc's."""
    api = MemoryKueueApi()
    for path in (OUR_CHECK, EXAMPLES / "cluster-queue.yml"):
        for document in documents(path):
            api.apply(document)
    return api


def test_a_kueue_workload_reclaims_quota_lent_to_a_slurm_job(
    fleet: SecuredFleet, tmp_path: Path
) -> None:
    code, out, err = slurm(fleet, "prolog")
    assert code == 0, err
    assert len(exports(out)["CUDA_VISIBLE_DEVICES"].split(",")) == 8
    bridge_settings = ClientSettings.from_env(fleet.client_environ("slurm-bridge"))
    stand_in = SlurmStandIn({})
    bridge_client = AllocatorClient(
        bridge_settings.target, tls=bridge_settings.tls, owner="slurm/job/7001"
    )
    bridge_inventory = InventoryClient(bridge_settings.inventory, tls=bridge_settings.tls)
    syncer = Syncer(bridge_client, bridge_inventory, stand_in, "quota-test", lease_seconds=600)
    assert syncer.sync_once().requeued == []  # it learns the job's reservation
    admin = allocator_pb2_grpc.AllocatorStub(fleet.channel("admin"))
    quotas = admin.QuotaStatus(pb.QuotaStatusRequest(), timeout=10).tenants
    assert {(q.tenant, q.used, q.borrowed) for q in quotas} == {
        ("hpc", "8", "4"),
        ("team-c", "0", "0"),
    }
    (job,) = admin.ListReservations(pb.ListReservationsRequest(), timeout=10).reservations
    # the bridge's sync as it runs: a pass a minute, and one at once on a preemption of its own
    stop = threading.Event()
    syncing = threading.Thread(target=syncer.run, args=(stop, 60.0), daemon=True)
    syncing.start()
    assert syncer.watching.wait(10)  # its WatchReservations stream is registered

    settings = kueue_settings(fleet, tmp_path / "token")
    api = kueue_with_our_check()
    name = ""
    for document in documents(EXAMPLES / "h100-nvlink-job.yml"):
        if document["kind"] == "Job":
            name = api.apply(workload_for_job(document))["metadata"]["name"]
    with kueue_placer(settings) as placer:
        controller = AdmissionController(api, placer, lease_ttl_seconds=60, preempt=True)
        KueueStandIn(api).step()  # Kueue reserves its own quota; the check is Pending
        controller.reconcile_all()
        preempted = time.monotonic()
        workload = Workload.from_dict(api.get("Workload", "team-a", name))
        check = workload.check("gpualloc")
        assert check is not None and check.state is CheckState.READY, check
        (update,) = check.pod_set_updates
        assert update.node_selector["kubernetes.io/hostname"].startswith("h100-node-")

    left = admin.ListReservations(pb.ListReservationsRequest(), timeout=10).reservations
    assert [r.owner.split("/")[0] for r in left] == ["team-c"]  # the Slurm job's is gone
    quotas = admin.QuotaStatus(pb.QuotaStatusRequest(), timeout=10).tenants
    assert {(q.tenant, q.used) for q in quotas} == {("hpc", "0"), ("team-c", "4")}
    bridge = allocator_pb2_grpc.AllocatorStub(fleet.channel("slurm-bridge"))
    with pytest.raises(grpc.RpcError) as caught:
        bridge.Commit(pb.CommitRequest(reservation_id=job.id, owner="slurm/job/7001"), timeout=10)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "was preempted by tenant team-c" in str(caught.value.details())  # not its owner
    # the Slurm bridge's sync, woken by the stream, finds the job's reservation revoked and
    # requeues the job at once, not at its next pass a minute later
    while ("scontrol", "requeue", "7001") not in stand_in.ran and time.monotonic() < preempted + 5:
        time.sleep(0.01)
    requeued_after = time.monotonic() - preempted
    stop.set()
    syncing.join(timeout=10)  # its pass in flight ends before its clients close
    assert not syncing.is_alive()
    bridge_client.close()
    bridge_inventory.close()
    print(f"\nthe Slurm job was requeued {requeued_after * 1000:.0f} ms after the preemption")
    assert requeued_after < 5
    (comment,) = [c for c in stand_in.ran if c[:2] == ("scontrol", "update")]
    assert comment[2] == "JobId=7001" and "GPUs preempted by tenant team-c" in comment[3]
    assert ("scontrol", "requeue", "7001") in stand_in.ran
    code, _, err = slurm(fleet, "epilog")  # the job ends: nothing left to release, no error
    assert code == 0, err


def test_a_kueue_workload_whose_pod_set_is_preempted_goes_back_to_retry(
    fleet: SecuredFleet, tmp_path: Path
) -> None:
    """The other way round: team-c's Workload of two pod sets (4 NVLinked H100s each) borrows
    hpc's idle quota and is admitted; hpc reclaims 4 GPUs (Allocate with preemption), which
    revokes one pod set's reservation. The controller's next pass sends the check to Retry
    naming who preempted it (Kueue evicts and requeues the Workload), releases the other pod
    set's reservation, and QuotaStatus shows no preemption pending for team-c: its holder was
    told."""
    admin = allocator_pb2_grpc.AllocatorStub(fleet.channel("admin"))
    for held in admin.ListReservations(pb.ListReservationsRequest(), timeout=10).reservations:
        admin.Release(pb.ReleaseRequest(reservation_id=held.id), timeout=10)
    api = kueue_with_our_check()
    (job,) = [d for d in documents(EXAMPLES / "h100-nvlink-job.yml") if d["kind"] == "Job"]
    workload = workload_for_job(job, name="two-pod-sets")
    second = copy.deepcopy(workload["spec"]["podSets"][0])
    workload["spec"]["podSets"].append({**second, "name": "aux"})
    api.apply(workload)
    settings = kueue_settings(fleet, tmp_path / "token")
    with kueue_placer(settings) as placer:
        controller = AdmissionController(api, placer, lease_ttl_seconds=60)
        stop = threading.Event()
        kueue = KueueStandIn(api)
        kueue.step()
        controller.reconcile_all()
        check = Workload.from_dict(api.get("Workload", "team-a", "two-pod-sets")).check("gpualloc")
        assert check is not None and check.state is CheckState.READY, check
        assert [u.name for u in check.pod_set_updates] == ["main", "aux"]
        kueue.step()  # every check Ready: Kueue admits it
        (decision,) = controller.reconcile_all()
        assert decision.action == "committed", decision
        quotas = admin.QuotaStatus(pb.QuotaStatusRequest(), timeout=10).tenants
        assert {(q.tenant, q.used, q.borrowed) for q in quotas} == {
            ("hpc", "0", "0"),
            ("team-c", "8", "4"),
        }

        hpc = allocator_pb2_grpc.AllocatorStub(fleet.channel("slurm-bridge"))
        request = pb.AllocateRequest(
            claims=[gpu_claim(4)], reserve=True, preempt=True, owner="slurm/job/7002"
        )
        # the controller as it runs: a pass a minute (no Kueue change comes), and one at once
        # when gpualloc revokes a Workload's reservation
        running = threading.Thread(target=controller.run, args=(stop, 60.0), daemon=True)
        running.start()
        assert controller.watching.wait(10)  # its WatchReservations stream is registered
        answer = hpc.Allocate(request, timeout=20)
        preempted = time.monotonic()
        assert answer.outcome == pb.OUTCOME_ALLOCATED
        (victim,) = answer.preemption.victims
        assert victim.reason == "reclaim"

        def our_check() -> AdmissionCheckState:
            found = Workload.from_dict(api.get("Workload", "team-a", "two-pod-sets"))
            state = found.check("gpualloc")
            assert state is not None
            return state

        while our_check().state is not CheckState.RETRY and time.monotonic() < preempted + 5:
            time.sleep(0.01)
        evicted_after = time.monotonic() - preempted
        retried = our_check()
        stop.set()
        kueue.step()  # Retry: Kueue evicts the Workload and requeues it
        stopped_by = time.monotonic() + 10
        while running.is_alive() and time.monotonic() < stopped_by:
            api.apply(api.get("Workload", "team-a", "two-pod-sets"))  # the loop's wait ends
            running.join(timeout=0.1)
        assert not running.is_alive()  # before the `with` closes its clients
        print(f"\nthe Workload went back to Retry {evicted_after * 1000:.0f} ms after the grant")
        assert retried.state is CheckState.RETRY and evicted_after < 5
        assert "was preempted by tenant hpc" in retried.message
        requeued = Workload.from_dict(api.get("Workload", "team-a", "two-pod-sets"))
        assert not requeued.quota_reserved and not requeued.admitted

    left = admin.ListReservations(pb.ListReservationsRequest(), timeout=10).reservations
    assert [r.owner for r in left] == ["hpc/slurm/job/7002"]  # the other pod set's released
    quotas = admin.QuotaStatus(pb.QuotaStatusRequest(), timeout=10).tenants
    assert {(q.tenant, q.used, q.pending_preemptions) for q in quotas} == {
        ("hpc", "4", 0),
        ("team-c", "0", 0),
    }
    admin.Release(pb.ReleaseRequest(reservation_id=left[0].id), timeout=10)


def gpu_claim(count: int) -> dra_pb2.ResourceClaim:
    exactly = dra_pb2.ExactDeviceRequest(device_class_name="gpu.nvidia.com", count=count)
    return dra_pb2.ResourceClaim(
        name="gpus",
        namespace="default",
        requests=[dra_pb2.DeviceRequest(name="gpu", exactly=exactly)],
    )


FLAVORED = """\
  quota:
    resourceFlavors:
    - {name: hopper, nodeLabels: {nvidia.com/gpu.family: hopper}}
    - {name: ada, nodeLabels: {nvidia.com/gpu.family: ada-lovelace}}
    resources: [{name: gpus, deviceClassNames: [gpu.nvidia.com], flavors: [hopper, ada]}]
  tenants:
  - name: team-a
  - name: team-b
  - name: team-c
    cohort: shared
    quotas:
    - {resource: gpus, flavor: hopper, nominal: 0}
    - {resource: gpus, flavor: ada, nominal: 4}
  - name: tools
    allowAdminAccess: true
  - name: hpc
    cohort: shared
    quotas:
    - {resource: gpus, flavor: hopper, nominal: 8}
    - {resource: gpus, flavor: ada, nominal: 0}
"""


def test_a_kueue_workload_falls_back_to_a_second_flavor_while_slurm_holds_the_first(
    tmp_path: Path,
) -> None:
    """team-c lists hopper (nominal 0, borrowable from hpc's 8) before ada (nominal 4). The
    Slurm bridge's prolog takes hpc's 8 H100s; a Kueue Workload of team-c asking for 4 GPUs of
    any model then gets the L40S node through the admission controller (nothing of hopper is
    left to borrow), charged to gpus/ada, and the Slurm job keeps its GPUs. The stand-in's
    admission names no flavor, so the fallback is gpualloc's own flavor search; what a real
    Kueue assigns is tests/e2e/test_kueue_real.py's (the *_mirrors_* tests)."""
    with secured_fleet(tmp_path / "pki", policy=policy_with(FLAVORED)) as fleet:
        code, out, err = slurm(fleet, "prolog")
        assert code == 0, err
        assert len(exports(out)["CUDA_VISIBLE_DEVICES"].split(",")) == 8
        api = kueue_with_our_check()
        (job,) = [d for d in documents(EXAMPLES / "h100-nvlink-job.yml") if d["kind"] == "Job"]
        job = copy.deepcopy(job)
        template = job["spec"]["template"]
        del template["metadata"]["annotations"]["gpualloc.io/nvlink"]
        del template["spec"]["nodeSelector"]  # any model will do
        name = api.apply(workload_for_job(job, name="any-model"))["metadata"]["name"]
        with kueue_placer(kueue_settings(fleet, tmp_path / "token")) as placer:
            controller = AdmissionController(api, placer, lease_ttl_seconds=60)
            KueueStandIn(api).step()
            controller.reconcile_all()
            check = Workload.from_dict(api.get("Workload", "team-a", name)).check("gpualloc")
            assert check is not None and check.state is CheckState.READY, check
            (update,) = check.pod_set_updates
            assert update.node_selector["kubernetes.io/hostname"] == "l40s-node-1"
        admin = allocator_pb2_grpc.AllocatorStub(fleet.channel("admin"))
        quotas = admin.QuotaStatus(pb.QuotaStatusRequest(), timeout=10).tenants
        used = {(q.tenant, q.resource): q.used for q in quotas if q.used != "0"}
        assert used == {("hpc", "gpus/hopper"): "8", ("team-c", "gpus/ada"): "4"}
        code, _, err = slurm(fleet, "epilog")
        assert code == 0, err


ONE_TENANT = """\
  quota:
    resourceFlavors:
    - {name: hopper, nodeLabels: {nvidia.com/gpu.family: hopper}}
    - {name: ada, nodeLabels: {nvidia.com/gpu.family: ada-lovelace}}
    resources: [{name: gpus, deviceClassNames: [gpu.nvidia.com], flavors: [hopper, ada]}]
  tenants:
  - name: team-a
  - name: team-b
  - name: team-c
  - name: tools
    allowAdminAccess: true
  - name: hpc
    quotas:
    - {resource: gpus, flavor: hopper, nominal: 8}
    - {resource: gpus, flavor: ada, nominal: 4}
"""
KUEUE_AS_TEAM_C = '    tenant: team-c\n    roles: [scheduler]\n    actFor: ["kueue/*"]'


def test_one_tenants_slurm_and_kueue_work_share_one_flavored_quota(tmp_path: Path) -> None:
    """The Slurm bridge and the Kueue sidecar both act for tenant hpc (hopper nominal 8, ada
    4). Slurm job 7001 takes the 8 H100s of h100-node-1; a Kueue Workload of hpc asking for 4
    GPUs of any model lands on the L40S node (hopper spent), charged to gpus/ada; Slurm job
    7002 on h100-node-2 is then refused (QUOTA_EXCEEDED on gpus/hopper: the prolog fails and
    holds nothing) although that node is idle, because one quota counts both bridges' grants;
    once job 7001's epilog releases its GPUs, job 7002's prolog gets 4."""
    policy = policy_with(ONE_TENANT)
    assert KUEUE_AS_TEAM_C in policy
    policy = policy.replace(KUEUE_AS_TEAM_C, KUEUE_AS_TEAM_C.replace("team-c", "hpc"))
    with secured_fleet(tmp_path / "pki", policy=policy) as fleet:
        code, out, err = slurm(fleet, "prolog")
        assert code == 0, err
        assert len(exports(out)["CUDA_VISIBLE_DEVICES"].split(",")) == 8
        api = kueue_with_our_check()
        (job,) = [d for d in documents(EXAMPLES / "h100-nvlink-job.yml") if d["kind"] == "Job"]
        job = copy.deepcopy(job)
        template = job["spec"]["template"]
        del template["metadata"]["annotations"]["gpualloc.io/nvlink"]
        del template["spec"]["nodeSelector"]  # any model will do
        workload = workload_for_job(job, name="any-model")
        workload["metadata"]["creationTimestamp"] = "2026-12-01T08:00:00Z"  # as the apiserver sets
        name = api.apply(workload)["metadata"]["name"]
        with kueue_placer(kueue_settings(fleet, tmp_path / "token")) as placer:
            controller = AdmissionController(api, placer, lease_ttl_seconds=60)
            KueueStandIn(api).step()
            controller.reconcile_all()
            check = Workload.from_dict(api.get("Workload", "team-a", name)).check("gpualloc")
            assert check is not None and check.state is CheckState.READY, check
            (update,) = check.pod_set_updates
            assert update.node_selector["kubernetes.io/hostname"] == "l40s-node-1"
        admin = allocator_pb2_grpc.AllocatorStub(fleet.channel("admin"))
        held = admin.ListReservations(pb.ListReservationsRequest(), timeout=10).reservations
        assert sorted(r.owner.split("/")[1] for r in held) == ["kueue", "slurm"]
        (kueue_held,) = [r for r in held if r.owner.startswith("hpc/kueue/")]
        # the sidecar sends the Workload's creation as the grant's queued time
        assert kueue_held.labels["gpualloc.dev/queued-at"] == "2026-12-01T08:00:00.000000Z"
        assert {r.owner.split("/")[0] for r in held} == {"hpc"}  # one tenant, two bridges
        quotas = admin.QuotaStatus(pb.QuotaStatusRequest(), timeout=10).tenants
        used = {(q.tenant, q.resource): q.used for q in quotas if q.used != "0"}
        assert used == {("hpc", "gpus/hopper"): "8", ("hpc", "gpus/ada"): "4"}

        second = {"SLURM_JOB_ID": "7002", "SLURMD_NODENAME": "h100-node-2"}
        second |= {"SLURM_JOB_GRES": "gpu:h100:4", "SLURM_CLUSTER_NAME": ""}  # no squeue here
        code, _, err = slurm_as(fleet, second, "prolog")
        assert code != 0 and "gpus/hopper" in err, err
        left = admin.ListReservations(pb.ListReservationsRequest(), timeout=10).reservations
        assert len(left) == 2  # the refused prolog holds nothing
        code, _, err = slurm(fleet, "epilog")  # job 7001 ends: hopper is free again
        assert code == 0, err
        code, out, err = slurm_as(fleet, second, "prolog")
        assert code == 0, err
        assert len(exports(out)["CUDA_VISIBLE_DEVICES"].split(",")) == 4


def slurm_as(fleet: SecuredFleet, job: dict[str, str], *argv: str) -> tuple[int, str, str]:
    """The Slurm bridge's hook for another job than JOB (its variables over JOB's)."""
    out, err = io.StringIO(), io.StringIO()
    environ = {**fleet.client_environ("slurm-bridge"), **JOB, **job}
    code = slurm_cli.main(list(argv), environ, out, err)
    return code, out.getvalue(), err.getvalue()
