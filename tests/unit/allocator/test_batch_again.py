"""A batch item that takes the last node again is answered without a NodeRun (solve_many's
`LastChoice.again`); what it answers is exactly what the general path answers.

The reference is the same batch with the shortcut turned off, so that every item goes through
`solve_in` (the walk, or NodeRun._again on the last node): the same results — nodes, devices in
order, configs, node selectors, scores and Stats — and the same state held afterwards (devices
in use, their owners, counters, node groups). Over generated fleets (random machine shapes
repeated over nodes with random holdings: test_node_choice's clusters; and the benchmark's
generator with MIG nodes and NVLink topologies), random claims, every policy, and budgets small
enough to run out.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadtest.clusters import device_classes, generate
from services.allocator.core import (
    AllocatedState,
    ClusterSnapshot,
    Policy,
    SearchBudget,
    SelectorCache,
    SolveResult,
    solve_many,
)
from services.allocator.core.groups import GroupIndex
from services.allocator.core.solver import LastChoice
from services.allocator.core.templates import node_templates
from services.common.dra.model import (
    AllocationResult,
    DeviceClass,
    DeviceRequestAllocationResult,
    Node,
    ResourceClaim,
    ResourceSlice,
)
from services.common.errors import GpuallocError
from tests.builders import DRIVER
from tests.unit.allocator.test_batch import KINDS, SETTINGS
from tests.unit.allocator.test_node_choice import copy_to
from tests.unit.allocator.test_solver_properties import CLASSES, claims, inventory

_AGAIN = LastChoice.again


@contextmanager
def counted_shortcut() -> Iterator[list[int]]:
    """The shortcut as it is, counting the items it answered."""
    answered = [0]

    def again(self: LastChoice, *args: Any) -> Any:
        found = _AGAIN(self, *args)
        answered[0] += found is not None
        return found

    with mock.patch.object(LastChoice, "again", again):
        yield answered


@contextmanager
def no_shortcut() -> Iterator[list[int]]:
    with mock.patch.object(LastChoice, "again", lambda *args: None):
        yield [0]


Batch = tuple[list[SolveResult] | str, AllocatedState]


def batch(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: dict[str, DeviceClass],
    claims_: Sequence[ResourceClaim],
    count: int,
    **options: Any,
) -> Batch:
    """The batch's results (or its error) and the state it held them in."""
    holding = state.detached(groups=True)
    try:
        results: list[SolveResult] | str = solve_many(
            snapshot,
            state,
            classes,
            claims_,
            count,
            selectors=SelectorCache(),
            holding=holding,
            **options,
        )
    except GpuallocError as error:
        results = f"{type(error).__name__}: {error.message}"
    return results, holding


def assert_same_state(snapshot: ClusterSnapshot, got: AllocatedState, want: AllocatedState) -> None:
    assert got.devices_in_use == want.devices_in_use
    counters = {c for e in snapshot.all_devices() for c, _ in e.counters}
    assert {c: got.counter_used(c) for c in counters} == {c: want.counter_used(c) for c in counters}
    assert {d: got.owners(d) for d in want.devices_in_use} == {
        d: want.owners(d) for d in want.devices_in_use
    }
    groups, wanted = got.node_groups(snapshot), want.node_groups(snapshot)
    assert groups.in_use == wanted.in_use
    assert groups.members == wanted.members
    assert groups.order == wanted.order
    built = GroupIndex.build(node_templates(snapshot), want.devices_in_use)
    assert groups.members == built.members


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[ResourceSlice], list[tuple[str, AllocationResult]]]:
    """test_node_choice's clusters, as slices: each run builds its own snapshot, so that
    neither reads what the other kept with it (template checks, kept outcomes: the CEL
    counts in Stats depend on them)."""
    shapes = [draw(inventory("shape")) for _ in range(draw(st.integers(1, 2)))]
    slices = []
    for i in range(draw(st.integers(2, 6))):
        slices.append(copy_to(shapes[draw(st.integers(0, len(shapes) - 1))], f"node-{i}"))
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
    return slices, held


@SETTINGS
@given(
    fleet=fleets(),
    claims_=claims(),
    policy=st.sampled_from(list(Policy)),
    count=st.integers(2, 24),
    steps=st.sampled_from([5, 20, 100, 1_000_000]),
)
def test_the_last_node_again_answers_what_the_general_path_answers(
    fleet: tuple[list[ResourceSlice], list[tuple[str, AllocationResult]]],
    claims_: list[ResourceClaim],
    policy: Policy,
    count: int,
    steps: int,
) -> None:
    slices, held = fleet
    options: dict[str, Any] = {"policy": policy, "budget": SearchBudget(max_steps=steps)}
    runs: list[tuple[ClusterSnapshot, list[Batch]]] = []
    for shortcut in (no_shortcut(), counted_shortcut()):
        snapshot = ClusterSnapshot.build(slices, [Node(s.pool.name) for s in slices])
        state = AllocatedState.build(snapshot, held)
        with shortcut:
            # three times: the later batches find the first one's kept outcomes scored
            made = [batch(snapshot, state, CLASSES, claims_, count, **options) for _ in range(3)]
            runs.append((snapshot, made))
    (_, want), (snapshot, got) = runs
    for (results, held_state), (wanted, wanted_state) in zip(got, want, strict=True):
        assert results == wanted
        assert_same_state(snapshot, held_state, wanted_state)


@pytest.mark.parametrize("steps", [None, 4, 12], ids=lambda s: f"steps-{s}")
@pytest.mark.parametrize("policy", list(Policy), ids=lambda p: str(p).lower())
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_last_node_again_on_a_generated_fleet(
    kind: str, policy: Policy, steps: int | None
) -> None:
    cluster = generate(320, seed=7)
    claims_, options = KINDS[kind]
    if steps is not None:  # a budget the walks, or the walk and the node's search, run out of
        options = {**options, "budget": SearchBudget(max_steps=steps)}
    classes = device_classes()
    runs = []
    for shortcut in (no_shortcut(), counted_shortcut()):
        snapshot = ClusterSnapshot.build(
            cluster.slices, cluster.nodes, topologies=cluster.topologies
        )
        state = AllocatedState.build(snapshot, cluster.held)
        with shortcut as answered:
            runs.append(
                (snapshot, *batch(snapshot, state, classes, claims_, 60, policy=policy, **options))
            )
    (_, want, want_state), (snapshot, got, got_state) = runs
    assert got == want
    assert_same_state(snapshot, got_state, want_state)
    if (
        kind == "one-h100" and policy is Policy.BINPACK and steps is None
    ):  # one GPU each: the fullest node again
        assert answered[0] > 0
