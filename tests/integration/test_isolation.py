"""No kind of work takes every thread: health checks answer while streams are open and calls
wait for a future generation, and one identity cannot hold more than its share of calls.

The loads are the issue's (20 WatchInventory streams; 16 Allocates waiting for generation
1e15), at the server's default 16 workers; before, 7 of 9 health checks failed under each.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from protos.inventory.v1 import inventory_pb2 as ipb
from protos.inventory.v1 import inventory_pb2_grpc
from services.bridges import local_cluster
from services.common.admission import Admission, AdmissionLimits
from services.common.errors import ResourceExhausted
from tests.integration.test_security import _claim
from tests.security_fixtures import secured_fleet

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster() -> Iterator[local_cluster.LocalCluster]:
    with local_cluster.start() as started:
        yield started


def _health_checks(target: str, count: int, timeout: float = 2.0) -> Counter[str]:
    answered: Counter[str] = Counter()
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for _ in range(count):
            try:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
                answered["SERVING"] += 1
            except grpc.RpcError as error:
                answered[error.code().name] += 1
            time.sleep(0.05)
    return answered


def test_health_checks_answer_while_twenty_watch_streams_are_open(cluster):
    channels = [grpc.insecure_channel(cluster.target) for _ in range(20)]
    streams = [
        inventory_pb2_grpc.InventoryStub(c).WatchInventory(ipb.WatchInventoryRequest(), timeout=30)
        for c in channels
    ]
    try:
        for stream in streams:
            next(iter(stream))  # each stream is open and has sent its first event
        assert _health_checks(cluster.target, 10) == {"SERVING": 10}
        allocator = allocator_pb2_grpc.AllocatorStub(channels[0])
        answer = allocator.Allocate(pb.AllocateRequest(claims=[_claim()]), timeout=5)
        assert answer.outcome == pb.OUTCOME_ALLOCATED  # unary calls keep their threads
    finally:
        for stream in streams:
            stream.cancel()
        for channel in channels:
            channel.close()


def test_health_checks_answer_while_calls_wait_for_a_future_generation(cluster):
    outcomes: Counter[str] = Counter()

    def wait() -> None:
        with grpc.insecure_channel(cluster.target) as channel:
            request = pb.AllocateRequest(claims=[_claim()], min_inventory_generation=10**15)
            try:
                allocator_pb2_grpc.AllocatorStub(channel).Allocate(request, timeout=4)
                outcomes["OK"] += 1
            except grpc.RpcError as error:
                outcomes[error.code().name] += 1

    waiters = [threading.Thread(target=wait) for _ in range(16)]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.3)
    try:
        assert _health_checks(cluster.target, 10) == {"SERVING": 10}
    finally:
        for waiter in waiters:
            waiter.join()
    # 4 (a quarter of the workers) waited until the generation did not come; the rest were
    # told at once to retry; none took the threads health checks need
    assert outcomes == {"UNAVAILABLE": 16}


def test_one_identity_cannot_hold_more_than_its_calls(tmp_path: Path):
    with secured_fleet(tmp_path, max_calls_per_caller=2) as fleet:
        slow = pb.AllocateRequest(claims=[_claim()], min_inventory_generation=10**15)
        stub = allocator_pb2_grpc.AllocatorStub(fleet.channel("scheduler-a"))
        futures = [stub.Allocate.future(slow, timeout=3) for _ in range(2)]
        time.sleep(0.3)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Allocate(pb.AllocateRequest(claims=[_claim()]), timeout=5)
        assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "GPUALLOC_MAX_CALLS_PER_CALLER" in str(caught.value.details())
        status = rpc_status.from_call(caught.value)
        assert status is not None and any(
            d.type_url.endswith("google.rpc.RetryInfo") for d in status.details
        )
        other = allocator_pb2_grpc.AllocatorStub(fleet.channel("scheduler-b"))
        answer = other.Allocate(pb.AllocateRequest(claims=[_claim()]), timeout=5)
        assert answer.outcome == pb.OUTCOME_ALLOCATED  # another identity is not held up
        for future in futures:
            with pytest.raises(grpc.RpcError):
                future.result()
        answer = stub.Allocate(pb.AllocateRequest(claims=[_claim()]), timeout=5)
        assert answer.outcome == pb.OUTCOME_ALLOCATED  # its own calls done, it may call again


def test_one_tenant_cannot_hold_every_stream(tmp_path: Path):
    """GPUALLOC_MAX_STREAMS=4 under a policy: a tenant's identities hold at most 2 streams
    (WatchReservations here); a third is RESOURCE_EXHAUSTED while another tenant still opens
    one, and a stream closed frees its place."""
    with secured_fleet(tmp_path, max_streams=4) as fleet:
        request = pb.WatchReservationsRequest()
        a = allocator_pb2_grpc.AllocatorStub(fleet.channel("scheduler-a"))
        held = [a.WatchReservations(request, timeout=30) for _ in range(2)]
        try:
            for stream in held:
                assert next(stream).kind == pb.RESERVATION_CHANGE_KIND_HEARTBEAT  # registered
            third = a.WatchReservations(request, timeout=30)
            with pytest.raises(grpc.RpcError) as caught:
                next(third)
            assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "tenant team-a already has 2 streams open" in str(caught.value.details())
            b = allocator_pb2_grpc.AllocatorStub(fleet.channel("scheduler-b"))
            other = b.WatchReservations(request, timeout=30)
            assert next(other).kind == pb.RESERVATION_CHANGE_KIND_HEARTBEAT
            other.cancel()
            held.pop().cancel()
            deadline = time.monotonic() + 10
            while True:  # the cancelled stream's place is freed once its thread sees it
                again = a.WatchReservations(request, timeout=30)
                try:
                    assert next(again).kind == pb.RESERVATION_CHANGE_KIND_HEARTBEAT
                    held.append(again)
                    break
                except grpc.RpcError:
                    assert time.monotonic() < deadline, "the cancelled stream's place stayed"
                    time.sleep(0.2)
        finally:
            for stream in held:
                stream.cancel()


LIMITS = {
    "streams-over-the-cap": (AdmissionLimits(max_streams=1), "stream", "GPUALLOC_MAX_STREAMS"),
    "caller-over-its-share": (AdmissionLimits(per_caller=1), "caller", "PER_CALLER"),
    "tenant-over-its-share": (AdmissionLimits(per_tenant=1), "tenant", "PER_TENANT"),
    "tenant-over-its-streams": (
        AdmissionLimits(per_tenant_streams=1),
        "tenant-stream",
        "tenant team already has 1 streams open",
    ),
}


@pytest.mark.parametrize(("limits", "kind", "named"), LIMITS.values(), ids=LIMITS.keys())
def test_admission_refuses_the_call_past_each_limit_and_frees_it_after(limits, kind, named):
    admission = Admission(limits)

    def enter() -> object:
        if kind == "stream":
            return admission.stream("Watch")
        if kind == "tenant-stream":
            return admission.stream("Watch", "team")
        caller = "a" if kind == "caller" else f"a-{time.monotonic_ns()}"
        return admission.unary("Allocate", caller, "team")

    first = enter()
    with first:  # type: ignore[attr-defined]
        with pytest.raises(ResourceExhausted, match=named) as caught, enter():  # type: ignore[attr-defined]
            pass
        assert caught.value.retry_after_seconds > 0
    with enter():  # type: ignore[attr-defined]
        pass
    assert admission.in_flight() == (0, 0)


def test_probes_on_the_health_port_answer_while_cel_heavy_calls_fill_every_worker():
    """The issue's CEL load: 16 Allocates of near-limit selectors with a 3 s deadline. Every
    worker is busy, so a probe on the main port would queue; the health port (what the
    manifests' probes use) answers throughout, and the work stops with the deadlines."""
    from services.common.config import ServerSettings
    from tests.integration.test_request_budget import claim, expensive

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        health_port = sock.getsockname()[1]
    server = ServerSettings(health_listen_address=f"127.0.0.1:{health_port}")
    with local_cluster.start(server=server) as cluster:
        outcomes: Counter[str] = Counter()

        def heavy(index: int) -> None:
            selectors = [expensive(50, -(100 * index + i)) for i in range(4)]
            request = pb.AllocateRequest(claims=[claim(*selectors)], node_name="h100-node-1")
            with grpc.insecure_channel(cluster.target) as channel:
                try:
                    answer = allocator_pb2_grpc.AllocatorStub(channel).Allocate(request, timeout=3)
                    outcomes[pb.Outcome.Name(answer.outcome)] += 1
                except grpc.RpcError as error:
                    outcomes[error.code().name] += 1

        callers = [threading.Thread(target=heavy, args=(i,)) for i in range(16)]
        for caller in callers:
            caller.start()
        time.sleep(0.5)
        probes = _health_checks(f"127.0.0.1:{health_port}", 20, timeout=1.0)
        for caller in callers:
            caller.join()
        after = time.process_time()
        time.sleep(1.0)
        burned = time.process_time() - after
    assert probes == {"SERVING": 20}
    assert sum(outcomes.values()) == 16
    assert set(outcomes) <= {"OUTCOME_BUDGET_EXHAUSTED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"}
    assert burned < 0.5, f"the server burned {burned:.2f}s of CPU after its clients were answered"
