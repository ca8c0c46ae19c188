"""Decoders for the inventory side: ResourceSlice (devices, attributes, capacity, counters,
taints), core/v1 NodeSelector and core/v1 Node (name and labels).

Each object decoder returns the object and its violations (metadata plus validate.py's rules);
shape errors raise `Invalid`. Private to `services.common.dra`; `parse` is the face.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache

from services.common.dra import validate
from services.common.dra._parse_fields import (
    Fields,
    Invalid,
    json_type,
    metadata_name,
    parse_quantity,
    read_quantity,
)
from services.common.dra.model import (
    AttributeType,
    AttributeValue,
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    CounterSet,
    Device,
    DeviceCapacity,
    DeviceCounterConsumption,
    DeviceTaint,
    Node,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourcePool,
    ResourceSlice,
    TaintEffect,
)
from services.common.dra.quantity import Quantity
from services.common.errors import FieldViolation

__all__ = ["decode_node", "decode_node_selector", "decode_resource_slice"]

_ATTRIBUTE_TYPES = ("int", "bool", "string", "version")
_RAW_TYPE: dict[str, type] = {"int": int, "bool": bool, "string": str, "version": str}


def decode_resource_slice(f: Fields) -> tuple[ResourceSlice, list[FieldViolation]]:
    metadata, spec = f.obj("metadata") or Fields({}, "metadata"), f.required_obj("spec")
    violations: list[FieldViolation] = []
    name = metadata_name(metadata, violations)
    pool = spec.obj("pool") or Fields({}, "spec.pool")
    slice_ = ResourceSlice(
        name=name,
        driver=spec.str_("driver"),
        pool=ResourcePool(
            pool.str_("name"), pool.int_("generation", 0), pool.int_("resourceSliceCount", 0)
        ),
        devices=tuple(_device(d) for d in spec.objs("devices")),
        node_name=spec.opt_str("nodeName"),
        node_selector=decode_node_selector(spec.obj("nodeSelector")),
        all_nodes=spec.flag("allNodes"),
        per_device_node_selection=spec.flag("perDeviceNodeSelection"),
        shared_counters=tuple(
            CounterSet(c.str_("name"), _counters(c)) for c in spec.objs("sharedCounters")
        ),
        labels=metadata.str_map("labels"),
        api_version=str(f.data["apiVersion"]),
    )
    return slice_, violations + validate.resource_slice_violations(slice_)


def _counters(f: Fields) -> dict[str, Quantity]:
    """`counters: {name: {value: quantity}}`."""
    counters = {}
    for name, value in f.map_("counters").items():
        path = validate.key_path(f.at("counters"), name)
        if not isinstance(value, dict):
            raise Invalid(path, f"must be an object, got {json_type(value)}")
        counters[name] = Fields(value, path).quantity("value")
    return counters


def _device(f: Fields) -> Device:
    attributes = {key: _attribute(f, key, value) for key, value in f.map_("attributes").items()}
    capacity = {key: _capacity(f, key, value) for key, value in f.map_("capacity").items()}
    return Device(
        name=f.str_("name"),
        attributes=attributes,
        capacity=capacity,
        consumes_counters=tuple(
            DeviceCounterConsumption(c.str_("counterSet"), _counters(c))
            for c in f.objs("consumesCounters")
        ),
        taints=tuple(_taint(t) for t in f.objs("taints")),
        allow_multiple_allocations=f.opt_bool("allowMultipleAllocations") is True,
        node_name=f.opt_str("nodeName"),
        node_selector=decode_node_selector(f.obj("nodeSelector")),
        all_nodes=f.flag("allNodes"),
        binding_conditions=f.strs("bindingConditions"),
        binding_failure_conditions=f.strs("bindingFailureConditions"),
        binds_to_node=f.opt_bool("bindsToNode") is True,
    )


def _capacity(device: Fields, key: str, value: object) -> DeviceCapacity:
    if type(value) is dict and len(value) == 1 and type(value.get("value")) is str:
        with contextlib.suppress(ValueError):  # the common case, fast; errors take the long way
            return DeviceCapacity(parse_quantity(value["value"].strip()))
    path = validate.key_path(device.at("capacity"), key)
    if not isinstance(value, dict):
        raise Invalid(path, f"must be an object, got {json_type(value)}")
    entry = Fields(value, path)
    return DeviceCapacity(entry.quantity("value"), _request_policy(entry.obj("requestPolicy")))


def _attribute(device: Fields, key: str, value: object) -> AttributeValue:
    """`{int|bool|string|version: value}`, exactly one of them."""
    if type(value) is dict and len(value) == 1:  # the common case, fast
        ((kind, raw),) = value.items()
        expected = _RAW_TYPE.get(kind)
        if expected is not None and type(raw) is expected:
            return _attribute_value(kind, raw)
    present = [t for t in _ATTRIBUTE_TYPES if isinstance(value, dict) and value.get(t) is not None]
    path = validate.key_path(device.at("attributes"), key)
    if len(present) != 1:
        raise Invalid(path, "must have exactly one of int, bool, string, version")
    kind = present[0]
    assert isinstance(value, dict)
    if type(value[kind]) is not _RAW_TYPE[kind]:
        wanted = {"int": "an integer", "bool": "a boolean"}.get(kind, "a string")
        raise Invalid(f"{path}.{kind}", f"must be {wanted}, got {json_type(value[kind])}")
    return _attribute_value(kind, value[kind])


@lru_cache(maxsize=65536)
def _attribute_value(kind: str, raw: int | bool | str) -> AttributeValue:
    """Shared instances: the same attribute values repeat on every device of a fleet."""
    return AttributeValue(AttributeType(kind), raw)


def _request_policy(f: Fields | None) -> CapacityRequestPolicy | None:
    if f is None:
        return None
    valid_range = f.obj("validRange")
    return CapacityRequestPolicy(
        default=f.opt_quantity("default"),
        valid_values=tuple(
            read_quantity(v, f"{f.at('validValues')}[{i}]")
            for i, v in enumerate(f.list_("validValues"))
        ),
        valid_range=None
        if valid_range is None
        else CapacityRequestPolicyRange(
            valid_range.quantity("min"),
            valid_range.opt_quantity("max"),
            valid_range.opt_quantity("step"),
        ),
    )


def _taint(f: Fields) -> DeviceTaint:
    return DeviceTaint(
        key=f.str_("key"),
        effect=f.enum("effect", TaintEffect),
        value=f.str_("value"),
        time_added=f.opt_str("timeAdded"),
    )


def decode_node_selector(f: Fields | None) -> NodeSelector | None:
    if f is None:
        return None
    return NodeSelector(
        tuple(
            NodeSelectorTerm(
                tuple(_requirement(r) for r in term.objs("matchExpressions")),
                tuple(_requirement(r) for r in term.objs("matchFields")),
            )
            for term in f.objs("nodeSelectorTerms")
        )
    )


def _requirement(f: Fields) -> NodeSelectorRequirement:
    return NodeSelectorRequirement(f.str_("key"), f.str_("operator"), f.strs("values"))


def decode_node(f: Fields) -> tuple[Node, list[FieldViolation]]:
    metadata = f.obj("metadata") or Fields({}, "metadata")
    violations: list[FieldViolation] = []
    name = metadata_name(metadata, violations)
    return Node(name, metadata.str_map("labels")), violations
