"""Kubernetes resource.Quantity: the upstream grammar, exact arithmetic, upstream's strings.

Grammar (k8s.io/apimachinery/pkg/api/resource/quantity.go)::

    <quantity>        ::= <signedNumber><suffix>
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>
    <signedNumber>    ::= <number> | +<number> | -<number>
    <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>

Behaviour follows apimachinery v0.34 `ParseQuantity` and `String()`:

- the exponent after e/E is an integer (`1e3`, `1E-3`, `1e+3`; `1e3.5` is rejected, as upstream);
- values finer than 1n (10^-9) round up, away from zero, to the next nano (`0.9n` -> `1n`);
- binary SI values are capped at 2^63-1 in magnitude (`9Ei` -> 9223372036854775807); a binary SI
  value strictly between -1 and 1 becomes decimal SI (`0.5Ki` is 512, printed `512`);
- `str()` is upstream's `String()`: the input itself when upstream keeps it (it already is in the
  canonical form, e.g. `1e3`, `100m`, `40Gi`, and also `+1` or `007`, which upstream keeps
  verbatim), otherwise `canonical()`, upstream's `CanonicalizeBytes` (`1.5` -> `1500m`,
  `1.5Gi` -> `1536Mi`, `1000` -> `1k`, `1E3` -> `1e3`).

Deliberate differences from the upstream scanner, which is looser than its own grammar: a number
needs at least one digit (upstream reads `Gi`, `e3`, `.`, `-` as zero; we reject them),
exponents beyond +-1000 digits are refused instead of building gigantic numbers or wrapping at
int32, and a decimal SI value beyond 10^18 prints as `1e21` (later upstream releases do the same;
v0.34 silently dropped the suffix).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from functools import total_ordering

__all__ = ["Quantity", "QuantityFormat"]


class QuantityFormat(StrEnum):
    BINARY_SI = "BinarySI"
    DECIMAL_SI = "DecimalSI"
    DECIMAL_EXPONENT = "DecimalExponent"


_BINARY_EXPONENT = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_BINARY_SUFFIX = {0: "", 1: "Ki", 2: "Mi", 3: "Gi", 4: "Ti", 5: "Pi", 6: "Ei"}
_DECIMAL_EXPONENT = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_DECIMAL_SUFFIX = {exponent: suffix for suffix, exponent in _DECIMAL_EXPONENT.items()}

# The upstream scanner: sign, digits, optional fraction, then suffix letters from this set, an
# optional sign and digits. Which suffixes are real is decided afterwards (`_interpret`).
_QUANTITY_RE = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?(?P<suffix>[eEinumkKMGTP]*[+-]?[0-9]*)"
)
_NANO_PER_UNIT = 10**9
_MAX_INT64 = 2**63 - 1
_MAX_DIGITS = 1000  # refuse values with more integer digits than this (upstream: unbounded)


@total_ordering
@dataclass(frozen=True, eq=False)
class Quantity:
    """An exact quantity; equal, ordered and hashed by value, whatever the format.

    `value` is always a multiple of 10^-9. `format` decides how `canonical()` prints it. `text` is
    the string upstream's `String()` would return (the parsed input when upstream keeps it)."""

    value: Fraction
    format: QuantityFormat = QuantityFormat.DECIMAL_SI
    text: str | None = field(default=None, kw_only=True, repr=False)

    # --- construction ---------------------------------------------------------------

    @classmethod
    def parse(cls, text: str) -> Quantity:
        """Parse like upstream `ParseQuantity` (no surrounding whitespace); ValueError otherwise."""
        if not isinstance(text, str):
            raise ValueError(f"quantity must be a string, got {type(text).__name__}")
        match = _QUANTITY_RE.fullmatch(text)
        if match is None or not (match["int"] or match["frac"]):
            raise ValueError(
                f"quantity {text!r} does not match the Kubernetes quantity grammar "
                "(e.g. '40Gi', '1.5', '100m', '1e3', '80G')"
            )
        base, exponent, fmt = _interpret(match["suffix"], text)
        negative = match["sign"] == "-"
        num = match["int"].lstrip("0") or "0"
        denom = match["frac"] or ""
        if base == 2:
            value, fmt = _binary_value(num, denom, exponent, negative)
        else:
            value = _decimal_value(num, denom, exponent, negative, text)
        kept = text if _upstream_keeps_text(num, denom, exponent, fmt, base) else None
        return cls(value, fmt, text=kept)

    @classmethod
    def of(
        cls, value: int | Fraction | str, fmt: QuantityFormat = QuantityFormat.DECIMAL_SI
    ) -> Quantity:
        """A quantity from a number (rounded up to nano), or from a string (parsed)."""
        if isinstance(value, str):
            return cls.parse(value)
        return cls(_round_up_to_nano(Fraction(value)), fmt)

    # --- arithmetic and comparison --------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.value == other.value

    def __lt__(self, other: Quantity) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __add__(self, other: Quantity) -> Quantity:
        return Quantity(self.value + other.value, self._sum_format(other))

    def __sub__(self, other: Quantity) -> Quantity:
        return Quantity(self.value - other.value, self._sum_format(other))

    def __neg__(self) -> Quantity:
        return Quantity(-self.value, self.format)

    def _sum_format(self, other: Quantity) -> QuantityFormat:
        # Upstream Add/Sub: a zero receiver takes the other operand's format.
        return other.format if self.value == 0 else self.format

    def compare(self, other: Quantity) -> int:
        """-1, 0 or 1, like upstream Cmp."""
        return (self.value > other.value) - (self.value < other.value)

    def sign(self) -> int:
        return (self.value > 0) - (self.value < 0)

    def is_zero(self) -> bool:
        return self.value == 0

    def is_integer(self) -> bool:
        return self.value.denominator == 1

    def as_int(self) -> int:
        """The integer value; ValueError if it has a fractional part."""
        if self.value.denominator != 1:
            raise ValueError(f"quantity {self} is not an integer")
        return self.value.numerator

    def as_float(self) -> float:
        return float(self.value)

    # --- printing -------------------------------------------------------------------

    def __str__(self) -> str:
        return self.text if self.text is not None else self.canonical()

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r})"

    def canonical(self) -> str:
        """Upstream `CanonicalizeBytes`: no fractional digits, the largest suffix of the format."""
        if self.value == 0:
            return "0"
        if (
            self.format is QuantityFormat.BINARY_SI
            and abs(self.value) >= 1024
            and self.value.denominator == 1
        ):
            return _format_binary(self.value.numerator)
        return _format_decimal(self.value, self.format is QuantityFormat.DECIMAL_EXPONENT)


# --- parsing helpers ----------------------------------------------------------------------


def _interpret(suffix: str, text: str) -> tuple[int, int, QuantityFormat]:
    """(base, exponent, format) of a suffix, as upstream's suffixer.interpret."""
    if suffix in _DECIMAL_EXPONENT:
        return 10, _DECIMAL_EXPONENT[suffix], QuantityFormat.DECIMAL_SI
    if suffix in _BINARY_EXPONENT:
        return 2, _BINARY_EXPONENT[suffix], QuantityFormat.BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch(r"[+-]?[0-9]+", suffix[1:]):
        exponent = int(suffix[1:])
        if abs(exponent) > 2**31 - 1:
            raise ValueError(f"quantity {text!r} has an exponent out of range")
        return 10, exponent, QuantityFormat.DECIMAL_EXPONENT
    raise ValueError(f"quantity {text!r} has an unknown suffix {suffix!r}")


def _decimal_value(num: str, denom: str, exponent: int, negative: bool, text: str) -> Fraction:
    digits = int(num + denom)
    if digits == 0:
        return Fraction(0)
    scale = exponent - len(denom)  # value = digits * 10^scale
    if len(str(digits)) + scale < -9:
        magnitude = Fraction(1, _NANO_PER_UNIT)  # below 1n: rounds up to exactly 1n
    elif len(str(digits)) + scale > _MAX_DIGITS:
        raise ValueError(f"quantity {text!r} is too large")
    else:
        magnitude = _round_up_to_nano(digits * Fraction(10) ** scale)
    return -magnitude if negative else magnitude


def _binary_value(
    num: str, denom: str, exponent: int, negative: bool
) -> tuple[Fraction, QuantityFormat]:
    magnitude = Fraction(int(num + denom), 10 ** len(denom)) * 2**exponent
    magnitude = min(_round_up_to_nano(magnitude), Fraction(_MAX_INT64))
    fmt = QuantityFormat.DECIMAL_SI if 0 < magnitude < 1 else QuantityFormat.BINARY_SI
    return (-magnitude if negative else magnitude), fmt


def _upstream_keeps_text(
    num: str, denom: str, exponent: int, fmt: QuantityFormat, base: int
) -> bool:
    """Whether upstream's fast path caches the input as the String() result."""
    shifted = num + denom
    if base == 2:
        precision = 15 - len(num) - exponent * 3 // 10 - 1
        if denom or precision < 0 or int(num) << exponent > _MAX_INT64:
            return False
        return int(num) & 7 != 0
    scale = exponent - len(denom)
    if 18 - len(shifted) < 0 or scale < -9:
        return False
    return scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"


def _round_up_to_nano(value: Fraction) -> Fraction:
    """Round away from zero to a multiple of 10^-9, as upstream's Round(Nano, RoundUp)."""
    nanos = value * _NANO_PER_UNIT
    if nanos.denominator == 1:
        return value
    magnitude = math.ceil(abs(nanos))
    return Fraction(magnitude if value > 0 else -magnitude, _NANO_PER_UNIT)


# --- printing helpers ---------------------------------------------------------------------


def _format_binary(value: int) -> str:
    mantissa, power = value, 0
    while mantissa % 1024 == 0:
        mantissa //= 1024
        power += 1
    if power > 6:  # beyond Ei (only reachable by arithmetic): keep Ei, grow the mantissa
        mantissa, power = mantissa * 1024 ** (power - 6), 6
    return f"{mantissa}{_BINARY_SUFFIX[power]}"


def _format_decimal(value: Fraction, exponent_format: bool) -> str:
    nanos = int(value * _NANO_PER_UNIT)  # exact: every Quantity is a multiple of 1n
    digits = str(abs(nanos))
    stripped = digits.rstrip("0")
    exponent = -9 + len(digits) - len(stripped)
    mantissa = int(stripped)
    while exponent % 3:  # lower the exponent to a multiple of three, as upstream
        mantissa *= 10
        exponent -= 1
    sign = "-" if nanos < 0 else ""
    if not exponent_format and exponent in _DECIMAL_SUFFIX:
        return f"{sign}{mantissa}{_DECIMAL_SUFFIX[exponent]}"
    return f"{sign}{mantissa}" if exponent == 0 else f"{sign}{mantissa}e{exponent}"
