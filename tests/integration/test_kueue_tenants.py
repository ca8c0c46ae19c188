"""The Kueue sidecar acts for each Workload's ClusterQueue: one quota across Slurm, Kueue and
the API when the policy is Kueue's own objects.

Real mTLS servers (tests/security_fixtures.py's fleet) under an access policy whose quota
section is the Kueue objects below (ResourceFlavors hopper and ada, ClusterQueues team-a,
team-b, team-c and hpc, their LocalQueues and gpualloc's AdmissionCheck), the same objects the
Kueue stand-in (services/bridges/kueue/memory_api.py) runs. The sidecar's identity (its
service-account token) has no tenant of its own: its binding lets it act for team-a, team-b and
hpc (`actForTenants`), and its controller runs with `tenants=cluster-queue`, so each Workload
is placed acting for the tenant named as its ClusterQueue. The Slurm bridge's certificate is
bound to hpc, as the worked example of docs/tenancy.md binds it.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from services.bridges.kueue.controller import AdmissionController, TenantMode
from services.bridges.kueue.memory_api import KueueStandIn, MemoryKueueApi, workload_for_job
from services.bridges.kueue.objects import AdmissionCheckState, CheckState, Workload
from services.bridges.slurm import cli as slurm_cli
from services.client import Outcome, Placement, claim_from_spec
from services.client.client import AllocateItem
from services.common.security.audit import AUDIT_LOGGER
from tests.integration.test_bridges_slurm import exports
from tests.integration.test_quota_bridges import (
    JOB,
    KUEUE_AS_TEAM_C,
    OUR_CHECK,
    gpu_claim,
    kueue_placer,
    kueue_settings,
)
from tests.security_fixtures import KUEUE_SUBJECT, SecuredFleet, policy_with, secured_fleet
from tests.unit.bridges.support import ROOT, documents

pytestmark = pytest.mark.timeout(180)

V2 = "kueue.x-k8s.io/v1beta2"
QUEUE = "gpus"  # every namespace's LocalQueue
H100_JOB = [
    d for d in documents(ROOT / "examples" / "bridges" / "kueue" / "h100-nvlink-job.yml")
    if d["kind"] == "Job"
][0]  # fmt: skip
FLAVORS = documents(ROOT / "examples" / "security" / "kueue" / "flavors.yml")  # hopper, ada


def cluster_queue(
    name: str, flavors: list[dict[str, Any]], cohort: str = "", **preemption: str
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": flavors}],
        "admissionChecksStrategy": {"admissionChecks": [{"name": "gpualloc"}]},
    }
    if cohort:
        spec["cohortName"] = cohort
    if preemption:
        spec["preemption"] = preemption
    return {"apiVersion": V2, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def flavor(name: str, nominal: int, **limits: int) -> dict[str, Any]:
    return {"name": name, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": nominal,
                                         **limits}]}  # fmt: skip


def local_queue(namespace: str, cluster: str) -> dict[str, Any]:
    return {
        "apiVersion": V2,
        "kind": "LocalQueue",
        "metadata": {"namespace": namespace, "name": QUEUE},
        "spec": {"clusterQueue": cluster},
    }


# team-a alone; team-b and hpc share the cohort `shared`, where team-b lends nothing and may
# borrow hpc's idle hopper GPUs, which hpc reclaims; team-c is a ClusterQueue the sidecar is
# not let act for
KUEUE_OBJECTS: list[dict[str, Any]] = [
    *FLAVORS,
    cluster_queue("team-a", [flavor("hopper", 4)]),
    cluster_queue("team-b", [flavor("hopper", 4, lendingLimit=0)], cohort="shared"),
    cluster_queue("team-c", [flavor("hopper", 4)]),
    cluster_queue(
        "hpc", [flavor("hopper", 8), flavor("ada", 4)], "shared", reclaimWithinCohort="Any"
    ),
    *(local_queue(q, q) for q in ("team-a", "team-b", "team-c", "hpc")),
]
SECTION = f"""\
  quota:
    kueue:
      objects: {json.dumps([*KUEUE_OBJECTS, *documents(OUR_CHECK)])}
  tenants:
  - name: tools
    allowAdminAccess: true
"""
ACTING = '    roles: [scheduler]\n    actFor: ["kueue/*"]\n    actForTenants: [team-a, team-b, hpc]'
POLICY = policy_with(SECTION).replace(KUEUE_AS_TEAM_C, ACTING)
assert ACTING in POLICY, "tests/security_fixtures.py's kueue binding changed"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredFleet]:
    with secured_fleet(tmp_path_factory.mktemp("pki-kueue-tenants"), policy=POLICY) as made:
        yield made


@pytest.fixture(autouse=True)
def nothing_held(fleet: SecuredFleet) -> Iterator[None]:
    yield
    admin = allocator_pb2_grpc.AllocatorStub(fleet.channel("admin"))
    for held in admin.ListReservations(pb.ListReservationsRequest(), timeout=10).reservations:
        admin.Release(pb.ReleaseRequest(reservation_id=held.id), timeout=10)


def kueue() -> MemoryKueueApi:
    """Kueue running the policy's objects, gpualloc's AdmissionCheck among them."""
    api = MemoryKueueApi()
    for document in [*documents(OUR_CHECK), *copy.deepcopy(KUEUE_OBJECTS)]:
        api.apply(document)
    return api


def submit(api: MemoryKueueApi, namespace: str, name: str, *, h100: bool = True) -> str:
    """A Workload of 4 GPUs in `namespace`'s LocalQueue (4 NVLinked H100s, or any model)."""
    job = copy.deepcopy(H100_JOB)
    job["metadata"] |= {"namespace": namespace, "name": name}
    job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = QUEUE
    if not h100:
        template = job["spec"]["template"]
        del template["metadata"]["annotations"]["gpualloc.io/nvlink"]
        del template["spec"]["nodeSelector"]
    return str(api.apply(workload_for_job(job, name=name))["metadata"]["name"])


def check_of(api: MemoryKueueApi, namespace: str, name: str) -> AdmissionCheckState:
    found = Workload.from_dict(api.get("Workload", namespace, name)).check("gpualloc")
    assert found is not None
    return found


def used(fleet: SecuredFleet) -> dict[tuple[str, str], str]:
    admin = allocator_pb2_grpc.AllocatorStub(fleet.channel("admin"))
    quotas = admin.QuotaStatus(pb.QuotaStatusRequest(), timeout=10).tenants
    return {(q.tenant, q.resource): q.used for q in quotas if q.used != "0"}


def owners(fleet: SecuredFleet) -> list[str]:
    admin = allocator_pb2_grpc.AllocatorStub(fleet.channel("admin"))
    listed = admin.ListReservations(pb.ListReservationsRequest(), timeout=10).reservations
    return sorted(r.owner for r in listed)


def test_a_sidecar_acting_for_two_cluster_queues_charges_each_its_own_quota(
    fleet: SecuredFleet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One sidecar, Workloads of three ClusterQueues in one pass: team-a's first 4 H100s and
    team-b's 4 are Ready, each held as `<its ClusterQueue>/kueue/...` and charged to its own
    quota; team-a's second Workload goes to Retry on team-a's quota (hopper, 4 of 4) while the
    fleet has H100s idle and team-b's quota is untouched by it; team-c's, a tenant the policy
    does not let the sidecar act for, goes to Retry with the policy's reason. The audit trail
    names the sidecar's identity and the tenant acted for. Admitted, each is committed in its
    own tenant; finished, released there."""
    api = kueue()
    for namespace, name in (("team-a", "a1"), ("team-b", "b1"), ("team-a", "a2"), ("team-c", "c1")):
        submit(api, namespace, name)
    stand_in = KueueStandIn(api)
    with kueue_placer(kueue_settings(fleet, tmp_path / "token")) as placer:
        controller = AdmissionController(
            api, placer, lease_ttl_seconds=60, tenants=TenantMode.CLUSTER_QUEUE
        )
        stand_in.step()  # Kueue reserves its own quota: every check Pending
        with caplog.at_level(logging.INFO, logger=AUDIT_LOGGER):
            controller.reconcile_all()
        assert check_of(api, "team-a", "a1").state is CheckState.READY
        assert check_of(api, "team-b", "b1").state is CheckState.READY
        refused = check_of(api, "team-a", "a2")
        assert refused.state is CheckState.RETRY, refused
        assert "quota" in refused.message and "nvidia.com/gpu/hopper" in refused.message
        assert "team-a" in refused.message
        denied = check_of(api, "team-c", "c1")
        assert denied.state is CheckState.RETRY, denied
        assert "acting for tenant team-c (the Workload's ClusterQueue)" in denied.message
        assert "may not act for tenant 'team-c'" in denied.message
        assert owners(fleet) == ["team-a/kueue/team-a/a1", "team-b/kueue/team-b/b1"]
        assert used(fleet) == {
            ("team-a", "nvidia.com/gpu/hopper"): "4",
            ("team-b", "nvidia.com/gpu/hopper"): "4",
        }
        grants = [r for r in caplog.records if r.getMessage() == "reservation.grant"]
        assert {(g.tenant, g.owner) for g in grants} == {  # type: ignore[attr-defined]
            ("team-a", "team-a/kueue/team-a/a1"),
            ("team-b", "team-b/kueue/team-b/b1"),
        }
        for grant in grants:
            assert KUEUE_SUBJECT in grant.identity  # type: ignore[attr-defined]
            assert grant.acts_for_tenant is True  # type: ignore[attr-defined]
            assert grant.identity_tenant == ""  # type: ignore[attr-defined]
        denials = [r for r in caplog.records if r.getMessage() == "call.denied"]
        assert denials and all("team-c" in d.reason for d in denials)  # type: ignore[attr-defined]

        # reads follow the tenant acted for: its own tenant's in full, nothing else's
        as_team_a = placer.client.for_tenant("team-a").list()
        assert sorted(r.owner for r in as_team_a if r.owner) == ["team-a/kueue/team-a/a1"]
        assert not [r for r in placer.client.list() if r.owner]  # no tenant of its own

        stand_in.step()  # Ready: Kueue admits a1 and b1 (and requeues a2 and c1)
        decisions = {d.workload: d.action for d in controller.reconcile_all()}
        assert decisions["team-a/a1"] == decisions["team-b/b1"] == "committed"
        stand_in.finish("team-b", "b1")
        decisions = {d.workload: d.action for d in controller.reconcile_all()}
        assert decisions["team-b/b1"] == "released"
        assert owners(fleet) == ["team-a/kueue/team-a/a1"]


def test_a_call_naming_a_tenant_it_may_not_act_for_is_denied(fleet: SecuredFleet) -> None:
    """Over the wire: the Slurm bridge (bound to hpc, no actForTenants) naming team-a, and the
    sidecar's token naming team-c, are PERMISSION_DENIED with the policy's reason; the
    sidecar naming team-a reserves as team-a."""
    bridge = allocator_pb2_grpc.AllocatorStub(fleet.channel("slurm-bridge"))
    request = pb.AllocateRequest(claims=[gpu_claim(1)], reserve=True, owner="slurm/job/1")
    with pytest.raises(grpc.RpcError) as caught:
        bridge.Allocate(request, timeout=10, metadata=(("x-gpualloc-tenant", "team-a"),))
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "may not act for tenant 'team-a' (the policy's actForTenants let it act for: none; " \
        "its own is hpc)" in str(caught.value.details())  # fmt: skip

    sidecar = allocator_pb2_grpc.AllocatorStub(fleet.token_channel())
    token = ("authorization", f"Bearer {fleet.token()}")
    request = pb.AllocateRequest(claims=[gpu_claim(1)], reserve=True, owner="kueue/ns/w")
    with pytest.raises(grpc.RpcError) as caught:
        sidecar.Allocate(request, timeout=10, metadata=(token, ("x-gpualloc-tenant", "team-c")))
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "may not act for tenant 'team-c' (the policy's actForTenants let it act for: hpc, " \
        "team-a, team-b; it has none)" in str(caught.value.details())  # fmt: skip
    with pytest.raises(grpc.RpcError) as caught:  # no tenant named: it has none to hold in
        sidecar.Allocate(request, timeout=10, metadata=(token,))
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    answer = sidecar.Allocate(
        request, timeout=10, metadata=(token, ("x-gpualloc-tenant", "team-a"))
    )
    assert answer.outcome == pb.OUTCOME_ALLOCATED
    assert [r.owner for r in answer.reservations] == ["team-a/kueue/ns/w"]


def test_a_preemption_wakes_the_sidecar_through_the_watch_of_the_tenant_it_acts_for(
    fleet: SecuredFleet, tmp_path: Path
) -> None:
    """team-b's Workload of 8 H100s (4 of them borrowed from hpc in their cohort) is admitted;
    hpc reclaims 4 GPUs (Allocate with preemption as the Slurm bridge's identity), which
    revokes it. The running controller, woken by team-b's WatchReservations stream (it watches
    each tenant it acts for; a pass a minute otherwise), sends it to Retry naming hpc."""
    api = kueue()
    job = copy.deepcopy(H100_JOB)
    job["metadata"] |= {"namespace": "team-b", "name": "big"}
    job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = QUEUE
    for where in ("requests", "limits"):
        job["spec"]["template"]["spec"]["containers"][0]["resources"][where]["nvidia.com/gpu"] = 8
    api.apply(workload_for_job(job, name="big"))
    stand_in = KueueStandIn(api)
    with kueue_placer(kueue_settings(fleet, tmp_path / "token")) as placer:
        controller = AdmissionController(
            api, placer, lease_ttl_seconds=60, tenants=TenantMode.CLUSTER_QUEUE
        )
        stand_in.step()
        controller.reconcile_all()
        assert check_of(api, "team-b", "big").state is CheckState.READY
        stand_in.step()
        assert {d.action for d in controller.reconcile_all()} == {"committed"}
        assert used(fleet) == {("team-b", "nvidia.com/gpu/hopper"): "8"}
        stop = threading.Event()
        running = threading.Thread(target=controller.run, args=(stop, 60.0), daemon=True)
        running.start()
        deadline = time.monotonic() + 10
        while controller.watching_tenants() != {"", "team-a", "team-b", "hpc"}:
            assert time.monotonic() < deadline, controller.watching_tenants()
            time.sleep(0.01)
        hpc = allocator_pb2_grpc.AllocatorStub(fleet.channel("slurm-bridge"))
        request = pb.AllocateRequest(
            claims=[gpu_claim(8)], reserve=True, preempt=True, owner="slurm/job/9"
        )
        answer = hpc.Allocate(request, timeout=20)
        preempted = time.monotonic()
        assert answer.outcome == pb.OUTCOME_ALLOCATED
        assert [v.reason for v in answer.preemption.victims] == ["reclaim"]
        while (
            check_of(api, "team-b", "big").state is not CheckState.RETRY
            and time.monotonic() < preempted + 5
        ):
            time.sleep(0.01)
        after = time.monotonic() - preempted
        retried = check_of(api, "team-b", "big")
        stop.set()
        stopped_by = time.monotonic() + 10
        while running.is_alive() and time.monotonic() < stopped_by:
            api.apply(api.get("Workload", "team-b", "big"))  # the loop's wait ends
            running.join(timeout=0.1)
        assert not running.is_alive()
    print(f"\nteam-b's Workload went back to Retry {after * 1000:.0f} ms after the grant")
    assert retried.state is CheckState.RETRY and after < 5, retried
    assert "was preempted by tenant hpc" in retried.message
    assert owners(fleet) == ["hpc/slurm/job/9"]


def slurm(fleet: SecuredFleet, job: dict[str, str], *argv: str) -> tuple[int, str, str]:
    """The Slurm bridge's hook (bound to hpc) for a job."""
    out, err = io.StringIO(), io.StringIO()
    environ = {**fleet.client_environ("slurm-bridge"), **JOB, **job}
    code = slurm_cli.main(list(argv), environ, out, err)
    return code, out.getvalue(), err.getvalue()


def test_one_cluster_queues_slurm_and_kueue_work_share_one_flavored_quota(
    fleet: SecuredFleet, tmp_path: Path
) -> None:
    """ClusterQueue hpc (hopper 8, ada 4; its cohort lends it nothing) is the Slurm bridge's
    tenant and, through the sidecar acting for it, its Kueue Workloads'. Slurm job 7001's
    prolog takes 8 H100s: hopper is spent. The stand-in, as Kueue's own count (which sees no
    Slurm job) would, assigns hopper to a Workload of hpc asking for 4 GPUs of any model:
    gpualloc keeps to Kueue's flavor (the pods will carry hopper's nodeLabels) and refuses it
    on hpc's hopper quota (Retry), although h100-node-2 is idle and ada would fit. The stand-in
    is then scripted to assign ada (a real Kueue does so only once the Slurm grant is mirrored:
    tests/e2e/test_kueue_real.py::test_with_mirrors_a_real_kueue_assigns_the_next_flavor_while_slurm_holds_the_first;
    without mirrors it assigns hopper again), and gpualloc places it on the L40S node, charged
    to ada. A Workload of 4 H100s, assigned hopper, waits (Retry) until job 7001's epilog frees
    hopper; requeued, it is placed on an H100 node."""
    code, out, err = slurm(fleet, {}, "prolog")
    assert code == 0, err
    assert len(exports(out)["CUDA_VISIBLE_DEVICES"].split(",")) == 8
    api = kueue()
    submit(api, "hpc", "any-model", h100=False)
    submit(api, "hpc", "h100s")
    stand_in = KueueStandIn(api)
    hopper, ada = {"nvidia.com/gpu": "hopper"}, {"nvidia.com/gpu": "ada"}
    stand_in.flavors |= {"hpc/any-model": hopper, "hpc/h100s": hopper}
    with kueue_placer(kueue_settings(fleet, tmp_path / "token")) as placer:
        controller = AdmissionController(
            api, placer, lease_ttl_seconds=60, tenants=TenantMode.CLUSTER_QUEUE
        )
        stand_in.step()  # Kueue reserves its quota, both on hopper
        controller.reconcile_all()
        for name in ("any-model", "h100s"):
            refused = check_of(api, "hpc", name)
            assert refused.state is CheckState.RETRY, refused
            assert "nvidia.com/gpu/hopper" in refused.message and "hpc" in refused.message
        assert owners(fleet) == ["hpc/slurm/job/7001"]

        stand_in.flavors["hpc/any-model"] = ada  # scripted: the real Kueue needs mirrors
        stand_in.step()  # Retry: Kueue requeues both
        stand_in.step()  # and reserves quota again
        controller.reconcile_all()
        fallen_back = check_of(api, "hpc", "any-model")
        assert fallen_back.state is CheckState.READY, fallen_back
        (update,) = fallen_back.pod_set_updates
        assert update.node_selector["kubernetes.io/hostname"] == "l40s-node-1"
        assert check_of(api, "hpc", "h100s").state is CheckState.RETRY  # hopper: waits
        assert owners(fleet) == ["hpc/kueue/hpc/any-model", "hpc/slurm/job/7001"]
        assert used(fleet) == {
            ("hpc", "nvidia.com/gpu/hopper"): "8",
            ("hpc", "nvidia.com/gpu/ada"): "4",
        }

        code, _, err = slurm(fleet, {}, "epilog")  # job 7001 ends: hopper is free again
        assert code == 0, err
        stand_in.step()  # Retry: Kueue requeues h100s
        stand_in.step()  # and reserves its quota again, on hopper
        controller.reconcile_all()
        placed = check_of(api, "hpc", "h100s")
        assert placed.state is CheckState.READY, placed
        (update,) = placed.pod_set_updates
        assert update.node_selector["kubernetes.io/hostname"].startswith("h100-node-")
        assert used(fleet) == {
            ("hpc", "nvidia.com/gpu/hopper"): "4",
            ("hpc", "nvidia.com/gpu/ada"): "4",
        }


def test_without_a_flavor_from_kueue_gpualloc_chooses_the_flavor(
    fleet: SecuredFleet, tmp_path: Path
) -> None:
    """A Workload whose admission names no flavors (an older Kueue, a stand-in) is placed by
    gpualloc's own flavor search: with hpc's hopper spent by Slurm job 7001, 4 GPUs of any
    model go to ada, the L40S node."""
    code, _, err = slurm(fleet, {}, "prolog")
    assert code == 0, err
    api = kueue()
    submit(api, "hpc", "any-model", h100=False)
    with kueue_placer(kueue_settings(fleet, tmp_path / "token")) as placer:
        controller = AdmissionController(
            api, placer, lease_ttl_seconds=60, tenants=TenantMode.CLUSTER_QUEUE
        )
        KueueStandIn(api).step()
        controller.reconcile_all()
        placed = check_of(api, "hpc", "any-model")
        assert placed.state is CheckState.READY, placed
        (update,) = placed.pod_set_updates
        assert update.node_selector["kubernetes.io/hostname"] == "l40s-node-1"
    code, _, err = slurm(fleet, {}, "epilog")
    assert code == 0, err


def test_a_flavor_kueue_assigned_that_is_gone_sends_the_workload_to_retry(
    fleet: SecuredFleet, tmp_path: Path
) -> None:
    api = kueue()
    submit(api, "team-a", "a1")
    stand_in = KueueStandIn(api)
    stand_in.flavors["team-a/a1"] = {"nvidia.com/gpu": "deleted-meanwhile"}
    with kueue_placer(kueue_settings(fleet, tmp_path / "token")) as placer:
        controller = AdmissionController(
            api, placer, lease_ttl_seconds=60, tenants=TenantMode.CLUSTER_QUEUE
        )
        stand_in.step()
        controller.reconcile_all()
        retried = check_of(api, "team-a", "a1")
    assert retried.state is CheckState.RETRY, retried
    assert "ResourceFlavor deleted-meanwhile, which Kueue assigned, is gone" in retried.message
    assert owners(fleet) == []


def test_an_allocate_batch_is_the_tenant_its_call_names(fleet: SecuredFleet, tmp_path: Path):
    """AllocateBatch is one call, so one tenant's: the sidecar's batch acting for team-a
    (hopper 4, no cohort) reserves as team-a, its items charged to team-a's quota, and the
    fifth GPU is that item's own QUOTA_EXCEEDED while the call succeeds."""
    claims = [claim_from_spec("1 x H100", name="gpu")]
    items = [
        AllocateItem(claims, reserve=True, owner=f"kueue/team-a/w{i}", idempotency_key=f"a-{i}")
        for i in range(5)
    ]
    with kueue_placer(kueue_settings(fleet, tmp_path / "token")) as placer:
        answers = placer.client.for_tenant("team-a").allocate_many(items)
    placed = [a for a in answers if isinstance(a, Placement) and a.fits]
    assert len(placed) == 4
    refused = answers[4]
    assert isinstance(refused, Placement) and refused.outcome is Outcome.QUOTA_EXCEEDED
    assert owners(fleet) == [f"team-a/kueue/team-a/w{i}" for i in range(4)]
    assert used(fleet) == {("team-a", "nvidia.com/gpu/hopper"): "4"}


# team-a lists the label-less gpu-flavor (every GPU: the Kueue bridge example's) before hopper
CATCH_ALL = {"apiVersion": V2, "kind": "ResourceFlavor", "metadata": {"name": "gpu-flavor"}}
CATCH_ALL_FIRST: list[dict[str, Any]] = [
    CATCH_ALL,
    *(f for f in FLAVORS if f["metadata"]["name"] == "hopper"),
    cluster_queue("team-a", [flavor("gpu-flavor", 2), flavor("hopper", 4)]),
    local_queue("team-a", "team-a"),
]


def test_a_workload_kueue_admits_on_the_labelled_flavor_after_a_catch_all_is_charged_there(
    tmp_path: Path,
) -> None:
    """ClusterQueue team-a lists gpu-flavor (no nodeLabels, nominal 2) before hopper (nominal
    4). Its gpu-flavor quota is spent (2 L40Ss through the API); Kueue admits a Workload of 4
    H100s on hopper, and the sidecar places it on hopper's nodes: gpualloc's flavor search
    falls past gpu-flavor (it could never grant 4) to hopper and charges the grant there, the
    flavor it assigned, as Kueue counts it (charged to the first flavor that selects an H100,
    gpu-flavor, it was refused and the Workload waited in Retry)."""
    section = SECTION.replace(
        json.dumps([*KUEUE_OBJECTS, *documents(OUR_CHECK)]),
        json.dumps([*CATCH_ALL_FIRST, *documents(OUR_CHECK)]),
    ) + "".join(f"  - name: {name}\n" for name in ("team-b", "team-c", "hpc"))  # not limited
    policy = policy_with(section).replace(KUEUE_AS_TEAM_C, ACTING)
    with secured_fleet(tmp_path / "pki", policy=policy) as made:
        api_a = allocator_pb2_grpc.AllocatorStub(made.channel("scheduler-a"))
        request = pb.AllocateRequest(
            claims=[gpu_claim(2)], reserve=True, owner="job/l40s", node_name="l40s-node-1"
        )
        spent = api_a.Allocate(request, timeout=30)
        assert spent.outcome == pb.OUTCOME_ALLOCATED, spent.quota_refusals
        api = MemoryKueueApi()
        for document in [*documents(OUR_CHECK), *copy.deepcopy(CATCH_ALL_FIRST)]:
            api.apply(document)
        submit(api, "team-a", "h100s")
        stand_in = KueueStandIn(api)
        stand_in.flavors["team-a/h100s"] = {"nvidia.com/gpu": "hopper"}
        with kueue_placer(kueue_settings(made, tmp_path / "token")) as placer:
            controller = AdmissionController(
                api, placer, lease_ttl_seconds=60, tenants=TenantMode.CLUSTER_QUEUE
            )
            stand_in.step()  # Kueue reserves its quota on hopper
            controller.reconcile_all()
            placed = check_of(api, "team-a", "h100s")
            assert placed.state is CheckState.READY, placed
            (update,) = placed.pod_set_updates
            assert update.node_selector["kubernetes.io/hostname"].startswith("h100-node-")
            assert used(made) == {
                ("team-a", "nvidia.com/gpu/gpu-flavor"): "2",
                ("team-a", "nvidia.com/gpu/hopper"): "4",
            }
