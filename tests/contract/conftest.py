"""The reservation store under test, one per implementation, and builders for its requests.

`store_under_test` is parametrized over the embedded store (driven by a fake clock, so leases
expire instantly when the test says so) and the Redis store on each layout: a real standalone
redis-server, a Sentinel group and a 3+3 Redis Cluster (leases expire by the server's own TIME,
so the test sleeps just past a short lease).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest

from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.adapters.store.redis_store import RedisReservationStore
from services.allocator.reservations.model import Hold, LimitedUse, ReservationStore, ReserveRequest
from services.common.dra.model import AllocationResult, DeviceRequestAllocationResult

DRIVER = "gpu.nvidia.com"
SHORT_LEASE = 0.5  # seconds: many Redis round trips even on a busy machine
PAST_SHORT_LEASE = 0.6
LONG_LEASE = 60.0

# The Redis layouts every Redis-backed contract runs on, by the fixture giving the URL.
REDIS_URL_FIXTURES = {
    "redis": "redis_url",
    "redis-sentinel": "redis_sentinel_url",
    "redis-cluster": "redis_cluster_url",
}

Store = ReservationStore  # both stores must satisfy the port: mypy checks the fixture below


class FakeClock:
    def __init__(self, now: float = 1_750_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class StoreUnderTest:
    kind: str
    store: Store
    wait: Callable[[float], None]  # let this many seconds pass on the store's clock
    # another store on the same state and clock that remembers revocations this many seconds
    remembering: Callable[[float], Store]


# Every contract runs on the embedded implementation and on each Redis layout.
STORE_KINDS = [
    pytest.param("memory", id="memory"),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
    pytest.param("redis-sentinel", id="redis-sentinel", marks=pytest.mark.redis),
    pytest.param("redis-cluster", id="redis-cluster", marks=pytest.mark.redis),
]


@pytest.fixture(params=STORE_KINDS)
def store_under_test(request: pytest.FixtureRequest) -> Iterator[StoreUnderTest]:
    if request.param == "memory":
        clock = FakeClock()

        def embedded(seconds: float) -> Store:  # its own state: the embedded store is its state
            return MemoryReservationStore(clock=clock, preempted_memory_seconds=seconds)

        yield StoreUnderTest("memory", MemoryReservationStore(clock=clock), clock.advance, embedded)
        return
    url: str = request.getfixturevalue(REDIS_URL_FIXTURES[request.param])
    stores = [RedisReservationStore(url, socket_timeout=2.0)]

    def on_redis(seconds: float) -> Store:
        stores.append(
            RedisReservationStore(url, socket_timeout=2.0, preempted_memory_seconds=seconds)
        )
        return stores[-1]

    try:
        yield StoreUnderTest(request.param, stores[0], time.sleep, on_redis)
    finally:
        for store in stores:
            store.close()


@pytest.fixture
def store(store_under_test: StoreUnderTest) -> Store:
    return store_under_test.store


def device(name: str, pool: str = "node-1") -> str:
    """A device key `driver/pool/device` (pool named after its node, as the NVIDIA driver does)."""
    return f"{DRIVER}/{pool}/{name}"


def counter(name: str = "memory", pool: str = "node-1", counter_set: str = "gpu-0-counters") -> str:
    return f"counter:{DRIVER}/{pool}/{counter_set}/{name}"


def capacity(name: str = "memory", pool: str = "node-1", dev: str = "gpu-0") -> str:
    return f"capacity:{DRIVER}/{pool}/{dev}/{name}"


def mem(amount: int, limit: int = 7000, key: str = "") -> LimitedUse:
    """`amount` milli-units of a limited use (by default a MIG memory counter of 7000)."""
    return LimitedUse(key or counter(), amount, limit)


def allocation_for(devices: Sequence[str]) -> AllocationResult:
    results = []
    for index, key in enumerate(devices):
        driver, pool, name = key.split("/")
        results.append(DeviceRequestAllocationResult(f"gpu-{index}", driver, pool, name))
    return AllocationResult(tuple(results))


def reserve_request(
    *devices: str,
    uses: Sequence[LimitedUse] = (),
    owner: str = "alice",
    node: str = "node-1",
    lease: float = LONG_LEASE,
    key: str = "",
) -> ReserveRequest:
    return ReserveRequest(
        owner=owner,
        node=node,
        claim_names=("claim-a",),
        allocations=(allocation_for(devices),),
        hold=Hold(tuple(devices), tuple(uses)),
        lease_seconds=lease,
        idempotency_key=key,
    )
