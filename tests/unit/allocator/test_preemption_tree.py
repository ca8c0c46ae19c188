"""Preemption over hierarchical cohorts (core/preemption.py's classical planner on a cohort
tree): Kueue's hierarchical preemption cases, and a brute-force model of its guarantees.

The rows are Kueue's TestHierarchicalPreemptions (pkg/scheduler/preemption/
preemption_hierarchical_test.go) rewritten in gpualloc's model: a ClusterQueue is a tenant, a
Cohort a cohort, an admitted workload a reservation of its priority, `cpu` the quota resource
`gpus`; the grant always finds devices (these cases are about quota only). Every tenant's
preemption policy is withinClusterQueue LowerPriority, reclaimWithinCohort Any unless a row
says otherwise.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.allocator.core import (
    Candidate,
    Holding,
    PreemptionContext,
    PreemptionReason,
    admit,
    plan_preemption,
)
from services.common.quota.model import (
    BorrowWithinCohort,
    CohortQuota,
    PreemptionPolicy,
    PriorityClass,
    QuotaLimits,
    QuotaModel,
    QuotaResource,
    ReclaimWithinCohort,
    TenantQuota,
    Usage,
    WithinTenant,
)

GPU = 1000
GPUS = QuotaResource("gpus", ("gpu.nvidia.com",))
MEMORY = QuotaResource("memory", ("gpu.nvidia.com",), counter="memory")
RECLAIM = PreemptionReason.RECLAIM
WHILE_BORROWING = PreemptionReason.RECLAIM_WHILE_BORROWING
PRIORITY = PreemptionReason.PRIORITY
KUEUE = PreemptionPolicy(WithinTenant.LOWER_PRIORITY, ReclaimWithinCohort.ANY)
BORROWS_BELOW_0 = PreemptionPolicy(
    WithinTenant.LOWER_PRIORITY, ReclaimWithinCohort.ANY, BorrowWithinCohort.LOWER_PRIORITY, 0
)
LOWER_BORROWS_BELOW_0 = PreemptionPolicy(
    WithinTenant.LOWER_PRIORITY,
    ReclaimWithinCohort.LOWER_PRIORITY,
    BorrowWithinCohort.LOWER_PRIORITY,
    0,
)


def c(
    name: str, parent: str = "", gpus: float | None = None, memory: float | None = None
) -> CohortQuota:
    quotas = {} if gpus is None else {"gpus": QuotaLimits(round(gpus * GPU))}
    if memory is not None:
        quotas["memory"] = QuotaLimits(round(memory * GPU))
    return CohortQuota(name, parent, quotas)


def q(
    name: str,
    cohort: str,
    gpus: float = 0,
    lend: float | None = None,
    policy: PreemptionPolicy = KUEUE,
    memory: float | None = None,
) -> TenantQuota:
    lending = None if lend is None else round(lend * GPU)
    limits = {"gpus": QuotaLimits(round(gpus * GPU), None, lending)}
    if memory is not None:
        limits["memory"] = QuotaLimits(round(memory * GPU))
    return TenantQuota(name, cohort, limits, policy)


def w(name: str, tenant: str, priority: int, gpus: float, memory: float = 0) -> Holding:
    amounts = {"gpus": round(gpus * GPU)}
    if memory:
        amounts["memory"] = round(memory * GPU)
    return Holding(name, tenant, PriorityClass(f"p{priority}", priority), 1000.0, amounts)


CASES = [
    # (id, cohorts, tenants, holdings, (preemptor's tenant, priority, gpus[, memory]),
    #  expected victims and their reasons)
    (
        # r -> c(2) -> q(0); r -> q_borrowing(0)
        "preempt-with-hierarchical-advantage",
        [c("r"), c("c", "r", 2)],
        [q("q", "c"), q("q_borrowing", "r")],
        [w("admitted2", "q_borrowing", 0, 2)],
        ("q", 0, 2),
        {"admitted2": RECLAIM},
    ),
    (
        "avoid-tenants-within-nominal",
        [c("r"), c("c", "r", 2)],
        [q("q_nominal", "r", 2), q("q", "c"), q("q_borrowing", "r")],
        [w("admitted1", "q_nominal", -10, 2), w("admitted2", "q_borrowing", 0, 2)],
        ("q", 0, 2),
        {"admitted2": RECLAIM},
    ),
    (
        "preempt-several-of-higher-priority-with-hierarchical-advantage",
        [c("r"), c("c", "r", 2)],
        [q("q", "c"), q("q_borrowing", "r")],
        [w("admitted1", "q_borrowing", 1, 1), w("admitted2", "q_borrowing", 2, 1)],
        ("q", 0, 2),
        {"admitted1": RECLAIM, "admitted2": RECLAIM},
    ),
    (
        "preempt-in-the-cohort-while-borrowing-and-in-its-own-tenant",
        [c("r"), c("c", "r", 3)],
        [q("q", "c", policy=BORROWS_BELOW_0), q("q_same_cohort", "c")],
        [
            w("admitted_not_preemptible", "q_same_cohort", 1, 1),
            w("admitted_preemptible", "q_same_cohort", 0, 2),
            w("admitted_own_queue", "q", -1, 1),
        ],
        ("q", 1, 2),
        {"admitted_own_queue": PRIORITY, "admitted_preemptible": WHILE_BORROWING},
    ),
    (
        "prefer-a-hierarchical-candidate-to-its-own",
        [c("r"), c("c", "r", 2)],
        [q("q", "c"), q("q_borrowing", "r")],
        [w("admitted_borrowing", "q_borrowing", 1, 1), w("admitted_same_queue", "q", -2, 1)],
        ("q", 0, 1),
        {"admitted_borrowing": RECLAIM},
    ),
    (
        "forced-to-preempt-a-priority-candidate",
        [c("r"), c("c", "r", 2)],
        [
            q("q", "c", policy=BORROWS_BELOW_0),
            q("q_nominal", "r", 2),
            q("q_same_cohort", "c"),
        ],
        [
            w("admitted_nominal", "q_nominal", -10, 2),
            w("admitted_same_cohort", "q_same_cohort", -1, 2),
        ],
        ("q", 0, 2),
        {"admitted_same_cohort": WHILE_BORROWING},
    ),
    (
        "a-grant-within-nominal-reclaims-any-priority",
        [c("r"), c("c", "r", 2)],
        [q("q", "c", 4), q("q_borrowing", "r"), q("q_same_cohort", "c")],
        [
            w("admitted_borrowing", "q_borrowing", 10, 3),
            w("admitted_same_cohort", "q_same_cohort", 10, 3),
        ],
        ("q", 0, 4),
        {"admitted_borrowing": RECLAIM, "admitted_same_cohort": RECLAIM},
    ),
    (
        "preempt-hierarchical-and-priority-candidates",
        [c("r", gpus=1), c("c", "r", 4)],
        [q("q", "c", policy=LOWER_BORROWS_BELOW_0), q("q_borrowing", "r"), q("q_same_cohort", "c")],
        [
            w("admitted_borrowing", "q_borrowing", -1, 2),
            w("admitted_same_cohort_preemptible", "q_same_cohort", -1, 1),
            w("admitted_borrowing_not_preemptible", "q_borrowing", 1, 2),
        ],
        ("q", 0, 3),
        {"admitted_borrowing": RECLAIM, "admitted_same_cohort_preemptible": WHILE_BORROWING},
    ),
    (
        "preempt-hierarchical-candidates-and-in-its-own-tenant",
        [c("r", gpus=1), c("c", "r", 4)],
        [q("q", "c", policy=LOWER_BORROWS_BELOW_0), q("q_borrowing", "r"), q("q_same_cohort", "c")],
        [
            w("admitted_borrowing", "q_borrowing", -1, 2),
            w("admitted_same_queue_preemptible", "q", -1, 1),
            w("admitted_borrowing_not_preemptible", "q_borrowing", 1, 2),
        ],
        ("q", 0, 3),
        {"admitted_borrowing": RECLAIM, "admitted_same_queue_preemptible": PRIORITY},
    ),
    (
        "reclaim-from-the-lowest-priority-skipping-tenants-within-nominal",
        [c("r"), c("c", "r", 3)],
        [q("q", "c"), q("q_borrowing", "r"), q("q_nominal", "r", 2)],
        [
            w("admitted_borrowing_prio_8", "q_borrowing", 8, 1),
            w("admitted_borrowing_prio_9", "q_borrowing", 9, 1),
            w("admitted_borrowing_prio_10", "q_borrowing", 9, 1),
            w("admitted_nominal", "q_nominal", -2, 2),
        ],
        ("q", 0, 1),
        {"admitted_borrowing_prio_8": RECLAIM},
    ),
    (
        "nothing-in-subtrees-within-their-quota",  # c_other uses 2 of its own 2
        [c("r"), c("c", "r", 2), c("c_other", "r", 2)],
        [q("q_other", "c_other"), q("q", "c"), q("q_same_cohort", "c")],
        [
            w("admitted_other_1", "q_other", -10, 1),
            w("admitted_other_2", "q_other", -10, 1),
            w("admitted_same_cohort", "q_same_cohort", 0, 2),
        ],
        ("q", 0, 2),
        None,
    ),
    (
        "several-resources",
        [c("r", gpus=3), c("c", "r", 4, memory=4)],
        [q("q", "c", memory=0), q("q_borrowing", "r", memory=0), q("q_same_cohort", "c", memory=0)],
        [
            w("admitted_borrowing", "q_borrowing", 0, 3, memory=1),
            w("admitted_same_cohort", "q_same_cohort", -2, 1, memory=3),
        ],
        ("q", -2, 2, 1),
        {"admitted_borrowing": RECLAIM},
    ),
    (
        "respect-lending-limits",  # q keeps 1 of its 3
        [c("r"), c("c", "r", 2)],
        [q("q", "c", 3, lend=2), q("q_borrowing", "r")],
        [w("admitted_borrowing", "q_borrowing", 0, 4)],
        ("q", -2, 5),
        {"admitted_borrowing": RECLAIM},
    ),
    (
        # r -> c11(4) -> c21(4) -> c31(4) -> q5; c21 -> c32(4) -> q4; c11 -> c22(4) -> q3;
        # c11 -> c23(4) -> q2; r -> c12(4) -> q1
        "reclaim-in-a-deep-tree",
        [
            c("r"),
            c("c11", "r", 4),
            c("c12", "r", 4),
            c("c21", "c11", 4),
            c("c22", "c11", 4),
            c("c23", "c11", 4),
            c("c31", "c21", 4),
            c("c32", "c21", 4),
        ],
        [q("q1", "c12"), q("q2", "c23"), q("q3", "c22"), q("q4", "c32"), q("q5", "c31")],
        [
            w("admitted_borrowing_1", "q1", -6, 4),
            w("admitted_borrowing_2", "q1", -5, 4),
            w("admitted_borrowing_3", "q2", -9, 4),
            w("admitted_borrowing_4", "q2", -10, 4),
            w("admitted_borrowing_5", "q3", -4, 4),
            w("admitted_borrowing_6", "q3", -3, 3),
            w("admitted_borrowing_7", "q4", 4, 2),
            w("admitted_borrowing_8", "q4", 2, 3),
        ],
        ("q5", -2, 7),
        {"admitted_borrowing_1": RECLAIM, "admitted_borrowing_4": RECLAIM},
    ),
    (
        # a (3 of its 4, borrowWithinCohort LowerPriority) asks 2 at priority 100: borrowing,
        # it may take no borrower of priority 1000 (the pass with borrowing allowed has only
        # its own a1); ending within nominal it may (its own a1 and one of b's). gpualloc
        # took both of b's while borrowing before (one pass, borrowing allowed)
        "borrow-within-cohort-never-takes-a-higher-priority-while-borrowing",
        [],
        [
            q(
                "a",
                "flat",
                4,
                policy=PreemptionPolicy(borrow_within_cohort=BorrowWithinCohort.LOWER_PRIORITY),
            ),
            q("b", "flat", 4),
        ],
        [w("a1", "a", 0, 3), w("b1", "b", 1000, 4), w("b2", "b", 1000, 4)],
        ("a", 100, 2),
        {"b1": RECLAIM, "a1": PRIORITY},
    ),
    (
        # t1 (2 of its 3) asks 3 at priority 2, borrowWithinCohort Never, no hierarchical
        # advantage: the pass that ends within nominal comes first (Kueue's attempts without
        # borrowing, then with), so both of its own lower-priority reservations go, not only
        # the priority-0 one that borrowing 1 would need (the property test below found it)
        "within-nominal-first-takes-both-own-rather-than-borrowing-with-one",
        [c("root", gpus=0), c("c0", "root", 1), c("c1", "root", 3)],
        [q("t0", "root", 3), q("t1", "root", 3)],
        [
            w("h0", "t0", 0, 2),
            w("h1", "t0", 0, 2),
            w("h2", "t0", 0, 2),
            w("h3", "t1", 0, 1),
            w("h4", "t1", 1, 1),
        ],
        ("t1", 2, 3),
        {"h3": PRIORITY, "h4": PRIORITY},
    ),
]


def model_of(cohorts: Sequence[CohortQuota], tenants: Sequence[TenantQuota]) -> QuotaModel:
    resources = (GPUS, MEMORY) if any("memory" in t.limits for t in tenants) else (GPUS,)
    return QuotaModel(
        resources, {t.tenant: t for t in tenants}, cohorts={x.name: x for x in cohorts}
    )


def usage_of(holdings: Sequence[Holding]) -> dict[str, dict[str, int]]:
    usage: dict[str, dict[str, int]] = {}
    for h in holdings:
        mine = usage.setdefault(h.tenant, {})
        for name, amount in h.amounts.items():
            mine[name] = mine.get(name, 0) + amount
    return usage


def plan(
    quotas: QuotaModel,
    holdings: Sequence[Holding],
    who: tuple[str, int, float] | tuple[str, int, float, float],
) -> dict[str, PreemptionReason] | None:
    tenant, priority, gpus = who[0], who[1], who[2]
    amounts = {"gpus": round(gpus * GPU)}
    if len(who) == 4:
        amounts["memory"] = round(who[3] * GPU)
    context = PreemptionContext(
        quotas,
        tenant,
        PriorityClass(f"p{priority}", priority),
        amounts,
        holdings,
        usage_of(holdings),
    )
    found = plan_preemption(context, lambda chosen, node: amounts)
    if found is None:
        return None
    return {v.holding.id: v.reason for v in found.victims}


@pytest.mark.parametrize(
    ("cohorts", "tenants", "holdings", "who", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_hierarchical_preemption_table(
    cohorts: list[CohortQuota],
    tenants: list[TenantQuota],
    holdings: list[Holding],
    who: tuple[str, int, float],
    expected: dict[str, PreemptionReason] | None,
) -> None:
    assert plan(model_of(cohorts, tenants), holdings, who) == expected


# --- the brute-force model: any tree, any holdings ---------------------------------------------


@st.composite
def scenes(draw: st.DrawFn, flat: bool = False) -> tuple[QuotaModel, list[Holding], str, int, int]:
    """A root, up to three cohorts below it with quotas of their own (none when `flat`), 2-4
    tenants anywhere in it with nominal quotas, reservations of priority -1..1 admitted one by
    one while the rule admitted them, and a grant of 1-4 GPUs at priority 0..2 by one of the
    tenants."""
    cohorts = [c("root", gpus=draw(st.integers(0, 2)))]
    for i in range(0 if flat else draw(st.integers(0, 3))):
        parent = draw(st.sampled_from([x.name for x in cohorts]))
        cohorts.append(c(f"c{i}", parent, draw(st.integers(0, 3))))
    tenants = [
        q(f"t{i}", draw(st.sampled_from([x.name for x in cohorts])), draw(st.integers(0, 3)))
        for i in range(draw(st.integers(2, 4)))
    ]
    quotas = model_of(cohorts, tenants)
    holdings: list[Holding] = []
    for i in range(draw(st.integers(0, 8))):
        tenant = draw(st.sampled_from([t.tenant for t in tenants]))
        gpus = draw(st.integers(1, 2))
        if admit(quotas, tenant, {"gpus": gpus * GPU}, usage_of(holdings)):
            continue
        priority = draw(st.integers(-1, 1))
        holdings.append(
            Holding(
                f"h{i}",
                tenant,
                PriorityClass(f"p{priority}", priority),
                float(i),
                {"gpus": gpus * GPU},
            )
        )
    who = draw(st.sampled_from([t.tenant for t in tenants]))
    return quotas, holdings, who, draw(st.integers(0, 2)), draw(st.integers(1, 4))


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_a_plan_fits_spares_nobody_needlessly_and_never_inverts_priorities(
    scene: tuple[QuotaModel, list[Holding], str, int, int],
) -> None:
    """Whatever the tree: once a plan's victims are gone the grant is admitted (no level
    overrun), no victim can be spared (within nominal, for a plan that ends there: a
    borrowing preemptor may not take what one within nominal may), every victim is one the
    rules allow (its own tenant's of a lower priority, or another tenant's that borrows), and,
    among the victims of one rule, no set that fits as the plan's pass must (within nominal,
    for a plan that ends there) takes a lower highest priority: for the tenant's own victims,
    checked against every subset of its own lower-priority reservations; for other tenants'
    victims, in a flat cohort (every tenant in the root) and a plan that ends within nominal,
    against every subset of the other tenants' reservations that reclaim could take (each
    victim's tenant still borrowing when it is taken, in Kueue's order)."""
    _check_plan(scene)


@settings(max_examples=600, deadline=None)
@given(scenes(flat=True))
def test_reclaim_in_a_flat_cohort_never_inverts_priorities(
    scene: tuple[QuotaModel, list[Holding], str, int, int],
) -> None:
    """The same property on flat cohorts only (every tenant in the root), where the other
    tenants' victims are checked against every set reclaim could take instead."""
    _check_plan(scene)


def _check_plan(scene: tuple[QuotaModel, list[Holding], str, int, int]) -> None:
    quotas, holdings, who, priority, gpus = scene
    amounts = {"gpus": gpus * GPU}
    usage = usage_of(holdings)
    context = PreemptionContext(
        quotas, who, PriorityClass(f"p{priority}", priority), amounts, holdings, usage
    )

    def fits(gone: Sequence[Holding], within_nominal: bool = False) -> bool:
        left = usage_of([h for h in holdings if h not in gone])
        return admit(quotas, who, amounts, left, within_nominal=within_nominal) == ()

    found = plan_preemption(context, lambda chosen, node: amounts)
    if fits([]):
        return  # nothing to preempt for (the service asks the planner only when refused)
    if found is None:
        return
    victims = [v.holding for v in found.victims]
    assert fits(victims)
    # a plan that ends within nominal was the pass that must (it may take borrowers that a
    # borrowing preemptor may not): no victim can be spared with the preemptor within nominal
    within = fits(victims, within_nominal=True)
    for victim in victims:
        spared = [h for h in victims if h is not victim]
        assert not fits(spared, within_nominal=within), "a victim could be spared"
    for v in found.victims:
        if v.reason is PRIORITY:
            assert v.holding.tenant == who and v.holding.priority.value < priority
        else:
            assert v.holding.tenant != who and _borrowed(quotas, v, usage)
    highest = max(v.priority.value for v in victims)
    own = [h for h in holdings if h.tenant == who and h.priority.value < priority]
    for size in range(1, len(own) + 1):
        for subset in itertools.combinations(own, size):
            # compared with sets that end where the plan's pass must (within nominal, for a
            # plan that does): Kueue tries that pass first when it may not borrow to preempt
            if fits(subset, within_nominal=within) and all(
                v.reason is PRIORITY for v in found.victims
            ):
                assert max(h.priority.value for h in subset) >= highest
    flat = all(t.cohort == "root" for t in quotas.tenants.values())
    if not (flat and within and all(v.reason is not PRIORITY for v in found.victims)):
        return
    others = [h for h in holdings if h.tenant != who]
    for size in range(1, len(others) + 1):
        for subset in itertools.combinations(others, size):
            if fits(subset, within_nominal=True) and _reclaimable(quotas, subset, usage):
                assert max(h.priority.value for h in subset) >= highest, "priority inversion"


def _reclaimable(quotas: QuotaModel, subset: Sequence[Holding], usage: Mapping[str, Usage]) -> bool:
    """Whether reclaim takes every one of `subset`, in Kueue's order (the lowest priority,
    then the newest, first): each while its tenant still uses more than its nominal."""
    left = {t: dict(u) for t, u in usage.items()}
    for h in sorted(subset, key=lambda h: (h.priority.value, -h.created_at, h.id)):
        mine = left.setdefault(h.tenant, {})
        if mine.get("gpus", 0) <= quotas.tenants[h.tenant].of("gpus").nominal:
            return False
        mine["gpus"] = mine.get("gpus", 0) - h.amounts["gpus"]
    return True


def _borrowed(quotas: QuotaModel, victim: Candidate, usage: Mapping[str, Usage]) -> bool:
    """The victim's tenant used more than its nominal before the preemption."""
    quota = quotas.tenants[victim.holding.tenant]
    return usage.get(victim.holding.tenant, {}).get("gpus", 0) > quota.of("gpus").nominal
