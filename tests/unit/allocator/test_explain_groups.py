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
    AllocatedState,
    ClusterSnapshot,
    Policy,
    SelectorCache,
    SolveResult,
    solve,
)
from services.allocator.core import solver as solver_module
from services.common.dra.model import AllocationResult, ResourceClaim
from services.common.errors import GpuallocError
from tests.unit.allocator.test_batch import KINDS, SETTINGS
from tests.unit.allocator.test_node_choice import clusters
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
    grouped = explained(call)
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
