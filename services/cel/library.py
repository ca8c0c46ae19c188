"""The CEL function tables for device selectors: the Kubernetes 1.34 base environment, as far
as device selectors use it.

Covered: CEL standard functions and conversions (here); cel-go ext Strings v2, the Kubernetes
regex library (cel_strings); Kubernetes and cel-go ext lists, ext Sets (cel_collections); the
Kubernetes quantity and semver libraries (cel_k8s). Not covered — `UNSUPPORTED` turns them into a
compile error that says so — timestamps/durations, URLs, IP/CIDR, authz, the Kubernetes format
library, optional types, `sortBy`/`transformMapEntry`.

Every implementation takes the evaluation `Frame` first and charges its cost before building
anything whose size depends on the input, so cost bounds memory as well as time. Names are not
typed overloads as in cel-go: one implementation per name dispatches on the runtime types and
raises "no such overload" for the rest.
"""

from __future__ import annotations

import math
import re
from typing import Any

from services.cel.lib_collections import COLLECTION_FUNCTIONS, COLLECTION_METHODS
from services.cel.lib_format import double_to_string
from services.cel.lib_k8s import K8S_FUNCTIONS, K8S_METHODS
from services.cel.lib_strings import STRING_FUNCTIONS, STRING_METHODS
from services.cel.values import (
    INT64_MIN,
    UINT64_MAX,
    CelType,
    EvalError,
    Frame,
    Function,
    Uint,
    check_int,
    fn,
    no_overload,
    type_name,
)

__all__ = ["FUNCTIONS", "METHODS", "UNSUPPORTED"]


def _size(frame: Frame, value: Any) -> int:
    frame.charge(1)
    if type(value) in (str, bytes) or isinstance(value, list | dict):
        return len(value)
    raise no_overload("size", value)


_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_UINT_TEXT = re.compile(r"[0-9]+")
_BOOL_TEXT = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True}
_BOOL_TEXT |= {"0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}


def _to_int(frame: Frame, value: Any) -> int:
    frame.charge(1)
    kind = type(value)
    if kind is int or kind is Uint:
        return check_int(int(value))
    if kind is float:
        if not math.isfinite(value) or not INT64_MIN <= value < 2.0**63:
            raise EvalError("range error converting double to int")
        return int(value)
    if kind is str and _INT_TEXT.fullmatch(value):
        return check_int(int(value))
    if kind is str:
        raise EvalError(f"cannot convert {value!r} to int")
    raise no_overload("int", value)


def _to_uint(frame: Frame, value: Any) -> Uint:
    frame.charge(1)
    kind = type(value)
    number: int | float
    if kind is int or kind is Uint:
        number = int(value)
    elif kind is float:
        if not math.isfinite(value) or not -1.0 < value < 2.0**64:
            raise EvalError("range error converting double to uint")
        number = int(value)
    elif kind is str and _UINT_TEXT.fullmatch(value):
        number = int(value)
    elif kind is str:
        raise EvalError(f"cannot convert {value!r} to uint")
    else:
        raise no_overload("uint", value)
    if not 0 <= number <= UINT64_MAX:
        raise EvalError("range error converting to uint")
    return Uint(number)


def _to_double(frame: Frame, value: Any) -> float:
    frame.charge(1)
    kind = type(value)
    if kind is float or kind is int or kind is Uint:
        return float(value)
    if kind is not str:
        raise no_overload("double", value)
    if value.strip() == value and "_" not in value:  # Go's ParseFloat takes neither
        try:
            return float(value)
        except ValueError:
            pass
    raise EvalError(f"cannot convert {value!r} to double")


def _to_string(frame: Frame, value: Any) -> str:
    frame.charge(1)
    kind = type(value)
    if kind is str:
        return str(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is int or kind is Uint:
        return str(int(value))
    if kind is float:
        return double_to_string(value)
    if kind is bytes:
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise EvalError("invalid UTF-8 in bytes to string conversion") from None
    raise no_overload("string", value)


def _to_bool(frame: Frame, value: Any) -> bool:
    frame.charge(1)
    if type(value) is bool:
        return bool(value)
    if type(value) is str:
        if value in _BOOL_TEXT:
            return _BOOL_TEXT[value]
        raise EvalError(f"cannot convert {value!r} to bool")
    raise no_overload("bool", value)


def _to_bytes(frame: Frame, value: Any) -> bytes:
    frame.charge(1)
    if type(value) is bytes:
        return bytes(value)
    if type(value) is str:
        return str(value).encode("utf-8")
    raise no_overload("bytes", value)


def _dyn(frame: Frame, value: Any) -> Any:
    return value


def _type(frame: Frame, value: Any) -> CelType:
    frame.charge(1)
    return CelType(type_name(value))


FUNCTIONS: dict[str, Function] = {
    "size": fn((1,), _size, "int"),
    "int": fn((1,), _to_int, "int"),
    "uint": fn((1,), _to_uint, "uint"),
    "double": fn((1,), _to_double, "double"),
    "string": fn((1,), _to_string, "string"),
    "bool": fn((1,), _to_bool, "bool"),
    "bytes": fn((1,), _to_bytes, "bytes"),
    "dyn": fn((1,), _dyn),
    "type": fn((1,), _type, "type"),
    **STRING_FUNCTIONS,
    **COLLECTION_FUNCTIONS,
    **K8S_FUNCTIONS,
}

METHODS: dict[str, Function] = {
    "size": fn((0,), _size, "int"),
    **STRING_METHODS,
    **COLLECTION_METHODS,
    **K8S_METHODS,
}

# Upstream names gpualloc does not implement: a compile error says so instead of "undeclared".
UNSUPPORTED = frozenset(
    {
        "timestamp", "duration", "getFullYear", "getMonth", "getDate", "getDayOfMonth",
        "getDayOfWeek", "getDayOfYear", "getHours", "getMinutes", "getSeconds",
        "getMilliseconds", "url", "isURL", "getScheme", "getHost", "getHostname", "getPort",
        "getEscapedPath", "getQuery", "ip", "isIP", "cidr", "isCIDR", "containsIP",
        "containsCIDR", "family", "isLoopback", "isUnspecified", "isLinkLocalMulticast",
        "isLinkLocalUnicast", "isGlobalUnicast", "prefixLength", "masked", "optional.of",
        "optional.none", "optional.ofNonZeroValue", "orValue", "hasValue",
        "sortBy", "transformMapEntry", "format.named", "authorizer", "serviceAccount",
    }
)  # fmt: skip
