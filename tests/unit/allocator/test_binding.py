"""The binding state of a reservation (reservations/binding.py) against a table: what waits,
what failed, when it is bound, and what a pool's reservation of the placement waits for."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.allocator.reservations.binding import (
    Binding,
    binding_of,
    binding_revocation,
    merge_conditions,
)
from services.allocator.reservations.model import (
    DeviceCondition,
    Hold,
    Reservation,
    ReservationState,
)
from services.common.dra.model import AllocationResult, DeviceRequestAllocationResult

GPU0, GPU1 = "gpu.nvidia.com/fabric/gpu-0", "gpu.nvidia.com/fabric/gpu-1"


def result(device: str, conditions: tuple[str, ...] = (), failures: tuple[str, ...] = ()):
    driver, pool, name = device.split("/")
    return DeviceRequestAllocationResult(
        "gpu", driver, pool, name, binding_conditions=conditions,
        binding_failure_conditions=failures,
    )  # fmt: skip


def reservation(*results: DeviceRequestAllocationResult, node: str = "node-1") -> Reservation:
    return Reservation(
        id=f"res-1@{node}",
        owner="alice",
        node=node,
        claim_names=("c",),
        allocations=(AllocationResult(results),),
        hold=Hold(),
        state=ReservationState.RESERVED,
        fencing_token=1,
        created_at=100.0,
        expires_at=400.0,
    )


def up(device: str, kind: str, status: bool = True) -> DeviceCondition:
    return DeviceCondition(device, kind, status)


TWO = reservation(result(GPU0, ("Ready",), ("Failed",)), result(GPU1, ("Ready", "Linked")))
CASES = [
    pytest.param(reservation(result(GPU0)), (), Binding(False), id="no-conditions-never-waits"),
    pytest.param(TWO, (), Binding(True, ((GPU0, "Ready"), (GPU1, "Ready"), (GPU1, "Linked")),
                 deadline=700.0), id="nothing-reported-waits-for-all"),
    pytest.param(TWO, (up(GPU0, "Ready"), up(GPU1, "Ready"), up(GPU1, "Linked", False)),
                 Binding(True, ((GPU1, "Linked"),), deadline=700.0), id="false-still-waits"),
    pytest.param(TWO, (up(GPU0, "Ready"), up(GPU1, "Ready"), up(GPU1, "Linked")),
                 Binding(True, deadline=700.0), id="all-true-is-bound"),
    pytest.param(TWO, (up(GPU0, "Ready", False), up(GPU0, "Failed")),
                 Binding(True, ((GPU0, "Ready"), (GPU1, "Ready"), (GPU1, "Linked")),
                         (GPU0, "Failed"), 700.0), id="a-failure-condition-true-failed"),
    pytest.param(TWO, (up(GPU1, "Failed"),),
                 Binding(True, ((GPU0, "Ready"), (GPU1, "Ready"), (GPU1, "Linked")),
                         deadline=700.0), id="a-failure-type-of-another-device-is-not-one"),
    pytest.param(replace(TWO, node="gpu.nvidia.com/fabric", id="res-1@gpu.nvidia.com/fabric"),
                 (), Binding(False), id="a-pools-reservation-never-waits"),
]  # fmt: skip


@pytest.mark.parametrize(("held", "reported", "want"), CASES)
def test_binding_of(
    held: Reservation, reported: tuple[DeviceCondition, ...], want: Binding
) -> None:
    got = binding_of(replace(held, conditions=reported), 600.0)
    assert got == want
    assert got.bound == (want.required and not want.waiting and want.failed is None)


def test_timed_out_only_while_binding_and_after_the_deadline() -> None:
    binding = binding_of(TWO, 600.0)
    assert not binding.timed_out(699.9)
    assert binding.timed_out(700.0)
    assert "binding timed out waiting for " + GPU0 + " Ready" in binding_revocation(binding)
    bound = binding_of(
        replace(TWO, conditions=(up(GPU0, "Ready"), up(GPU1, "Ready"), up(GPU1, "Linked"))), 600.0
    )
    assert not bound.timed_out(10_000.0)


def test_newest_report_wins_in_first_report_order() -> None:
    merged = merge_conditions(
        (up(GPU0, "Ready", False), up(GPU1, "Ready")),
        (up(GPU0, "Ready"), up(GPU0, "Failed", False)),
    )
    assert merged == (up(GPU0, "Ready"), up(GPU1, "Ready"), up(GPU0, "Failed", False))
