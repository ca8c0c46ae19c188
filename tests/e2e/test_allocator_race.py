"""The race: two allocator worker processes on one port, one Redis, 32 client threads.

Thousands of Allocate(reserve)+Release cycles on examples/cluster (16 H100, 4 A100 as DynamicMIG
partitions sharing counters, 4 L40S), with claims that compete for the same devices and the
same MIG memory slices. While it runs and at the end, an independent audit reads every live
reservation back from Redis and checks, from the ResourceSlices themselves (not from the
holds the allocator computed): no device is held twice, no counter is used past its total.
Every call must end in a reservation, ABORTED (a lost race) or an unsatisfiable answer.
It runs on a standalone Redis and on a 3-primary + 3-replica Redis Cluster (the audit then reads
every shard through the cluster client).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from fractions import Fraction

import grpc
import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from services.allocator.adapters.store.redis_store import RedisReservationStore
from services.allocator.app.inventory_feed import StaticFeed
from services.allocator.core import ClusterSnapshot, CounterID
from services.common.dra.model import DeviceID
from tests.e2e.allocator_harness import CLUSTER, pb_claims

pytestmark = pytest.mark.slow

THREADS = 32
CHANNELS = 16  # connections; the kernel spreads them over the workers
CYCLES = 3000
TIME_LIMIT = 25.0  # seconds of hammering at most
CLAIMS = ("one-h100", "mig-small-else-medium", "two-gpus-same-pcie-root", "all-l40s")
# A MIG claim that wants the 3g.20gb partitions: it overlaps the 1g ones on the same slices.
MIG_MEDIUM = 'device.attributes["gpu.nvidia.com"].profile == "3g.20gb"'


def _requests() -> list[pb.AllocateRequest]:
    requests = [pb.AllocateRequest(claims=pb_claims(name)) for name in CLAIMS]
    medium = pb.AllocateRequest(claims=pb_claims("one-h100"))
    exactly = medium.claims[0].requests[0].exactly
    exactly.device_class_name = "mig.nvidia.com"
    del exactly.selectors[:]
    exactly.selectors.add(cel=MIG_MEDIUM)
    requests.append(medium)
    for request in requests:
        request.reserve = True
        request.lease_ttl.seconds = 30
    return requests


def audit(store: RedisReservationStore, snapshot: ClusterSnapshot) -> int:
    """Check the live reservations against the slices; returns how many there are."""
    live = store.live()
    holders: dict[DeviceID, str] = {}
    used: dict[CounterID, Fraction] = {}
    for reservation in live:
        for allocation in reservation.allocations:
            for result in allocation.results:
                entry = snapshot.device(result.device_id)
                assert entry is not None, result.device_id
                if result.admin_access:
                    continue
                assert result.device_id not in holders, (
                    f"{result.device_id} held by {holders[result.device_id]} and {reservation.id}"
                )
                holders[result.device_id] = reservation.id
                for counter, amount in entry.counters:
                    used[counter] = used.get(counter, Fraction(0)) + amount
    for counter, amount in used.items():
        total = next(
            e.slice.counter_totals[counter]
            for e in snapshot.all_devices()
            if counter in e.slice.counter_totals
        )
        assert amount <= total, f"{counter}: {amount} used of {total}"
    return len(live)


class Hammer:
    def __init__(self, stubs, requests) -> None:
        self.stubs = stubs
        self.requests = requests
        self.outcomes: Counter[str] = Counter()
        self.unexpected: list[str] = []
        self.lock = threading.Lock()
        self.cycles = 0
        self.deadline = time.monotonic() + TIME_LIMIT

    def more(self) -> bool:
        with self.lock:
            if self.cycles >= CYCLES or time.monotonic() > self.deadline:
                return False
            self.cycles += 1
            return True

    def run(self, index: int) -> None:
        rng = random.Random(index)
        stub = self.stubs[index % len(self.stubs)]
        owner = (("x-gpualloc-owner", f"client-{index}"),)
        while self.more():
            request = rng.choice(self.requests)
            try:
                response = stub.Allocate(request, metadata=owner, timeout=10)
            except grpc.RpcError as error:
                kind = "aborted" if error.code() == grpc.StatusCode.ABORTED else error.code().name
                self.note(kind, error)
                continue
            if response.outcome != pb.OUTCOME_ALLOCATED:
                self.note("unsatisfiable")
                continue
            [reservation] = response.reservations
            self.note("reserved")
            time.sleep(rng.random() * 0.005)  # hold it a moment
            try:
                stub.Release(
                    pb.ReleaseRequest(reservation_id=reservation.id), metadata=owner, timeout=10
                )
            except grpc.RpcError as error:
                self.note(f"release-{error.code().name}", error)

    def note(self, kind: str, error: grpc.RpcError | None = None) -> None:
        with self.lock:
            self.outcomes[kind] += 1
            if kind not in ("reserved", "unsatisfiable", "aborted"):
                self.unexpected.append(f"{kind}: {error.details() if error else ''}")


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param("redis_url", id="redis", marks=pytest.mark.redis),
        pytest.param("redis_cluster_url", id="redis-cluster", marks=pytest.mark.redis),
    ],
)
def test_two_workers_never_give_a_device_or_counter_twice(allocator_processes, layout, request):
    redis_url = request.getfixturevalue(layout)
    allocator = allocator_processes(redis_url, workers=2)
    workers = allocator.children()
    assert len(workers) == 2
    # The kernel spreads new connections over the sockets listening then: a worker still
    # starting when the channels connect would get none (seen on a loaded machine).
    limit = time.monotonic() + 60
    while not all(_sockets(pid, allocator.port, LISTEN) for pid in workers):
        assert time.monotonic() < limit, "both workers listen on the port"
        time.sleep(0.1)
    stubs = [allocator.stub() for _ in range(CHANNELS)]
    hammer = Hammer(stubs, _requests())
    snapshot = ClusterSnapshot.build(
        [
            s
            for slices in StaticFeed.from_paths([str(CLUSTER)]).update().slices.values()
            for s in slices
        ]
    )
    threads = [threading.Thread(target=hammer.run, args=(i,)) for i in range(THREADS)]
    store = RedisReservationStore(redis_url)
    try:
        for thread in threads:
            thread.start()
        audits = 0
        while any(t.is_alive() for t in threads):
            audit(store, snapshot)  # mid-run: the invariants hold at every moment
            audits += 1
            time.sleep(0.2)
        for thread in threads:
            thread.join()
        assert audit(store, snapshot) == 0  # every reservation was released
    finally:
        store.close()
    assert not hammer.unexpected, hammer.unexpected[:5]
    assert hammer.outcomes["reserved"] >= 500, hammer.outcomes
    assert hammer.outcomes["aborted"] + hammer.outcomes["unsatisfiable"] > 0, hammer.outcomes
    assert sum(hammer.outcomes.values()) == hammer.cycles
    assert audits >= 3
    served = {pid: _sockets(pid, allocator.port, ESTABLISHED) for pid in workers}
    assert all(count > 0 for count in served.values()), served  # both workers had clients
    print(f"race: {hammer.cycles} cycles, {dict(hammer.outcomes)}, connections {served}")


ESTABLISHED, LISTEN = "01", "0A"  # /proc/net/tcp's socket states


def _sockets(pid: int, port: int, state: str) -> int:
    """TCP sockets on local `port` in `state` that process `pid` holds."""
    from pathlib import Path

    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == state and fields[9] in inodes:
                count += 1
    return count
