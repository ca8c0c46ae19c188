"""A batch of identical items (core.solve_many) equals the same items solved one by one.

The reference is the plain loop a caller would write: `solve`, add the placement to the state,
`solve` again. Over generated fleets (random machine shapes repeated over nodes, random
holdings: test_node_choice's clusters; and the benchmark's generator with MIG nodes and NVLink
topologies), random claims, every policy, unpinned, pinned and restricted to some nodes: the
same placements in the same order, and the same point where items stop fitting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadtest.clusters import device_classes, generate
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
    build_plan,
    solve,
    solve_many,
)
from services.common.dra.model import (
    AllocationResult,
    DeviceClass,
    DeviceRequest,
    DeviceSelector,
    DeviceSubRequest,
    ExactDeviceRequest,
    ResourceClaim,
)
from services.common.errors import GpuallocError, InvalidArgument
from tests.unit.allocator.test_node_choice import clusters
from tests.unit.allocator.test_solver_properties import CLASSES, claims

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def one_by_one(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: dict[str, DeviceClass],
    claims_: Sequence[ResourceClaim],
    count: int,
    **options: Any,
) -> list[SolveResult]:
    """The reference: each item solved on its own, on the state holding the ones before it."""
    results: list[SolveResult] = []
    for _ in range(count):
        result = solve(snapshot, state, classes, claims_, **options)
        results.append(result)
        if not isinstance(result, Allocated):
            break
        for allocation in result.allocations:
            state = state.with_allocation(allocation, "earlier")
    return results


def placements(results: Sequence[SolveResult]) -> list[object]:
    return [
        (r.node, r.allocations) if isinstance(r, Allocated) else ("unsatisfiable",) for r in results
    ]


def outcome(call: Any) -> list[object] | str:
    try:
        return placements(call())
    except GpuallocError as error:
        return f"{type(error).__name__}: {error.message}"


@SETTINGS
@given(
    cluster=clusters(),
    claims_=claims(),
    policy=st.sampled_from(list(Policy)),
    count=st.integers(1, 12),
    where=st.sampled_from(["any", "pinned", "restricted"]),
    data=st.data(),
)
def test_a_batch_equals_its_items_one_by_one(
    cluster: tuple[ClusterSnapshot, list[tuple[str, AllocationResult]]],
    claims_: list[ResourceClaim],
    policy: Policy,
    count: int,
    where: str,
    data: st.DataObject,
) -> None:
    snapshot, held = cluster
    state = AllocatedState.build(snapshot, held)
    names = list(snapshot.node_names)
    options: dict[str, Any] = {"policy": policy}
    if where == "pinned":
        options["node"] = data.draw(st.sampled_from(names))
    elif where == "restricted":
        options["nodes"] = data.draw(st.sets(st.sampled_from(names), min_size=1))
    batch = outcome(
        lambda: solve_many(
            snapshot, state, CLASSES, claims_, count, selectors=SelectorCache(), **options
        )
    )
    alone = outcome(
        lambda: one_by_one(
            snapshot, state, CLASSES, claims_, count, selectors=SelectorCache(), **options
        )
    )
    assert batch == alone


# --- the benchmark's fleets: MIG nodes, NVLink topologies, partly used nodes ----------------

_DRIVER = "gpu.nvidia.com"
_ATTR = f"device.attributes['{_DRIVER}']"


def _request(name: str, count: int = 1, cel: str | None = None) -> DeviceRequest:
    selectors = (DeviceSelector(cel),) if cel else ()
    return DeviceRequest(name, ExactDeviceRequest(_DRIVER, selectors, count=count))


MIG_FALLBACK = DeviceRequest(
    "mig",
    first_available=(
        DeviceSubRequest(
            "small", "mig.nvidia.com", (DeviceSelector(f"{_ATTR}.profile.startsWith('1g.')"),)
        ),
        DeviceSubRequest(
            "medium", "mig.nvidia.com", (DeviceSelector(f"{_ATTR}.profile.startsWith('2g.')"),)
        ),
        DeviceSubRequest("whole", "gpu.nvidia.com", (DeviceSelector("true"),)),
    ),
)
KINDS: dict[str, tuple[tuple[ResourceClaim, ...], dict[str, Any]]] = {
    "one-h100": (
        (
            ResourceClaim(
                "one",
                "bench",
                requests=(_request("gpu", cel=f"{_ATTR}.productName == 'NVIDIA H100 80GB HBM3'"),),
            ),
        ),
        {},
    ),
    "four-nvlink": (
        (ResourceClaim("four", "bench", requests=(_request("gpus", 4),)),),
        {"topology_constraints": (TopologyConstraint(TopologyKind.NVLINK_CONNECTED),)},
    ),
    "eight": ((ResourceClaim("eight", "bench", requests=(_request("gpus", 8),)),), {}),
    "mig-fallback": ((ResourceClaim("mig", "bench", requests=(MIG_FALLBACK,)),), {}),
    "two-claims": (
        (
            ResourceClaim("a", "bench", requests=(MIG_FALLBACK,)),
            ResourceClaim("b", "bench", requests=(_request("gpus", 2),)),
        ),
        {},
    ),
}


@pytest.mark.parametrize("policy", list(Policy), ids=lambda p: str(p).lower())
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_batch_on_a_generated_fleet_equals_its_items_one_by_one(
    kind: str, policy: Policy
) -> None:
    cluster = generate(320, seed=7)
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    state = AllocatedState.build(snapshot, cluster.held)
    claims_, options = KINDS[kind]
    classes = device_classes()
    count = 60
    batch = solve_many(
        snapshot,
        state,
        classes,
        claims_,
        count,
        policy=policy,
        selectors=SelectorCache(),
        **options,
    )
    alone = one_by_one(
        snapshot,
        state,
        classes,
        claims_,
        count,
        policy=policy,
        selectors=SelectorCache(),
        **options,
    )
    assert placements(batch) == placements(alone)
    assert len(batch) >= 2


@pytest.mark.parametrize("policy", list(Policy), ids=lambda p: str(p).lower())
@pytest.mark.parametrize("kind", list(KINDS))
def test_batches_sharing_their_plan_and_facts_answer_as_fresh_ones(
    kind: str, policy: Policy
) -> None:
    """The service passes every batch of a shape its kept plan and SolveFacts (app/placing.py):
    batch after batch, each on the state holding the ones before, the placements are those of
    batches that work everything out afresh (Stats may differ: they count what the search
    evaluated, and kept facts and outcomes spare evaluations, as they do for unary solves)."""
    cluster = generate(320, seed=11)
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    claims_, options = KINDS[kind]
    classes = device_classes()
    plan, facts, selectors = build_plan(claims_, classes), SolveFacts(), SelectorCache()
    shared_state = fresh_state = AllocatedState.build(snapshot, cluster.held)
    for _ in range(3):
        shared_holding = shared_state.detached(groups=True)
        shared = solve_many(
            snapshot,
            shared_state,
            classes,
            claims_,
            20,
            policy=policy,
            selectors=selectors,
            holding=shared_holding,
            plan=plan,
            facts=facts,
            **options,
        )
        fresh_holding = fresh_state.detached(groups=True)
        fresh = solve_many(
            snapshot,
            fresh_state,
            classes,
            claims_,
            20,
            policy=policy,
            selectors=SelectorCache(),
            holding=fresh_holding,
            **options,
        )
        assert placements(shared) == placements(fresh)
        shared_state, fresh_state = shared_holding, fresh_holding


def test_a_batch_stops_at_the_first_item_that_does_not_fit() -> None:
    cluster = generate(16, seed=1, partly_used=False)
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    state = AllocatedState(snapshot)
    claims_, options = KINDS["eight"]
    results = solve_many(
        snapshot, state, device_classes(), claims_, 5, selectors=SelectorCache(), **options
    )
    assert [isinstance(r, Allocated) for r in results] == [True, True, False]


def test_a_negative_count_is_invalid() -> None:
    snapshot = ClusterSnapshot.build([])
    with pytest.raises(InvalidArgument):
        solve_many(snapshot, AllocatedState(snapshot), {}, [], -1, selectors=SelectorCache())


# --- outcomes kept per node group (core/outcomes.py) -----------------------------------------


def _fleet() -> tuple[ClusterSnapshot, AllocatedState]:
    cluster = generate(320, seed=7)
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    return snapshot, AllocatedState.build(snapshot, cluster.held)


def test_a_repeated_question_reads_kept_outcomes_instead_of_searching(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services.allocator.core import search

    snapshot, state = _fleet()
    claims_, options = KINDS["mig-fallback"]
    first = solve(snapshot, state, device_classes(), claims_, selectors=SelectorCache(), **options)
    runs: list[object] = []
    original = search.NodeSearch.run

    def counted(self: search.NodeSearch) -> bool:
        runs.append(self)
        return original(self)

    monkeypatch.setattr(search.NodeSearch, "run", counted)
    again = solve(snapshot, state, device_classes(), claims_, selectors=SelectorCache(), **options)
    assert isinstance(first, Allocated) and isinstance(again, Allocated)
    assert (again.node, again.allocations, again.score) == (
        first.node,
        first.allocations,
        first.score,
    )
    assert again.stats.steps == first.stats.steps  # a kept outcome charges its search's steps
    assert runs == []


def test_a_kept_outcome_does_not_stretch_a_budget() -> None:
    from services.allocator.core import SearchBudget

    snapshot, state = _fleet()
    claims_, options = KINDS["eight"]
    classes = device_classes()
    solve(snapshot, state, classes, claims_, selectors=SelectorCache(), **options)
    tight = SearchBudget(max_steps=1)
    again = solve(snapshot, state, classes, claims_, selectors=SelectorCache(), budget=tight)
    assert not isinstance(again, Allocated) and again.budget_exhausted
