"""Preemption with fair sharing (core/fair_preemption.py through core/preemption.py's planner):
Kueue's fair-sharing preemption cases, and a brute-force model of its guarantees.

The rows are Kueue's TestFairPreemptions (pkg/scheduler/preemption/preemption_fair_test.go,
v0.17.8) rewritten in gpualloc's model: a ClusterQueue is a tenant, a Cohort a cohort, `cpu` of
a flavor the quota resource `gpus/<flavor>`, an admitted workload a reservation of its
priority (all admitted at once: ties go by name, as Kueue's go by UID), the incoming workload
the grant, which always finds devices (these cases are about quota only). A tenant's policy
is written `<withinClusterQueue><reclaimWithinCohort>[B<maxPriorityThreshold>]` with N(ever),
L(owerPriority), A(ny): `LAB-3` is LowerPriority, Any, borrowWithinCohort LowerPriority up
to -3 (which fair sharing does not use, as in Kueue).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.allocator.core import (
    Candidate,
    Holding,
    PreemptionContext,
    PreemptionReason,
    Share,
    admit,
    dominant_share,
    plan_preemption,
    strategy_allows,
    tree_levels,
)
from services.common.dra.quantity import Quantity
from services.common.quota.model import (
    BorrowWithinCohort,
    CohortQuota,
    FairSharing,
    PreemptionPolicy,
    PreemptionStrategy,
    PriorityClass,
    QuotaLimits,
    QuotaModel,
    QuotaResource,
    ReclaimWithinCohort,
    TenantQuota,
    Usage,
    WithinTenant,
)
from services.common.quota.tree import NodeKey, tenant_node

GPU = 1000
RECLAIM = PreemptionReason.RECLAIM
FAIR = PreemptionReason.FAIR_SHARING
PRIORITY = PreemptionReason.PRIORITY
WHILE_BORROWING = PreemptionReason.RECLAIM_WHILE_BORROWING
_POLICY = {"N": "Never", "L": "LowerPriority", "A": "Any", "E": "LowerOrNewerEqualPriority"}

Quotas = Mapping[str, float | tuple[float, float | None, float | None]]


def _limits(quotas: Quotas) -> dict[str, QuotaLimits]:
    found = {}
    for flavor, value in quotas.items():
        nominal, borrow, lend = value if isinstance(value, tuple) else (value, None, None)
        found[f"gpus/{flavor}"] = QuotaLimits(
            round(nominal * GPU),
            None if borrow is None else round(borrow * GPU),
            None if lend is None else round(lend * GPU),
        )
    return found


def _weight(text: str) -> Fraction:
    return Quantity.parse(text).value


def co(name: str, parent: str, quotas: Quotas, w: str = "1") -> CohortQuota:
    return CohortQuota(name, parent, _limits(quotas), _weight(w))


def cq(name: str, cohort: str, quotas: Quotas, policy: str, w: str = "1") -> TenantQuota:
    borrow = BorrowWithinCohort.LOWER_PRIORITY if "B" in policy else BorrowWithinCohort.NEVER
    threshold = int(policy.split("B")[1]) if "B" in policy else None
    preemption = PreemptionPolicy(
        WithinTenant(_POLICY[policy[0]]),
        ReclaimWithinCohort(_POLICY[policy[1]]),
        borrow,
        threshold,
    )
    return TenantQuota(name, cohort, _limits(quotas), preemption, weight=_weight(w))


def wl(name: str, tenant: str, priority: int, amount: float, flavor: str = "default") -> Holding:
    return Holding(
        name,
        tenant,
        PriorityClass(f"p{priority}", priority),
        1000.0,
        {f"gpus/{flavor}": round(amount * GPU)},
    )


FAIR_CASES = [
    (
        "reclaim-nominal-from-user-using-the-most",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1", "a", 0, 1),
            wl("a2", "a", 0, 1),
            wl("a3", "a", 0, 1),
            wl("b1", "b", 0, 1),
            wl("b2", "b", 0, 1),
            wl("b3", "b", 0, 1),
            wl("b4", "b", 0, 1),
            wl("b5", "b", 0, 1),
            wl("c1", "c", 0, 1),
        ],
        ("c", 0, 1, "default"),
        {"b1": RECLAIM},
    ),
    (
        "can-reclaim-from-queue-using-less-if-taking-the-latest-workload-from-user-using-the-most-isnt-enough",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1", "a", 0, 3),
            wl("a2", "a", 0, 1),
            wl("b1", "b", 0, 2),
            wl("b2", "b", 0, 3),
        ],
        ("c", 0, 3, "default"),
        {"a1": RECLAIM},
    ),
    (
        "reclaim-borrowable-quota-from-user-using-the-most",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1", "a", 0, 1),
            wl("a2", "a", 0, 1),
            wl("a3", "a", 0, 1),
            wl("b1", "b", 0, 1),
            wl("b2", "b", 0, 1),
            wl("b3", "b", 0, 1),
            wl("b4", "b", 0, 1),
            wl("b5", "b", 0, 1),
            wl("c1", "c", 0, 1),
        ],
        ("a", 0, 1, "default"),
        {"b1": FAIR},
    ),
    (
        "preempt-one-from-each-cq-borrowing",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1", "a", 0, 0.5),
            wl("a2", "a", 0, 0.5),
            wl("a3", "a", 0, 3),
            wl("b1", "b", 0, 0.5),
            wl("b2", "b", 0, 0.5),
            wl("b3", "b", 0, 3),
        ],
        ("c", 0, 2, "default"),
        {"a1": RECLAIM, "b1": RECLAIM},
    ),
    (
        "cant-preempt-when-everyone-under-nominal",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1", "a", 0, 1),
            wl("a2", "a", 0, 1),
            wl("a3", "a", 0, 1),
            wl("b1", "b", 0, 1),
            wl("b2", "b", 0, 1),
            wl("b3", "b", 0, 1),
            wl("c1", "c", 0, 1),
            wl("c2", "c", 0, 1),
            wl("c3", "c", 0, 1),
        ],
        ("c", 0, 1, "default"),
        {},
    ),
    (
        "cant-preempt-when-it-would-switch-the-imbalance",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1", "a", 0, 1),
            wl("a2", "a", 0, 1),
            wl("a3", "a", 0, 1),
            wl("b1", "b", 0, 1),
            wl("b2", "b", 0, 1),
            wl("b3", "b", 0, 1),
            wl("b4", "b", 0, 1),
            wl("b5", "b", 0, 1),
        ],
        ("a", 0, 2, "default"),
        {},
    ),
    (
        "can-preempt-lower-priority-workloads-from-same-cq",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1_low", "a", -1, 1),
            wl("a2_low", "a", -1, 1),
            wl("a3", "a", 0, 1),
            wl("a4", "a", 0, 1),
            wl("b1", "b", 0, 1),
            wl("b2", "b", 0, 1),
            wl("b3", "b", 0, 1),
            wl("b4", "b", 0, 1),
            wl("b5", "b", 0, 1),
        ],
        ("a", 0, 2, "default"),
        {"a1_low": PRIORITY, "a2_low": PRIORITY},
    ),
    (
        "can-preempt-a-combination-of-same-cq-and-highest-user",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a_low", "a", -1, 1),
            wl("a2", "a", 0, 1),
            wl("a3", "a", 0, 1),
            wl("b1", "b", 0, 1),
            wl("b2", "b", 0, 1),
            wl("b3", "b", 0, 1),
            wl("b4", "b", 0, 1),
            wl("b5", "b", 0, 1),
            wl("b6", "b", 0, 1),
        ],
        ("a", 0, 2, "default"),
        {"a_low": PRIORITY, "b1": FAIR},
    ),
    (
        "preempt-huge-workload-if-there-is-no-other-option-as-long-as-the-target-cq-gets-a-lower-share",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("b1", "b", 0, 9),
        ],
        ("a", 0, 2, "default"),
        {"b1": RECLAIM},
    ),
    (
        "cant-preempt-huge-workload-if-the-incoming-is-also-huge",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1", "a", 0, 2),
            wl("b1", "b", 0, 7),
        ],
        ("a", 0, 5, "default"),
        {},
    ),
    (
        "cant-preempt-2-smaller-workloads-if-the-incoming-is-huge",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("b1", "b", 0, 2),
            wl("b2", "b", 0, 2),
            wl("b3", "b", 0, 3),
        ],
        ("a", 0, 6, "default"),
        {},
    ),
    (
        "preempt-from-target-and-others-even-if-over-nominal",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1_low", "a", -1, 2),
            wl("a2_low", "a", -1, 1),
            wl("b1", "b", 0, 3),
            wl("b2", "b", 0, 3),
        ],
        ("a", 0, 4, "default"),
        {"a1_low": PRIORITY, "b1": FAIR},
    ),
    (
        "prefer-to-preempt-workloads-that-dont-make-the-target-cq-have-the-biggest-share",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("b1", "b", 0, 2),
            wl("b2", "b", 0, 1),
            wl("b3", "b", 0, 2),
            wl("c1", "c", 0, 1),
        ],
        ("a", 0, 3.5, "default"),
        {"b2": FAIR},
    ),
    (
        "preempt-from-different-cluster-queues-if-the-end-result-has-a-smaller-max-share",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("b1", "b", 0, 2),
            wl("b2", "b", 0, 2.5),
            wl("c1", "c", 0, 2),
            wl("c2", "c", 0, 2.5),
        ],
        ("a", 0, 3.5, "default"),
        {"b1": FAIR, "c1": FAIR},
    ),
    (
        "scenario-above-does-not-flap",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1", "a", 0, 3.5),
            wl("b2", "b", 0, 2.5),
            wl("c2", "c", 0, 2.5),
        ],
        ("b", 0, 2, "default"),
        {},
    ),
    (
        "cannot-preempt-if-it-would-make-the-candidate-cq-go-under-nominal-after-preempting-one-element",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("b1", "b", 0, 3),
            wl("b2", "b", 0, 3),
            wl("c1", "c", 0, 3),
        ],
        ("a", 0, 4, "default"),
        {},
    ),
    (
        "workloads-under-priority-threshold-not-capriciously-preempted",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1", "a", 0, 1),
            wl("a2", "a", 0, 1),
            wl("a3", "a", 0, 1),
            wl("b1", "b", 0, 1),
            wl("b2", "b", 0, 1),
            wl("b3", "b", 0, 1),
            wl("preemptible1", "preemptible", -3, 1),
            wl("preemptible2", "preemptible", -3, 1),
            wl("preemptible3", "preemptible", -3, 1),
        ],
        ("a", 0, 2, "default"),
        {},
    ),
    (
        "preempt-lower-priority-first-even-if-big",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanInitialShare",),
        [
            wl("a1", "a", 0, 3),
            wl("b_low", "b", 0, 5),
            wl("b_high", "b", 1, 1),
        ],
        ("a", 0, 1, "default"),
        {"b_low": FAIR},
    ),
    (
        "preempt-workload-that-doesnt-transfer-the-imbalance-even-if-high-priority",
        [],
        [
            cq("a", "all", {"default": 3}, "LAB-3"),
            cq("b", "all", {"default": 3}, "LAB-3"),
            cq("c", "all", {"default": 3}, "LAB-3"),
            cq("preemptible", "all", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare",),
        [
            wl("a1", "a", 0, 3),
            wl("b_low", "b", 0, 5),
            wl("b_high", "b", 1, 1),
        ],
        ("a", 0, 1, "default"),
        {"b_high": FAIR},
    ),
    (
        "cq-with-higher-weight-can-preempt-more",
        [],
        [
            cq("a", "all", {"default": 3}, "LA", w="2"),
            cq("b", "all", {"default": 3}, "LA"),
            cq("c", "all", {"default": 3}, "LA"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1", "a", 0, 1),
            wl("a2", "a", 0, 1),
            wl("a3", "a", 0, 1),
            wl("b1", "b", 0, 1),
            wl("b2", "b", 0, 1),
            wl("b3", "b", 0, 1),
            wl("b4", "b", 0, 1),
            wl("b5", "b", 0, 1),
            wl("b6", "b", 0, 1),
        ],
        ("a", 0, 2, "default"),
        {"b1": FAIR, "b2": FAIR},
    ),
    (
        "can-preempt-anything-borrowing-from-cq-with-0-weight",
        [],
        [
            cq("a", "all", {"default": 3}, "LA"),
            cq("b", "all", {"default": 3}, "LA", w="0"),
            cq("c", "all", {"default": 3}, "LA"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1", "a", 0, 1),
            wl("a2", "a", 0, 1),
            wl("a3", "a", 0, 1),
            wl("b1", "b", 0, 1),
            wl("b2", "b", 0, 1),
            wl("b3", "b", 0, 1),
            wl("b4", "b", 0, 1),
            wl("b5", "b", 0, 1),
            wl("b6", "b", 0, 1),
        ],
        ("a", 0, 3, "default"),
        {"b1": FAIR, "b2": FAIR, "b3": FAIR},
    ),
    (
        "cant-preempt-nominal-from-cq-with-0-weight",
        [],
        [
            cq("a", "all", {"default": 3}, "LA"),
            cq("b", "all", {"default": 3}, "LA", w="0"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1", "a", 0, 1),
            wl("a2", "a", 0, 1),
            wl("a3", "a", 0, 1),
            wl("b1", "b", 0, 1),
            wl("b2", "b", 0, 1),
            wl("b3", "b", 0, 1),
        ],
        ("a", 0, 1, "default"),
        {},
    ),
    (
        "cant-preempt-nominal-from-cohort-with-0-weight",
        [co("right-cohort", "root", {"default": 1}, w="0")],
        [
            cq("left-cq", "root", {"default": 0}, "NA"),
            cq("right-cq", "right-cohort", {"default": 0}, "NA", w="0"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("right-1", "right-cq", 0, 1),
        ],
        ("left-cq", 0, 1, "default"),
        {},
    ),
    (
        "can-preempt-within-cluster-queue-when-no-cohort",
        [],
        [
            cq("a", "", {"default": 1}, "LN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1", "a", 0, 1),
        ],
        ("a", 1000, 1, "default"),
        {"a1": PRIORITY},
    ),
    (
        "hierarchical-preemption",
        [
            co("ROOT", "", {"default": 5}),
            co("LEFT", "ROOT", {"default": 5}, w="2"),
            co("RIGHT", "ROOT", {"default": 5}),
        ],
        [
            cq("a", "LEFT", {"default": 1}, "NA", w="2"),
            cq("b", "LEFT", {"default": 1}, "NN"),
            cq("c", "ROOT", {"default": 1}, "NN"),
            cq("d", "RIGHT", {"default": 1}, "NN"),
            cq("e", "RIGHT", {"default": 1}, "NN", w="0.99"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("b1", "b", 1, 1),
            wl("b2", "b", 2, 1),
            wl("b3", "b", 3, 1),
            wl("b4", "b", 4, 1),
            wl("b5", "b", 5, 1),
            wl("c1", "c", 1, 1),
            wl("c2", "c", 2, 1),
            wl("c3", "c", 3, 1),
            wl("c4", "c", 4, 1),
            wl("c5", "c", 5, 1),
            wl("d1", "d", 1, 1),
            wl("d2", "d", 2, 1),
            wl("d3", "d", 3, 1),
            wl("d4", "d", 4, 1),
            wl("d5", "d", 5, 1),
            wl("e1", "e", 1, 1),
            wl("e2", "e", 2, 1),
            wl("e3", "e", 3, 1),
            wl("e4", "e", 4, 1),
            wl("e5", "e", 5, 1),
        ],
        ("a", 0, 5, "default"),
        {"b1": FAIR, "b2": FAIR, "c1": FAIR, "c2": FAIR, "e1": FAIR},
    ),
    (
        "borrowing-cq-in-non-borrowing-cohort-is-protected",
        [co("ROOT", "", {}), co("RIGHT", "ROOT", {"default": 1}, w="0.1")],
        [
            cq("a", "ROOT", {"default": 5}, "LA", w="10"),
            cq("b", "RIGHT", {}, "NN", w="0.1"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1", "a", -1, 1),
            wl("a2", "a", -1, 1),
            wl("a3", "a", -1, 1),
            wl("b1", "b", -1, 1),
        ],
        ("a", 0, 5, "default"),
        {"a1": PRIORITY, "a2": PRIORITY, "a3": PRIORITY},
    ),
    (
        "forced-to-preempt-within-clusterqueue-because-borrowing-workload-too-important",
        [co("ROOT", "", {}), co("RIGHT", "ROOT", {"default": 3}, w="0.1")],
        [
            cq("a", "ROOT", {"default": 5}, "LL", w="10"),
            cq("b", "RIGHT", {}, "NN", w="0.1"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a1", "a", -1, 1),
            wl("a2", "a", -1, 1),
            wl("a3", "a", -1, 1),
            wl("b1", "b", 100, 4),
        ],
        ("a", 0, 4, "default"),
        {"a1": PRIORITY, "a2": PRIORITY, "a3": PRIORITY},
    ),
    (
        "deep-preemption",
        [
            co("ROOT", "", {}),
            co("A", "ROOT", {}, w="1.01"),
            co("AA", "A", {}),
            co("AAA", "AA", {}),
            co("B", "ROOT", {}, w="0.99"),
            co("BB", "B", {}),
            co("BBB", "BB", {}),
            co("C", "ROOT", {}),
            co("CC", "C", {}),
            co("CCC", "CC", {}),
            co("CCCC", "CCC", {"default": 1}),
        ],
        [
            cq("a", "AAA", {"default": 0}, "NA"),
            cq("b", "BBB", {"default": 0}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("b1", "b", 0, 1),
        ],
        ("a", 0, 1, "default"),
        {"b1": FAIR},
    ),
    (
        "cq-with-zero-weight-can-reclaim-nominal-quota",
        [],
        [
            cq("a", "ROOT", {"default": 1}, "NA", w="0.0"),
            cq("b", "ROOT", {"default": 0}, "NN", w="1.0"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("b1", "b", 0, 1),
        ],
        ("a", 0, 1, "default"),
        {"b1": RECLAIM},
    ),
    (
        "cohort-with-zero-weight-can-reclaim-nominal-quota",
        [co("A", "ROOT", {"default": 1}, w="0.0")],
        [
            cq("a", "A", {"default": 0}, "NA", w="0.0"),
            cq("b", "ROOT", {"default": 0}, "NN", w="1.0"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("b1", "b", 0, 1),
        ],
        ("a", 0, 1, "default"),
        {"b1": FAIR},
    ),
    (
        "nominal-first-workload-fitting-within-nominal-can-preempt-despite-high-aggregate-drs",
        [],
        [
            cq("a", "all", {"premium": 3, "cheap": 0}, "NA"),
            cq("b", "all", {"premium": 0, "cheap": 6}, "NN"),
        ],
        ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
        [
            wl("a_prem1", "a", 0, 1, "premium"),
            wl("a_prem2", "a", 0, 1, "premium"),
            wl("a_cheap1", "a", 0, 1, "cheap"),
            wl("a_cheap2", "a", 0, 1, "cheap"),
            wl("a_cheap3", "a", 0, 1, "cheap"),
            wl("a_cheap4", "a", 0, 1, "cheap"),
            wl("a_cheap5", "a", 0, 1, "cheap"),
            wl("b_prem1", "b", 0, 1, "premium"),
        ],
        ("a", 0, 1, "premium"),
        {"b_prem1": RECLAIM},
    ),
]


def fair_model(
    cohorts: Sequence[CohortQuota],
    tenants: Sequence[TenantQuota],
    strategies: Sequence[str] = ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
) -> QuotaModel:
    flavors = sorted(
        {name for t in tenants for name in t.limits}
        | {name for c in cohorts for name in c.limits}
        | {"gpus/default"}
    )
    resources = tuple(
        QuotaResource(name, ("gpu.nvidia.com",), base="gpus", flavor=name.split("/")[1])
        for name in flavors
    )
    return QuotaModel(
        resources,
        {t.tenant: t for t in tenants},
        cohorts={c.name: c for c in cohorts},
        fair_sharing=FairSharing(True, tuple(PreemptionStrategy(s) for s in strategies)),
    )


def usage_of(holdings: Sequence[Holding]) -> dict[str, dict[str, int]]:
    usage: dict[str, dict[str, int]] = {}
    for h in holdings:
        mine = usage.setdefault(h.tenant, {})
        for name, amount in h.amounts.items():
            mine[name] = mine.get(name, 0) + amount
    return usage


@pytest.mark.parametrize(
    ("cohorts", "tenants", "strategies", "holdings", "incoming", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in FAIR_CASES],
)
def test_fair_preemption_table(
    cohorts: list[CohortQuota],
    tenants: list[TenantQuota],
    strategies: tuple[str, ...],
    holdings: list[Holding],
    incoming: tuple[str, int, float, str],
    expected: dict[str, PreemptionReason],
) -> None:
    quotas = fair_model(cohorts, tenants, strategies)
    tenant, priority, amount, flavor = incoming
    amounts = {f"gpus/{flavor}": round(amount * GPU)}
    context = PreemptionContext(
        quotas,
        tenant,
        PriorityClass(f"p{priority}", priority),
        amounts,
        holdings,
        usage_of(holdings),
    )
    found = plan_preemption(context, lambda chosen, node: amounts)
    got = {} if found is None else {v.holding.id: v.reason for v in found.victims}
    assert got == expected


def test_a_fair_sequence_that_frees_no_node_is_made_again_node_by_node() -> None:
    """Fair sharing on: b (nominal 2, holding nothing) asks for 2 GPUs on one node; a
    (nominal 2) holds 3: a-big (2 GPUs on n1, older) and a-small (1 on n2, newest). The
    fleet-wide sequence takes a-small first (the newest), after which a is within nominal, so
    it ends there, freeing 1 GPU of n2: no node fits. Made again node by node, n1's own
    candidate comes first: a-big goes, reason reclaim, and the grant lands on n1."""
    quotas = fair_model(
        [], [cq("a", "all", {"default": 2}, "LA"), cq("b", "all", {"default": 2}, "LA")]
    )
    big = Holding("a-big", "a", PriorityClass("p0", 0), 1.0, {"gpus/default": 2 * GPU})
    small = Holding("a-small", "a", PriorityClass("p0", 0), 2.0, {"gpus/default": GPU})
    node_of = {"a-big": "n1", "a-small": "n2"}
    free = {"n1": 0, "n2": 0}  # free GPUs on each node with nothing revoked
    amounts = {"gpus/default": 2 * GPU}
    context = PreemptionContext(
        quotas, "b", PriorityClass("p0", 0), amounts, [big, small], usage_of([big, small])
    )

    def place(chosen: Sequence[Candidate], node: str) -> dict[str, int] | None:
        freed = dict(free)
        for c in chosen:
            freed[node_of[c.holding.id]] += round(c.holding.amounts["gpus/default"] / GPU)
        fits = [n for n, count in freed.items() if count >= 2 and node in ("", n)]
        return amounts if fits else None

    assert plan_preemption(context, place) is None  # fleet-wide only: a-small frees no node
    found = plan_preemption(context, place, node_of=node_of)
    assert found is not None
    assert (found.node, {v.holding.id: v.reason for v in found.victims}) == (
        "n1",
        {"a-big": RECLAIM},
    )


# --- the brute-force model: any tree, any holdings ---------------------------------------------


@st.composite
def fair_scenes(
    draw: st.DrawFn,
) -> tuple[QuotaModel, list[Holding], str, int, int, tuple[str, ...]]:
    """A root and up to two cohorts below it, 2-4 tenants anywhere with weights 0-2, their
    reservations of priority -1..1 admitted one by one while the rule admitted them, a grant
    of 1-4 GPUs at priority 0..2, and one of Kueue's strategy lists."""
    cohorts = [co("root", "", {"default": draw(st.integers(0, 2))})]
    for i in range(draw(st.integers(0, 2))):
        parent = draw(st.sampled_from([c.name for c in cohorts]))
        cohorts.append(
            co(
                f"c{i}",
                parent,
                {"default": draw(st.integers(0, 2))},
                w=draw(st.sampled_from("012")),
            )
        )
    tenants = [
        cq(
            f"t{i}",
            draw(st.sampled_from([c.name for c in cohorts])),
            {"default": draw(st.integers(0, 3))},
            "LA",
            w=draw(st.sampled_from(["0", "500m", "1", "2"])),
        )
        for i in range(draw(st.integers(2, 4)))
    ]
    strategies = draw(
        st.sampled_from(
            [
                ("LessThanOrEqualToFinalShare", "LessThanInitialShare"),
                ("LessThanOrEqualToFinalShare",),
                ("LessThanInitialShare",),
            ]
        )
    )
    quotas = fair_model(cohorts, tenants, strategies)
    holdings: list[Holding] = []
    for i in range(draw(st.integers(0, 8))):
        tenant = draw(st.sampled_from([t.tenant for t in tenants]))
        gpus = draw(st.integers(1, 2))
        if admit(quotas, tenant, {"gpus/default": gpus * GPU}, usage_of(holdings)):
            continue
        priority = draw(st.integers(-1, 1))
        holdings.append(
            Holding(
                f"h{i}",
                tenant,
                PriorityClass(f"p{priority}", priority),
                float(i),
                {"gpus/default": gpus * GPU},
            )
        )
    who = draw(st.sampled_from([t.tenant for t in tenants]))
    return quotas, holdings, who, draw(st.integers(0, 2)), draw(st.integers(1, 4)), strategies


@settings(max_examples=300, deadline=None)
@given(fair_scenes())
def test_a_fair_plan_fits_spares_nobody_and_takes_only_what_the_rules_allow(
    scene: tuple[QuotaModel, list[Holding], str, int, int, tuple[str, ...]],
) -> None:
    """Whatever the tree, weights and strategy list (Kueue's three), every plan the planner
    returns is checked with the rules' own predicates (`admit`, `dominant_share`,
    `strategy_allows`), computed here from the holdings, never by asking the planner:

    - **No overrun, nobody spared for nothing.** With the victims gone the grant is admitted
      at every level of the tree; without any one of them it is not.
    - **Only what the rules allow.** Each victim is the caller's own of a lower priority, or
      a tenant's that borrows when it is taken: reason reclaim while the caller stays within
      nominal with the grant (Kueue's FairSharingPreemptWithinNominal), else fair-sharing,
      and then one of the strategies allows it, comparing the shares of the two sides just
      below their lowest common cohort. "When it is taken": the victims before it in the
      plan (the order the strategies took them) are gone, and so may be any subset of the
      spared candidates (the fill-back restores one taken earlier that the grant fits
      without). Every subset is tried (a scene holds at most 8 reservations); the states in
      which the victim is allowed are kept, each with the first strategy that allows it.
    - **No priority inversion within a victim's tenant.** Kueue's fair preemption is greedy
      by share: it picks the tenant with the highest share and tries that tenant's candidates
      lowest priority first, the second strategy only on what the first refused. So it
      guarantees lower priority first within one tenant, not across tenants (a higher
      priority of the tenant borrowing most goes before a lower one of a tenant borrowing
      less). Every alternative that swaps one victim of another tenant for a spared
      reservation of that tenant of strictly lower priority is enumerated; one that is
      sufficient (the grant is admitted with it and the other victims gone) and allowed in
      the victim's place in every kept state, by the strategy that allowed the victim there,
      fails the plan: it took a higher priority than the rules needed.

    Not checked: that no set of lower priorities across tenants would do (Kueue does not
    promise it). Kueue does not retry a candidate the first strategy refused once the shares
    have moved; a plan that passed over one that way would fail here (none was found)."""
    quotas, holdings, who, priority, gpus, strategies = scene
    amounts = {"gpus/default": gpus * GPU}
    usage = usage_of(holdings)
    context = PreemptionContext(
        quotas, who, PriorityClass(f"p{priority}", priority), amounts, holdings, usage
    )

    def fits(gone: Sequence[Holding]) -> bool:
        left = usage_of([h for h in holdings if h not in gone])
        return admit(quotas, who, amounts, left) == ()

    if fits([]):
        return
    found = plan_preemption(context, lambda chosen, node: amounts)
    if found is None:
        return
    victims = [v.holding for v in found.victims]
    assert fits(victims)
    for victim in victims:
        assert not fits([h for h in victims if h is not victim]), "a victim could be spared"
    nominal = quotas.tenants[who].of("gpus/default").nominal
    within = usage.get(who, {}).get("gpus/default", 0) + amounts["gpus/default"] <= nominal
    spared = [h for h in holdings if h not in victims]
    for k, planned in enumerate(found.victims):
        h = planned.holding
        if planned.reason is PRIORITY:
            assert h.tenant == who and h.priority.value < priority
            continue
        assert h.tenant != who and _borrows(quotas, h.tenant, usage)
        assert planned.reason is (RECLAIM if within else FAIR)
        # gone when h was taken: the victims before it in the plan and any of the spared
        # candidates (taken before it, then restored by the fill-back); reclaim needs only
        # that h's tenant borrows, fair sharing the first strategy that allows h (Kueue tries
        # the second only on what the first refused)
        restorable = [x for x in spared if x.tenant != who or x.priority.value < priority]
        rules = [None] if within else [PreemptionStrategy(x) for x in strategies]
        states: list[tuple[list[Holding], PreemptionStrategy | None]] = []
        for n in range(len(restorable) + 1):
            for extra in itertools.combinations(restorable, n):
                gone = [*victims[:k], *extra]
                left = [x for x in holdings if x not in gone]
                allowing = [r for r in rules if _allowed(quotas, who, amounts, left, h, r)]
                if allowing:
                    states.append((gone, allowing[0]))
        assert states, f"{h.id} taken though the rules do not allow it"
        for c in spared:
            if c.tenant != h.tenant or c.priority.value >= h.priority.value:
                continue
            swapped = [x for x in victims if x is not h] + [c]
            allowed = all(
                _allowed(
                    quotas, who, amounts, [x for x in holdings if x not in gone or x is c], c, rule
                )
                for gone, rule in states
            )
            assert not (fits(swapped) and allowed), (
                f"{h.id} (priority {h.priority.value}) taken where {c.id} "
                f"(priority {c.priority.value}) would do"
            )


def _share(quotas: QuotaModel, key: NodeKey, usage: Mapping[str, Usage]) -> Share:
    """`key`'s dominant resource share with `usage`, from the tree's levels of every resource."""
    levels = {
        r.name: tree_levels(
            quotas.tree, r.name, {t: u.get(r.name, 0) for t, u in usage.items()}, key
        )
        for r in quotas.resources
    }
    return dominant_share(quotas.tree, key, levels, quotas.base_of())


def _allowed(
    quotas: QuotaModel,
    who: str,
    amounts: Usage,
    left: Sequence[Holding],
    victim: Holding,
    strategy: PreemptionStrategy | None,
) -> bool:
    """Whether, with only `left` held and the grant counted, `victim`'s tenant borrows and
    (for fair sharing; None for reclaim) `strategy` lets the caller take `victim`, comparing
    the shares of the two sides just below their lowest common cohort."""
    before = usage_of(left)
    if not _borrows(quotas, victim.tenant, before):
        return False
    if strategy is None:
        return True
    tree = quotas.tree
    mine, theirs = tenant_node(who), tenant_node(victim.tenant)
    lca = next(a for a in tree.ancestors(theirs) if a in set(tree.ancestors(mine)))

    def side(key: NodeKey) -> NodeKey:
        while tree.parent(key) != lca:
            parent = tree.parent(key)
            assert parent is not None
            key = parent
        return key

    after = usage_of([h for h in left if h is not victim])
    for usage in (before, after):  # the caller's usage counts its grant
        mine_now = usage.setdefault(who, {})
        for name, amount in amounts.items():
            mine_now[name] = mine_now.get(name, 0) + amount
    preemptor_new = _share(quotas, side(mine), before)
    target_old = _share(quotas, side(theirs), before)
    target_new = _share(quotas, side(theirs), after)
    return strategy_allows(strategy, preemptor_new, target_old, target_new)


def _borrows(quotas: QuotaModel, tenant: str, usage: Mapping[str, Usage]) -> bool:
    return (
        usage.get(tenant, {}).get("gpus/default", 0)
        > quotas.tenants[tenant].of("gpus/default").nominal
    )
