"""The Kueue objects a policy names, read one by one into values by kind: each document is
dispatched by apiVersion and kind to its reader (queues, flavors, cohorts, priorities,
configuration), its name checked once per kind; Lists and ConfigMaps are unpacked."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.common.dra.names import dns1123_subdomain_errors
from services.common.errors import FieldViolation
from services.common.security.kueue_quota.cohorts import read_cohort
from services.common.security.kueue_quota.configuration import (
    CONFIG_VERSIONS,
    Configuration,
    configuration_in_config_map,
    read_configuration,
)
from services.common.security.kueue_quota.fields import Checker, FieldError, ObjectRef
from services.common.security.kueue_quota.flavors import read_resource_flavor
from services.common.security.kueue_quota.priorities import (
    PRIORITY_CLASS_FIELDS,
    WPC_FIELDS,
    add_priority,
    read_priority_class,
    read_workload_priority_class,
)
from services.common.security.kueue_quota.queues import Queue, read_cluster_queue

KUEUE_GROUP = "kueue.x-k8s.io"
_KUEUE_VERSIONS = (f"{KUEUE_GROUP}/v1beta1", f"{KUEUE_GROUP}/v1beta2")
_PRIORITY_CLASS_VERSION = "scheduling.k8s.io/v1"

# Kueue's objects that carry no quota: they stay with Kueue (read, checked for shape, unused)
_KUEUE_ONLY_KINDS = (
    "LocalQueue",
    "AdmissionCheck",
    "ProvisioningRequestConfig",
    "MultiKueueConfig",
    "MultiKueueCluster",
)
_NAMESPACED = ("LocalQueue", "ConfigMap")  # the kinds read whose objects live in a namespace
_ENVELOPE = ("apiVersion", "kind", "metadata", "spec", "status")
_METADATA_FIELDS = {
    "name", "namespace", "labels", "annotations", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "finalizers",
    "managedFields", "ownerReferences", "generateName", "selfLink",
}  # fmt: skip


@dataclass
class Objects:
    """The objects read, by kind (`limit`: how many are read at most)."""

    errors: list[FieldViolation]
    limit: int
    flavors: dict[str, dict[str, Any]] = field(default_factory=dict)
    queues: dict[str, Queue] = field(default_factory=dict)
    cohorts: dict[str, Queue] = field(default_factory=dict)  # Cohort objects, read as queues
    priorities: dict[str, dict[str, Any]] = field(default_factory=dict)
    kueue_only: list[ObjectRef] = field(default_factory=list)
    configuration: Configuration | None = None
    count: int = 0  # objects met so far (List items each)
    _names: dict[tuple[str, str], ObjectRef] = field(default_factory=dict)  # (kind, name)

    def add(self, origin: str, document: object) -> None:
        if document is None:
            return  # an empty YAML document (`---` at the end)
        self.count += 1
        if self.count > self.limit:
            if self.count == self.limit + 1:
                Checker(self.errors, ObjectRef(origin)).fail(
                    FieldError.TOO_MANY,
                    "",
                    f"more than {self.limit} objects: none past it is read",
                )
            return
        checker = Checker(self.errors, ObjectRef(origin))
        if not isinstance(document, Mapping):
            checker.fail(FieldError.INVALID, "", "must be a Kubernetes object (a mapping)")
            return
        version, kind = document.get("apiVersion"), document.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and "items" in document:
            checker.mapping(document, "", {"apiVersion", "kind", "metadata", "items"})
            for j, item in enumerate(checker.sequence(document["items"], "items")):
                self.add(f"{origin}.items[{j}]", item)
            return
        if not isinstance(version, str) or not version:
            checker.fail(FieldError.REQUIRED, "apiVersion", "")
            return
        if not isinstance(kind, str) or not kind:
            checker.fail(FieldError.REQUIRED, "kind", "")
            return
        name = _object_name(document)
        checker = Checker(self.errors, ObjectRef(origin, kind, name), version=version)
        if version in _KUEUE_VERSIONS:
            self._kueue_object(checker, kind, document)
        elif version in CONFIG_VERSIONS and kind == "Configuration":
            first = self.configuration.ref if self.configuration is not None else None
            self.configuration = read_configuration(checker, document, first) or self.configuration
        elif version == _PRIORITY_CLASS_VERSION and kind == "PriorityClass":
            if self._named(checker, document, PRIORITY_CLASS_FIELDS):
                native = read_priority_class(checker, document, self.priorities)
                add_priority(checker, self.priorities, native)
        elif version == "v1" and kind == "ConfigMap":
            inner = configuration_in_config_map(checker, origin, document)
            if inner is not None:
                self.add(*inner)
        else:
            checker.fail(
                FieldError.NOT_SUPPORTED,
                "kind",
                f"{version} {kind} is not a Kueue object gpualloc reads (ClusterQueue, "
                "ResourceFlavor, Cohort, WorkloadPriorityClass of kueue.x-k8s.io/v1beta1 or "
                "v1beta2; Kueue's Configuration; scheduling.k8s.io/v1 PriorityClass)",
            )

    def _kueue_object(self, checker: Checker, kind: str, document: Mapping[str, Any]) -> None:
        if kind in ("ClusterQueue", "ResourceFlavor", "WorkloadPriorityClass", "Cohort"):
            top = WPC_FIELDS if kind == "WorkloadPriorityClass" else _ENVELOPE
            if not self._named(checker, document, top):
                return
            name = checker.ref.name
            if kind == "ClusterQueue":
                self.queues[name] = read_cluster_queue(checker, document)
            elif kind == "ResourceFlavor":
                self.flavors[name] = read_resource_flavor(checker, document)
            elif kind == "WorkloadPriorityClass":
                native = read_workload_priority_class(checker, document)
                add_priority(checker, self.priorities, native)
            else:
                self.cohorts[name] = read_cohort(checker, document)
        elif kind in _KUEUE_ONLY_KINDS:
            if self._named(checker, document, None):
                self.kueue_only.append(checker.ref)
        else:
            checker.fail(
                FieldError.NOT_SUPPORTED,
                "kind",
                f"{kind} is not a Kueue policy object (ClusterQueue, ResourceFlavor, Cohort, "
                f"WorkloadPriorityClass; {', '.join(_KUEUE_ONLY_KINDS)} are read and left to "
                "Kueue)",
            )

    def _named(
        self, checker: Checker, document: Mapping[str, Any], top: Iterable[str] | None
    ) -> bool:
        """Check the object's top-level fields (`top`; None: any, for an object left to
        Kueue), its metadata and its name; False when it has no usable name or is a second
        object of its kind and name."""
        checker.mapping(document, "", top)
        metadata = checker.mapping(document.get("metadata"), "metadata", _METADATA_FIELDS)
        name = checker.string(metadata.get("name"), "metadata.name")
        if not name:
            return False
        for problem in dns1123_subdomain_errors(name):
            checker.fail(FieldError.INVALID, "metadata.name", problem)
        key = (checker.ref.kind, checker.ref.name)  # a LocalQueue's is <namespace>/<name>
        if key in self._names:
            checker.fail(
                FieldError.DUPLICATE, "metadata.name", f"{name} is also in {self._names[key]}"
            )
            return False
        self._names[key] = checker.ref
        return True


def _object_name(document: Mapping[str, Any]) -> str:
    """`name`, or `<namespace>/<name>` for a namespaced object (a LocalQueue)."""
    metadata = document.get("metadata")
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
        return ""
    namespace = metadata.get("namespace") if document.get("kind") in _NAMESPACED else ""
    prefix = f"{namespace}/" if isinstance(namespace, str) and namespace else ""
    return f"{prefix}{metadata['name']}"
