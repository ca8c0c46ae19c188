"""The native quota section written from the Kueue objects read: a ClusterQueue is a tenant
(its quotas, cohort, preemption, flavorFungibility, fair-sharing weight), a Cohort a cohort,
each (resource, flavor) of their resource groups a flavored quota resource counted as
`Resources` says, ResourceFlavors the native flavors, priority classes the native ones, the
Configuration's fair sharing the native fields."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.common.security.kueue_quota.cohorts import check_cohort_tree
from services.common.security.kueue_quota.fields import Checker, FieldError, ObjectRef
from services.common.security.kueue_quota.objects import Objects
from services.common.security.kueue_quota.queues import Queue
from services.common.security.kueue_quota.resources import Resources


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


def native_section(objects: Objects, resources: Resources) -> KueueTranslation:
    """The native quota section and tenants of the objects read."""
    order: dict[str, list[str]] = {}  # enforced resource -> its flavors, first seen first
    not_enforced: list[tuple[str, str]] = []
    tenants = {
        name: {**queue.fields, "quotas": _quotas(objects, queue, resources, order, not_enforced)}
        for name, queue in objects.queues.items()
    }
    cohorts = [
        {"name": name, **cohort.fields,
         "quotas": _quotas(objects, cohort, resources, order, not_enforced)}
        for name, cohort in objects.cohorts.items()
    ]  # fmt: skip
    check_cohort_tree(objects.errors, objects.cohorts, objects.queues)
    declared = set(objects.cohorts)
    for cohort in list(objects.cohorts.values()):  # a parent no object declares: Kueue's
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
        "resourceFlavors": list(objects.flavors.values()),
        "priorityClasses": list(objects.priorities.values()),
        # Kueue admits no workload asking for a resource its ClusterQueue does not cover: a
        # limited tenant is not granted devices no quota resource counts either
        "uncountedDevices": "Refuse",
    }
    if cohorts:
        quota["cohorts"] = cohorts
    configuration = objects.configuration
    if configuration is not None and configuration.fair_sharing is not None:
        quota["fairSharing"] = configuration.fair_sharing
    if configuration is not None and configuration.admission_fair_sharing is not None:
        weights = configuration.admission_fair_sharing["resourceWeights"]
        quota["admissionFairSharing"] = {  # gpualloc counts no usage of the others
            **configuration.admission_fair_sharing,
            "resourceWeights": {r: w for r, w in weights.items() if r in order},
        }
    return KueueTranslation(quota, tenants, tuple(not_enforced), tuple(objects.kueue_only))


def _quotas(
    objects: Objects,
    queue: Queue,
    resources: Resources,
    order: dict[str, list[str]],
    not_enforced: list[tuple[str, str]],
) -> list[dict[str, Any]]:
    """The native quotas of a ClusterQueue's or Cohort's resource groups: those of
    resources gpualloc enforces; the others listed in `not_enforced` or refused."""
    checker = Checker(objects.errors, queue.ref)
    quotas: list[dict[str, Any]] = []
    missing: set[str] = set()
    refused: set[str] = set()
    for resource, flavor, limits, path, covered_at in queue.quotas if queue.valid else ():
        if flavor not in objects.flavors and flavor not in missing:
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
        configuration = objects.configuration
        excluded = configuration.excluded_prefixes if configuration is not None else []
        for prefix in excluded:
            if resource.startswith(prefix) and configuration is not None:
                Checker(objects.errors, configuration.ref).fail(
                    FieldError.REFUSED,
                    "resources.excludeResourcePrefixes",
                    f"{prefix} excludes {resource}, which gpualloc enforces",
                )
        flavors = order.setdefault(resource, [])
        if flavor not in flavors:
            flavors.append(flavor)
        quotas.append({"resource": resource, "flavor": flavor, **limits})
    return quotas
