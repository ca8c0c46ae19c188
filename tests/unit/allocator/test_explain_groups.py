"""Explaining by node groups (core/replay.py) gives the explanation searching every node gives.

The reference is the solver with replays turned off: every node searched on its own, every
device recorded as it is met. Over generated fleets (test_node_choice's clusters: machine shapes
repeated over nodes with random holdings; the benchmark's generator: MIG nodes, NVLink
topologies, partly used nodes), random claims and every policy: the same answer, explanation
(closest misses per node, rejection groups with counts and examples, constraints, choice) and
search statistics.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadtest.clusters import device_classes, generate
from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    Policy,
    ReasonCode,
    SelectorCache,
    SolveResult,
    Unsatisfiable,
    solve,
)
from services.allocator.core import solver as solver_module
from services.common.dra.model import AllocationResult, ResourceClaim
from services.common.errors import GpuallocError
from tests.builders import DRIVER, claim
from tests.unit.allocator.test_batch import KINDS, SETTINGS
from tests.unit.allocator.test_node_choice import GPU, clusters, held_on, machine
from tests.unit.allocator.test_solver_properties import CLASSES, claims


def explained(call: Any) -> SolveResult | str:
    """The answer, its CEL cache counters left out (the template's checks evaluate a
    selector once per template, not once per node: fewer cache hits, the same outcomes)."""
    try:
        result: SolveResult = call()
    except GpuallocError as error:
        return f"{type(error).__name__}: {error.message}"
    return replace(result, stats=replace(result.stats, cel_evaluations=0, cel_profile_hits=0))


def both(call: Any) -> tuple[SolveResult | str, SolveResult | str]:
    """(by groups, node by node); by groups twice: the second reads the first's kept tapes."""
    grouped = explained(call)
    assert explained(call) == grouped
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(solver_module.NodeRun, "_replaying", lambda self: None)
        alone = explained(call)
    return grouped, alone


@SETTINGS
@given(
    cluster=clusters(),
    claims_=claims(),
    policy=st.sampled_from(list(Policy)),
    restricted=st.booleans(),
    data=st.data(),
)
def test_explaining_by_groups_equals_searching_every_node(
    cluster: tuple[ClusterSnapshot, list[tuple[str, AllocationResult]]],
    claims_: list[ResourceClaim],
    policy: Policy,
    restricted: bool,
    data: st.DataObject,
) -> None:
    snapshot, held = cluster
    state = AllocatedState.build(snapshot, held)
    nodes = None
    if restricted:
        nodes = data.draw(st.sets(st.sampled_from(list(snapshot.node_names)), min_size=1))
    grouped, alone = both(
        lambda: solve(
            snapshot,
            state,
            CLASSES,
            claims_,
            policy=policy,
            selectors=SelectorCache(),
            explain=True,
            nodes=nodes,
        )
    )
    assert grouped == alone


@pytest.mark.parametrize("policy", list(Policy), ids=lambda p: str(p).lower())
@pytest.mark.parametrize("kind", list(KINDS))
def test_explaining_a_generated_fleet_by_groups_equals_searching_every_node(
    kind: str, policy: Policy
) -> None:
    cluster = generate(640, seed=11)
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    state = AllocatedState.build(snapshot, cluster.held)
    claims_, options = KINDS[kind]
    classes = device_classes()
    grouped, alone = both(
        lambda: solve(
            snapshot,
            state,
            classes,
            claims_,
            policy=policy,
            selectors=SelectorCache(),
            explain=True,
            **options,
        )
    )
    assert grouped == alone


# --- node-group reuse, case by case ------------------------------------------------------------


def _searches(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    from services.allocator.core import search

    searched: list[str | None] = []
    original = search.NodeSearch.run

    def counted(self: search.NodeSearch) -> bool:
        searched.append(self.view.name)
        return original(self)

    monkeypatch.setattr(search.NodeSearch, "run", counted)
    return searched


def test_one_node_of_a_group_is_searched_and_every_node_is_explained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Eight alike nodes, half of them with two GPUs held: two groups, two searches, and
    every node still has its own closest miss (a claim of four GPUs does not fit the half
    with two held)."""
    snapshot = ClusterSnapshot.build([machine(f"node-{i}") for i in range(8)])
    held = [held_on(f"node-{i}", "gpu-0", "gpu-1") for i in range(0, 8, 2)]
    state = AllocatedState.build(snapshot, held)
    claims_ = [claim("c").request("g", "gpu", 4).build()]
    searched = _searches(monkeypatch)
    result = solve(snapshot, state, GPU, claims_, selectors=SelectorCache(), explain=True)
    assert isinstance(result, Allocated) and result.explanation is not None
    assert result.node == "node-1"
    assert len(searched) == 1  # node-0's group is pruned unsearched, node-1's searched once
    assert [m.node for m in result.explanation.nodes] == [f"node-{i}" for i in range(0, 8, 2)]
    assert result.explanation.choice is not None
    assert result.explanation.choice.feasible_nodes == 4
    assert result.explanation.choice.runner_up == "node-3"


def test_replayed_nodes_name_their_own_holders() -> None:
    """Devices in use are explained node by node: each node's reservation holds its GPUs."""
    snapshot = ClusterSnapshot.build([machine(f"node-{i}") for i in range(3)])
    held = [held_on(f"node-{i}", "gpu-0", "gpu-1", "gpu-2", "gpu-3") for i in range(3)]
    state = AllocatedState.build(snapshot, held)
    claims_ = [claim("c").request("g", "gpu", 1).build()]
    result = solve(snapshot, state, GPU, claims_, selectors=SelectorCache(), explain=True)
    assert isinstance(result, Unsatisfiable)
    (request,) = result.explanation.requests
    in_use = {g.holders: g.count for g in request.rejections if g.code is ReasonCode.IN_USE}
    assert in_use == {(f"default/node-{i}",): 4 for i in range(3)}
    assert request.considered == 12


def test_counts_and_examples_add_up_over_a_group() -> None:
    """A selector false for every device: 4 per node, 20 in all, the smallest ids as examples."""
    snapshot = ClusterSnapshot.build([machine(f"node-{i}") for i in range(5)])
    state = AllocatedState(snapshot)
    selector = f'device.attributes["{DRIVER}"].model == "a100"'
    claims_ = [claim("c").request("g", "gpu", 1, selector).build()]
    result = solve(snapshot, state, GPU, claims_, selectors=SelectorCache(), explain=True)
    assert isinstance(result, Unsatisfiable)
    (request,) = result.explanation.requests
    (group,) = request.rejections
    assert (group.code, group.count) == (ReasonCode.REQUEST_SELECTOR, 20)
    assert group.examples == (
        f"{DRIVER}/node-0/gpu-0",
        f"{DRIVER}/node-0/gpu-1",
        f"{DRIVER}/node-0/gpu-2",
    )
