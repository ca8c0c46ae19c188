"""PlanMemo (app/placing.py): a unary solve's plan found again for the same claim objects and
classes, never for others; a claim that does not fit the classes raises every time."""

from __future__ import annotations

import pytest

from services.allocator.app.placing import PlanMemo
from services.allocator.core import build_plan
from services.common.dra.model import DeviceClass, ResourceClaim
from services.common.errors import InvalidArgument
from tests.builders import claim, classes, cls

GPU = cls("gpu", "device.driver == 'gpu.example.com'")
CLASSES = classes(GPU)
ONE = claim("one").request("gpu").build()
Asked = tuple[tuple[ResourceClaim, ...], dict[str, DeviceClass]]  # a solve's claims and classes
TWO = claim("two").request("gpu", count=2).build()


@pytest.mark.parametrize(
    ("first", "again", "same"),
    [
        pytest.param(((ONE,), CLASSES), ((ONE,), CLASSES), True, id="same-claims-same-classes"),
        pytest.param(((ONE,), CLASSES), ((TWO,), CLASSES), False, id="other-claims"),
        pytest.param(((ONE, TWO), CLASSES), ((TWO, ONE), CLASSES), False, id="other-order"),
        pytest.param(((ONE,), CLASSES), ((ONE,), dict(CLASSES)), False, id="equal-other-classes"),
        pytest.param(
            ((ONE,), CLASSES),
            ((claim("one").request("gpu").build(),), CLASSES),
            False,
            id="equal-other-claim-object",
        ),
    ],
)
def test_a_plan_is_found_again_only_for_the_same_claims_and_classes(
    first: Asked, again: Asked, same: bool
) -> None:
    memo = PlanMemo()
    plan = memo.plan(*first)
    assert (memo.plan(*again) is plan) is same
    rebuilt = build_plan(*again)  # what the solve would have built: the same plan either way
    assert [c.label for c in memo.plan(*again).claims] == [c.label for c in rebuilt.claims]
    assert [a.count for a in memo.plan(*again).alternatives()] == [
        a.count for a in rebuilt.alternatives()
    ]


def test_a_claim_that_does_not_fit_the_classes_raises_every_time() -> None:
    memo = PlanMemo()
    bad = claim("bad").request("gpu", "no-such-class").build()
    for _ in range(2):
        with pytest.raises(InvalidArgument):
            memo.plan((bad,), CLASSES)


def test_the_memo_forgets_the_least_recently_used_past_its_limit() -> None:
    memo = PlanMemo(limit=2)
    one = memo.plan((ONE,), CLASSES)
    two = memo.plan((TWO,), CLASSES)
    assert memo.plan((ONE,), CLASSES) is one  # ONE used last: TWO is forgotten next
    memo.plan((ONE, TWO), CLASSES)
    assert memo.plan((ONE,), CLASSES) is one
    assert memo.plan((TWO,), CLASSES) is not two
