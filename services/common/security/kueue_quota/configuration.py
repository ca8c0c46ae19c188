"""Kueue's Configuration (kind Configuration, or the ConfigMap Kueue's manifests and Helm
chart hold it in), read for what it says about quota: fair sharing and admission fair sharing
(as the native fields), the feature gates that change a quota decision (refused unless at
Kueue's defaults), deviceClassMappings (how a resource name counts) and excludeResourcePrefixes.
The manager's other settings are Kueue's own: checked for shape only."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from services.common.security.kueue_quota.fields import Checker, FieldError, ObjectRef

CONFIG_VERSIONS = ("config.kueue.x-k8s.io/v1beta1", "config.kueue.x-k8s.io/v1beta2")
_CONFIG_MAP_KEY = "controller_manager_config.yaml"  # Kueue's manifests and Helm chart
_CONFIGURATION_FIELDS = (
    "apiVersion", "kind", "namespace", "webhook", "leaderElection", "metrics", "health",
    "pprofBindAddress", "controller", "tls", "manageJobsWithoutQueueName",
    "managedJobsNamespaceSelector", "internalCertManagement", "waitForPodsReady",
    "clientConnection", "integrations", "multiKueue", "fairSharing", "admissionFairSharing",
    "resources", "featureGates", "objectRetentionPolicies",
)  # fmt: skip


@dataclass
class Configuration:
    """What a Configuration says about quota, natively."""

    ref: ObjectRef
    fair_sharing: dict[str, Any] | None = None  # quota.fairSharing; None: off
    admission_fair_sharing: dict[str, Any] | None = None
    excluded_prefixes: list[str] = field(default_factory=list)
    device_class_mappings: dict[str, dict[str, Any]] = field(default_factory=dict)


def configuration_in_config_map(
    checker: Checker, origin: str, document: Mapping[str, Any]
) -> tuple[str, Mapping[str, Any]] | None:
    """The Configuration a ConfigMap holds, with its origin; None (reported) when it holds
    none."""
    data = document.get("data")
    if not isinstance(data, Mapping) or _CONFIG_MAP_KEY not in data:
        checker.fail(
            FieldError.NOT_SUPPORTED,
            "kind",
            f"a ConfigMap is read only when it holds Kueue's Configuration ({_CONFIG_MAP_KEY})",
        )
        return None
    text = data[_CONFIG_MAP_KEY]
    where = f"{origin}.data[{_CONFIG_MAP_KEY}]"
    try:
        inner = yaml.safe_load(text) if isinstance(text, str) else None
    except yaml.YAMLError as error:
        checker.fail(FieldError.INVALID, f"data[{_CONFIG_MAP_KEY}]", f"not YAML: {error}")
        return None
    if not isinstance(inner, Mapping) or inner.get("kind") != "Configuration":
        checker.fail(FieldError.INVALID, f"data[{_CONFIG_MAP_KEY}]", "not a Configuration")
        return None
    return where, inner


def read_configuration(
    checker: Checker, document: Mapping[str, Any], first: ObjectRef | None
) -> Configuration | None:
    """The Configuration's quota settings; None (reported) when it is a second one (`first`:
    where the first came from)."""
    v1beta1 = checker.version.endswith("v1beta1")
    allowed = set(_CONFIGURATION_FIELDS) | (
        {"queueVisibility"} if v1beta1 else {"visibilityServer"}
    )
    checker.mapping(document, "", allowed)
    if first is not None:
        checker.fail(FieldError.DUPLICATE, "kind", f"a second Configuration ({first})")
        return None
    configuration = Configuration(checker.ref)
    configuration.fair_sharing = _configured_fair_sharing(
        checker, document.get("fairSharing"), v1beta1
    )
    configuration.admission_fair_sharing = _admission_fair_sharing(
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
    configuration.excluded_prefixes = [
        checker.string(p, f"resources.excludeResourcePrefixes[{i}]")
        for i, p in enumerate(
            checker.sequence(
                resources.get("excludeResourcePrefixes", []),
                "resources.excludeResourcePrefixes",
            )
        )
    ]
    _device_class_mappings(
        checker, resources.get("deviceClassMappings", []), configuration.device_class_mappings
    )
    return configuration


def _device_class_mappings(
    checker: Checker, value: object, mapped: dict[str, dict[str, Any]]
) -> None:
    """resources.deviceClassMappings, into `mapped` (resource name -> native fields)."""
    base = "resources.deviceClassMappings"
    mappings = checker.sequence(value, base)
    if len(mappings) > 16:
        checker.fail(FieldError.TOO_MANY, base, "must have at most 16 items")
    owner: dict[str, str] = {}
    for i, item in enumerate(mappings):
        path = f"{base}[{i}]"
        fields = checker.mapping(item, path, {"name", "deviceClassNames"})
        name = checker.resource_name(fields.get("name"), f"{path}.name")
        if name in mapped:
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
            mapped[name] = {"deviceClassNames": names}


_STRATEGIES = ("LessThanOrEqualToFinalShare", "LessThanInitialShare")
_STRATEGY_SETS = ((_STRATEGIES[0],), (_STRATEGIES[1],), _STRATEGIES)  # Kueue's valid lists


def _configured_fair_sharing(
    checker: Checker, value: object, v1beta1: bool
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


def _admission_fair_sharing(checker: Checker, value: object) -> dict[str, Any] | None:
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


def _feature_gates(checker: Checker, value: object) -> None:
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
