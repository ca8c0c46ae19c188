"""Validation of DeviceClasses, ResourceClaims (requests, constraints, config) and their
AllocationResults, as pkg/apis/resource/validation does at Kubernetes 1.34.

Private to `services.common.dra`; `validate` is the face and re-exports the limits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from services.common.dra import names
from services.common.dra._validate_report import (
    MULTIPLE,
    Report,
    RequestNames,
    byte_length,
    key_path,
)
from services.common.dra._validate_slices import node_selector_violations
from services.common.dra.model import (
    AllocationMode,
    AllocationResult,
    ConfigSource,
    DeviceClass,
    DeviceConstraint,
    DeviceSelector,
    DeviceSubRequest,
    DeviceToleration,
    ExactDeviceRequest,
    OpaqueDeviceConfiguration,
    ResourceClaim,
    TaintEffect,
    TolerationOperator,
)
from services.common.errors import FieldViolation

__all__ = [
    "MAX_CEL_LENGTH",
    "MAX_CONFIGS",
    "MAX_CONSTRAINTS",
    "MAX_OPAQUE_PARAMETERS_LENGTH",
    "MAX_REQUESTS",
    "MAX_SELECTORS",
    "MAX_SUBREQUESTS",
    "MAX_TOLERATIONS",
    "allocation_result_violations",
    "claim_request_names",
    "device_class_violations",
    "resource_claim_violations",
]

MAX_REQUESTS = 32  # also the number of allocation results (AllocationResultsMaxSize)
MAX_CONSTRAINTS = 32
MAX_CONFIGS = 32
MAX_SUBREQUESTS = 8
MAX_SELECTORS = 32
MAX_TOLERATIONS = 16
MAX_CEL_LENGTH = 10 * 1024
MAX_OPAQUE_PARAMETERS_LENGTH = 10 * 1024

_ONE_REQUEST_KIND = "exactly one of `exactly` or `firstAvailable` is required"
_ONE_CONSTRAINT_KIND = "exactly one of `matchAttribute` or `distinctAttribute` is required"
_BAD_REQUEST_REF = (
    "must be the name of a request in the claim or the name of a request and a subrequest "
    "separated by '/'"
)
_NOT_JSON_OBJECT = "parameters must be a valid JSON object"


# --- DeviceClass --------------------------------------------------------------------------


def device_class_violations(device_class: DeviceClass, path: str = "spec") -> list[FieldViolation]:
    r = Report()
    _selectors(r, device_class.selectors, f"{path}.selectors")
    if r.within(f"{path}.config", device_class.config, MAX_CONFIGS):
        for i, config in enumerate(device_class.config):
            _opaque(r, config, f"{path}.config[{i}].opaque")
    return r


def _selectors(r: Report, selectors: Sequence[DeviceSelector], path: str) -> None:
    if not r.within(path, selectors, MAX_SELECTORS):
        return
    for i, selector in enumerate(selectors):
        expression_path = f"{path}[{i}].cel.expression"
        if not selector.cel.strip():
            r.required(expression_path)
        elif byte_length(selector.cel) > MAX_CEL_LENGTH:
            r.too_long(expression_path, MAX_CEL_LENGTH)


def _opaque(r: Report, opaque: OpaqueDeviceConfiguration, path: str) -> None:
    r.check(f"{path}.driver", opaque.driver, names.driver_name_errors)
    parameters_path = f"{path}.parameters"
    if not isinstance(opaque.parameters, Mapping):
        r.invalid(parameters_path, "<value omitted>", _NOT_JSON_OBJECT)
        return
    if not opaque.parameters:
        r.required(parameters_path)
        return
    try:
        encoded = json.dumps(opaque.parameters, separators=(",", ":"))
    except (TypeError, ValueError):
        r.invalid(parameters_path, "<value omitted>", _NOT_JSON_OBJECT)
        return
    if byte_length(encoded) > MAX_OPAQUE_PARAMETERS_LENGTH:
        r.too_long(parameters_path, MAX_OPAQUE_PARAMETERS_LENGTH)


# --- ResourceClaim ------------------------------------------------------------------------


def resource_claim_violations(
    claim: ResourceClaim, path: str = "spec", status_path: str = "status"
) -> list[FieldViolation]:
    """spec.devices (requests, constraints, config) and, when present, status.allocation."""
    r = Report()
    request_names = claim_request_names(claim)
    requests_path = f"{path}.devices.requests"
    if r.within(requests_path, claim.requests, MAX_REQUESTS):
        for i, request in enumerate(claim.requests):
            request_path = f"{requests_path}[{i}]"
            r.name(f"{request_path}.name", request.name, names.dns1123_label_errors)
            if request.exactly is None and not request.first_available:
                r.required(request_path, _ONE_REQUEST_KIND)
            elif request.exactly is not None and request.first_available:
                r.invalid(request_path, "", _ONE_REQUEST_KIND + MULTIPLE)
            elif request.exactly is not None:
                _exact_request(r, request.exactly, f"{request_path}.exactly")
            else:
                _subrequests(r, request.first_available, f"{request_path}.firstAvailable")
        r.duplicates(requests_path, [q.name for q in claim.requests], ".name")
    constraints_path = f"{path}.devices.constraints"
    if r.within(constraints_path, claim.constraints, MAX_CONSTRAINTS):
        for i, constraint in enumerate(claim.constraints):
            _constraint(r, constraint, f"{constraints_path}[{i}]", request_names)
    config_path = f"{path}.devices.config"
    if r.within(config_path, claim.config, MAX_CONFIGS):
        for i, config in enumerate(claim.config):
            _request_refs(r, config.requests, f"{config_path}[{i}].requests", request_names)
            _opaque(r, config.opaque, f"{config_path}[{i}].opaque")
    if claim.allocation is not None:
        allocation_path = f"{status_path}.allocation"
        r.extend(allocation_result_violations(claim.allocation, allocation_path, request_names))
    return r


def claim_request_names(claim: ResourceClaim) -> dict[str, frozenset[str]]:
    """Request name -> its subrequest names: what a result or a reference may name."""
    return {q.name: frozenset(s.name for s in q.first_available) for q in claim.requests}


def _exact_request(r: Report, request: ExactDeviceRequest, path: str) -> None:
    _class_and_selectors(r, request.device_class_name, request.selectors, path)
    _count(r, request.allocation_mode, request.count, path)
    _tolerations(r, request.tolerations, f"{path}.tolerations")
    if request.capacity is not None:
        for key in request.capacity.requests:
            capacity_path = key_path(f"{path}.capacity.requests", key)
            r.check(capacity_path, key, names.qualified_name_errors)


def _subrequests(r: Report, subrequests: Sequence[DeviceSubRequest], path: str) -> None:
    if not r.within(path, subrequests, MAX_SUBREQUESTS):
        return
    for i, sub in enumerate(subrequests):
        sub_path = f"{path}[{i}]"
        r.name(f"{sub_path}.name", sub.name, names.dns1123_label_errors)
        _class_and_selectors(r, sub.device_class_name, sub.selectors, sub_path)
        _count(r, sub.allocation_mode, sub.count, sub_path)
        _tolerations(r, sub.tolerations, f"{sub_path}.tolerations")
    r.duplicates(path, [s.name for s in subrequests], ".name")


def _class_and_selectors(
    r: Report, class_name: str, selectors: Sequence[DeviceSelector], path: str
) -> None:
    class_path = f"{path}.deviceClassName"
    r.name(class_path, class_name, names.dns1123_subdomain_errors)
    _selectors(r, selectors, f"{path}.selectors")


def _count(r: Report, mode: AllocationMode, count: int, path: str) -> None:
    if mode is AllocationMode.EXACT_COUNT:
        if count <= 0:
            r.invalid(f"{path}.count", count, "must be greater than zero")
    elif mode is AllocationMode.ALL:
        if count not in (0, 1):  # 0 and the model's default 1 both stand for "unset"
            r.invalid(f"{path}.count", count, "must not be specified when allocationMode is 'All'")
    else:
        r.not_supported(f"{path}.allocationMode", mode, [m.value for m in AllocationMode])


def _tolerations(r: Report, tolerations: Sequence[DeviceToleration], path: str) -> None:
    if not r.within(path, tolerations, MAX_TOLERATIONS):
        return
    for i, toleration in enumerate(tolerations):
        toleration_path = f"{path}[{i}]"
        if toleration.key:
            r.check(f"{toleration_path}.key", toleration.key, names.label_name_errors)
        value_path = f"{toleration_path}.value"
        if toleration.operator is TolerationOperator.EXISTS:
            if toleration.value:
                r.invalid(value_path, toleration.value, "must be empty for operator `Exists`")
        elif toleration.operator is TolerationOperator.EQUAL:
            r.check(value_path, toleration.value, names.label_value_errors)
        else:
            operators = [o.value for o in TolerationOperator]
            r.not_supported(f"{toleration_path}.operator", toleration.operator, operators)
        if toleration.effect is not None and not isinstance(toleration.effect, TaintEffect):
            effects = [e.value for e in TaintEffect]
            r.not_supported(f"{toleration_path}.effect", toleration.effect, effects)


def _constraint(
    r: Report, constraint: DeviceConstraint, path: str, request_names: RequestNames
) -> None:
    _request_refs(r, constraint.requests, f"{path}.requests", request_names)
    match, distinct = constraint.match_attribute, constraint.distinct_attribute
    if match is not None and distinct is not None:
        r.invalid(path, "", _ONE_CONSTRAINT_KIND + MULTIPLE)
    elif match is not None:
        r.name(f"{path}.matchAttribute", match, names.fully_qualified_name_errors)
    elif distinct is not None:
        r.name(f"{path}.distinctAttribute", distinct, names.fully_qualified_name_errors)
    else:
        r.required(f"{path}.matchAttribute")


def _request_refs(
    r: Report, refs: Sequence[str], path: str, request_names: RequestNames | None
) -> None:
    if not r.within(path, refs, MAX_REQUESTS):
        return
    for i, ref in enumerate(refs):
        _request_ref(r, ref, f"{path}[{i}]", request_names)
    r.duplicates(path, refs)


def _request_ref(r: Report, ref: str, path: str, request_names: RequestNames | None) -> None:
    """`req` or `req/sub`; with `request_names`, it must name one of the claim's."""
    segments = ref.split("/")
    if len(segments) > 2:
        r.invalid(path, ref, _BAD_REQUEST_REF)
        return
    for segment in segments:
        r.name(path, segment, names.dns1123_label_errors)
    if request_names is None:
        return
    subrequests = request_names.get(segments[0])
    if subrequests is None or (len(segments) == 2 and segments[1] not in subrequests):
        r.invalid(path, ref, _BAD_REQUEST_REF)


# --- AllocationResult ---------------------------------------------------------------------


def allocation_result_violations(
    allocation: AllocationResult,
    path: str = "status.allocation",
    request_names: RequestNames | None = None,
) -> list[FieldViolation]:
    """A claim's status.allocation; `request_names` (request -> subrequests) enables the check
    that every result names a request of the claim."""
    r = Report()
    results_path = f"{path}.devices.results"
    if r.within(results_path, allocation.results, MAX_REQUESTS):
        for i, result in enumerate(allocation.results):
            result_path = f"{results_path}[{i}]"
            _request_ref(r, result.request, f"{result_path}.request", request_names)
            r.check(f"{result_path}.driver", result.driver, names.driver_name_errors)
            r.check(f"{result_path}.pool", result.pool, names.pool_name_errors)
            r.name(f"{result_path}.device", result.device, names.dns1123_label_errors)
            _tolerations(r, result.tolerations, f"{result_path}.tolerations")
            if result.share_id is not None:
                r.check(f"{result_path}.shareID", result.share_id, names.uid_errors)
            for key in result.consumed_capacity:
                capacity_path = key_path(f"{result_path}.consumedCapacity", key)
                r.check(capacity_path, key, names.qualified_name_errors)
    config_path = f"{path}.devices.config"
    if r.within(config_path, allocation.config, 2 * MAX_CONFIGS):  # class + claim configs
        for i, config in enumerate(allocation.config):
            if not isinstance(config.source, ConfigSource):
                sources = [s.value for s in ConfigSource]
                r.not_supported(f"{config_path}[{i}].source", config.source, sources)
            _request_refs(r, config.requests, f"{config_path}[{i}].requests", request_names)
            _opaque(r, config.opaque, f"{config_path}[{i}].opaque")
    if allocation.node_selector is not None:
        r.extend(node_selector_violations(allocation.node_selector, f"{path}.nodeSelector"))
    return r
