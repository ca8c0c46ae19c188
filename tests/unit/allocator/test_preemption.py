"""The preemption planner as pure values (services/allocator/core/preemption.py): who may go,
in which order, the fewest of them, and each knob of a tenant's Kueue-style policy as a row.

The cases are Kueue's classical preemption (pkg/scheduler/preemption's table tests, read and
rewritten in gpualloc's tenant model): a ClusterQueue is a tenant, its admitted workloads are
reservations of their priority, the incoming workload is the grant.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from services.allocator.core import (
    Candidate,
    Holding,
    Move,
    PreemptionContext,
    PreemptionReason,
    Target,
    Targets,
    consolidation_order,
    fewest_moves,
    fewest_victims,
    movable_candidates,
    plan_preemption,
    preemption_candidates,
    preemption_targets,
    victims_by_node,
)
from services.common.dra.model import AllocationResult
from services.common.quota.model import (
    DEFAULT_PREEMPTION,
    BorrowWithinCohort,
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

GPU = 1000  # one device, in milli-units
GPUS = QuotaResource("gpus", ("gpu.nvidia.com",))
CONSOLIDATE = PreemptionReason.CONSOLIDATE
PRIORITY = PreemptionReason.PRIORITY
RECLAIM = PreemptionReason.RECLAIM
WHILE_BORROWING = PreemptionReason.RECLAIM_WHILE_BORROWING


def model(*tenants: TenantQuota) -> QuotaModel:
    return QuotaModel((GPUS,), {t.tenant: t for t in tenants})


def tenant(
    name: str,
    nominal: int,
    cohort: str = "c",
    borrow: int | None = None,
    lend: int | None = None,
    policy: PreemptionPolicy = DEFAULT_PREEMPTION,
) -> TenantQuota:
    limits = QuotaLimits(
        nominal * GPU,
        None if borrow is None else borrow * GPU,
        None if lend is None else lend * GPU,
    )
    return TenantQuota(name, cohort, {"gpus": limits}, policy)


def used(**gpus: int) -> dict[str, dict[str, int]]:
    return {name: {"gpus": count * GPU} for name, count in gpus.items()}


def context(
    quotas: QuotaModel,
    who: str,
    priority: PriorityClass,
    holdings: Sequence[Holding],
    usage: Mapping[str, Usage],
    gpus: int = 1,
    created_at: float = float("inf"),
) -> PreemptionContext:
    return PreemptionContext(
        quotas, who, priority, {"gpus": gpus * GPU}, holdings, usage, created_at
    )


# --- preemption: who may go, in which order, and the fewest of them --------------------------

LOW = PriorityClass("low", 0)
STANDARD = PriorityClass("standard", 100)
HIGH = PriorityClass("high", 1000)
GUARDED = PriorityClass("guarded", 500, preemptible=False)
POLITE = PriorityClass("polite", 1000, preempts=False)


def holding(
    name: str, who: str, priority: PriorityClass = STANDARD, age: int = 0, gpus: int = 1
) -> Holding:
    return Holding(name, who, priority, created_at=1000.0 - age, amounts={"gpus": gpus * GPU})


COHORT = model(tenant("a", 4), tenant("b", 4), tenant("c", 4, cohort=""))

ORDER_CASES = [
    (
        "reclaim-newest-of-the-borrower",
        "b",
        STANDARD,
        [holding("a1", "a", age=3), holding("a2", "a", age=2), holding("a3", "a", age=1)],
        used(a=6),
        ["a3", "a2", "a1"],
    ),
    (
        "reclaim-lowest-priority-first",
        "b",
        STANDARD,
        [holding("a1", "a", LOW, age=3), holding("a2", "a", age=2), holding("a3", "a", HIGH)],
        used(a=6),
        ["a1", "a2", "a3"],  # reclaim takes any priority: the lent quota is b's
    ),
    (
        "no-reclaim-from-a-tenant-within-nominal",
        "b",
        STANDARD,
        [holding("a1", "a")],
        used(a=4),
        [],
    ),
    (
        "no-reclaim-when-the-grant-borrows",
        "b",
        HIGH,
        [holding("a1", "a"), holding("b1", "b", LOW)],
        used(a=6, b=4),
        ["b1"],  # b asks beyond its nominal: only its own lower priority may go
    ),
    (
        "own-lower-priority-lowest-then-newest",
        "c",
        HIGH,
        [holding("c1", "c", LOW, age=2), holding("c2", "c", STANDARD), holding("c3", "c", LOW)],
        used(c=4),
        ["c3", "c1", "c2"],
    ),
    ("never-an-equal-or-higher-priority", "c", STANDARD, [holding("c1", "c")], used(c=4), []),
    ("guarded-is-never-a-victim", "c", HIGH, [holding("c1", "c", GUARDED)], used(c=4), []),
    ("a-polite-class-never-preempts", "c", POLITE, [holding("c1", "c", LOW)], used(c=4), []),
    ("other-cohorts-are-never-reclaimed", "c", HIGH, [holding("a1", "a", LOW)], used(a=6), []),
]


@pytest.mark.parametrize(
    ("who", "priority", "holdings", "usage", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in ORDER_CASES],
)
def test_preemption_candidates_table(
    who: str,
    priority: PriorityClass,
    holdings: list[Holding],
    usage: dict[str, dict[str, int]],
    expected: list[str],
) -> None:
    found = preemption_candidates(context(COHORT, who, priority, holdings, usage))
    assert [c.holding.id for c in found] == expected


def test_reclaim_takes_the_lowest_priority_first_whoever_borrows_most() -> None:
    """Kueue's order: the priority decides among other tenants' borrowers, not how much
    their tenant borrows (gpualloc took the most borrowing tenant's first before: b1 of
    priority 100 before a1 of 0, a priority inversion Kueue never makes)."""
    quotas = model(tenant("a", 4), tenant("b", 4), tenant("d", 4))
    holdings = [holding("a1", "a", LOW), holding("b1", "b")]
    found = preemption_candidates(context(quotas, "d", STANDARD, holdings, used(a=5, b=6)))
    assert [(c.holding.id, c.reason) for c in found] == [("a1", RECLAIM), ("b1", RECLAIM)]


@example(sizes=[1, 1, 1, 1, 4], need=4)  # four small victims in rule order, or one large one
@example(sizes=[1, 1, 1, 1, 4, 4, 4], need=12)  # six in rule order, three at least: minimal only
@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=7),
    st.integers(1, 12),
)
def test_fewest_victims_is_minimal_and_needed(sizes: list[int], need: int) -> None:
    """Victims free `size` GPUs each; the grant needs `need`. The answer fits, no victim can
    be spared, it is None exactly when all of them together are not enough, and it is the
    smallest set when one or two victims suffice (the default search tries every set of one
    or two of seven candidates) — checked against every subset."""
    candidates = [Candidate(holding(f"v{i}", "c"), PRIORITY) for i in range(len(sizes))]
    size = {c.holding.id: s for c, s in zip(candidates, sizes, strict=True)}

    def fits(chosen: Sequence[Candidate]) -> bool:
        return sum(size[c.holding.id] for c in chosen) >= need

    found = fewest_victims(candidates, fits)
    if sum(sizes) < need:
        assert found is None
        return
    assert found is not None and fits(found)
    for victim in found:
        assert not fits([c for c in found if c is not victim])
    smallest = min(
        len(subset)
        for r in range(1, len(candidates) + 1)
        for subset in itertools.combinations(candidates, r)
        if fits(subset)
    )
    if smallest <= 2:
        assert len(found) == smallest
    exhaustive = fewest_victims(candidates, fits, smaller=2 ** len(candidates))
    assert exhaustive is not None and len(exhaustive) == smallest


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        pytest.param(used(a=6), ["a3", "a2"], id="reclaim-stops-at-the-victims-nominal"),
        pytest.param(used(a=8), ["a3", "a2", "a1"], id="a-tenant-far-over-loses-more"),
        pytest.param(used(a=5), ["a3"], id="one-borrowed-one-taken"),
    ],
)
def test_reclaim_never_takes_a_victims_nominal_share(
    usage: dict[str, dict[str, int]], expected: list[str]
) -> None:
    """Tenant a (nominal 4) holds what `usage` says; b reclaims as much as it can use (the
    grant fits only with everything gone): a keeps its nominal, as Kueue's reclaimWithinCohort
    does, however many candidates there are."""
    holdings = [holding(f"a{i}", "a", age=4 - i) for i in range(1, 4)]
    candidates = preemption_candidates(context(COHORT, "b", STANDARD, holdings, usage))
    taken = fewest_victims(candidates, lambda chosen: False, model=COHORT, usage=usage)
    assert taken is None  # never enough: the grant wants more than a borrows
    taken = fewest_victims(
        candidates, lambda chosen: len(chosen) >= len(expected), model=COHORT, usage=usage
    )
    assert taken is not None and [c.holding.id for c in taken] == expected


# (candidates, the one victim that frees enough alone, GPUs each frees) -> the victims found
BOUND_CASES = [
    # the first 64 candidates in the rules' order are looked at, the 65th never
    ("the-64th-candidate-is-taken", 64, 63, [0] * 64, 2, ["v63"]),
    ("the-65th-candidate-is-never-taken", 65, 64, [0] * 65, 2, None),
    # v0 and v1 (1 GPU each) are the run that fits a grant of 2; then up to 32 sets of fewer
    # victims are tried, the smallest first in the rules' order: the singletons v0, v1, ...
    ("a-smaller-set-found-by-the-32nd-solve", 40, 31, [1] * 40, 2, ["v31"]),
    ("a-smaller-set-after-32-solves-is-not-looked-for", 40, 32, [1] * 40, 2, ["v0", "v1"]),
]


@pytest.mark.parametrize(
    ("count", "alone", "sizes", "need", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in BOUND_CASES],
)
def test_fewest_victims_bounds(
    count: int, alone: int, sizes: list[int], need: int, expected: list[str] | None
) -> None:
    """fewest_victims with its defaults (docs/tenancy.md): only the first 64 candidates are
    looked at (a grant that only the 65th makes room for gets None: the planner then looks
    node by node), and after the shortest run is pruned, at most 32 more solves look for a
    set of fewer victims (one found by the 32nd is taken, one the 33rd would find is not).
    Victim `v<alone>` frees `need` GPUs on its own; every other frees its `sizes` entry."""
    candidates = [Candidate(holding(f"v{i}", "c", age=i), PRIORITY) for i in range(count)]
    size = {f"v{i}": need if i == alone else sizes[i] for i in range(count)}

    def fits(chosen: Sequence[Candidate]) -> bool:
        return sum(size[c.holding.id] for c in chosen) >= need

    found = fewest_victims(candidates, fits)
    assert (found if found is None else [c.holding.id for c in found]) == expected


def test_beyond_the_first_64_candidates_the_victims_are_looked_for_node_by_node() -> None:
    """Tenant c's grant of high priority may preempt its 65 low reservations, newest first;
    only the oldest (the 65th) makes room, on node `a`. Fleet-wide the first 64 never make
    room, so without `node_of` there is no plan; with it, the planner looks node by node
    and node `a`'s own candidate comes first there: the oldest goes, on `a`."""
    alone = model(tenant("c", 100, cohort=""))
    holdings = [holding(f"h{i}", "c", LOW, age=i) for i in range(64)]
    holdings.append(holding("old", "c", LOW, age=100))
    ask = context(alone, "c", HIGH, holdings, used(c=65))

    def place(chosen: Sequence[Candidate], node: str) -> dict[str, int] | None:
        freed = {c.holding.id for c in chosen}
        return {"gpus": GPU} if "old" in freed and node in ("", "a") else None

    assert [c.holding.id for c in preemption_candidates(ask)][-1] == "old"
    assert plan_preemption(ask, place) is None
    node_of = {h.id: "a" if h.id == "old" else "z" for h in holdings}
    plan = plan_preemption(ask, place, node_of=node_of)
    assert plan is not None
    assert ([c.holding.id for c in plan.victims], plan.node) == (["old"], "a")


# node -> victims held there (id, priority, reason); what each node needs freed (GPUs)
NODE_CASES = [
    (
        "the-node-that-one-victim-frees",
        {
            "n1": [("s1", STANDARD, RECLAIM), ("s2", STANDARD, RECLAIM)],
            "n2": [("b1", LOW, RECLAIM)],
        },
        {"n1": 2, "n2": 1},
        None,
        ("n2", ["b1"]),
    ),
    (
        "reclaim-before-own-lower-priority",
        {"n1": [("own", LOW, PRIORITY)], "n2": [("lent", STANDARD, RECLAIM)]},
        {"n1": 1, "n2": 1},
        None,
        ("n2", ["lent"]),
    ),
    (
        "a-node-all-victims-cannot-free-is-passed-over",
        {"n1": [("x1", LOW, RECLAIM)], "n2": [("y1", LOW, RECLAIM), ("y2", LOW, RECLAIM)]},
        {"n1": 2, "n2": 2},
        None,
        ("n2", ["y1", "y2"]),
    ),
    (
        "only-the-nodes-the-query-may-use",
        {"n1": [("x1", LOW, RECLAIM)], "n2": [("y1", LOW, RECLAIM)]},
        {"n1": 1, "n2": 1},
        ["n2"],
        ("n2", ["y1"]),
    ),
    (
        "lower-highest-priority-wins-a-tie",
        {"n1": [("hi", HIGH, RECLAIM)], "n2": [("lo", LOW, RECLAIM)]},
        {"n1": 1, "n2": 1},
        None,
        ("n2", ["lo"]),
    ),
    ("nowhere", {"n1": [("x1", LOW, RECLAIM)]}, {"n1": 2}, None, None),
    (
        "only-the-16-nodes-holding-the-most-are-tried",
        {
            **{f"n{i:02}": [(f"x{i}a", LOW, RECLAIM), (f"x{i}b", LOW, RECLAIM)] for i in range(16)},
            "z": [("z1", LOW, RECLAIM)],
        },
        {**{f"n{i:02}": 3 for i in range(16)}, "z": 1},
        None,
        None,  # z alone would fit, but it holds the least: the 17th node is never tried
    ),
]


@pytest.mark.parametrize(
    ("held", "need", "nodes", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in NODE_CASES],
)
def test_victims_by_node(
    held: dict[str, list[tuple[str, PriorityClass, PreemptionReason]]],
    need: dict[str, int],
    nodes: list[str] | None,
    expected: tuple[str, list[str]] | None,
) -> None:
    """Each victim frees one GPU of its node (quota is no concern here); a node fits the grant
    once `need[node]` of its victims are gone. The answer: the best node and its fewest
    victims, none of them elsewhere."""
    candidates = [
        Candidate(holding(name, "a", priority), reason)
        for victims in held.values()
        for name, priority, reason in victims
    ]
    node_of = {name: node for node, victims in held.items() for name, _, _ in victims}

    def fits_on(node: str, chosen: Sequence[Candidate]) -> bool:
        return sum(1 for c in chosen if node_of[c.holding.id] == node) >= need[node]

    found = victims_by_node(candidates, node_of, fits_on, nodes=nodes)
    if expected is None:
        assert found is None
        return
    assert found is not None
    assert (found.node, [c.holding.id for c in found.victims]) == (expected[0], expected[1])


MOVABLE = PriorityClass("movable", 100, movable=True)
MOVABLE_LOW = PriorityClass("movable-low", 0, movable=True)
FIXED_MOVABLE = PriorityClass("fixed", 500, preemptible=False, movable=True)

MOVE_CASES = [
    (
        "any-tenant-of-the-cohort-newest-first",
        "b",
        [holding("a1", "a", MOVABLE, age=2), holding("b1", "b", MOVABLE, age=1)],
        used(a=3, b=1),
        ["b1", "a1"],  # a is within nominal: reclaim could not take a1, a move may
    ),
    (
        "any-priority-even-higher",
        "b",
        [holding("a1", "a", PriorityClass("top", 9000, movable=True))],
        used(a=1),
        ["a1"],
    ),
    ("only-movable-classes", "b", [holding("a1", "a"), holding("a2", "a", LOW)], used(a=2), []),
    ("never-an-unpreemptible-class", "b", [holding("a1", "a", FIXED_MOVABLE)], used(a=1), []),
    ("never-when-the-grant-borrows", "b", [holding("a1", "a", MOVABLE)], used(a=1, b=4), []),
    ("never-another-cohort", "c", [holding("a1", "a", MOVABLE)], used(a=1), []),
]


@pytest.mark.parametrize(
    ("who", "holdings", "usage", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in MOVE_CASES],
)
def test_movable_candidates_table(
    who: str, holdings: list[Holding], usage: dict[str, dict[str, int]], expected: list[str]
) -> None:
    found = movable_candidates(context(COHORT, who, STANDARD, holdings, usage))
    assert [c.holding.id for c in found] == expected
    assert {c.reason for c in found} <= {CONSOLIDATE}


def test_a_polite_class_never_moves_anyone() -> None:
    found = movable_candidates(context(COHORT, "b", POLITE, [holding("a1", "a", MOVABLE)], {}))
    assert found == []


def test_consolidation_frees_the_emptiest_gpu_first() -> None:
    moves = [
        Candidate(holding("x1", "a", MOVABLE, age=1), CONSOLIDATE),
        Candidate(holding("y1", "a", MOVABLE, age=2), CONSOLIDATE),
        Candidate(holding("x2", "a", MOVABLE, age=3), CONSOLIDATE),
        Candidate(holding("z1", "a", MOVABLE, age=4), CONSOLIDATE),
    ]
    gpu = {"x1": "gpu-x", "x2": "gpu-x", "y1": "gpu-y", "z1": "gpu-z"}
    ordered = [c.holding.id for c in consolidation_order(moves, gpu)]
    assert ordered == ["y1", "z1", "x1", "x2"]  # one each on y and z (by name), then x's two
    # freeing one GPU takes the run that empties it, and nothing more
    found = fewest_moves(consolidation_order(moves, gpu), lambda c: len(c) >= 2)
    assert found is not None and [c.holding.id for c in found] == ["y1", "z1"]
    assert fewest_moves(moves, lambda c: False) is None


# --- the planner: a tenant's policy, knob by knob, and Kueue's passes ---------------------------

MINUS = PriorityClass("minus", -1)
ZERO = PriorityClass("zero", 0)
PLUS = PriorityClass("plus", 1)

NEVER_WITHIN = PreemptionPolicy(within_tenant=WithinTenant.NEVER)
NEWER_EQUAL = PreemptionPolicy(within_tenant=WithinTenant.LOWER_OR_NEWER_EQUAL_PRIORITY)
NEVER_RECLAIM = PreemptionPolicy(reclaim_within_cohort=ReclaimWithinCohort.NEVER)
RECLAIM_LOWER = PreemptionPolicy(reclaim_within_cohort=ReclaimWithinCohort.LOWER_PRIORITY)
BORROW_LOWER = PreemptionPolicy(borrow_within_cohort=BorrowWithinCohort.LOWER_PRIORITY)


def borrow_below(threshold: int) -> PreemptionPolicy:
    return PreemptionPolicy(
        borrow_within_cohort=BorrowWithinCohort.LOWER_PRIORITY, max_priority_threshold=threshold
    )


def held(who: str, count: int, priority: PriorityClass = STANDARD, gpus: int = 1) -> list[Holding]:
    """`count` reservations of `who`, `who`1 the oldest."""
    return [
        holding(f"{who}{i}", who, priority, age=count - i, gpus=gpus) for i in range(1, count + 1)
    ]


# (id, tenants, who asks, at which priority, GPUs, holdings, fleet size or None (unbounded),
#  the victims with their reasons, None: no preemption helps)
PLAN_CASES = [
    (
        "below-nominal-own-lower-priority-plus-a-borrower-ends-within-nominal",
        # the rule gap: a holds 3 of 4 and asks 2; b borrows 1; without b's, the pool is short
        [tenant("a", 4), tenant("b", 4)],
        "a", HIGH, 2,
        [holding("a1", "a", LOW), holding("a2", "a", HIGH, 2),
         holding("a3", "a", HIGH, 1), *held("b", 5)],
        None,
        [("b5", RECLAIM), ("a1", PRIORITY)],
    ),
    (
        "at-nominal-only-its-own-and-borrowing",
        [tenant("a", 4), tenant("b", 4)],
        "a", HIGH, 1,
        [*held("a", 4, LOW), *held("b", 4)],
        8,
        [("a4", PRIORITY)],
    ),
    (
        "within-cluster-queue-never-takes-none-of-its-own",
        [tenant("a", 4, cohort="", policy=NEVER_WITHIN)],
        "a", HIGH, 1, held("a", 4, LOW), None, None,
    ),
    (
        "within-cluster-queue-lower-priority-spares-equal",
        [tenant("a", 4, cohort="")],
        "a", STANDARD, 1, held("a", 4), None, None,
    ),
    (
        "lower-or-newer-equal-takes-an-equal-created-after-the-preemptor",
        [tenant("a", 4, cohort="", policy=NEWER_EQUAL)],
        "a", STANDARD, 1, held("a", 4), None, [("a4", PRIORITY)],  # created_at 999.0 > 998.5
    ),
    (
        "lower-or-newer-equal-still-prefers-lower-priority",
        [tenant("a", 4, cohort="", policy=NEWER_EQUAL)],
        "a", STANDARD, 1, [*held("a", 3), holding("low", "a", LOW, age=9)], None,
        [("low", PRIORITY)],
    ),
    (
        "reclaim-within-cohort-never",
        [tenant("a", 4, policy=NEVER_RECLAIM), tenant("b", 4)],
        "a", STANDARD, 1, held("b", 8), None, None,
    ),
    (
        "reclaim-within-cohort-any-takes-a-higher-priority-borrower",
        [tenant("a", 4), tenant("b", 4)],
        "a", STANDARD, 1, held("b", 8, HIGH), None, [("b8", RECLAIM)],
    ),
    (
        "reclaim-within-cohort-lower-priority-spares-a-higher-borrower",
        [tenant("a", 4, policy=RECLAIM_LOWER), tenant("b", 4)],
        "a", STANDARD, 1, held("b", 8, HIGH), None, None,
    ),
    (
        "reclaim-within-cohort-lower-priority-takes-a-lower-borrower",
        [tenant("a", 4, policy=RECLAIM_LOWER), tenant("b", 4)],
        "a", STANDARD, 1, [*held("b", 7, HIGH), holding("blow", "b", LOW, age=9)], None,
        [("blow", RECLAIM)],
    ),
    (
        "borrow-within-cohort-never-while-borrowing",
        [tenant("a", 4), tenant("b", 4), tenant("d", 4)],
        "a", STANDARD, 1, [*held("a", 4, HIGH), *held("b", 8, LOW)], None, None,
    ),
    (
        "borrow-within-cohort-lower-priority-while-borrowing",
        [tenant("a", 4, policy=BORROW_LOWER), tenant("b", 4), tenant("d", 4)],
        "a", STANDARD, 1, [*held("a", 4, HIGH), *held("b", 8, LOW)], None,
        [("b8", WHILE_BORROWING)],
    ),
    (
        "borrow-within-cohort-never-an-equal-priority",
        [tenant("a", 4, policy=BORROW_LOWER), tenant("b", 4), tenant("d", 4)],
        "a", STANDARD, 1, [*held("a", 4, HIGH), *held("b", 8)], None, None,
    ),
    (
        "borrow-within-cohort-above-the-threshold-is-spared",
        [tenant("a", 4, policy=borrow_below(50)), tenant("b", 4), tenant("d", 4)],
        "a", HIGH, 1, [*held("a", 4, HIGH), *held("b", 8)], None, None,
    ),
    (
        "borrow-within-cohort-at-the-threshold-is-taken",
        [tenant("a", 4, policy=borrow_below(100)), tenant("b", 4), tenant("d", 4)],
        "a", HIGH, 1, [*held("a", 4, HIGH), *held("b", 8)], None, [("b8", WHILE_BORROWING)],
    ),
    (
        "two-of-the-lowest-rather-than-one-higher",
        # fewest victims, never at a higher priority: Kueue takes the two of -1, not the one of 0
        [tenant("a", 4, cohort="")],
        "a", HIGH, 2,
        [holding("m1", "a", MINUS, 2), holding("m2", "a", MINUS, 1), holding("z", "a", ZERO, 3, 2)],
        4,
        [("m2", PRIORITY), ("m1", PRIORITY)],
    ),
    (
        "one-large-rather-than-two-small-of-one-priority",
        [tenant("a", 4, cohort="")],
        "a", HIGH, 2,
        [holding("s1", "a", LOW, 2), holding("s2", "a", LOW, 1), holding("big", "a", LOW, 3, 2)],
        4,
        [("big", PRIORITY)],
    ),
    (
        "the-lower-priority-of-a-tenant-borrowing-less-first",
        # a borrows 1 at -1, b borrows 3 at 1: Kueue reclaims a's, whoever borrows most
        [tenant("a", 4), tenant("b", 4), tenant("d", 4)],
        "d", STANDARD, 1, [*held("a", 5, MINUS), *held("b", 7, PLUS)], 12, [("a5", RECLAIM)],
    ),
    (
        "other-tenants-first-then-its-own",
        [tenant("a", 4), tenant("b", 4)],
        "a", HIGH, 1, [*held("a", 3, LOW), *held("b", 5, HIGH)], 8, [("b5", RECLAIM)],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("tenants", "who", "priority", "gpus", "holdings", "fleet", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in PLAN_CASES],
)
def test_plan_preemption_table(
    tenants: list[TenantQuota],
    who: str,
    priority: PriorityClass,
    gpus: int,
    holdings: list[Holding],
    fleet: int | None,
    expected: list[tuple[str, PreemptionReason]] | None,
) -> None:
    """The grant needs `gpus` free devices of a fleet of `fleet` (every holding takes its
    GPUs of it) and its quota (the planner's own check)."""
    quotas = model(*tenants)
    usage: dict[str, dict[str, int]] = {}
    for h in holdings:
        mine = usage.setdefault(h.tenant, {})
        mine["gpus"] = mine.get("gpus", 0) + h.amounts["gpus"]

    def place(chosen: Sequence[Candidate], node: str) -> Usage | None:
        if fleet is not None:
            gone = {c.holding.id for c in chosen}
            busy = sum(h.amounts["gpus"] for h in holdings if h.id not in gone)
            if fleet * GPU - busy < gpus * GPU:
                return None
        return {"gpus": gpus * GPU}

    ask = context(quotas, who, priority, holdings, usage, gpus, created_at=998.5)
    plan = plan_preemption(ask, place)
    # the preemptor's one entry gives the same targets (no consolidation asked: a gang's)
    targets = preemption_targets(ask, place, consolidating=None)
    if expected is None:
        assert plan is None and targets is None
        return
    assert plan is not None and targets is not None
    assert [(c.holding.id, c.reason) for c in plan.victims] == expected
    assert [(t.id, t.reason, t.move) for t in targets.targets] == [
        (name, reason, None) for name, reason in expected
    ]
    assert targets.reclaims_only == all(
        reason in (RECLAIM, WHILE_BORROWING) for _, reason in expected
    )


def _target(name: str, reason: PreemptionReason, moved_to: str = "") -> Target:
    move = Move(name, moved_to, AllocationResult()) if moved_to else None
    return Target(Candidate(holding(name, "b"), reason), move)


@pytest.mark.parametrize(
    ("targets", "reasons", "reclaims_only"),
    [
        pytest.param([_target("b1", RECLAIM)], [RECLAIM], True, id="a-reclaim"),
        pytest.param(
            [_target("b1", RECLAIM), _target("b2", WHILE_BORROWING)],
            [RECLAIM, WHILE_BORROWING],
            True,
            id="reclaims-while-borrowing-too",
        ),
        pytest.param(
            [_target("b1", RECLAIM), _target("a1", PRIORITY)],
            [RECLAIM, PRIORITY],
            False,
            id="one-priority-target-preempts",
        ),
        pytest.param(
            [_target("b1", RECLAIM, moved_to="n2")],
            [CONSOLIDATE],
            False,
            id="a-moved-target-is-consolidated-whatever-its-candidate-reason",
        ),
        pytest.param(
            [_target("b1", PreemptionReason.FAIR_SHARING)],
            [PreemptionReason.FAIR_SHARING],
            False,
            id="fair-sharing-preempts",
        ),
    ],
)
def test_a_plans_targets_say_their_reason_and_whether_the_plan_reclaims(
    targets: list[Target], reasons: list[PreemptionReason], reclaims_only: bool
) -> None:
    """Kueue's flavor assigner mode is the plan's: Reclaim only when every target is
    reclaimed; a moved target's reason is CONSOLIDATE."""
    plan = Targets(tuple(targets))
    assert [t.reason for t in plan.targets] == reasons
    assert plan.reclaims_only is reclaims_only


def test_a_pass_that_cannot_end_within_nominal_costs_no_solve() -> None:
    """a holds 3 of its 4 at the preemptor's priority and asks 2: even with every candidate of
    its own gone it would borrow, so the within-nominal pass is not tried (it could only fail,
    one solve per node), and the borrowing pass has no candidate: no placement is tried."""
    quotas = model(tenant("a", 4), tenant("b", 4))
    holdings = [*held("a", 3, HIGH), *held("b", 5)]
    calls: list[int] = []

    def place(chosen: Sequence[Candidate], node: str) -> Usage | None:
        calls.append(len(chosen))
        return {"gpus": 2 * GPU}

    plan = plan_preemption(context(quotas, "a", HIGH, holdings, used(a=3, b=5), 2), place)
    assert plan is None and calls == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-1, 1), st.integers(1, 2)), min_size=1, max_size=7),
    st.integers(1, 4),
)
def test_victims_never_invert_priorities_and_none_can_be_spared(
    victims: list[tuple[int, int]], need: int
) -> None:
    """A tenant alone on a fleet of 8 GPUs holds reservations of priority -1..1 and 1-2 GPUs
    each (`victims`, the rest of the fleet free) and asks `need` GPUs at priority 2: checked
    against every subset of its reservations, the plan fits, no victim can be spared, and no
    set that fits takes a lower highest priority (Kueue and kube-scheduler never take a
    higher-priority victim while lower-priority ones would do)."""
    classes = {p: PriorityClass(f"p{p}", p) for p in (-1, 0, 1)}
    holdings = [
        holding(f"h{i}", "a", classes[p], age=i, gpus=g) for i, (p, g) in enumerate(victims)
    ]
    held_gpus = sum(g for _, g in victims)
    free = max(0, 8 - held_gpus)
    quotas = model(tenant("a", 100, cohort=""))

    def freed(chosen: Sequence[Holding | Candidate]) -> int:
        return sum(
            (c.holding if isinstance(c, Candidate) else c).amounts["gpus"] // GPU for c in chosen
        )

    def place(chosen: Sequence[Candidate], node: str) -> Usage | None:
        return {"gpus": need * GPU} if free + freed(chosen) >= need else None

    usage = used(a=held_gpus)
    plan = plan_preemption(
        context(quotas, "a", PriorityClass("top", 2), holdings, usage, need), place
    )
    fitting = [
        subset
        for r in range(1, len(holdings) + 1)
        for subset in itertools.combinations(holdings, r)
        if free + freed(subset) >= need
    ]
    if free >= need or not fitting:
        assert plan is None or free >= need
        return
    assert plan is not None and free + freed(plan.victims) >= need
    for victim in plan.victims:
        assert free + freed([c for c in plan.victims if c is not victim]) < need
    highest = max(c.holding.priority.value for c in plan.victims)
    assert highest == min(max(h.priority.value for h in subset) for subset in fitting)
