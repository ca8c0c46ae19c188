"""Kueue's objects, read from Kueue's own manifests, and the in-memory port over them."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from services.bridges.kueue.memory_api import KueueStandIn, MemoryKueueApi, workload_for_job
from services.bridges.kueue.objects import (
    AdmissionCheck,
    AdmissionCheckState,
    CheckState,
    ClusterQueue,
    PodSetUpdate,
    Workload,
)
from services.common.errors import InvalidArgument
from tests.unit.bridges.support import DATA, documents

KUEUE = DATA / "kueue"


def of_kind(name: str, kind: str) -> list[dict[str, Any]]:
    return [d for d in documents(KUEUE / name) if d["kind"] == kind]


@pytest.mark.parametrize(
    ("file", "expected"),
    [
        pytest.param("provisioning-setup.yaml", ("cluster-queue", ("sample-prov",)), id="strategy"),
        pytest.param("sample-gpu-queues.yaml", ("tas-cluster-queue", ()), id="no-checks"),
    ],
)
def test_cluster_queue_checks(file, expected):
    (queue,) = [ClusterQueue.from_dict(d) for d in of_kind(file, "ClusterQueue")]
    assert (queue.name, queue.admission_checks) == expected


def test_cluster_queue_list_form():
    queue = ClusterQueue.from_dict(
        {"kind": "ClusterQueue", "metadata": {"name": "q"}, "spec": {"admissionChecks": ["a", "b"]}}
    )
    assert queue.admission_checks == ("a", "b")


@pytest.mark.parametrize(
    ("file", "controller"),
    [
        pytest.param("sample-admission-check.yaml", "ProvisioningRequestController", id="sample"),
        pytest.param("provisioning-setup.yaml", "kueue.x-k8s.io/provisioning-request", id="setup"),
    ],
)
def test_admission_check_controller(file, controller):
    (check,) = [AdmissionCheck.from_dict(d) for d in of_kind(file, "AdmissionCheck")]
    assert check.controller_name == controller and not check.active


def test_documented_workload_with_documented_pending_status():
    (workload_doc,) = documents(KUEUE / "workload-sample-job.yaml")
    (status_doc,) = documents(KUEUE / "workload-status-pending-admission-check.yaml")
    workload = Workload.from_dict({**workload_doc, **status_doc})
    assert (workload.namespace, workload.name) == ("team-a", "sample-job")
    assert [(p.name, p.count) for p in workload.pod_sets] == [("main", 3)]
    assert workload.quota_reserved and not workload.admitted and workload.active
    assert workload.cluster_queue == "dws-cluster-queue"
    assert workload.check("dws-prov") == AdmissionCheckState("dws-prov", CheckState.PENDING)


def test_workload_of_a_documented_job():
    (job,) = documents(KUEUE / "sample-job.yaml")
    workload = Workload.from_dict(workload_for_job(job))
    (pod_set,) = workload.pod_sets
    assert (pod_set.name, pod_set.count) == ("main", 3)
    resources = pod_set.pod_spec["containers"][0]["resources"]
    assert resources["limits"] == {"nvidia.com/gpu": 1}
    assert workload.name.startswith("job-sample-job-")


def test_check_state_writes_round_trip():
    state = AdmissionCheckState(
        "gpualloc", CheckState.READY, "ok", (PodSetUpdate("main", {"kubernetes.io/hostname": "n"}),)
    )
    written = state.to_dict("2026-01-01T00:00:00Z")
    assert written["podSetUpdates"] == [
        {"name": "main", "nodeSelector": {"kubernetes.io/hostname": "n"}}
    ]
    assert AdmissionCheckState.from_dict(written) == state


def test_wrong_kind_is_refused():
    with pytest.raises(InvalidArgument) as raised:
        Workload.from_dict({"kind": "Job", "metadata": {"name": "x"}})
    assert raised.value.field_path == "kind"


def setup_api() -> tuple[MemoryKueueApi, KueueStandIn, str]:
    api = MemoryKueueApi()
    for document in documents(KUEUE / "provisioning-setup.yaml"):
        api.apply(document)
    (job,) = documents(KUEUE / "sample-job.yaml")
    name = api.apply(workload_for_job(job))["metadata"]["name"]
    return api, KueueStandIn(api), name


def test_stand_in_reserves_quota_with_the_queues_checks():
    api, kueue, name = setup_api()
    kueue.step()
    workload = Workload.from_dict(api.get("Workload", "default", name))
    assert workload.quota_reserved and workload.cluster_queue == "cluster-queue"
    assert workload.check("sample-prov") == AdmissionCheckState("sample-prov", CheckState.PENDING)


def test_writing_one_check_leaves_the_others_alone():
    api, kueue, name = setup_api()
    kueue.step()
    api.update(
        "Workload",
        "default",
        name,
        lambda o: o["status"]["admissionChecks"].append(
            {"name": "gpualloc", "state": "Pending", "message": "", "lastTransitionTime": "t"}
        ),
    )
    api.set_admission_check_state(
        "default", name, AdmissionCheckState("gpualloc", CheckState.READY).to_dict("t")
    )
    workload = Workload.from_dict(api.get("Workload", "default", name))
    assert [(c.name, c.state) for c in workload.admission_checks] == [
        ("sample-prov", CheckState.PENDING),
        ("gpualloc", CheckState.READY),
    ]
    kueue.step()  # sample-prov still Pending: not admitted
    assert not Workload.from_dict(api.get("Workload", "default", name)).admitted


@pytest.mark.parametrize(
    ("state", "admitted", "quota", "active"),
    [
        pytest.param("Ready", True, True, True, id="all-ready-admits"),
        pytest.param("Retry", False, False, True, id="retry-releases-quota"),
        pytest.param("Rejected", False, False, False, id="rejected-deactivates"),
    ],
)
def test_stand_in_follows_kueues_documented_rules(state, admitted, quota, active):
    api, kueue, name = setup_api()
    kueue.step()
    api.set_admission_check_state(
        "default", name, AdmissionCheckState("sample-prov", CheckState(state)).to_dict("t")
    )
    kueue.step(reserve=False)
    workload = Workload.from_dict(api.get("Workload", "default", name))
    assert (workload.admitted, workload.quota_reserved, workload.active) == (
        admitted,
        quota,
        active,
    )


def test_wait_for_change_wakes_on_a_write():
    api, _, name = setup_api()
    assert api.wait_for_change(0.01) is False
    timer = threading.Timer(0.05, lambda: api.delete("Workload", "default", name))
    timer.start()
    assert api.wait_for_change(5.0) is True
    timer.join()


def test_admission_check_becomes_active():
    api, _, _ = setup_api()
    api.set_admission_check_active("sample-prov", "ok")
    (check,) = [AdmissionCheck.from_dict(d) for d in api.list_admission_checks()]
    assert check.active


@pytest.mark.parametrize(
    ("assignments", "expected"),
    [
        pytest.param(None, {}, id="no-admission"),
        pytest.param("...", {}, id="not-a-list"),
        pytest.param([{"name": "main", "count": 1}], {}, id="no-flavors-assigned"),
        pytest.param(
            [{"name": "main", "flavors": {"cpu": "default", "nvidia.com/gpu": "hopper"}},
             {"name": "aux", "flavors": {"nvidia.com/gpu": "ada", "memory": "ada"}}],
            {"main": ("default", "hopper"), "aux": ("ada",)},
            id="each-pod-sets-flavors-once-sorted",
        ),
        pytest.param(["main"], {}, id="an-entry-not-a-mapping"),
    ],
)  # fmt: skip
def test_the_flavors_kueue_assigned_each_pod_set(assignments, expected):
    workload = {"kind": "Workload", "metadata": {"name": "w"}, "spec": {}}
    if assignments is not None:
        workload["status"] = {"admission": {"clusterQueue": "q", "podSetAssignments": assignments}}
    assert Workload.from_dict(workload).assigned_flavors == expected
