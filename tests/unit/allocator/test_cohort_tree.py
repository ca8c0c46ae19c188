"""Hierarchical cohorts as pure values (the tree's shape, services/common/quota/tree.py, and the
quota rule over it, services/allocator/core/quota/levels.py and rule.py): what each tenant may
still take at every level, against Kueue's own cases and a brute-force model of "no overrun at
any level".

The table rows are Kueue's TestAvailable (pkg/cache/scheduler/resource_test.go), rewritten in
gpualloc's model: a ClusterQueue is a tenant, a Cohort a cohort, one flavor of `cpu` the quota
resource `gpus`. The brute-force model states the rule as Kueue's addUsage propagates usage,
without the closed form of `available`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.allocator.core import admit, cohort_status, resource_levels, tenant_status
from services.common.quota.model import (
    CohortQuota,
    QuotaLimits,
    QuotaModel,
    QuotaResource,
    TenantQuota,
)
from services.common.quota.tree import CohortCycle, CohortTree, TreeNode, cohort_node, tenant_node

GPU = 1000
GPUS = QuotaResource("gpus", ("gpu.nvidia.com",))


def limits(nominal: float, borrow: float | None = None, lend: float | None = None) -> QuotaLimits:
    def milli(value: float | None) -> int | None:
        return None if value is None else round(value * GPU)

    return QuotaLimits(round(nominal * GPU), milli(borrow), milli(lend))


def cq(
    name: str,
    cohort: str,
    nominal: float,
    borrow: float | None = None,
    lend: float | None = None,
    weight: Fraction = Fraction(1),
) -> TenantQuota:
    return TenantQuota(name, cohort, {"gpus": limits(nominal, borrow, lend)}, weight=weight)


def cohort(
    name: str,
    parent: str = "",
    nominal: float | None = None,
    borrow: float | None = None,
    lend: float | None = None,
    weight: Fraction = Fraction(1),
) -> CohortQuota:
    quotas = {} if nominal is None else {"gpus": limits(nominal, borrow, lend)}
    return CohortQuota(name, parent, quotas, weight)


def tree_model(tenants: Sequence[TenantQuota], cohorts: Sequence[CohortQuota]) -> QuotaModel:
    return QuotaModel((GPUS,), {t.tenant: t for t in tenants}, cohorts={c.name: c for c in cohorts})


def gpus(**used: float) -> dict[str, dict[str, int]]:
    return {name: {"gpus": round(count * GPU)} for name, count in used.items()}


# --- what each tenant may still take (Kueue's TestAvailable) ---------------------------------

AVAILABLE = [
    # (id, tenants, cohorts, usage, available with that usage, available with none)
    (
        "tenants-without-a-cohort",  # Kueue: base cqs
        [cq("cq1", "", 0), cq("cq2", "", 5)],
        [],
        gpus(cq1=1, cq2=2.5),
        {"cq1": 0, "cq2": 2.5},
        {"cq1": 0, "cq2": 5},
    ),
    (
        "a-cohort-with-quota-of-its-own",  # Kueue: cqs with cohort (29 = 10 + 10 + 9 lent)
        [cq("cq1", "c", 10), cq("cq2", "c", 10, lend=9)],
        [cohort("c", nominal=10)],
        gpus(cq1=1, cq2=0.5),
        {"cq1": 28, "cq2": 28.5},
        {"cq1": 29, "cq2": 30},
    ),
    (
        "a-tenant-borrows-its-cohorts-own-quota",  # Kueue: cq borrows from cohort
        [cq("cq1", "c", 10)],
        [cohort("c", nominal=10)],
        gpus(cq1=11),
        {"cq1": 9},
        {"cq1": 20},
    ),
    (
        # Kueue: cq oversubscription spills into cohort — there cq2 gets 0 as well, since
        # Kueue lets the overrun make every node's capacity 0; in gpualloc an overrun never
        # takes a node's local (guaranteed) quota, which nobody borrows (docs/tenancy.md)
        "an-overrun-elsewhere-keeps-a-guaranteed-part",
        [cq("cq1", "c", 10), cq("cq2", "c", 10, borrow=0, lend=0)],
        [cohort("c", nominal=10)],
        gpus(cq1=31),
        {"cq1": 0, "cq2": 10},
        {"cq1": 20, "cq2": 10},
    ),
    (
        "lending-and-borrowing-limits",  # Kueue: lending and borrowing limits respected
        [cq("cq1", "c", 10), cq("cq2", "c", 10, borrow=2), cq("cq3", "c", 10, lend=5)],
        [cohort("c", nominal=10)],
        gpus(cq1=20, cq2=10, cq3=6),
        {"cq1": 4, "cq2": 2, "cq3": 4},
        {"cq1": 35, "cq2": 12, "cq3": 40},
    ),
    (
        # root -> left(10) -> cq1, root -> right(10) -> cq2 (lends nothing)
        "two-subtrees-share-their-root",  # Kueue: hierarchical cohort
        [cq("cq1", "left", 10), cq("cq2", "right", 10, lend=0)],
        [cohort("root"), cohort("left", "root", 10), cohort("right", "root", 10)],
        gpus(cq1=10, cq2=5),
        {"cq1": 20, "cq2": 25},
        {"cq1": 30, "cq2": 40},
    ),
    (
        # left borrows at most 5 from root; left-cq2 at most 5 from left
        "a-cohorts-borrowing-limit-caps-its-subtree",  # Kueue: ... respects borrowing limit
        [cq("l1", "left", 10), cq("l2", "left", 10, borrow=5), cq("r", "right", 10)],
        [cohort("root"), cohort("left", "root", 10, borrow=5), cohort("right", "root", 10)],
        {},
        {"l1": 35, "l2": 15, "r": 50},
        {"l1": 35, "l2": 15, "r": 50},
    ),
    (
        # left lends root at most 5 (of l1's lent 5 and l2's 10); l1 keeps 5 of its own
        "a-cohorts-lending-limit-caps-what-leaves-it",  # Kueue: ... respects lending limit
        [
            cq("l1", "left", 10, lend=5),
            cq("l2", "left", 10),
            cq("r", "right", 0),
            cq("top", "root", 0),
        ],
        [cohort("root"), cohort("left", "root", 0, lend=5), cohort("right", "root", 0)],
        {},
        {"l1": 20, "l2": 15, "r": 5, "top": 5},
        {"l1": 20, "l2": 15, "r": 5, "top": 5},
    ),
    (
        "usage-in-one-subtree-is-lent-to-another",
        [cq("l1", "left", 4), cq("r1", "right", 4)],
        [cohort("root", nominal=2), cohort("left", "root"), cohort("right", "root")],
        gpus(l1=7),
        {"l1": 3, "r1": 3},  # root has 10: l1 holds 7, 3 left for anyone
        {"l1": 10, "r1": 10},
    ),
    (
        "a-subtree-with-lending-limit-0-keeps-its-quota",
        [cq("l1", "left", 4), cq("r1", "right", 4)],
        [cohort("root"), cohort("left", "root", 2, lend=0), cohort("right", "root")],
        gpus(r1=4),
        {"l1": 6, "r1": 0},  # left keeps its 6 (2 + l1's 4): r1 never gets any of it
        {"l1": 10, "r1": 4},
    ),
]


@pytest.mark.parametrize(
    ("tenants", "cohorts", "usage", "expected", "empty"),
    [pytest.param(*case[1:], id=case[0]) for case in AVAILABLE],
)
def test_available_table(
    tenants: list[TenantQuota],
    cohorts: list[CohortQuota],
    usage: dict[str, dict[str, int]],
    expected: dict[str, float],
    empty: dict[str, float],
) -> None:
    quotas = tree_model(tenants, cohorts)
    for seen, want in ((usage, expected), ({}, empty)):
        left = {t.tenant: tenant_status(quotas, seen, [t.tenant])[0].left / GPU for t in tenants}
        assert left == want
        for t in tenants:  # admit grants exactly up to what is left
            most = round(want[t.tenant] * GPU)
            assert admit(quotas, t.tenant, {"gpus": most}, seen) == ()
            assert admit(quotas, t.tenant, {"gpus": most + 1}, seen) != ()
    for t in tenants:  # Kueue's potentialAvailable: what it could take with nothing used
        key = tenant_node(t.tenant)
        assert resource_levels(quotas, key, "gpus", {}).potential(key) / GPU == empty[t.tenant]


# --- one tree, one ledger ----------------------------------------------------------------------


def test_a_tree_is_one_ledger_named_after_its_root() -> None:
    quotas = tree_model(
        [cq("a", "research", 1), cq("b", "ops", 1), cq("c", "", 1), cq("d", "other", 1)],
        [cohort("org"), cohort("research", "org"), cohort("ops", "org")],
    )
    assert [quotas.ledger_key(quotas.tenants[t]) for t in "abcd"] == [
        "cohort:org",
        "cohort:org",
        "tenant:c",
        "cohort:other",  # a cohort nobody declares is a root of its own
    ]
    assert quotas.ledgers() == ("cohort:org", "cohort:other", "tenant:c")
    assert quotas.members(quotas.tenants["a"]) == ("a", "b")
    assert quotas.path("a") == ("org", "research") and quotas.path("c") == ()
    assert quotas.cohort_names() == ("ops", "org", "other", "research")


def test_a_cycle_is_refused_by_the_tree() -> None:
    with pytest.raises(CohortCycle):
        CohortTree(
            [
                TreeNode(("cohort", "x"), "y", {}),
                TreeNode(("cohort", "y"), "x", {}),
            ]
        )


# --- what QuotaStatus shows of the tree ------------------------------------------------------


def test_cohort_rows_show_each_level() -> None:
    """org (2 of its own) -> research (4 of its own, lends org at most 1, borrows at most 2)
    -> team-a (4); org -> team-b (2). research's subtree holds 8 (its 4 and team-a's), it
    keeps 7 and lends org 1; team-a's 7 all come from research. org's subtree is its 2, the
    1 research lends and team-b's 2."""
    quotas = tree_model(
        [cq("team-a", "research", 4), cq("team-b", "org", 2)],
        [cohort("org", nominal=2), cohort("research", "org", 4, borrow=2, lend=1)],
    )
    rows = {r.cohort: r for r in cohort_status(quotas, gpus(**{"team-a": 7, "team-b": 3}))}
    research, org = rows["research"], rows["org"]
    assert (research.subtree, research.used, research.borrowed) == (8 * GPU, 7 * GPU, 0)
    assert research.path == ("org",) and org.path == ()
    # research keeps 7 of its 8 (lending limit 1): 0 of it stored in org is used by research
    # org: own 2 + research's 1 + team-b's 2 = 5; team-b uses 3 of it
    assert (org.subtree, org.used, org.borrowed, org.left) == (5 * GPU, 3 * GPU, 0, 2 * GPU)
    # team-b borrows 1 beyond its 2: org's own quota serves it before any child's
    assert org.lent == 0 and research.lent == 0
    team_b = tenant_status(quotas, gpus(**{"team-a": 7, "team-b": 5}), ["team-b"])[0]
    assert team_b.borrowed == 3 * GPU and team_b.path == ("org",)
    lent = {r.cohort: r.lent for r in cohort_status(quotas, gpus(**{"team-b": 5}))}
    assert lent == {"org": 0, "research": 1 * GPU}  # org's own 2 first, then research's 1


# --- the brute-force model: usage propagated level by level -----------------------------------


def _quota_of(node: TenantQuota | CohortQuota) -> QuotaLimits | None:
    return node.limits.get("gpus")


def model_admits(
    quotas: QuotaModel, usage: Mapping[str, Mapping[str, int]], tenant: str, amount: int
) -> bool:
    """The grant goes in level by level, as Kueue's addUsage propagates it: each node keeps
    what fits in its local quota and passes the rest to its parent. A level that is passed
    anything must stay within its borrowing limit (its usage in the parent at most what it
    lends there plus the limit); a root that is passed anything must stay within its subtree
    quota. Nothing is checked where nothing arrives (an overrun elsewhere refuses nothing)."""
    nodes: dict[tuple[str, str], TenantQuota | CohortQuota] = {}
    parent_of: dict[tuple[str, str], tuple[str, str] | None] = {}
    for t in quotas.tenants.values():
        nodes[("tenant", t.tenant)] = t
        parent_of[("tenant", t.tenant)] = ("cohort", t.cohort) if t.cohort else None
    for name in quotas.cohort_names():
        c = quotas.cohorts.get(name, CohortQuota(name))
        nodes[("cohort", name)] = c
        parent_of[("cohort", name)] = ("cohort", c.parent) if c.parent else None

    def children(key: tuple[str, str]) -> list[tuple[str, str]]:
        return [k for k, p in parent_of.items() if p == key]

    def subtree(key: tuple[str, str]) -> int:
        own = _quota_of(nodes[key])
        total = own.nominal if own is not None else 0
        if key[0] == "cohort":
            total += sum(subtree(k) - local(k) for k in children(key))
        return total

    def local(key: tuple[str, str]) -> int:
        own = _quota_of(nodes[key])
        if own is None or own.lending_limit is None:
            return 0
        return max(0, subtree(key) - own.lending_limit)

    def used(key: tuple[str, str]) -> int:
        if key[0] == "tenant":
            return usage.get(key[1], {}).get("gpus", 0)
        return sum(max(0, used(k) - local(k)) for k in children(key))

    key: tuple[str, str] | None = ("tenant", tenant)
    delta = amount
    while key is not None and delta > 0:
        before, parent = used(key), parent_of[key]
        if parent is None:
            return before + delta <= subtree(key)
        passed = max(0, before + delta - local(key)) - max(0, before - local(key))
        own = _quota_of(nodes[key])
        limit = own.borrowing_limit if own is not None else None
        after = max(0, before + delta - local(key))  # its usage in its parent
        if passed > 0 and limit is not None and after > subtree(key) - local(key) + limit:
            return False
        key, delta = parent, passed
    return True


_SIZES = st.integers(0, 4)
_LIMIT = st.one_of(st.none(), st.integers(0, 4))


@st.composite
def trees(draw: st.DrawFn) -> QuotaModel:
    """A root with up to two levels of cohorts below it (each with quotas of its own or not,
    and limits towards its parent) and 2-4 tenants hung anywhere in it."""
    cohorts = [CohortQuota("root", "", draw(_cohort_limits(root=True)))]
    for i in range(draw(st.integers(0, 3))):
        parent = draw(st.sampled_from([c.name for c in cohorts]))
        cohorts.append(CohortQuota(f"c{i}", parent, draw(_cohort_limits(root=False))))
    tenants = []
    for i in range(draw(st.integers(2, 4))):
        where = draw(st.sampled_from([c.name for c in cohorts]))
        nominal = draw(_SIZES)
        lend = draw(st.one_of(st.none(), st.integers(0, nominal)))
        tenants.append(
            TenantQuota(
                f"t{i}",
                where,
                {"gpus": QuotaLimits(nominal * GPU, _milli(draw(_LIMIT)), _milli(lend))},
            )
        )
    return tree_model(tenants, cohorts)


@st.composite
def _cohort_limits(draw: st.DrawFn, root: bool) -> dict[str, QuotaLimits]:
    if not draw(st.booleans()):
        return {}
    nominal = draw(_SIZES) * GPU
    if root:
        return {"gpus": QuotaLimits(nominal)}
    return {"gpus": QuotaLimits(nominal, _milli(draw(_LIMIT)), _milli(draw(_LIMIT)))}


def _milli(value: int | None) -> int | None:
    return None if value is None else value * GPU


@settings(max_examples=300, deadline=None)
@given(trees(), st.lists(st.tuples(st.integers(0, 3), st.integers(-3, 4)), max_size=25))
def test_grants_and_releases_follow_the_brute_force_model(
    quotas: QuotaModel, steps: list[tuple[int, int]]
) -> None:
    """From an empty ledger, grants (positive) and releases (negative) of random tenants:
    every grant is admitted exactly when the model admits it (no level overrun, nothing
    refused needlessly), `left` is the largest grant the model admits, and no level ever
    holds more than its limits allow."""
    names = sorted(quotas.tenants)
    usage: dict[str, dict[str, int]] = {}
    for who, amount in steps:
        tenant = names[who % len(names)]
        held = usage.get(tenant, {}).get("gpus", 0)
        if amount <= 0:
            usage[tenant] = {"gpus": max(0, held + amount * GPU)}
            continue
        admitted = admit(quotas, tenant, {"gpus": amount * GPU}, usage) == ()
        assert admitted == model_admits(quotas, usage, tenant, amount * GPU)
        left = tenant_status(quotas, usage, [tenant])[0].left
        assert model_admits(quotas, usage, tenant, left)
        assert not model_admits(quotas, usage, tenant, left + 1)
        if admitted:
            usage[tenant] = {"gpus": held + amount * GPU}
            _assert_no_overrun(quotas, usage)


def _assert_no_overrun(quotas: QuotaModel, usage: Mapping[str, Mapping[str, int]]) -> None:
    """Every level within its limits: a root within its subtree quota, every other node's
    usage in its parent within what it lends there plus its borrowing limit."""
    root = cohort_node("root")
    levels = resource_levels(quotas, root, "gpus", usage)
    for key in quotas.tree.subtree(root):
        if quotas.tree.parent(key) is None:
            assert levels.usage[key] <= levels.subtree[key]
            continue
        own = quotas.tree.limits(key, "gpus")
        if own is not None and own.borrowing_limit is not None:
            in_parent = max(0, levels.usage[key] - levels.local[key])
            lent = levels.subtree[key] - levels.local[key]
            assert in_parent <= lent + own.borrowing_limit


@settings(max_examples=200, deadline=None)
@given(trees(), st.lists(st.integers(0, 6), min_size=4, max_size=4), st.integers(0, 3))
def test_any_usage_admits_what_the_model_admits(
    quotas: QuotaModel, held: list[int], who: int
) -> None:
    """Any usage, overruns included (a policy shrank under it): a grant is admitted exactly
    when no level that it adds to would pass its limits."""
    names = sorted(quotas.tenants)
    usage = {name: {"gpus": held[i] * GPU} for i, name in enumerate(names)}
    tenant = names[who % len(names)]
    left = tenant_status(quotas, usage, [tenant])[0].left
    for amount in range(8):
        admitted = admit(quotas, tenant, {"gpus": amount * GPU}, usage) == ()
        assert admitted == model_admits(quotas, usage, tenant, amount * GPU), amount
        assert admitted == (amount * GPU <= left)
