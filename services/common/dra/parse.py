"""DRA objects from YAML or JSON text, exactly as `kubectl get -o yaml|json` prints them.

Accepted: a single object, a `List` (kind `List`, or a typed list such as `ResourceSliceList`
whose items may omit apiVersion/kind), multi-document YAML streams (`---`) and concatenated JSON
documents (text starting with `{` or `[` is read as JSON only, as kubectl does). Kinds:
ResourceSlice, DeviceClass, ResourceClaim (spec.devices and status.allocation),
ResourceClaimTemplate (its spec.spec, as the ResourceClaim it stamps out) and core/v1 Node (name
and labels). API versions resource.k8s.io/v1 and v1beta2 (same shape); v1beta1 (devices under
`basic`, requests without `exactly`) is converted to the v1 shape first, so its errors use v1
field paths, as the API server's do. Fields gpualloc does not model (managedFields, status of
slices, creationTimestamp, newer alpha fields) are ignored.

Every object is validated (validate.py). Errors name the source, the line (when it can be found),
the document and the object, then the field path, e.g. `slices.yaml:57: document 2
(ResourceSlice "node-1-gpu"): spec.devices[3].attributes["productName"]: must have exactly one
of int, bool, string, version`. Malformed YAML/JSON raises ParseError;
anything else InvalidArgument with every violation in `.violations`.

Only `read_text` touches the file system; everything else works on text or decoded values.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from enum import StrEnum
from functools import lru_cache
from pathlib import PurePath
from typing import Any, TypeVar

import yaml

from services.common.dra import names, validate
from services.common.dra.model import (
    AllocationMode,
    AllocationResult,
    AttributeType,
    AttributeValue,
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    CapacityRequirements,
    ConfigSource,
    CounterSet,
    Device,
    DeviceAllocationConfiguration,
    DeviceCapacity,
    DeviceClaimConfiguration,
    DeviceClass,
    DeviceConstraint,
    DeviceCounterConsumption,
    DeviceRequest,
    DeviceRequestAllocationResult,
    DeviceSelector,
    DeviceSubRequest,
    DeviceTaint,
    DeviceToleration,
    ExactDeviceRequest,
    Node,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    OpaqueDeviceConfiguration,
    ResourceClaim,
    ResourcePool,
    ResourceSlice,
    TaintEffect,
    TolerationOperator,
)
from services.common.dra.quantity import Quantity
from services.common.errors import FieldViolation, InvalidArgument, ParseError

__all__ = [
    "RESOURCE_API_VERSIONS",
    "KubeObject",
    "decode_object",
    "load_files",
    "load_objects",
    "read_text",
]

KubeObject = ResourceSlice | DeviceClass | ResourceClaim | Node

RESOURCE_API_VERSIONS = ("resource.k8s.io/v1", "resource.k8s.io/v1beta2")  # the v1 shape
_V1BETA1 = "resource.k8s.io/v1beta1"  # converted to the v1 shape before decoding
_BASE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available


class _Loader(_BASE_LOADER):  # type: ignore[misc]
    """YAML as Kubernetes reads it (sigs.k8s.io/yaml): unquoted timestamps stay strings."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in _BASE_LOADER.yaml_implicit_resolvers.items()
    }


_ATTRIBUTE_TYPES = ("int", "bool", "string", "version")
_RAW_TYPE: dict[str, type] = {"int": int, "bool": bool, "string": str, "version": str}
_EXACTLY_FIELDS = (
    *("deviceClassName", "selectors", "allocationMode", "count"),
    *("adminAccess", "tolerations", "capacity"),
)
_PATH_SEGMENT = re.compile(r'\.?([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')
E = TypeVar("E", bound=StrEnum)


# --- public API ---------------------------------------------------------------------------


def read_text(path: str | PurePath) -> str:
    """The one place that reads a file: its text, or InvalidArgument/ParseError naming it."""
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except UnicodeDecodeError as exc:
        raise ParseError(f"not UTF-8 text: {exc.reason}", str(path)) from exc
    except OSError as exc:
        raise InvalidArgument(f"{path}: cannot read: {exc.strerror}") from exc


def load_files(paths: Iterable[str | PurePath]) -> list[KubeObject]:
    """Every object of every file, in order."""
    return [obj for path in paths for obj in load_objects(read_text(path), str(path))]


def load_objects(text: str, source: str = "<input>") -> list[KubeObject]:
    """Every object of a YAML or JSON text (one object, a List, or a stream of documents)."""
    objects: list[KubeObject] = []
    for number, document in _documents(text, source):
        if document is not None:
            objects.extend(_decode_document(document, _Where(source, text, number)))
    return objects


def decode_object(data: Mapping[str, Any], source: str = "<object>") -> KubeObject:
    """One already-decoded object (e.g. from a watch event or `json.loads`), validated."""
    return _decode_object(dict(data), _Where(source, "", 1), None, None)


# --- documents ----------------------------------------------------------------------------


def _documents(text: str, source: str) -> list[tuple[int, object]]:
    """(document number, value) for each document. Text that starts like JSON is JSON only, as
    kubectl's YAML-or-JSON decoder does; anything else is a YAML stream."""
    if text.lstrip()[:1] in ("{", "["):
        try:
            return list(enumerate(_json_documents(text), start=1))
        except json.JSONDecodeError as exc:
            raise ParseError(f"invalid JSON: {exc.msg}", source, exc.lineno) from None
    documents: list[tuple[int, object]] = []
    try:
        for number, document in enumerate(yaml.load_all(text, Loader=_Loader), start=1):
            documents.append((number, document))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "malformed"
        where = f"document {len(documents) + 1}: invalid YAML: {problem}"
        raise ParseError(where, source, mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:
        raise ParseError(f"invalid YAML: {exc}", source) from None
    return documents


def _json_documents(text: str) -> Iterator[object]:
    decoder = json.JSONDecoder()
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position == len(text):
            return
        document, position = decoder.raw_decode(text, position)
        yield document


class _Where:
    """Where an object came from, for error messages; finds the line only when one is needed."""

    def __init__(self, source: str, text: str, document: int) -> None:
        self.source, self.text, self.document = source, text, document
        self.item: int | None = None
        self.kind = self.name = ""

    def at_item(self, item: int) -> _Where:
        where = _Where(self.source, self.text, self.document)
        where.item = item
        return where

    def fail(self, violations: list[FieldViolation]) -> InvalidArgument:
        line = _line_of(self.text, self.document, self.item, violations[0].path)
        context = f"document {self.document}"
        if self.item is not None:
            context += f", items[{self.item}]"
        if self.kind:
            context += f" ({self.kind} {json.dumps(self.name)})" if self.name else f" ({self.kind})"
        location = f"{self.source}:{line}" if line else self.source
        return validate.violations_error(violations, f"{location}: {context}: ")


def _line_of(text: str, document: int, item: int | None, path: str) -> int | None:
    """The 1-based line of the deepest YAML node on `path`; re-reads the text, on errors only."""
    if not text:
        return None
    try:
        nodes = yaml.compose_all(text, Loader=_Loader)
        node = next(itertools.islice(nodes, document - 1, None), None)
    except yaml.YAMLError:
        return None
    segments: list[str | int] = [] if item is None else ["items", item]
    for match in _PATH_SEGMENT.finditer(path):
        name, index, key = match.groups()
        segments.append(int(index) if index is not None else name or json.loads(key))
    line = None if node is None else node.start_mark.line + 1
    for segment in segments:
        found = _child_node(node, segment)
        if found is None:
            break
        marker, node = found
        line = marker.start_mark.line + 1
    return line


def _child_node(node: yaml.Node | None, segment: str | int) -> tuple[yaml.Node, yaml.Node] | None:
    """(the node naming the child: its key, or the item itself; the child's value node)."""
    if isinstance(node, yaml.MappingNode) and isinstance(segment, str):
        return next(((key, value) for key, value in node.value if key.value == segment), None)
    if isinstance(node, yaml.SequenceNode) and isinstance(segment, int):
        return (node.value[segment],) * 2 if segment < len(node.value) else None
    return None


def _decode_document(document: object, where: _Where) -> list[KubeObject]:
    if not isinstance(document, dict):
        got = _json_type(document)
        detail = f"must be a Kubernetes object (a mapping with apiVersion and kind), got {got}"
        raise where.fail([FieldViolation("", detail)])
    kind = document.get("kind")
    typed_list = isinstance(kind, str) and kind.endswith("List") and kind[:-4] in _DECODERS
    if kind != "List" and not typed_list:
        return [_decode_object(document, where, None, None)]
    items = document.get("items") or []
    if not isinstance(items, list):
        raise where.fail([FieldViolation("items", f"must be a list, got {_json_type(items)}")])
    item_kind = str(kind)[:-4] if typed_list else None
    item_version = document.get("apiVersion") if typed_list else None
    return [
        _decode_object(item, where.at_item(i), item_kind, item_version)
        for i, item in enumerate(items)
    ]


def _decode_object(
    data: object, where: _Where, default_kind: str | None, default_version: object
) -> KubeObject:
    if not isinstance(data, dict):
        raise where.fail([FieldViolation("", f"must be an object, got {_json_type(data)}")])
    kind, version = data.get("kind", default_kind), data.get("apiVersion", default_version)
    metadata = data.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    where.kind, where.name = str(kind or ""), name if isinstance(name, str) else ""
    try:
        decoder = _decoder(kind, version)
        if version == _V1BETA1:
            data = _upgrade_v1beta1(str(kind), data)
        elif "apiVersion" not in data:  # an item of a typed list: the list's version
            data = dict(data, apiVersion=version)
        obj, violations = decoder(_Fields(data, ""))
    except _Invalid as exc:
        raise where.fail([exc.violation]) from None
    if violations:
        raise where.fail(violations)
    return obj


Decoder = Callable[["_Fields"], tuple[KubeObject, list[FieldViolation]]]


def _decoder(kind: object, version: object) -> Decoder:
    if kind is None:
        raise _Invalid("kind", "Required value")
    if version is None:
        raise _Invalid("apiVersion", "Required value")
    decoder = _DECODERS.get(str(kind))
    if decoder is None:
        raise _Invalid("kind", _unsupported(kind, _DECODERS))
    supported = ("v1",) if kind == "Node" else (*RESOURCE_API_VERSIONS, _V1BETA1)
    if version not in supported:
        raise _Invalid("apiVersion", _unsupported(version, supported))
    return decoder


def _upgrade_v1beta1(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """v1beta1 -> v1 shape: hoist `devices[].basic`, move request fields under `exactly`."""
    data = dict(data, apiVersion=RESOURCE_API_VERSIONS[0])
    spec = data.get("spec")
    if not isinstance(spec, dict):
        return data
    if kind == "ResourceSlice" and isinstance(spec.get("devices"), list):
        data["spec"] = dict(spec, devices=[_hoist_basic(d) for d in spec["devices"]])
    elif kind in ("ResourceClaim", "ResourceClaimTemplate"):
        claim_spec = spec.get("spec") if kind == "ResourceClaimTemplate" else spec
        devices = claim_spec.get("devices") if isinstance(claim_spec, dict) else None
        if isinstance(devices, dict) and isinstance(devices.get("requests"), list):
            requests = [_nest_exactly(r) for r in devices["requests"]]
            claim_spec = dict(claim_spec or {}, devices=dict(devices, requests=requests))
            data["spec"] = (
                dict(spec, spec=claim_spec) if kind == "ResourceClaimTemplate" else claim_spec
            )
    return data


def _hoist_basic(device: object) -> object:
    if not isinstance(device, dict) or not isinstance(device.get("basic"), dict):
        return device
    return {**{k: v for k, v in device.items() if k != "basic"}, **device["basic"]}


def _nest_exactly(request: object) -> object:
    if not isinstance(request, dict) or request.get("firstAvailable"):
        return request
    exactly = {k: request[k] for k in _EXACTLY_FIELDS if k in request}
    rest = {k: v for k, v in request.items() if k not in _EXACTLY_FIELDS}
    return {**rest, "exactly": exactly} if exactly else rest


# --- typed access to decoded JSON ---------------------------------------------------------


class _Invalid(Exception):
    """A value of the wrong shape; decoding stops at the first one."""

    def __init__(self, path: str, description: str) -> None:
        super().__init__(f"{path}: {description}")
        self.violation = FieldViolation(path, description)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def _unsupported(value: object, supported: Iterable[str]) -> str:
    choices = ", ".join(json.dumps(s) for s in sorted(supported))
    return f"Unsupported value: {json.dumps(value, default=str)}: supported values: {choices}"


class _Fields:
    """One JSON object being decoded. Absent and null fields read as unset, as in Go."""

    __slots__ = ("data", "path")

    def __init__(self, data: Mapping[str, Any], path: str) -> None:
        self.data, self.path = data, path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def str_(self, key: str, default: str = "") -> str:
        value = self.opt_str(key)
        return default if value is None else value

    def opt_str(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is None or isinstance(value, str):
            return value
        raise _Invalid(self.at(key), f"must be a string, got {_json_type(value)}")

    def int_(self, key: str, default: int) -> int:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(self.at(key), f"must be an integer, got {_json_type(value)}")
        return value

    def opt_bool(self, key: str) -> bool | None:
        value = self.data.get(key)
        if value is None or isinstance(value, bool):
            return value
        raise _Invalid(self.at(key), f"must be a boolean, got {_json_type(value)}")

    def flag(self, key: str) -> bool:
        """A `*bool` that must be unset or true (allNodes, perDeviceNodeSelection)."""
        value = self.opt_bool(key)
        if value is False:
            raise _Invalid(
                self.at(key), "Invalid value: false: must be either unset or set to true"
            )
        return value is True

    def enum(self, key: str, enum: type[E], default: E | None = None) -> E:
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise _Invalid(self.at(key), "Required value")
            return default
        try:
            return enum(value)
        except ValueError:
            raise _Invalid(self.at(key), _unsupported(value, [e.value for e in enum])) from None

    def obj(self, key: str) -> _Fields | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise _Invalid(self.at(key), f"must be an object, got {_json_type(value)}")
        return _Fields(value, self.at(key))

    def required_obj(self, key: str) -> _Fields:
        value = self.obj(key)
        if value is None:
            raise _Invalid(self.at(key), "Required value")
        return value

    def objs(self, key: str) -> list[_Fields]:
        items = self.list_(key)
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise _Invalid(f"{self.at(key)}[{i}]", f"must be an object, got {_json_type(item)}")
        return [_Fields(item, f"{self.at(key)}[{i}]") for i, item in enumerate(items)]

    def strs(self, key: str) -> tuple[str, ...]:
        items = self.list_(key)
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise _Invalid(f"{self.at(key)}[{i}]", f"must be a string, got {_json_type(item)}")
        return tuple(items)

    def list_(self, key: str) -> list[Any]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise _Invalid(self.at(key), f"must be a list, got {_json_type(value)}")
        return value

    def map_(self, key: str) -> dict[str, Any]:
        value = self.data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise _Invalid(self.at(key), f"must be an object, got {_json_type(value)}")
        for name in value:
            if not isinstance(name, str):
                raise _Invalid(self.at(key), f"keys must be strings, got {_json_type(name)}")
        return value

    def str_map(self, key: str) -> dict[str, str]:
        value = self.map_(key)
        for name, item in value.items():
            if not isinstance(item, str):
                path = validate.key_path(self.at(key), name)
                raise _Invalid(path, f"must be a string, got {_json_type(item)}")
        return value

    def quantity(self, key: str) -> Quantity:
        value = self.opt_quantity(key)
        if value is None:
            raise _Invalid(self.at(key), "Required value")
        return value

    def opt_quantity(self, key: str) -> Quantity | None:
        value = self.data.get(key)
        return None if value is None else _quantity(value, self.at(key))

    def quantities(self, key: str) -> dict[str, Quantity]:
        return {
            name: _quantity(value, validate.key_path(self.at(key), name))
            for name, value in self.map_(key).items()
        }


@lru_cache(maxsize=4096)
def _parse_quantity(text: str) -> Quantity:
    """Quantities repeat across a fleet (`80Gi` on every GPU): parse each text once."""
    return Quantity.parse(text)


def _quantity(value: object, path: str) -> Quantity:
    """A quantity as upstream's UnmarshalJSON reads it: a string (trimmed) or a JSON number."""
    if isinstance(value, str):
        text = value.strip()
    elif isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
    elif isinstance(value, float) and math.isfinite(value):
        text = repr(value)
    else:
        raise _Invalid(path, f"must be a quantity string, got {_json_type(value)}")
    try:
        return _parse_quantity(text)
    except ValueError as exc:
        raise _Invalid(path, f"Invalid value: {json.dumps(value)}: {exc}") from None


# --- object decoders ----------------------------------------------------------------------


def _metadata_name(metadata: _Fields, violations: list[FieldViolation]) -> str:
    name = metadata.str_("name")
    if not name:
        violations.append(FieldViolation("metadata.name", "Required value"))
    for error in names.dns1123_subdomain_errors(name) if name else ():
        violations.append(
            FieldViolation("metadata.name", f"Invalid value: {json.dumps(name)}: {error}")
        )
    return name


def _resource_slice(f: _Fields) -> tuple[ResourceSlice, list[FieldViolation]]:
    metadata, spec = f.obj("metadata") or _Fields({}, "metadata"), f.required_obj("spec")
    violations: list[FieldViolation] = []
    name = _metadata_name(metadata, violations)
    pool = spec.obj("pool") or _Fields({}, "spec.pool")
    slice_ = ResourceSlice(
        name=name,
        driver=spec.str_("driver"),
        pool=ResourcePool(
            pool.str_("name"), pool.int_("generation", 0), pool.int_("resourceSliceCount", 0)
        ),
        devices=tuple(_device(d) for d in spec.objs("devices")),
        node_name=spec.opt_str("nodeName"),
        node_selector=_node_selector(spec.obj("nodeSelector")),
        all_nodes=spec.flag("allNodes"),
        per_device_node_selection=spec.flag("perDeviceNodeSelection"),
        shared_counters=tuple(
            CounterSet(c.str_("name"), _counters(c)) for c in spec.objs("sharedCounters")
        ),
        labels=metadata.str_map("labels"),
        api_version=str(f.data["apiVersion"]),
    )
    return slice_, violations + validate.resource_slice_violations(slice_)


def _counters(f: _Fields) -> dict[str, Quantity]:
    """`counters: {name: {value: quantity}}`."""
    counters = {}
    for name, value in f.map_("counters").items():
        path = validate.key_path(f.at("counters"), name)
        if not isinstance(value, dict):
            raise _Invalid(path, f"must be an object, got {_json_type(value)}")
        counters[name] = _Fields(value, path).quantity("value")
    return counters


def _device(f: _Fields) -> Device:
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
        node_selector=_node_selector(f.obj("nodeSelector")),
        all_nodes=f.flag("allNodes"),
    )


def _capacity(device: _Fields, key: str, value: object) -> DeviceCapacity:
    if type(value) is dict and len(value) == 1 and type(value.get("value")) is str:
        with contextlib.suppress(ValueError):  # the common case, fast; errors take the long way
            return DeviceCapacity(_parse_quantity(value["value"].strip()))
    path = validate.key_path(device.at("capacity"), key)
    if not isinstance(value, dict):
        raise _Invalid(path, f"must be an object, got {_json_type(value)}")
    entry = _Fields(value, path)
    return DeviceCapacity(entry.quantity("value"), _request_policy(entry.obj("requestPolicy")))


def _attribute(device: _Fields, key: str, value: object) -> AttributeValue:
    """`{int|bool|string|version: value}`, exactly one of them."""
    if type(value) is dict and len(value) == 1:  # the common case, fast
        ((kind, raw),) = value.items()
        expected = _RAW_TYPE.get(kind)
        if expected is not None and type(raw) is expected:
            return _attribute_value(kind, raw)
    present = [t for t in _ATTRIBUTE_TYPES if isinstance(value, dict) and value.get(t) is not None]
    path = validate.key_path(device.at("attributes"), key)
    if len(present) != 1:
        raise _Invalid(path, "must have exactly one of int, bool, string, version")
    kind = present[0]
    assert isinstance(value, dict)
    if type(value[kind]) is not _RAW_TYPE[kind]:
        wanted = {"int": "an integer", "bool": "a boolean"}.get(kind, "a string")
        raise _Invalid(f"{path}.{kind}", f"must be {wanted}, got {_json_type(value[kind])}")
    return _attribute_value(kind, value[kind])


@lru_cache(maxsize=65536)
def _attribute_value(kind: str, raw: int | bool | str) -> AttributeValue:
    """Shared instances: the same attribute values repeat on every device of a fleet."""
    return AttributeValue(AttributeType(kind), raw)


def _request_policy(f: _Fields | None) -> CapacityRequestPolicy | None:
    if f is None:
        return None
    valid_range = f.obj("validRange")
    return CapacityRequestPolicy(
        default=f.opt_quantity("default"),
        valid_values=tuple(
            _quantity(v, f"{f.at('validValues')}[{i}]")
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


def _taint(f: _Fields) -> DeviceTaint:
    return DeviceTaint(
        key=f.str_("key"),
        effect=f.enum("effect", TaintEffect),
        value=f.str_("value"),
        time_added=f.opt_str("timeAdded"),
    )


def _node_selector(f: _Fields | None) -> NodeSelector | None:
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


def _requirement(f: _Fields) -> NodeSelectorRequirement:
    return NodeSelectorRequirement(f.str_("key"), f.str_("operator"), f.strs("values"))


def _device_class(f: _Fields) -> tuple[DeviceClass, list[FieldViolation]]:
    metadata, spec = (
        f.obj("metadata") or _Fields({}, "metadata"),
        f.obj("spec") or _Fields({}, "spec"),
    )
    violations: list[FieldViolation] = []
    name = _metadata_name(metadata, violations)
    device_class = DeviceClass(
        name=name,
        selectors=_selectors(spec),
        config=tuple(_opaque(c.required_obj("opaque")) for c in spec.objs("config")),
        labels=metadata.str_map("labels"),
    )
    return device_class, violations + validate.device_class_violations(device_class)


def _selectors(f: _Fields) -> tuple[DeviceSelector, ...]:
    return tuple(
        DeviceSelector(s.required_obj("cel").str_("expression")) for s in f.objs("selectors")
    )


def _opaque(f: _Fields) -> OpaqueDeviceConfiguration:
    parameters = f.data.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise _Invalid(
            f.at("parameters"),
            'Invalid value: "<value omitted>": parameters must be a valid JSON object',
        )
    return OpaqueDeviceConfiguration(f.str_("driver"), parameters or {})


def _resource_claim(f: _Fields) -> tuple[ResourceClaim, list[FieldViolation]]:
    metadata = f.obj("metadata") or _Fields({}, "metadata")
    violations: list[FieldViolation] = []
    name = _metadata_name(metadata, violations)
    status = f.obj("status")
    allocation = status.obj("allocation") if status is not None else None
    claim = _claim(metadata, name, f.obj("spec") or _Fields({}, "spec"), _allocation(allocation))
    return claim, violations + validate.resource_claim_violations(claim)


def _resource_claim_template(f: _Fields) -> tuple[ResourceClaim, list[FieldViolation]]:
    metadata = f.obj("metadata") or _Fields({}, "metadata")
    violations: list[FieldViolation] = []
    name = _metadata_name(metadata, violations)
    spec = f.required_obj("spec").obj("spec") or _Fields({}, "spec.spec")
    claim = _claim(metadata, name, spec, None)
    return claim, violations + validate.resource_claim_violations(claim, path="spec.spec")


def _claim(
    metadata: _Fields, name: str, spec: _Fields, allocation: AllocationResult | None
) -> ResourceClaim:
    devices = spec.obj("devices") or _Fields({}, spec.at("devices"))
    return ResourceClaim(
        name=name,
        namespace=metadata.str_("namespace", "default"),
        uid=metadata.str_("uid"),
        requests=tuple(_request(r) for r in devices.objs("requests")),
        constraints=tuple(
            DeviceConstraint(
                c.strs("requests"), c.opt_str("matchAttribute"), c.opt_str("distinctAttribute")
            )
            for c in devices.objs("constraints")
        ),
        config=tuple(
            DeviceClaimConfiguration(c.strs("requests"), _opaque(c.required_obj("opaque")))
            for c in devices.objs("config")
        ),
        allocation=allocation,
        labels=metadata.str_map("labels"),
        annotations=metadata.str_map("annotations"),
    )


def _request(f: _Fields) -> DeviceRequest:
    exactly = f.obj("exactly")
    return DeviceRequest(
        name=f.str_("name"),
        exactly=None if exactly is None else _exact_request(exactly),
        first_available=tuple(_subrequest(s) for s in f.objs("firstAvailable")),
    )


def _mode_and_count(f: _Fields) -> tuple[AllocationMode, int]:
    """API defaults: ExactCount with count 1. With All, count must be unset (0 counts as unset)."""
    mode = f.enum("allocationMode", AllocationMode, AllocationMode.EXACT_COUNT)
    count = f.int_("count", 0 if mode is AllocationMode.ALL else 1)
    if mode is AllocationMode.ALL:
        if count != 0:
            detail = "must not be specified when allocationMode is 'All'"
            raise _Invalid(f.at("count"), f"Invalid value: {count}: {detail}")
        return mode, 1  # the model's default; the allocator ignores count for All
    return mode, count


def _exact_request(f: _Fields) -> ExactDeviceRequest:
    mode, count = _mode_and_count(f)
    capacity = f.obj("capacity")
    return ExactDeviceRequest(
        device_class_name=f.str_("deviceClassName"),
        selectors=_selectors(f),
        allocation_mode=mode,
        count=count,
        admin_access=f.opt_bool("adminAccess"),
        tolerations=tuple(_toleration(t) for t in f.objs("tolerations")),
        capacity=None
        if capacity is None
        else CapacityRequirements(capacity.quantities("requests")),
    )


def _subrequest(f: _Fields) -> DeviceSubRequest:
    mode, count = _mode_and_count(f)
    capacity = f.obj("capacity")
    return DeviceSubRequest(
        name=f.str_("name"),
        device_class_name=f.str_("deviceClassName"),
        selectors=_selectors(f),
        allocation_mode=mode,
        count=count,
        tolerations=tuple(_toleration(t) for t in f.objs("tolerations")),
        capacity=None
        if capacity is None
        else CapacityRequirements(capacity.quantities("requests")),
    )


def _toleration(f: _Fields) -> DeviceToleration:
    effect = f.data.get("effect")
    return DeviceToleration(
        key=f.str_("key"),
        operator=f.enum("operator", TolerationOperator, TolerationOperator.EQUAL),
        value=f.str_("value"),
        effect=None if effect is None else f.enum("effect", TaintEffect),
        toleration_seconds=None
        if f.data.get("tolerationSeconds") is None
        else f.int_("tolerationSeconds", 0),
    )


def _allocation(f: _Fields | None) -> AllocationResult | None:
    if f is None:
        return None
    devices = f.obj("devices") or _Fields({}, f.at("devices"))
    return AllocationResult(
        results=tuple(_allocated_device(r) for r in devices.objs("results")),
        config=tuple(
            DeviceAllocationConfiguration(
                c.enum("source", ConfigSource),
                c.strs("requests"),
                _opaque(c.required_obj("opaque")),
            )
            for c in devices.objs("config")
        ),
        node_selector=_node_selector(f.obj("nodeSelector")),
    )


def _allocated_device(f: _Fields) -> DeviceRequestAllocationResult:
    return DeviceRequestAllocationResult(
        request=f.str_("request"),
        driver=f.str_("driver"),
        pool=f.str_("pool"),
        device=f.str_("device"),
        admin_access=f.opt_bool("adminAccess"),
        tolerations=tuple(_toleration(t) for t in f.objs("tolerations")),
        share_id=f.opt_str("shareID"),
        consumed_capacity=f.quantities("consumedCapacity"),
    )


def _node(f: _Fields) -> tuple[Node, list[FieldViolation]]:
    metadata = f.obj("metadata") or _Fields({}, "metadata")
    violations: list[FieldViolation] = []
    name = _metadata_name(metadata, violations)
    return Node(name, metadata.str_map("labels")), violations


_DECODERS: dict[str, Decoder] = {
    "ResourceSlice": _resource_slice,
    "DeviceClass": _device_class,
    "ResourceClaim": _resource_claim,
    "ResourceClaimTemplate": _resource_claim_template,
    "Node": _node,
}
