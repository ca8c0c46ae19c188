"""Holding devices whole by their place on a node (`AllocatedState.hold_whole_in_place`, what a
batch item read from a kept outcome holds) changes the state as `hold_in_place` of the same
allocation does.

Over test_batch_again's generated fleets (random machine shapes repeated over nodes, random
holdings): runs of holds of random devices of templated nodes, free or already held, on one
state by place and on another by their results: the same devices in use, owners, counters and
node groups (read after each hold and at the end); and the same through the path by device id
(`hold_whole_in_place` given a snapshot other than the state's own).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.allocator.core import AllocatedState, ClusterSnapshot
from services.allocator.core.templates import node_templates
from services.common.dra.model import (
    AllocationResult,
    DeviceRequestAllocationResult,
    Node,
    ResourceSlice,
)
from tests.unit.allocator.test_batch import SETTINGS
from tests.unit.allocator.test_batch_again import assert_same_state, fleets


@SETTINGS
@given(
    fleet=fleets(),
    picks=st.lists(
        st.tuples(st.integers(0, 99), st.lists(st.integers(0, 99), min_size=1, max_size=4)),
        min_size=1,
        max_size=12,
    ),
    read_between=st.booleans(),
    same_snapshot=st.booleans(),
)
def test_holding_devices_by_their_place_is_holding_their_results(
    fleet: tuple[list[ResourceSlice], list[tuple[str, AllocationResult]]],
    picks: list[tuple[int, list[int]]],
    read_between: bool,
    same_snapshot: bool,
) -> None:
    slices, held = fleet
    snapshot = ClusterSnapshot.build(slices, [Node(s.pool.name) for s in slices])
    state = AllocatedState.build(snapshot, held)
    state.node_groups(snapshot)
    templates = node_templates(snapshot)
    nodes = sorted(templates.of_node)
    if not nodes:
        return
    by_place, by_result = state.detached(groups=True), state.detached(groups=True)
    # another snapshot of the same slices: the path by device id
    other = (
        snapshot
        if same_snapshot
        else ClusterSnapshot.build(slices, [Node(s.pool.name) for s in slices])
    )
    for node_pick, device_picks in picks:
        name = nodes[node_pick % len(nodes)]
        view = snapshot.view(name)
        devices = view.devices()
        indices = list(dict.fromkeys(i % len(devices) for i in device_picks))
        results = tuple(
            DeviceRequestAllocationResult(
                "r", devices[i].id.driver, devices[i].id.pool, devices[i].id.device
            )
            for i in indices
        )
        by_place.hold_whole_in_place(
            other if not same_snapshot else snapshot,
            other.view(name) if not same_snapshot else view,
            indices,
        )
        by_result.hold_in_place(AllocationResult(results))
        if read_between:
            assert_same_state(snapshot, by_place, by_result)
    assert_same_state(snapshot, by_place, by_result)
