"""Text rendering for CEL values: `string(double)`, the ext Strings `format` function and
`strings.quote`, following cel-go's output where selectors can observe it.

Doubles print as Go's `%g` with the shortest round-trip digits (`1e+06`, `0.0001`, `1.5`), which
is not Python's `repr`. `format` supports the verbs cel-go documents: %s %d %f %e %b %o %x %X
and %%, with an optional precision for %f/%e; it charges for each piece before joining them.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from services.cel.values import EvalError, Frame, Uint, type_name

__all__ = ["double_to_string", "format_string", "quote"]


def double_to_string(value: float) -> str:
    """Go's `fmt.Sprintf("%g", value)`, which cel-go's string(double) uses."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0.0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign = "-" if value < 0 else ""
    digits_tuple = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, digits_tuple.digits))
    exponent = int(digits_tuple.exponent) + len(digits) - 1  # scientific exponent
    if exponent < -4 or exponent >= 6:  # Go: shortest %g switches to %e at precision 6
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    if exponent < 0:
        return f"{sign}0.{'0' * (-exponent - 1)}{digits}"
    if exponent + 1 >= len(digits):
        return sign + digits + "0" * (exponent + 1 - len(digits))
    return f"{sign}{digits[: exponent + 1]}.{digits[exponent + 1 :]}"


_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def quote(text: str) -> str:
    """`strings.quote`: double-quoted, with C-style escapes for control characters."""
    return '"' + "".join(_ESCAPES.get(c, c) for c in text) + '"'


def _plain(value: Any) -> str:
    """A value as `%s` shows it."""
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
        return bytes(value).decode("utf-8", errors="replace")
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ", ".join(_nested(v) for v in value) + "]"
    if isinstance(value, dict):
        entries = sorted((_nested(k), _nested(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in entries) + "}"
    return type_name(value)


def _nested(value: Any) -> str:
    return quote(value) if type(value) is str else _plain(value)


def _integer(verb: str, value: Any) -> str:
    if type(value) not in (int, Uint):
        raise EvalError(f"format: %{verb} needs an integer, got {type_name(value)}")
    number = int(value)
    body = {"d": "d", "b": "b", "o": "o", "x": "x", "X": "X"}[verb]
    return format(number, body)


def _fixed(verb: str, value: Any, precision: int) -> str:
    if type(value) not in (int, Uint, float):
        raise EvalError(f"format: %{verb} needs a number, got {type_name(value)}")
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        return double_to_string(number)
    if verb == "f":
        return f"{number:.{precision}f}"
    return f"{number:.{precision}e}"


def _hex(verb: str, value: Any) -> str:
    if type(value) is str:
        raw = str(value).encode("utf-8")
    elif type(value) is bytes:
        raw = bytes(value)
    else:
        return _integer(verb, value)
    text = raw.hex()
    return text.upper() if verb == "X" else text


def _render(verb: str, value: Any, precision: int | None) -> str:
    if verb == "s":
        return _plain(value)
    if verb in "fe":
        return _fixed(verb, value, 6 if precision is None else precision)
    if verb in "xX":
        return _hex(verb, value)
    if verb in "dbo":
        return _integer(verb, value)
    raise EvalError(f"format: unknown verb %{verb}")


def format_string(frame: Frame, template: str, args: list[Any]) -> str:
    pieces: list[str] = []
    used = 0
    i = 0
    while i < len(template):
        char = template[i]
        if char != "%":
            j = template.find("%", i)
            j = len(template) if j < 0 else j
            pieces.append(template[i:j])
            i = j
            continue
        i += 1
        precision: int | None = None
        if i < len(template) and template[i] == ".":
            start = i + 1
            i = start
            while i < len(template) and template[i].isdigit():
                i += 1
            precision = int(template[start:i] or "0")
        if i >= len(template):
            raise EvalError("format: unterminated format verb")
        verb = template[i]
        i += 1
        if verb == "%":
            pieces.append("%")
            continue
        if used >= len(args):
            raise EvalError(f"format: not enough arguments for {template!r}")
        piece = _render(verb, args[used], precision)
        used += 1
        frame.charge(1 + len(piece) // 10)
        pieces.append(piece)
    if used != len(args):
        raise EvalError(f"format: {len(args) - used} unused argument(s)")
    return "".join(pieces)
