"""The `gpualloc.*.v1` packages only grow: every message field (number, type, cardinality, JSON
name), enum value and RPC of the recorded contract (tests/data/protos/v1-wire.json) is still
there, unchanged. New fields, values, messages and RPCs are fine; removing, renumbering,
retyping or renaming one fails here, since old clients and servers (docs/upgrade.md) read the
wire by number and grpcurl-style JSON by name.

After an intended addition, record it: `python -m tests.unit.protos.test_wire_compatibility`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from google.protobuf import descriptor

from tests.unit.protos.test_contracts import ROOT, generated_modules

CONTRACT = ROOT / "tests" / "data" / "protos" / "v1-wire.json"


def _messages(file: descriptor.FileDescriptor) -> list[descriptor.Descriptor]:
    found: list[descriptor.Descriptor] = []
    pending = list(file.message_types_by_name.values())
    while pending:
        message = pending.pop()
        if not message.GetOptions().map_entry:
            found.append(message)
        pending.extend(message.nested_types)
    return found


def _enums(file: descriptor.FileDescriptor) -> list[descriptor.EnumDescriptor]:
    found = list(file.enum_types_by_name.values())
    for message in _messages(file):
        found.extend(message.enum_types)
    return found


def _field(field: descriptor.FieldDescriptor) -> list[Any]:
    kind = field.message_type or field.enum_type
    repeated = field.is_repeated
    return [field.number, field.type, repeated, kind.full_name if kind else "", field.json_name]


def current_contract() -> dict[str, dict[str, Any]]:
    contract: dict[str, dict[str, Any]] = {"messages": {}, "enums": {}, "services": {}}
    for module in generated_modules():
        file: descriptor.FileDescriptor = module.DESCRIPTOR
        for message in _messages(file):
            contract["messages"][message.full_name] = {f.name: _field(f) for f in message.fields}
        for enum in _enums(file):
            contract["enums"][enum.full_name] = {v.name: v.number for v in enum.values}
        for service in file.services_by_name.values():
            contract["services"][service.full_name] = {
                m.name: [m.input_type.full_name, m.output_type.full_name] for m in service.methods
            }
    return contract


def test_every_recorded_field_value_and_rpc_is_still_there_unchanged() -> None:
    recorded = json.loads(CONTRACT.read_text())
    current = current_contract()
    broken = [
        f"{section} {scope}.{name}: recorded {before}, now {now.get(name)}"
        for section, scopes in recorded.items()
        for scope, entries in scopes.items()
        for now in [current[section].get(scope, {})]
        for name, before in entries.items()
        if now.get(name) != before
    ]
    assert not broken, "\n".join(broken)


def test_the_contract_covers_the_served_packages() -> None:
    recorded = json.loads(CONTRACT.read_text())
    assert set(recorded["services"]) == {
        "gpualloc.allocator.v1.Allocator",
        "gpualloc.inventory.v1.Inventory",
    }
    assert len(recorded["messages"]) > 50


def test_a_reader_skips_fields_it_does_not_know_and_keeps_the_rest() -> None:
    """What an older server or client does with a field added after it was built."""
    from protos.allocator.v1 import allocator_pb2

    known = allocator_pb2.ReleaseRequest(reservation_id="res-1@node-1", fencing_token=7)
    newer = known.SerializeToString() + _unknown_string_field(999, b"from a newer version")

    read = allocator_pb2.ReleaseRequest.FromString(newer)

    assert (read.reservation_id, read.fencing_token) == ("res-1@node-1", 7)


def _unknown_string_field(number: int, value: bytes) -> bytes:
    """A length-delimited field `number` on the wire (tag varint, length, bytes)."""
    tag = (number << 3) | 2
    varint = bytearray()
    while True:
        byte, tag = tag & 0x7F, tag >> 7
        varint.append(byte | (0x80 if tag else 0))
        if not tag:
            break
    return bytes(varint) + bytes([len(value)]) + value


if __name__ == "__main__":
    CONTRACT.parent.mkdir(parents=True, exist_ok=True)
    CONTRACT.write_text(json.dumps(current_contract(), indent=1, sort_keys=True) + "\n")
    sys.stdout.write(f"wrote {CONTRACT.relative_to(ROOT)}\n")
