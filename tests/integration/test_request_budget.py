"""A request's CEL work is bounded as a whole, and stops with its deadline or its client.

Upstream bounds each CEL expression (1,000,000 cost units); a service evaluating for many
callers must bound the request: before, one Allocate with 4 near-limit selectors ran 31.9 s and
answered after the server's own 30 s limit, and the server kept burning CPU for ~50 s after its
clients gave up. The expensive selectors here are nested comprehensions whose cost is known
(~7 units an iteration; ~900,000 units take about a second here).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import grpc
import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from protos.common.v1 import dra_pb2
from services.allocator.config import AllocatorSettings
from services.bridges import local_cluster

pytestmark = pytest.mark.timeout(120)


def expensive(size: int, constant: int = 0) -> str:
    """A selector true for every device, costing ~6.3 x size^3 units per evaluation."""
    items = ", ".join(str(i) for i in range(size))
    # the innermost term reads the device, so nothing is folded at compile time
    return (
        f"[{items}].all(x, [{items}].all(y, [{items}].all(z, "
        f"x + y + z >= {constant} && device.driver == 'gpu.nvidia.com')))"
    )


def claim(*expressions: str) -> dra_pb2.ResourceClaim:
    exactly = dra_pb2.ExactDeviceRequest(
        device_class_name="gpu.nvidia.com",
        count=1,
        selectors=[dra_pb2.DeviceSelector(cel=e) for e in expressions],
    )
    return dra_pb2.ResourceClaim(
        name="costly",
        namespace="default",
        requests=[dra_pb2.DeviceRequest(name="gpu", exactly=exactly)],
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[local_cluster.LocalCluster]:
    settings = replace(AllocatorSettings(expire_interval=0.2), max_cel_cost=200_000)
    with local_cluster.start(settings=settings) as started:
        yield started


def _stub(cluster: local_cluster.LocalCluster) -> allocator_pb2_grpc.AllocatorStub:
    return allocator_pb2_grpc.AllocatorStub(grpc.insecure_channel(cluster.target))


def test_a_request_past_its_cel_budget_is_resource_exhausted_with_the_figure(cluster):
    request = pb.AllocateRequest(
        claims=[claim(expensive(24, 0), expensive(24, -1), expensive(24, -2))],
        node_name="l40s-node-1",
    )
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as caught:
        _stub(cluster).Allocate(request, timeout=30)
    elapsed = time.monotonic() - started
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    details = str(caught.value.details())
    assert "200,000 cost units" in details and "GPUALLOC_MAX_CEL_COST" in details
    assert elapsed < 10


def test_a_cheap_request_is_not_touched_by_the_budget(cluster):
    request = pb.AllocateRequest(claims=[claim(expensive(8))], node_name="l40s-node-1")
    answer = _stub(cluster).Allocate(request, timeout=30)
    assert answer.outcome == pb.OUTCOME_ALLOCATED


def _cpu_after(seconds: float) -> float:
    """CPU this process (client and in-process server) burns over the next `seconds`."""
    before = time.process_time()
    time.sleep(seconds)
    return time.process_time() - before


@pytest.fixture(scope="module")
def unbudgeted() -> Iterator[local_cluster.LocalCluster]:
    settings = replace(AllocatorSettings(expire_interval=0.2), max_cel_cost=50_000_000)
    with local_cluster.start(settings=settings) as started:
        yield started


def _four_costly(seed: int) -> list[dra_pb2.ResourceClaim]:
    """Four distinct selectors of ~900,000 units each: seconds of evaluation."""
    return [claim(*(expensive(50, -(seed + i)) for i in range(4)))]


def test_a_long_evaluation_stops_with_the_calls_deadline(unbudgeted):
    request = pb.AllocateRequest(claims=_four_costly(10), node_name="h100-node-2")
    started = time.monotonic()
    try:
        answer = _stub(unbudgeted).Allocate(request, timeout=0.5)
    except grpc.RpcError as error:  # the deadline passed before the search began
        assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    else:  # the search stopped just before the deadline and said so
        assert answer.outcome == pb.OUTCOME_BUDGET_EXHAUSTED
        assert time.monotonic() - started < 0.5
    assert _cpu_after(1.0) < 0.35, "the server kept evaluating after the deadline"


def test_a_long_evaluation_stops_when_its_client_goes_away(unbudgeted):
    request = pb.AllocateRequest(claims=_four_costly(20), node_name="h100-node-1")
    future = _stub(unbudgeted).Allocate.future(request, timeout=60)
    time.sleep(0.4)
    future.cancel()
    assert _cpu_after(1.0) < 0.35, "the server kept evaluating after the client cancelled"


def test_compiling_many_long_selectors_stops_with_the_deadline(unbudgeted):
    """Eight calls of thirty-two distinct long selectors take seconds to compile alone (~20 ms
    each): compiling stops with each call's time as evaluating does."""

    def call(index: int) -> None:
        selectors = [expensive(50, -(1000 * index + i)) for i in range(32)]
        request = pb.AllocateRequest(claims=[claim(*selectors)], node_name="h100-node-2")
        try:
            answer = _stub(unbudgeted).Allocate(request, timeout=1.0)
            assert answer.outcome == pb.OUTCOME_BUDGET_EXHAUSTED
        except grpc.RpcError as error:
            assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED

    callers = [threading.Thread(target=call, args=(i + 1,)) for i in range(8)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert _cpu_after(1.5) < 0.35, "the server kept compiling after the deadlines"
