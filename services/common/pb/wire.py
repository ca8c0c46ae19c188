"""The protocol buffer wire format, written by hand: for replies built as bytes.

A reply with many small fields (an AllocateBatch of 64 reservations: ~60 fields each) costs
~20 us per item set field by field through upb from Python, and ~1 us to parse from bytes. So
the hot replies are written as bytes here and parsed once into their message
(`MergeFromString`): the same message, hence the same bytes on the wire as the message built
field by field (tests/unit/common/test_pb_wire.py and
tests/unit/allocator/test_allocate_response_bytes.py compare them).

What is written is what upb's encoder writes for a proto3 message: fields in field-number
order; a scalar or string field without presence only when it is not its default; a message
field whenever it is set (an empty one as its key and a zero length); repeated fields
unpacked for strings and messages. Map fields are not written here: a map's order on the wire
is its hash table's, so a message with one is built field by field.
"""

from __future__ import annotations

import functools
import struct

VARINT = 0
I64 = 1
LEN = 2

_SMALL = tuple(bytes((value,)) for value in range(0x80))  # a varint below 2**7
_CONTINUED = tuple(bytes((value | 0x80,)) for value in range(0x80))  # one byte of seven bits
# the low 14 bits of a longer varint, as its first two bytes (more follow): ~2x fewer steps
_PAIRS = tuple(_CONTINUED[value & 0x7F] + _CONTINUED[value >> 7] for value in range(0x4000))
SIZES_BELOW = 0x1000
SIZES = tuple(
    _SMALL[size] if size < 0x80 else _CONTINUED[size & 0x7F] + _SMALL[size >> 7]
    for size in range(SIZES_BELOW)
)
"""The varint of each length below SIZES_BELOW (4 KiB: an answer's messages), to look up:
`SIZES[n] if n < SIZES_BELOW else varint(n)` writes a length without a call."""
_DOUBLE = struct.Struct("<d")
_ZERO_DOUBLE = bytes(8)


def varint(value: int) -> bytes:
    """`value` as a base-128 varint; a negative one (int32, int64, an enum) as its 64-bit two's
    complement, ten bytes, as protobuf writes it."""
    if 0 <= value < 0x80:
        return _SMALL[value]
    if value < 0:
        value += 1 << 64
    out = b""
    while value >= 0x4000:
        out += _PAIRS[value & 0x3FFF]
        value >>= 14
    return out + (_SMALL[value] if value < 0x80 else _CONTINUED[value & 0x7F] + _SMALL[value >> 7])


def key(number: int, wire_type: int) -> bytes:
    """A field's key: its number and wire type (VARINT, I64, LEN)."""
    return varint(number << 3 | wire_type)


def string_field(field_key: bytes, text: str) -> bytes:
    """A proto3 string field (no presence): nothing when empty."""
    if not text:
        return b""
    data = text.encode()
    size = len(data)
    return field_key + (_SMALL[size] if size < 0x80 else varint(size)) + data


@functools.lru_cache(maxsize=65536)
def cached_string_field(field_key: bytes, text: str) -> bytes:
    """string_field for the values answers repeat (node, pool, device, claim names, owners)."""
    return string_field(field_key, text)


def length_prefixed(data: bytes) -> bytes:
    """`data` after its length: a message's or a string's body as its field carries it."""
    size = len(data)
    return (SIZES[size] if size < SIZES_BELOW else varint(size)) + data


def message_field(field_key: bytes, body: bytes) -> bytes:
    """A set message field whose serialized body is `body` (an empty body is still written)."""
    size = len(body)
    return field_key + (SIZES[size] if size < SIZES_BELOW else varint(size)) + body


def varint_field(field_key: bytes, value: int) -> bytes:
    """A proto3 integer, bool or enum field (no presence): nothing when 0."""
    return field_key + varint(value) if value else b""


def double_field(field_key: bytes, value: float) -> bytes:
    """A proto3 double field (no presence): nothing when its bits are all zero (-0.0 is
    written, as upb writes it)."""
    packed = _DOUBLE.pack(value)
    return b"" if packed == _ZERO_DOUBLE else field_key + packed


def counter_field(field_key: bytes, value: int) -> bytes:
    """varint_field for a value that counts up (a fencing token): its low 14 bits written
    each time, the varint of the bits above them kept (`_high_varint`: they change once per
    16,384 values)."""
    if value < 0x4000:
        return varint_field(field_key, value)
    return field_key + _PAIRS[value & 0x3FFF] + _high_varint(value >> 14)


@functools.lru_cache(maxsize=1024)
def _high_varint(value: int) -> bytes:
    """The varint of a counter's bits above its lowest 14 (> 0)."""
    return varint(value)
