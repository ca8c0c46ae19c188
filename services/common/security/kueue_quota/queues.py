"""A ClusterQueue read as Kueue's CRD and webhook check it: its resource groups (flavored
quotas, also a Cohort's), its preemption and flavorFungibility with Kueue's defaults written
out, its fair-sharing weight, and the fields that stay with Kueue (checked for shape)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.common.dra.names import (
    dns1123_subdomain_errors,
    label_name_errors,
    label_value_errors,
)
from services.common.dra.quantity import Quantity
from services.common.security.kueue_quota.fields import Checker, FieldError, ObjectRef

_WEIGHT_FLOOR = Quantity.parse("1n")
QUEUE_FIELDS = (
    "resourceGroups", "queueingStrategy", "namespaceSelector", "flavorFungibility", "preemption",
    "admissionChecksStrategy", "stopPolicy", "fairSharing", "admissionScope",
)  # fmt: skip


@dataclass
class Queue:
    """A ClusterQueue read: its tenant fields and its resources per flavor, in order."""

    ref: ObjectRef
    fields: dict[str, Any]
    # (resource, flavor, limits, the flavor's path, the covered resource's path), in order
    quotas: list[tuple[str, str, dict[str, Any], str, str]]
    valid: bool = True  # False: the queue's own fields are wrong (no checks across objects)


def read_cluster_queue(checker: Checker, document: Mapping[str, Any]) -> Queue:
    """A ClusterQueue's tenant fields and quotas (`valid`: its own fields are right)."""
    v1beta1 = checker.version.endswith("v1beta1")
    cohort_field = "cohort" if v1beta1 else "cohortName"
    allowed = set(QUEUE_FIELDS) | {cohort_field} | ({"admissionChecks"} if v1beta1 else set())
    spec = checker.mapping(document.get("spec", {}), "spec", allowed)
    cohort = checker.string(spec.get(cohort_field, ""), f"spec.{cohort_field}", required=False)
    for problem in dns1123_subdomain_errors(cohort) if cohort else ():
        checker.fail(FieldError.INVALID, f"spec.{cohort_field}", problem)
    fields: dict[str, Any] = {"cohort": cohort} if cohort else {}
    queue = Queue(checker.ref, fields, [])
    before = len(checker.errors)
    resource_groups(checker, spec.get("resourceGroups", []), bool(cohort), queue)
    fields["preemption"] = _preemption(checker, spec.get("preemption", {}))
    fields["flavorFungibility"] = _fungibility(checker, spec.get("flavorFungibility", {}))
    _kueue_only_queue_fields(checker, spec, v1beta1)
    stop = spec.get("stopPolicy", "None")
    if checker.choice(stop, "spec.stopPolicy", ("None", "Hold", "HoldAndDrain")) and stop != "None":
        checker.fail(
            FieldError.REFUSED,
            "spec.stopPolicy",
            f"{stop}: a stopped ClusterQueue is not supported (remove the tenant's quotas "
            "to stop its grants)",
        )
    weight = fair_sharing_weight(checker, spec.get("fairSharing"), "spec.fairSharing")
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
    queue.valid = len(checker.errors) == before
    return queue


def resource_groups(
    checker: Checker, value: object, in_cohort: bool, queue: Queue, *, of_cohort: bool = False
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
    checker: Checker, value: object, path: str, in_cohort: bool, *, of_cohort: bool = False
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


def _preemption(checker: Checker, value: object) -> dict[str, Any]:
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


def _fungibility(checker: Checker, value: object) -> dict[str, Any]:
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


def _kueue_only_queue_fields(checker: Checker, spec: Mapping[str, Any], v1beta1: bool) -> None:
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


def _label_selector(checker: Checker, value: object, path: str) -> None:
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


def fair_sharing_weight(checker: Checker, value: object, path: str) -> object | None:
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
