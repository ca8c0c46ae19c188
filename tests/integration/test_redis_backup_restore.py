"""docs/operations.md, "Backup and restore", step by step against real redis-servers and a real
allocator over gRPC: `redis-cli --rdb` takes the backup, the server dies, a fresh server starts
from the file (AOF switched on after), the fencing counters are deleted, and a new allocator
serves the restored reservations; the inventory resumes the backup's generation.

What a restore does, as asserted here: reservations in the backup are served again (commit,
release); a lease that ran out while the store was down is freed by the first expiry; what was
granted after the backup is gone (NotFound, its devices free); without the counter reset the
node's next fencing token would repeat one issued after the backup, with it the next token is
above every one issued before; the inventory's generation goes back to the backup's.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
import redis

from protos.allocator.v1 import allocator_pb2 as pb
from services.allocator.config import AllocatorSettings
from services.inventory.adapters.store.redis_repository import RedisInventoryRepository
from tests.conftest import RedisServer, RedisServerFactory, redis_binary
from tests.contract.test_inventory_repository import assert_same_content, busy_service, t4_slice
from tests.e2e.allocator_harness import owner, pb_claims, serve_allocator
from tests.ports import free_port

pytestmark = pytest.mark.redis

NODE = "h100-node-1"
OWNER = owner("alice")
FENCE_PATTERN = "gpualloc:{*}:fence"  # the docs' SCAN pattern for the default prefix
SHORT_LEASE_S = 3.0  # outlives the backup, not the outage


def _reserve(stub, lease_seconds: float) -> pb.Reservation:
    request = pb.AllocateRequest(claims=pb_claims("one-h100"), node_name=NODE, reserve=True)
    request.lease_ttl.FromNanoseconds(int(lease_seconds * 1e9))
    response = stub.Allocate(request, metadata=OWNER, timeout=10)
    assert response.outcome == pb.OUTCOME_ALLOCATED
    (reservation,) = response.reservations
    made: pb.Reservation = reservation
    return made


def _listed(stub) -> dict[str, int]:
    response = stub.ListReservations(pb.ListReservationsRequest(), metadata=OWNER, timeout=10)
    return {r.id: r.state for r in response.reservations}


def _cli(server: RedisServer, *args: str) -> str:
    done = subprocess.run(
        ["redis-cli", "-h", server.host, "-p", str(server.port), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_backup_restored_into_a_fresh_server_is_served_by_a_new_allocator(
    redis_server_factory: RedisServerFactory, grpc_channel_factory, tmp_path: Path
) -> None:
    # `redis-cli --rdb` waits repl-diskless-sync-delay (5 s by default) for other replicas
    primary = redis_server_factory(appendonly=True, extra_args=("--repl-diskless-sync-delay", "0"))
    settings = AllocatorSettings(redis_url=primary.url, expire_interval=0.1)
    first = serve_allocator(grpc_channel_factory, settings=settings)
    committed = _reserve(first.stub, 600)
    first.stub.Commit(pb.CommitRequest(reservation_id=committed.id), metadata=OWNER, timeout=10)
    kept = _reserve(first.stub, 600)
    short = _reserve(first.stub, SHORT_LEASE_S)  # runs out while the store is down
    short_ends = time.monotonic() + SHORT_LEASE_S
    inventory = busy_service(RedisInventoryRepository(primary.url))
    backed_up = inventory.snapshot()

    # 1. the backup: an RDB snapshot streamed to a file (functions included)
    backup = tmp_path / "backup" / "gpualloc.rdb"
    backup.parent.mkdir()
    _cli(primary, "--rdb", str(backup))
    assert backup.stat().st_size > 0

    # after the backup: a grant and an inventory change the backup does not have
    after = _reserve(first.stub, 600)
    assert after.fencing_token > max(committed.fencing_token, kept.fencing_token)
    inventory.apply([replace(t4_slice(), name="after-backup")])
    assert inventory.generation == backed_up.generation + 1
    inventory.close()
    first.app.close()
    primary.stop(kill=True)  # the disaster
    time.sleep(max(0.0, short_ends - time.monotonic()) + 0.2)

    # 2. the restore: the file as dump.rdb in a fresh server's dir, started without AOF (else
    # an empty AOF would be loaded instead), then AOF switched on
    restored = RedisServer(redis_binary(), free_port(), tmp_path / "restored")
    restored.directory.mkdir()
    shutil.copy(backup, restored.directory / "dump.rdb")
    restored.start()
    try:
        _cli(restored, "CONFIG", "SET", "appendonly", "yes")
        with restored.client() as client:
            assert client.function_list()  # the library came with the backup
            assert client.exists(f"gpualloc:{{{NODE}}}:res:{short.id}")  # restored, run out
            # 3. the fencing counters: without the reset the next grant would repeat a token
            assert int(client.get(f"gpualloc:{{{NODE}}}:fence") or 0) + 1 == after.fencing_token
            keys = _cli(restored, "--scan", "--pattern", FENCE_PATTERN).split()
            assert keys == [f"gpualloc:{{{NODE}}}:fence"]
            _cli(restored, "DEL", *keys)
            deadline = time.monotonic() + 10
            while client.info("persistence")["aof_rewrite_in_progress"]:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert client.info("persistence")["aof_enabled"] == 1

        # 4. a new allocator on the restored server
        settings = AllocatorSettings(redis_url=restored.url, expire_interval=0.1)
        second = serve_allocator(grpc_channel_factory, settings=settings)
        try:
            deadline = time.monotonic() + 10
            while short.id in _listed(second.stub):  # expired meanwhile: freed by the janitor
                assert time.monotonic() < deadline, "the run-out lease was not freed"
                time.sleep(0.1)
            assert _listed(second.stub) == {
                committed.id: pb.RESERVATION_STATE_COMMITTED,
                kept.id: pb.RESERVATION_STATE_RESERVED,
            }
            stub = second.stub
            stub.Commit(pb.CommitRequest(reservation_id=kept.id), metadata=OWNER, timeout=10)
            stub.Release(pb.ReleaseRequest(reservation_id=committed.id), metadata=OWNER, timeout=10)
            with pytest.raises(grpc.RpcError) as lost:
                stub.Commit(pb.CommitRequest(reservation_id=after.id), metadata=OWNER, timeout=10)
            assert lost.value.code() == grpc.StatusCode.NOT_FOUND
            fresh = _reserve(stub, 600)
            assert fresh.fencing_token > after.fencing_token  # re-seeded from the clock
        finally:
            second.app.close()

        # 5. the inventory resumes the backup's generation (its later change is gone)
        repository = RedisInventoryRepository(restored.url)
        loaded = repository.load()
        repository.close()
        assert loaded is not None
        assert_same_content(loaded, backed_up)
    finally:
        restored.stop(kill=True)


def test_the_fence_pattern_matches_only_fencing_counters(redis_url: str) -> None:
    """The docs' SCAN pattern, on keys of every kind the store and the inventory write."""
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        for key in ("gpualloc:{n1}:fence", "gpualloc:{n1}:res:x", "gpualloc:{n1}:ids",
                    "gpualloc:nodes:{3}", "{gpualloc:inventory}:generation"):  # fmt: skip
            client.set(key, "1")
        assert sorted(client.scan_iter(match=FENCE_PATTERN)) == ["gpualloc:{n1}:fence"]
