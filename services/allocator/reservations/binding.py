"""The binding step of a reservation (DRA device binding conditions, KEP-5007), as values.

A reservation whose allocations hold a device result with `bindingConditions` is *binding*
until every one of those conditions has been reported True for that device; it is then
*bound*. A device's `bindingFailureConditions` reported True, or the binding timeout passing
first (kube-scheduler's `bindingTimeout`, 600 s by default), is a binding *failure*: the
allocator then revokes the reservation (`BINDING_REVOKED_BY` names why), as kube-scheduler
clears the allocation of a claim whose binding failed. Reports come as ResourceClaim
`status.devices[].conditions` do upstream: per device, a condition type and its status; the
newest report of a (device, type) wins.

A placement that uses devices of network-attached pools takes one reservation per such pool
besides the node's (reservations/holds.py); every one carries the whole placement. The binding
is the node's reservation's (a device binds to the node): a pool's reservation (its `node` is
`driver/pool`) never waits, and when the node's fails the service releases it too.

Pure: the store keeps the reports (`Reservation.conditions`); the service decides with these
functions and revokes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from services.allocator.reservations.holds import device_key
from services.allocator.reservations.model import DeviceCondition, Reservation

__all__ = [
    "BINDING_REVOKED_BY",
    "DEFAULT_BINDING_TIMEOUT_SECONDS",
    "MAX_DEVICE_CONDITIONS",
    "Binding",
    "binding_devices",
    "binding_of",
    "binding_revocation",
    "is_pool_hold",
    "merge_conditions",
]

DEFAULT_BINDING_TIMEOUT_SECONDS = 600.0  # kube-scheduler's DynamicResources bindingTimeout
MAX_DEVICE_CONDITIONS = 8  # condition types kept per device, as status.devices[].conditions

BINDING_REVOKED_BY = "binding:"  # model.preempted_error words these
"""The prefix of the `by` of a revocation for a failed binding: `binding: <why>`. Stores do not
count such a revocation as a pending preemption; errors and watch changes tell it apart."""


@dataclass(frozen=True)
class Binding:
    """Where a reservation stands. `required`: whether any device has binding conditions;
    `waiting`: (device, condition type) not yet reported True; `failed`: the first (device,
    failure condition type) reported True, if any; `deadline`: when binding times out."""

    required: bool
    waiting: tuple[tuple[str, str], ...] = ()
    failed: tuple[str, str] | None = None
    deadline: float | None = None

    @property
    def bound(self) -> bool:
        return self.required and not self.waiting and self.failed is None

    @property
    def binding(self) -> bool:
        """Still waiting for conditions (not bound, not failed)."""
        return self.required and bool(self.waiting) and self.failed is None

    def timed_out(self, now: float) -> bool:
        return self.binding and self.deadline is not None and now >= self.deadline


def binding_of(reservation: Reservation, timeout_seconds: float) -> Binding:
    """The binding state of `reservation` from its allocations and reported conditions."""
    if is_pool_hold(reservation):
        return Binding(False)
    reported = {(c.device, c.type): c.status for c in reservation.conditions}
    required = False
    waiting: list[tuple[str, str]] = []
    failed: tuple[str, str] | None = None
    for allocation in reservation.allocations:
        for result in allocation.results:
            if not result.binding_conditions:
                continue
            required = True
            device = device_key(result.device_id)
            for condition in result.binding_failure_conditions:
                if failed is None and reported.get((device, condition)) is True:
                    failed = (device, condition)
            for condition in result.binding_conditions:
                wanted = (device, condition)
                if reported.get(wanted) is not True and wanted not in waiting:
                    waiting.append(wanted)
    deadline = reservation.created_at + timeout_seconds if required else None
    return Binding(required, tuple(waiting), failed, deadline)


def is_pool_hold(reservation: Reservation) -> bool:
    """A network-attached pool's reservation of a placement (`node` is `driver/pool`)."""
    return "/" in reservation.node


def binding_devices(reservation: Reservation) -> frozenset[str]:
    """The devices of `reservation` that have binding conditions (`driver/pool/device`)."""
    return frozenset(
        device_key(r.device_id)
        for a in reservation.allocations
        for r in a.results
        if r.binding_conditions or r.binding_failure_conditions
    )


def merge_conditions(
    have: Sequence[DeviceCondition], reported: Iterable[DeviceCondition]
) -> tuple[DeviceCondition, ...]:
    """`have` with `reported` applied: the newest status of each (device, type) wins; order
    is first report first."""
    merged = {(c.device, c.type): c for c in have}
    for condition in reported:
        merged[(condition.device, condition.type)] = condition
    return tuple(merged.values())


def binding_revocation(binding: Binding) -> str:
    """The `by` of the revocation of a failed or timed-out binding."""
    if binding.failed is not None:
        device, condition = binding.failed
        return f"{BINDING_REVOKED_BY} binding failed: device {device} reported {condition}"
    return f"{BINDING_REVOKED_BY} binding timed out waiting for " + ", ".join(
        f"{device} {condition}" for device, condition in binding.waiting
    )
