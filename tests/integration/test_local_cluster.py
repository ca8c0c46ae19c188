"""`make run-cluster`'s parts: deploy/local/redis-cluster.sh starts a real 3+3 Redis Cluster on
loopback and `gpualloc serve --demo` runs on it (reserve, commit, release through gRPC)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loadtest.bench_store import free_cluster_base
from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from services.common.redis_layout import connect, parse_layout
from tests.e2e.allocator_harness import pb_claims
from tests.ports import free_port

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "local" / "redis-cluster.sh"


@pytest.fixture
def local_cluster(tmp_path: Path) -> Iterator[str]:
    env = {**os.environ, "GPUALLOC_CLUSTER_PORT": str(free_cluster_base())}
    directory = str(tmp_path / "cluster")
    try:
        done = subprocess.run(
            [str(SCRIPT), "start", directory], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr
        yield done.stdout.strip()
    finally:
        subprocess.run([str(SCRIPT), "stop", directory], env=env, timeout=30, check=False)


def test_the_script_starts_a_cluster_and_gpualloc_serves_on_it(
    local_cluster: str, tmp_path: Path
) -> None:
    layout = parse_layout(local_cluster)
    assert layout.kind == "cluster" and len(layout.nodes) == 6
    client = connect(local_cluster, socket_timeout=1.0)
    assert len(client.get_primaries()) == 3  # type: ignore[union-attr]
    client.close()

    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "serve", "--demo", "--listen", f"127.0.0.1:{port}",
         "--redis-url", local_cluster],
        cwd=ROOT, env={**os.environ, "GPUALLOC_LOG_FORMAT": "text"}, stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        _wait_serving(channel, process, tmp_path / "serve.log")
        stub = allocator_pb2_grpc.AllocatorStub(channel)
        request = pb.AllocateRequest(claims=pb_claims("one-h100"), reserve=True)
        response = stub.Allocate(request, timeout=10)
        assert response.outcome == pb.OUTCOME_ALLOCATED
        [reservation] = response.reservations
        stub.Commit(pb.CommitRequest(reservation_id=reservation.id), timeout=10)
        listed = stub.ListReservations(pb.ListReservationsRequest(), timeout=10)
        assert [r.id for r in listed.reservations] == [reservation.id]
        stub.Release(pb.ReleaseRequest(reservation_id=reservation.id), timeout=10)
    finally:
        channel.close()
        process.terminate()
        process.wait(20)
        log.close()


def _wait_serving(channel: grpc.Channel, process: subprocess.Popen[bytes], log: Path) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + 30
    while True:
        try:
            reply = health.Check(
                health_pb2.HealthCheckRequest(service="gpualloc.allocator.v1.Allocator"), timeout=1
            )
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"gpualloc serve on the cluster did not serve:\n{log.read_text()}")
        time.sleep(0.2)
