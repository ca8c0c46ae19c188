"""CEL runtime values and operators for device selectors: plain Python values, CEL semantics.

Values are Python natives — `bool`, `int` (int64), `Uint` (uint64), `float`, `str`, `bytes`,
`None` (null), `list`, `dict` — plus `Quantity`, `Version`, `CelType` and the `DeviceValue`
projection. Python's own operators are wrong for CEL in several places (True == 1, floor
division, unbounded ints, `[1] == [True]`), so every operator goes through a function here that
checks the operand types first and raises `EvalError` ("no such overload", "division by zero",
"integer overflow") exactly where cel-go returns an error value.

`Frame` carries the variables of one evaluation and its cost budget; everything that can make
work grow (calls, comprehension steps, string and list building) charges it *before* doing the
work, so a runaway selector stops with `CostExceeded` instead of allocating gigabytes.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from services.cel.semver import Version
from services.common.dra.quantity import Quantity
from services.common.dra.suggest import did_you_mean

__all__ = [
    "EMPTY_MAP",
    "INT64_MAX",
    "INT64_MIN",
    "STOP_CHECK_UNITS",
    "UINT64_MAX",
    "CelType",
    "CostExceeded",
    "DeviceValue",
    "DomainMap",
    "EvalError",
    "Frame",
    "Function",
    "Impl",
    "Stopped",
    "Uint",
    "add",
    "check_int",
    "divide",
    "equal",
    "fn",
    "index",
    "int_arg",
    "less",
    "modulo",
    "multiply",
    "negate",
    "no_overload",
    "ordered",
    "select",
    "str_args",
    "subtract",
    "type_name",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1


class EvalError(Exception):
    """A CEL runtime error value (cel-go's types.Err), raised instead of returned."""


class CostExceeded(Exception):
    """The evaluation spent its cost budget."""


class Uint(int):
    """CEL uint: a distinct type from int (1u and 1 are equal, but `1u + 1` has no overload)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{int(self)}u"


@dataclass(frozen=True)
class CelType:
    """A CEL type value, e.g. the result of `type(x)` or the identifier `int`."""

    name: str

    def __str__(self) -> str:
        return self.name


class DomainMap(dict[str, Any]):
    """`device.attributes` / `device.capacity`: a missing domain reads as an empty map.

    Upstream wraps these maps with a default (`newStringInterfaceMapWithDefault`), so
    `device.attributes["x.com"].model` is "no such key: model" and `"x.com" in device.attributes`
    is false. `in`, `size()` and iteration still see only the domains that exist.
    """

    def __missing__(self, key: object) -> dict[str, Any]:
        if isinstance(key, str):
            return EMPTY_MAP
        raise KeyError(key)


EMPTY_MAP: dict[str, Any] = {}


@dataclass(frozen=True, eq=False)
class DeviceValue:
    """The `device` variable: the object type kubernetes.DRADevice."""

    driver: str
    attributes: DomainMap
    capacity: DomainMap
    allow_multiple_allocations: bool

    FIELDS = ("driver", "attributes", "capacity", "allowMultipleAllocations")

    def field(self, name: str) -> Any:
        if name == "driver":
            return self.driver
        if name == "attributes":
            return self.attributes
        if name == "capacity":
            return self.capacity
        if name == "allowMultipleAllocations":
            return self.allow_multiple_allocations
        raise EvalError(f"no such field: {name}")


class Stopped(Exception):  # noqa: N818 - a signal, like StopIteration, not an error of CEL
    """The request's `stop` check said so (its deadline passed, its client went away)."""


STOP_CHECK_UNITS = 16_384  # ~0.1 ms of evaluation between two looks at `stop`


class Frame:
    """One evaluation: variable bindings, the remaining cost budget, and the request's `stop`
    check, looked at every STOP_CHECK_UNITS units so that one long expression cannot outlive
    its request (the core reads no clock: `stop` is the caller's)."""

    __slots__ = ("_stop", "_until_check", "budget", "vars")

    def __init__(
        self, variables: dict[str, Any], budget: int, stop: Callable[[], bool] | None = None
    ) -> None:
        self.vars = variables
        self.budget = budget
        self._stop = stop
        self._until_check = STOP_CHECK_UNITS

    def charge(self, units: int) -> None:
        self.budget -= units
        if self.budget < 0:
            raise CostExceeded()
        if self._stop is not None:
            self._until_check -= units
            if self._until_check <= 0:
                self._until_check = STOP_CHECK_UNITS
                if self._stop():
                    raise Stopped()


# --- type names -------------------------------------------------------------------------

_TYPE_NAMES: dict[type, str] = {
    bool: "bool",
    int: "int",
    Uint: "uint",
    float: "double",
    str: "string",
    bytes: "bytes",
    type(None): "null_type",
    list: "list",
    dict: "map",
    DomainMap: "map",
    Quantity: "kubernetes.Quantity",
    Version: "kubernetes.Semver",
    CelType: "type",
    DeviceValue: "kubernetes.DRADevice",
}


def type_name(value: object) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def no_overload(name: str, *args: object) -> EvalError:
    types = ", ".join(type_name(a) for a in args)
    return EvalError(f"no such overload: {name}({types})")


# --- equality and ordering --------------------------------------------------------------

_NUMBER_TYPES = (int, Uint, float)


def _is_number(value: object) -> bool:
    return type(value) in _NUMBER_TYPES


def equal(a: object, b: object) -> bool:
    """CEL heterogeneous equality: different types are unequal, numbers compare by value."""
    ta, tb = type(a), type(b)
    if ta in _NUMBER_TYPES and tb in _NUMBER_TYPES:
        return a == b
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(equal, a, b))
    if isinstance(a, dict):
        if not isinstance(b, dict) or len(a) != len(b):
            return False
        return all(k in b and equal(v, b[k]) for k, v in a.items())
    if ta is not tb:
        return False
    if ta is DeviceValue:
        return a is b
    return a == b


def ordered(name: str, a: object, b: object) -> None:
    """Raise unless `a` and `b` have an ordering overload (numbers, strings, bytes, bools)."""
    ta, tb = type(a), type(b)
    if ta in _NUMBER_TYPES and tb in _NUMBER_TYPES:
        return
    if ta is tb and ta in (str, bytes, bool):
        return
    raise no_overload(name, a, b)


def less(a: Any, b: Any) -> bool:
    ordered("_<_", a, b)
    return bool(a < b)


# --- arithmetic -------------------------------------------------------------------------


def check_int(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise EvalError("integer overflow")
    return value


def _check_uint(value: int) -> Uint:
    if not 0 <= value <= UINT64_MAX:
        raise EvalError("unsigned integer overflow")
    return Uint(value)


def _arith(
    name: str, a: Any, b: Any, on_int: Callable[[int, int], int], on_float: Callable[..., Any]
) -> Any:
    ta, tb = type(a), type(b)
    if ta is not tb:
        raise no_overload(name, a, b)
    if ta is int:
        return check_int(on_int(a, b))
    if ta is Uint:
        return _check_uint(on_int(int(a), int(b)))
    if ta is float:
        return on_float(a, b)
    raise no_overload(name, a, b)


def add(frame: Frame, a: Any, b: Any) -> Any:
    ta = type(a)
    if ta is type(b) and (ta is str or ta is bytes or ta is list):
        frame.charge(1 + (len(a) + len(b)) // 10)
        return a + b
    frame.charge(1)
    return _arith("_+_", a, b, operator.add, operator.add)


def subtract(frame: Frame, a: Any, b: Any) -> Any:
    frame.charge(1)
    return _arith("_-_", a, b, operator.sub, operator.sub)


def multiply(frame: Frame, a: Any, b: Any) -> Any:
    frame.charge(1)
    return _arith("_*_", a, b, operator.mul, operator.mul)


def _truncated_div(a: int, b: int) -> int:
    if b == 0:
        raise EvalError("division by zero")
    quotient = abs(a) // abs(b)
    return quotient if (a < 0) == (b < 0) else -quotient


def _truncated_mod(a: int, b: int) -> int:
    if b == 0:
        raise EvalError("modulus by zero")
    return a - b * _truncated_div(a, b)


def _float_div(a: float, b: float) -> float:
    if b == 0.0:
        if a == 0.0 or a != a:
            return float("nan")
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _no_float_mod(a: float, b: float) -> float:
    raise EvalError("no such overload: _%_(double, double)")


def divide(frame: Frame, a: Any, b: Any) -> Any:
    frame.charge(1)
    return _arith("_/_", a, b, _truncated_div, _float_div)


def modulo(frame: Frame, a: Any, b: Any) -> Any:
    frame.charge(1)
    return _arith("_%_", a, b, _truncated_mod, _no_float_mod)


def negate(frame: Frame, a: Any) -> Any:
    frame.charge(1)
    if type(a) is int:
        return check_int(-a)
    if type(a) is float:
        return -a
    raise no_overload("-_", a)


# --- selection --------------------------------------------------------------------------


def select(value: Any, field: str) -> Any:
    """`value.field`: a map key or a device field."""
    if isinstance(value, dict):
        try:
            return value[field]
        except KeyError:
            raise EvalError(f"no such key: {field}{_known_key_hint(field, value)}") from None
    if type(value) is DeviceValue:
        return value.field(field)
    raise EvalError(f"type '{type_name(value)}' does not support field selection")


def _known_key_hint(field: str, value: dict[Any, Any]) -> str:
    """` (did you mean "productName"?)` when a key of the map (a device's attributes in one
    domain, its capacities) is close; cached, as the same miss repeats on every device."""
    return _closest_key(field, tuple(k for k in value if type(k) is str))


@lru_cache(maxsize=1024)
def _closest_key(field: str, keys: tuple[str, ...]) -> str:
    return did_you_mean(field, keys)


def index(value: Any, key: Any) -> Any:
    """`value[key]` on a list (int index) or a map (any key type CEL allows)."""
    if isinstance(value, list):
        tk = type(key)
        if tk is float and key.is_integer():
            key = int(key)
        elif tk is not int and tk is not Uint:
            raise no_overload("_[_]", value, key)
        if not 0 <= key < len(value):
            raise EvalError(f"index out of bounds: {key}")
        return value[key]
    if isinstance(value, dict):
        if type(key) not in (str, int, Uint, bool, float):
            raise no_overload("_[_]", value, key)
        try:
            return value[key]
        except KeyError:
            raise EvalError(f"no such key: {key}") from None
    raise no_overload("_[_]", value, key)


# --- library functions ------------------------------------------------------------------

Impl = Callable[..., Any]


@dataclass(frozen=True)
class Function:
    """One callable name: allowed argument counts (receiver excluded for methods), the
    implementation `impl(frame, *args)`, and its static result type (None = dyn)."""

    arities: frozenset[int]
    impl: Impl
    result: str | None = None


def fn(arities: tuple[int, ...], impl: Impl, result: str | None = None) -> Function:
    return Function(frozenset(arities), impl, result)


def str_args(name: str, *args: Any) -> None:
    """Raise "no such overload" unless every argument is a string."""
    if any(type(a) is not str for a in args):
        raise no_overload(name, *args)


def int_arg(name: str, receiver: Any, value: Any) -> int:
    if type(value) is not int:
        raise no_overload(name, receiver, value)
    return int(value)
