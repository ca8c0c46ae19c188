"""SolveFacts (core/candidates.py): what the solves of one plan work out from the question alone,
kept between solves (app/placing.py's PlanMemo keeps one per plan), never changes an answer.

A caller that keeps one SolveFacts for its plan and solves again and again — on a state that
holds each placement before the next, under other policies, with or without topology
constraints, on another snapshot, explaining or not — gets what a solve with nothing kept
answers, every time (generated fleets: test_node_choice's clusters and test_solver_properties'
claims; the benchmark's generated fleet). And PlanMemo's facts are its plan's, for one
snapshot at a time.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadtest.clusters import device_classes, generate
from services.allocator.app.placing import PlanMemo
from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    Policy,
    SelectorCache,
    SolveFacts,
    SolveResult,
    TopologyConstraint,
    TopologyKind,
    Unsatisfiable,
    build_plan,
    solve,
)
from services.common.dra.model import AllocationResult, ResourceClaim
from services.common.errors import GpuallocError
from tests.builders import claim, classes, cls
from tests.unit.allocator.test_batch import KINDS, placements
from tests.unit.allocator.test_node_choice import clusters
from tests.unit.allocator.test_solver_properties import CLASSES, claims

GPU_CLASSES = classes(cls("gpu", "device.driver == 'gpu.example.com'"))
ONE = claim("one").request("gpu").build()
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@SETTINGS
@given(
    cluster=clusters(),
    other=clusters(),
    claims_=claims(),
    asks=st.lists(
        st.tuples(
            st.sampled_from(list(Policy)),
            st.booleans(),  # with a topology constraint
            st.booleans(),  # explain
            st.booleans(),  # on the other snapshot
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_solves_that_keep_their_facts_answer_as_solves_that_keep_nothing(
    cluster: tuple[ClusterSnapshot, list[tuple[str, AllocationResult]]],
    other: tuple[ClusterSnapshot, list[tuple[str, AllocationResult]]],
    claims_: list[ResourceClaim],
    asks: list[tuple[Policy, bool, bool, bool]],
) -> None:
    states = {
        id(snapshot): (snapshot, AllocatedState.build(snapshot, held))
        for snapshot, held in (cluster, other)
    }
    facts = SolveFacts()
    selectors = SelectorCache()
    try:
        plan = build_plan(claims_, CLASSES)
    except Exception:  # noqa: BLE001 - a plan the classes refuse: nothing to keep
        return
    nvlink = (TopologyConstraint(TopologyKind.NVLINK_CONNECTED, required=False),)
    for policy, constrained, explain, elsewhere in asks:
        snapshot, state = states[id((other if elsewhere else cluster)[0])]
        options: dict[str, Any] = {
            "policy": policy,
            "explain": explain,
            "topology_constraints": nvlink if constrained else (),
        }
        kept = answer(snapshot, state, claims_, selectors, plan=plan, facts=facts, **options)
        alone = answer(snapshot, state, claims_, SelectorCache(), **options)
        assert placements_or_error(kept) == placements_or_error(alone)
        if explain and isinstance(kept, Allocated | Unsatisfiable):
            assert isinstance(alone, Allocated | Unsatisfiable)
            assert kept.explanation == alone.explanation
        if isinstance(kept, Allocated):  # the next solve sees this one held
            for allocation in kept.allocations:
                state = state.with_allocation(allocation, "earlier")
            states[id(snapshot)] = (snapshot, state)


def answer(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    claims_: list[ResourceClaim],
    selectors: SelectorCache,
    **options: Any,
) -> SolveResult | GpuallocError:
    try:
        return solve(snapshot, state, CLASSES, claims_, selectors=selectors, **options)
    except GpuallocError as error:
        return error


def placements_or_error(result: SolveResult | GpuallocError) -> object:
    if isinstance(result, GpuallocError):
        return f"{type(result).__name__}: {result.message}"
    return placements([result])


@pytest.mark.parametrize("kind", list(KINDS))
def test_kept_facts_on_a_generated_fleet_answer_as_a_fresh_solve(kind: str) -> None:
    cluster = generate(320, seed=7)
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    state = AllocatedState.build(snapshot, cluster.held)
    claims_, options = KINDS[kind]
    classes = device_classes()
    plan, facts, selectors = build_plan(claims_, classes), SolveFacts(), SelectorCache()
    for policy in [*Policy, *Policy]:  # each policy twice: the second reads the kept facts
        kept = solve(
            snapshot,
            state,
            classes,
            claims_,
            policy=policy,
            selectors=selectors,
            plan=plan,
            facts=facts,
            **options,
        )
        alone = solve(
            snapshot, state, classes, claims_, policy=policy, selectors=SelectorCache(), **options
        )
        assert placements([kept]) == placements([alone])
        if isinstance(kept, Allocated):
            for allocation in kept.allocations:
                state = state.with_allocation(allocation, "earlier")


@pytest.mark.parametrize(
    ("change", "kept"),
    [
        pytest.param({}, True, id="same-question"),
        pytest.param({"snapshot": "other"}, False, id="other-snapshot"),
        pytest.param({"selectors": "other"}, False, id="other-selectors"),
        pytest.param({"plan": "other"}, False, id="other-plan"),
        pytest.param({"question": ("FIRST_FIT",)}, False, id="other-question"),
        pytest.param({"question": ("BINPACK",)}, True, id="equal-question"),
    ],
)
def test_facts_are_kept_only_for_the_same_plan_snapshot_selectors_and_question(
    change: dict[str, Any], kept: bool
) -> None:
    one = ClusterSnapshot.build([], [])
    plan = build_plan([], CLASSES)
    selectors = SelectorCache()
    facts = SolveFacts()
    first = facts.of(plan, one, selectors, ("BINPACK",))
    first["worked-out"] = True
    asked = {
        "plan": build_plan([], CLASSES) if change.get("plan") else plan,
        "snapshot": ClusterSnapshot.build([], []) if change.get("snapshot") else one,
        "selectors": SelectorCache() if change.get("selectors") else selectors,
        "question": change.get("question", ("BINPACK",)),
    }
    again = facts.of(**asked)
    assert (again is first) is kept
    assert ("worked-out" in again) is kept


def test_plan_memo_clears_its_facts_for_a_new_snapshot() -> None:
    memo = PlanMemo()
    one, two = ClusterSnapshot.build([], []), ClusterSnapshot.build([], [])
    selectors = SelectorCache()
    plan, facts = memo.question((ONE,), GPU_CLASSES, one)
    facts.of(plan, one, selectors, ())["worked-out"] = True
    assert memo.question((ONE,), GPU_CLASSES, one) == (plan, facts)
    assert "worked-out" in facts.of(plan, one, selectors, ())
    assert memo.question((ONE,), GPU_CLASSES, two) == (plan, facts)  # the same plan and holder
    assert "worked-out" not in facts.of(plan, one, selectors, ())  # ... emptied
