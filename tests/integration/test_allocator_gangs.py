"""Gangs over real gRPC (server on port 0), with the embedded store and with Redis.

The GPU view is examples/cluster: h100-node-1 and h100-node-2 (8 H100 each) share
`topology.kubernetes.io/zone=zone-a`; a100-node-1 and l40s-node-1 are in zone-b; every node has
a rack of its own (`gpualloc.dev/rack`). A gang of H100 claims therefore fits in zone-a only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from protos.allocator.v1 import allocator_pb2 as pb
from services.allocator.app.telemetry import configure_telemetry
from services.allocator.config import AllocatorSettings
from services.allocator.reservations.holds import placement_holds
from services.allocator.reservations.model import (
    ReservationStore,
    ReserveRequest,
    reserve_placement,
)
from services.common.errors import Conflict, InvalidArgument
from services.common.grpc_errors import error_from_rpc
from services.common.pb.dra_mapping import from_pb_allocation_result
from tests.e2e.allocator_harness import (
    ServedAllocator,
    SilentStore,
    owner,
    pb_claims,
    pb_example_classes,
    serve_allocator,
)

ZONE = "topology.kubernetes.io/zone"
RACK = "gpualloc.dev/rack"
H100 = ("h100-node-1", "h100-node-2")


def gang(count: int, claim: str = "one-h100", label: str = ZONE) -> pb.Gang:
    return pb.Gang(node_count=count, claims_per_node=pb_claims(claim), group_by_label=label)


def allocate(
    count: int, claim: str = "one-h100", label: str = ZONE, **fields
) -> pb.AllocateRequest:
    classes = pb_example_classes("h100.example.com") if claim == "eight-h100" else []
    return pb.AllocateRequest(gang=gang(count, claim, label), device_classes=classes, **fields)


def _devices(placement: pb.NodePlacement) -> list[str]:
    return [
        f"{r.driver}/{r.pool}/{r.device}"
        for claim in placement.allocations
        for r in claim.allocation.results
    ]


def test_gang_allocate_reserves_one_reservation_per_node(allocator):
    response = allocator.stub.Allocate(
        allocate(2, reserve=True, idempotency_key="job-3"), metadata=owner("job/3"), timeout=10
    )
    assert response.outcome == pb.OUTCOME_ALLOCATED
    assert sorted(p.node_name for p in response.gang_placements) == list(H100)
    assert not response.node_name and not response.allocations
    for placement in response.gang_placements:
        [claim] = placement.allocations
        assert (claim.namespace, claim.name) == ("default", "one-h100")
        assert {r.pool for r in claim.allocation.results} == {placement.node_name}
        assert 0 < placement.score <= 1
    by_node = {r.node_name: r for r in response.reservations}
    assert sorted(by_node) == list(H100)
    for placement in response.gang_placements:
        reservation = by_node[placement.node_name]
        assert reservation.owner == "job/3"
        assert [f"{d.driver}/{d.pool}/{d.device}" for d in reservation.devices] == _devices(
            placement
        )
    again = allocator.stub.Allocate(
        allocate(2, reserve=True, idempotency_key="job-3"), metadata=owner("job/3"), timeout=10
    )
    assert sorted(r.id for r in again.reservations) == sorted(by_node[n].id for n in H100)
    listed = allocator.stub.ListReservations(pb.ListReservationsRequest(owner="job/3"), timeout=5)
    assert len(listed.reservations) == 2


def test_explain_gang_names_the_gang_holding_the_zone(allocator):
    held = allocator.stub.Allocate(
        allocate(2, "eight-h100", reserve=True), metadata=owner("job/big"), timeout=10
    )
    assert held.outcome == pb.OUTCOME_ALLOCATED
    response = allocator.stub.Explain(pb.ExplainRequest(gang=gang(2)), timeout=10)
    assert response.outcome == pb.OUTCOME_UNSATISFIABLE
    assert response.explanation.messages[0].startswith("gang of 2 nodes")
    assert {h.reservation_id for h in response.holders} == {r.id for r in held.reservations}
    assert {h.node_name for h in response.holders} == set(H100)


def test_explain_gang_that_fits_shows_the_placement(allocator):
    response = allocator.stub.Explain(pb.ExplainRequest(gang=gang(2)), timeout=10)
    assert response.outcome == pb.OUTCOME_ALLOCATED
    assert sorted(p.node_name for p in response.gang_placements) == list(H100)
    assert response.explanation.messages[0] == (
        f"gang of 2 nodes in {ZONE}=zone-a: "
        + ", ".join(p.node_name for p in response.gang_placements)
    )


@pytest.mark.parametrize(
    ("request_", "outcome"),
    [
        pytest.param(allocate(2, label=RACK), pb.OUTCOME_UNSATISFIABLE, id="one-node-per-rack"),
        pytest.param(allocate(3), pb.OUTCOME_UNSATISFIABLE, id="zone-a-has-two-h100-nodes"),
        pytest.param(allocate(2, label=""), pb.OUTCOME_ALLOCATED, id="without-a-label"),
    ],
)
def test_gang_outcomes(allocator, request_, outcome):
    response = allocator.stub.Allocate(request_, timeout=10)
    assert response.outcome == outcome
    if outcome == pb.OUTCOME_UNSATISFIABLE:
        assert response.explanation.messages[0].startswith("gang of")
        assert not response.gang_placements


def test_capacity_counts_gangs(allocator):
    allocator.stub.Allocate(
        allocate(1, reserve=True), metadata=owner("x"), timeout=10
    )  # one GPU on one H100 node
    response = allocator.stub.Capacity(pb.CapacityRequest(gang=gang(2)), timeout=10)
    assert response.total == 7  # 7 + 8 units: 7 pairs of distinct nodes
    assert sorted(n.count for n in response.nodes) == [7, 8]
    assert response.accuracy == pb.COUNT_ACCURACY_EXACT
    assert not response.models


@pytest.mark.parametrize(
    ("request_", "path"),
    [
        pytest.param(
            pb.AllocateRequest(gang=gang(2), claims=pb_claims("one-h100")),
            "claims",
            id="gang-and-claims",
        ),
        pytest.param(
            pb.AllocateRequest(gang=gang(2), node_name="h100-node-1"),
            "node_name",
            id="gang-with-a-pinned-node",
        ),
        pytest.param(pb.ExplainRequest(gang=gang(0)), "gang.node_count", id="zero-nodes"),
        pytest.param(
            pb.AllocateRequest(gang=pb.Gang(node_count=2)),
            "gang.claims_per_node",
            id="no-claims-per-node",
        ),
    ],
)
def test_bad_gangs_are_invalid_argument_with_the_field_path(allocator, request_, path):
    call = (
        allocator.stub.Explain
        if isinstance(request_, pb.ExplainRequest)
        else allocator.stub.Allocate
    )
    with pytest.raises(grpc.RpcError) as caught:
        call(request_, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    typed = error_from_rpc(caught.value)
    assert isinstance(typed, InvalidArgument) and typed.field_path == path


def test_solver_errors_in_gang_claims_point_into_the_gang(allocator):
    request = allocate(2)
    request.gang.claims_per_node[0].requests[0].exactly.device_class_name = "no-such-class"
    with pytest.raises(grpc.RpcError) as caught:
        allocator.stub.Allocate(request, timeout=10)
    typed = error_from_rpc(caught.value)
    assert isinstance(typed, InvalidArgument)
    assert typed.field_path == "gang.claims_per_node[0].requests[0].exactly.device_class_name"


# --- a stale view of the reservations: conflicts, retries, all or nothing ----------------------


def _stale_allocator(grpc_channel_factory, store, retries: int, reader=None) -> ServedAllocator:
    """An allocator that never hears of other replicas' reservations (SilentStore)."""
    settings = AllocatorSettings(
        reserve_retries=retries, expire_interval=60.0, resync_interval=3600.0
    )
    telemetry = configure_telemetry({}, metric_readers=[reader] if reader else [])
    silent: Any = SilentStore(store)
    return serve_allocator(grpc_channel_factory, silent, settings=settings, telemetry=telemetry)


def _taken_behind_its_back(
    served: ServedAllocator, store: ReservationStore, claim: str = "one-h100"
) -> str:
    """Reserve, directly in the store, the first device the gang's last member would get (the
    store reserves members in order: the earlier ones are taken, then released again)."""
    answer = served.stub.Allocate(allocate(2, claim), timeout=10)
    placement = answer.gang_placements[-1]
    node = placement.node_name
    allocation = from_pb_allocation_result(placement.allocations[0].allocation)
    single = dataclasses.replace(allocation, results=allocation.results[:1])
    snapshot = served.app.view.require(0).snapshot
    [hold] = placement_holds(snapshot, node, [single]).values()
    reserve_placement(
        store, [ReserveRequest("other-replica", node, ("default/other",), (single,), hold, 60.0)]
    )[0]
    return hold.devices[0]


def _counter(reader: InMemoryMetricReader, name: str) -> int:
    data = reader.get_metrics_data()
    return sum(
        getattr(point, "value", 0)
        for resource in (data.resource_metrics if data else ())
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    )


def test_a_gang_conflict_refreshes_and_solves_again(grpc_channel_factory, store):
    reader = InMemoryMetricReader()
    served = _stale_allocator(grpc_channel_factory, store, retries=3, reader=reader)
    try:
        taken = _taken_behind_its_back(served, store)
        response = served.stub.Allocate(allocate(2, reserve=True), metadata=owner("me"), timeout=10)
        assert response.outcome == pb.OUTCOME_ALLOCATED
        devices = [d for p in response.gang_placements for d in _devices(p)]
        assert taken not in devices
        assert sorted(r.node_name for r in response.reservations) == list(H100)
        assert _counter(reader, "gpualloc.reservation.conflicts") == 1
    finally:
        served.app.close()


@pytest.mark.parametrize(
    ("retries", "outcome"),
    [
        pytest.param(0, None, id="no-retries-aborted"),
        pytest.param(1, pb.OUTCOME_UNSATISFIABLE, id="retried-then-unsatisfiable"),
    ],
)
def test_a_gang_is_reserved_all_or_nothing(grpc_channel_factory, store, retries, outcome):
    served = _stale_allocator(grpc_channel_factory, store, retries=retries)
    try:
        taken = _taken_behind_its_back(served, store, "eight-h100")
        request = allocate(2, "eight-h100", reserve=True)
        if outcome is None:
            with pytest.raises(grpc.RpcError) as caught:
                served.stub.Allocate(request, metadata=owner("me"), timeout=10)
            assert caught.value.code() == grpc.StatusCode.ABORTED
            error = error_from_rpc(caught.value)
            assert isinstance(error, Conflict) and error.conflicts == (f"device:{taken}",)
        else:
            response = served.stub.Allocate(request, metadata=owner("me"), timeout=10)
            assert response.outcome == outcome
            assert not response.reservations
        # the first member was taken, then released again: only the other replica's is left
        assert [r.owner for r in store.list()] == ["other-replica"]
    finally:
        served.app.close()
