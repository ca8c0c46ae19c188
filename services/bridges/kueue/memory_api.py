"""`MemoryKueueApi`: the KueueApi port over objects held in memory, plus a stand-in for Kueue.

Used by the controller's tests and by `make demo`, where no API server runs. Objects are
stored as the JSON dicts `kubectl get -o json` shows (apply Kueue's own manifests as they are).

No Kueue runs here either, so `KueueStandIn` plays the part of Kueue's own controllers, as
Kueue's admission-check documentation describes them (site/content/en/docs/concepts/
admission_check/_index.md):

- quota reservation: status.admission.clusterQueue, condition QuotaReserved=True, and a
  `Pending` entry in status.admissionChecks for each check of the ClusterQueue (Kueue's quota
  arithmetic itself is not modelled: every reservation asked for is granted);
- all checks `Ready` -> condition Admitted=True;
- a check in `Retry` -> the quota is released and the checks go back to `Pending`;
- a check `Rejected` -> the Workload is deactivated (spec.active=false), quota released;
- finish / evict / delete as a job's end, a preemption, or `kubectl delete` would.
"""

from __future__ import annotations

import copy
import threading
import uuid as uuid_module
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from services.bridges.kueue.objects import CheckState, ClusterQueue
from services.common.errors import NotFound

__all__ = ["QUEUE_LABEL", "KueueStandIn", "MemoryKueueApi", "workload_for_job"]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

KubeObject = dict[str, Any]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _set_condition(obj: KubeObject, kind: str, status: bool, reason: str, message: str) -> None:
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    wanted = {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": _now(),
    }
    for i, condition in enumerate(conditions):
        if condition.get("type") == kind:
            if condition.get("status") == wanted["status"]:
                wanted["lastTransitionTime"] = condition.get(
                    "lastTransitionTime", wanted["lastTransitionTime"]
                )
            conditions[i] = wanted
            return
    conditions.append(wanted)


class MemoryKueueApi:
    """The port over dicts; thread-safe; `version` counts changes (for wait_for_change)."""

    def __init__(self) -> None:
        self._objects: dict[tuple[str, str, str], KubeObject] = {}
        self._changed = threading.Condition()
        self.version = 0
        self.state_writes = 0

    # --- the store ----------------------------------------------------------------------------

    def apply(self, obj: Mapping[str, Any]) -> KubeObject:
        """Add or replace an object (a Workload without a uid gets one)."""
        stored = copy.deepcopy(dict(obj))
        metadata = stored.setdefault("metadata", {})
        if stored.get("kind") == "Workload":
            metadata.setdefault("uid", str(uuid_module.uuid4()))
            metadata.setdefault("namespace", "default")
        with self._changed:
            self._objects[self._key(stored)] = stored
            self._touch()
        return copy.deepcopy(stored)

    def delete(self, kind: str, namespace: str, name: str) -> None:
        with self._changed:
            self._objects.pop((kind, namespace, name), None)
            self._touch()

    def get(self, kind: str, namespace: str, name: str) -> KubeObject:
        with self._changed:
            found = self._objects.get((kind, namespace, name))
            if found is None:
                raise NotFound(f"{kind} {namespace}/{name} not found")
            return copy.deepcopy(found)

    def update(self, kind: str, namespace: str, name: str, change: Any) -> None:
        """Run `change(obj)` on the stored object, under the lock."""
        with self._changed:
            found = self._objects.get((kind, namespace, name))
            if found is None:
                raise NotFound(f"{kind} {namespace}/{name} not found")
            change(found)
            self._touch()

    @staticmethod
    def _key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
        metadata = obj.get("metadata") or {}
        return (str(obj.get("kind")), str(metadata.get("namespace") or ""), str(metadata["name"]))

    def _touch(self) -> None:
        self.version += 1
        self._changed.notify_all()

    def _list(self, kind: str) -> list[KubeObject]:
        with self._changed:
            return [copy.deepcopy(o) for (k, _, _), o in sorted(self._objects.items()) if k == kind]

    # --- KueueApi -----------------------------------------------------------------------------

    def list_admission_checks(self) -> list[KubeObject]:
        return self._list("AdmissionCheck")

    def list_cluster_queues(self) -> list[KubeObject]:
        return self._list("ClusterQueue")

    def list_workloads(self) -> list[KubeObject]:
        return self._list("Workload")

    def get_resource_flavor(self, name: str) -> KubeObject | None:
        with self._changed:
            found = self._objects.get(("ResourceFlavor", "", name))
            return copy.deepcopy(found) if found is not None else None

    def get_resource_claim_template(self, namespace: str, name: str) -> KubeObject | None:
        with self._changed:
            found = self._objects.get(("ResourceClaimTemplate", namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def set_admission_check_state(
        self, namespace: str, workload: str, state: Mapping[str, Any]
    ) -> None:
        def merge(obj: KubeObject) -> None:
            checks = obj.setdefault("status", {}).setdefault("admissionChecks", [])
            for i, check in enumerate(checks):
                if check.get("name") == state["name"]:
                    checks[i] = dict(state)
                    return
            checks.append(dict(state))

        self.update("Workload", namespace, workload, merge)
        self.state_writes += 1

    def set_admission_check_active(self, name: str, message: str) -> None:
        self.update(
            "AdmissionCheck",
            "",
            name,
            lambda o: _set_condition(o, "Active", True, "Active", message),
        )

    def apply_namespaced(self, obj: Mapping[str, Any]) -> None:
        key = self._key(obj)
        with self._changed:
            existing = self._objects.get(key)
        if existing is None or existing.get("spec") != obj.get("spec"):
            self.apply(obj)

    def delete_workload(self, namespace: str, name: str) -> None:
        self.delete("Workload", namespace, name)

    def wait_for_change(self, timeout_seconds: float) -> bool:
        with self._changed:
            seen = self.version
            return self._changed.wait_for(lambda: self.version != seen, timeout_seconds)


class KueueStandIn:
    """What Kueue's own controllers would do to Workloads (see the module docstring)."""

    def __init__(self, api: MemoryKueueApi) -> None:
        self.api = api
        # Workload key -> the flavor Kueue's flavor assigner would give each resource, as a
        # test says (the stand-in counts no quota of its own); none: no flavors assigned
        self.flavors: dict[str, Mapping[str, str]] = {}

    def cluster_queue_of(self, workload: Mapping[str, Any]) -> ClusterQueue:
        namespace = workload["metadata"].get("namespace", "default")
        queue = workload.get("spec", {}).get("queueName", "")
        local = self.api.get("LocalQueue", namespace, queue)
        name = local["spec"]["clusterQueue"]
        return ClusterQueue.from_dict(self.api.get("ClusterQueue", "", name))

    def reserve_quota(self, namespace: str, name: str) -> None:
        workload = self.api.get("Workload", namespace, name)
        queue = self.cluster_queue_of(workload)

        def reserve(obj: KubeObject) -> None:
            status = obj.setdefault("status", {})
            flavors = self.flavors.get(f"{namespace}/{name}")
            status["admission"] = {
                "clusterQueue": queue.name,
                "podSetAssignments": [
                    {
                        "name": p.get("name", "main"),
                        "count": p.get("count", 1),
                        **({"flavors": dict(flavors)} if flavors else {}),
                    }
                    for p in obj.get("spec", {}).get("podSets", [])
                ],
            }
            _set_condition(
                obj,
                "QuotaReserved",
                True,
                "QuotaReserved",
                f"Quota reserved in ClusterQueue {queue.name}",
            )
            status["admissionChecks"] = [
                {"name": check, "state": "Pending", "message": "", "lastTransitionTime": _now()}
                for check in queue.admission_checks
            ]

        self.api.update("Workload", namespace, name, reserve)

    def step(self, *, reserve: bool = True) -> None:
        """One pass of Kueue over every Workload: reserve quota for active pending ones (when
        `reserve`), admit those whose checks are all Ready, requeue Retry, deactivate Rejected."""
        for workload in self.api.list_workloads():
            metadata = workload["metadata"]
            namespace, name = metadata.get("namespace", "default"), metadata["name"]
            status = workload.get("status", {})
            conditions = {c["type"]: c["status"] == "True" for c in status.get("conditions", [])}
            states = [
                CheckState(c.get("state", "Pending")) for c in status.get("admissionChecks", [])
            ]
            if conditions.get("Finished") or workload.get("spec", {}).get("active") is False:
                continue
            if CheckState.REJECTED in states:
                self.api.update("Workload", namespace, name, _deactivate)
            elif CheckState.RETRY in states:
                self.api.update("Workload", namespace, name, _requeue)
            elif conditions.get("QuotaReserved"):
                if not conditions.get("Admitted") and all(s is CheckState.READY for s in states):
                    self.api.update(
                        "Workload",
                        namespace,
                        name,
                        lambda o: _set_condition(
                            o, "Admitted", True, "Admitted", "The workload is admitted"
                        ),
                    )
            elif reserve:
                self.reserve_quota(namespace, name)

    def finish(self, namespace: str, name: str) -> None:
        self.api.update(
            "Workload",
            namespace,
            name,
            lambda o: _set_condition(o, "Finished", True, "Succeeded", "Job finished successfully"),
        )

    def evict(self, namespace: str, name: str) -> None:
        def evict(obj: KubeObject) -> None:
            _set_condition(
                obj,
                "Evicted",
                True,
                "Preempted",
                "Preempted to accommodate a higher priority Workload",
            )
            _release_quota(obj)

        self.api.update("Workload", namespace, name, evict)


def workload_for_job(job: Mapping[str, Any], *, name: str = "") -> KubeObject:
    """The Workload Kueue's batch/v1 Job integration makes for a Job (pkg/controller/jobs/job:
    one pod set `main`, count = parallelism, the Job's pod template; the queue from the
    `kueue.x-k8s.io/queue-name` label; named `job-<job name>-<hash>`)."""
    metadata = job.get("metadata") or {}
    job_name = metadata.get("name") or str(metadata.get("generateName", "job-")).rstrip("-")
    spec = job.get("spec") or {}
    digest = uuid_module.uuid5(uuid_module.NAMESPACE_URL, f"{job_name}/{name}").hex[:5]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": name or f"job-{job_name}-{digest}",
            "namespace": metadata.get("namespace", "default"),
            "labels": {"kueue.x-k8s.io/job-uid": digest},
        },
        "spec": {
            "active": True,
            "queueName": (metadata.get("labels") or {}).get(QUEUE_LABEL, ""),
            "podSets": [
                {
                    "name": "main",
                    "count": int(spec.get("parallelism", 1)),
                    "template": copy.deepcopy(spec.get("template") or {}),
                }
            ],
        },
    }


def _release_quota(obj: KubeObject) -> None:
    status = obj.setdefault("status", {})
    status.pop("admission", None)
    _set_condition(obj, "QuotaReserved", False, "Pending", "The workload has no reservation")
    _set_condition(obj, "Admitted", False, "NoReservation", "The workload has no reservation")


def _requeue(obj: KubeObject) -> None:
    _release_quota(obj)
    for check in obj["status"].get("admissionChecks", []):
        if check.get("state") == "Retry":
            check["retryCount"] = int(check.get("retryCount", 0)) + 1
        check["state"] = "Pending"


def _deactivate(obj: KubeObject) -> None:
    obj.setdefault("spec", {})["active"] = False
    _release_quota(obj)
    _set_condition(obj, "Evicted", True, "Deactivated", "The workload is deactivated")
