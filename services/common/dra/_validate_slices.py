"""Validation of ResourceSlices (devices, attributes, capacity, counters, taints, node access)
and of core/v1 NodeSelectors, as pkg/apis/resource/validation does at Kubernetes 1.34.

Private to `services.common.dra`; `validate` is the face and re-exports the limits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.common.dra import names
from services.common.dra._validate_report import (
    MULTIPLE,
    CounterSets,
    Report,
    byte_length,
    key_path,
)
from services.common.dra.model import (
    AttributeType,
    AttributeValue,
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    CounterSet,
    Device,
    DeviceTaint,
    NodeSelector,
    NodeSelectorRequirement,
    ResourceSlice,
    TaintEffect,
)
from services.common.dra.quantity import Quantity
from services.common.errors import FieldViolation

__all__ = [
    "MAX_ATTRIBUTES_AND_CAPACITIES",
    "MAX_ATTRIBUTE_VALUE_LENGTH",
    "MAX_BINDING_CONDITIONS",
    "MAX_COUNTERS_PER_DEVICE",
    "MAX_DEVICES_PER_SLICE",
    "MAX_DEVICE_COUNTERS_PER_SLICE",
    "MAX_SHARED_COUNTERS",
    "MAX_TAINTS_PER_DEVICE",
    "MAX_VALID_VALUES",
    "node_selector_violations",
    "resource_slice_violations",
]

MAX_DEVICES_PER_SLICE = 128
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_TAINTS_PER_DEVICE = 4
MAX_SHARED_COUNTERS = 32
MAX_COUNTERS_PER_DEVICE = 32
MAX_DEVICE_COUNTERS_PER_SLICE = 1024
MAX_ATTRIBUTE_VALUE_LENGTH = 64
MAX_VALID_VALUES = 10
MAX_BINDING_CONDITIONS = 4  # each of bindingConditions and bindingFailureConditions

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
_UNKNOWN_COUNTER_SET = "must reference a counterSet defined in the ResourceSlice sharedCounters"
_UNKNOWN_COUNTER = "must reference a counter defined in the ResourceSlice sharedCounters"
_TOO_MANY_ENTRIES = "the total number of attributes and capacities must not exceed"
_TOO_MANY_POLICIES = (
    'exactly one policy can be specified, cannot specify "validValues" and "validRange" at the '
    "same time"
)


# --- ResourceSlice ------------------------------------------------------------------------


def resource_slice_violations(slice_: ResourceSlice, path: str = "spec") -> list[FieldViolation]:
    r = Report()
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


def _slice_node_access(r: Report, slice_: ResourceSlice, path: str) -> None:
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
        r.invalid(path, "{" + ", ".join(chosen) + "}", _ONE_NODE_ACCESS + MULTIPLE)


def _shared_counters(
    r: Report, counter_sets: Sequence[CounterSet], path: str
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


def _counters(r: Report, counters: Mapping[str, Quantity], path: str) -> None:
    if not counters:
        r.required(path)
    for name in counters:
        r.name(key_path(path, name), name, names.dns1123_label_errors)


def _device(
    r: Report, device: Device, path: str, per_device: bool, counter_sets: CounterSets
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
    for name, conditions in (
        ("bindingConditions", device.binding_conditions),
        ("bindingFailureConditions", device.binding_failure_conditions),
    ):
        if r.within(f"{path}.{name}", conditions, MAX_BINDING_CONDITIONS):
            for i, condition in enumerate(conditions):  # condition types (IsQualifiedName)
                r.check(f"{path}.{name}[{i}]", condition, names.label_name_errors)


def _attribute_is_valid(attribute: AttributeValue) -> bool:
    """The common case, checked without building field paths (10,000 slices must be cheap)."""
    kind, value = attribute.type, attribute.value
    if type(value) is str and (kind is AttributeType.STRING or kind is AttributeType.VERSION):
        short = len(value) <= MAX_ATTRIBUTE_VALUE_LENGTH and (
            value.isascii() or byte_length(value) <= MAX_ATTRIBUTE_VALUE_LENGTH
        )
        return short and (kind is AttributeType.STRING or not names.semver_errors(value))
    if kind is AttributeType.INT:
        return type(value) is int and value in _INT64
    return kind is AttributeType.BOOL and type(value) is bool


def _attribute_value(r: Report, attribute: AttributeValue, path: str) -> None:
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
        if byte_length(value) > MAX_ATTRIBUTE_VALUE_LENGTH:
            r.too_long(value_path, MAX_ATTRIBUTE_VALUE_LENGTH)
    else:
        r.not_supported(path, kind, [t.value for t in AttributeType])


def _request_policy(
    r: Report, capacity: Quantity, policy: CapacityRequestPolicy, path: str
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
    r: Report, capacity: Quantity, default: Quantity, values: Sequence[Quantity], path: str
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
    r: Report,
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


def _taint(r: Report, taint: DeviceTaint, path: str) -> None:
    r.check(f"{path}.key", taint.key, names.label_name_errors)
    if taint.value:
        r.check(f"{path}.value", taint.value, names.label_value_errors)
    if not isinstance(taint.effect, TaintEffect):
        r.not_supported(f"{path}.effect", taint.effect, [e.value for e in TaintEffect])


def _consumes_counters(r: Report, device: Device, path: str, counter_sets: CounterSets) -> None:
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


def _device_node_access(r: Report, device: Device, path: str, per_device: bool) -> None:
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
    r = Report()
    terms_path = f"{path}.nodeSelectorTerms"
    if not selector.node_selector_terms:
        r.required(terms_path, "must have at least one node selector term")
    for i, term in enumerate(selector.node_selector_terms):
        for j, requirement in enumerate(term.match_expressions):
            _label_requirement(r, requirement, f"{terms_path}[{i}].matchExpressions[{j}]")
        for j, requirement in enumerate(term.match_fields):
            _field_requirement(r, requirement, f"{terms_path}[{i}].matchFields[{j}]")
    return r


def _label_requirement(r: Report, requirement: NodeSelectorRequirement, path: str) -> None:
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


def _field_requirement(r: Report, requirement: NodeSelectorRequirement, path: str) -> None:
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
