"""A ResourceFlavor read as Kueue's CRD and webhook check it, as the native flavor: its
nodeLabels, nodeTaints and tolerations (topologyName is refused: Kueue's topology-aware
scheduling is not gpualloc's)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common.dra.names import label_name_errors, label_value_errors
from services.common.security.kueue_quota.fields import Checker, FieldError


def read_resource_flavor(checker: Checker, document: Mapping[str, Any]) -> dict[str, Any]:
    """The native flavor of a ResourceFlavor (named as the object)."""
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
    return native


_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _taints(checker: Checker, value: object, path: str) -> list[dict[str, Any]]:
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


def _tolerations(checker: Checker, value: object, path: str) -> list[dict[str, Any]]:
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
