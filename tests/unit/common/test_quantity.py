"""Quantity against upstream apimachinery behaviour (ParseQuantity, String, CanonicalizeBytes).

Expected strings come from upstream's own tables (quantity_test.go TestQuantityString,
TestQuantityParseEmit, TestQuantityParse at v0.34.9) plus the cases gpualloc relies on.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.dra.quantity import Quantity, QuantityFormat

BIN, DEC, EXP = QuantityFormat.BINARY_SI, QuantityFormat.DECIMAL_SI, QuantityFormat.DECIMAL_EXPONENT


@pytest.mark.parametrize(
    ("text", "value", "fmt", "printed"),
    [
        pytest.param("40Gi", 40 * 2**30, BIN, "40Gi", id="binary-gi"),
        pytest.param("1.5", Fraction(3, 2), DEC, "1500m", id="decimal-fraction"),
        pytest.param("100m", Fraction(1, 10), DEC, "100m", id="milli"),
        pytest.param("1e3", 1000, EXP, "1e3", id="exponent-lower"),
        pytest.param("1E3", 1000, EXP, "1E3", id="exponent-upper-kept-verbatim"),
        pytest.param("80G", 80 * 10**9, DEC, "80G", id="decimal-giga"),
        pytest.param(".5", Fraction(1, 2), DEC, "500m", id="leading-dot"),
        pytest.param("5.", 5, DEC, "5.", id="trailing-dot-kept-verbatim"),
        pytest.param("+1", 1, DEC, "+1", id="plus-sign-kept-verbatim"),
        pytest.param("-1Ki", -1024, BIN, "-1Ki", id="negative-binary"),
        pytest.param("1.5Gi", 1536 * 2**20, BIN, "1536Mi", id="fractional-gi"),
        pytest.param("0.5Gi", 512 * 2**20, BIN, "512Mi", id="half-gi"),
        pytest.param(
            "1.0000000001", Fraction(1000000001, 10**9), DEC, "1000000001n", id="round-up-to-nano"
        ),
        pytest.param("0.9n", Fraction(1, 10**9), DEC, "1n", id="below-nano-rounds-up"),
        pytest.param("-0.9n", Fraction(-1, 10**9), DEC, "-1n", id="negative-rounds-away-from-zero"),
        pytest.param("1000", 1000, DEC, "1k", id="thousand-is-1k"),
        pytest.param("0.1", Fraction(1, 10), DEC, "100m", id="tenth-is-100m"),
        pytest.param("9Ei", 2**63 - 1, BIN, "9223372036854775807", id="binary-capped-at-int64"),
        pytest.param(
            "0.000000000001Ki", Fraction(2, 10**9), DEC, "2n", id="tiny-binary-becomes-decimal"
        ),
        pytest.param("12E", 12 * 10**18, DEC, "12E", id="exa"),
        pytest.param("1000E", 10**21, DEC, "1e21", id="beyond-exa-uses-exponent"),
        pytest.param("1.2e3", 1200, EXP, "1200", id="exponent-with-fraction"),
        pytest.param("1.3E+6", 1300000, EXP, "1300e3", id="exponent-with-plus"),
        pytest.param("1E-3", Fraction(1, 1000), EXP, "1E-3", id="negative-exponent"),
        pytest.param("0", 0, DEC, "0", id="zero"),
        pytest.param("-0", 0, DEC, "0", id="negative-zero"),
        pytest.param("0Gi", 0, BIN, "0", id="zero-binary"),
        pytest.param("1.G", 10**9, DEC, "1.G", id="dot-before-suffix"),
        pytest.param("0.5Ki", 512, BIN, "512", id="small-binary-prints-decimal"),
        pytest.param("2.9296875Ki", 3000, BIN, "3000", id="binary-without-1024-factor"),
        pytest.param("100.035Ki", Fraction(10243584, 100), BIN, "102435840m", id="binary-fraction"),
    ],
)
def test_parse_value_format_and_string(
    text: str, value: Fraction | int, fmt: QuantityFormat, printed: str
) -> None:
    quantity = Quantity.parse(text)
    assert quantity.value == value
    assert quantity.format is fmt
    assert str(quantity) == printed


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("1.5.5", id="two-dots"),
        pytest.param("Gi", id="suffix-without-number"),
        pytest.param("1 Gi", id="inner-space"),
        pytest.param("1gi", id="lower-case-binary-suffix"),
        pytest.param("1KiB", id="bytes-suffix"),
        pytest.param("1e", id="exponent-without-digits"),
        pytest.param("e3", id="exponent-without-mantissa"),
        pytest.param("", id="empty"),
        pytest.param(" ", id="blank"),
        pytest.param(" 1", id="leading-space"),
        pytest.param("1 ", id="trailing-space"),
        pytest.param(".", id="lone-dot"),
        pytest.param("-", id="lone-sign"),
        pytest.param("1e3.5", id="fractional-exponent"),
        pytest.param("1.1.M", id="upstream-invalid-dots"),
        pytest.param("1+1.0M", id="upstream-invalid-plus"),
        pytest.param("0.1mi", id="upstream-invalid-mi"),
        pytest.param("0.1am", id="upstream-invalid-am"),
        pytest.param("aoeu", id="upstream-invalid-word"),
        pytest.param(".5i", id="upstream-invalid-i"),
        pytest.param("-3.01e-", id="upstream-invalid-dangling-sign"),
        pytest.param("1K", id="upper-case-kilo"),
        pytest.param("1e99999999999", id="exponent-out-of-range"),
    ],
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="quantity"):
        Quantity.parse(text)


@pytest.mark.parametrize(
    ("canonical", "alternate"),
    [
        pytest.param("1Gi", "1024Mi", id="gi"),
        pytest.param("300Mi", "307200Ki", id="mi"),
        pytest.param("1001Gi", "1025024Mi", id="odd-gi"),
        pytest.param("1Ti", "1024Gi", id="ti"),
        pytest.param("5", "5000m", id="five"),
        pytest.param("500m", "0.5", id="half"),
        pytest.param("1G", "1000M", id="giga-from-mega"),
        pytest.param("1G", "0.001T", id="giga-from-tera"),
        pytest.param("1m", "1000u", id="milli"),
        pytest.param("1080m", "1.08", id="fraction"),
        pytest.param("1080m", "1080000000n", id="nano"),
        pytest.param("1e9", ".001e12", id="exponent"),
        pytest.param("1e-3", "0.001e0", id="negative-exponent"),
        pytest.param("1e-9", "1000e-12", id="nano-exponent"),
        pytest.param("0", "00", id="zeros"),
        pytest.param("1Gi", "1048576Ki", id="kibi-to-gibi"),
        pytest.param("1024m", ".001Ki", id="upstream-parse-emit-milli-kibi"),
        pytest.param("1024n", ".000000001Ki", id="upstream-parse-emit-nano-kibi"),
    ],
)
def test_canonical_strings_like_upstream(canonical: str, alternate: str) -> None:
    """Upstream keeps a canonical input as its String(); other spellings print canonically."""
    assert str(Quantity.parse(canonical)) == canonical
    assert Quantity.parse(alternate).text is None
    assert str(Quantity.parse(alternate)) == canonical
    assert Quantity.parse(alternate) == Quantity.parse(canonical)
    if canonical != "0":
        assert str(Quantity.parse("-" + alternate)) == "-" + canonical


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        pytest.param("1E3", "1e3", id="upper-exponent"),
        pytest.param("+1", "1", id="plus"),
        pytest.param("5.", "5", id="trailing-dot"),
        pytest.param("007", "7", id="leading-zeros"),
        pytest.param("1.500", "1500m", id="trailing-zeros"),
    ],
)
def test_canonical_ignores_the_kept_spelling(text: str, canonical: str) -> None:
    assert Quantity.parse(text).canonical() == canonical


@pytest.mark.parametrize(
    ("smaller", "larger"),
    [
        pytest.param("40G", "40Gi", id="decimal-below-binary"),
        pytest.param("999m", "1", id="milli-below-one"),
        pytest.param("1e3", "1001", id="exponent-below-decimal"),
        pytest.param("-1Ki", "-1k", id="negatives"),
        pytest.param("15Gi", "16106127361", id="gi-below-bytes"),
    ],
)
def test_comparison_across_formats(smaller: str, larger: str) -> None:
    a, b = Quantity.parse(smaller), Quantity.parse(larger)
    assert a < b and b > a and a != b
    assert a.compare(b) == -1 and b.compare(a) == 1


def test_equality_and_hash_ignore_format() -> None:
    assert Quantity.parse("1Gi") == Quantity.parse("1073741824") == Quantity.parse("1.073741824G")
    assert len({Quantity.parse("1k"), Quantity.parse("1e3"), Quantity.parse("1000")}) == 1


def test_arithmetic_keeps_format_and_zero_takes_the_other() -> None:
    total = Quantity.parse("1Gi") + Quantity.parse("512Mi")
    assert str(total) == "1536Mi"
    assert str(Quantity.parse("80Gi") - Quantity.parse("80Gi")) == "0"
    assert (Quantity.parse("0") + Quantity.parse("1Ki")).format is BIN
    assert str(-Quantity.parse("1500m")) == "-1500m"


def test_integer_helpers() -> None:
    assert Quantity.parse("15Gi").as_int() == 15 * 2**30
    assert Quantity.parse("1Ki").is_integer() and not Quantity.parse("1.5").is_integer()
    with pytest.raises(ValueError, match="not an integer"):
        Quantity.parse("100m").as_int()
    assert Quantity.of(3) == Quantity.parse("3")
    assert Quantity.of(Fraction(1, 3)) == Quantity.parse("333333334n")  # rounded up to nano


quantity_texts = st.builds(
    lambda sign, whole, frac, suffix: f"{sign}{whole}{frac}{suffix}",
    st.sampled_from(["", "-", "+"]),
    st.integers(min_value=0, max_value=10**12).map(str),
    st.one_of(st.just(""), st.integers(min_value=0, max_value=10**9).map(lambda n: f".{n}")),
    st.sampled_from(
        ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
    )
    | st.integers(min_value=-30, max_value=30).map(lambda e: f"e{e}"),
)


@given(quantity_texts)
def test_printed_form_parses_back_to_the_same_value(text: str) -> None:
    quantity = Quantity.parse(text)
    assert Quantity.parse(str(quantity)) == quantity
    assert Quantity.parse(quantity.canonical()) == quantity
    again = Quantity.parse(quantity.canonical())
    assert again.canonical() == quantity.canonical()  # canonical is a fixed point
    assert (quantity.value * 10**9).denominator == 1  # always a whole number of nanos
