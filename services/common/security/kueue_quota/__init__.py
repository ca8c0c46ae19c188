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

The package, by concern: `fields` (the field checker and the error types), `objects` (reading
the documents by kind), `queues` (ClusterQueue: resource groups, preemption, fungibility),
`flavors` (ResourceFlavor), `cohorts` (Cohort and the tree's checks), `priorities`,
`configuration` (Kueue's Configuration), `resources` (how a resource name counts) and `native`
(the native section written from them); this module is the policy's side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from services.common.errors import FieldViolation
from services.common.security.kueue_quota.fields import (
    Checker,
    FieldError,
    KueueViolation,
    ObjectRef,
)
from services.common.security.kueue_quota.native import KueueTranslation, native_section
from services.common.security.kueue_quota.objects import KUEUE_GROUP, Objects
from services.common.security.kueue_quota.resources import (
    BUILT_IN_RESOURCES,
    NOT_ALLOCATED,
    Resources,
    explicit_resources,
    mig_profile_resource,
)

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

_FILES_LIMIT = 256
_OBJECTS_LIMIT = 5000  # objects in all: a site's queues, flavors and classes, with room to spare

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
    made = {**native, **translation.quota}
    if "uncountedDevices" in native:  # the site's word on what Kueue has no word for
        made["uncountedDevices"] = native["uncountedDevices"]
    return made, merged, translation


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
    top = Checker(errors, ObjectRef("spec.quota.kueue"), prefix="spec.quota.kueue")
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
    explicit = explicit_resources(top, fields.get("resources", []))
    not_enforced = {
        top.string(item, f"notEnforced[{i}]")
        for i, item in enumerate(top.sequence(fields.get("notEnforced", []), "notEnforced"))
    }
    objects = Objects(errors, _OBJECTS_LIMIT)
    for origin, document in documents:
        objects.add(origin, document)
    configuration = objects.configuration
    mappings = configuration.device_class_mappings if configuration is not None else {}
    resources = Resources(explicit, mappings, not_enforced - {""}, top)
    return native_section(objects, resources)
