"""The Kubernetes CEL quantity and semver libraries (k8s.io/apiserver/pkg/cel/library quantity.go
and semverlib.go), on services.common.dra.quantity.Quantity and cel_semver.Version.

`compareTo`, `isGreaterThan` and `isLessThan` exist for both types under one name, so the
implementation dispatches on the receiver. `add`/`sub` accept a quantity or an int, as upstream
(the int becomes a DecimalExponent quantity); `asInteger` fails unless the value is an integer
that fits int64.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from services.cel.semver import Version
from services.cel.values import (
    INT64_MAX,
    INT64_MIN,
    EvalError,
    Frame,
    Function,
    Impl,
    check_int,
    fn,
    no_overload,
    str_args,
)
from services.common.dra.quantity import Quantity, QuantityFormat

__all__ = ["K8S_FUNCTIONS", "K8S_METHODS"]


def _quantity(frame: Frame, text: Any) -> Quantity:
    str_args("quantity", text)
    frame.charge(1)
    try:
        return Quantity.parse(text)
    except ValueError as exc:
        raise EvalError(str(exc)) from None


def _is_quantity(frame: Frame, text: Any) -> bool:
    str_args("isQuantity", text)
    frame.charge(1)
    try:
        Quantity.parse(text)
    except ValueError:
        return False
    return True


def _quantity_arg(name: str, value: Any, *rest: Any) -> Quantity:
    if type(value) is not Quantity:
        raise no_overload(name, value, *rest)
    return value


def _as_int64(q: Quantity) -> int | None:
    if not q.is_integer() or not INT64_MIN <= q.value <= INT64_MAX:
        return None
    return q.as_int()


def _sign(frame: Frame, q: Any) -> int:
    frame.charge(1)
    return _quantity_arg("sign", q).sign()


def _is_integer(frame: Frame, q: Any) -> bool:
    frame.charge(1)
    return _as_int64(_quantity_arg("isInteger", q)) is not None


def _as_integer(frame: Frame, q: Any) -> int:
    frame.charge(1)
    value = _as_int64(_quantity_arg("asInteger", q))
    if value is None:
        raise EvalError("cannot convert value to integer")
    return value


def _as_approximate_float(frame: Frame, q: Any) -> float:
    frame.charge(1)
    value = _quantity_arg("asApproximateFloat", q).value
    try:
        return float(value)
    except OverflowError:
        return math.copysign(math.inf, value)


def _quantity_math(name: str, sign: int) -> Impl:
    def impl(frame: Frame, receiver: Any, other: Any) -> Quantity:
        q = _quantity_arg(name, receiver, other)
        frame.charge(1)
        operand: Quantity
        if type(other) is int:
            operand = Quantity(Fraction(other), QuantityFormat.DECIMAL_EXPONENT)
        elif type(other) is Quantity:
            operand = other
        else:
            raise no_overload(name, q, other)
        return q + operand if sign > 0 else q - operand

    return impl


def _compare_to(frame: Frame, first: Any, second: Any) -> int:
    frame.charge(1)
    if type(first) is Quantity and type(second) is Quantity:
        return first.compare(second)
    if type(first) is Version and type(second) is Version:
        return first.compare(second)
    raise no_overload("compareTo", first, second)


def _is_greater_than(frame: Frame, first: Any, second: Any) -> bool:
    return _compare_to(frame, first, second) > 0


def _is_less_than(frame: Frame, first: Any, second: Any) -> bool:
    return _compare_to(frame, first, second) < 0


def _semver(frame: Frame, text: Any, normalize: Any = False) -> Version:
    if type(text) is not str or type(normalize) is not bool:
        raise no_overload("semver", text, normalize)
    frame.charge(1)
    try:
        return Version.parse(text, normalize=normalize)
    except ValueError as exc:
        raise EvalError(str(exc)) from None


def _is_semver(frame: Frame, text: Any, normalize: Any = False) -> bool:
    if type(text) is not str or type(normalize) is not bool:
        raise no_overload("isSemver", text, normalize)
    frame.charge(1)
    return Version.is_valid(text, normalize=normalize)


def _version_part(name: str) -> Impl:
    def impl(frame: Frame, version: Any) -> int:
        if type(version) is not Version:
            raise no_overload(name, version)
        frame.charge(1)
        return check_int(getattr(version, name))

    return impl


K8S_FUNCTIONS: dict[str, Function] = {
    "quantity": fn((1,), _quantity, "quantity"),
    "isQuantity": fn((1,), _is_quantity, "bool"),
    "sign": fn((1,), _sign, "int"),
    "semver": fn((1, 2), _semver, "semver"),
    "isSemver": fn((1, 2), _is_semver, "bool"),
}

K8S_METHODS: dict[str, Function] = {
    "sign": fn((0,), _sign, "int"),
    "isInteger": fn((0,), _is_integer, "bool"),
    "asInteger": fn((0,), _as_integer, "int"),
    "asApproximateFloat": fn((0,), _as_approximate_float, "double"),
    "add": fn((1,), _quantity_math("add", 1), "quantity"),
    "sub": fn((1,), _quantity_math("sub", -1), "quantity"),
    "compareTo": fn((1,), _compare_to, "int"),
    "isGreaterThan": fn((1,), _is_greater_than, "bool"),
    "isLessThan": fn((1,), _is_less_than, "bool"),
    "major": fn((0,), _version_part("major"), "int"),
    "minor": fn((0,), _version_part("minor"), "int"),
    "patch": fn((0,), _version_part("patch"), "int"),
}
