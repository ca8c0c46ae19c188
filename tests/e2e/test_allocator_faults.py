"""Faults with real processes: Redis crashing, Redis hanging, an allocator killed.

- Redis killed mid-run: reserving calls fail fast with UNAVAILABLE (never past their deadline);
  after a restart from its AOF the committed reservations are all there, the per-node keys are
  consistent (nothing half-written), and the allocator reserves again on its own.
- Redis hung (SIGSTOP): calls fail with UNAVAILABLE after GPUALLOC_REDIS_TIMEOUT.
- An allocator killed mid-lease: its uncommitted leases expire and another allocator hands the
  devices out again; committed reservations stay.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

import grpc
import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from tests.e2e.allocator_harness import allocate_request, owner

pytestmark = pytest.mark.slow

FAST = {"GPUALLOC_REDIS_TIMEOUT": "0.5", "GPUALLOC_EXPIRE_INTERVAL": "0.2"}


def _reserve(stub: Any, claim: str = "one-h100", lease: int = 30, **fields: Any) -> Any:
    request = allocate_request(claim, reserve=True, **fields)
    request.lease_ttl.seconds = lease
    return stub.Allocate(request, metadata=owner("job"), timeout=5)


def _timed_error(call, *args, **kwargs) -> tuple[grpc.StatusCode, float]:
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)
    return caught.value.code(), time.monotonic() - started


def _consistent(client, prefix: str = "gpualloc") -> int:
    """Every device/use key points at a live reservation hash that holds it, and back."""
    reservations = 0
    for key in client.scan_iter(f"{prefix}:{{*}}:res:*"):
        reservations += 1
        base, rid = key.rsplit("res:", 1)
        fields = client.hgetall(key)
        for device in json.loads(fields["devices"]):
            assert client.get(f"{base}dev:{device}") == rid, (key, device)
        for use_key, amount, _limit in json.loads(fields["uses"]):
            assert client.hget(f"{base}use:{use_key}", rid) == amount, (key, use_key)
    for key in client.scan_iter(f"{prefix}:{{*}}:dev:*"):
        base = key.split("dev:", 1)[0]
        assert client.exists(f"{base}res:{client.get(key)}"), key
    return reservations


class Background:
    """Threads that keep reserving and releasing, counting outcomes and the slowest error."""

    def __init__(self, stubs) -> None:
        self.stubs = stubs
        self.stop = threading.Event()
        self.codes: dict[str, int] = {}
        self.slowest_error = 0.0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(s,)) for s in stubs]

    def run(self, stub) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                response = _reserve(stub, lease=5)
                if response.reservations:
                    stub.Release(
                        pb.ReleaseRequest(reservation_id=response.reservations[0].id),
                        metadata=owner("job"),
                        timeout=5,
                    )
                self.count("OK")
            except grpc.RpcError as error:
                with self.lock:
                    self.slowest_error = max(self.slowest_error, time.monotonic() - started)
                self.count(error.code().name)
                time.sleep(0.05)

    def count(self, code: str) -> None:
        with self.lock:
            self.codes[code] = self.codes.get(code, 0) + 1

    def __enter__(self) -> Background:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def test_redis_crash_fails_fast_and_aof_restart_keeps_committed(
    redis_server_factory, allocator_processes
):
    redis = redis_server_factory(appendonly=True, extra_args=("--appendfsync", "always"))
    allocator = allocator_processes(redis.url, env=FAST)
    stub = allocator.stub()
    committed = []
    for _ in range(3):
        [reservation] = _reserve(stub, node_name="h100-node-1").reservations
        stub.Commit(
            pb.CommitRequest(reservation_id=reservation.id), metadata=owner("job"), timeout=5
        )
        committed.append(reservation.id)
    with Background([allocator.stub() for _ in range(4)]) as background:
        time.sleep(1.0)
        redis.stop(kill=True)  # a crash, mid-run
        time.sleep(0.3)
        for call, request in (
            (stub.Allocate, allocate_request("one-h100", reserve=True)),
            (stub.Commit, pb.CommitRequest(reservation_id=committed[0])),
            (stub.Release, pb.ReleaseRequest(reservation_id=committed[0])),
            (stub.GetReservation, pb.GetReservationRequest(reservation_id=committed[0])),
        ):
            code, seconds = _timed_error(call, request, metadata=owner("job"), timeout=5)
            assert code == grpc.StatusCode.UNAVAILABLE
            assert seconds < 2.0
        time.sleep(0.5)
        redis.start()  # replays the AOF
        deadline = time.monotonic() + 15
        while True:
            try:
                _reserve(stub, node_name="h100-node-2")
                break
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE
                assert time.monotonic() < deadline, "no recovery after the restart"
                time.sleep(0.2)
        time.sleep(0.5)
    assert set(background.codes) <= {"OK", "UNAVAILABLE", "ABORTED"}, background.codes
    assert background.codes.get("UNAVAILABLE", 0) > 0
    assert background.slowest_error < 3.0  # never hung until the 5 s deadline
    for rid in committed:
        got = stub.GetReservation(pb.GetReservationRequest(reservation_id=rid), timeout=5)
        assert got.reservation.state == pb.RESERVATION_STATE_COMMITTED
    with redis.client() as client:
        assert _consistent(client) >= len(committed)


def test_hung_redis_fails_calls_after_the_redis_timeout(redis_server_factory, allocator_processes):
    redis = redis_server_factory()
    allocator = allocator_processes(redis.url, env=FAST)
    stub = allocator.stub()
    [reservation] = _reserve(stub).reservations
    pid = redis._process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        code, seconds = _timed_error(
            stub.Commit,
            pb.CommitRequest(reservation_id=reservation.id),
            metadata=owner("job"),
            timeout=5,
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    assert code == grpc.StatusCode.UNAVAILABLE
    assert 0.4 < seconds < 3.0  # the 0.5 s socket timeout (twice at most: lookup + step)
    committed = stub.Commit(
        pb.CommitRequest(reservation_id=reservation.id), metadata=owner("job"), timeout=5
    )
    assert committed.reservation.state == pb.RESERVATION_STATE_COMMITTED


def test_a_killed_allocators_leases_expire_and_free_the_devices(redis_url, allocator_processes):
    first = allocator_processes(redis_url, env=FAST)
    second = allocator_processes(redis_url, env=FAST)
    stub = first.stub()
    leased = _reserve(stub, "all-l40s", lease=2, node_name="l40s-node-1").reservations[0]
    kept = _reserve(stub, node_name="h100-node-1").reservations[0]
    stub.Commit(pb.CommitRequest(reservation_id=kept.id), metadata=owner("job"), timeout=5)
    first.kill()
    other = second.stub()
    blocked = other.Allocate(allocate_request("all-l40s", node_name="l40s-node-1"), timeout=5)
    assert blocked.outcome == pb.OUTCOME_UNSATISFIABLE
    assert [h.reservation_id for h in blocked.holders] == [leased.id]
    started = time.monotonic()
    while True:
        response = _reserve(other, "all-l40s", node_name="l40s-node-1")
        if response.outcome == pb.OUTCOME_ALLOCATED:
            break
        assert time.monotonic() - started < 10, "the dead allocator's lease never expired"
        time.sleep(0.1)
    assert response.reservations[0].id != leased.id
    got = other.GetReservation(pb.GetReservationRequest(reservation_id=kept.id), timeout=5)
    assert got.reservation.state == pb.RESERVATION_STATE_COMMITTED
