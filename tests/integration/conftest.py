"""Fixtures shared by the allocator's integration tests: the reservation store, both kinds, and
an allocator served on port 0 in front of it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.adapters.store.redis_store import RedisReservationStore
from services.allocator.reservations.model import ReservationStore
from tests.e2e.allocator_harness import serve_allocator


@pytest.fixture(
    params=[
        pytest.param("memory", id="embedded"),
        pytest.param("redis", id="redis", marks=pytest.mark.redis),
    ]
)
def store(request: pytest.FixtureRequest) -> Iterator[ReservationStore]:
    """The embedded store, then a Redis store on a real redis-server."""
    yield from store_of(request, request.param)


def store_of(request: pytest.FixtureRequest, kind: str) -> Iterator[ReservationStore]:
    """`memory`: the embedded store; `redis` or another fixture giving a Redis URL
    (`redis_cluster_url`, ...): a Redis store there, closed after the test."""
    if kind == "memory":
        yield MemoryReservationStore()
        return
    made = RedisReservationStore(request.getfixturevalue("redis_url" if kind == "redis" else kind))
    yield made
    made.close()


@pytest.fixture
def allocator(grpc_channel_factory: Any, store: ReservationStore) -> Iterator[Any]:
    """An allocator server on the example cluster, in front of `store`."""
    served = serve_allocator(grpc_channel_factory, store)
    yield served
    served.app.close()
