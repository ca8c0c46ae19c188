"""Kubernetes resource.Quantity: the exact upstream grammar, exact arithmetic, canonical strings.

Grammar (k8s.io/apimachinery/pkg/api/resource/quantity.go)::

    <quantity>        ::= <signedNumber><suffix>
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>
    <signedNumber>    ::= <number> | +<number> | -<number>
    <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>

Values are held exactly as a Fraction; like upstream, anything finer than 1n (10^-9) is rounded
up (away from zero) to the next nano. The format (binary SI, decimal SI, decimal exponent) comes
from the suffix and is used when printing, as upstream's canonical form does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from functools import total_ordering

__all__ = ["Quantity", "QuantityFormat"]


class QuantityFormat(StrEnum):
    BINARY_SI = "BinarySI"
    DECIMAL_SI = "DecimalSI"
    DECIMAL_EXPONENT = "DecimalExponent"


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX_BY_EXP = {exp: suffix for suffix, exp in _DECIMAL.items()}

_NUMBER = r"[+-]?(?:\d+\.?\d*|\.\d+)"
_QUANTITY_RE = re.compile(
    rf"^(?P<number>{_NUMBER})(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?\d+)|(?P<decimal>[numkMGTPE]?))$"
)
_NANO = Fraction(1, 10**9)
_MAX_EXPONENT = 1000  # refuse absurd exponents rather than building a gigantic integer


@total_ordering
@dataclass(frozen=True, eq=False)
class Quantity:
    """An exact quantity. Compare, add and subtract; `str()` gives the canonical form."""

    value: Fraction
    format: QuantityFormat = QuantityFormat.DECIMAL_SI

    # --- construction ---------------------------------------------------------------

    @classmethod
    def parse(cls, text: str) -> Quantity:
        """Parse upstream's grammar; raises ValueError with a readable message otherwise."""
        if not isinstance(text, str):
            raise ValueError(f"quantity must be a string, got {type(text).__name__}")
        s = text.strip()
        match = _QUANTITY_RE.match(s)
        if not s or match is None:
            raise ValueError(
                f"quantity {text!r} does not match the Kubernetes grammar "
                "(e.g. '40Gi', '1.5', '100m', '1e3', '80G')"
            )
        number = Fraction(match["number"])
        if match["binary"] is not None:
            return cls(_round_nano(number * _BINARY[match["binary"]]), QuantityFormat.BINARY_SI)
        if match["exp"] is not None:
            exp = int(match["exp"])
            if abs(exp) > _MAX_EXPONENT:
                raise ValueError(f"quantity {text!r} has an exponent out of range")
            return cls(_round_nano(number * Fraction(10) ** exp), QuantityFormat.DECIMAL_EXPONENT)
        exp = _DECIMAL[match["decimal"] or ""]
        return cls(_round_nano(number * Fraction(10) ** exp), QuantityFormat.DECIMAL_SI)

    @classmethod
    def of(cls, value: int | Fraction | str, fmt: QuantityFormat = QuantityFormat.DECIMAL_SI) -> Quantity:
        """A quantity from a number (or from a string, parsed)."""
        if isinstance(value, str):
            return cls.parse(value)
        return cls(_round_nano(Fraction(value)), fmt)

    # --- arithmetic and comparison --------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.value == other.value

    def __lt__(self, other: Quantity) -> bool:
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __add__(self, other: Quantity) -> Quantity:
        return Quantity(self.value + other.value, self.format)

    def __sub__(self, other: Quantity) -> Quantity:
        return Quantity(self.value - other.value, self.format)

    def __neg__(self) -> Quantity:
        return Quantity(-self.value, self.format)

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
        return self.canonical()

    def __repr__(self) -> str:
        return f"Quantity({self.canonical()!r})"

    def canonical(self) -> str:
        """Upstream's canonical string: the largest suffix of the format that keeps an integer
        mantissa (binary SI falls back to decimal SI when no binary suffix fits)."""
        if self.value == 0:
            return "0"
        if self.format is QuantityFormat.BINARY_SI and self.value.denominator == 1:
            text = _format_binary(self.value.numerator)
            if text is not None:
                return text
        exponent_format = self.format is QuantityFormat.DECIMAL_EXPONENT
        return _format_decimal(self.value, exponent_format)


def _round_nano(value: Fraction) -> Fraction:
    """Round away from zero to a multiple of 10^-9, as upstream's infDec scale limit does."""
    scaled = value / _NANO
    if scaled.denominator == 1:
        return value
    rounded = math.ceil(abs(scaled))
    return Fraction(rounded if value > 0 else -rounded) * _NANO


def _format_binary(value: int) -> str | None:
    magnitude = abs(value)
    if magnitude < 1024:
        return None  # upstream prints small binary values in decimal SI
    for suffix, factor in reversed(_BINARY.items()):
        if magnitude % factor == 0:
            return f"{value // factor}{suffix}"
    return None


def _format_decimal(value: Fraction, exponent_format: bool) -> str:
    # Find the largest exponent (multiple of 3, within n..E) that leaves an integer mantissa.
    best_exp = -9
    for exp in range(18, -10, -3):
        mantissa = value / Fraction(10) ** exp
        if mantissa.denominator == 1:
            best_exp = exp
            break
    mantissa_int = int(value / Fraction(10) ** best_exp)
    if best_exp == 18 and not exponent_format:
        # Beyond E: keep multiplying into the mantissa, as upstream does.
        return f"{mantissa_int}E"
    if exponent_format:
        return f"{mantissa_int}" if best_exp == 0 else f"{mantissa_int}e{best_exp}"
    return f"{mantissa_int}{_DECIMAL_SUFFIX_BY_EXP[best_exp]}"
