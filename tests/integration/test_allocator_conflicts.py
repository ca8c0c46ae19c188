"""Allocate(reserve) when this allocator's view of the reservations is stale.

`SilentStore` loses every change event (as Redis pub/sub may), so a reservation another
replica makes is unknown here until the store refuses ours: then the allocator refreshes that
node's reservations and solves again, up to GPUALLOC_RESERVE_RETRIES times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from protos.allocator.v1 import allocator_pb2 as pb
from services.allocator.app.telemetry import configure_telemetry
from services.allocator.config import AllocatorSettings
from services.allocator.core import AllocatedState
from services.allocator.reservations.holds import placement_holds
from services.allocator.reservations.model import ReserveRequest, reserve_placement
from services.common.errors import Conflict
from services.common.grpc_errors import error_from_rpc
from services.common.pb.dra_mapping import from_pb_allocation_result
from tests.e2e.allocator_harness import SilentStore, allocate_request, owner, serve_allocator

NODE = "h100-node-1"


def _stale_allocator(grpc_channel_factory, store, retries: int, reader=None):
    settings = AllocatorSettings(
        reserve_retries=retries, expire_interval=60.0, resync_interval=3600.0
    )
    telemetry = configure_telemetry({}, metric_readers=[reader] if reader else [])
    silent: Any = SilentStore(store)  # the port's shape, by delegation
    return serve_allocator(grpc_channel_factory, silent, settings=settings, telemetry=telemetry)


def _taken_behind_its_back(served, store) -> str:
    """Reserve, directly in the store, the device this allocator would pick next."""
    answer = served.stub.Allocate(allocate_request("one-h100", node_name=NODE), timeout=10)
    allocation = from_pb_allocation_result(answer.allocations[0].allocation)
    snapshot = served.app.view.current().snapshot
    [hold] = placement_holds(snapshot, NODE, [allocation]).values()
    reserve_placement(
        store,
        [ReserveRequest("other-replica", NODE, ("default/other",), (allocation,), hold, 60.0)],
    )[0]
    return hold.devices[0]


def _counter(reader: InMemoryMetricReader, name: str) -> int:
    data = reader.get_metrics_data()
    total = 0
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    total += sum(getattr(point, "value", 0) for point in metric.data.data_points)
    return total


def test_a_conflict_refreshes_the_node_and_solves_again(grpc_channel_factory, store):
    reader = InMemoryMetricReader()
    served = _stale_allocator(grpc_channel_factory, store, retries=3, reader=reader)
    try:
        taken = _taken_behind_its_back(served, store)
        response = served.stub.Allocate(
            allocate_request("one-h100", node_name=NODE, reserve=True),
            metadata=owner("me"),
            timeout=10,
        )
        assert response.outcome == pb.OUTCOME_ALLOCATED
        [result] = response.allocations[0].allocation.results
        assert f"{result.driver}/{result.pool}/{result.device}" != taken
        assert _counter(reader, "gpualloc.reservation.conflicts") == 1
        assert _counter(reader, "gpualloc.reservation.aborted") == 0
    finally:
        served.app.close()


def test_without_retries_the_conflict_is_aborted_with_the_devices(grpc_channel_factory, store):
    served = _stale_allocator(grpc_channel_factory, store, retries=0)
    try:
        taken = _taken_behind_its_back(served, store)
        with pytest.raises(grpc.RpcError) as caught:
            served.stub.Allocate(
                allocate_request("one-h100", node_name=NODE, reserve=True),
                metadata=owner("me"),
                timeout=10,
            )
        assert caught.value.code() == grpc.StatusCode.ABORTED
        error = error_from_rpc(caught.value)
        assert isinstance(error, Conflict) and error.conflicts == (f"device:{taken}",)
        # The refresh after the conflict taught this allocator: the next call succeeds.
        again = served.stub.Allocate(
            allocate_request("one-h100", node_name=NODE, reserve=True),
            metadata=owner("me"),
            timeout=10,
        )
        assert again.outcome == pb.OUTCOME_ALLOCATED
    finally:
        served.app.close()


def _reserve_one(served: Any) -> pb.AllocateResponse:
    response: pb.AllocateResponse = served.stub.Allocate(
        allocate_request("one-h100", node_name=NODE, reserve=True),
        metadata=owner("me"),
        timeout=10,
    )
    return response


def _drift(served: Any) -> None:
    """Make the state solved against drift from the copy of the reservations (which still
    matches the store): the cached state, current in version, holds nothing."""
    holdings = served.app.holdings
    holdings.state_for(served.app.view.current())  # every reservation so far is in the state
    cached = holdings._cached
    assert cached is not None
    empty = AllocatedState(cached.view.snapshot)
    holdings._cached = dataclasses.replace(cached, state=empty, version=holdings.version)


def test_a_conflict_the_refresh_does_not_explain_rebuilds_the_state(grpc_channel_factory, store):
    """The copy holds what the store holds, but the state solved against drifted (simulated by
    emptying the cached state): after the node's refresh the held device still shows free, so
    the state is rebuilt and the solve after the conflict avoids the device."""
    reader = InMemoryMetricReader()
    served = _stale_allocator(grpc_channel_factory, store, retries=2, reader=reader)
    try:
        [held] = _reserve_one(served).allocations[0].allocation.results
        _drift(served)
        second = _reserve_one(served)
        assert second.outcome == pb.OUTCOME_ALLOCATED
        [result] = second.allocations[0].allocation.results
        assert result.device != held.device
        assert _counter(reader, "gpualloc.reservation.conflicts") == 1
    finally:
        served.app.close()


def test_drift_is_healed_even_when_the_refresh_also_finds_another_change(
    grpc_channel_factory, store
):
    """The state drifted and the node's refresh finds an unrelated reservation too: the
    conflicting device must still show in use afterwards, else the state is rebuilt."""
    reader = InMemoryMetricReader()
    served = _stale_allocator(grpc_channel_factory, store, retries=1, reader=reader)
    try:
        _reserve_one(served)
        _taken_behind_its_back(served, store)  # the unrelated change the refresh will find
        _drift(served)
        again = _reserve_one(served)
        assert again.outcome == pb.OUTCOME_ALLOCATED
        assert _counter(reader, "gpualloc.reservation.conflicts") == 1
    finally:
        served.app.close()


class _LearnsTheWinnerFirst(SilentStore):
    """The first reserve loses to another replica, and this process learns the winner (its
    event, or another caller's refresh) before its own refresh after the conflict."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.holdings: Any = None

    def reserve(self, placements: Sequence[Sequence[ReserveRequest]]) -> Any:
        if self.holdings is not None:
            [[request]] = placements
            winner = dataclasses.replace(request, owner="other-replica", idempotency_key="")
            reserve_placement(self.inner, [winner])
            self.holdings.refresh(request.node)
            self.holdings = None
        return self.inner.reserve(placements)


def test_a_conflict_already_explained_before_the_refresh_does_not_rebuild(
    grpc_channel_factory, store
):
    racing: Any = _LearnsTheWinnerFirst(store)  # the port's shape, by delegation
    served = serve_allocator(
        grpc_channel_factory,
        racing,
        settings=AllocatorSettings(reserve_retries=2, expire_interval=60.0, resync_interval=3600.0),
    )
    try:
        holdings = served.app.holdings
        rebuilds: list[int] = []
        rebuild = holdings.rebuild

        def counted_rebuild() -> None:
            rebuilds.append(1)
            rebuild()

        holdings.rebuild = counted_rebuild  # type: ignore[method-assign]
        racing.holdings = holdings
        response = served.stub.Allocate(
            allocate_request("one-h100", node_name=NODE, reserve=True),
            metadata=owner("me"),
            timeout=10,
        )
        assert response.outcome == pb.OUTCOME_ALLOCATED
        assert racing.holdings is None  # the race happened
        assert rebuilds == []  # the state already held the winner: nothing to heal
    finally:
        served.app.close()
