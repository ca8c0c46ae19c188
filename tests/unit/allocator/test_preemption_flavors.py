"""The planner on flavored quotas (core/preemption.py): another tenant's reservation is a
reclaim candidate only when it counts a resource the grant needs, as Kueue's candidates must
use a flavor/resource needing preemption (WorkloadUsesResources): a borrower of ada gives a
grant on hopper nothing back."""

from __future__ import annotations

import pytest

from services.allocator.core import Holding, PreemptionContext, preemption_candidates
from services.common.quota.model import (
    PriorityClass,
    QuotaLimits,
    QuotaModel,
    QuotaResource,
    TenantQuota,
)

GPU = 1000
HOPPER, ADA = "gpus/hopper", "gpus/ada"
MODEL = QuotaModel(
    (
        QuotaResource(HOPPER, ("gpu",), base="gpus", flavor="hopper"),
        QuotaResource(ADA, ("gpu",), base="gpus", flavor="ada"),
    ),
    {
        "a": TenantQuota("a", "c", {HOPPER: QuotaLimits(2 * GPU), ADA: QuotaLimits(2 * GPU)}),
        "b": TenantQuota("b", "c", {HOPPER: QuotaLimits(2 * GPU), ADA: QuotaLimits(0)}),
    },
)
STANDARD = PriorityClass("standard", 100)
# b borrows a's 2 ada GPUs and holds 2 hopper GPUs within its nominal
HOLDINGS = [
    Holding("b-ada-1", "b", STANDARD, 1.0, {ADA: GPU}),
    Holding("b-ada-2", "b", STANDARD, 2.0, {ADA: GPU}),
    Holding("b-hopper", "b", STANDARD, 3.0, {HOPPER: 2 * GPU}),
]
USAGE = {"b": {ADA: 2 * GPU, HOPPER: 2 * GPU}}


@pytest.mark.parametrize(
    ("wanted", "expected"),
    [
        pytest.param(ADA, ["b-ada-2", "b-ada-1"], id="a-grant-on-ada-reclaims-the-ada-borrower"),
        pytest.param(HOPPER, [], id="a-grant-on-hopper-takes-no-borrower-of-ada"),
    ],
)
def test_reclaim_candidates_count_what_the_grant_needs(wanted: str, expected: list[str]) -> None:
    context = PreemptionContext(MODEL, "a", STANDARD, {wanted: GPU}, HOLDINGS, USAGE)
    assert [c.holding.id for c in preemption_candidates(context)] == expected
