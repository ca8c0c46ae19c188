"""One request's CEL spending (CelMeter): a budget over all its evaluations, and a stop check
that ends a long evaluation part-way — values in, no clock in the core."""

from __future__ import annotations

import pytest

from services.cel.selectors import (
    CelBudgetExhausted,
    CelDevice,
    CelMeter,
    SelectorCache,
)
from services.cel.values import STOP_CHECK_UNITS
from services.common.errors import DeadlineExceeded


def costly(size: int, constant: int = 0) -> str:
    items = ", ".join(str(i) for i in range(size))
    return (
        f"[{items}].all(x, [{items}].all(y, [{items}].all(z, "
        f"x + y + z >= {constant} && device.driver == 'gpu.nvidia.com')))"
    )


DEVICE = CelDevice("gpu.nvidia.com", {}, {})


def test_a_stop_check_ends_an_evaluation_part_way():
    looks: list[int] = []

    def stop() -> bool:
        looks.append(1)
        return len(looks) > 3  # the 4th look says stop (the 1st is before evaluating)

    meter = CelMeter(10_000_000, stop)
    selector = SelectorCache().compile(costly(40))
    with pytest.raises(DeadlineExceeded):
        selector.matches(DEVICE, meter)
    spent = meter.limit - meter.remaining
    assert 2 * STOP_CHECK_UNITS <= spent <= 4 * STOP_CHECK_UNITS  # stopped, not finished
    assert selector.matches(DEVICE, CelMeter())  # not remembered as the profile's outcome


def test_the_budget_covers_every_evaluation_of_the_request():
    cache = SelectorCache()
    first, second = cache.compile(costly(20, 0)), cache.compile(costly(20, -1))
    meter = CelMeter(100_000)
    assert first.matches(DEVICE, meter)
    spent = meter.limit - meter.remaining
    assert 40_000 < spent < 100_000
    with pytest.raises(CelBudgetExhausted, match="100,000 cost units"):
        second.matches(DEVICE, meter)
    assert second.matches(DEVICE, CelMeter())  # a request with budget left gets the answer
    assert first.matches(DEVICE, CelMeter(1))  # a remembered profile costs nothing


def test_without_a_meter_only_the_per_expression_limit_applies():
    assert SelectorCache().compile(costly(20)).matches(DEVICE)
