"""The allocator over real gRPC (server on port 0), with the embedded store and with Redis.

The GPU view is examples/cluster: h100-node-1 and h100-node-2 (8 H100 each), a100-node-1 (4
A100s published as DynamicMIG partitions with shared counters) and l40s-node-1 (4 L40S).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2
from grpc_status import rpc_status

from protos.allocator.v1 import allocator_pb2 as pb
from protos.common.v1 import dra_pb2
from services.allocator.bootstrap import FEED_HEALTH_NAME
from services.allocator.config import AllocatorSettings
from services.common.errors import Conflict, InvalidArgument
from services.common.grpc_errors import error_from_rpc
from tests.e2e.allocator_harness import (
    ServedAllocator,
    allocate_request,
    owner,
    pb_claims,
    pb_example_classes,
)

SERVICE = "gpualloc.allocator.v1.Allocator"


def _error(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The grpc.RpcError (also a grpc.Call) the call raised."""
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)
    return caught.value


def _device(result: dra_pb2.DeviceRequestAllocationResult) -> str:
    return f"{result.driver}/{result.pool}/{result.device}"


# --- Allocate -----------------------------------------------------------------------------------


def test_allocate_places_a_claim_without_reserving(allocator):
    response = allocator.stub.Allocate(allocate_request("one-h100"), timeout=10)
    assert response.outcome == pb.OUTCOME_ALLOCATED
    assert response.node_name in ("h100-node-1", "h100-node-2")
    [claim] = response.allocations
    assert (claim.namespace, claim.name) == ("default", "one-h100")
    assert [r.request for r in claim.allocation.results] == ["gpu"]
    assert response.inventory_generation == 1
    assert not response.reservations
    assert 0 < response.score <= 1


def test_allocate_with_reserve_then_commit_renew_release_get_list(allocator):
    response = allocator.stub.Allocate(
        allocate_request(
            "one-h100",
            reserve=True,
            idempotency_key="job-1",
            lease_ttl=duration_pb2.Duration(seconds=60),
            reservation_labels={"slurm.job_id": "1"},
        ),
        metadata=owner("slurm/job/1"),
        timeout=10,
    )
    [reservation] = response.reservations
    assert reservation.owner == "slurm/job/1"
    assert reservation.state == pb.RESERVATION_STATE_RESERVED
    assert reservation.node_name == response.node_name
    assert reservation.fencing_token > 0
    assert dict(reservation.labels) == {"slurm.job_id": "1"}
    assert [_device(d) for d in reservation.devices] == [
        _device(r) for r in response.allocations[0].allocation.results
    ]
    assert reservation.expires_at.seconds - reservation.created_at.seconds == 60

    got = allocator.stub.GetReservation(
        pb.GetReservationRequest(reservation_id=reservation.id), timeout=5
    )
    assert got.reservation.id == reservation.id
    renewed = allocator.stub.Renew(
        pb.RenewRequest(
            reservation_id=reservation.id, lease_ttl=duration_pb2.Duration(seconds=120)
        ),
        metadata=owner("slurm/job/1"),
        timeout=5,
    )
    assert renewed.reservation.expires_at.seconds > reservation.expires_at.seconds
    committed = allocator.stub.Commit(
        pb.CommitRequest(reservation_id=reservation.id, fencing_token=reservation.fencing_token),
        metadata=owner("slurm/job/1"),
        timeout=5,
    )
    assert committed.reservation.state == pb.RESERVATION_STATE_COMMITTED
    assert not committed.reservation.HasField("expires_at")
    listed = allocator.stub.ListReservations(
        pb.ListReservationsRequest(owner="slurm/job/1"), timeout=5
    )
    assert [r.id for r in listed.reservations] == [reservation.id]
    error = _error(
        allocator.stub.Renew,
        pb.RenewRequest(reservation_id=reservation.id),
        metadata=owner("slurm/job/1"),
        timeout=5,
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    released = allocator.stub.Release(
        pb.ReleaseRequest(reservation_id=reservation.id), metadata=owner("slurm/job/1"), timeout=5
    )
    assert released.reservation.id == reservation.id
    error = _error(
        allocator.stub.GetReservation,
        pb.GetReservationRequest(reservation_id=reservation.id),
        timeout=5,
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND
    missing = allocator.stub.Release(
        pb.ReleaseRequest(reservation_id=reservation.id, allow_missing=True),
        metadata=owner("slurm/job/1"),
        timeout=5,
    )
    assert not missing.HasField("reservation")


def test_reserved_devices_are_not_allocated_again(allocator):
    seen = set()
    for _ in range(16):
        response = allocator.stub.Allocate(
            allocate_request("one-h100", reserve=True), metadata=owner("a"), timeout=10
        )
        assert response.outcome == pb.OUTCOME_ALLOCATED
        seen.add(_device(response.allocations[0].allocation.results[0]))
    assert len(seen) == 16  # every H100 of both nodes, each once
    full = allocator.stub.Allocate(allocate_request("one-h100", explain=True), timeout=10)
    assert full.outcome == pb.OUTCOME_UNSATISFIABLE
    assert any("in use (8)" in m for m in full.explanation.messages)
    assert {h.owner for h in full.holders} == {"a"}


def test_mig_partitions_consume_counters_until_none_fit(allocator):
    placed = []
    while True:
        response = allocator.stub.Allocate(
            allocate_request("mig-small-else-medium", reserve=True), metadata=owner("m"), timeout=10
        )
        if response.outcome != pb.OUTCOME_ALLOCATED:
            break
        placed.append(response.allocations[0].allocation.results[0].request)
    # 4 A100s x 7 1g.5gb slices; then neither 2g.10gb nor a whole A100 has counters left.
    assert placed == ["mig/small"] * 28
    reservations = allocator.stub.ListReservations(
        pb.ListReservationsRequest(owner="m", page_size=1000), timeout=5
    ).reservations
    assert len(reservations) == 28


def test_allocate_reserve_is_idempotent_by_key(allocator):
    request = allocate_request("one-h100", reserve=True, idempotency_key="k1")
    first = allocator.stub.Allocate(request, metadata=owner("o"), timeout=10)
    request.lease_ttl.FromSeconds(77)  # the lease, budget and explain flags are not the request
    request.explain = True
    second = allocator.stub.Allocate(request, metadata=owner("o"), timeout=10)
    assert [r.id for r in second.reservations] == [r.id for r in first.reservations]
    assert second.allocations == first.allocations


@pytest.mark.parametrize(
    "change",
    [
        pytest.param("claims", id="other-claims"),
        pytest.param("node", id="other-node"),
        pytest.param("labels", id="other-labels"),
    ],
)
def test_allocate_key_reused_for_another_request_is_failed_precondition(allocator, change):
    """A reused key with another request (2 GPUs instead of 4, say) must not silently get the
    first request's reservation."""
    request = allocate_request("one-h100", reserve=True, idempotency_key=f"reuse-{change}")
    first = allocator.stub.Allocate(request, metadata=owner("o"), timeout=10)
    [reservation] = first.reservations
    if change == "claims":
        other = allocate_request("eight-h100", reserve=True, idempotency_key=f"reuse-{change}")
    else:
        other = pb.AllocateRequest()
        other.CopyFrom(request)
        if change == "node":
            other.node_name = "h100-node-2"
        else:
            other.reservation_labels["job"] = "another"
    error = _error(allocator.stub.Allocate, other, metadata=owner("o"), timeout=10)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"was first used for another request (reservation {reservation.id})" in error.details()


def test_explain_names_the_reservation_holding_the_devices(allocator):
    held = allocator.stub.Allocate(
        allocate_request("one-h100", node_name="h100-node-1", reserve=True),
        metadata=owner("holder-job"),
        timeout=10,
    )
    [reservation] = held.reservations
    response = allocator.stub.Explain(
        pb.ExplainRequest(
            claims=pb_claims("eight-h100"),
            device_classes=pb_example_classes("h100.example.com"),  # inline: not built in
            node_name="h100-node-1",
        ),
        timeout=10,
    )
    assert response.outcome == pb.OUTCOME_UNSATISFIABLE
    assert [(h.reservation_id, h.owner) for h in response.holders] == [
        (reservation.id, "holder-job")
    ]
    assert response.holders[0].HasField("expires_at")
    text = "\n".join(response.explanation.messages)
    assert f"in use by {reservation.id}" in text
    [request] = response.explanation.requests
    in_use = [g for g in request.rejections if g.reason == pb.REJECTION_REASON_IN_USE]
    assert in_use and in_use[0].count == 1


def test_explain_says_why_the_chosen_node_won(allocator):
    response = allocator.stub.Explain(pb.ExplainRequest(claims=pb_claims("one-h100")), timeout=10)
    assert response.outcome == pb.OUTCOME_ALLOCATED
    assert any("chosen by BinPack" in m for m in response.explanation.messages)
    assert response.explanation.stats.nodes_considered >= 2


def test_capacity_counts_units_per_node_and_model(allocator):
    allocator.stub.Allocate(
        allocate_request("one-h100", node_name="h100-node-2", reserve=True),
        metadata=owner("x"),
        timeout=10,
    )
    response = allocator.stub.Capacity(pb.CapacityRequest(claims=pb_claims("one-h100")), timeout=10)
    assert response.accuracy == pb.COUNT_ACCURACY_EXACT
    assert [(n.node_name, n.count) for n in response.nodes] == [
        ("h100-node-1", 8),
        ("h100-node-2", 7),
    ]
    assert [(m.product_name, m.count) for m in response.models] == [("NVIDIA H100 80GB HBM3", 15)]
    total = allocator.stub.Capacity(
        pb.CapacityRequest(claims=pb_claims("one-h100"), ignore_reservations=True), timeout=10
    )
    assert total.total == 16


def test_capacity_of_an_unknown_device_class_is_invalid_not_zero(allocator):
    request = pb.CapacityRequest(claims=pb_claims("one-h100"))
    request.claims[0].requests[0].exactly.device_class_name = "no-such-class.example.com"
    error = _error(allocator.stub.Capacity, request, timeout=10)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "no-such-class.example.com" in error.details()


# --- Reserve: conflicts, idempotency, owners ------------------------------------------------


def _placement(
    allocator: ServedAllocator, claim: str = "one-h100", node: str = "h100-node-1"
) -> pb.ReserveRequest:
    response = allocator.stub.Allocate(allocate_request(claim, node_name=node), timeout=10)
    assert response.outcome == pb.OUTCOME_ALLOCATED
    return pb.ReserveRequest(node_name=response.node_name, allocations=response.allocations)


def test_reserve_of_a_taken_placement_is_aborted_naming_the_devices(allocator):
    request = _placement(allocator)
    allocator.stub.Reserve(request, metadata=owner("first"), timeout=5)
    error = _error(allocator.stub.Reserve, request, metadata=owner("second"), timeout=5)
    assert error.code() == grpc.StatusCode.ABORTED
    typed = error_from_rpc(error)
    assert isinstance(typed, Conflict)
    device = _device(request.allocations[0].allocation.results[0])
    assert typed.conflicts == (f"device:{device}",)
    details = rpc_status.from_call(error)
    assert details is not None and len(details.details) == 2  # ErrorInfo + one ResourceInfo


def test_concurrent_reserves_with_one_key_make_one_reservation(allocator):
    request = _placement(allocator)
    request.idempotency_key = "same-key"
    barrier = threading.Barrier(8)

    def reserve(_):
        barrier.wait()
        return allocator.stub.Reserve(request, metadata=owner("o"), timeout=10).reservation.id

    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(reserve, range(8)))
    assert len(ids) == 1


def test_reserve_key_reused_for_another_placement_is_failed_precondition(allocator):
    first = _placement(allocator, node="h100-node-1")
    first.idempotency_key = "k"
    allocator.stub.Reserve(first, metadata=owner("o"), timeout=5)
    other = _placement(allocator, node="h100-node-1")  # the next free GPU
    other.idempotency_key = "k"
    error = _error(allocator.stub.Reserve, other, metadata=owner("o"), timeout=5)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "was first used for another placement" in error.details()


@pytest.mark.parametrize(
    "call",
    [
        pytest.param("commit", id="commit"),
        pytest.param("renew", id="renew"),
        pytest.param("release", id="release"),
    ],
)
def test_another_owner_is_permission_denied(allocator, call):
    reserved = allocator.stub.Reserve(_placement(allocator), metadata=owner("alice"), timeout=5)
    rid = reserved.reservation.id
    requests = {
        "commit": (allocator.stub.Commit, pb.CommitRequest(reservation_id=rid)),
        "renew": (allocator.stub.Renew, pb.RenewRequest(reservation_id=rid)),
        "release": (allocator.stub.Release, pb.ReleaseRequest(reservation_id=rid)),
    }
    method, request = requests[call]
    error = _error(method, request, metadata=owner("bob"), timeout=5)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    setattr(request, "owner", "alice")  # noqa: B010 - the field serves without metadata
    method(request, timeout=5)


def test_stale_fencing_token_is_failed_precondition(allocator):
    reserved = allocator.stub.Reserve(_placement(allocator), metadata=owner("o"), timeout=5)
    token = reserved.reservation.fencing_token
    error = _error(
        allocator.stub.Commit,
        pb.CommitRequest(reservation_id=reserved.reservation.id, fencing_token=token + 1),
        metadata=owner("o"),
        timeout=5,
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_list_pages_by_id(allocator):
    ids = []
    for _ in range(5):
        response = allocator.stub.Allocate(
            allocate_request("one-h100", reserve=True), metadata=owner("p"), timeout=10
        )
        ids.append(response.reservations[0].id)
    seen: list[str] = []
    token = ""
    while True:
        page = allocator.stub.ListReservations(
            pb.ListReservationsRequest(owner="p", page_size=2, page_token=token), timeout=5
        )
        seen.extend(r.id for r in page.reservations)
        token = page.next_page_token
        if not token:
            break
    assert seen == sorted(ids)
    error = _error(
        allocator.stub.ListReservations,
        pb.ListReservationsRequest(owner="q", page_token=page_token_of(allocator)),
        timeout=5,
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def page_token_of(allocator: ServedAllocator) -> str:
    page = allocator.stub.ListReservations(
        pb.ListReservationsRequest(owner="p", page_size=1), timeout=5
    )
    return str(page.next_page_token)


# --- errors --------------------------------------------------------------------------------------


def _with_selector(expression: str) -> pb.AllocateRequest:
    request = allocate_request("one-h100")
    del request.claims[0].requests[0].exactly.selectors[:]
    request.claims[0].requests[0].exactly.selectors.add(cel=expression)
    return request


def _unknown_class() -> pb.AllocateRequest:
    request = allocate_request("one-h100")
    request.claims[0].requests[0].exactly.device_class_name = "no-such-class"
    return request


def _duplicate_claim() -> pb.AllocateRequest:
    return allocate_request("one-h100", "one-h100")


def _bad_quantity() -> pb.AllocateRequest:
    request = allocate_request("one-h100")
    request.claims[0].requests[0].exactly.capacity.requests["memory"].value = "10 GiB"
    return request


def _infinite_opaque_parameter() -> pb.AllocateRequest:
    """JSON has no Infinity; a Struct number can be one (it answered INTERNAL once)."""
    request = allocate_request("one-h100")
    config = request.claims[0].config.add()
    config.opaque.driver = "gpu.nvidia.com"
    config.opaque.parameters.update({"sharing": {"replicas": float("inf")}})
    return request


@pytest.mark.parametrize(
    ("build", "path"),
    [
        pytest.param(
            lambda: _with_selector("device.attributes["),
            "claims[0].requests[0].exactly.selectors[0].cel",
            id="cel-syntax-error",
        ),
        pytest.param(
            lambda: _with_selector("device.attributes['gpu.nvidia.com'].nosuch == 1"),
            "claims[0].requests[0].exactly.selectors[0].cel",
            id="cel-runtime-error",
        ),
        pytest.param(
            _unknown_class, "claims[0].requests[0].exactly.device_class_name", id="unknown-class"
        ),
        pytest.param(_duplicate_claim, "claims[1].name", id="duplicate-claim"),
        pytest.param(
            _bad_quantity,
            'claims[0].requests[0].exactly.capacity.requests["memory"]',
            id="bad-quantity",
        ),
        pytest.param(lambda: pb.AllocateRequest(), "claims", id="no-claims"),
        pytest.param(
            _infinite_opaque_parameter,
            'claims[0].config[0].opaque.parameters["sharing"]["replicas"]',
            id="infinite-opaque-parameter",
        ),
    ],
)
def test_bad_claims_are_invalid_argument_with_the_field_path(allocator, build, path):
    error = _error(allocator.stub.Allocate, build(), timeout=10)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    typed = error_from_rpc(error)
    assert isinstance(typed, InvalidArgument)
    assert typed.field_path == path


def test_reserve_of_an_unknown_device_names_the_result(allocator):
    request = _placement(allocator)
    request.allocations[0].allocation.results[0].device = "gpu-99"
    error = _error(allocator.stub.Reserve, request, metadata=owner("o"), timeout=5)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    typed = error_from_rpc(error)
    assert isinstance(typed, InvalidArgument)
    assert typed.field_path == "allocations[0].allocation.results[0]"


def test_unknown_pinned_node_is_not_found(allocator):
    error = _error(allocator.stub.Allocate, allocate_request("one-h100", node_name="nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_waiting_for_a_future_generation_ends_before_the_deadline(allocator):
    error = _error(
        allocator.stub.Allocate,
        allocate_request("one-h100", min_inventory_generation=99),
        timeout=1.0,
    )
    assert error.code() == grpc.StatusCode.UNAVAILABLE  # not DEADLINE_EXCEEDED: we answered
    assert "generation 99" in error.details()


def test_step_budget_gives_budget_exhausted(allocator):
    request = allocate_request("one-h100")
    request.budget.max_steps = 1
    response = allocator.stub.Allocate(request, timeout=10)
    assert response.outcome == pb.OUTCOME_BUDGET_EXHAUSTED


def test_health_reports_the_allocator_and_its_feed(allocator):
    assert allocator.check(SERVICE) == health_pb2.HealthCheckResponse.SERVING
    assert allocator.check(FEED_HEALTH_NAME) == health_pb2.HealthCheckResponse.SERVING


def test_settings_are_read_from_the_environment():
    settings = AllocatorSettings.from_env(
        {"GPUALLOC_LEASE_TTL": "90s", "GPUALLOC_POLICY": "spread", "GPUALLOC_RESERVE_RETRIES": "5"}
    )
    assert (settings.lease_seconds, settings.policy.value, settings.reserve_retries) == (
        90.0,
        "Spread",
        5,
    )
