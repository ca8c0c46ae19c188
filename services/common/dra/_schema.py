"""Strict decoding: the field names of each kind, as kubectl's strict validation knows them.

`kubectl apply --validate=strict` (the default since 1.27) refuses an object with a field its
schema lacks: `strict decoding error: unknown field "spec.devices.requests[0].exactly.
deviceClasName"`. gpualloc does the same for the objects it reads from files, stdin and
ApplyResourceSlices' manifest, with the closest known name as a hint. The schema is
resource.k8s.io/v1 of Kubernetes 1.34, alpha and beta fields included (bindingConditions,
allowMultipleAllocations, ...), so an object a 1.34 API server accepts is accepted here even
where gpualloc ignores the field. Objects read back from an API server's watch or from the
store are decoded leniently (parse.decode_object): a newer server may add fields.

A schema is a mapping of field name -> the schema of its value: another mapping for an object
(applied to each item when the value is a list), `MapOf(schema)` for a map whose keys are the
user's (attributes, capacity, counters), or `ANY` where any value goes (labels, opaque
parameters, a Node's spec and status, fields whose values gpualloc does not read).

Private to `services.common.dra`; `parse` is the face.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from services.common.dra import validate
from services.common.dra.limits import MAX_UNKNOWN_FIELDS
from services.common.dra.suggest import did_you_mean
from services.common.errors import FieldViolation

__all__ = ["UnknownField", "unknown_fields"]


@dataclass(frozen=True)
class MapOf:
    """A map with the user's keys; each value has the schema `values`."""

    values: Schema


class _Any:
    """Any value: not checked."""


ANY = _Any()
Schema = Mapping[str, "Schema"] | MapOf | _Any


@dataclass(frozen=True)
class UnknownField(FieldViolation):
    """A field the kind's schema lacks; reads as kubectl's `unknown field "<path>"`."""

    def __str__(self) -> str:
        return self.description


def _fields(*names: str, **nested: Schema) -> dict[str, Schema]:
    """Leaf fields (any value: their shape is checked by the decoders) plus nested schemas."""
    return {**dict.fromkeys(names, ANY), **nested}


_OBJECT_META = _fields(
    *("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation"),
    *("creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels"),
    *("annotations", "ownerReferences", "finalizers", "managedFields"),
)
_REQUIREMENT = _fields("key", "operator", "values")
_NODE_SELECTOR = _fields(
    nodeSelectorTerms=_fields(matchExpressions=_REQUIREMENT, matchFields=_REQUIREMENT)
)
_COUNTERS = MapOf(_fields("value"))
_TAINT = _fields("key", "value", "effect", "timeAdded")
_TOLERATION = _fields("key", "operator", "value", "effect", "tolerationSeconds")
_SELECTOR = _fields(cel=_fields("expression"))
_OPAQUE = _fields("driver", "parameters")
_REQUEST_POLICY = _fields("default", "validValues", validRange=_fields("min", "max", "step"))
_DEVICE = _fields(
    *("name", "nodeName", "allNodes", "bindsToNode", "bindingConditions"),
    *("bindingFailureConditions", "allowMultipleAllocations"),
    attributes=MapOf(_fields("int", "bool", "string", "version")),
    capacity=MapOf(
        _fields(
            "value",
            requestPolicy=_fields(
                "default", "validValues", validRange=_fields("min", "max", "step")
            ),
        )
    ),
    consumesCounters=_fields("counterSet", counters=_COUNTERS),
    nodeSelector=_NODE_SELECTOR,
    taints=_TAINT,
)
_RESOURCE_SLICE = _fields(
    "apiVersion",
    "kind",
    "status",  # not in the API; older gpualloc docs and some tools print `status: {}`
    metadata=_OBJECT_META,
    spec=_fields(
        *("driver", "nodeName", "allNodes", "perDeviceNodeSelection"),
        pool=_fields("name", "generation", "resourceSliceCount"),
        nodeSelector=_NODE_SELECTOR,
        devices=_DEVICE,
        sharedCounters=_fields("name", counters=_COUNTERS),
    ),
)
_DEVICE_CLASS = _fields(
    "apiVersion",
    "kind",
    metadata=_OBJECT_META,
    spec=_fields("extendedResourceName", selectors=_SELECTOR, config=_fields(opaque=_OPAQUE)),
)
_REQUEST_FIELDS = dict(
    selectors=_SELECTOR,
    tolerations=_TOLERATION,
    capacity=_fields("requests"),
)
_CLAIM_SPEC = _fields(
    devices=_fields(
        requests=_fields(
            "name",
            exactly=_fields(
                *("deviceClassName", "allocationMode", "count", "adminAccess"), **_REQUEST_FIELDS
            ),
            firstAvailable=_fields(
                *("name", "deviceClassName", "allocationMode", "count"), **_REQUEST_FIELDS
            ),
        ),
        constraints=_fields("requests", "matchAttribute", "distinctAttribute"),
        config=_fields("requests", opaque=_OPAQUE),
    )
)
_ALLOCATION = _fields(
    "allocationTimestamp",
    devices=_fields(
        results=_fields(
            *("request", "driver", "pool", "device", "adminAccess", "bindingConditions"),
            *("bindingFailureConditions", "shareID", "consumedCapacity"),
            tolerations=_TOLERATION,
        ),
        config=_fields("source", "requests", opaque=_OPAQUE),
    ),
    nodeSelector=_NODE_SELECTOR,
)
_RESOURCE_CLAIM = _fields(
    "apiVersion",
    "kind",
    metadata=_OBJECT_META,
    spec=_CLAIM_SPEC,
    status=_fields("reservedFor", "devices", allocation=_ALLOCATION),
)
_RESOURCE_CLAIM_TEMPLATE = _fields(
    "apiVersion",
    "kind",
    metadata=_OBJECT_META,
    spec=_fields(metadata=_OBJECT_META, spec=_CLAIM_SPEC),
)
_NODE = _fields("apiVersion", "kind", "spec", "status", metadata=_OBJECT_META)

_SCHEMAS: dict[str, Schema] = {
    "ResourceSlice": _RESOURCE_SLICE,
    "DeviceClass": _DEVICE_CLASS,
    "ResourceClaim": _RESOURCE_CLAIM,
    "ResourceClaimTemplate": _RESOURCE_CLAIM_TEMPLATE,
    "Node": _NODE,
}


def unknown_fields(kind: str, data: Mapping[str, Any]) -> list[FieldViolation]:
    """The fields of `data` (an object of `kind`, in the v1 shape) its schema lacks, each with
    the closest known sibling as a hint; at most MAX_UNKNOWN_FIELDS, then a count of the rest."""
    schema = _SCHEMAS.get(kind)
    if schema is None:
        return []
    found: list[FieldViolation] = []
    more = 0
    for path, name, known in _walk(schema, data, ""):
        if len(found) == MAX_UNKNOWN_FIELDS:
            more += 1
            continue
        found.append(UnknownField(path, f'unknown field "{path}"{did_you_mean(name, known)}'))
    if more:
        found.append(FieldViolation("", f"and {more} more unknown fields"))
    return found


def _walk(schema: Schema, value: object, path: str) -> Iterator[tuple[str, str, list[str]]]:
    """(path, field name, the names known there) of each unknown field under `value`."""
    if isinstance(schema, _Any):
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(schema, item, f"{path}[{i}]")
        return
    if not isinstance(value, dict):
        return  # a value of the wrong shape: the decoders say so, with its path
    if isinstance(schema, MapOf):
        for key, item in value.items():
            yield from _walk(schema.values, item, validate.key_path(path, str(key)))
        return
    for key, item in value.items():
        child = f"{path}.{key}" if path else str(key)
        sub = schema.get(key) if isinstance(key, str) else None
        if sub is None:
            yield child, str(key), list(schema)
        else:
            yield from _walk(sub, item, child)
