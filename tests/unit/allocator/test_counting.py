"""Capacity (core.count_units) against brute force: place units until nothing fits.

Two references that know nothing of node groups, kept outcomes or counter sets:

- per node, the old count: pinned solves on a copy of the state, one unit after another, until
  one does not fit (what app/capacity_count.py did node by node before the core counted);
- for the whole fleet, a batch of units placed until one does not fit (unpinned solves, each
  on the state holding the ones before it): the same total, the same units per node and per
  GPU model, since a node's devices are its own.

Over test_node_choice's clusters (random machine shapes repeated over nodes, random holdings,
shared devices among them) and the benchmark's generator (MIG nodes in the DynamicMIG layout,
NVLink topologies, partly used nodes), random claims and every policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadtest.clusters import device_classes, generate
from services.allocator.core import (
    UNKNOWN_MODEL,
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    Policy,
    SearchBudget,
    SelectorCache,
    count_units,
    solve,
)
from services.common.dra.model import (
    AllocationResult,
    DeviceClass,
    Node,
    ResourceClaim,
    ResourceSlice,
)
from services.common.errors import GpuallocError
from tests import builders as b
from tests.unit.allocator.test_batch import KINDS, SETTINGS
from tests.unit.allocator.test_node_choice import clusters
from tests.unit.allocator.test_solver_properties import CLASSES, claims

Counted = tuple[int, dict[str, int], dict[str, int], bool]  # total, per node, per model, cut
MAX_UNITS = 1024


def model_of(snapshot: ClusterSnapshot, result: Allocated) -> str:
    for allocation in result.allocations:
        for device in allocation.results:
            entry = snapshot.device(device.device_id)
            if entry is not None:
                value = entry.device.attributes.get("productName") or entry.device.attributes.get(
                    f"{entry.id.driver}/productName"
                )
                return str(value.value) if value is not None else UNKNOWN_MODEL
    return UNKNOWN_MODEL


def node_by_node(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: dict[str, DeviceClass],
    claims_: Sequence[ResourceClaim],
    max_units: int = MAX_UNITS,
    **options: Any,
) -> Counted:
    per_node: dict[str, int] = {}
    models: dict[str, int] = {}
    cut = False
    for name in snapshot.node_names:
        held = state
        while True:
            if per_node.get(name, 0) == max_units:
                cut = True  # units that take nothing (adminAccess) never stop
                break
            try:
                result = solve(
                    snapshot,
                    held,
                    classes,
                    claims_,
                    node=name,
                    selectors=SelectorCache(),
                    **options,
                )
            except GpuallocError:
                break  # a node-only error skips the node
            if not isinstance(result, Allocated):
                break
            per_node[name] = per_node.get(name, 0) + 1
            models[model_of(snapshot, result)] = models.get(model_of(snapshot, result), 0) + 1
            for allocation in result.allocations:
                held = held.with_allocation(allocation, "unit")
    return sum(per_node.values()), per_node, models, cut


def until_nothing_fits(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: dict[str, DeviceClass],
    claims_: Sequence[ResourceClaim],
    **options: Any,
) -> Counted:
    per_node: dict[str, int] = {}
    models: dict[str, int] = {}
    while True:
        result = solve(snapshot, state, classes, claims_, selectors=SelectorCache(), **options)
        if not isinstance(result, Allocated):
            break
        assert result.node is not None
        per_node[result.node] = per_node.get(result.node, 0) + 1
        models[model_of(snapshot, result)] = models.get(model_of(snapshot, result), 0) + 1
        for allocation in result.allocations:
            state = state.with_allocation(allocation, "unit")
    return sum(per_node.values()), per_node, models, False


def counted(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: dict[str, DeviceClass],
    claims_: Sequence[ResourceClaim],
    max_units: int = MAX_UNITS,
    **options: Any,
) -> Counted:
    units = count_units(
        snapshot,
        state,
        classes,
        claims_,
        list(snapshot.node_names),
        selectors=SelectorCache(),
        max_units=max_units,
        **options,
    )
    per_node = {n.node: n.count for n in units.nodes}
    return units.total, per_node, dict(units.models), units.cut


def outcome(call: Any) -> Counted | str:
    try:
        result: Counted = call()
    except GpuallocError as error:
        return f"{type(error).__name__}: {error.message}"
    return result


@SETTINGS
@given(cluster=clusters(), claims_=claims(), policy=st.sampled_from(list(Policy)))
def test_capacity_equals_counting_every_node_on_its_own(
    cluster: tuple[ClusterSnapshot, list[tuple[str, AllocationResult]]],
    claims_: list[ResourceClaim],
    policy: Policy,
) -> None:
    snapshot, held = cluster
    state = AllocatedState.build(snapshot, held)
    mine = outcome(lambda: counted(snapshot, state, CLASSES, claims_, 8, policy=policy))
    reference = node_by_node(snapshot, state, CLASSES, claims_, 8, policy=policy)
    if isinstance(mine, str):  # an error of every node is the question's
        assert reference[0] == 0
    else:
        assert mine == reference


def shared_and_tainted(node: str) -> list[ResourceSlice]:
    """d0: shared (allowMultipleAllocations), mem=1, b=x; d1: tainted t, without b."""
    d0 = b.device("d0").attr("b", "x").capacity("mem", "1").multi()
    return [b.slice_(f"{node}-slice", d0, b.device("d1").taint("t", "v")).node(node).build()]


def beside_an_invalid_pool(node: str) -> list[ResourceSlice]:
    """g0 in a valid pool, then a pool made invalid by a repeated device name."""
    bad = b.slice_(f"{node}-bad", b.device("x"), b.device("x")).node(node).pool(f"{node}-bad")
    return [b.slice_(f"{node}-gpus", b.device("g0")).node(node).pool(node).build(), bad.build()]


# One unit fits (s0: d0's whole mem); the next takes s1, `All` over d0 and d1 — d1 lacks b, so
# the pinned solve raises (a claim constraint fails in All mode), unless d1 is held (no fit).
ALL_OR_ERROR = (
    b.claim("c0")
    .first_available(
        "r0",
        b.sub("s0", "any", 0, all_devices=True, capacity={"mem": "1"}),
        b.sub("s1", "any", 0, all_devices=True, tolerations=[b.toleration("t", exists=True)]),
    )
    .match(f"{b.DRIVER}/b")
    .build()
)
# One unit takes g0; the next reaches the invalid pool, which is the node's error (grouped).
ONE_DEVICE = b.claim("c0").request("r0", "any").build()

NEXT_UNIT_ERRS = [  # shape, nodes, held devices per node, claim, units per node
    pytest.param(
        shared_and_tainted,
        1,
        {},
        ALL_OR_ERROR,
        {"node-0": 1},
        id="one-node-errs-at-its-second-unit",
    ),
    pytest.param(
        shared_and_tainted,
        2,
        {"node-0": ["d1"]},
        ALL_OR_ERROR,
        {"node-0": 1, "node-1": 1},
        id="a-node-erring-at-its-second-unit-beside-one-that-does-not",
    ),
    pytest.param(
        beside_an_invalid_pool,
        2,
        {},
        ONE_DEVICE,
        {"node-0": 1, "node-1": 1},
        id="grouped-nodes-err-at-their-second-unit",
    ),
    pytest.param(
        beside_an_invalid_pool,
        2,
        {"node-0": ["g0"]},
        ONE_DEVICE,
        {"node-1": 1},
        id="grouped-node-erring-at-its-first-unit-is-skipped",
    ),
]


@pytest.mark.parametrize(("shape", "nodes", "held", "claim_", "expected"), NEXT_UNIT_ERRS)
def test_a_node_whose_next_unit_errs_keeps_the_units_before(
    shape: Callable[[str], list[ResourceSlice]],
    nodes: int,
    held: dict[str, list[str]],
    claim_: ResourceClaim,
    expected: dict[str, int],
) -> None:
    """Hypothesis's counterexamples, minimised: a pinned solve that raises after earlier units
    ends the node's count there, as one that does not fit (node_by_node), pinned or not; only
    an error of the node's first unit is the node's (skipped; raised for a pinned node)."""
    names = [f"node-{i}" for i in range(nodes)]
    snapshot = ClusterSnapshot.build([s for n in names for s in shape(n)], [Node(n) for n in names])
    state = AllocatedState.build(
        snapshot,
        [
            (f"default/{n}", b.allocation(*(b.result("held", d, n) for d in devices)))
            for n, devices in held.items()
        ],
    )
    for policy in Policy:
        mine = counted(snapshot, state, CLASSES, [claim_], 8, policy=policy)
        assert mine == (sum(expected.values()), expected, {UNKNOWN_MODEL: mine[0]}, False)
        assert mine == node_by_node(snapshot, state, CLASSES, [claim_], 8, policy=policy)
        for name in names:
            try:
                pinned = count_units(
                    snapshot,
                    state,
                    CLASSES,
                    [claim_],
                    [name],
                    pinned=True,
                    policy=policy,
                    selectors=SelectorCache(),
                )
            except GpuallocError:
                assert name not in expected  # the node's own error: its first unit errs
            else:
                assert pinned.total == expected[name]


@pytest.mark.parametrize("policy", list(Policy), ids=lambda p: str(p).lower())
@pytest.mark.parametrize("kind", list(KINDS))
def test_capacity_of_a_generated_fleet_equals_placing_until_nothing_fits(
    kind: str, policy: Policy
) -> None:
    cluster = generate(160, seed=3)
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    state = AllocatedState.build(snapshot, cluster.held)
    claims_, options = KINDS[kind]
    classes = device_classes()
    mine = counted(snapshot, state, classes, claims_, policy=policy, **options)
    assert mine == until_nothing_fits(snapshot, state, classes, claims_, policy=policy, **options)
    assert mine == node_by_node(snapshot, state, classes, claims_, policy=policy, **options)
    assert mine[0] > 0


def test_a_budget_cuts_the_count_as_pinned_solves_would() -> None:
    """With too few steps for one unit's search the count is a lower bound, nothing counted."""
    cluster = generate(160, seed=3)
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    state = AllocatedState.build(snapshot, cluster.held)
    claims_, _ = KINDS["mig-fallback"]
    units = count_units(
        snapshot,
        state,
        device_classes(),
        claims_,
        list(snapshot.node_names),
        selectors=SelectorCache(),
        budget=SearchBudget(max_steps=1),
    )
    assert units.cut and units.total == 0


def test_max_units_cuts_a_node() -> None:
    cluster = generate(16, seed=3, partly_used=False)
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    claims_, _ = KINDS["one-h100"]
    units = count_units(
        snapshot,
        AllocatedState(snapshot),
        device_classes(),
        claims_,
        list(snapshot.node_names),
        selectors=SelectorCache(),
        max_units=3,
    )
    assert units.cut
    assert [(n.count, n.cut) for n in units.nodes] == [(3, True)] * len(units.nodes)
