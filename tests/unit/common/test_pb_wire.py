"""services.common.pb.wire writes what upb writes: varints (negative ones as ten bytes),
proto3 scalars left out at their default (a double by its bits: -0.0 is written), strings as
UTF-8 after their length (two length bytes from 128 bytes on), set messages even empty."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protos.allocator.v1 import allocator_pb2 as pb
from services.common.pb.wire import (
    I64,
    LEN,
    VARINT,
    counter_field,
    double_field,
    key,
    message_field,
    string_field,
    varint,
    varint_field,
)


@given(st.integers(-(2**63), 2**63 - 1))
def test_an_int64_is_what_upb_writes(value: int) -> None:
    expected = pb.AllocateResponse(inventory_generation=value).SerializeToString()
    assert varint_field(key(8, VARINT), value) == expected


@pytest.mark.parametrize(
    "value",
    [0, 1, 127, 128, 16383, 16384, 2**21 - 1, 2**21, 2**35, 2**63 - 1, 2**64 - 1],
    ids=lambda v: f"uint64-{v}",
)
def test_a_uint64_at_each_length_is_what_upb_writes(value: int) -> None:
    expected = pb.Reservation(fencing_token=value).SerializeToString()
    assert varint_field(key(7, VARINT), value) == expected
    assert varint(value) == expected[1:] or value == 0


@given(
    st.one_of(
        st.integers(0, 2**64 - 1),
        st.integers(0, 2**20).map(lambda low: 1_796_594_544_742 + low),  # a run of tokens
        st.sampled_from([0, 1, 0x3FFF, 0x4000, 0x4001, 2**21, 2**64 - 1]),
    )
)
def test_a_counter_is_the_uint64_upb_writes(value: int) -> None:
    expected = pb.Reservation(fencing_token=value).SerializeToString()
    assert counter_field(key(7, VARINT), value) == expected
    assert counter_field(key(7, VARINT), value) == varint_field(key(7, VARINT), value)


@pytest.mark.parametrize(
    "value", [0.0, -0.0, 0.125, 1.0, -1.5, math.inf, 5e-324], ids=lambda v: f"double-{v!r}"
)
def test_a_double_is_written_unless_its_bits_are_zero(value: float) -> None:
    expected = pb.AllocateResponse(score=value).SerializeToString()
    assert double_field(key(5, I64), value) == expected


@given(st.text(max_size=300))
def test_a_string_is_what_upb_writes(text: str) -> None:
    try:
        expected = pb.AllocateResponse(node_name=text).SerializeToString()
    except (ValueError, UnicodeEncodeError):  # a lone surrogate: no message can hold it
        with pytest.raises(UnicodeEncodeError):
            string_field(key(2, LEN), text)
        return
    assert string_field(key(2, LEN), text) == expected


@pytest.mark.parametrize("reason", ["", "r", "r" * 200], ids=["empty", "short", "long"])
def test_a_set_message_is_written_even_empty(reason: str) -> None:
    victims = [pb.PreemptionVictim(reason=reason)] if reason else []
    preemption = pb.Preemption(victims=victims)
    expected = pb.AllocateResponse(preemption=preemption).SerializeToString()
    assert message_field(key(11, LEN), preemption.SerializeToString()) == expected
