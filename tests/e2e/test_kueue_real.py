"""The Kueue sidecar (gpualloc-kueue's AdmissionController over KubernetesKueueApi) under a real
Kueue v0.17.0 on a real kube-apiserver v1.34.4 (tests/control_plane.py), with a real gpualloc
(inventory + allocator on port 0, the example cluster) behind it.

The chain Kueue's users see: a batch/v1 Job with `kueue.x-k8s.io/queue-name` and a GPU
request -> Kueue makes its Workload and reserves quota in the ClusterQueue that lists our
AdmissionCheck -> the sidecar reserves in gpualloc and sets the check Ready with
podSetUpdates (the node's hostname) -> Kueue admits the Workload and unsuspends the Job with
that node selector. No kubelet: pods never run.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes  # the `kube` extra (make install): a real import, never a skip
import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from services.bridges import local_cluster
from services.bridges.kueue.controller import AdmissionController, TenantMode
from services.bridges.kueue.k8s_adapter import KubernetesKueueApi
from services.bridges.kueue.objects import CheckState, Workload
from services.bridges.placing import Placer
from services.client import AllocatorClient, InventoryClient, ReservationState
from services.client.config import ClientSettings
from tests.control_plane import ControlPlane, control_plane_in
from tests.integration.test_kueue_tenants import slurm
from tests.integration.test_quota_bridges import (
    KUEUE_AS_TEAM_C,
    SHARED,
    gpu_claim,
    kueue_settings,
)
from tests.security_fixtures import SecuredFleet, policy_with, secured_fleet
from tests.slurm.conftest import SlurmCluster, slurm_of
from tests.unit.bridges.support import ROOT, documents, release_everything

pytestmark = pytest.mark.timeout(300)  # the control plane's start counts in the first test's

EXAMPLES = ROOT / "examples" / "bridges" / "kueue"
OUR_CHECK = ROOT / "deploy" / "k8s" / "kueue" / "admission-check.yaml"
NAMESPACE = "team-a"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
WAIT_S = 60.0


def until(
    what: str, found: Callable[[], Any], timeout: float = WAIT_S, shown: Callable[[], Any] = str
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = found()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {shown()}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with control_plane_in(tmp_path_factory.mktemp("control-plane"), kueue=True) as started:
        started.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        started.apply_files([OUR_CHECK, EXAMPLES / "cluster-queue.yml"])
        yield started


@pytest.fixture(scope="module")
def gpualloc() -> Iterator[local_cluster.LocalCluster]:
    with local_cluster.start() as started:
        yield started


class Sidecar:
    """gpualloc-kueue as it runs (`AdmissionController.run`, resync 1 s) on a thread; with
    `settings`, as it runs under an access policy (TLS and its service-account token)."""

    def __init__(
        self,
        plane: ControlPlane,
        target: str,
        settings: ClientSettings | None = None,
        tenants: TenantMode = TenantMode.BINDING,
        mirror_namespace: str = "",
    ) -> None:
        if settings is None:
            self.client = AllocatorClient(target, owner="test")
            self.inventory = InventoryClient(target)
        else:
            tls, token = settings.tls, settings.token_file
            self.client = AllocatorClient(settings.target, tls=tls, token_file=token)
            self.inventory = InventoryClient(settings.inventory, tls=tls, token_file=token)
        self.api = KubernetesKueueApi(api_client=plane.api_client())
        self.controller = AdmissionController(
            self.api,
            Placer(self.client, self.inventory),
            lease_ttl_seconds=60,
            tenants=tenants,
            mirror_namespace=mirror_namespace,
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.controller.run, args=(self.stop, 1.0))
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.client.close()
        self.inventory.close()


@pytest.fixture
def sidecar(plane, gpualloc) -> Iterator[Sidecar]:
    running = Sidecar(plane, gpualloc.target)
    yield running
    running.close()
    _delete_all(plane)
    release_everything(gpualloc.target)


class Cluster:
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        client = plane.api_client()
        self.batch = kubernetes.client.BatchV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)

    def submit(
        self, path: Path, name: str | None = None, queue: str = "gpu-queue", any_model: bool = False
    ) -> str:
        (job,) = [d for d in documents(path) if d["kind"] == "Job"]
        job = copy.deepcopy(job)
        if any_model:  # 4 GPUs of any model, NVLinked or not
            del job["spec"]["template"]["spec"]["nodeSelector"]
            del job["spec"]["template"]["metadata"]["annotations"]
        job["metadata"]["namespace"] = NAMESPACE
        job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = queue
        if name:
            job["metadata"]["name"] = name
        job["spec"]["suspend"] = True  # what Kueue's Job webhook does (not registered here)
        self.plane.apply(job)
        return str(job["metadata"]["name"])

    def job(self, name: str) -> Any:
        return self.batch.read_namespaced_job(name, NAMESPACE)

    def workload_of(self, job: str) -> Workload | None:
        found = self.raw_workload_of(job)
        return Workload.from_dict(found) if found else None

    def workloads(self) -> list[dict[str, Any]]:
        listed: Any = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, "workloads"
        )
        return list(listed["items"])

    def raw_workload_of(self, job: str) -> dict[str, Any] | None:
        for item in self.workloads():
            owners = item["metadata"].get("ownerReferences") or []
            if any(o["kind"] == "Job" and o["name"] == job for o in owners):
                return dict(item)
        return None

    def check_of(self, job: str) -> Any:
        workload = self.workload_of(job)
        return workload.check("gpualloc") if workload else None

    def delete_job(self, name: str) -> None:
        """Delete the Job, and its Workload as the garbage collector would (no controller
        manager runs here to follow the ownerReference)."""
        workload = self.workload_of(name)
        self.batch.delete_namespaced_job(name, NAMESPACE, propagation_policy="Background")
        if workload is not None:
            _delete_workload(self.custom, workload.name)


def _delete_workload(custom: Any, name: str, namespace: str = NAMESPACE) -> None:
    body = {"metadata": {"finalizers": None}}
    try:
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "workloads", name, body)
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "workloads", name)
    except kubernetes.client.ApiException as error:
        if error.status != 404:
            raise


def _delete_all(plane: ControlPlane) -> None:
    cluster = Cluster(plane)
    for job in cluster.batch.list_namespaced_job(NAMESPACE).items:
        if job.metadata and job.metadata.name:
            cluster.delete_job(job.metadata.name)
    for item in cluster.workloads():
        _delete_workload(cluster.custom, item["metadata"]["name"])


@pytest.fixture
def cluster(plane) -> Cluster:
    return Cluster(plane)


def _held(sidecar: Sidecar, workload: str) -> list[Any]:
    return list(sidecar.client.list(owner=f"kueue/{NAMESPACE}/{workload}"))


def _admitted(cluster: Cluster, job: str) -> Workload:
    def admitted() -> Workload | None:
        found = cluster.workload_of(job)
        return found if found is not None and found.admitted else None

    workload: Workload = until("Workload admitted", admitted)
    return workload


def _unsuspended(cluster: Cluster, job: str) -> Any:
    found = cluster.job(job)
    return found if found.spec.suspend is False else None


def test_our_admission_check_turns_active_and_the_cluster_queue_with_it(plane, sidecar, cluster):
    def active(plural: str, name: str) -> bool:
        found = cluster.custom.get_cluster_custom_object(GROUP, VERSION, plural, name)
        conditions = found.get("status", {}).get("conditions", [])
        return any(c["type"] == "Active" and c["status"] == "True" for c in conditions)

    until("AdmissionCheck gpualloc Active", lambda: active("admissionchecks", "gpualloc"))
    until("ClusterQueue active", lambda: active("clusterqueues", "gpu-cluster-queue"))


def test_a_gpu_job_is_admitted_and_unsuspended_on_the_node_gpualloc_reserved(sidecar, cluster):
    job = cluster.submit(EXAMPLES / "h100-nvlink-job.yml")
    check = until(
        "check Ready",
        lambda: (c := cluster.check_of(job)) and c.state is CheckState.READY and c,
    )
    (update,) = check.pod_set_updates
    node = update.node_selector["kubernetes.io/hostname"]
    assert node.startswith("h100-node")
    started = until("Job unsuspended by Kueue", lambda: _unsuspended(cluster, job))
    selector = started.spec.template.spec.node_selector
    assert selector["kubernetes.io/hostname"] == node
    assert selector["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"  # the Job's own kept
    workload = until(
        "Workload admitted", lambda: (w := cluster.workload_of(job)) and w.admitted and w
    )
    (held,) = until(
        "reservation committed",
        lambda: [r for r in _held(sidecar, workload.name) if r.state is ReservationState.COMMITTED],
    )
    assert held.node_name == node and len(held.devices) == 4


def test_a_job_that_can_never_fit_is_rejected_and_kueue_deactivates_it(sidecar, cluster):
    """Rejected (documented: Kueue deactivates the Workload, which evicts it and resets the
    check): the Workload ends inactive, evicted as DeactivatedDueToAdmissionCheck naming our
    check, its Job suspended, nothing held."""
    job = cluster.submit(EXAMPLES / "too-big-job.yml")

    def deactivated() -> dict[str, Any] | None:
        found = cluster.raw_workload_of(job)
        if not found or found["spec"].get("active") is not False:
            return None
        conditions = found.get("status", {}).get("conditions", [])
        evicted = any(c["type"] == "Evicted" and c["status"] == "True" for c in conditions)
        return found if evicted else None  # Kueue writes spec.active, then the eviction

    workload = until(
        "Workload deactivated", deactivated, shown=lambda: cluster.raw_workload_of(job)
    )
    conditions = {c["type"]: c for c in workload["status"]["conditions"]}
    evicted = conditions["Evicted"]
    assert evicted["status"] == "True", evicted
    assert evicted["reason"] == "DeactivatedDueToAdmissionCheck", evicted
    assert "gpualloc" in evicted["message"] and "rejected" in evicted["message"], evicted
    assert cluster.job(job).spec.suspend is True
    assert _held(sidecar, workload["metadata"]["name"]) == []


def test_a_lost_reservation_makes_kueue_evict_and_requeue_the_workload(sidecar, cluster):
    job = cluster.submit(EXAMPLES / "h100-nvlink-job.yml")
    until("Job unsuspended", lambda: _unsuspended(cluster, job))
    workload = until(
        "Workload admitted", lambda: (w := cluster.workload_of(job)) and w.admitted and w
    )
    (held,) = until("reserved", lambda: _held(sidecar, workload.name))
    sidecar.client.release(held, owner=held.owner)  # gone from under the admitted Workload

    def evictions() -> int:
        found = cluster.raw_workload_of(job) or {}
        stats = found.get("status", {}).get("schedulingStats", {}).get("evictions", [])
        return sum(int(e.get("count", 0)) for e in stats)

    # Kueue evicts it (the Job suspended) and requeues it; the cycle may be quicker than a
    # poll of the Job, so what it leaves is checked: the eviction counted on the Workload
    until("Workload evicted", lambda: evictions() >= 1, shown=lambda: cluster.raw_workload_of(job))
    # requeued: Kueue reserves quota again, the sidecar places it again, Kueue admits again
    (again,) = until(
        "placed again", lambda: [r for r in _held(sidecar, workload.name) if r.id != held.id]
    )
    until("Job unsuspended again", lambda: _unsuspended(cluster, job), timeout=120)
    assert again.node_name.startswith("h100-node")


def test_a_deleted_job_s_reservation_is_released(sidecar, cluster):
    job = cluster.submit(EXAMPLES / "h100-nvlink-job.yml")
    workload = until(
        "Workload admitted", lambda: (w := cluster.workload_of(job)) and w.admitted and w
    )
    until("reserved", lambda: _held(sidecar, workload.name))
    cluster.delete_job(job)
    until("released", lambda: _held(sidecar, workload.name) == [])


def test_a_sidecar_restarted_mid_flight_neither_leaks_nor_duplicates(plane, gpualloc, cluster):
    """The sidecar stops after reserving and setting Ready (before it commits); a new one
    (fresh memory) finds the same reservation, commits it once, and nothing else is held."""
    first = Sidecar(plane, gpualloc.target)
    try:
        job = cluster.submit(EXAMPLES / "h100-nvlink-job.yml", name="restarted")
        until("check Ready", lambda: (c := cluster.check_of(job)) and c.state is CheckState.READY)
    finally:
        first.close()
    workload = cluster.workload_of(job)
    assert workload is not None
    (before,) = _held(first_or_new := Sidecar(plane, gpualloc.target), workload.name)
    try:
        until("Job unsuspended", lambda: _unsuspended(cluster, job))
        (after,) = until(
            "committed once",
            lambda: [
                r
                for r in _held(first_or_new, workload.name)
                if r.state is ReservationState.COMMITTED
            ],
        )
        assert after.id == before.id
        assert len(list(first_or_new.client.list())) == 1
    finally:
        first_or_new.close()
        _delete_all(plane)
        release_everything(gpualloc.target)


# team-c (the sidecar's token) has no quota of its own: all it holds is borrowed from hpc's
# idle 4 GPUs in their cohort, so hpc reclaiming them preempts the Kueue Workload's reservation
OWN_QUOTA = "{name: team-c, cohort: shared, quotas: [{resource: gpus, nominal: 4}]}"
BORROWING = SHARED.replace(OWN_QUOTA, OWN_QUOTA.replace("nominal: 4", "nominal: 0"))
assert BORROWING != SHARED, "test_quota_bridges' SHARED policy changed: update OWN_QUOTA"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredFleet]:
    with secured_fleet(tmp_path_factory.mktemp("pki-kueue"), policy=policy_with(BORROWING)) as made:
        yield made


def test_a_preemption_in_gpualloc_makes_kueue_evict_and_requeue_the_workload(
    plane, fleet, cluster, tmp_path
):
    """The sidecar under the policy (TLS, team-c's token) places a Job's Workload on quota
    borrowed from hpc; hpc reclaims it with Allocate(preempt) through gpualloc's policy, which
    revokes the Workload's reservation: the sidecar sends the check to Retry naming hpc, Kueue
    evicts the Workload (the Job suspended) and requeues it, and it stays pending while hpc
    holds the GPUs (team-c has no quota of its own left to borrow)."""
    sidecar = Sidecar(plane, "", kueue_settings(fleet, tmp_path / "token"))
    try:
        job = cluster.submit(EXAMPLES / "h100-nvlink-job.yml")
        until("Job unsuspended", lambda: _unsuspended(cluster, job))
        workload = _admitted(cluster, job)
        (held,) = until("reserved", lambda: _held(sidecar, workload.name))
        hpc = allocator_pb2_grpc.AllocatorStub(fleet.channel("slurm-bridge"))
        request = pb.AllocateRequest(
            claims=[gpu_claim(4)], reserve=True, preempt=True, owner="slurm/job/7002"
        )
        answer = hpc.Allocate(request, timeout=20)
        assert answer.outcome == pb.OUTCOME_ALLOCATED
        assert [v.reason for v in answer.preemption.victims] == ["reclaim"]

        def evictions() -> list[dict[str, Any]]:
            found = cluster.raw_workload_of(job) or {}
            return list(found.get("status", {}).get("schedulingStats", {}).get("evictions", []))

        until("Workload evicted", evictions, shown=lambda: cluster.raw_workload_of(job))
        until("Job suspended", lambda: cluster.job(job).spec.suspend is True)
        requeued = until("Workload requeued", lambda: cluster.workload_of(job))
        assert not requeued.admitted
        placed = [r for r in _held(sidecar, workload.name) if r.id != held.id]
        assert not placed, "nothing placed again while hpc holds the GPUs"
    finally:
        sidecar.close()
        _delete_all(plane)


def _flavor(name: str, family: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": {"nvidia.com/gpu.family": family}},
    }


def _queue(name: str, flavor: str) -> list[dict[str, Any]]:
    """A ClusterQueue of 4 GPUs of one flavor (and the cpu and memory Kueue counts for the
    Job), with gpualloc's check, and its LocalQueue `<name>-queue` in the test's namespace."""
    resources = [
        {"name": "cpu", "nominalQuota": 64},
        {"name": "memory", "nominalQuota": "512Gi"},
        {"name": "nvidia.com/gpu", "nominalQuota": 4},
    ]
    return [
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [{"name": flavor, "resources": resources}],
                    }
                ],
                "admissionChecksStrategy": {"admissionChecks": [{"name": "gpualloc"}]},
            },
        },
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "LocalQueue",
            "metadata": {"namespace": NAMESPACE, "name": f"{name}-queue"},
            "spec": {"clusterQueue": name},
        },
    ]


# The site's objects, applied to Kueue and given to gpualloc's policy alike: two ClusterQueues,
# research on the H100 nodes (flavor hopper), inference on the L40S node (flavor ada)
SITE = [
    _flavor("hopper", "hopper"),
    _flavor("ada", "ada-lovelace"),
    *_queue("research", "hopper"),
    *_queue("inference", "ada"),
]
QUEUES_AS_TENANTS = f"""\
  quota:
    kueue:
      objects: {json.dumps(SITE)}
  tenants:
  - name: team-a
  - name: team-b
  - name: team-c
  - name: tools
    allowAdminAccess: true
  - name: hpc
"""
SLURM_AS_HPC = '    tenant: hpc\n    roles: [scheduler]\n    actFor: ["slurm/job/*"]'
ACTING = '    roles: [scheduler]\n    actFor: ["kueue/*"]\n    actForTenants: [research, inference]'


def test_cluster_queues_slurm_and_kueue_work_share_their_quotas_under_a_real_kueue(
    plane, cluster, tmp_path
):
    """The policy is the site's Kueue objects: ClusterQueues research (4 GPUs of flavor
    hopper, whose nodeLabels name the H100 nodes) and inference (4 of ada, the L40S node).
    The Slurm bridge is bound to research; the sidecar (its service-account token) acts for
    both with `tenants=cluster-queue`. Slurm job 7001's prolog takes 4 H100s as research.
    A Job of 4 GPUs of any model in each LocalQueue: inference's is admitted and unsuspended
    on the L40S node, held as `inference/kueue/...`; research's, which Kueue's own count admits
    (it sees no Slurm job), is refused by gpualloc on research's quota, so Kueue evicts and
    requeues it and the Job stays suspended. Job 7001's epilog frees the quota: Kueue's next
    try is admitted, held as `research/kueue/...`. Each Job is unsuspended with its flavor's
    nodeLabels (Kueue's) and the node gpualloc holds agreeing: gpualloc placed each on the
    flavor Kueue assigned it."""
    policy = policy_with(QUEUES_AS_TENANTS).replace(KUEUE_AS_TEAM_C, ACTING)
    policy = policy.replace(SLURM_AS_HPC, SLURM_AS_HPC.replace("hpc", "research"))
    assert ACTING in policy and "tenant: research" in policy
    for document in SITE:
        plane.apply(document)
    job_7001 = {"SLURM_JOB_GRES": "gpu:h100:4"}
    with secured_fleet(tmp_path / "pki", policy=policy) as fleet:
        code, _, err = slurm(fleet, job_7001, "prolog")
        assert code == 0, err
        sidecar = Sidecar(
            plane, "", kueue_settings(fleet, tmp_path / "token"), TenantMode.CLUSTER_QUEUE
        )
        admin = allocator_pb2_grpc.AllocatorStub(fleet.channel("admin"))

        def used() -> dict[tuple[str, str], str]:
            quotas = admin.QuotaStatus(pb.QuotaStatusRequest(), timeout=10).tenants
            return {(q.tenant, q.resource): q.used for q in quotas if q.used != "0"}

        def owners() -> list[str]:
            listed = admin.ListReservations(pb.ListReservationsRequest(), timeout=10)
            return sorted(r.owner for r in listed.reservations)

        def running(job: str, family: str, node: str) -> Workload:
            unsuspended = until(f"{job} unsuspended", lambda: _unsuspended(cluster, job))
            selector = unsuspended.spec.template.spec.node_selector
            assert selector["nvidia.com/gpu.family"] == family  # Kueue's, from the flavor
            assert selector["kubernetes.io/hostname"].startswith(node)  # gpualloc's
            return _admitted(cluster, job)

        job_path = EXAMPLES / "h100-nvlink-job.yml"
        try:
            inference = cluster.submit(job_path, "inference-job", "inference-queue", True)
            research = cluster.submit(job_path, "research-job", "research-queue", True)
            served = running(inference, "ada-lovelace", "l40s-node-")
            assert served.assigned_flavors == {"main": ("ada",)}

            def refused() -> str:
                found = cluster.raw_workload_of(research) or {}
                for check in found.get("status", {}).get("admissionChecks", []):
                    if check.get("name") == "gpualloc" and "quota" in check.get("message", ""):
                        return str(check["message"])
                return ""

            why = until(
                "research refused", refused, shown=lambda: cluster.raw_workload_of(research)
            )
            assert "research" in why and "nvidia.com/gpu/hopper" in why
            assert cluster.job(research).spec.suspend is True
            assert owners() == [
                f"inference/kueue/{NAMESPACE}/{served.name}",
                "research/slurm/job/7001",
            ]

            code, _, err = slurm(fleet, job_7001, "epilog")  # the Slurm job ends
            assert code == 0, err
            trained = running(research, "hopper", "h100-node-")
            assert trained.assigned_flavors == {"main": ("hopper",)}
            assert owners() == [
                f"inference/kueue/{NAMESPACE}/{served.name}",
                f"research/kueue/{NAMESPACE}/{trained.name}",
            ]
            assert used() == {
                ("inference", "nvidia.com/gpu/ada"): "4",
                ("research", "nvidia.com/gpu/hopper"): "4",
            }
        finally:
            sidecar.close()
            _delete_all(plane)


def _two_flavor_queue(name: str) -> list[dict[str, Any]]:
    """ClusterQueue `name` with flavors hopper (8 GPUs) then ada (4), Kueue's defaults for
    borrowing and preemption (flavorFungibility whenCanBorrow: MayStopSearch, whenCanPreempt:
    TryNextFlavor), gpualloc's check, and its LocalQueue `<name>-queue`."""

    def resources(gpus: int) -> list[dict[str, Any]]:
        return [
            {"name": "cpu", "nominalQuota": 64},
            {"name": "memory", "nominalQuota": "512Gi"},
            {"name": "nvidia.com/gpu", "nominalQuota": gpus},
        ]

    queue, local = _queue(name, "hopper")
    queue["spec"]["resourceGroups"][0]["flavors"] = [
        {"name": "hopper", "resources": resources(8)},
        {"name": "ada", "resources": resources(4)},
    ]
    return [queue, local]


# ClusterQueue hpc: hopper (the H100 nodes) 8, then ada (the L40S node) 4; the Slurm bridge and
# the sidecar (acting for hpc, `tenants=cluster-queue`) draw on its one quota
HPC_SITE = [_flavor("hopper", "hopper"), _flavor("ada", "ada-lovelace"), *_two_flavor_queue("hpc")]
HPC_AS_TENANT = f"""\
  quota:
    kueue:
      objects: {json.dumps(HPC_SITE)}
  tenants:
  - name: team-a
  - name: team-b
  - name: team-c
  - name: tools
    allowAdminAccess: true
"""
ACTING_FOR_HPC = '    roles: [scheduler]\n    actFor: ["kueue/*"]\n    actForTenants: [hpc]'
MIRRORS = "gpualloc-mirrors"
JOB_7001 = {"SLURM_JOB_GRES": "gpu:h100:8"}


def _assignments(found: dict[str, Any] | None) -> list[str]:
    """The flavors Kueue assigned the Workload's GPUs now ([] without an admission)."""
    admission = ((found or {}).get("status") or {}).get("admission") or {}
    return [a["flavors"].get("nvidia.com/gpu", "") for a in admission.get("podSetAssignments", [])]


def _evictions(found: dict[str, Any] | None) -> int:
    stats = ((found or {}).get("status") or {}).get("schedulingStats", {}).get("evictions", [])
    return sum(int(e.get("count", 0)) for e in stats)


@contextlib.contextmanager
def _assignments_watched(cluster: Cluster) -> Iterator[set[str]]:
    """Every flavor Kueue assigns a Workload's GPUs in the test's namespace meanwhile, from a
    watch of the Workloads (every change, not a poll that can miss a short admission)."""
    seen: set[str] = set()
    stop = threading.Event()
    watch = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]

    def follow() -> None:
        while not stop.is_set():
            stream = watch.stream(  # type: ignore[no-untyped-call]
                cluster.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                NAMESPACE,
                "workloads",
                resource_version=watch.resource_version,  # where the last stream ended
                timeout_seconds=2,
            )
            for event in stream:
                seen.update(_assignments(event["object"]))

    thread = threading.Thread(target=follow)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(10)


def _hpc_fleet(plane: ControlPlane, tmp_path: Path) -> Any:
    policy = policy_with(HPC_AS_TENANT).replace(KUEUE_AS_TEAM_C, ACTING_FOR_HPC)
    assert ACTING_FOR_HPC in policy and "tenant: hpc" in policy  # the Slurm bridge's binding
    for document in HPC_SITE:
        plane.apply(document)
    return secured_fleet(tmp_path / "pki", policy=policy)


def test_without_mirrors_a_real_kueue_retries_the_first_flavor_until_slurm_releases(
    plane, cluster, tmp_path
):
    """ClusterQueue hpc lists hopper (8) before ada (4). Slurm job 7001's prolog takes hpc's
    8 H100s through gpualloc; Kueue's own count sees no Slurm job. A Job of 4 GPUs of any
    model: Kueue assigns hopper, gpualloc's check answers Retry on hpc's hopper quota, Kueue
    evicts the Workload (reason AdmissionCheck) and requeues it — and assigns hopper again,
    every time: its requeue forgets the assignment it tried, and ada, which would fit, is
    never assigned. The Job stays suspended until job 7001's epilog; then it runs on hopper."""
    with _hpc_fleet(plane, tmp_path) as fleet:
        code, _, err = slurm(fleet, JOB_7001, "prolog")
        assert code == 0, err
        settings = kueue_settings(fleet, tmp_path / "token")
        sidecar = Sidecar(plane, "", settings, TenantMode.CLUSTER_QUEUE)
        try:
            with _assignments_watched(cluster) as seen:
                job = cluster.submit(
                    EXAMPLES / "h100-nvlink-job.yml", "any-model", "hpc-queue", True
                )
                until(
                    "3 evictions",
                    lambda: _evictions(cluster.raw_workload_of(job)) >= 3,
                    shown=lambda: cluster.raw_workload_of(job),
                )
                assert cluster.job(job).spec.suspend is True
            found = cluster.raw_workload_of(job) or {}
            reasons = {e["reason"] for e in found["status"]["schedulingStats"]["evictions"]}
            assert reasons == {"AdmissionCheck"}, found["status"]
            assert seen == {"hopper"}, f"Kueue assigned {seen}: ada never, although it fits"

            code, _, err = slurm(fleet, JOB_7001, "epilog")  # the Slurm job ends
            assert code == 0, err
            started = until("Job unsuspended", lambda: _unsuspended(cluster, job))
            selector = started.spec.template.spec.node_selector
            assert selector["nvidia.com/gpu.family"] == "hopper"
            assert selector["kubernetes.io/hostname"].startswith("h100-node-")
            assert _admitted(cluster, job).assigned_flavors == {"main": ("hopper",)}
        finally:
            sidecar.close()
            _delete_all(plane)


def test_with_mirrors_a_real_kueue_assigns_the_next_flavor_while_slurm_holds_the_first(
    plane, cluster, tmp_path
):
    """The same ClusterQueue, the sidecar with a mirror namespace. Slurm job 7001's prolog
    takes hpc's 8 H100s: the sidecar mirrors the grant as a Workload of 8 GPUs with hopper's
    nodeLabels as its nodeSelector in LocalQueue gpualloc-hpc, sets its check Ready without
    placing anything, and Kueue admits it on hopper: Kueue's count now sees hopper spent. A Job
    of 4 GPUs of any model is then assigned ada at once (never evicted), placed by gpualloc on
    the L40S node and charged to hpc's ada quota. Job 7001's epilog ends the grant: its mirror
    is deleted, and Kueue's count frees hopper. A Workload labelled as a mirror in the mirror
    namespace that mirrors no live grant is deleted, never made Ready."""
    plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MIRRORS}})
    with _hpc_fleet(plane, tmp_path) as fleet:
        code, _, err = slurm(fleet, JOB_7001, "prolog")
        assert code == 0, err
        settings = kueue_settings(fleet, tmp_path / "token")
        sidecar = Sidecar(plane, "", settings, TenantMode.CLUSTER_QUEUE, mirror_namespace=MIRRORS)
        custom = cluster.custom

        def mirrors() -> list[dict[str, Any]]:
            listed = custom.list_namespaced_custom_object(GROUP, VERSION, MIRRORS, "workloads")
            return list(listed["items"])

        def admitted_mirror() -> Workload | None:
            found = [Workload.from_dict(m) for m in mirrors()]
            return found[0] if len(found) == 1 and found[0].admitted else None

        try:
            mirror = until("mirror admitted", admitted_mirror, shown=mirrors)
            assert mirror.cluster_queue == "hpc"
            assert mirror.assigned_flavors == {"main": ("hopper",)}
            (raw,) = mirrors()
            assert (
                raw["metadata"]["annotations"]["gpualloc.io/mirror-owner"] == "hpc/slurm/job/7001"
            )
            (pod_set,) = raw["spec"]["podSets"]
            (container,) = pod_set["template"]["spec"]["containers"]
            assert container["resources"]["requests"] == {"nvidia.com/gpu": "8"}
            assert "nothing placed" in (mirror.check("gpualloc").message or "")

            job = cluster.submit(EXAMPLES / "h100-nvlink-job.yml", "any-model", "hpc-queue", True)
            started = until("Job unsuspended", lambda: _unsuspended(cluster, job))
            selector = started.spec.template.spec.node_selector
            assert selector["nvidia.com/gpu.family"] == "ada-lovelace"  # Kueue's, from ada
            assert selector["kubernetes.io/hostname"].startswith("l40s-node-")  # gpualloc's
            workload = _admitted(cluster, job)
            assert workload.assigned_flavors == {"main": ("ada",)}
            assert _evictions(cluster.raw_workload_of(job)) == 0  # ada at once, no Retry
            admin = allocator_pb2_grpc.AllocatorStub(fleet.channel("admin"))
            quotas = admin.QuotaStatus(pb.QuotaStatusRequest(), timeout=10).tenants
            used = {(q.tenant, q.resource): q.used for q in quotas if q.used != "0"}
            assert used == {
                ("hpc", "nvidia.com/gpu/hopper"): "8",
                ("hpc", "nvidia.com/gpu/ada"): "4",
            }

            code, _, err = slurm(fleet, JOB_7001, "epilog")  # the Slurm job ends
            assert code == 0, err
            until("mirror deleted", lambda: mirrors() == [], shown=mirrors)

            # a Workload labelled as a mirror that mirrors no live grant is deleted, never Ready
            kept = ("namespace", "labels", "annotations")
            metadata = {k: raw["metadata"][k] for k in kept} | {"name": "forged"}
            forged = {"apiVersion": raw["apiVersion"], "kind": "Workload", "metadata": metadata}
            cluster.plane.apply(forged | {"spec": raw["spec"]})
            until("forged mirror deleted", lambda: mirrors() == [], shown=mirrors)
        finally:
            sidecar.close()
            _delete_all(plane)
            for item in mirrors():
                _delete_workload(custom, item["metadata"]["name"], MIRRORS)


def test_with_mirrors_a_workload_kueue_put_on_the_first_flavor_is_preempted_for_the_mirror(
    plane, cluster, tmp_path
):
    """The order where Kueue reserved hopper for a Job of 4 GPUs of any model before the Slurm
    grant's mirror existed (the sidecar starts after), in ClusterQueue hpc with
    `preemption.withinClusterQueue: LowerPriority`: the mirror (priority 1e9) does not fit
    Kueue's count beside the Job, so Kueue preempts the Job to admit it; the Job's next try is
    assigned ada and runs on the L40S node."""
    plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MIRRORS}})
    with _hpc_fleet(plane, tmp_path) as fleet:
        (queue,) = [d for d in HPC_SITE if d["kind"] == "ClusterQueue"]
        plane.apply(queue | {"spec": queue["spec"] | {"preemption": PREEMPT_BY_PRIORITY}})
        code, _, err = slurm(fleet, JOB_7001, "prolog")
        assert code == 0, err
        # the check Active (as any sidecar leaves it), so Kueue reserves quota before ours runs
        KubernetesKueueApi(api_client=plane.api_client()).set_admission_check_active(
            "gpualloc", "gpualloc admission is running"
        )
        job = cluster.submit(EXAMPLES / "h100-nvlink-job.yml", "any-model", "hpc-queue", True)
        until(
            "hopper reserved by Kueue",
            lambda: _assignments(cluster.raw_workload_of(job)) == ["hopper"],
            shown=lambda: cluster.raw_workload_of(job),
        )
        settings = kueue_settings(fleet, tmp_path / "token")
        sidecar = Sidecar(plane, "", settings, TenantMode.CLUSTER_QUEUE, mirror_namespace=MIRRORS)
        custom = cluster.custom

        def mirrors() -> list[dict[str, Any]]:
            listed = custom.list_namespaced_custom_object(GROUP, VERSION, MIRRORS, "workloads")
            return list(listed["items"])

        try:
            started = until(  # after Kueue's preemption and requeue: as "unsuspended again"
                "Job unsuspended",
                lambda: _unsuspended(cluster, job),
                timeout=120,
                shown=lambda: json.dumps(
                    [cluster.raw_workload_of(job), *mirrors()], indent=1, default=str
                ),
            )
            selector = started.spec.template.spec.node_selector
            assert selector["nvidia.com/gpu.family"] == "ada-lovelace"
            assert selector["kubernetes.io/hostname"].startswith("l40s-node-")
            assert _admitted(cluster, job).assigned_flavors == {"main": ("ada",)}
            (mirror,) = [Workload.from_dict(m) for m in mirrors()]
            assert mirror.admitted and mirror.assigned_flavors == {"main": ("hopper",)}
            code, _, err = slurm(fleet, JOB_7001, "epilog")
            assert code == 0, err
            until("mirror deleted", lambda: mirrors() == [], shown=mirrors)
        finally:
            sidecar.close()
            _delete_all(plane)
            for item in mirrors():
                _delete_workload(custom, item["metadata"]["name"], MIRRORS)
            plane.apply(queue)  # hpc as the other tests have it


PREEMPT_BY_PRIORITY = {"withinClusterQueue": "LowerPriority"}


@pytest.fixture
def real_slurm(gpualloc) -> Iterator[SlurmCluster]:
    """A real slurmctld and slurmd with the bridge's hooks (tests/slurm/conftest.py), started
    for the test (its gres.conf from the module's gpualloc, the same inventory as the fleet's)."""
    with slurm_of(gpualloc) as started:
        yield started


@pytest.mark.slurm
@pytest.mark.timeout(300, func_only=True)  # the Slurm's start is the fixture's, not the test's
def test_a_real_slurm_job_and_a_real_kueue_job_share_cluster_queue_hpc_s_flavored_quota(
    plane, cluster, real_slurm, tmp_path
):
    """ClusterQueue hpc (hopper 8, then ada 4) under a real Slurm and a real Kueue, both bridges
    talking to one gpualloc with hpc's Kueue objects as its policy. A batch job submitted with
    sbatch (`--gres=gpu:8`) runs on h100-node-1: the bridge's PrologSlurmctld, over mutual TLS as
    the Slurm bridge bound to hpc, holds the node's 8 H100s as `hpc/slurm/job/<id>`. The sidecar
    mirrors that grant (a Workload of 8 GPUs, admitted by Kueue on hopper), so a Job of 4 GPUs
    of any model is assigned ada at once (never evicted) and unsuspended on the L40S node,
    charged to hpc's ada quota beside the job's hopper. When the Slurm job ends, its node
    Epilog releases its GPUs and the mirror is deleted: hpc's hopper quota is free."""
    plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MIRRORS}})
    custom = cluster.custom

    def mirrors() -> list[dict[str, Any]]:
        listed = custom.list_namespaced_custom_object(GROUP, VERSION, MIRRORS, "workloads")
        return list(listed["items"])

    def admitted_mirror() -> Workload | None:
        found = [Workload.from_dict(m) for m in mirrors()]
        return found[0] if len(found) == 1 and found[0].admitted else None

    with _hpc_fleet(plane, tmp_path) as fleet:
        bridge = fleet.client_environ("slurm-bridge")
        tls = {k: v for k, v in bridge.items() if k.startswith("GPUALLOC_CLIENT_TLS_")}
        admin = allocator_pb2_grpc.AllocatorStub(fleet.channel("admin"))

        def used() -> dict[tuple[str, str], str]:
            quotas = admin.QuotaStatus(pb.QuotaStatusRequest(), timeout=10).tenants
            return {(q.tenant, q.resource): q.used for q in quotas if q.used != "0"}

        def owners() -> list[str]:
            listed = admin.ListReservations(pb.ListReservationsRequest(), timeout=10)
            return sorted(r.owner for r in listed.reservations)

        with real_slurm.served_by(fleet.mtls_port, **tls):
            out = real_slurm.out
            held = f"touch {out}/ready-$SLURM_JOB_ID\nwhile [ ! -e {out}/go ]; do sleep 0.2; done\n"
            job_id = real_slurm.sbatch("--gres=gpu:8", script=held)
            real_slurm.wait_for_file(out / f"ready-{job_id}")  # running: its prolog held
            assert owners() == [f"hpc/slurm/job/{job_id}"]
            settings = kueue_settings(fleet, tmp_path / "token")
            sidecar = Sidecar(
                plane, "", settings, TenantMode.CLUSTER_QUEUE, mirror_namespace=MIRRORS
            )
            try:
                mirror = until("mirror admitted", admitted_mirror, shown=mirrors)
                assert mirror.cluster_queue == "hpc"
                assert mirror.assigned_flavors == {"main": ("hopper",)}
                (raw,) = mirrors()
                owner = raw["metadata"]["annotations"]["gpualloc.io/mirror-owner"]
                assert owner == f"hpc/slurm/job/{job_id}"

                job = cluster.submit(
                    EXAMPLES / "h100-nvlink-job.yml", "any-model", "hpc-queue", True
                )
                started = until("Job unsuspended", lambda: _unsuspended(cluster, job))
                selector = started.spec.template.spec.node_selector
                assert selector["nvidia.com/gpu.family"] == "ada-lovelace"  # Kueue's, from ada
                assert selector["kubernetes.io/hostname"].startswith("l40s-node-")  # gpualloc's
                workload = _admitted(cluster, job)
                assert workload.assigned_flavors == {"main": ("ada",)}
                assert _evictions(cluster.raw_workload_of(job)) == 0  # ada at once, no Retry
                assert real_slurm.job(job_id)["JobState"] == "RUNNING"
                assert owners() == [
                    f"hpc/kueue/{NAMESPACE}/{workload.name}",
                    f"hpc/slurm/job/{job_id}",
                ]
                assert used() == {
                    ("hpc", "nvidia.com/gpu/hopper"): "8",
                    ("hpc", "nvidia.com/gpu/ada"): "4",
                }

                (out / "go").touch()  # the Slurm job ends
                done = real_slurm.wait_for(job_id, ["COMPLETED", "FAILED"])
                assert done["JobState"] == "COMPLETED", done
                until("mirror deleted", lambda: mirrors() == [], shown=mirrors)
                assert owners() == [f"hpc/kueue/{NAMESPACE}/{workload.name}"]
                assert used() == {("hpc", "nvidia.com/gpu/ada"): "4"}
            finally:
                sidecar.close()
                _delete_all(plane)
                for item in mirrors():
                    _delete_workload(custom, item["metadata"]["name"], MIRRORS)
