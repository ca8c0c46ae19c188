"""The binding step of a reservation end to end: a real allocator on port 0 in front of the
embedded store and a real redis-server, a fabric pool of composable GPUs with binding
conditions (bindsToNode), the node's agent reporting device conditions over
ReportDeviceConditions, the holder committing and watching (docs/reservations.md, "Binding").

Cases: bound (every condition True: Commit succeeds, the reservation says BOUND), failed (a
failure condition True: released, Commit and Renew answer FAILED_PRECONDITION
RESERVATION_PREEMPTED with the reason, WatchReservations sends BINDING_FAILED), timed out (the
binding timeout passes: released the same way), released meanwhile (the holder gives up before
the agent reports: the report is NOT_FOUND and changes nothing).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from protos.allocator.v1 import allocator_pb2 as pb
from protos.common.v1 import dra_pb2
from services.allocator.app.inventory_feed import StaticFeed
from services.allocator.app.telemetry import Telemetry, configure_telemetry
from services.allocator.config import AllocatorSettings
from services.common.dra.model import (
    DeviceClass,
    DeviceRequest,
    DeviceSelector,
    ExactDeviceRequest,
    ResourceClaim,
)
from services.common.errors import NotBound, Preempted
from services.common.grpc_errors import error_from_rpc
from services.common.pb.dra_mapping import to_pb_device_class, to_pb_resource_claim
from services.common.security.audit import AUDIT_LOGGER
from tests.e2e.allocator_harness import ServedAllocator, owner, serve_allocator
from tests.fabric import ATTACHED, FAILED, fabric_manifest

TIMEOUT = 4.0  # GPUALLOC_BINDING_TIMEOUT of the server under test
HOLDER = owner("slurm/job/7")

FABRIC = fabric_manifest(4)
CLASS = DeviceClass("fabric-gpu", (DeviceSelector('device.driver == "gpu.nvidia.com"'),))


def serve_fabric(
    grpc_channel_factory: Any, store: Any, tmp_path: Path, telemetry: Telemetry | None = None
) -> ServedAllocator:
    (tmp_path / "fabric.yaml").write_text(FABRIC)
    return serve_allocator(
        grpc_channel_factory,
        store,
        settings=AllocatorSettings(expire_interval=0.1, binding_timeout=TIMEOUT),
        feed=StaticFeed.from_paths([str(tmp_path)]),
        telemetry=telemetry,
    )


@pytest.fixture
def fabric(grpc_channel_factory: Any, store: Any, tmp_path: Path) -> Iterator[ServedAllocator]:
    served = serve_fabric(grpc_channel_factory, store, tmp_path)
    yield served
    served.app.close()


def reserve(allocator: ServedAllocator) -> pb.Reservation:
    """One fabric GPU, reserved: the node's reservation (which binds)."""
    return reserve_placement(allocator)[0]


def placement_request(idempotency_key: str = "") -> pb.AllocateRequest:
    """One fabric GPU, to reserve."""
    claim = ResourceClaim(
        "composed", requests=(DeviceRequest("gpu", ExactDeviceRequest("fabric-gpu")),)
    )
    return pb.AllocateRequest(
        claims=[to_pb_resource_claim(claim)],
        device_classes=[to_pb_device_class(CLASS)],
        reserve=True,
        lease_ttl=duration_pb2.Duration(seconds=60),
        idempotency_key=idempotency_key,
    )


def reserve_placement(allocator: ServedAllocator) -> tuple[pb.Reservation, pb.Reservation]:
    """One fabric GPU, reserved: the node's reservation and the fabric pool's."""
    response = allocator.stub.Allocate(placement_request(), metadata=HOLDER, timeout=10)
    [result] = response.allocations[0].allocation.results
    assert list(result.binding_conditions) == [ATTACHED]
    assert list(result.binding_failure_conditions) == [FAILED]
    term = response.allocations[0].allocation.node_selector.node_selector_terms[0]
    assert term.match_fields[0].values == ["composable-1"]  # bindsToNode: pinned to the node
    node, pool = response.reservations  # the node's, then the fabric pool's (docs/api.md)
    assert (node.node_name, pool.node_name) == ("composable-1", "gpu.nvidia.com/fabric")
    assert node.binding == pb.BINDING_PHASE_BINDING
    assert pool.binding == pb.BINDING_PHASE_UNSPECIFIED  # the node's reservation binds
    return node, pool


def report(
    allocator: ServedAllocator, reservation: pb.Reservation, condition: str, status: bool = True
) -> pb.ReportDeviceConditionsResponse:
    [device] = reservation.devices
    return allocator.stub.ReportDeviceConditions(
        pb.ReportDeviceConditionsRequest(
            reservation_id=reservation.id,
            conditions=[pb.DeviceCondition(device=device, type=condition, status=status)],
        ),
        timeout=10,
    )


def commit(allocator: ServedAllocator, reservation: pb.Reservation) -> pb.CommitResponse:
    return allocator.stub.Commit(
        pb.CommitRequest(reservation_id=reservation.id), metadata=HOLDER, timeout=10
    )


def refusal(call: Any, *args: Any) -> Exception:
    with pytest.raises(grpc.RpcError) as caught:
        call(*args)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    return error_from_rpc(caught.value)


def watch(allocator: ServedAllocator) -> queue.Queue[pb.WatchReservationsResponse]:
    """The holder's WatchReservations changes, as they come (the stream ends with the test)."""
    changes: queue.Queue[pb.WatchReservationsResponse] = queue.Queue()
    stream = allocator.stub.WatchReservations(
        pb.WatchReservationsRequest(owner="slurm/job/7"), metadata=HOLDER, timeout=30
    )

    def follow() -> None:
        try:
            for change in stream:
                changes.put(change)
        except grpc.RpcError:
            pass

    threading.Thread(target=follow, daemon=True).start()
    first = changes.get(timeout=10)
    assert first.kind == pb.RESERVATION_CHANGE_KIND_HEARTBEAT  # registered: nothing missed
    return changes


def next_kind(
    changes: queue.Queue[pb.WatchReservationsResponse], kind: int, within: float = 10.0
) -> pb.WatchReservationsResponse:
    end = time.monotonic() + within
    while time.monotonic() < end:
        change = changes.get(timeout=max(0.01, end - time.monotonic()))
        if change.kind == kind:
            return change
    raise AssertionError(f"no change of kind {kind}")


def test_bound_once_every_condition_is_reported_true(fabric: ServedAllocator) -> None:
    reservation = reserve(fabric)
    changes = watch(fabric)

    early = refusal(commit, fabric, reservation)
    assert isinstance(early, NotBound)
    assert f"waiting for {reservation.devices[0].driver}/fabric/" in str(early)
    not_yet = report(fabric, reservation, ATTACHED, status=False)
    assert not_yet.reservation.binding == pb.BINDING_PHASE_BINDING
    assert not not_yet.released
    bound = report(fabric, reservation, ATTACHED)
    assert bound.reservation.binding == pb.BINDING_PHASE_BOUND
    assert [(c.type, c.status) for c in bound.reservation.conditions] == [(ATTACHED, True)]
    next_kind(changes, pb.RESERVATION_CHANGE_KIND_CONDITIONS)

    committed = commit(fabric, reservation)
    assert committed.reservation.state == pb.RESERVATION_STATE_COMMITTED
    assert committed.reservation.binding == pb.BINDING_PHASE_BOUND
    late = report(fabric, reservation, FAILED)  # once committed, it was bound: kept
    assert not late.released


def test_a_failure_condition_releases_it_and_the_holder_is_told(fabric: ServedAllocator) -> None:
    reservation, pool = reserve_placement(fabric)
    changes = watch(fabric)

    failed = report(fabric, reservation, FAILED)

    assert failed.released
    with pytest.raises(grpc.RpcError) as gone:  # the placement's pool reservation went with it
        fabric.stub.GetReservation(pb.GetReservationRequest(reservation_id=pool.id), timeout=10)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    assert failed.released_reason.startswith("binding failed: device gpu.nvidia.com/fabric/")
    change = next_kind(changes, pb.RESERVATION_CHANGE_KIND_BINDING_FAILED)
    assert change.reservation_id == reservation.id
    assert "reported dra.example.com/attach-failed" in change.preempted_by
    for call in (commit, renew):
        told = refusal(call, fabric, reservation)
        assert isinstance(told, Preempted)
        assert "was released: binding failed" in str(told)
    again = reserve(fabric)  # its GPU is free again
    assert again.devices


def renew(allocator: ServedAllocator, reservation: pb.Reservation) -> pb.RenewResponse:
    return allocator.stub.Renew(
        pb.RenewRequest(reservation_id=reservation.id), metadata=HOLDER, timeout=10
    )


def test_the_binding_timeout_releases_it(fabric: ServedAllocator) -> None:
    reservation = reserve(fabric)
    changes = watch(fabric)

    change = next_kind(changes, pb.RESERVATION_CHANGE_KIND_BINDING_FAILED, within=TIMEOUT + 10)

    assert change.reservation_id == reservation.id
    assert "binding timed out waiting for gpu.nvidia.com/fabric/" in change.preempted_by
    told = refusal(commit, fabric, reservation)
    assert isinstance(told, Preempted)
    assert "binding timed out" in str(told)


def test_released_meanwhile_the_report_finds_nothing(fabric: ServedAllocator) -> None:
    reservation = reserve(fabric)
    fabric.stub.Release(
        pb.ReleaseRequest(reservation_id=reservation.id), metadata=HOLDER, timeout=10
    )

    with pytest.raises(grpc.RpcError) as caught:
        report(fabric, reservation, ATTACHED)

    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def condition(device: dra_pb2.DeviceID, type_: str = ATTACHED) -> pb.DeviceCondition:
    return pb.DeviceCondition(device=device, type=type_, status=True)


ELSEWHERE = dra_pb2.DeviceID(driver="gpu.nvidia.com", pool="fabric", device="gpu-9")
# (the report's conditions, given the reserved device; the field path the refusal names)
BAD_REPORTS = [
    pytest.param(lambda d: [], "conditions", id="no-conditions"),
    pytest.param(lambda d: [pb.DeviceCondition(type=ATTACHED, status=True)],
                 "conditions[0].device", id="device-unset"),
    pytest.param(lambda d: [condition(ELSEWHERE)], "conditions[0].device",
                 id="a-device-it-does-not-hold"),
    pytest.param(lambda d: [condition(d, "")], "conditions[0].type", id="type-empty"),
    pytest.param(lambda d: [condition(d, "Not A Name")], "conditions[0].type",
                 id="type-not-a-qualified-name"),
    pytest.param(lambda d: [condition(d), condition(d)], "conditions[1].type",
                 id="a-type-twice-for-a-device"),
    pytest.param(lambda d: [condition(d, f"dra.example.com/c{i}") for i in range(9)],
                 "conditions", id="more-than-8-types-for-a-device"),
    pytest.param(lambda d: [condition(d)] * 100_000, "conditions", id="a-flood-of-conditions"),
]  # fmt: skip


@pytest.mark.parametrize(("conditions", "path"), BAD_REPORTS)
def test_a_bad_report_is_invalid_and_changes_nothing(
    fabric: ServedAllocator, conditions: Any, path: str
) -> None:
    """Upstream keeps at most 8 conditions a device, one per type (status.devices[].conditions
    is a map keyed by type): a report past that is refused, not stored."""
    reservation = reserve(fabric)
    [device] = reservation.devices

    with pytest.raises(grpc.RpcError) as caught:
        fabric.stub.ReportDeviceConditions(
            pb.ReportDeviceConditionsRequest(
                reservation_id=reservation.id, conditions=conditions(device)
            ),
            timeout=10,
        )

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert path in (caught.value.details() or "")
    got = fabric.stub.GetReservation(
        pb.GetReservationRequest(reservation_id=reservation.id), metadata=HOLDER, timeout=10
    ).reservation
    assert (list(got.conditions), got.binding) == ([], pb.BINDING_PHASE_BINDING)


def test_types_past_8_across_reports_are_refused(fabric: ServedAllocator) -> None:
    reservation = reserve(fabric)
    [device] = reservation.devices
    for first in range(0, 8, 4):
        fabric.stub.ReportDeviceConditions(
            pb.ReportDeviceConditionsRequest(
                reservation_id=reservation.id,
                conditions=[
                    condition(device, f"dra.example.com/c{i}") for i in range(first, first + 4)
                ],
            ),
            timeout=10,
        )

    with pytest.raises(grpc.RpcError) as caught:
        report(fabric, reservation, "dra.example.com/c8")

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "would have 9 condition types: at most 8" in (caught.value.details() or "")
    assert report(fabric, reservation, "dra.example.com/c7", False).reservation.conditions[7] == (
        pb.DeviceCondition(device=device, type="dra.example.com/c7", status=False)
    )  # a type it has may still change


def test_another_replica_shows_the_reported_binding_before_its_refresh(
    grpc_channel_factory: Any, store: Any, tmp_path: Path
) -> None:
    """Two allocators on one store: a report on one, and the other's answers (an idempotent
    Allocate's replay, from its copy) show the reservation bound from the CONDITIONS event, not
    only after its next refresh (GPUALLOC_RESYNC_INTERVAL, 30 s)."""
    first = serve_fabric(grpc_channel_factory, store, tmp_path)
    second = serve_fabric(grpc_channel_factory, store, tmp_path)
    try:
        request = placement_request(idempotency_key="job-7")
        node = first.stub.Allocate(request, metadata=HOLDER, timeout=10).reservations[0]
        assert report(first, node, ATTACHED).reservation.binding == pb.BINDING_PHASE_BOUND

        end = time.monotonic() + 5  # well before the refresh
        phase = pb.BINDING_PHASE_BINDING
        while phase != pb.BINDING_PHASE_BOUND and time.monotonic() < end:
            replay = second.stub.Allocate(request, metadata=HOLDER, timeout=10)
            assert replay.reservations[0].id == node.id  # the replay, not a new placement
            phase = replay.reservations[0].binding
            time.sleep(0.05)

        assert phase == pb.BINDING_PHASE_BOUND
        commit(second, node)
    finally:
        second.app.close()
        first.app.close()


def test_a_report_is_audited_with_what_it_said_and_did(
    fabric: ServedAllocator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    reservation = reserve(fabric)
    [device] = reservation.devices

    report(fabric, reservation, ATTACHED, False)
    report(fabric, reservation, FAILED)

    events = [
        vars(r) for r in caplog.records
        if r.name == AUDIT_LOGGER and getattr(r, "event", "") == "reservation.conditions"
    ]  # fmt: skip
    key = f"{device.driver}/{device.pool}/{device.device}"
    assert [(e["reservation"], e["owner"], e["node"]) for e in events] == [
        (reservation.id, "slurm/job/7", "composable-1")
    ] * 2
    assert [e["conditions"] for e in events] == [
        [f"{key} {ATTACHED}=False"],
        [f"{key} {FAILED}=True"],
    ]
    assert "released" not in events[0]  # empty fields are left out
    assert events[1]["released"].startswith("binding: binding failed: device " + key)


class CommitAfterRead:
    """The store, with the holder's Commit landing right after one read of `target`: a binding
    sweep read the reservation still binding, then the agent's last report and the holder's
    Commit came before the sweep's revoke."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.target = ""

    def get(self, reservation_id: str) -> Any:
        found = self.inner.get(reservation_id)
        if reservation_id == self.target:
            self.target = ""
            self.inner.commit(reservation_id, found.owner)
        return found

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_a_sweep_that_loses_to_a_commit_leaves_the_reservation_held(
    grpc_channel_factory: Any, store: Any, tmp_path: Path
) -> None:
    racing = CommitAfterRead(store)
    served = serve_fabric(grpc_channel_factory, racing, tmp_path)
    try:
        reservation = reserve(served)
        racing.target = reservation.id  # the sweep past the timeout reads it next
        deadline = time.monotonic() + TIMEOUT + 10
        while racing.target and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # the sweep's revoke, refused

        got = served.stub.GetReservation(
            pb.GetReservationRequest(reservation_id=reservation.id), metadata=HOLDER, timeout=10
        ).reservation
        assert got.state == pb.RESERVATION_STATE_COMMITTED
        assert reservation.id in {r.id for r in served.app.holdings.reservations()}
    finally:
        served.app.close()


def test_binding_failures_are_counted_by_reason(
    grpc_channel_factory: Any, store: Any, tmp_path: Path
) -> None:
    reader = InMemoryMetricReader()
    served = serve_fabric(
        grpc_channel_factory, store, tmp_path, configure_telemetry({}, metric_readers=[reader])
    )
    try:
        assert failures(reader) == {"failed": 0, "timed_out": 0}  # a series from the start
        changes = watch(served)
        failing, lapsing = reserve(served), reserve(served)
        assert report(served, failing, FAILED).released
        end = time.monotonic() + TIMEOUT + 10  # the node's reservations', and their pools'
        while (
            next_kind(
                changes, pb.RESERVATION_CHANGE_KIND_BINDING_FAILED, end - time.monotonic()
            ).reservation_id
            != lapsing.id
        ):
            pass
        # The revoker counts after its revoke, which published the event: the watch may see the
        # event first (CI once read timed_out 0 here), so the count gets a moment to follow.
        settled = time.monotonic() + 5
        while failures(reader) != {"failed": 1, "timed_out": 1} and time.monotonic() < settled:
            time.sleep(0.05)
        assert failures(reader) == {"failed": 1, "timed_out": 1}
    finally:
        served.app.close()


def failures(reader: InMemoryMetricReader) -> dict[str, int]:
    """gpualloc.reservation.binding_failures by reason."""
    data = reader.get_metrics_data()
    counted: dict[str, int] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "gpualloc.reservation.binding_failures":
                    for point in metric.data.data_points:
                        reason = str((point.attributes or {})["reason"])
                        counted[reason] = counted.get(reason, 0) + int(getattr(point, "value", 0))
    return counted
