"""The resource.k8s.io/v1 validation rules (Kubernetes 1.34) for model objects.

Parsed objects pass through here (parse.py calls these), and so can objects built in code, for
example from protobuf. Every check reports a `FieldViolation` with the Kubernetes field path
(`spec.devices[3].attributes["productName"].version`) and a description worded like the API
server's (`Required value`, `Invalid value: "x": ...`, `Duplicate value: ...`, `Too many: ...`).
`*_violations` return all violations; `validate_*` raise `InvalidArgument` carrying all of them,
with the first in the message.

Limits follow k8s.io/api resource/v1 types.go and pkg/apis/resource/validation at 1.34: <= 128
devices per slice, <= 32 attributes + capacities per device, <= 4 taints per device, <= 32
shared counters per slice, <= 32 consumed counters per device and <= 1024 per slice (consumed
counter sets must be defined in the same slice), <= 32 requests, constraints and configs per
claim, 1..8 subrequests, <= 32 selectors, CEL <= 10 KiB, <= 16 tolerations, <= 32 results.
Where the model cannot tell "unset" from a default (the count of an All request), parse.py
enforces the rule on the raw input and the model-level check accepts both forms.

This module is the public face; the rules live in private modules by kind: `_validate_slices`
(ResourceSlice, Device, counters, taints, NodeSelector), `_validate_claims` (DeviceClass,
ResourceClaim, AllocationResult) and `_validate_report` (the violation collector they share).
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.dra._validate_claims import (
    MAX_CEL_LENGTH,
    MAX_CONFIGS,
    MAX_CONSTRAINTS,
    MAX_OPAQUE_PARAMETERS_LENGTH,
    MAX_REQUESTS,
    MAX_SELECTORS,
    MAX_SUBREQUESTS,
    MAX_TOLERATIONS,
    allocation_result_violations,
    claim_request_names,
    device_class_violations,
    resource_claim_violations,
)
from services.common.dra._validate_report import key_path
from services.common.dra._validate_slices import (
    MAX_ATTRIBUTE_VALUE_LENGTH,
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_COUNTERS_PER_DEVICE,
    MAX_DEVICE_COUNTERS_PER_SLICE,
    MAX_DEVICES_PER_SLICE,
    MAX_SHARED_COUNTERS,
    MAX_TAINTS_PER_DEVICE,
    MAX_VALID_VALUES,
    node_selector_violations,
    resource_slice_violations,
)
from services.common.dra.model import AllocationResult, DeviceClass, ResourceClaim, ResourceSlice
from services.common.errors import FieldViolation, InvalidArgument

__all__ = [
    "MAX_ATTRIBUTES_AND_CAPACITIES",
    "MAX_ATTRIBUTE_VALUE_LENGTH",
    "MAX_CEL_LENGTH",
    "MAX_CONFIGS",
    "MAX_CONSTRAINTS",
    "MAX_COUNTERS_PER_DEVICE",
    "MAX_DEVICES_PER_SLICE",
    "MAX_DEVICE_COUNTERS_PER_SLICE",
    "MAX_OPAQUE_PARAMETERS_LENGTH",
    "MAX_REQUESTS",
    "MAX_SELECTORS",
    "MAX_SHARED_COUNTERS",
    "MAX_SUBREQUESTS",
    "MAX_TAINTS_PER_DEVICE",
    "MAX_TOLERATIONS",
    "MAX_VALID_VALUES",
    "allocation_result_violations",
    "device_class_violations",
    "key_path",
    "node_selector_violations",
    "raise_on_violations",
    "resource_claim_violations",
    "resource_slice_violations",
    "validate_allocation_result",
    "validate_device_class",
    "validate_resource_claim",
    "validate_resource_slice",
    "violations_error",
]


def raise_on_violations(violations: Sequence[FieldViolation], prefix: str = "") -> None:
    """Raise `violations_error(...)` when there are any violations."""
    if violations:
        raise violations_error(violations, prefix)


def violations_error(violations: Sequence[FieldViolation], prefix: str = "") -> InvalidArgument:
    """InvalidArgument carrying all violations; its message is `prefix`, the first violation and
    how many more there are."""
    message = f"{prefix}{violations[0]}"
    if len(violations) > 1:
        message += f" (and {len(violations) - 1} more)"
    return InvalidArgument(message, violations)


def validate_resource_slice(slice_: ResourceSlice, path: str = "spec") -> None:
    raise_on_violations(resource_slice_violations(slice_, path))


def validate_device_class(device_class: DeviceClass, path: str = "spec") -> None:
    raise_on_violations(device_class_violations(device_class, path))


def validate_resource_claim(
    claim: ResourceClaim, path: str = "spec", status_path: str = "status"
) -> None:
    raise_on_violations(resource_claim_violations(claim, path, status_path))


def validate_allocation_result(
    allocation: AllocationResult,
    path: str = "status.allocation",
    claim: ResourceClaim | None = None,
) -> None:
    """With `claim`, each result's request must name one of the claim's (sub)requests."""
    request_names = claim_request_names(claim) if claim is not None else None
    raise_on_violations(allocation_result_violations(allocation, path, request_names))
