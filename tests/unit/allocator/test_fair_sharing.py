"""Fair sharing's pure parts (services/allocator/core/quota/fair_sharing.py): dominant resource
shares over the cohort tree, the two preemption strategies, and usage decayed with a half-life.

The share rows are Kueue's TestDominantResourceShare (pkg/cache/scheduler/fair_sharing_test.go)
rewritten in gpualloc's model: a ClusterQueue is a tenant, `cpu` and `example.com/gpu` are the
quota resources `cpu` and `gpu`, a flavor of cpu is the flavored resource `cpu/<flavor>`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

import pytest

from services.allocator.core import (
    ConsumedUsage,
    Share,
    decay,
    decayed_score,
    resample,
    share_of,
    strategy_allows,
)
from services.common.quota.model import (
    CohortQuota,
    PreemptionStrategy,
    QuotaLimits,
    QuotaModel,
    QuotaResource,
    TenantQuota,
)
from services.common.quota.tree import cohort_node, tenant_node

CPU = QuotaResource("cpu", ("cpu",))
GPU = QuotaResource("gpu", ("gpu",))


def flavor(name: str) -> QuotaResource:
    return QuotaResource(f"cpu/{name}", ("cpu",), base="cpu", flavor=name)


def quotas(nominal: Mapping[str, float] | None = None, **more: float) -> dict[str, QuotaLimits]:
    return {name: QuotaLimits(round(n * 1000)) for name, n in {**(nominal or {}), **more}.items()}


def shares(
    resources: Sequence[QuotaResource],
    tenants: Sequence[TenantQuota],
    cohorts: Sequence[CohortQuota],
    usage: Mapping[str, float],
    extra: Mapping[str, float],
) -> dict[str, tuple[int, str]]:
    model = QuotaModel(
        tuple(resources), {t.tenant: t for t in tenants}, cohorts={c.name: c for c in cohorts}
    )
    used = {"cq": {name: round(v * 1000) for name, v in usage.items()}}
    wanted = {name: round(v * 1000) for name, v in extra.items()}
    found = {}
    for t in tenants:
        share = share_of(model, tenant_node(t.tenant), used, wanted if t.tenant == "cq" else None)
        found[t.tenant] = (share.rounded(), share.dominant)
    for name in model.cohort_names():
        share = share_of(model, cohort_node(name), used)
        found[name] = (share.rounded(), share.dominant)
    return found


LENDER = TenantQuota("lending-cq", "test-cohort", quotas(cpu=8, gpu=5))
INF = 2**63 - 1

SHARES = [
    # (id, resources, tenants, cohorts, cq's usage, the grant it asks, expected share and
    # dominant resource of every tenant and cohort)
    (
        "no-cohort",
        [CPU, GPU],
        [TenantQuota("cq", "", quotas(cpu=2000, gpu=5))],
        [],
        {"cpu": 1, "gpu": 2},
        {},
        {"cq": (0, "")},
    ),
    (
        "usage-below-nominal",
        [CPU, GPU],
        [TenantQuota("cq", "test-cohort", quotas(cpu=2, gpu=5)), LENDER],
        [],
        {"cpu": 1, "gpu": 2},
        {},
        {"cq": (0, ""), "lending-cq": (0, ""), "test-cohort": (0, "")},
    ),
    (
        "usage-above-nominal",  # (7-5)*1000/10
        [CPU, GPU],
        [TenantQuota("cq", "test-cohort", quotas(cpu=2, gpu=5)), LENDER],
        [],
        {"cpu": 3, "gpu": 7},
        {},
        {"cq": (200, "gpu"), "lending-cq": (0, ""), "test-cohort": (0, "")},
    ),
    (
        "slightly-above-nominal-in-a-large-cohort",  # 1*1000/1500 rounded up
        [GPU],
        [
            TenantQuota("cq", "test-cohort", quotas(gpu=500)),
            TenantQuota("lending-cq", "test-cohort", quotas(gpu=1000), weight=Fraction(300)),
        ],
        [],
        {"gpu": 501},
        {},
        {"cq": (1, "gpu"), "lending-cq": (0, ""), "test-cohort": (0, "")},
    ),
    (
        "way-above-nominal-with-large-weights",  # 300*1000/1500/300
        [GPU],
        [
            TenantQuota("cq", "test-cohort", quotas(gpu=500), weight=Fraction(300)),
            TenantQuota("lending-cq", "test-cohort", quotas(gpu=1000), weight=Fraction(300)),
        ],
        [],
        {"gpu": 800},
        {},
        {"cq": (1, "gpu"), "lending-cq": (0, ""), "test-cohort": (0, "")},
    ),
    (
        "one-resource-above-nominal",  # (3-2)*1000/10
        [CPU, GPU],
        [TenantQuota("cq", "test-cohort", quotas(cpu=2, gpu=5)), LENDER],
        [],
        {"cpu": 3, "gpu": 3},
        {},
        {"cq": (100, "cpu"), "lending-cq": (0, ""), "test-cohort": (0, "")},
    ),
    (
        "with-the-grant-above-nominal",  # (1+4-2)*1000/10
        [CPU, GPU],
        [TenantQuota("cq", "test-cohort", quotas(cpu=2, gpu=5)), LENDER],
        [],
        {"cpu": 1, "gpu": 2},
        {"cpu": 4, "gpu": 4},
        {"cq": (300, "cpu"), "lending-cq": (0, ""), "test-cohort": (0, "")},
    ),
    (
        "a-resource-nobody-lends-is-not-dominant",  # gpu: lendable 0
        [CPU, GPU],
        [
            TenantQuota("cq", "test-cohort", {**quotas(cpu=2), "gpu": QuotaLimits(2000, None, 0)}),
            TenantQuota(
                "lending-cq", "test-cohort", {**quotas(cpu=8), "gpu": QuotaLimits(64000, None, 0)}
            ),
        ],
        [],
        {"cpu": 1, "gpu": 1},
        {"cpu": 4, "gpu": 4},
        {"cq": (300, "cpu"), "lending-cq": (0, ""), "test-cohort": (0, "")},
    ),
    (
        "flavors-of-one-resource-add-up",  # ((15+10-20)+0)*1000/200: spot under nominal
        [flavor("on-demand"), flavor("spot"), flavor("default")],
        [
            TenantQuota("cq", "test-cohort", quotas({"cpu/on-demand": 20, "cpu/spot": 80})),
            TenantQuota("lending-cq", "test-cohort", quotas({"cpu/default": 100})),
        ],
        [],
        {"cpu/on-demand": 15, "cpu/spot": 5},
        {"cpu/on-demand": 10},
        {"cq": (25, "cpu"), "lending-cq": (0, ""), "test-cohort": (0, "")},
    ),
    (
        "an-integer-weight-divides",  # ((7-5)*1000/10)/2
        [GPU],
        [
            TenantQuota("cq", "test-cohort", quotas(gpu=5), weight=Fraction(2)),
            TenantQuota("lending-cq", "test-cohort", quotas(gpu=5)),
        ],
        [],
        {"gpu": 7},
        {},
        {"cq": (100, "gpu"), "lending-cq": (0, ""), "test-cohort": (0, "")},
    ),
    (
        "a-decimal-weight-multiplies",  # ((7-5)*1000/10)/(1/2)
        [GPU],
        [
            TenantQuota("cq", "test-cohort", quotas(gpu=5), weight=Fraction(1, 2)),
            TenantQuota("lending-cq", "test-cohort", quotas(gpu=5)),
        ],
        [],
        {"gpu": 7},
        {},
        {"cq": (400, "gpu"), "lending-cq": (0, ""), "test-cohort": (0, "")},
    ),
    (
        "a-zero-weight-borrowing-is-infinite",
        [GPU],
        [
            TenantQuota("cq", "test-cohort", quotas(gpu=5), weight=Fraction(0)),
            TenantQuota("lending-cq", "test-cohort", quotas(gpu=10)),
        ],
        [],
        {"gpu": 7},
        {},
        {"cq": (INF, "gpu"), "lending-cq": (0, ""), "test-cohort": (0, "")},
    ),
    (
        "a-cohort-has-a-share-too",  # cq: 5/50*1000; child-cohort: the same over its weight 2
        [GPU],
        [TenantQuota("cq", "child-cohort", quotas(gpu=5))],
        [
            CohortQuota("child-cohort", "root", {}, Fraction(2)),
            CohortQuota("root", "", quotas(gpu=45)),
        ],
        {"gpu": 10},
        {},
        {"cq": (100, "gpu"), "child-cohort": (50, "gpu"), "root": (0, "")},
    ),
    (
        "quota-only-at-the-root",  # 10/50*1000, and over the cohort's weight 2
        [GPU],
        [TenantQuota("cq", "child-cohort", quotas(gpu=0))],
        [
            CohortQuota("child-cohort", "root", {}, Fraction(2)),
            CohortQuota("root", "", quotas(gpu=50)),
        ],
        {"gpu": 10},
        {},
        {"cq": (200, "gpu"), "child-cohort": (100, "gpu"), "root": (0, "")},
    ),
    (
        # the cohort can lend cq only 10 (its borrowing limit); the root can lend it 50
        "a-borrowing-limit-shrinks-what-can-be-lent",
        [GPU],
        [TenantQuota("cq", "child-cohort", quotas(gpu=0))],
        [
            CohortQuota("child-cohort", "root", {"gpu": QuotaLimits(0, 10_000)}),
            CohortQuota("root", "", quotas(gpu=50)),
        ],
        {"gpu": 10},
        {},
        {"cq": (1000, "gpu"), "child-cohort": (200, "gpu"), "root": (0, "")},
    ),
]


@pytest.mark.parametrize(
    ("resources", "tenants", "cohorts", "usage", "extra", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in SHARES],
)
def test_dominant_resource_share_table(
    resources: list[QuotaResource],
    tenants: list[TenantQuota],
    cohorts: list[CohortQuota],
    usage: dict[str, float],
    extra: dict[str, float],
    expected: dict[str, tuple[int, str]],
) -> None:
    assert shares(resources, tenants, cohorts, usage, extra) == expected


# --- the two strategies -------------------------------------------------------------------------


def share(value: float, weight: float = 1) -> Share:
    return Share(Fraction(value), Fraction(weight), "gpu", value > 0)


STRATEGIES = [
    # (id, strategy, preemptor's share with its grant, victim side's before, after, allowed)
    ("final-share-equal-is-allowed", "LessThanOrEqualToFinalShare", share(100), share(300),
     share(100), True),
    ("final-share-below-is-refused", "LessThanOrEqualToFinalShare", share(200), share(300),
     share(100), False),
    ("initial-share-above-is-allowed", "LessThanInitialShare", share(200), share(300),
     share(100), True),
    ("initial-share-equal-is-refused", "LessThanInitialShare", share(300), share(300),
     share(100), False),
    ("an-infinite-victim-share-loses-to-any-finite", "LessThanOrEqualToFinalShare",
     share(10_000), share(50, 0), share(10, 0), True),
    ("an-infinite-preemptor-share-never-wins", "LessThanInitialShare", share(1, 0),
     share(10_000), share(10_000), False),
    ("two-infinite-shares-compare-by-ratio", "LessThanInitialShare", share(20, 0), share(30, 0),
     share(30, 0), True),
    ("zero-weight-not-borrowing-is-zero", "LessThanOrEqualToFinalShare", share(0, 0), share(1),
     share(0), True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("strategy", "preemptor", "before", "after", "allowed"),
    [pytest.param(*case[1:], id=case[0]) for case in STRATEGIES],
)
def test_strategy_table(
    strategy: str, preemptor: Share, before: Share, after: Share, allowed: bool
) -> None:
    assert strategy_allows(PreemptionStrategy(strategy), preemptor, before, after) is allowed


# --- usage with a half-life --------------------------------------------------------------------

HOUR = 3600.0

DECAY = [
    # (id, old decayed usage, held now, seconds since the last sample, half-life, expected)
    ("one-half-life-halves-the-gap", {"gpus": 8000.0}, {"gpus": 0}, HOUR, HOUR, {"gpus": 4000.0}),
    ("two-half-lives-quarter-it", {"gpus": 8000.0}, {}, 2 * HOUR, HOUR, {"gpus": 2000.0}),
    ("converges-on-what-is-held", {}, {"gpus": 4000}, HOUR, HOUR, {"gpus": 2000.0}),
    ("no-time-no-change", {"gpus": 8000.0}, {"gpus": 0}, 0.0, HOUR, {"gpus": 8000.0}),
    ("a-half-life-of-0-keeps-only-the-present", {"gpus": 8000.0}, {"gpus": 1000}, 60.0, 0.0,
     {"gpus": 1000.0}),
    ("time-never-runs-backwards", {"gpus": 8000.0}, {"gpus": 0}, -HOUR, HOUR, {"gpus": 8000.0}),
    ("resources-decay-on-their-own", {"gpus": 8000.0}, {"mig": 2000}, HOUR, HOUR,
     {"gpus": 4000.0, "mig": 1000.0}),
    ("nothing-left-is-dropped", {"gpus": 8000.0}, {}, 60.0, 0.0, {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("old", "held", "elapsed", "half_life", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in DECAY],
)
def test_decay_table(
    old: dict[str, float],
    held: dict[str, int],
    elapsed: float,
    half_life: float,
    expected: dict[str, float],
) -> None:
    found = decay(old, held, elapsed, half_life)
    assert found.keys() == expected.keys()
    for name, value in expected.items():
        assert math.isclose(found[name], value)


def test_sampling_every_interval_is_kueues_moving_average() -> None:
    """Sampled every 5 minutes with a 10-minute half-life, a tenant holding 8 GPUs for an hour
    approaches 8 (1 - 0.5 ** 6 of it), and a new tenant starts from nothing."""
    consumed: dict[str, ConsumedUsage] = {}
    for minute in range(0, 65, 5):
        consumed = resample(consumed, {"a": {"gpus": 8000}}, ["a", "b"], minute * 60.0, 600.0)
    assert math.isclose(consumed["a"].amounts["gpus"], 8000 * (1 - 0.5**6))
    assert consumed["a"].at == 3600.0 and consumed["b"].amounts == {}
    assert resample(consumed, {}, ["a"], 60.0, 600.0)["a"].at == 3600.0  # never back in time


SCORES = [
    # (id, decayed usage, resource weights, tenant weight, expected)
    ("sum-in-units", {"gpus": 2000.0, "mig": 500.0}, {}, Fraction(1), 2.5),
    ("resource-weights", {"gpus": 2000.0, "mig": 500.0}, {"mig": Fraction(4)}, Fraction(1), 4.0),
    ("tenant-weight-divides", {"gpus": 2000.0}, {}, Fraction(2), 1.0),
    ("flavors-weigh-as-their-resource", {"gpus/hopper": 1000.0}, {"gpus": Fraction(3)},
     Fraction(1), 3.0),
    ("zero-weight-is-infinite", {"gpus": 1000.0}, {}, Fraction(0), None),
    ("zero-weight-unused-is-zero", {}, {}, Fraction(0), 0.0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("amounts", "weights", "tenant_weight", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in SCORES],
)
def test_decayed_score_table(
    amounts: dict[str, float],
    weights: dict[str, Fraction],
    tenant_weight: Fraction,
    expected: float | None,
) -> None:
    base_of = {"gpus/hopper": "gpus"}
    assert decayed_score(amounts, weights, base_of, tenant_weight) == expected
