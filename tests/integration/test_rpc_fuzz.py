"""A fuzzer that stays: every RPC of both services, fed raw bytes, mutated valid requests and
random well-formed messages, must answer with a status the API documents — never INTERNAL or
UNKNOWN (a bug), never after its deadline — and the server must stay healthy without growing.

`make fuzz` runs it with GPUALLOC_FUZZ_EXAMPLES=10000; the suite runs a fixed, small budget.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor as pb_descriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protos.allocator.v1 import allocator_pb2 as pb
from protos.inventory.v1 import inventory_pb2 as ipb
from services.bridges import local_cluster
from tests.integration.test_security import _allocate, _claim

EXAMPLES = int(os.environ.get("GPUALLOC_FUZZ_EXAMPLES", "300"))
DEADLINE = 2.0
pytestmark = pytest.mark.timeout(max(300, EXAMPLES // 10))

_SERVICES = (
    pb.DESCRIPTOR.services_by_name["Allocator"],
    ipb.DESCRIPTOR.services_by_name["Inventory"],
)
METHODS = [(service, method) for service in _SERVICES for method in service.methods]
FD = pb_descriptor.FieldDescriptor

SEEDS: dict[str, Message] = {
    "Allocate": _allocate(reserve=True, owner="fuzz"),
    "Explain": pb.ExplainRequest(claims=[_claim()]),
    "Capacity": pb.CapacityRequest(claims=[_claim()]),
    "GetReservation": pb.GetReservationRequest(reservation_id="res-0"),
    "ListReservations": pb.ListReservationsRequest(page_size=5),
    "GetInventory": ipb.GetInventoryRequest(node_name="l40s-node-1"),
}

# A well-formed request can still be refused: these are the statuses the API documents.
DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.OUT_OF_RANGE,
}

_INT_RANGES = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1),
    FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1),
    FD.TYPE_FIXED64: (0, 2**64 - 1),
}
_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["gpu.nvidia.com", "l40s-node-1", "h100-node-1", "1Gi", "-1", "device.x"]),
    st.builds(lambda n: "x" * n, st.integers(0, 20_000)),
)


def _scalar(field: pb_descriptor.FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type in _INT_RANGES:
        low, high = _INT_RANGES[field.type]
        return st.one_of(
            st.integers(low, high), st.sampled_from([0, 1, -1 if low < 0 else 2, high])
        )
    if field.type == FD.TYPE_BOOL:
        return st.booleans()
    if field.type in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    if field.type == FD.TYPE_ENUM:
        values = field.enum_type.values if field.enum_type is not None else []
        return st.sampled_from([v.number for v in values] + [999])
    if field.type == FD.TYPE_BYTES:
        return st.binary(max_size=64)
    return _TEXT


@st.composite
def messages(draw: st.DrawFn, descriptor: pb_descriptor.Descriptor, depth: int = 0) -> Message:
    """A random message of `descriptor`'s type: a random subset of its fields, any values."""
    from google.protobuf import message_factory

    message: Message = message_factory.GetMessageClass(descriptor)()
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue
        if field.message_type is not None:
            if depth >= 3:
                continue
            if field.message_type.GetOptions().map_entry:
                key, value = (
                    field.message_type.fields_by_name["key"],
                    field.message_type.fields_by_name["value"],
                )
                if value.message_type is not None:
                    continue
                target = getattr(message, field.name)
                target[draw(_scalar(key))] = draw(_scalar(value))
                continue
            count = draw(st.integers(1, 2)) if field.is_repeated else 1
            for _ in range(count):
                child = draw(messages(field.message_type, depth + 1))
                if field.is_repeated:
                    getattr(message, field.name).add().CopyFrom(child)
                else:
                    getattr(message, field.name).CopyFrom(child)
            continue
        value = draw(_scalar(field))
        try:
            if field.is_repeated:
                getattr(message, field.name).append(value)
            else:
                setattr(message, field.name, value)
        except (ValueError, TypeError):  # e.g. a float out of range for the field
            pass
    return message


@st.composite
def payloads(draw: st.DrawFn) -> tuple[str, bool, bytes]:
    """(method path, server-streaming, request bytes): raw bytes, a mutated seed, or a random
    well-formed message."""
    service, method = draw(st.sampled_from(METHODS))
    path = f"/{service.full_name}/{method.name}"
    kind = draw(st.sampled_from(["raw", "mutated", "message"]))
    if kind == "raw":
        data = draw(st.binary(max_size=256))
    elif kind == "mutated" and method.name in SEEDS:
        mutated = bytearray(SEEDS[method.name].SerializeToString())
        for _ in range(draw(st.integers(1, 8))):
            if not mutated:
                break
            position = draw(st.integers(0, len(mutated) - 1))
            mutated[position] = draw(st.integers(0, 255))
        data = bytes(mutated[: draw(st.integers(0, len(mutated)))])
    else:
        data = draw(messages(method.input_type)).SerializeToString()
    return path, method.server_streaming, data


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[local_cluster.LocalCluster, grpc.Channel]]:
    with local_cluster.start() as cluster, grpc.insecure_channel(cluster.target) as channel:
        yield cluster, channel


OUTCOMES: Counter[str] = Counter()


def _call(
    channel: grpc.Channel, path: str, streaming: bool, data: bytes
) -> tuple[grpc.StatusCode, str, float]:
    started = time.monotonic()
    try:
        if streaming:
            streamed: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(path)
            stream = streamed(data, timeout=DEADLINE)
            with contextlib.suppress(StopIteration):
                next(iter(stream))
            stream.cancel()
        else:
            unary: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(path)
            unary(data, timeout=DEADLINE)
        return grpc.StatusCode.OK, "", time.monotonic() - started
    except grpc.RpcError as error:
        return error.code(), str(error.details()), time.monotonic() - started


@settings(
    max_examples=EXAMPLES,
    deadline=None,  # each call has its own deadline, checked below
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(payload=payloads())
def _fuzz_one(channel: grpc.Channel, payload: tuple[str, bool, bytes]) -> None:
    path, streaming, data = payload
    code, details, elapsed = _call(channel, path, streaming, data)
    OUTCOMES[code.name] += 1
    if code is grpc.StatusCode.CANCELLED and streaming:
        return  # our own cancel after the first event
    assert code in DOCUMENTED, f"{path}: {code.name}: {details[:300]}"
    assert elapsed < DEADLINE + 0.5, f"{path}: answered after {elapsed:.2f}s"


def test_every_rpc_survives_fuzzed_requests(served):
    cluster, channel = served
    before = _rss_mib()
    _fuzz_one(channel)
    grown = _rss_mib() - before
    check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    assert OUTCOMES["INTERNAL"] == 0 and OUTCOMES["UNKNOWN"] == 0, dict(OUTCOMES)
    # the bound grows with the examples: most of the growth is Hypothesis' own (its choice
    # records and character tables, as tracemalloc shows), not the server's
    bound = 64 + EXAMPLES / 40
    assert grown < bound, f"RSS grew {grown:.0f} MiB over {sum(OUTCOMES.values())} requests"
    print(f"fuzz: {sum(OUTCOMES.values())} requests, {dict(OUTCOMES)}, RSS +{grown:.1f} MiB")
