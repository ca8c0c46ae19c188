"""Consumable capacity (DRAConsumableCapacity): how much of a device one allocation consumes.

Upstream `structured/internal/experimental/consumable_capacity.go`, as pure functions over
exact fractions. A request names capacities it wants; every capacity of the device is consumed
by some amount: the request rounded up by the capacity's `requestPolicy`, or, when not
requested, the policy's default, else the whole capacity. Integer arithmetic for `validRange`
steps uses upstream's `Quantity.Value()` (rounded up to an integer), as upstream does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

from services.allocator.core.explain import Shortage, ShortageKind
from services.common.dra.model import (
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    DeviceCapacity,
)
from services.common.dra.quantity import Quantity, QuantityFormat

__all__ = [
    "capacity_problem",
    "consumed_amount",
    "consumed_capacity",
    "violates_policy",
]


def consumed_amount(requested: Quantity | None, capacity: DeviceCapacity) -> Quantity:
    """Upstream `calculateConsumedCapacity`."""
    policy = capacity.request_policy
    if requested is None:
        if policy is not None and policy.default is not None:
            return policy.default
        return capacity.value
    if policy is None:
        return requested
    if policy.valid_range is not None:
        return _round_up_range(requested, policy.valid_range)
    if policy.valid_values:
        return next((v for v in policy.valid_values if requested <= v), requested)
    return requested


def _round_up_range(requested: Quantity, valid_range: CapacityRequestPolicyRange) -> Quantity:
    if requested < valid_range.min:
        return valid_range.min
    step = _int_value(valid_range.step) if valid_range.step is not None else 0
    if step <= 0:
        return requested
    low = _int_value(valid_range.min)
    steps = math.ceil(Fraction(_int_value(requested) - low, step))
    return Quantity(Fraction(low + step * steps), QuantityFormat.BINARY_SI)


def violates_policy(amount: Quantity, policy: CapacityRequestPolicy | None) -> bool:
    """Upstream `violatesPolicy`: the default is always fine; a range checks max and step (not
    min, as upstream); a value list must contain the amount."""
    if policy is None:
        return False
    if policy.default is not None and amount == policy.default:
        return False
    if policy.valid_range is not None:
        valid_range = policy.valid_range
        if valid_range.max is not None and amount > valid_range.max:
            return True
        if valid_range.step is not None:
            step = _int_value(valid_range.step)
            return step != 0 and (_int_value(amount) - _int_value(valid_range.min)) % step != 0
        return False
    if policy.valid_values:
        return amount not in policy.valid_values
    return False


def consumed_capacity(
    requests: Mapping[str, Quantity], capacity: Mapping[str, DeviceCapacity]
) -> dict[str, Quantity]:
    """Upstream `GetConsumedCapacityFromRequest`: one amount per capacity of the device."""
    return {name: consumed_amount(requests.get(name), cap) for name, cap in capacity.items()}


def capacity_problem(
    requests: Mapping[str, Quantity],
    capacity: Mapping[str, DeviceCapacity],
    already: Mapping[str, Fraction],
) -> Shortage | None:
    """Upstream `CmpRequestOverCapacity`; None when the request fits, else why not.

    `already` is what other allocations (and picks earlier in this search) consume of each
    capacity; it is empty for devices that are not multi-allocatable.
    """
    for name in sorted(requests):
        if name not in capacity:
            return Shortage(ShortageKind.MISSING, name)
    for name, cap in sorted(capacity.items()):
        amount = consumed_amount(requests.get(name), cap)
        if violates_policy(amount, cap.request_policy):
            return Shortage(ShortageKind.NOT_ALLOWED, name, needed=str(amount))
        used = already.get(name, Fraction(0))
        if used + amount.value > cap.value.value:
            free = Quantity(cap.value.value - used, cap.value.format)
            return Shortage(ShortageKind.SHORT, name, needed=str(amount), free=str(free))
    return None


def _int_value(quantity: Quantity) -> int:
    """Upstream `Quantity.Value()`: the value rounded up, away from zero, to an integer."""
    value = quantity.value
    return math.ceil(value) if value >= 0 else math.floor(value)
