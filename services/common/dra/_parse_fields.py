"""Typed access to decoded JSON, for the decoders of parse.py: each read checks the value's
shape and fails with the field path, as upstream's strict JSON decoding does.

Absent and null fields read as unset, as in Go. Decoding stops at the first value of the wrong
shape (`Invalid`); the validation rules then run on the decoded object and report every
violation. Private to `services.common.dra`; `parse` is the face.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from enum import StrEnum
from functools import lru_cache
from typing import Any, TypeVar

from services.common.dra import names, validate
from services.common.dra.quantity import Quantity
from services.common.errors import FieldViolation

__all__ = [
    "Fields",
    "Invalid",
    "json_type",
    "metadata_name",
    "parse_quantity",
    "read_quantity",
    "unsupported",
]

E = TypeVar("E", bound=StrEnum)


class Invalid(Exception):
    """A value of the wrong shape; decoding stops at the first one."""

    def __init__(self, path: str, description: str) -> None:
        super().__init__(f"{path}: {description}")
        self.violation = FieldViolation(path, description)


def json_type(value: object) -> str:
    """A value's JSON type, as named in shape errors."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def unsupported(value: object, supported: Iterable[str]) -> str:
    """The API server's description of a value outside an enum."""
    choices = ", ".join(json.dumps(s) for s in sorted(supported))
    return f"Unsupported value: {json.dumps(value, default=str)}: supported values: {choices}"


class Fields:
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
        raise Invalid(self.at(key), f"must be a string, got {json_type(value)}")

    def int_(self, key: str, default: int) -> int:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(self.at(key), f"must be an integer, got {json_type(value)}")
        return value

    def opt_bool(self, key: str) -> bool | None:
        value = self.data.get(key)
        if value is None or isinstance(value, bool):
            return value
        raise Invalid(self.at(key), f"must be a boolean, got {json_type(value)}")

    def flag(self, key: str) -> bool:
        """A `*bool` that must be unset or true (allNodes, perDeviceNodeSelection)."""
        value = self.opt_bool(key)
        if value is False:
            raise Invalid(self.at(key), "Invalid value: false: must be either unset or set to true")
        return value is True

    def enum(self, key: str, enum: type[E], default: E | None = None) -> E:
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise Invalid(self.at(key), "Required value")
            return default
        try:
            return enum(value)
        except ValueError:
            raise Invalid(self.at(key), unsupported(value, [e.value for e in enum])) from None

    def obj(self, key: str) -> Fields | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise Invalid(self.at(key), f"must be an object, got {json_type(value)}")
        return Fields(value, self.at(key))

    def required_obj(self, key: str) -> Fields:
        value = self.obj(key)
        if value is None:
            raise Invalid(self.at(key), "Required value")
        return value

    def objs(self, key: str) -> list[Fields]:
        items = self.list_(key)
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise Invalid(f"{self.at(key)}[{i}]", f"must be an object, got {json_type(item)}")
        return [Fields(item, f"{self.at(key)}[{i}]") for i, item in enumerate(items)]

    def strs(self, key: str) -> tuple[str, ...]:
        items = self.list_(key)
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise Invalid(f"{self.at(key)}[{i}]", f"must be a string, got {json_type(item)}")
        return tuple(items)

    def list_(self, key: str) -> list[Any]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise Invalid(self.at(key), f"must be a list, got {json_type(value)}")
        return value

    def map_(self, key: str) -> dict[str, Any]:
        value = self.data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise Invalid(self.at(key), f"must be an object, got {json_type(value)}")
        for name in value:
            if not isinstance(name, str):
                raise Invalid(self.at(key), f"keys must be strings, got {json_type(name)}")
        return value

    def str_map(self, key: str) -> dict[str, str]:
        value = self.map_(key)
        for name, item in value.items():
            if not isinstance(item, str):
                path = validate.key_path(self.at(key), name)
                raise Invalid(path, f"must be a string, got {json_type(item)}")
        return value

    def quantity(self, key: str) -> Quantity:
        value = self.opt_quantity(key)
        if value is None:
            raise Invalid(self.at(key), "Required value")
        return value

    def opt_quantity(self, key: str) -> Quantity | None:
        value = self.data.get(key)
        return None if value is None else read_quantity(value, self.at(key))

    def quantities(self, key: str) -> dict[str, Quantity]:
        return {
            name: read_quantity(value, validate.key_path(self.at(key), name))
            for name, value in self.map_(key).items()
        }


@lru_cache(maxsize=4096)
def parse_quantity(text: str) -> Quantity:
    """Quantities repeat across a fleet (`80Gi` on every GPU): parse each text once."""
    return Quantity.parse(text)


def read_quantity(value: object, path: str) -> Quantity:
    """A quantity as upstream's UnmarshalJSON reads it: a string (trimmed) or a JSON number."""
    if isinstance(value, str):
        text = value.strip()
    elif isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
    elif isinstance(value, float) and math.isfinite(value):
        text = repr(value)
    else:
        raise Invalid(path, f"must be a quantity string, got {json_type(value)}")
    try:
        return parse_quantity(text)
    except ValueError as exc:
        raise Invalid(path, f"Invalid value: {json.dumps(value)}: {exc}") from None


def metadata_name(metadata: Fields, violations: list[FieldViolation]) -> str:
    """metadata.name, required and a DNS subdomain; its violations join the object's."""
    name = metadata.str_("name")
    if not name:
        violations.append(FieldViolation("metadata.name", "Required value"))
    for error in names.dns1123_subdomain_errors(name) if name else ():
        violations.append(
            FieldViolation("metadata.name", f"Invalid value: {json.dumps(name)}: {error}")
        )
    return name
