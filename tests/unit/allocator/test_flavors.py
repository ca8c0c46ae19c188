"""Kueue's flavor modes and fungibility as pure values (services/allocator/core/flavors.py).

`preferred` is Kueue's isPreferred (pkg/scheduler/flavorassigner, TestIsPreferred's rows read
and rewritten), `should_try_next` its shouldTryNextFlavor, `choose_flavor` the loop over a
ClusterQueue's flavors, `quota_standing` the quota's part of fitsResourceQuota."""

from __future__ import annotations

import pytest

from services.allocator.core import (
    FlavorAttempt,
    FlavorMode,
    QuotaStanding,
    choose_flavor,
    preferred,
    quota_standing,
    should_try_next,
)
from services.common.quota.model import (
    FlavorFungibility,
    FlavorPreference,
    QuotaLimits,
    QuotaModel,
    QuotaResource,
    TenantQuota,
    WhenCanBorrow,
    WhenCanPreempt,
)

FIT, PREEMPT, RECLAIM = FlavorMode.FIT, FlavorMode.PREEMPT, FlavorMode.RECLAIM
NO_FIT, NONE = FlavorMode.NO_FIT, FlavorMode.NO_CANDIDATES
TRY, STOP = WhenCanBorrow.TRY_NEXT_FLAVOR, WhenCanBorrow.MAY_STOP_SEARCH
P_TRY, P_STOP = WhenCanPreempt.TRY_NEXT_FLAVOR, WhenCanPreempt.MAY_STOP_SEARCH
BOTH_TRY = FlavorFungibility(TRY, P_TRY)
PREEMPTION_FIRST = FlavorFungibility(TRY, P_TRY, FlavorPreference.PREEMPTION_OVER_BORROWING)
BORROWING_FIRST = FlavorFungibility(TRY, P_TRY, FlavorPreference.BORROWING_OVER_PREEMPTION)


def made(mode: FlavorMode, borrows: int = 0, flavor: str = "f") -> FlavorAttempt[None]:
    return FlavorAttempt("gpus", flavor, mode, borrows)


# (id, a, b, fungibility, whether a is preferred)
PREFERRED = [
    ("default-prioritises-preemption-mode", made(FIT), made(PREEMPT), BOTH_TRY, True),
    ("explicit-borrowing-over-preemption-prioritises-the-mode",
     made(PREEMPT, 1), made(FIT, 2), BORROWING_FIRST, False),
    ("explicit-preemption-over-borrowing-prioritises-borrowing",
     made(PREEMPT, 1), made(FIT, 2), PREEMPTION_FIRST, True),
    ("preemption-over-borrowing-breaks-borrowing-ties-with-the-mode",
     made(PREEMPT, 1), made(FIT, 1), PREEMPTION_FIRST, False),
    ("preemption-over-borrowing-rejects-a-no-candidate-flavor-first",
     made(NONE, 1), made(FIT, 2), PREEMPTION_FIRST, False),
    ("preemption-over-borrowing-prefers-fit-over-a-shallower-no-candidate",
     made(FIT, 2), made(NONE, 1), PREEMPTION_FIRST, True),
    ("no-candidates-is-preferred-to-no-fit", made(NONE, 1), made(NO_FIT), BOTH_TRY, True),
    ("no-fit-is-worse-than-no-candidates", made(NO_FIT), made(NONE, 1), BOTH_TRY, False),
    ("no-candidates-keep-the-borrowing-preference",
     made(NONE, 1), made(NONE, 2), PREEMPTION_FIRST, True),
    ("no-candidates-keep-the-borrowing-preference-in-reverse",
     made(NONE, 2), made(NONE, 1), PREEMPTION_FIRST, False),
    ("reclaim-is-preferred-to-preempt", made(RECLAIM), made(PREEMPT), BOTH_TRY, True),
    ("a-tie-keeps-the-earlier", made(FIT, 1), made(FIT, 1), BOTH_TRY, False),
    ("anything-is-preferred-to-nothing-yet", made(NONE), None, BOTH_TRY, True),
    ("no-fit-is-never-preferred", made(NO_FIT), None, BOTH_TRY, False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("a", "b", "fungibility", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in PREFERRED],
)
def test_preferred_table(
    a: FlavorAttempt[None],
    b: FlavorAttempt[None] | None,
    fungibility: FlavorFungibility,
    expected: bool,
) -> None:
    assert preferred(a, b, fungibility) is expected


# (id, attempt, fungibility, whether the search goes on)
TRY_NEXT = [
    ("no-fit-goes-on", made(NO_FIT), FlavorFungibility(STOP, P_STOP), True),
    ("no-candidates-goes-on", made(NONE), FlavorFungibility(STOP, P_STOP), True),
    ("fit-within-nominal-stops", made(FIT), BOTH_TRY, False),
    ("fit-borrowing-stops-with-may-stop-search", made(FIT, 1), FlavorFungibility(STOP), False),
    ("fit-borrowing-goes-on-with-try-next-flavor", made(FIT, 1), FlavorFungibility(TRY), True),
    ("preempt-goes-on-by-default", made(PREEMPT), FlavorFungibility(), True),
    ("reclaim-goes-on-by-default", made(RECLAIM), FlavorFungibility(), True),
    ("preempt-stops-with-may-stop-search", made(PREEMPT), FlavorFungibility(STOP, P_STOP), False),
    ("preempt-borrowing-goes-on-when-borrowing-tries-next",
     made(PREEMPT, 1), FlavorFungibility(TRY, P_STOP), True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("attempt", "fungibility", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in TRY_NEXT],
)
def test_should_try_next_table(
    attempt: FlavorAttempt[None], fungibility: FlavorFungibility, expected: bool
) -> None:
    assert should_try_next(attempt, fungibility) is expected


# (id, the flavors' attempts in order, fungibility, the flavor chosen, how many were tried)
CHOICES = [
    ("the-first-fit-ends-the-search",
     [made(FIT, 0, "a"), made(FIT, 0, "b")], FlavorFungibility(), "a", 1),
    ("a-preempting-first-then-a-fit",
     [made(PREEMPT, 0, "a"), made(FIT, 0, "b")], FlavorFungibility(), "b", 2),
    ("the-best-of-all-when-none-ends-it",
     [made(PREEMPT, 0, "a"), made(RECLAIM, 0, "b"), made(NONE, 0, "c")],
     FlavorFungibility(), "b", 3),
    ("every-flavor-no-fit-chooses-none",
     [made(NO_FIT, 0, "a"), made(NO_FIT, 0, "b")], FlavorFungibility(), None, 2),
    ("only-no-candidates-chooses-the-first-of-them",
     [made(NO_FIT, 0, "a"), made(NONE, 1, "b"), made(NONE, 1, "c")],
     FlavorFungibility(), "b", 3),
]  # fmt: skip


@pytest.mark.parametrize(
    ("attempts", "fungibility", "expected", "count"),
    [pytest.param(*case[1:], id=case[0]) for case in CHOICES],
)
def test_choose_flavor_table(
    attempts: list[FlavorAttempt[None]],
    fungibility: FlavorFungibility,
    expected: str | None,
    count: int,
) -> None:
    by_flavor = {a.flavor: a for a in attempts}
    choice = choose_flavor(by_flavor, by_flavor.__getitem__, fungibility)
    assert len(choice.tried) == count
    assert (choice.chosen.flavor if choice.chosen else None) == expected
    assert [a.flavor for a in choice.tried if a.chosen] == ([expected] if expected else [])


GPU = 1000
MODEL = QuotaModel(
    (QuotaResource("gpus", ("gpu",)),),
    {
        "a": TenantQuota("a", "c", {"gpus": QuotaLimits(2 * GPU, borrowing_limit=1 * GPU)}),
        "b": TenantQuota("b", "c", {"gpus": QuotaLimits(2 * GPU)}),
    },
)

# (id, a's grant, usage, the standing)
STANDINGS = [
    ("within-nominal", 2, {}, QuotaStanding.WITHIN_NOMINAL),
    ("borrowing", 3, {}, QuotaStanding.BORROWING),
    ("above-what-it-could-ever-get", 4, {}, QuotaStanding.ABOVE_MAX),
    ("short-while-b-holds-its-own", 3, {"b": {"gpus": 2 * GPU}}, QuotaStanding.SHORT),
    ("short-while-it-holds-its-own", 1, {"a": {"gpus": 3 * GPU}}, QuotaStanding.SHORT),
]


@pytest.mark.parametrize(
    ("asks", "usage", "expected"), [pytest.param(*case[1:], id=case[0]) for case in STANDINGS]
)
def test_quota_standing_table(
    asks: int, usage: dict[str, dict[str, int]], expected: QuotaStanding
) -> None:
    assert quota_standing(MODEL, "a", {"gpus": asks * GPU}, usage) is expected
