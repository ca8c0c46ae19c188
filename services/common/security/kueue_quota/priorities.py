"""Priority classes: Kueue's WorkloadPriorityClass and Kubernetes' PriorityClass, as the
native `quota.priorityClasses[]` (a reservation names one)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common.security.kueue_quota.fields import Checker, FieldError

_HIGHEST_USER_PRIORITY = 1_000_000_000  # Kubernetes: a PriorityClass's value above it is system's
WPC_FIELDS = ("apiVersion", "kind", "metadata", "value", "description")
PRIORITY_CLASS_FIELDS = (*WPC_FIELDS, "globalDefault", "preemptionPolicy")


def read_workload_priority_class(checker: Checker, document: Mapping[str, Any]) -> dict[str, Any]:
    value = checker.int32(document.get("value"), "value")
    _description(checker, document)
    return {"name": checker.ref.name, "value": value}


def read_priority_class(
    checker: Checker, document: Mapping[str, Any], priorities: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """A PriorityClass (its name checked already); `priorities`: the classes read before it
    (one global default)."""
    name = checker.ref.name
    value = checker.int32(document.get("value"), "value")
    if value > _HIGHEST_USER_PRIORITY and not name.startswith("system-"):
        checker.fail(FieldError.FORBIDDEN, "value", f"must not exceed {_HIGHEST_USER_PRIORITY}")
    _description(checker, document)
    native: dict[str, Any] = {"name": name, "value": value}
    policy = document.get("preemptionPolicy", "PreemptLowerPriority")
    if policy not in ("PreemptLowerPriority", "Never"):
        checker.fail(FieldError.NOT_SUPPORTED, "preemptionPolicy", "PreemptLowerPriority, Never")
    elif policy == "Never":
        native["preemptionPolicy"] = "Never"
    default = document.get("globalDefault", False)
    if not isinstance(default, bool):
        checker.fail(FieldError.INVALID, "globalDefault", "must be true or false")
    elif default:
        others = [p["name"] for p in priorities.values() if p.get("globalDefault")]
        if others:
            checker.fail(
                FieldError.FORBIDDEN,
                "globalDefault",
                f"{others[0]} is already the global default",
            )
        native["globalDefault"] = True
    return native


def add_priority(
    checker: Checker, priorities: dict[str, dict[str, Any]], native: dict[str, Any]
) -> None:
    """`native` into `priorities`, unless a class of its name is there (refused)."""
    name = native["name"]
    if name in priorities:
        checker.fail(
            FieldError.DUPLICATE,
            "metadata.name",
            f"{name} is both a WorkloadPriorityClass and a PriorityClass (a reservation "
            "names one priority class)",
        )
        return
    priorities[name] = native


def _description(checker: Checker, document: Mapping[str, Any]) -> None:
    if "description" in document:
        text = checker.string(document["description"], "description", required=False)
        if len(text) > 2048:
            checker.fail(FieldError.TOO_LONG, "description", "must have at most 2048 characters")
