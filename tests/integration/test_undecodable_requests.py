"""Requests that are not protobuf: INVALID_ARGUMENT, and no slot or memory left behind.

grpcio (1.85) leaks a stream slot and ~20 KiB for every request its deserializer rejects:
after ~100 on one connection the connection refuses new streams (REFUSED_STREAM), and tens of
thousands take the process past its memory limit. The servers decode requests inside the call
instead (services/common/grpc_errors.py: ErrorMappingInterceptor), which this checks with a few
thousand undecodable requests on one connection.
"""

from __future__ import annotations

import resource
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from services.bridges import local_cluster

pytestmark = pytest.mark.timeout(180)

GARBAGE = b"\xff\xff\xff\xff\x0f"  # a truncated varint field: protobuf's DecodeError
COUNT = 3000


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@pytest.fixture(scope="module")
def cluster() -> Iterator[local_cluster.LocalCluster]:
    with local_cluster.start() as started:
        yield started


METHODS = {
    "get-reservation": "/gpualloc.allocator.v1.Allocator/GetReservation",
    "allocate": "/gpualloc.allocator.v1.Allocator/Allocate",
    "get-inventory": "/gpualloc.inventory.v1.Inventory/GetInventory",
    "watch-inventory": "/gpualloc.inventory.v1.Inventory/WatchInventory",
    "health-check": "/grpc.health.v1.Health/Check",
}


@pytest.mark.parametrize("method", METHODS.values(), ids=METHODS.keys())
def test_an_undecodable_request_is_invalid_argument(cluster, method):
    with grpc.insecure_channel(cluster.target) as channel:
        if method.endswith("WatchInventory"):
            stream: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(method)
            with pytest.raises(grpc.RpcError) as caught:
                next(iter(stream(GARBAGE, timeout=5)))
        else:
            unary: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(method)
            with pytest.raises(grpc.RpcError) as caught:
                unary(GARBAGE, timeout=5)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid protobuf message" in str(caught.value.details())


def test_thousands_of_undecodable_requests_leave_the_connection_and_memory_as_they_were(cluster):
    with grpc.insecure_channel(cluster.target) as channel:
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            METHODS["get-reservation"]
        )
        for _ in range(200):  # warm: allocator caches, grpc's pools
            with pytest.raises(grpc.RpcError):
                call(GARBAGE, timeout=5)
        before = _rss_kib()
        codes: Counter[str] = Counter()
        for _ in range(COUNT):
            try:
                call(GARBAGE, timeout=5)
            except grpc.RpcError as error:
                codes[error.code().name] += 1
        grown_mib = (_rss_kib() - before) / 1024
        assert codes == {"INVALID_ARGUMENT": COUNT}  # none refused (UNAVAILABLE) after ~100
        answer = allocator_pb2_grpc.AllocatorStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            answer.GetReservation(pb.GetReservationRequest(reservation_id="res-x"), timeout=5)
        assert caught.value.code() is grpc.StatusCode.NOT_FOUND  # the same connection still works
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert grown_mib < 20, f"RSS grew {grown_mib:.1f} MiB over {COUNT} undecodable requests"
