"""Kueue's objects (kueue.x-k8s.io/v1beta2, as `kubectl get -o json` returns them) as the few
frozen values the admission controller reads.

Only what the controller needs is read; unknown fields are ignored, so newer Kueue versions
keep working. Field names are Kueue's (apis/kueue/v1beta2/workload_types.go,
clusterqueue_types.go, admissioncheck_types.go):

- Workload: metadata (name, namespace, uid, deletionTimestamp), spec.active, spec.podSets[]
  (name, count, template), status.admission.clusterQueue and .podSetAssignments[] (name,
  flavors: the ResourceFlavor Kueue assigned each resource), status.conditions[] (QuotaReserved,
  Admitted, Finished, Evicted), status.admissionChecks[] (name, state, message,
  podSetUpdates[]);
- ClusterQueue: spec.admissionChecks[] or spec.admissionChecksStrategy.admissionChecks[].name;
- AdmissionCheck: spec.controllerName, status.conditions[] (Active).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from services.common.errors import InvalidArgument

__all__ = [
    "GROUP",
    "VERSION",
    "AdmissionCheck",
    "AdmissionCheckState",
    "CheckState",
    "ClusterQueue",
    "PodSet",
    "PodSetUpdate",
    "Workload",
]

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"


class CheckState(StrEnum):
    PENDING = "Pending"
    READY = "Ready"
    RETRY = "Retry"
    REJECTED = "Rejected"


@dataclass(frozen=True)
class PodSetUpdate:
    """What a check asks Kueue to add to a pod set's pods when it admits the Workload."""

    name: str
    node_selector: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name}
        for key, value in (
            ("labels", self.labels),
            ("annotations", self.annotations),
            ("nodeSelector", self.node_selector),
        ):
            if value:
                data[key] = dict(value)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PodSetUpdate:
        return cls(
            name=str(data.get("name", "")),
            node_selector=dict(data.get("nodeSelector") or {}),
            labels=dict(data.get("labels") or {}),
            annotations=dict(data.get("annotations") or {}),
        )


@dataclass(frozen=True)
class AdmissionCheckState:
    """One entry of Workload status.admissionChecks."""

    name: str
    state: CheckState
    message: str = ""
    pod_set_updates: tuple[PodSetUpdate, ...] = ()

    def to_dict(self, last_transition_time: str) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "state": self.state.value,
            "message": self.message,
            "lastTransitionTime": last_transition_time,
        }
        if self.pod_set_updates:
            data["podSetUpdates"] = [u.to_dict() for u in self.pod_set_updates]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AdmissionCheckState:
        try:
            state = CheckState(data.get("state", "Pending"))
        except ValueError:
            state = CheckState.PENDING
        return cls(
            name=str(data.get("name", "")),
            state=state,
            message=str(data.get("message", "")),
            pod_set_updates=tuple(
                PodSetUpdate.from_dict(u) for u in data.get("podSetUpdates") or ()
            ),
        )


@dataclass(frozen=True)
class PodSet:
    """`count` pods from one template (spec.podSets[])."""

    name: str
    count: int
    template: Mapping[str, Any]

    @property
    def pod_spec(self) -> Mapping[str, Any]:
        spec: Mapping[str, Any] = self.template.get("spec") or {}
        return spec

    @property
    def annotations(self) -> Mapping[str, str]:
        metadata: Mapping[str, Any] = self.template.get("metadata") or {}
        return metadata.get("annotations") or {}


def _conditions(status: Mapping[str, Any]) -> dict[str, bool]:
    return {
        str(c.get("type")): str(c.get("status")) == "True"
        for c in status.get("conditions") or ()
        if isinstance(c, Mapping)
    }


def _metadata(data: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    if data.get("kind") != kind:
        raise InvalidArgument.at("kind", f"expected {kind}, got {data.get('kind')!r}")
    metadata: Mapping[str, Any] = data.get("metadata") or {}
    if not metadata.get("name"):
        raise InvalidArgument.at("metadata.name", f"a {kind} needs a name")
    return metadata


def _assigned_flavors(assignments: object) -> dict[str, tuple[str, ...]]:
    """status.admission.podSetAssignments[] as pod set -> its flavors (each once, sorted);
    anything not shaped as Kueue writes it is read as no assignment."""
    found: dict[str, tuple[str, ...]] = {}
    for assignment in assignments if isinstance(assignments, list) else ():
        flavors = assignment.get("flavors") if isinstance(assignment, Mapping) else None
        if isinstance(flavors, Mapping) and flavors:
            name = str(assignment.get("name") or "main")
            found[name] = tuple(sorted({str(f) for f in flavors.values()}))
    return found


@dataclass(frozen=True)
class Workload:
    namespace: str
    name: str
    uid: str
    pod_sets: tuple[PodSet, ...]
    active: bool = True
    deleting: bool = False
    cluster_queue: str = ""
    conditions: Mapping[str, bool] = field(default_factory=dict)
    admission_checks: tuple[AdmissionCheckState, ...] = ()
    created_at: float | None = None  # metadata.creationTimestamp, seconds since the epoch
    # pod set -> the ResourceFlavors Kueue assigned its resources (sorted, each once)
    assigned_flavors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def quota_reserved(self) -> bool:
        return self.conditions.get("QuotaReserved", False)

    @property
    def admitted(self) -> bool:
        return self.conditions.get("Admitted", False)

    @property
    def finished(self) -> bool:
        return self.conditions.get("Finished", False)

    @property
    def evicted(self) -> bool:
        return self.conditions.get("Evicted", False)

    def check(self, name: str) -> AdmissionCheckState | None:
        return next((c for c in self.admission_checks if c.name == name), None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Workload:
        metadata = _metadata(data, "Workload")
        spec: Mapping[str, Any] = data.get("spec") or {}
        status: Mapping[str, Any] = data.get("status") or {}
        admission: Mapping[str, Any] = status.get("admission") or {}
        return cls(
            namespace=str(metadata.get("namespace") or "default"),
            name=str(metadata["name"]),
            uid=str(metadata.get("uid") or ""),
            pod_sets=tuple(
                PodSet(
                    str(p.get("name") or "main"), int(p.get("count", 1)), p.get("template") or {}
                )
                for p in spec.get("podSets") or ()
            ),
            active=spec.get("active", True) is not False,
            deleting=bool(metadata.get("deletionTimestamp")),
            cluster_queue=str(admission.get("clusterQueue") or ""),
            conditions=_conditions(status),
            admission_checks=tuple(
                AdmissionCheckState.from_dict(c) for c in status.get("admissionChecks") or ()
            ),
            created_at=_timestamp(metadata.get("creationTimestamp")),
            assigned_flavors=_assigned_flavors(admission.get("podSetAssignments")),
        )


def _timestamp(value: object) -> float | None:
    """An RFC 3339 time (a Kubernetes object's creationTimestamp) in seconds since the epoch;
    None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class ClusterQueue:
    name: str
    admission_checks: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterQueue:
        metadata = _metadata(data, "ClusterQueue")
        spec: Mapping[str, Any] = data.get("spec") or {}
        names = [str(n) for n in spec.get("admissionChecks") or ()]
        strategy: Mapping[str, Any] = spec.get("admissionChecksStrategy") or {}
        names.extend(str(r.get("name")) for r in strategy.get("admissionChecks") or ())
        return cls(str(metadata["name"]), tuple(names))


@dataclass(frozen=True)
class AdmissionCheck:
    name: str
    controller_name: str
    active: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AdmissionCheck:
        metadata = _metadata(data, "AdmissionCheck")
        spec: Mapping[str, Any] = data.get("spec") or {}
        status: Mapping[str, Any] = data.get("status") or {}
        return cls(
            str(metadata["name"]),
            str(spec.get("controllerName") or ""),
            _conditions(status).get("Active", False),
        )
