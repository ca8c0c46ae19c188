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
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence

from services.common.dra import names
from services.common.dra.model import (
    AllocationMode,
    AllocationResult,
    AttributeType,
    AttributeValue,
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    ConfigSource,
    CounterSet,
    Device,
    DeviceClass,
    DeviceConstraint,
    DeviceSelector,
    DeviceSubRequest,
    DeviceTaint,
    DeviceToleration,
    ExactDeviceRequest,
    NodeSelector,
    NodeSelectorRequirement,
    OpaqueDeviceConfiguration,
    ResourceClaim,
    ResourceSlice,
    TaintEffect,
    TolerationOperator,
)
from services.common.dra.quantity import Quantity
from services.common.errors import FieldViolation, InvalidArgument

__all__ = [
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

MAX_DEVICES_PER_SLICE = 128
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_TAINTS_PER_DEVICE = 4
MAX_SHARED_COUNTERS = 32
MAX_COUNTERS_PER_DEVICE = 32
MAX_DEVICE_COUNTERS_PER_SLICE = 1024
MAX_ATTRIBUTE_VALUE_LENGTH = 64
MAX_REQUESTS = 32  # also the number of allocation results (AllocationResultsMaxSize)
MAX_CONSTRAINTS = 32
MAX_CONFIGS = 32
MAX_SUBREQUESTS = 8
MAX_SELECTORS = 32
MAX_TOLERATIONS = 16
MAX_CEL_LENGTH = 10 * 1024
MAX_OPAQUE_PARAMETERS_LENGTH = 10 * 1024
MAX_VALID_VALUES = 10

_INT64 = range(-(2**63), 2**63)
_ONE_NODE_ACCESS = (
    "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
)
_ONE_DEVICE_NODE_ACCESS = (
    "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
    "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"
)
_DEVICE_NODE_ACCESS_FORBIDDEN = (
    "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is "
    "set to true in the ResourceSlice spec"
)
_ONE_REQUEST_KIND = "exactly one of `exactly` or `firstAvailable` is required"
_ONE_CONSTRAINT_KIND = "exactly one of `matchAttribute` or `distinctAttribute` is required"
_MULTIPLE = ", but multiple fields are set"
_BAD_REQUEST_REF = (
    "must be the name of a request in the claim or the name of a request and a subrequest "
    "separated by '/'"
)
_UNKNOWN_COUNTER_SET = "must reference a counterSet defined in the ResourceSlice sharedCounters"
_UNKNOWN_COUNTER = "must reference a counter defined in the ResourceSlice sharedCounters"
_TOO_MANY_ENTRIES = "the total number of attributes and capacities must not exceed"
_TOO_MANY_POLICIES = (
    'exactly one policy can be specified, cannot specify "validValues" and "validRange" at the '
    "same time"
)
_NOT_JSON_OBJECT = "parameters must be a valid JSON object"

RequestNames = Mapping[str, frozenset[str]]  # request name -> its subrequest names
CounterSets = Mapping[str, frozenset[str]]  # counter-set name -> its counter names
Checker = Callable[[str], tuple[str, ...]]


# --- public API ---------------------------------------------------------------------------


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
    request_names = _request_names(claim) if claim is not None else None
    raise_on_violations(allocation_result_violations(allocation, path, request_names))


def key_path(path: str, key: str) -> str:
    """`path["key"]`: the field path of a map entry."""
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


# --- the collector: descriptions worded like k8s.io/apimachinery/.../validation/field -----


def _show(value: object) -> str:
    text = json.dumps(value) if isinstance(value, str | int | bool) else str(value)
    return text if len(text) <= 80 else text[:60] + "..." + text[-10:]


class _Report(list[FieldViolation]):
    """The violations found so far; one short method per kind of finding."""

    def required(self, path: str, detail: str = "") -> None:
        self.append(
            FieldViolation(path, f"Required value: {detail}" if detail else "Required value")
        )

    def invalid(self, path: str, value: object, detail: str) -> None:
        self.append(FieldViolation(path, f"Invalid value: {_show(value)}: {detail}"))

    def too_many(self, path: str, count: int, limit: int) -> None:
        self.append(FieldViolation(path, f"Too many: {count}: must have at most {limit} items"))

    def too_long(self, path: str, limit: int) -> None:
        self.append(FieldViolation(path, f"Too long: may not be more than {limit} bytes"))

    def forbidden(self, path: str, detail: str) -> None:
        self.append(FieldViolation(path, f"Forbidden: {detail}"))

    def not_supported(self, path: str, value: object, supported: Iterable[str]) -> None:
        choices = ", ".join(json.dumps(s) for s in sorted(supported))
        self.append(
            FieldViolation(path, f"Unsupported value: {_show(value)}: supported values: {choices}")
        )

    def check(self, path: str, value: str, checker: Checker) -> None:
        """Attach the findings of a `names` checker."""
        for error in checker(value):
            if error == "Required value":
                self.required(path)
            else:
                self.invalid(path, value, error)

    def name(self, path: str, value: str, checker: Checker) -> None:
        """A required name: empty is `Required value`, otherwise the checker's findings."""
        if value:
            self.check(path, value, checker)
        else:
            self.required(path)

    def duplicates(self, path: str, keys: Sequence[str], field: str = "") -> None:
        """`Duplicate value` at `path[i]` (or `path[i].field`) for each repeated key."""
        seen: set[str] = set()
        for i, key in enumerate(keys):
            if key in seen:
                self.append(FieldViolation(f"{path}[{i}]{field}", f"Duplicate value: {_show(key)}"))
            seen.add(key)

    def within(self, path: str, items: Sequence[object], limit: int) -> bool:
        """False (after reporting) when a list is over its limit; upstream then skips the items."""
        if len(items) <= limit:
            return True
        self.too_many(path, len(items), limit)
        return False


def _byte_length(text: str) -> int:
    """Go measures strings in UTF-8 bytes; a lone surrogate (JSON "\\ud800") counts as 3."""
    return len(text.encode("utf-8", "surrogatepass"))


# --- ResourceSlice ------------------------------------------------------------------------


def resource_slice_violations(slice_: ResourceSlice, path: str = "spec") -> list[FieldViolation]:
    r = _Report()
    r.check(f"{path}.driver", slice_.driver, names.driver_name_errors)
    pool = slice_.pool
    r.check(f"{path}.pool.name", pool.name, names.pool_name_errors)
    if pool.generation < 0:
        r.invalid(
            f"{path}.pool.generation", pool.generation, "must be greater than or equal to zero"
        )
    if pool.resource_slice_count <= 0:
        r.invalid(
            f"{path}.pool.resourceSliceCount",
            pool.resource_slice_count,
            "must be greater than zero",
        )
    _slice_node_access(r, slice_, path)
    counter_sets = _shared_counters(r, slice_.shared_counters, f"{path}.sharedCounters")
    devices_path = f"{path}.devices"
    if r.within(devices_path, slice_.devices, MAX_DEVICES_PER_SLICE):
        for i, device in enumerate(slice_.devices):
            _device(
                r, device, f"{devices_path}[{i}]", slice_.per_device_node_selection, counter_sets
            )
        r.duplicates(devices_path, [d.name for d in slice_.devices], ".name")
        total = sum(len(c.counters) for d in slice_.devices for c in d.consumes_counters)
        if total > MAX_DEVICE_COUNTERS_PER_SLICE:
            limit = MAX_DEVICE_COUNTERS_PER_SLICE
            r.invalid(
                devices_path,
                total,
                f"the total number of counters in devices must not exceed {limit}",
            )
    return r


def _slice_node_access(r: _Report, slice_: ResourceSlice, path: str) -> None:
    chosen: list[str] = []
    if slice_.node_name is not None:
        if slice_.node_name:
            chosen.append("`nodeName`")
            r.check(f"{path}.nodeName", slice_.node_name, names.dns1123_subdomain_errors)
        else:
            r.invalid(f"{path}.nodeName", "", "must be either unset or set to a non-empty string")
    if slice_.node_selector is not None:
        chosen.append("`nodeSelector`")
        r.extend(node_selector_violations(slice_.node_selector, f"{path}.nodeSelector"))
        terms = slice_.node_selector.node_selector_terms
        if len(terms) != 1:
            terms_path = f"{path}.nodeSelector.nodeSelectorTerms"
            r.invalid(terms_path, len(terms), "must have exactly one node selector term")
    if slice_.all_nodes:
        chosen.append("`allNodes`")
    if slice_.per_device_node_selection:
        chosen.append("`perDeviceNodeSelection`")
    if not chosen:
        r.required(path, _ONE_NODE_ACCESS)
    elif len(chosen) > 1:
        r.invalid(path, "{" + ", ".join(chosen) + "}", _ONE_NODE_ACCESS + _MULTIPLE)


def _shared_counters(
    r: _Report, counter_sets: Sequence[CounterSet], path: str
) -> dict[str, frozenset[str]]:
    """Check sharedCounters; return counter-set name -> counter names, for consumesCounters."""
    known: dict[str, frozenset[str]] = {}
    for i, counter_set in enumerate(counter_sets):
        r.name(f"{path}[{i}].name", counter_set.name, names.dns1123_label_errors)
        _counters(r, counter_set.counters, f"{path}[{i}].counters")
        known.setdefault(counter_set.name, frozenset(counter_set.counters))
    r.duplicates(path, [s.name for s in counter_sets], ".name")
    total = sum(len(s.counters) for s in counter_sets)
    if total > MAX_SHARED_COUNTERS:
        r.invalid(
            path,
            total,
            f"the total number of shared counters must not exceed {MAX_SHARED_COUNTERS}",
        )
    return known


def _counters(r: _Report, counters: Mapping[str, Quantity], path: str) -> None:
    if not counters:
        r.required(path)
    for name in counters:
        r.name(key_path(path, name), name, names.dns1123_label_errors)


def _device(
    r: _Report, device: Device, path: str, per_device: bool, counter_sets: CounterSets
) -> None:
    r.name(f"{path}.name", device.name, names.dns1123_label_errors)
    entries = len(device.attributes) + len(device.capacity)
    if entries > MAX_ATTRIBUTES_AND_CAPACITIES:
        r.invalid(path, entries, f"{_TOO_MANY_ENTRIES} {MAX_ATTRIBUTES_AND_CAPACITIES}")
    for key, attribute in device.attributes.items():
        if names.qualified_name_errors(key) or not _attribute_is_valid(attribute):
            attribute_path = key_path(f"{path}.attributes", key)  # paths only for the invalid
            r.check(attribute_path, key, names.qualified_name_errors)
            _attribute_value(r, attribute, attribute_path)
    for key, capacity in device.capacity.items():
        if not names.qualified_name_errors(key) and capacity.request_policy is None:
            continue
        capacity_path = key_path(f"{path}.capacity", key)
        r.check(capacity_path, key, names.qualified_name_errors)
        policy_path = f"{capacity_path}.requestPolicy"
        if capacity.request_policy is None:
            continue
        if device.allow_multiple_allocations:
            _request_policy(r, capacity.value, capacity.request_policy, policy_path)
        else:
            r.forbidden(policy_path, "allowMultipleAllocations must be true")
    if r.within(f"{path}.taints", device.taints, MAX_TAINTS_PER_DEVICE):
        for i, taint in enumerate(device.taints):
            _taint(r, taint, f"{path}.taints[{i}]")
    _consumes_counters(r, device, path, counter_sets)
    _device_node_access(r, device, path, per_device)


def _attribute_is_valid(attribute: AttributeValue) -> bool:
    """The common case, checked without building field paths (10,000 slices must be cheap)."""
    kind, value = attribute.type, attribute.value
    if type(value) is str and (kind is AttributeType.STRING or kind is AttributeType.VERSION):
        short = len(value) <= MAX_ATTRIBUTE_VALUE_LENGTH and (
            value.isascii() or _byte_length(value) <= MAX_ATTRIBUTE_VALUE_LENGTH
        )
        return short and (kind is AttributeType.STRING or not names.semver_errors(value))
    if kind is AttributeType.INT:
        return type(value) is int and value in _INT64
    return kind is AttributeType.BOOL and type(value) is bool


def _attribute_value(r: _Report, attribute: AttributeValue, path: str) -> None:
    kind, value = attribute.type, attribute.value
    if kind is AttributeType.INT:
        if not isinstance(value, int) or isinstance(value, bool) or value not in _INT64:
            r.invalid(f"{path}.int", value, "must be a 64-bit integer")
    elif kind is AttributeType.BOOL:
        if not isinstance(value, bool):
            r.invalid(f"{path}.bool", value, "must be a boolean")
    elif kind is AttributeType.STRING or kind is AttributeType.VERSION:
        value_path = f"{path}.{kind.value}"
        if not isinstance(value, str):
            r.invalid(value_path, value, "must be a string")
            return
        if kind is AttributeType.VERSION:
            r.check(value_path, value, names.semver_errors)
        if _byte_length(value) > MAX_ATTRIBUTE_VALUE_LENGTH:
            r.too_long(value_path, MAX_ATTRIBUTE_VALUE_LENGTH)
    else:
        r.not_supported(path, kind, [t.value for t in AttributeType])


def _request_policy(
    r: _Report, capacity: Quantity, policy: CapacityRequestPolicy, path: str
) -> None:
    """Consumable capacity: at most one of validValues/validRange, and a default they admit."""
    if policy.valid_values and policy.valid_range is not None:
        r.forbidden(path, _TOO_MANY_POLICIES)
    elif (policy.valid_values or policy.valid_range is not None) and policy.default is None:
        kind = "validValues" if policy.valid_values else "validRange"
        r.required(f"{path}.default", f"required when {kind} is defined")
    elif policy.valid_values and policy.default is not None:
        _valid_values(r, capacity, policy.default, policy.valid_values, f"{path}.validValues")
    elif policy.valid_range is not None and policy.default is not None:
        _valid_range(r, capacity, policy.default, policy.valid_range, f"{path}.validRange")


def _valid_values(
    r: _Report, capacity: Quantity, default: Quantity, values: Sequence[Quantity], path: str
) -> None:
    if not r.within(path, values, MAX_VALID_VALUES):
        return
    for i in range(1, len(values)):
        if values[i - 1] > values[i]:
            r.invalid(f"{path}[{i}]", str(values[i]), "values must be sorted in ascending order")
    for i, option in enumerate(values):
        if option > capacity:
            r.invalid(
                f"{path}[{i}]", str(option), f"option is larger than capacity value: {capacity}"
            )
    r.duplicates(path, [str(v.value) for v in values])
    if default not in values:
        r.invalid(path, str(default), "default value is not valid according to the requestPolicy")


def _valid_range(
    r: _Report,
    capacity: Quantity,
    default: Quantity,
    valid_range: CapacityRequestPolicyRange,
    path: str,
) -> None:
    low, high, step = valid_range.min, valid_range.max, valid_range.step
    if low > capacity:
        r.invalid(f"{path}.min", str(low), f"min is larger than capacity value: {capacity}")
    if default < low:
        r.invalid(f"{path}.min", str(default), f"default is less than min: {low}")
    if high is not None:
        if low > high:
            r.invalid(f"{path}.max", str(low), f"min is larger than max: {high}")
        if high > capacity:
            r.invalid(f"{path}.max", str(high), f"max is larger than capacity value: {capacity}")
        if default > high:
            r.invalid(f"{path}.max", str(default), f"default is more than max: {high}")
    if step is None:
        return
    step_path = f"{path}.step"
    if step.sign() <= 0:
        r.invalid(step_path, str(step), "must be greater than zero")
        return
    if low + step > capacity:
        r.invalid(
            step_path, str(step), f"one step {low + step} is larger than capacity value: {capacity}"
        )
    for value in (default, high):
        if value is not None and (value.value - low.value) / step.value % 1:
            r.invalid(
                step_path,
                str(value),
                f"value is not a multiple of a given step ({step}) from ({low})",
            )


def _taint(r: _Report, taint: DeviceTaint, path: str) -> None:
    r.check(f"{path}.key", taint.key, names.label_name_errors)
    if taint.value:
        r.check(f"{path}.value", taint.value, names.label_value_errors)
    if not isinstance(taint.effect, TaintEffect):
        r.not_supported(f"{path}.effect", taint.effect, [e.value for e in TaintEffect])


def _consumes_counters(r: _Report, device: Device, path: str, counter_sets: CounterSets) -> None:
    consumptions = device.consumes_counters
    for i, consumption in enumerate(consumptions):
        entry_path = f"{path}.consumesCounters[{i}]"
        set_name = consumption.counter_set
        r.name(f"{entry_path}.counterSet", set_name, names.dns1123_label_errors)
        _counters(r, consumption.counters, f"{entry_path}.counters")
        available = counter_sets.get(set_name)
        if available is None:
            r.invalid(f"{entry_path}.counterSet", set_name, _UNKNOWN_COUNTER_SET)
            continue
        for name in consumption.counters:
            if name not in available:
                r.invalid(key_path(f"{entry_path}.counters", name), name, _UNKNOWN_COUNTER)
    r.duplicates(f"{path}.consumesCounters", [c.counter_set for c in consumptions], ".counterSet")
    total = sum(len(c.counters) for c in consumptions)
    if total > MAX_COUNTERS_PER_DEVICE:
        r.invalid(
            path, total, f"the total number of counters must not exceed {MAX_COUNTERS_PER_DEVICE}"
        )


def _device_node_access(r: _Report, device: Device, path: str, per_device: bool) -> None:
    if not per_device:
        if device.node_name is not None or device.node_selector is not None or device.all_nodes:
            r.invalid(path, "", _DEVICE_NODE_ACCESS_FORBIDDEN)
        return
    chosen: list[str] = []
    if device.node_name is not None:
        if device.node_name:
            chosen.append("`nodeName`")
            r.check(f"{path}.nodeName", device.node_name, names.dns1123_subdomain_errors)
        else:
            r.invalid(f"{path}.nodeName", "", "must not be empty")
    if device.node_selector is not None:
        chosen.append("`nodeSelector`")
        r.extend(node_selector_violations(device.node_selector, f"{path}.nodeSelector"))
    if device.all_nodes:
        chosen.append("`allNodes`")
    if not chosen:
        r.required(path, _ONE_DEVICE_NODE_ACCESS)
    elif len(chosen) > 1:
        r.invalid(path, "{" + ", ".join(chosen) + "}", _ONE_DEVICE_NODE_ACCESS)


# --- core/v1 NodeSelector -----------------------------------------------------------------


def node_selector_violations(selector: NodeSelector, path: str) -> list[FieldViolation]:
    """core/v1 ValidateNodeSelector: >= 1 term; expressions on labels, fields on metadata.name."""
    r = _Report()
    terms_path = f"{path}.nodeSelectorTerms"
    if not selector.node_selector_terms:
        r.required(terms_path, "must have at least one node selector term")
    for i, term in enumerate(selector.node_selector_terms):
        for j, requirement in enumerate(term.match_expressions):
            _label_requirement(r, requirement, f"{terms_path}[{i}].matchExpressions[{j}]")
        for j, requirement in enumerate(term.match_fields):
            _field_requirement(r, requirement, f"{terms_path}[{i}].matchFields[{j}]")
    return r


def _label_requirement(r: _Report, requirement: NodeSelectorRequirement, path: str) -> None:
    operator, values = requirement.operator, requirement.values
    values_path = f"{path}.values"
    if operator in ("In", "NotIn"):
        if not values:
            r.required(values_path, "must be specified when `operator` is 'In' or 'NotIn'")
    elif operator in ("Exists", "DoesNotExist"):
        if values:
            detail = "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
            r.forbidden(values_path, detail)
    elif operator in ("Gt", "Lt"):
        if len(values) != 1:
            r.required(
                values_path, "must be specified single value when `operator` is 'Lt' or 'Gt'"
            )
    else:
        r.invalid(f"{path}.operator", operator, "not a valid selector operator")
    r.check(f"{path}.key", requirement.key, names.label_name_errors)
    for i, value in enumerate(values):
        r.check(f"{values_path}[{i}]", value, names.label_value_errors)


def _field_requirement(r: _Report, requirement: NodeSelectorRequirement, path: str) -> None:
    if requirement.operator not in ("In", "NotIn"):
        r.invalid(f"{path}.operator", requirement.operator, "not a valid selector operator")
    elif len(requirement.values) != 1:
        detail = "must be only one value when `operator` is 'In' or 'NotIn' for node field selector"
        r.required(f"{path}.values", detail)
    if requirement.key != "metadata.name":
        r.invalid(f"{path}.key", requirement.key, "not a valid field selector key")
        return
    for i, value in enumerate(requirement.values):
        r.check(f"{path}.values[{i}]", value, names.dns1123_subdomain_errors)


# --- DeviceClass --------------------------------------------------------------------------


def device_class_violations(device_class: DeviceClass, path: str = "spec") -> list[FieldViolation]:
    r = _Report()
    _selectors(r, device_class.selectors, f"{path}.selectors")
    if r.within(f"{path}.config", device_class.config, MAX_CONFIGS):
        for i, config in enumerate(device_class.config):
            _opaque(r, config, f"{path}.config[{i}].opaque")
    return r


def _selectors(r: _Report, selectors: Sequence[DeviceSelector], path: str) -> None:
    if not r.within(path, selectors, MAX_SELECTORS):
        return
    for i, selector in enumerate(selectors):
        expression_path = f"{path}[{i}].cel.expression"
        if not selector.cel.strip():
            r.required(expression_path)
        elif _byte_length(selector.cel) > MAX_CEL_LENGTH:
            r.too_long(expression_path, MAX_CEL_LENGTH)


def _opaque(r: _Report, opaque: OpaqueDeviceConfiguration, path: str) -> None:
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
    if _byte_length(encoded) > MAX_OPAQUE_PARAMETERS_LENGTH:
        r.too_long(parameters_path, MAX_OPAQUE_PARAMETERS_LENGTH)


# --- ResourceClaim ------------------------------------------------------------------------


def resource_claim_violations(
    claim: ResourceClaim, path: str = "spec", status_path: str = "status"
) -> list[FieldViolation]:
    """spec.devices (requests, constraints, config) and, when present, status.allocation."""
    r = _Report()
    request_names = _request_names(claim)
    requests_path = f"{path}.devices.requests"
    if r.within(requests_path, claim.requests, MAX_REQUESTS):
        for i, request in enumerate(claim.requests):
            request_path = f"{requests_path}[{i}]"
            r.name(f"{request_path}.name", request.name, names.dns1123_label_errors)
            if request.exactly is None and not request.first_available:
                r.required(request_path, _ONE_REQUEST_KIND)
            elif request.exactly is not None and request.first_available:
                r.invalid(request_path, "", _ONE_REQUEST_KIND + _MULTIPLE)
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


def _request_names(claim: ResourceClaim) -> dict[str, frozenset[str]]:
    return {q.name: frozenset(s.name for s in q.first_available) for q in claim.requests}


def _exact_request(r: _Report, request: ExactDeviceRequest, path: str) -> None:
    _class_and_selectors(r, request.device_class_name, request.selectors, path)
    _count(r, request.allocation_mode, request.count, path)
    _tolerations(r, request.tolerations, f"{path}.tolerations")
    if request.capacity is not None:
        for key in request.capacity.requests:
            capacity_path = key_path(f"{path}.capacity.requests", key)
            r.check(capacity_path, key, names.qualified_name_errors)


def _subrequests(r: _Report, subrequests: Sequence[DeviceSubRequest], path: str) -> None:
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
    r: _Report, class_name: str, selectors: Sequence[DeviceSelector], path: str
) -> None:
    class_path = f"{path}.deviceClassName"
    r.name(class_path, class_name, names.dns1123_subdomain_errors)
    _selectors(r, selectors, f"{path}.selectors")


def _count(r: _Report, mode: AllocationMode, count: int, path: str) -> None:
    if mode is AllocationMode.EXACT_COUNT:
        if count <= 0:
            r.invalid(f"{path}.count", count, "must be greater than zero")
    elif mode is AllocationMode.ALL:
        if count not in (0, 1):  # 0 and the model's default 1 both stand for "unset"
            r.invalid(f"{path}.count", count, "must not be specified when allocationMode is 'All'")
    else:
        r.not_supported(f"{path}.allocationMode", mode, [m.value for m in AllocationMode])


def _tolerations(r: _Report, tolerations: Sequence[DeviceToleration], path: str) -> None:
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
    r: _Report, constraint: DeviceConstraint, path: str, request_names: RequestNames
) -> None:
    _request_refs(r, constraint.requests, f"{path}.requests", request_names)
    match, distinct = constraint.match_attribute, constraint.distinct_attribute
    if match is not None and distinct is not None:
        r.invalid(path, "", _ONE_CONSTRAINT_KIND + _MULTIPLE)
    elif match is not None:
        r.name(f"{path}.matchAttribute", match, names.fully_qualified_name_errors)
    elif distinct is not None:
        r.name(f"{path}.distinctAttribute", distinct, names.fully_qualified_name_errors)
    else:
        r.required(f"{path}.matchAttribute")


def _request_refs(
    r: _Report, refs: Sequence[str], path: str, request_names: RequestNames | None
) -> None:
    if not r.within(path, refs, MAX_REQUESTS):
        return
    for i, ref in enumerate(refs):
        _request_ref(r, ref, f"{path}[{i}]", request_names)
    r.duplicates(path, refs)


def _request_ref(r: _Report, ref: str, path: str, request_names: RequestNames | None) -> None:
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
    r = _Report()
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
