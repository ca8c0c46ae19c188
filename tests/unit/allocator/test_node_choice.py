"""Choosing the node by groups (templates x free state) against searching every node.

Clusters here are a few machine shapes repeated over several nodes (devices carry a per-node
`uuid`, as real GPUs do, so only templates can tell the copies are alike), with random holdings.
Properties, per policy:

1. the node the solver picks is optimal under the policy's key among the feasible nodes, the
   key and feasibility coming from pinned solves of every node (brute force over nodes), and
   its allocation is the pinned solve's — and the one an explaining pinned solve finds, which
   checks every device itself instead of reusing its template's checks;
2. the index of groups a state keeps up to date equals one built from scratch.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from services.allocator.app.capacity_count import count_capacity
from services.allocator.app.messages import Query
from services.allocator.app.placing import Deadline, PlacementSearch
from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    Policy,
    SearchBudget,
    SelectorCache,
    Unsatisfiable,
    solve,
)
from services.allocator.core.groups import GroupIndex
from services.allocator.core.scoring import node_key
from services.allocator.core.templates import node_templates
from services.common.dra.model import (
    AllocationResult,
    AttributeValue,
    DeviceRequestAllocationResult,
    Node,
    ResourceClaim,
    ResourceSlice,
)
from services.common.errors import GpuallocError
from tests.builders import (
    DRIVER,
    allocation,
    claim,
    classes,
    cls,
    device,
    result,
    slice_,
    sub,
    with_taint,
)
from tests.unit.allocator.test_solver_properties import CLASSES, claims, inventory

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def copy_to(shape: ResourceSlice, node: str) -> ResourceSlice:
    """The shape on another node: its pool, node name and a uuid per device of its own."""
    devices = tuple(
        replace(d, attributes={**d.attributes, "uuid": AttributeValue.string(f"{node}/{d.name}")})
        for d in shape.devices
    )
    return replace(
        shape,
        name=f"{node}-slice",
        pool=replace(shape.pool, name=node),
        node_name=node,
        devices=devices,
    )


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[tuple[str, AllocationResult]]]:
    shapes = [draw(inventory("shape")) for _ in range(draw(st.integers(1, 2)))]
    slices = []
    for i in range(draw(st.integers(2, 6))):
        slices.append(copy_to(shapes[draw(st.integers(0, len(shapes) - 1))], f"node-{i}"))
    snapshot = ClusterSnapshot.build(slices, [Node(s.pool.name) for s in slices])
    held = []
    for placed in slices:
        taken = [d for d in placed.devices if draw(st.integers(0, 2)) == 0]
        results = tuple(
            DeviceRequestAllocationResult(
                "held",
                DRIVER,
                placed.pool.name,
                d.name,
                share_id=f"s-{d.name}" if d.allow_multiple_allocations else None,
            )
            for d in taken
        )
        if results:
            held.append((f"default/{placed.pool.name}", AllocationResult(results)))
    return snapshot, held


def pinned_best(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    claims_: list[ResourceClaim],
    policy: Policy,
) -> dict[str, Allocated]:
    found = {}
    for name in snapshot.node_names:
        try:
            outcome = solve(
                snapshot,
                state,
                CLASSES,
                claims_,
                node=name,
                policy=policy,
                selectors=SelectorCache(),
            )
        except GpuallocError:
            continue  # a node error: the node does not count
        if isinstance(outcome, Allocated):
            found[name] = outcome
    return found


@SETTINGS
@given(cluster=clusters(), claims_=claims(), policy=st.sampled_from(list(Policy)))
def test_chosen_node_is_optimal_under_the_policy_key(
    cluster: tuple[ClusterSnapshot, list[tuple[str, AllocationResult]]],
    claims_: list[ResourceClaim],
    policy: Policy,
) -> None:
    snapshot, held = cluster
    state = AllocatedState.build(snapshot, held)
    try:
        chosen = solve(snapshot, state, CLASSES, claims_, policy=policy, selectors=SelectorCache())
    except GpuallocError:
        assume(False)
        return
    feasible = pinned_best(snapshot, state, claims_, policy)
    assert isinstance(chosen, Allocated) == bool(feasible)
    if isinstance(chosen, Allocated):
        best = min(feasible, key=lambda n: node_key(policy, n, feasible[n].score))
        assert chosen.node == best
        assert chosen.allocations == feasible[best].allocations
        assert chosen.score == feasible[best].score
        checked = solve(  # explaining, the pinned solve checks every device itself
            snapshot,
            state,
            CLASSES,
            claims_,
            node=best,
            policy=policy,
            selectors=SelectorCache(),
            explain=True,
        )
        assert isinstance(checked, Allocated) and checked.allocations == chosen.allocations


@SETTINGS
@given(cluster=clusters(), data=st.data())
def test_group_index_follows_allocations(
    cluster: tuple[ClusterSnapshot, list[tuple[str, AllocationResult]]], data: st.DataObject
) -> None:
    snapshot, held = cluster
    state = AllocatedState.build(snapshot, held[:1])
    state.node_groups(snapshot)  # from here on, every new state updates its copy
    for owner, allocation_ in held[1:]:
        state = state.with_allocation(allocation_, owner)
    for owner, allocation_ in held:
        if data.draw(st.booleans()):
            state = state.without_allocation(allocation_, owner)
    kept = state.node_groups(snapshot)
    fresh = GroupIndex.build(node_templates(snapshot), state.devices_in_use)
    assert kept.in_use == fresh.in_use
    assert kept.members == fresh.members
    assert kept.order == fresh.order


def _contents(groups: GroupIndex) -> tuple[object, ...]:
    return (
        groups.in_use,
        {key: list(nodes) for key, nodes in groups.members.items()},
        [list(entries) for entries in groups.order],
    )


@SETTINGS
@given(
    nodes=st.integers(2, 8),
    holds=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 3)), min_size=1, max_size=40),
    data=st.data(),
)
def test_group_index_edits_in_place_only_what_no_other_state_holds(
    nodes: int, holds: list[tuple[int, int]], data: st.DataObject
) -> None:
    """A detached state moves its nodes in place; the states derived from it on the way (and
    the one it was detached from) keep the groups they had, and every index equals a fresh
    build over its own devices in use."""
    snapshot = ClusterSnapshot.build([machine(f"node-{i}") for i in range(nodes)])
    state = AllocatedState.build(snapshot, [held_on("node-0", "gpu-0")])
    base = _contents(state.node_groups(snapshot))
    work = state.detached(groups=True)
    kept: list[tuple[AllocatedState, tuple[object, ...]]] = []
    for number, (node, gpu) in enumerate(holds):
        owner, allocation_ = held_on(f"node-{node % nodes}", f"gpu-{gpu}")
        owner = f"{owner}-{number}"
        if work.in_use(allocation_.results[0].device_id) and data.draw(st.booleans()):
            derived = work.with_changes([(owner, None, allocation_)])  # some other holder's
        else:
            work.hold_in_place(allocation_, owner)
            derived = work.with_changes([])
        if data.draw(st.booleans()):
            kept.append((derived, _contents(derived.node_groups(snapshot))))
    for derived, contents in [(state, base), *kept, (work, _contents(work.node_groups(snapshot)))]:
        assert _contents(derived.node_groups(snapshot)) == contents
        fresh = GroupIndex.build(node_templates(snapshot), derived.devices_in_use)
        assert _contents(fresh) == contents


# --- tables ---------------------------------------------------------------------------------------

GPU = classes(cls("gpu", f'device.driver == "{DRIVER}"'))


def machine(node: str, gpus: int = 4) -> ResourceSlice:
    return (
        slice_(
            f"{node}-gpus",
            *(
                device(f"gpu-{i}").attr("uuid", f"{node}-{i}").attr("model", "h100")
                for i in range(gpus)
            ),
        )
        .node(node)
        .build()
    )


def held_on(node: str, *devices: str) -> tuple[str, AllocationResult]:
    return (f"default/{node}", allocation(*(result("x", d, pool=node) for d in devices)))


def test_identical_nodes_share_a_template_and_uuid_is_abstracted() -> None:
    snapshot = ClusterSnapshot.build([machine(f"node-{i}") for i in range(5)])
    templates = node_templates(snapshot)
    assert len(templates.templates) == 1
    assert templates.templates[0].nodes == [f"node-{i}" for i in range(5)]
    assert templates.abstracted == frozenset({(DRIVER, "uuid")})
    assert templates.ungrouped == []


def test_nodes_seeing_shared_or_multi_allocatable_devices_stay_ungrouped() -> None:
    shared = slice_("fabric", device("link-0")).all_nodes().pool("fabric").build()
    multi = slice_("m", device("gpu-0").multi().capacity("memory", "4")).node("node-m").build()
    snapshot = ClusterSnapshot.build(
        [machine("node-a"), shared, multi], [Node("node-a"), Node("node-m")]
    )
    assert sorted(node_templates(snapshot).ungrouped) == ["node-a", "node-m"]


def test_binpack_searches_only_the_fullest_group() -> None:
    snapshot = ClusterSnapshot.build([machine(f"node-{i}") for i in range(40)])
    held = [held_on(f"node-{i}", "gpu-0", "gpu-1") for i in range(10, 20)]
    held.append(held_on("node-30", "gpu-0", "gpu-1", "gpu-2"))
    state = AllocatedState.build(snapshot, held)
    outcome = solve(
        snapshot, state, GPU, [claim("c").request("g").build()], selectors=SelectorCache()
    )
    assert isinstance(outcome, Allocated) and outcome.node == "node-30"
    assert (outcome.stats.nodes_total, outcome.stats.nodes_searched) == (40, 1)
    two = solve(
        snapshot, state, GPU, [claim("c").request("g", "gpu", 2).build()], selectors=SelectorCache()
    )
    assert isinstance(two, Allocated) and two.node == "node-10"  # first of the 2-free group
    assert two.stats.nodes_feasible == 10  # the group stands for its ten nodes


def test_spread_and_first_fit_over_groups() -> None:
    snapshot = ClusterSnapshot.build([machine(f"node-{i}") for i in range(6)])
    state = AllocatedState.build(snapshot, [held_on("node-0", "gpu-0"), held_on("node-3", "gpu-1")])
    one = [claim("c").request("g").build()]
    spread = solve(snapshot, state, GPU, one, policy=Policy.SPREAD, selectors=SelectorCache())
    first = solve(snapshot, state, GPU, one, policy=Policy.FIRST_FIT, selectors=SelectorCache())
    assert isinstance(spread, Allocated) and spread.node == "node-1"
    assert isinstance(first, Allocated) and first.node == "node-0"


def test_selector_reading_an_abstracted_attribute_searches_every_node() -> None:
    snapshot = ClusterSnapshot.build([machine(f"node-{i}") for i in range(3)])
    state = AllocatedState(snapshot)
    wanted = claim("c").request("g", "gpu", 1, f'device.attributes["{DRIVER}"].uuid == "node-2-3"')
    outcome = solve(snapshot, state, GPU, [wanted.build()], selectors=SelectorCache())
    assert isinstance(outcome, Allocated) and outcome.node == "node-2"
    assert outcome.stats.nodes_pruned + outcome.stats.nodes_searched == 3  # each looked at


def test_first_available_rank_beats_capacity_across_nodes() -> None:
    small = slice_("s", device("mig-0").attr("kind", "mig")).node("node-a").build()
    snapshot = ClusterSnapshot.build([machine("node-b", 2), small])
    both = classes(
        cls("gpu", f'device.driver == "{DRIVER}"'),
    )
    request = claim("c").first_available(
        "r",
        sub("small", "gpu", 1, f'"kind" in device.attributes["{DRIVER}"]'),
        sub("whole", "gpu"),
    )
    outcome = solve(
        snapshot, AllocatedState(snapshot), both, [request.build()], selectors=SelectorCache()
    )
    assert isinstance(outcome, Allocated) and outcome.node == "node-a"
    assert outcome.allocations[0].results[0].request == "r/small"
    assert outcome.score.ranks == (0,)


def test_budget_exhausted_while_choosing_by_groups() -> None:
    snapshot = ClusterSnapshot.build([machine(f"node-{i}") for i in range(4)])
    outcome = solve(
        snapshot,
        AllocatedState(snapshot),
        GPU,
        [claim("c").request("g", "gpu", 5).build()],
        selectors=SelectorCache(),
        budget=SearchBudget(max_steps=1),
    )
    assert isinstance(outcome, Unsatisfiable)


@pytest.mark.parametrize("policy", list(Policy))
def test_explain_and_groups_choose_the_same_node(policy: Policy) -> None:
    snapshot = ClusterSnapshot.build([machine(f"node-{i}") for i in range(8)])
    held = [held_on(f"node-{i}", *(f"gpu-{g}" for g in range(i % 4))) for i in range(8)]
    state = AllocatedState.build(snapshot, held)
    claims_ = [claim("c").request("g", "gpu", 2).build()]
    fast = solve(snapshot, state, GPU, claims_, policy=policy, selectors=SelectorCache())
    slow = solve(
        snapshot, state, GPU, claims_, policy=policy, selectors=SelectorCache(), explain=True
    )
    assert isinstance(fast, Allocated) and isinstance(slow, Allocated)
    assert (fast.node, fast.allocations) == (slow.node, slow.allocations)


def test_capacity_counts_no_tainted_gpu() -> None:
    """A tainted GPU is not capacity: the node with one gets its own template, one unit less."""
    tainted = with_taint(machine("node-2"), {"node-2/gpu-1"})
    snapshot = ClusterSnapshot.build([machine("node-0"), machine("node-1"), tainted])
    query = Query(claims=(claim("one").request("gpu", "gpu").build(),))
    answer = count_capacity(
        PlacementSearch(SelectorCache()),
        snapshot,
        AllocatedState(snapshot),
        GPU,
        query,
        Deadline(None),
        generation=1,
    )
    assert answer.total == 11
    assert {n.node: n.count for n in answer.nodes} == {"node-0": 4, "node-1": 4, "node-2": 3}
