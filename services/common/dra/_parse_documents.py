"""From text to objects: YAML/JSON documents, `List`s, the kind and apiVersion of each object,
the v1beta1 -> v1 upgrade, and where an error is (source, line, document, object).

Private to `services.common.dra`; `parse` is the face.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import yaml

from services.common.dra import validate
from services.common.dra._parse_claims import (
    decode_device_class,
    decode_resource_claim,
    decode_resource_claim_template,
)
from services.common.dra._parse_fields import Fields, Invalid, json_type, unsupported
from services.common.dra._parse_slices import decode_node, decode_resource_slice
from services.common.dra._schema import unknown_fields
from services.common.dra.limits import DocumentLimits, check_size, check_value, check_yaml_node
from services.common.dra.model import DeviceClass, Node, ResourceClaim, ResourceSlice
from services.common.errors import FieldViolation, InvalidArgument, ParseError

__all__ = [
    "RESOURCE_API_VERSIONS",
    "KubeObject",
    "Where",
    "decode_document",
    "decode_kube_object",
    "read_documents",
]

KubeObject = ResourceSlice | DeviceClass | ResourceClaim | Node
Decoder = Callable[[Fields], tuple[KubeObject, list[FieldViolation]]]

_DECODERS: dict[str, Decoder] = {
    "ResourceSlice": decode_resource_slice,
    "DeviceClass": decode_device_class,
    "ResourceClaim": decode_resource_claim,
    "ResourceClaimTemplate": decode_resource_claim_template,
    "Node": decode_node,
}

RESOURCE_API_VERSIONS = ("resource.k8s.io/v1", "resource.k8s.io/v1beta2")  # the v1 shape
_V1BETA1 = "resource.k8s.io/v1beta1"  # converted to the v1 shape before decoding
_BASE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available


class _Loader(_BASE_LOADER):  # type: ignore[misc]
    """YAML as Kubernetes reads it (sigs.k8s.io/yaml): unquoted timestamps stay strings."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in _BASE_LOADER.yaml_implicit_resolvers.items()
    }


_EXACTLY_FIELDS = (
    *("deviceClassName", "selectors", "allocationMode", "count"),
    *("adminAccess", "tolerations", "capacity"),
)
_PATH_SEGMENT = re.compile(r'\.?([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')


def read_documents(
    text: str, source: str, limits: DocumentLimits | None = None
) -> list[tuple[int, object]]:
    """(document number, value) for each document. Text that starts like JSON is JSON only, as
    kubectl's YAML-or-JSON decoder does; anything else is a YAML stream. Size, depth and value
    count are bounded by `limits` (limits.py) before and while decoding."""
    limits = limits or DocumentLimits()
    check_size(text, source, limits)
    if text.lstrip()[:1] in ("{", "["):
        try:
            return list(enumerate(_json_documents(text, source, limits), start=1))
        except json.JSONDecodeError as exc:
            raise ParseError(f"invalid JSON: {exc.msg}", source, exc.lineno) from None
        except RecursionError:
            raise ParseError(limits.depth_message(), source) from None
    documents: list[tuple[int, object]] = []
    try:
        for number, document in enumerate(_yaml_documents(text, source, limits), start=1):
            documents.append((number, document))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "malformed"
        where = f"document {len(documents) + 1}: invalid YAML: {problem}"
        raise ParseError(where, source, mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:
        raise ParseError(f"invalid YAML: {exc}", source) from None
    return documents


def _json_documents(text: str, source: str, limits: DocumentLimits) -> Iterator[object]:
    decoder = json.JSONDecoder()
    position = used = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position == len(text):
            return
        document, position = decoder.raw_decode(text, position)
        used = check_value(document, source, limits, used)
        yield document


def _yaml_documents(text: str, source: str, limits: DocumentLimits) -> Iterator[object]:
    """`yaml.load_all`, with each composed document checked before it is constructed (the
    check walks aliases as used, which constructing alone would not reveal)."""
    loader = _Loader(text)
    used = 0
    try:
        while loader.check_node():
            node = loader.get_node()
            used = check_yaml_node(node, source, limits, used)
            yield loader.construct_document(node)
    finally:
        loader.dispose()


class Where:
    """Where an object came from, for error messages; finds the line only when one is needed.
    `strict`: unknown fields are errors (input from a user); else ignored (from a server)."""

    def __init__(self, source: str, text: str, document: int, *, strict: bool = True) -> None:
        self.source, self.text, self.document, self.strict = source, text, document, strict
        self.item: int | None = None
        self.kind = self.name = ""

    def at_item(self, item: int) -> Where:
        where = Where(self.source, self.text, self.document, strict=self.strict)
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


def decode_document(document: object, where: Where) -> list[tuple[KubeObject, Where]]:
    """One document: an object, or a List whose items are decoded one by one; each object with
    where it is (for errors found later, e.g. a class the claim names that does not exist)."""
    if not isinstance(document, dict):
        got = json_type(document)
        detail = f"must be a Kubernetes object (a mapping with apiVersion and kind), got {got}"
        raise where.fail([FieldViolation("", detail)])
    kind = document.get("kind")
    typed_list = isinstance(kind, str) and kind.endswith("List") and kind[:-4] in _DECODERS
    if kind != "List" and not typed_list:
        return [(decode_kube_object(document, where, None, None), where)]
    items = document.get("items") or []
    if not isinstance(items, list):
        raise where.fail([FieldViolation("items", f"must be a list, got {json_type(items)}")])
    item_kind = str(kind)[:-4] if typed_list else None
    item_version = document.get("apiVersion") if typed_list else None
    located = [(item, where.at_item(i)) for i, item in enumerate(items)]
    return [(decode_kube_object(item, at, item_kind, item_version), at) for item, at in located]


def decode_kube_object(
    data: object, where: Where, default_kind: str | None, default_version: object
) -> KubeObject:
    """One object; a typed list's items inherit its kind and apiVersion (the defaults)."""
    if not isinstance(data, dict):
        raise where.fail([FieldViolation("", f"must be an object, got {json_type(data)}")])
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
        unknown = unknown_fields(str(kind), data) if where.strict else []
        if unknown:  # as kubectl's strict decoding: before, and instead of, validation
            raise where.fail(unknown)
        obj, violations = decoder(Fields(data, ""))
    except Invalid as exc:
        raise where.fail([exc.violation]) from None
    if violations:
        raise where.fail(violations)
    return obj


def _decoder(kind: object, version: object) -> Decoder:
    if kind is None:
        raise Invalid("kind", "Required value")
    if version is None:
        raise Invalid("apiVersion", "Required value")
    decoder = _DECODERS.get(str(kind))
    if decoder is None:
        raise Invalid("kind", unsupported(kind, _DECODERS))
    supported = ("v1",) if kind == "Node" else (*RESOURCE_API_VERSIONS, _V1BETA1)
    if version not in supported:
        raise Invalid("apiVersion", unsupported(version, supported))
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
