"""Shared pieces of the DRA mapping: field paths, quantities, node selection, opaque config."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from google.protobuf import json_format, struct_pb2

from protos.common.v1 import dra_pb2
from services.common.dra.model import (
    DeviceID,
    DeviceSelector,
    Node,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    OpaqueDeviceConfiguration,
    TaintEffect,
)
from services.common.dra.quantity import Quantity
from services.common.errors import InvalidArgument

_MAX_EXACT_FLOAT_INT = 2**53

M = TypeVar("M")
P = TypeVar("P")

TAINT_EFFECTS: dict[TaintEffect, dra_pb2.TaintEffect.ValueType] = {
    TaintEffect.NO_SCHEDULE: dra_pb2.TAINT_EFFECT_NO_SCHEDULE,
    TaintEffect.NO_EXECUTE: dra_pb2.TAINT_EFFECT_NO_EXECUTE,
}


# --- paths and small helpers -----------------------------------------------------------------


def field_path(path: str, field: str | int, key: str | None = None) -> str:
    """`path` extended by a field name, a list index, or a field and map key.

    >>> field_path("claims[0]", "requests"), field_path("requests", 1)
    ('claims[0].requests', 'requests[1]')
    >>> field_path("devices[0]", "attributes", "productName")
    'devices[0].attributes["productName"]'
    """
    named = f"{path}.{field}" if path else str(field)
    step = f"{path}[{field}]" if isinstance(field, int) else named
    return step if key is None else f"{step}[{json.dumps(key)}]"


def items(values: Iterable[P], path: str, convert: Callable[[P, str], M]) -> tuple[M, ...]:
    """Convert a repeated field element by element, each with its indexed path."""
    return tuple(convert(value, field_path(path, i)) for i, value in enumerate(values))


def by_key(values: Mapping[str, P], path: str, convert: Callable[[P, str], M]) -> dict[str, M]:
    """Convert a map field entry by entry (sorted by key), each with its `["key"]` path."""
    return {key: convert(values[key], f"{path}[{json.dumps(key)}]") for key in sorted(values)}


def sorted_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return dict(sorted(labels.items()))


def reverse(table: Mapping[M, int], value: int, path: str, what: str) -> M:
    """The model value a protobuf enum number stands for; InvalidArgument for unknown ones."""
    for model_value, pb_value in table.items():
        if pb_value == value:
            return model_value
    raise InvalidArgument.at(path, f"unknown {what} {value}")


def required(path: str) -> InvalidArgument:
    return InvalidArgument.at(path, "must be set")


def not_empty(value: str, path: str) -> str:
    if not value:
        raise InvalidArgument.at(path, "must not be empty")
    return value


# --- identity and quantities -----------------------------------------------------------------


def to_pb_device_id(device_id: DeviceID) -> dra_pb2.DeviceID:
    return dra_pb2.DeviceID(driver=device_id.driver, pool=device_id.pool, device=device_id.device)


def from_pb_device_id(msg: dra_pb2.DeviceID, path: str = "") -> DeviceID:
    return DeviceID(
        driver=not_empty(msg.driver, field_path(path, "driver")),
        pool=not_empty(msg.pool, field_path(path, "pool")),
        device=not_empty(msg.device, field_path(path, "device")),
    )


def to_pb_quantity(quantity: Quantity) -> dra_pb2.Quantity:
    return dra_pb2.Quantity(value=quantity.canonical())


def from_pb_quantity(msg: dra_pb2.Quantity, path: str = "") -> Quantity:
    """The quantity; `path` names the Quantity field itself (e.g. `capacity["memory"].value`)."""
    if not msg.value:
        raise InvalidArgument.at(path, "quantity must not be empty")
    try:
        return Quantity.parse(msg.value)
    except ValueError as error:
        raise InvalidArgument.at(path, str(error)) from None


def quantities_to_pb(values: Mapping[str, Quantity]) -> dict[str, dra_pb2.Quantity]:
    return {key: to_pb_quantity(value) for key, value in values.items()}


def quantities_from_pb(values: Mapping[str, dra_pb2.Quantity], path: str) -> dict[str, Quantity]:
    return by_key(values, path, from_pb_quantity)


# --- node selection --------------------------------------------------------------------------


def _requirement_to_pb(req: NodeSelectorRequirement) -> dra_pb2.NodeSelectorRequirement:
    return dra_pb2.NodeSelectorRequirement(key=req.key, operator=req.operator, values=req.values)


def _requirement_from_pb(
    msg: dra_pb2.NodeSelectorRequirement, path: str
) -> NodeSelectorRequirement:
    return NodeSelectorRequirement(msg.key, msg.operator, tuple(msg.values))


def to_pb_node_selector(selector: NodeSelector) -> dra_pb2.NodeSelector:
    return dra_pb2.NodeSelector(
        node_selector_terms=[
            dra_pb2.NodeSelectorTerm(
                match_expressions=[_requirement_to_pb(r) for r in term.match_expressions],
                match_fields=[_requirement_to_pb(r) for r in term.match_fields],
            )
            for term in selector.node_selector_terms
        ]
    )


def _term_from_pb(msg: dra_pb2.NodeSelectorTerm, path: str) -> NodeSelectorTerm:
    expressions_path = field_path(path, "match_expressions")
    return NodeSelectorTerm(
        match_expressions=items(msg.match_expressions, expressions_path, _requirement_from_pb),
        match_fields=items(
            msg.match_fields, field_path(path, "match_fields"), _requirement_from_pb
        ),
    )


def from_pb_node_selector(msg: dra_pb2.NodeSelector, path: str = "") -> NodeSelector:
    terms_path = field_path(path, "node_selector_terms")
    return NodeSelector(items(msg.node_selector_terms, terms_path, _term_from_pb))


def to_pb_node(node: Node) -> dra_pb2.Node:
    return dra_pb2.Node(name=node.name, labels=node.labels)


def from_pb_node(msg: dra_pb2.Node, path: str = "") -> Node:
    return Node(not_empty(msg.name, field_path(path, "name")), sorted_labels(msg.labels))


# --- selectors and opaque configuration ------------------------------------------------------


def selector_to_pb(selector: DeviceSelector) -> dra_pb2.DeviceSelector:
    return dra_pb2.DeviceSelector(cel=selector.cel)


def selector_from_pb(msg: dra_pb2.DeviceSelector, path: str) -> DeviceSelector:
    if not msg.cel.strip():
        raise InvalidArgument.at(field_path(path, "cel"), "must not be empty")
    return DeviceSelector(msg.cel)


def to_pb_opaque_configuration(
    opaque: OpaqueDeviceConfiguration,
) -> dra_pb2.OpaqueDeviceConfiguration:
    parameters = struct_pb2.Struct()
    parameters.update(opaque.parameters)
    return dra_pb2.OpaqueDeviceConfiguration(driver=opaque.driver, parameters=parameters)


def from_pb_opaque_configuration(
    msg: dra_pb2.OpaqueDeviceConfiguration, path: str = ""
) -> OpaqueDeviceConfiguration:
    driver = not_empty(msg.driver, field_path(path, "driver"))
    _finite_numbers(msg.parameters, field_path(path, "parameters"))
    parameters: dict[str, Any] = json_format.MessageToDict(msg.parameters)
    return OpaqueDeviceConfiguration(driver, _integral_numbers(parameters))


def _finite_numbers(value: struct_pb2.Struct | struct_pb2.Value, path: str) -> None:
    """Parameters are JSON (a RawExtension upstream), which has no NaN or Infinity: a Struct
    number that is one is bad input at its own path, not an error converting it."""
    if isinstance(value, struct_pb2.Struct):
        for key in sorted(value.fields):
            _finite_numbers(value.fields[key], f"{path}[{json.dumps(key)}]")
        return
    kind = value.WhichOneof("kind")
    if kind == "number_value" and not math.isfinite(value.number_value):
        raise InvalidArgument.at(
            path, f"{value.number_value} is not a JSON number (JSON has no NaN or Infinity)"
        )
    if kind == "struct_value":
        _finite_numbers(value.struct_value, path)
    elif kind == "list_value":
        for index, item in enumerate(value.list_value.values):
            _finite_numbers(item, field_path(path, index))


def _integral_numbers(value: Any) -> Any:
    """Struct numbers are doubles; give back ints where the JSON number was integral."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= _MAX_EXACT_FLOAT_INT:
        return int(value)
    if isinstance(value, dict):
        return {key: _integral_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral_numbers(item) for item in value]
    return value
