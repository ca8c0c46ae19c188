"""Kueue's own objects as the access policy's quota section (docs/tenancy.md, "Kueue's objects
as the policy").

A site that runs Kueue already writes its GPU quotas as ClusterQueues, ResourceFlavors and
WorkloadPriorityClasses. The access policy may point at those files instead of restating them:

    spec:
      quota:
        kueue:
          files: [kueue/]                 # files or directories, relative to the policy file
          objects: [...]                  # or inline, the same objects
          resources:                      # optional: how a Kueue resource name counts
          - {name: example.com/mig-memory, deviceClassNames: [mig.nvidia.com], counter: memory}
          notEnforced: [rdma/hca]         # optional: other resources gpualloc does not allocate

`translate` checks every object as strictly as Kueue's CRDs and webhooks do (v0.17,
kueue.x-k8s.io v1beta1 and v1beta2) and writes the **native** quota section from them (the
`spec.quota` mapping and the tenants' quota fields that policy.py parses, so there is one quota
model and one rule): a ClusterQueue is a tenant, its cohort a cohort, each (resource, flavor) of
its resource groups a flavored quota resource, its preemption and flavorFungibility the
tenant's, with Kueue's defaults written out; a ResourceFlavor's nodeLabels are the flavor's;
WorkloadPriorityClasses and Kubernetes PriorityClasses are priority classes.

Three kinds of field, decided one by one (the lists are in docs/tenancy.md):
- translated (quota semantics gpualloc honours);
- Kueue's own (queueing, namespaces, admission checks, the manager's settings): they stay with
  Kueue, which still applies them to its Workloads; gpualloc has no queue and its callers are
  the policy's bindings, so they are checked for shape and have no meaning here;
- refused by name: quota semantics gpualloc cannot honour (yet). Nothing is ignored silently.

Errors are `KueueViolation`s: the object (origin, kind, name), the field path inside it and a
Kubernetes field-error type (`FieldError`). Pure: decoded documents in, native mappings out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import yaml

from services.common.dra.names import (
    dns1123_subdomain_errors,
    label_name_errors,
    label_value_errors,
)
from services.common.dra.quantity import Quantity
from services.common.errors import FieldViolation

__all__ = [
    "BUILT_IN_RESOURCES",
    "KUEUE_GROUP",
    "NOT_ALLOCATED",
    "FieldError",
    "KueueTranslation",
    "KueueViolation",
    "ObjectRef",
    "apply_kueue",
    "kueue_file_entries",
    "mig_profile_resource",
    "translate",
]

KUEUE_GROUP = "kueue.x-k8s.io"
_KUEUE_VERSIONS = (f"{KUEUE_GROUP}/v1beta1", f"{KUEUE_GROUP}/v1beta2")
_CONFIG_VERSIONS = ("config.kueue.x-k8s.io/v1beta1", "config.kueue.x-k8s.io/v1beta2")
_PRIORITY_CLASS_VERSION = "scheduling.k8s.io/v1"
_CONFIG_MAP_KEY = "controller_manager_config.yaml"  # Kueue's manifests and Helm chart

# Kueue's objects that carry no quota: they stay with Kueue (read, checked for shape, unused)
_KUEUE_ONLY_KINDS = (
    "LocalQueue",
    "AdmissionCheck",
    "ProvisioningRequestConfig",
    "MultiKueueConfig",
    "MultiKueueCluster",
)

# How a Kueue resource name counts when neither spec.quota.kueue.resources nor the
# Configuration's deviceClassMappings name it: the NVIDIA device plugin's whole GPUs, as the
# Kueue bridge asks for them (services/bridges/kueue/translate.py: class gpu.nvidia.com).
BUILT_IN_RESOURCES: Mapping[str, Mapping[str, Any]] = {
    "nvidia.com/gpu": {"deviceClassNames": ["gpu.nvidia.com"]},
}
# Resources of a Pod that gpualloc does not allocate: accepted in a ClusterQueue and listed as
# not enforced (Kueue still enforces them on its own Workloads).
NOT_ALLOCATED = ("cpu", "memory", "ephemeral-storage", "pods", "storage")
_NOT_ALLOCATED_PREFIXES = ("hugepages-",)
_MIG_PREFIX = "nvidia.com/mig-"
# NVIDIA's MIG profile names (1g.10gb, 1c.3g.71gb, 1g.10gb-me), as services/client/specs.py has
_MIG_PROFILE = re.compile(r"\d+(c\.\d+)?g\.\d+gb(\+me(\.all)?|\+gfx|-me)?")
_MIG_CLASS = "mig.nvidia.com"  # the NVIDIA DRA driver's class of MIG devices


def mig_profile_resource(name: str) -> Mapping[str, Any] | None:
    """How the device plugin's `nvidia.com/mig-<profile>` (the GPU Operator's mixed MIG
    strategy) counts: each device of class mig.nvidia.com of that profile counts 1, what the
    Kueue bridge allocates for it (services/bridges/kueue/translate.py); None for another name."""
    profile = name.removeprefix(_MIG_PREFIX)
    if not name.startswith(_MIG_PREFIX) or not _MIG_PROFILE.fullmatch(profile):
        return None
    expression = f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"
    return {"deviceClassNames": [_MIG_CLASS], "selectors": [{"cel": {"expression": expression}}]}


_INT32 = (-(2**31), 2**31 - 1)
_HIGHEST_USER_PRIORITY = 1_000_000_000  # Kubernetes: a PriorityClass's value above it is system's
_WEIGHT_FLOOR = Quantity.parse("1n")
_FILES_LIMIT = 256
_OBJECTS_LIMIT = 5000  # objects in all: a site's queues, flavors and classes, with room to spare


class FieldError(StrEnum):
    """What is wrong with a field, in Kubernetes' field-error words (field.ErrorType), plus
    gpualloc's own: an unknown field (kubectl --validate=strict) and a refusal."""

    REQUIRED = "Required value"
    INVALID = "Invalid value"
    DUPLICATE = "Duplicate value"
    NOT_SUPPORTED = "Unsupported value"
    NOT_FOUND = "Not found"
    TOO_MANY = "Too many"
    TOO_LONG = "Too long"
    FORBIDDEN = "Forbidden"
    UNKNOWN = "Unknown field"
    REFUSED = "Not honoured by gpualloc"  # valid Kueue that gpualloc cannot honour: refused


@dataclass(frozen=True)
class ObjectRef:
    """Where an object came from (`kueue/queues.yaml[2]`, `spec.quota.kueue.objects[0]`) and
    what it is."""

    origin: str
    kind: str = ""
    name: str = ""

    def __str__(self) -> str:
        what = " ".join(part for part in (self.kind, self.name) if part)
        return f"{self.origin} ({what})" if what else self.origin


@dataclass(frozen=True)
class KueueViolation(FieldViolation):
    """One bad field of one Kueue object: `path` is the field path inside the object
    (`spec.resourceGroups[0].flavors[1].resources[0].lendingLimit`), `error` its type."""

    error: FieldError = FieldError.INVALID
    origin: str = ""
    kind: str = ""
    name: str = ""

    def __str__(self) -> str:
        what = " ".join(part for part in (self.kind, self.name) if part)
        where = f"{self.origin}: {what}" if what else self.origin
        at = f" {self.path}" if self.path else ""
        return f"{where}:{at}: {self.error}: {self.description}"


@dataclass(frozen=True)
class KueueTranslation:
    """The native quota section written from Kueue's objects, and what it leaves out on
    purpose (each documented): resources not enforced per ClusterQueue, objects that are
    Kueue's own."""

    quota: Mapping[str, Any]  # spec.quota's native fields: resources, resourceFlavors, ...
    tenants: Mapping[str, Mapping[str, Any]]  # ClusterQueue -> the tenant's quota fields
    not_enforced: tuple[tuple[str, str], ...] = ()  # (ClusterQueue, resource)
    kueue_only: tuple[ObjectRef, ...] = ()  # objects read and left to Kueue

    def notes(self) -> tuple[str, ...]:
        """One line per thing left out on purpose, for the server's log."""
        lines = []
        if self.not_enforced:
            by_resource: dict[str, list[str]] = {}
            for queue, resource in self.not_enforced:
                by_resource.setdefault(resource, []).append(queue)
            listed = "; ".join(f"{r} ({', '.join(q)})" for r, q in sorted(by_resource.items()))
            lines.append(
                f"Kueue quotas of resources gpualloc does not allocate, not enforced: {listed}"
            )
        if self.kueue_only:
            lines.append(
                "Kueue objects without quota, left to Kueue: "
                + ", ".join(f"{ref.kind} {ref.name}" for ref in self.kueue_only)
            )
        return tuple(lines)


# --- the access policy's side ---------------------------------------------------------------

_SECTION_FIELDS = {"files", "objects", "resources", "notEnforced"}
_NATIVE_QUOTA_FIELDS = ("resources", "resourceFlavors", "priorityClasses")
_TENANT_QUOTA_FIELDS = ("cohort", "quotas", "preemption", "flavorFungibility", "fairSharing")


def kueue_file_entries(policy: object) -> tuple[str, ...]:
    """The `spec.quota.kueue.files` entries of a decoded policy, as written (for the edge to
    read); () when there are none or the section is malformed (the parser then says why)."""
    if not isinstance(policy, Mapping):
        return ()
    spec = policy.get("spec")
    quota = spec.get("quota") if isinstance(spec, Mapping) else None
    section = quota.get("kueue") if isinstance(quota, Mapping) else None
    files = section.get("files") if isinstance(section, Mapping) else None
    if not isinstance(files, list):
        return ()
    return tuple(entry for entry in files if isinstance(entry, str) and entry)


def apply_kueue(
    quota: Mapping[str, Any],
    tenants: object,
    files: Mapping[str, Sequence[tuple[str, object]]],
    errors: list[FieldViolation],
) -> tuple[Mapping[str, Any], object, KueueTranslation | None]:
    """The policy's `spec.quota` and `spec.tenants` with `spec.quota.kueue` translated into
    them: (native quota section, tenants, the translation). A policy without the section is
    returned as it is. `files`: per `files` entry, its decoded documents with their origins."""
    if "kueue" not in quota:
        return quota, tenants, None
    for key in quota:
        if key in _NATIVE_QUOTA_FIELDS:
            errors.append(
                FieldViolation(
                    f"spec.quota.{key}",
                    "given by spec.quota.kueue: write it as Kueue objects (docs/tenancy.md)",
                )
            )
    before = len(errors)
    translation = translate(quota["kueue"], files, errors)
    native = {k: v for k, v in quota.items() if k != "kueue" and k not in _NATIVE_QUOTA_FIELDS}
    if len(errors) > before:  # refused: the queues are tenants by name only, so that the
        # native parser reports nothing twice (and bindings naming them stay valid)
        bare = KueueTranslation({}, dict.fromkeys(translation.tenants, {}))
        return native, _merge_tenants(tenants, bare, errors), None
    merged = _merge_tenants(tenants, translation, errors)
    return {**native, **translation.quota}, merged, translation


def _merge_tenants(
    tenants: object, translation: KueueTranslation, errors: list[FieldViolation]
) -> object:
    """spec.tenants with each ClusterQueue's quota fields added to the tenant of its name
    (appended when the policy does not list it); a listed tenant may carry only what Kueue
    has no word for (allowAdminAccess, maxReservations, gpualloc's tolerations)."""
    if not isinstance(tenants, list):
        return tenants  # the parser says why
    merged: list[object] = []
    seen: set[str] = set()
    for i, item in enumerate(tenants):
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or name not in translation.tenants:
            merged.append(item)
            continue
        assert isinstance(item, Mapping)
        seen.add(name)
        for key in _TENANT_QUOTA_FIELDS:
            if key in item:
                errors.append(
                    FieldViolation(
                        f"spec.tenants[{i}].{key}",
                        f"given by ClusterQueue {name} (spec.quota.kueue)",
                    )
                )
        merged.append({**item, **translation.tenants[name]})
    for name, fields in translation.tenants.items():
        if name not in seen:
            merged.append({"name": name, **fields})
    return merged


# --- the translation ------------------------------------------------------------------------


def translate(
    section: object,
    files: Mapping[str, Sequence[tuple[str, object]]],
    errors: list[FieldViolation],
) -> KueueTranslation:
    """The native quota section from `spec.quota.kueue` (errors appended to `errors`)."""
    top = _Checker(errors, ObjectRef("spec.quota.kueue"), prefix="spec.quota.kueue")
    fields = top.mapping(section, "", _SECTION_FIELDS)
    documents: list[tuple[str, object]] = []
    entries = top.sequence(fields.get("files", []), "files")
    if len(entries) > _FILES_LIMIT:
        top.fail(FieldError.TOO_MANY, "files", f"must have at most {_FILES_LIMIT} entries")
    for i, entry in enumerate(entries):
        name = top.string(entry, f"files[{i}]")
        if name and name not in files:
            top.fail(FieldError.NOT_FOUND, f"files[{i}]", f"{name} was not read")
        documents.extend(files.get(name, ()))
    for i, item in enumerate(top.sequence(fields.get("objects", []), "objects")):
        documents.append((f"spec.quota.kueue.objects[{i}]", item))
    if not documents:
        top.fail(FieldError.REQUIRED, "", "names no Kueue objects (files or objects)")
    explicit = _explicit_resources(top, fields.get("resources", []))
    not_enforced = {
        top.string(item, f"notEnforced[{i}]")
        for i, item in enumerate(top.sequence(fields.get("notEnforced", []), "notEnforced"))
    }
    objects = _Objects(errors)
    for origin, document in documents:
        objects.add(origin, document)
    resources = _Resources(explicit, objects.device_class_mappings, not_enforced - {""}, top)
    return objects.translate(resources)


def _explicit_resources(top: _Checker, value: object) -> dict[str, dict[str, Any]]:
    """spec.quota.kueue.resources: a Kueue resource name and how it counts (native fields)."""
    mapped: dict[str, dict[str, Any]] = {}
    for i, item in enumerate(top.sequence(value, "resources")):
        path = f"resources[{i}]"
        fields = top.mapping(
            item, path, {"name", "deviceClassNames", "counter", "gpuShare", "selectors"}
        )
        name = top.resource_name(fields.get("name"), f"{path}.name")
        if name in mapped:
            top.fail(FieldError.DUPLICATE, f"{path}.name", name)
        classes = top.sequence(fields.get("deviceClassNames"), f"{path}.deviceClassNames")
        if not classes:
            top.fail(FieldError.REQUIRED, f"{path}.deviceClassNames", "at least one DeviceClass")
        native: dict[str, Any] = {
            "deviceClassNames": [
                top.string(c, f"{path}.deviceClassNames[{j}]") for j, c in enumerate(classes)
            ]
        }
        if "counter" in fields:
            native["counter"] = top.string(fields["counter"], f"{path}.counter")
        if "gpuShare" in fields:
            if not isinstance(fields["gpuShare"], bool):
                top.fail(FieldError.INVALID, f"{path}.gpuShare", "must be true or false")
            native["gpuShare"] = fields["gpuShare"] is True
        if "selectors" in fields:  # a DeviceClass's shape, checked by the native parser
            native["selectors"] = fields["selectors"]
        if native.get("counter") and native.get("gpuShare"):
            top.fail(FieldError.INVALID, f"{path}.gpuShare", "counts a counter or GPU shares")
        if name:
            mapped[name] = native
    return mapped


@dataclass
class _Resources:
    """How each Kueue resource name counts in gpualloc, in this order: spec.quota.kueue's
    `resources`, the Configuration's deviceClassMappings, the built-ins; or it is not
    allocated by gpualloc (not enforced); or it is refused."""

    explicit: Mapping[str, Mapping[str, Any]]
    mappings: Mapping[str, Mapping[str, Any]]
    not_enforced: set[str]
    top: _Checker

    def __post_init__(self) -> None:
        for name in sorted(set(self.explicit) & set(self.mappings)):
            self.top.fail(
                FieldError.DUPLICATE,
                "resources",
                f"{name} is also a deviceClassMappings name of the Configuration",
            )
        for name in sorted(self.not_enforced & (set(self.explicit) | set(self.mappings))):
            self.top.fail(FieldError.INVALID, "notEnforced", f"{name} is mapped to devices")

    def counted(self, name: str) -> Mapping[str, Any] | None:
        """The native fields (deviceClassNames, counter, gpuShare, selectors) `name` counts by;
        None when it counts no device (`refusal` says whether that is allowed)."""
        for table in (self.explicit, self.mappings, BUILT_IN_RESOURCES):
            if name in table:
                return table[name]
        return mig_profile_resource(name)

    def refusal(self, name: str) -> str | None:
        """Why a covered resource is refused; None when it counts or is not enforced."""
        if self.counted(name) is not None:
            return None
        if name in self.not_enforced or name in NOT_ALLOCATED:
            return None
        if name.startswith(_NOT_ALLOCATED_PREFIXES):
            return None
        if name.startswith(_MIG_PREFIX):
            return (
                f"{name}: not a MIG profile (NVIDIA's mixed strategy names them "
                "nvidia.com/mig-<profile>, e.g. nvidia.com/mig-1g.10gb)"
            )
        return (
            f"gpualloc allocates no resource {name}: map it to DeviceClasses "
            "(spec.quota.kueue.resources, or the Configuration's deviceClassMappings) or list "
            "it in spec.quota.kueue.notEnforced"
        )


@dataclass
class _Queue:
    """A ClusterQueue read: its tenant fields and its resources per flavor, in order."""

    ref: ObjectRef
    fields: dict[str, Any]
    # (resource, flavor, limits, the flavor's path, the covered resource's path), in order
    quotas: list[tuple[str, str, dict[str, Any], str, str]]
    valid: bool = True  # False: the queue's own fields are wrong (no checks across objects)


@dataclass
class _Objects:
    """The objects read, by kind, and the checks that span objects."""

    errors: list[FieldViolation]
    flavors: dict[str, dict[str, Any]] = field(default_factory=dict)
    queues: dict[str, _Queue] = field(default_factory=dict)
    cohorts: dict[str, _Queue] = field(default_factory=dict)  # Cohort objects, read as queues
    fair_sharing: dict[str, Any] | None = None  # the Configuration's, natively
    admission_fair_sharing: dict[str, Any] | None = None
    priorities: dict[str, dict[str, Any]] = field(default_factory=dict)
    device_class_mappings: dict[str, dict[str, Any]] = field(default_factory=dict)
    kueue_only: list[ObjectRef] = field(default_factory=list)
    configuration: ObjectRef | None = None
    excluded_prefixes: list[str] = field(default_factory=list)
    count: int = 0  # objects met so far (List items each)
    _names: dict[tuple[str, str], ObjectRef] = field(default_factory=dict)  # (kind, name)

    def add(self, origin: str, document: object) -> None:
        if document is None:
            return  # an empty YAML document (`---` at the end)
        self.count += 1
        if self.count > _OBJECTS_LIMIT:
            if self.count == _OBJECTS_LIMIT + 1:
                _Checker(self.errors, ObjectRef(origin)).fail(
                    FieldError.TOO_MANY,
                    "",
                    f"more than {_OBJECTS_LIMIT} objects: none past it is read",
                )
            return
        checker = _Checker(self.errors, ObjectRef(origin))
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
        checker = _Checker(self.errors, ObjectRef(origin, kind, name), version=version)
        if version in _KUEUE_VERSIONS:
            self._kueue_object(checker, kind, document)
        elif version in _CONFIG_VERSIONS and kind == "Configuration":
            self._configuration(checker, document)
        elif version == _PRIORITY_CLASS_VERSION and kind == "PriorityClass":
            self._priority_class(checker, document)
        elif version == "v1" and kind == "ConfigMap":
            self._config_map(checker, origin, document)
        else:
            checker.fail(
                FieldError.NOT_SUPPORTED,
                "kind",
                f"{version} {kind} is not a Kueue object gpualloc reads (ClusterQueue, "
                "ResourceFlavor, Cohort, WorkloadPriorityClass of kueue.x-k8s.io/v1beta1 or "
                "v1beta2; Kueue's Configuration; scheduling.k8s.io/v1 PriorityClass)",
            )

    def _kueue_object(self, checker: _Checker, kind: str, document: Mapping[str, Any]) -> None:
        readers = {
            "ClusterQueue": self._cluster_queue,
            "ResourceFlavor": self._resource_flavor,
            "WorkloadPriorityClass": self._workload_priority_class,
            "Cohort": self._cohort,
        }
        if kind in readers:
            top = _WPC_FIELDS if kind == "WorkloadPriorityClass" else _ENVELOPE
            if self._named(checker, document, top):
                readers[kind](checker, document)
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
        self, checker: _Checker, document: Mapping[str, Any], top: Iterable[str] | None
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

    # --- ResourceFlavor ---------------------------------------------------------------------

    def _resource_flavor(self, checker: _Checker, document: Mapping[str, Any]) -> None:
        spec = checker.mapping(
            document.get("spec", {}),
            "spec",
            {"nodeLabels", "nodeTaints", "tolerations", "topologyName"},
        )
        labels = checker.mapping(spec.get("nodeLabels", {}), "spec.nodeLabels", None)
        if len(labels) > 8:
            checker.fail(FieldError.TOO_MANY, "spec.nodeLabels", "must have at most 8 labels")
        for key, value in labels.items():
            where = f"spec.nodeLabels[{key}]"
            for problem in label_name_errors(str(key)):
                checker.fail(FieldError.INVALID, where, problem)
            text = checker.string(value, where, required=False)
            for problem in label_value_errors(text):
                checker.fail(FieldError.INVALID, where, problem)
        if "topologyName" in spec and not labels:
            checker.fail(
                FieldError.INVALID,
                "spec",
                "at least one nodeLabel is required when topology is set",
            )
        taints = _taints(checker, spec.get("nodeTaints", []), "spec.nodeTaints")
        tolerations = _tolerations(checker, spec.get("tolerations", []), "spec.tolerations")
        if "topologyName" in spec:
            checker.fail(
                FieldError.REFUSED,
                "spec.topologyName",
                "topology-aware scheduling is Kueue's; gpualloc places by its own topology "
                "rules (docs/tenancy.md)",
            )
        native: dict[str, Any] = {
            "name": checker.ref.name,
            "nodeLabels": {str(k): str(v) for k, v in labels.items()},
        }
        for key, value in (("nodeTaints", taints), ("tolerations", tolerations)):
            if value:
                native[key] = value
        self.flavors[checker.ref.name] = native

    # --- priorities -------------------------------------------------------------------------

    def _workload_priority_class(self, checker: _Checker, document: Mapping[str, Any]) -> None:
        value = checker.int32(document.get("value"), "value")
        _description(checker, document)
        self._priority(checker, {"name": checker.ref.name, "value": value})

    def _priority_class(self, checker: _Checker, document: Mapping[str, Any]) -> None:
        if not self._named(checker, document, _PRIORITY_CLASS_FIELDS):
            return
        name = checker.ref.name
        value = checker.int32(document.get("value"), "value")
        if value > _HIGHEST_USER_PRIORITY and not name.startswith("system-"):
            checker.fail(FieldError.FORBIDDEN, "value", f"must not exceed {_HIGHEST_USER_PRIORITY}")
        _description(checker, document)
        native: dict[str, Any] = {"name": name, "value": value}
        policy = document.get("preemptionPolicy", "PreemptLowerPriority")
        if policy not in ("PreemptLowerPriority", "Never"):
            checker.fail(
                FieldError.NOT_SUPPORTED, "preemptionPolicy", "PreemptLowerPriority, Never"
            )
        elif policy == "Never":
            native["preemptionPolicy"] = "Never"
        default = document.get("globalDefault", False)
        if not isinstance(default, bool):
            checker.fail(FieldError.INVALID, "globalDefault", "must be true or false")
        elif default:
            others = [p["name"] for p in self.priorities.values() if p.get("globalDefault")]
            if others:
                checker.fail(
                    FieldError.FORBIDDEN,
                    "globalDefault",
                    f"{others[0]} is already the global default",
                )
            native["globalDefault"] = True
        self._priority(checker, native)

    def _priority(self, checker: _Checker, native: dict[str, Any]) -> None:
        name = native["name"]
        if name in self.priorities:
            checker.fail(
                FieldError.DUPLICATE,
                "metadata.name",
                f"{name} is both a WorkloadPriorityClass and a PriorityClass (a reservation "
                "names one priority class)",
            )
            return
        self.priorities[name] = native

    # --- Cohort -----------------------------------------------------------------------------

    def _cohort(self, checker: _Checker, document: Mapping[str, Any]) -> None:
        """A Cohort: its parent, quotas of its own and fair-sharing weight (native
        `quota.cohorts[]`)."""
        spec = checker.mapping(
            document.get("spec", {}), "spec", {"parentName", "resourceGroups", "fairSharing"}
        )
        parent = checker.string(spec.get("parentName", ""), "spec.parentName", required=False)
        for problem in dns1123_subdomain_errors(parent) if parent else ():
            checker.fail(FieldError.INVALID, "spec.parentName", problem)
        fields: dict[str, Any] = {"parent": parent} if parent else {}
        cohort = _Queue(checker.ref, fields, [])
        before = len(self.errors)
        groups = spec.get("resourceGroups", [])
        _resource_groups(checker, groups, bool(parent), cohort, of_cohort=True)
        weight = _fair_sharing(checker, spec.get("fairSharing"), "spec.fairSharing")
        if weight is not None:
            fields["fairSharing"] = {"weight": weight}
        cohort.valid = len(self.errors) == before
        self.cohorts[checker.ref.name] = cohort

    # --- Configuration ----------------------------------------------------------------------

    def _config_map(self, checker: _Checker, origin: str, document: Mapping[str, Any]) -> None:
        data = document.get("data")
        if not isinstance(data, Mapping) or _CONFIG_MAP_KEY not in data:
            checker.fail(
                FieldError.NOT_SUPPORTED,
                "kind",
                f"a ConfigMap is read only when it holds Kueue's Configuration ({_CONFIG_MAP_KEY})",
            )
            return
        text = data[_CONFIG_MAP_KEY]
        where = f"{origin}.data[{_CONFIG_MAP_KEY}]"
        try:
            inner = yaml.safe_load(text) if isinstance(text, str) else None
        except yaml.YAMLError as error:
            checker.fail(FieldError.INVALID, f"data[{_CONFIG_MAP_KEY}]", f"not YAML: {error}")
            return
        if not isinstance(inner, Mapping) or inner.get("kind") != "Configuration":
            checker.fail(FieldError.INVALID, f"data[{_CONFIG_MAP_KEY}]", "not a Configuration")
            return
        self.add(where, inner)

    def _configuration(self, checker: _Checker, document: Mapping[str, Any]) -> None:
        v1beta1 = checker.version.endswith("v1beta1")
        allowed = set(_CONFIGURATION_FIELDS) | (
            {"queueVisibility"} if v1beta1 else {"visibilityServer"}
        )
        checker.mapping(document, "", allowed)
        if self.configuration is not None:
            checker.fail(
                FieldError.DUPLICATE, "kind", f"a second Configuration ({self.configuration})"
            )
            return
        self.configuration = checker.ref
        self.fair_sharing = _configured_fair_sharing(checker, document.get("fairSharing"), v1beta1)
        self.admission_fair_sharing = _admission_fair_sharing(
            checker, document.get("admissionFairSharing")
        )
        resources = checker.mapping(
            document.get("resources", {}),
            "resources",
            {"excludeResourcePrefixes", "transformations", "deviceClassMappings"},
        )
        if resources.get("transformations"):
            checker.fail(
                FieldError.REFUSED,
                "resources.transformations",
                "gpualloc counts devices, not transformed Pod resources",
            )
        _feature_gates(checker, document.get("featureGates", {}))
        self.excluded_prefixes = [
            checker.string(p, f"resources.excludeResourcePrefixes[{i}]")
            for i, p in enumerate(
                checker.sequence(
                    resources.get("excludeResourcePrefixes", []),
                    "resources.excludeResourcePrefixes",
                )
            )
        ]
        self._device_class_mappings(checker, resources.get("deviceClassMappings", []))

    def _device_class_mappings(self, checker: _Checker, value: object) -> None:
        base = "resources.deviceClassMappings"
        mappings = checker.sequence(value, base)
        if len(mappings) > 16:
            checker.fail(FieldError.TOO_MANY, base, "must have at most 16 items")
        owner: dict[str, str] = {}
        for i, item in enumerate(mappings):
            path = f"{base}[{i}]"
            fields = checker.mapping(item, path, {"name", "deviceClassNames"})
            name = checker.resource_name(fields.get("name"), f"{path}.name")
            if name in self.device_class_mappings:
                checker.fail(FieldError.DUPLICATE, f"{path}.name", name)
            classes = checker.sequence(fields.get("deviceClassNames"), f"{path}.deviceClassNames")
            if not classes:
                checker.fail(
                    FieldError.REQUIRED,
                    f"{path}.deviceClassNames",
                    "at least one device class name is required",
                )
            if len(classes) > 8:
                checker.fail(FieldError.TOO_MANY, f"{path}.deviceClassNames", "at most 8")
            seen: set[str] = set()
            names: list[str] = []
            for j, raw in enumerate(classes):
                where = f"{path}.deviceClassNames[{j}]"
                device_class = checker.resource_name(raw, where)
                if device_class in seen:
                    checker.fail(FieldError.DUPLICATE, where, device_class)
                seen.add(device_class)
                if owner.get(device_class, name) != name:
                    checker.fail(
                        FieldError.INVALID,
                        where,
                        f"device class already mapped to resource {owner[device_class]}",
                    )
                owner.setdefault(device_class, name)
                names.append(device_class)
            if name:
                self.device_class_mappings[name] = {"deviceClassNames": names}

    # --- ClusterQueue -----------------------------------------------------------------------

    def _cluster_queue(self, checker: _Checker, document: Mapping[str, Any]) -> None:
        v1beta1 = checker.version.endswith("v1beta1")
        cohort_field = "cohort" if v1beta1 else "cohortName"
        allowed = set(_QUEUE_FIELDS) | {cohort_field} | ({"admissionChecks"} if v1beta1 else set())
        spec = checker.mapping(document.get("spec", {}), "spec", allowed)
        cohort = checker.string(spec.get(cohort_field, ""), f"spec.{cohort_field}", required=False)
        for problem in dns1123_subdomain_errors(cohort) if cohort else ():
            checker.fail(FieldError.INVALID, f"spec.{cohort_field}", problem)
        fields: dict[str, Any] = {"cohort": cohort} if cohort else {}
        queue = _Queue(checker.ref, fields, [])
        before = len(self.errors)
        _resource_groups(checker, spec.get("resourceGroups", []), bool(cohort), queue)
        fields["preemption"] = _preemption(checker, spec.get("preemption", {}))
        fields["flavorFungibility"] = _fungibility(checker, spec.get("flavorFungibility", {}))
        _kueue_only_queue_fields(checker, spec, v1beta1)
        stop = spec.get("stopPolicy", "None")
        if (
            checker.choice(stop, "spec.stopPolicy", ("None", "Hold", "HoldAndDrain"))
            and stop != "None"
        ):
            checker.fail(
                FieldError.REFUSED,
                "spec.stopPolicy",
                f"{stop}: a stopped ClusterQueue is not supported (remove the tenant's quotas "
                "to stop its grants)",
            )
        weight = _fair_sharing(checker, spec.get("fairSharing"), "spec.fairSharing")
        if weight is not None:
            fields["fairSharing"] = {"weight": weight}
        scope = checker.mapping(
            spec.get("admissionScope", {}), "spec.admissionScope", {"admissionMode"}
        )
        if "admissionScope" in spec:
            checker.choice(
                scope.get("admissionMode"),
                "spec.admissionScope.admissionMode",
                ("UsageBasedAdmissionFairSharing", "NoAdmissionFairSharing"),
            )
        queue.valid = len(self.errors) == before
        self.queues[checker.ref.name] = queue

    # --- the native section -----------------------------------------------------------------

    def translate(self, resources: _Resources) -> KueueTranslation:
        order: dict[str, list[str]] = {}  # enforced resource -> its flavors, first seen first
        not_enforced: list[tuple[str, str]] = []
        tenants = {
            name: {**queue.fields, "quotas": self._quotas(queue, resources, order, not_enforced)}
            for name, queue in self.queues.items()
        }
        cohorts = [
            {"name": name, **cohort.fields,
             "quotas": self._quotas(cohort, resources, order, not_enforced)}
            for name, cohort in self.cohorts.items()
        ]  # fmt: skip
        self._check_cohort_tree()
        declared = set(self.cohorts)
        for cohort in list(self.cohorts.values()):  # a parent no object declares: Kueue's
            parent = cohort.fields.get("parent")  # default Cohort (no quota, no limits)
            if parent and parent not in declared:
                declared.add(parent)
                cohorts.append({"name": parent})
        native_resources = []
        for resource, flavors in order.items():
            counted = resources.counted(resource)
            assert counted is not None
            native_resources.append({"name": resource, **counted, "flavors": flavors})
        quota: dict[str, Any] = {
            "resources": native_resources,
            "resourceFlavors": list(self.flavors.values()),
            "priorityClasses": list(self.priorities.values()),
        }
        if cohorts:
            quota["cohorts"] = cohorts
        if self.fair_sharing is not None:
            quota["fairSharing"] = self.fair_sharing
        if self.admission_fair_sharing is not None:
            weights = self.admission_fair_sharing["resourceWeights"]
            quota["admissionFairSharing"] = {  # gpualloc counts no usage of the others
                **self.admission_fair_sharing,
                "resourceWeights": {r: w for r, w in weights.items() if r in order},
            }
        return KueueTranslation(quota, tenants, tuple(not_enforced), tuple(self.kueue_only))

    def _quotas(
        self,
        queue: _Queue,
        resources: _Resources,
        order: dict[str, list[str]],
        not_enforced: list[tuple[str, str]],
    ) -> list[dict[str, Any]]:
        """The native quotas of a ClusterQueue's or Cohort's resource groups: those of
        resources gpualloc enforces; the others listed in `not_enforced` or refused."""
        checker = _Checker(self.errors, queue.ref)
        quotas: list[dict[str, Any]] = []
        missing: set[str] = set()
        refused: set[str] = set()
        for resource, flavor, limits, path, covered_at in queue.quotas if queue.valid else ():
            if flavor not in self.flavors and flavor not in missing:
                missing.add(flavor)
                checker.fail(
                    FieldError.NOT_FOUND,
                    f"{path}.name",
                    f"ResourceFlavor {flavor} is not among the objects given",
                )
            refusal = resources.refusal(resource)
            if refusal is not None:
                if resource not in refused:
                    refused.add(resource)
                    checker.fail(FieldError.REFUSED, covered_at, refusal)
                continue
            if resources.counted(resource) is None:
                if (queue.ref.name, resource) not in not_enforced:
                    not_enforced.append((queue.ref.name, resource))
                continue
            for prefix in self.excluded_prefixes:
                if resource.startswith(prefix) and self.configuration is not None:
                    _Checker(self.errors, self.configuration).fail(
                        FieldError.REFUSED,
                        "resources.excludeResourcePrefixes",
                        f"{prefix} excludes {resource}, which gpualloc enforces",
                    )
            flavors = order.setdefault(resource, [])
            if flavor not in flavors:
                flavors.append(flavor)
            quotas.append({"resource": resource, "flavor": flavor, **limits})
        return quotas

    def _check_cohort_tree(self) -> None:
        """What Kueue accepts as objects but cannot run: a cycle of parents (Kueue disables
        every member until it is gone) and a Cohort named as a ClusterQueue (gpualloc's
        tenants and cohorts share one namespace). Refused."""
        for name, cohort in self.cohorts.items():
            if name in self.queues:
                _Checker(self.errors, cohort.ref).fail(
                    FieldError.REFUSED,
                    "metadata.name",
                    f"a ClusterQueue is named {name} too: gpualloc's tenants and cohorts "
                    "share names",
                )
        reported: set[str] = set()
        for name in self.cohorts:
            chain, at = [name], self.cohorts[name].fields.get("parent")
            while at in self.cohorts and at not in chain:
                chain.append(at)
                at = self.cohorts[at].fields.get("parent")
            if at in chain and at not in reported:
                loop = [*chain[chain.index(at) :], at]
                reported.update(loop)
                _Checker(self.errors, self.cohorts[at].ref).fail(
                    FieldError.REFUSED,
                    "spec.parentName",
                    "Cohorts form a cycle (Kueue stops every member until it is removed): "
                    + " -> ".join(loop),
                )


_NAMESPACED = ("LocalQueue", "ConfigMap")  # the kinds read whose objects live in a namespace
_ENVELOPE = ("apiVersion", "kind", "metadata", "spec", "status")
_WPC_FIELDS = ("apiVersion", "kind", "metadata", "value", "description")
_PRIORITY_CLASS_FIELDS = (*_WPC_FIELDS, "globalDefault", "preemptionPolicy")
_METADATA_FIELDS = {
    "name", "namespace", "labels", "annotations", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "finalizers",
    "managedFields", "ownerReferences", "generateName", "selfLink",
}  # fmt: skip
_QUEUE_FIELDS = (
    "resourceGroups", "queueingStrategy", "namespaceSelector", "flavorFungibility", "preemption",
    "admissionChecksStrategy", "stopPolicy", "fairSharing", "admissionScope",
)  # fmt: skip
_CONFIGURATION_FIELDS = (
    "apiVersion", "kind", "namespace", "webhook", "leaderElection", "metrics", "health",
    "pprofBindAddress", "controller", "tls", "manageJobsWithoutQueueName",
    "managedJobsNamespaceSelector", "internalCertManagement", "waitForPodsReady",
    "clientConnection", "integrations", "multiKueue", "fairSharing", "admissionFairSharing",
    "resources", "featureGates", "objectRetentionPolicies",
)  # fmt: skip


_STRATEGIES = ("LessThanOrEqualToFinalShare", "LessThanInitialShare")
_STRATEGY_SETS = ((_STRATEGIES[0],), (_STRATEGIES[1],), _STRATEGIES)  # Kueue's valid lists


def _configured_fair_sharing(
    checker: _Checker, value: object, v1beta1: bool
) -> dict[str, Any] | None:
    """The Configuration's fairSharing as the native `quota.fairSharing`: v1beta2's present
    means enabled (preemptionStrategies required); v1beta1's has `enable` and defaults the
    strategies to both. None: fair sharing off."""
    if value is None:
        return None
    allowed = {"enable", "preemptionStrategies"} if v1beta1 else {"preemptionStrategies"}
    fields = checker.mapping(value, "fairSharing", allowed)
    if v1beta1 and fields.get("enable") is not True:
        if not isinstance(fields.get("enable", False), bool):
            checker.fail(FieldError.INVALID, "fairSharing.enable", "must be true or false")
        return None
    where = "fairSharing.preemptionStrategies"
    strategies = tuple(checker.sequence(fields.get("preemptionStrategies", []), where))
    if not strategies and v1beta1:
        strategies = _STRATEGIES
    if not strategies:
        checker.fail(FieldError.REQUIRED, where, "must be specified")
        return None
    if strategies not in _STRATEGY_SETS:
        listed = "; ".join(",".join(s) for s in _STRATEGY_SETS)
        checker.fail(FieldError.NOT_SUPPORTED, where, f"supported values: {listed}")
        return None
    return {"enabled": True, "preemptionStrategies": list(strategies)}


_DURATION = re.compile(r"(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+|0")


def _admission_fair_sharing(checker: _Checker, value: object) -> dict[str, Any] | None:
    """The Configuration's admissionFairSharing as the native one: the half-life (>= 0), the
    sampling interval (not negative; 5m when omitted or zero, as Kueue defaults it before it
    validates), the resource weights (>= 0; translated with the resource names, below)."""
    if value is None:
        return None
    path = "admissionFairSharing"
    fields = checker.mapping(
        value, path, {"usageHalfLifeTime", "usageSamplingInterval", "resourceWeights"}
    )
    native: dict[str, Any] = {}
    for key, default in (("usageHalfLifeTime", "0s"), ("usageSamplingInterval", "5m")):
        text = checker.string(fields.get(key, default), f"{path}.{key}")
        if text.startswith("-"):
            checker.fail(FieldError.INVALID, f"{path}.{key}", "must be greater than or equal to 0")
        elif text and not _DURATION.fullmatch(text):
            checker.fail(FieldError.INVALID, f"{path}.{key}", f"not a duration: {text!r}")
        elif key == "usageSamplingInterval" and re.fullmatch(r"(0+(\.0+)?[a-zµ]*)+", text):
            text = default  # Kueue defaults a zero interval before it validates: 5m
        native[key] = text
    weights = checker.mapping(fields.get("resourceWeights", {}), f"{path}.resourceWeights", None)
    native["resourceWeights"] = {}
    for name, weight in weights.items():
        where = f"{path}.resourceWeights[{name}]"
        checker.resource_name(name, where)
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            checker.fail(FieldError.INVALID, where, "must be a number")
        elif weight < 0:
            checker.fail(FieldError.INVALID, where, "must be greater than or equal to 0")
        else:
            native["resourceWeights"][name] = weight
    return native


# Kueue v0.17's feature gates that change a quota decision, with their defaults: gpualloc
# decides as Kueue does with these defaults, so a Configuration that turns one the other way is
# refused (the others are the manager's business).
QUOTA_FEATURE_GATES: Mapping[str, bool] = {
    "FlavorFungibility": True,
    "LendingLimit": True,
    "HierarchicalCohorts": True,
    "PrioritySortingWithinCohort": True,
    "FairSharingPreemptWithinNominal": True,
    "FairSharingPrioritizeNonBorrowing": True,
    "PriorityBoost": False,
}


def _feature_gates(checker: _Checker, value: object) -> None:
    gates = checker.mapping(value, "featureGates", None)
    for name, enabled in gates.items():
        where = f"featureGates[{name}]"
        if not isinstance(enabled, bool):
            checker.fail(FieldError.INVALID, where, "must be true or false")
        elif name in QUOTA_FEATURE_GATES and enabled != QUOTA_FEATURE_GATES[name]:
            checker.fail(
                FieldError.REFUSED,
                where,
                f"gpualloc decides as Kueue does with {name}={QUOTA_FEATURE_GATES[name]} "
                "(its default)",
            )


def _object_name(document: Mapping[str, Any]) -> str:
    """`name`, or `<namespace>/<name>` for a namespaced object (a LocalQueue)."""
    metadata = document.get("metadata")
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
        return ""
    namespace = metadata.get("namespace") if document.get("kind") in _NAMESPACED else ""
    prefix = f"{namespace}/" if isinstance(namespace, str) and namespace else ""
    return f"{prefix}{metadata['name']}"


def _description(checker: _Checker, document: Mapping[str, Any]) -> None:
    if "description" in document:
        text = checker.string(document["description"], "description", required=False)
        if len(text) > 2048:
            checker.fail(FieldError.TOO_LONG, "description", "must have at most 2048 characters")


def _resource_groups(
    checker: _Checker, value: object, in_cohort: bool, queue: _Queue, *, of_cohort: bool = False
) -> None:
    """spec.resourceGroups as Kueue's CRD and webhook check them (a ClusterQueue's, or a
    Cohort's: `of_cohort`); the quotas into `queue`."""
    groups = checker.sequence(value, "spec.resourceGroups")
    if len(groups) > 16:
        checker.fail(FieldError.TOO_MANY, "spec.resourceGroups", "must have at most 16 items")
    seen_resources: set[str] = set()
    seen_flavors: set[str] = set()
    total_flavors = total_resources = 0
    for i, group in enumerate(groups[:16]):  # past Kueue's limits nothing more is read
        path = f"spec.resourceGroups[{i}]"
        fields = checker.mapping(group, path, {"coveredResources", "flavors"})
        covered = checker.sequence(fields.get("coveredResources"), f"{path}.coveredResources")
        flavors = checker.sequence(fields.get("flavors"), f"{path}.flavors")
        for key, items in (("coveredResources", covered), ("flavors", flavors)):
            if not items:
                checker.fail(FieldError.REQUIRED, f"{path}.{key}", "must have at least 1 item")
            if len(items) > 64:
                checker.fail(FieldError.TOO_MANY, f"{path}.{key}", "must have at most 64 items")
        total_flavors += len(flavors)
        total_resources += len(covered)
        names: list[str] = []
        for j, raw in enumerate(covered[:64]):
            where = f"{path}.coveredResources[{j}]"
            name = checker.resource_name(raw, where)
            if name in seen_resources:
                checker.fail(FieldError.DUPLICATE, where, name)
            seen_resources.add(name)
            names.append(name)
        combinations = 0
        for j, item in enumerate(flavors[:64]):
            where = f"{path}.flavors[{j}]"
            flavor = checker.mapping(item, where, {"name", "resources"})
            flavor_name = checker.string(flavor.get("name"), f"{where}.name")
            for problem in dns1123_subdomain_errors(flavor_name) if flavor_name else ():
                checker.fail(FieldError.INVALID, f"{where}.name", problem)
            if flavor_name in seen_flavors:
                checker.fail(FieldError.DUPLICATE, f"{where}.name", flavor_name)
            seen_flavors.add(flavor_name)
            quotas = checker.sequence(flavor.get("resources"), f"{where}.resources")
            if not quotas:
                checker.fail(FieldError.REQUIRED, f"{where}.resources", "must have at least 1 item")
            if len(quotas) > 64:
                checker.fail(
                    FieldError.TOO_MANY, f"{where}.resources", "must have at most 64 items"
                )
            combinations += len(quotas)
            if len(quotas) != len(covered):
                checker.fail(
                    FieldError.INVALID,
                    path,
                    "flavors must have the same number of resources as the coveredResources",
                )
            for k, entry in enumerate(quotas[:64]):
                limits = _resource_quota(
                    checker, entry, f"{where}.resources[{k}]", in_cohort, of_cohort=of_cohort
                )
                if k < len(names) and limits is not None:
                    resource_name, fields_of = limits
                    if resource_name != names[k]:
                        checker.fail(
                            FieldError.INVALID,
                            f"{where}.resources[{k}].name",
                            "must match the name in coveredResources",
                        )
                        continue
                    if flavor_name:
                        covered_at = f"{path}.coveredResources[{k}]"
                        queue.quotas.append(
                            (resource_name, flavor_name, fields_of, where, covered_at)
                        )
        if combinations > 512:
            checker.fail(
                FieldError.INVALID,
                path,
                f"number of flavor-resource combinations in a resourceGroup must be <= 512, "
                f"got {combinations}",
            )
    for what, total in (("flavors", total_flavors), ("covered resources", total_resources)):
        if total > 256:
            checker.fail(
                FieldError.INVALID,
                "spec.resourceGroups",
                f"total number of {what} across all resourceGroups must be <= 256, got {total}",
            )


def _resource_quota(
    checker: _Checker, value: object, path: str, in_cohort: bool, *, of_cohort: bool = False
) -> tuple[str, dict[str, Any]] | None:
    """One ResourceQuota: (its name, the native limits: nominal, borrowingLimit,
    lendingLimit as written); None when it cannot be read. `in_cohort`: the ClusterQueue has a
    cohort (the Cohort a parent: `of_cohort`), without which it may neither borrow nor lend;
    a Cohort may lend more than its own nominal (its members' quota), a ClusterQueue not."""
    fields = checker.mapping(
        value, path, {"name", "nominalQuota", "borrowingLimit", "lendingLimit"}
    )
    name = checker.resource_name(fields.get("name"), f"{path}.name")
    nominal = checker.quantity(fields.get("nominalQuota"), f"{path}.nominalQuota")
    limits: dict[str, Any] = {"nominal": fields.get("nominalQuota")}
    for key, native in (("borrowingLimit", "borrowingLimit"), ("lendingLimit", "lendingLimit")):
        if key not in fields:
            continue
        amount = checker.quantity(fields[key], f"{path}.{key}")
        if not in_cohort:
            empty = "parent" if of_cohort else "cohort"
            checker.fail(FieldError.INVALID, f"{path}.{key}", f"must be nil when {empty} is empty")
        if (
            not of_cohort
            and key == "lendingLimit"
            and amount is not None
            and nominal is not None
            and amount > nominal
        ):
            checker.fail(
                FieldError.INVALID,
                f"{path}.{key}",
                "must be less than or equal to the nominalQuota",
            )
        limits[native] = fields[key]
    if not name or nominal is None:
        return None
    return name, limits


def _preemption(checker: _Checker, value: object) -> dict[str, Any]:
    """spec.preemption with Kueue's defaults written out (Never for all three: the native
    form's defaults differ, docs/tenancy.md)."""
    path = "spec.preemption"
    fields = checker.mapping(
        value, path, {"withinClusterQueue", "reclaimWithinCohort", "borrowWithinCohort"}
    )
    within = fields.get("withinClusterQueue", "Never")
    checker.choice(within, f"{path}.withinClusterQueue",
                   ("Never", "LowerPriority", "LowerOrNewerEqualPriority"))  # fmt: skip
    reclaim = fields.get("reclaimWithinCohort", "Never")
    checker.choice(reclaim, f"{path}.reclaimWithinCohort", ("Never", "LowerPriority", "Any"))
    borrow = checker.mapping(
        fields.get("borrowWithinCohort", {}),
        f"{path}.borrowWithinCohort",
        {"policy", "maxPriorityThreshold"},
    )
    policy = borrow.get("policy", "Never")
    checker.choice(policy, f"{path}.borrowWithinCohort.policy", ("Never", "LowerPriority"))
    native_borrow: dict[str, Any] = {"policy": policy}
    if "maxPriorityThreshold" in borrow:
        threshold = checker.int32(
            borrow["maxPriorityThreshold"], f"{path}.borrowWithinCohort.maxPriorityThreshold"
        )
        if policy == "LowerPriority":  # with Never, Kueue reads no threshold: neither do we
            native_borrow["maxPriorityThreshold"] = threshold
    if reclaim == "Never" and policy != "Never":
        checker.fail(
            FieldError.INVALID,
            path,
            "reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never",
        )
    return {
        "withinClusterQueue": within,
        "reclaimWithinCohort": reclaim,
        "borrowWithinCohort": native_borrow,
    }


_OLD_NAMES = {"Borrow": "MayStopSearch", "Preempt": "MayStopSearch"}  # v1beta1's deprecated


def _fungibility(checker: _Checker, value: object) -> dict[str, Any]:
    path = "spec.flavorFungibility"
    fields = checker.mapping(value, path, {"whenCanBorrow", "whenCanPreempt", "preference"})
    old = checker.version.endswith("v1beta1")
    borrow = fields.get("whenCanBorrow", "MayStopSearch")
    choices = ("MayStopSearch", "TryNextFlavor", *(("Borrow",) if old else ()))
    checker.choice(borrow, f"{path}.whenCanBorrow", choices)
    preempt = fields.get("whenCanPreempt", "TryNextFlavor")
    choices = ("MayStopSearch", "TryNextFlavor", *(("Preempt",) if old else ()))
    checker.choice(preempt, f"{path}.whenCanPreempt", choices)
    if "preference" in fields:
        where = f"{path}.preference"
        known = checker.choice(
            fields["preference"], where, ("BorrowingOverPreemption", "PreemptionOverBorrowing")
        )
        if known and (borrow != "TryNextFlavor" or preempt != "TryNextFlavor"):
            checker.fail(
                FieldError.INVALID,
                where,
                f"preference {fields['preference']!r} requires both whenCanBorrow and "
                "whenCanPreempt to be TryNextFlavor",
            )
    native = {  # Kueue's defaults written out, as the queue's preemption's
        "whenCanBorrow": _OLD_NAMES.get(str(borrow), borrow),
        "whenCanPreempt": _OLD_NAMES.get(str(preempt), preempt),
    }
    if "preference" in fields:
        native["preference"] = fields["preference"]
    return native


_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _taints(checker: _Checker, value: object, path: str) -> list[dict[str, Any]]:
    """A ResourceFlavor's nodeTaints as Kueue checks them (at most 8; a label name for a key,
    a label value; Kubernetes' effects; one per key and effect); as the native flavor's
    (`timeAdded`, a NoExecute taint's bookkeeping, is no part of admission)."""
    items = checker.sequence(value, path)
    if len(items) > 8:
        checker.fail(FieldError.TOO_MANY, path, "must have at most 8 items")
    taints: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for i, item in enumerate(items):
        where = f"{path}[{i}]"
        fields = checker.mapping(item, where, {"key", "value", "effect", "timeAdded"})
        key = checker.string(fields.get("key"), f"{where}.key")
        for problem in label_name_errors(key) if key else ():
            checker.fail(FieldError.INVALID, f"{where}.key", problem)
        text = checker.string(fields.get("value", ""), f"{where}.value", required=False)
        for problem in label_value_errors(text):
            checker.fail(FieldError.INVALID, f"{where}.value", problem)
        effect = fields.get("effect")
        if not checker.choice(effect, f"{where}.effect", _TAINT_EFFECTS):
            continue
        if (key, str(effect)) in seen:
            checker.fail(FieldError.DUPLICATE, where, "taints must be unique by key and effect")
        seen.add((key, str(effect)))
        taints.append({"key": key, **({"value": text} if text else {}), "effect": effect})
    return taints


def _tolerations(checker: _Checker, value: object, path: str) -> list[dict[str, Any]]:
    """A ResourceFlavor's tolerations as Kueue's CRD and webhook check them; as the native
    flavor's (`tolerationSeconds`, how long a pod stays on a NoExecute-tainted node, is the
    pods' business: Kueue injects it, admission reads it not)."""
    items = checker.sequence(value, path)
    if len(items) > 8:
        checker.fail(FieldError.TOO_MANY, path, "must have at most 8 items")
    tolerations: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"{path}[{i}]"
        allowed = {"key", "operator", "value", "effect", "tolerationSeconds"}
        fields = checker.mapping(item, where, allowed)
        key = checker.string(fields.get("key", ""), f"{where}.key", required=False)
        for problem in label_name_errors(key) if key else ():
            checker.fail(FieldError.INVALID, f"{where}.key", problem)
        operator = fields.get("operator", "Equal")
        if not checker.choice(operator, f"{where}.operator", ("Equal", "Exists")):
            continue
        if not key and operator != "Exists":
            checker.fail(
                FieldError.INVALID,
                f"{where}.operator",
                "operator must be Exists when 'key' is empty, which means 'match all values "
                "and all keys'",
            )
        text = checker.string(fields.get("value", ""), f"{where}.value", required=False)
        if operator == "Exists" and "value" in fields:
            checker.fail(
                FieldError.INVALID,
                f"{where}.value",
                "a value must be empty when 'operator' is 'Exists'",
            )
        effect = fields.get("effect")
        if effect is not None and not checker.choice(effect, f"{where}.effect", _TAINT_EFFECTS):
            continue
        if "tolerationSeconds" in fields:
            checker.int64(fields["tolerationSeconds"], f"{where}.tolerationSeconds")
            if effect != "NoExecute":
                checker.fail(
                    FieldError.INVALID,
                    f"{where}.effect",
                    "effect must be 'NoExecute' when 'tolerationSeconds' is set",
                )
        native: dict[str, Any] = {"operator": operator}
        if key:
            native["key"] = key
        if text:
            native["value"] = text
        if effect is not None:
            native["effect"] = effect
        tolerations.append(native)
    return tolerations


def _kueue_only_queue_fields(checker: _Checker, spec: Mapping[str, Any], v1beta1: bool) -> None:
    """Fields that stay with Kueue: checked for shape only (docs/tenancy.md's list)."""
    checker.choice(
        spec.get("queueingStrategy", "BestEffortFIFO"),
        "spec.queueingStrategy",
        ("StrictFIFO", "BestEffortFIFO"),
    )
    if "namespaceSelector" in spec:
        _label_selector(checker, spec["namespaceSelector"], "spec.namespaceSelector")
    if v1beta1:
        for i, name in enumerate(
            checker.sequence(spec.get("admissionChecks", []), "spec.admissionChecks")
        ):
            if len(checker.string(name, f"spec.admissionChecks[{i}]")) > 316:
                checker.fail(FieldError.TOO_LONG, f"spec.admissionChecks[{i}]", "at most 316")
    if "admissionChecksStrategy" in spec:
        where = "spec.admissionChecksStrategy"
        strategy = checker.mapping(spec["admissionChecksStrategy"], where, {"admissionChecks"})
        rules = checker.sequence(strategy.get("admissionChecks", []), f"{where}.admissionChecks")
        for i, rule in enumerate(rules):
            path = f"{where}.admissionChecks[{i}]"
            fields = checker.mapping(rule, path, {"name", "onFlavors"})
            checker.string(fields.get("name"), f"{path}.name")
            for j, flavor in enumerate(
                checker.sequence(fields.get("onFlavors", []), f"{path}.onFlavors")
            ):
                text = checker.string(flavor, f"{path}.onFlavors[{j}]")
                for problem in dns1123_subdomain_errors(text) if text else ():
                    checker.fail(FieldError.INVALID, f"{path}.onFlavors[{j}]", problem)


def _label_selector(checker: _Checker, value: object, path: str) -> None:
    """A metav1.LabelSelector, as ValidateLabelSelector checks it."""
    if value is None:
        return
    fields = checker.mapping(value, path, {"matchLabels", "matchExpressions"})
    for key, label in checker.mapping(
        fields.get("matchLabels", {}), f"{path}.matchLabels", None
    ).items():
        where = f"{path}.matchLabels[{key}]"
        for problem in label_name_errors(str(key)):
            checker.fail(FieldError.INVALID, where, problem)
        for problem in label_value_errors(checker.string(label, where, required=False)):
            checker.fail(FieldError.INVALID, where, problem)
    expressions = checker.sequence(fields.get("matchExpressions", []), f"{path}.matchExpressions")
    for i, item in enumerate(expressions):
        where = f"{path}.matchExpressions[{i}]"
        expression = checker.mapping(item, where, {"key", "operator", "values"})
        for problem in label_name_errors(checker.string(expression.get("key"), f"{where}.key")):
            checker.fail(FieldError.INVALID, f"{where}.key", problem)
        operator = expression.get("operator")
        checker.choice(operator, f"{where}.operator", ("In", "NotIn", "Exists", "DoesNotExist"))
        values = checker.sequence(expression.get("values", []), f"{where}.values")
        if operator in ("In", "NotIn") and not values:
            checker.fail(
                FieldError.REQUIRED, f"{where}.values", "must be specified for In or NotIn"
            )
        if operator in ("Exists", "DoesNotExist") and values:
            checker.fail(
                FieldError.FORBIDDEN,
                f"{where}.values",
                "may not be specified for Exists or DoesNotExist",
            )


def _fair_sharing(checker: _Checker, value: object, path: str) -> object | None:
    """fairSharing.weight: a quantity, 0 or above 10^-9 (it counts only where the
    Configuration enables fair sharing); the weight as written, None when unset."""
    if value is None:
        return None
    fields = checker.mapping(value, path, {"weight"})
    if "weight" not in fields:
        return None
    weight = checker.quantity(fields["weight"], f"{path}.weight", negative_ok=True)
    if weight is None:
        return None
    if weight.value < 0:
        checker.fail(FieldError.INVALID, f"{path}.weight", "must be greater than or equal to 0")
    elif 0 < weight.value <= _WEIGHT_FLOOR.value:
        checker.fail(FieldError.INVALID, f"{path}.weight", "When not 0, weight must be > 10e-9")
    weight_as_written: object = fields["weight"]
    return weight_as_written


class _Checker:
    """Typed field readers over one object: each records a KueueViolation and returns a
    harmless value."""

    def __init__(
        self,
        errors: list[FieldViolation],
        ref: ObjectRef,
        *,
        version: str = "",
        prefix: str = "",
    ) -> None:
        self.errors = errors
        self.ref = ref
        self.version = version
        self.prefix = prefix

    def fail(self, error: FieldError, path: str, description: str) -> None:
        if self.prefix:  # a field of the policy itself: a plain violation at its full path
            full = f"{self.prefix}.{path}" if path else self.prefix
            self.errors.append(KueueViolation(full, description, error))
            return
        self.errors.append(
            KueueViolation(path, description, error, self.ref.origin, self.ref.kind, self.ref.name)
        )

    def mapping(self, value: object, path: str, allowed: Iterable[str] | None) -> Mapping[str, Any]:
        if value is None:
            self.fail(FieldError.REQUIRED, path, "")
            return {}
        if not isinstance(value, Mapping):
            self.fail(FieldError.INVALID, path, f"must be a mapping, got {type(value).__name__}")
            return {}
        if allowed is not None:
            known = set(allowed)
            for key in value:
                if key not in known:
                    where = f"{path}.{key}" if path else str(key)
                    self.fail(FieldError.UNKNOWN, where, f"known: {', '.join(sorted(known))}")
        return value

    def sequence(self, value: object, path: str) -> Sequence[object]:
        if value is None:
            self.fail(FieldError.REQUIRED, path, "")
            return ()
        if not isinstance(value, list):
            self.fail(FieldError.INVALID, path, f"must be a list, got {type(value).__name__}")
            return ()
        return value

    def string(self, value: object, path: str, *, required: bool = True) -> str:
        if value is None or value == "":
            if required:
                self.fail(FieldError.REQUIRED, path, "")
            return ""
        if not isinstance(value, str):
            self.fail(FieldError.INVALID, path, f"must be a string, got {type(value).__name__}")
            return ""
        return value

    def choice(self, value: object, path: str, choices: Sequence[str]) -> bool:
        if value in choices:
            return True
        self.fail(
            FieldError.NOT_SUPPORTED, path, f"{value!r}: supported values: {', '.join(choices)}"
        )
        return False

    def int32(self, value: object, path: str) -> int:
        if value is None:
            self.fail(FieldError.REQUIRED, path, "")
            return 0
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(FieldError.INVALID, path, f"must be an integer, got {value!r}")
            return 0
        if not _INT32[0] <= value <= _INT32[1]:
            self.fail(FieldError.INVALID, path, "must fit in 32 bits")
            return 0
        return value

    def int64(self, value: object, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(FieldError.INVALID, path, f"must be an integer, got {value!r}")
            return 0
        if not -(2**63) <= value < 2**63:
            self.fail(FieldError.INVALID, path, "must fit in 64 bits")
            return 0
        return value

    def quantity(self, value: object, path: str, *, negative_ok: bool = False) -> Quantity | None:
        if value is None:
            self.fail(FieldError.REQUIRED, path, "")
            return None
        if isinstance(value, bool) or not isinstance(value, int | str):
            self.fail(FieldError.INVALID, path, f"must be an integer or a quantity, got {value!r}")
            return None
        try:
            quantity = Quantity.parse(str(value))
        except ValueError as error:
            self.fail(FieldError.INVALID, path, str(error))
            return None
        if quantity.value < 0 and not negative_ok:
            self.fail(FieldError.INVALID, path, "must be greater than or equal to 0")
            return None
        return quantity

    def resource_name(self, value: object, path: str) -> str:
        """A resource name (corev1.ResourceName as Kueue checks it: a qualified name)."""
        name = self.string(value, path)
        if len(name) > 253:
            self.fail(FieldError.INVALID, path, "must not exceed 253 characters")
            return ""
        for problem in label_name_errors(name) if name else ():
            self.fail(FieldError.INVALID, path, problem)
        return name
