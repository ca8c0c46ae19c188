"""AllocatedState: what existing allocations hold, kept live by with/without updates."""

from __future__ import annotations

from fractions import Fraction

from services.allocator.core import AllocatedState, CounterID
from services.common.dra.model import DeviceID
from tests.builders import DRIVER, allocation, claim, device, result, slice_, snapshot

SNAP = snapshot(
    slice_(
        "s",
        device("gpu-0"),
        device("mig-a").consumes("g", memory="4"),
        device("shared").multi().capacity("memory", "8").consumes("g", memory="2"),
    ).counter_set("g", memory="8")
)
COUNTER = CounterID(DRIVER, "node-1", "g", "memory")


def dev(name: str) -> DeviceID:
    return DeviceID(DRIVER, "node-1", name)


def test_dedicated_shared_and_admin_results() -> None:
    state = AllocatedState.build(
        SNAP,
        [
            ("default/a", allocation(result("r", "gpu-0"), result("r", "mig-a"))),
            (
                "default/b",
                allocation(result("r", "shared", share_id="s1", consumed={"memory": "3"})),
            ),
            ("default/monitor", allocation(result("r", "gpu-0", admin=True))),
        ],
    )
    assert state.is_exclusive(dev("gpu-0")) and state.is_exclusive(dev("mig-a"))
    assert not state.is_exclusive(dev("shared")) and state.in_use(dev("shared"))
    assert state.owners(dev("gpu-0")) == ("default/a",)
    assert state.consumed_capacity(dev("shared")) == {"memory": Fraction(3)}
    assert state.counter_used(COUNTER) == 6  # mig-a 4 + shared 2, the shared device once
    assert state.devices_in_use == {dev("gpu-0"), dev("mig-a"), dev("shared")}


def test_updates_return_new_states_and_count_shared_counters_once() -> None:
    empty = AllocatedState(SNAP)
    one = empty.with_allocation(
        allocation(result("r", "shared", share_id="s1", consumed={"memory": "3"})), "a"
    )
    two = one.with_allocation(
        allocation(result("r", "shared", share_id="s2", consumed={"memory": "1"})), "b"
    )
    assert not empty.in_use(dev("shared"))
    assert two.consumed_capacity(dev("shared")) == {"memory": Fraction(4)}
    assert two.counter_used(COUNTER) == 2
    assert two.share_ids(dev("shared")) == {"s1", "s2"}
    back = two.without_allocation(
        allocation(result("r", "shared", share_id="s1", consumed={"memory": "3"})), "a"
    )
    assert back.consumed_capacity(dev("shared")) == {"memory": Fraction(1)}
    assert back.counter_used(COUNTER) == 2
    gone = back.without_allocation(
        allocation(result("r", "shared", share_id="s2", consumed={"memory": "1"})), "b"
    )
    assert not gone.in_use(dev("shared")) and gone.counter_used(COUNTER) == 0
    assert two.counter_used(COUNTER) == 2  # the older states are untouched


def test_one_share_held_by_two_owners_is_released_by_each_on_its_own() -> None:
    """A placement pending in this process and the reservation that settles it hold the same
    share id for a moment; dropping the pending one must leave the reservation's."""
    share = allocation(result("r", "shared", share_id="s1", consumed={"memory": "3"}))
    both = AllocatedState(SNAP).with_allocation(share, "pending").with_allocation(share, "res-1")
    assert both.owners(dev("shared")) == ("pending", "res-1")
    assert both.share_ids(dev("shared")) == {"s1"}
    settled = both.without_allocation(share, "pending")
    assert settled.in_use(dev("shared"))
    assert settled.owners(dev("shared")) == ("res-1",)
    assert settled.consumed_capacity(dev("shared")) == {"memory": Fraction(3)}
    assert settled.counter_used(COUNTER) == 2
    released = settled.without_allocation(share, "res-1")
    assert not released.in_use(dev("shared")) and released.counter_used(COUNTER) == 0
    assert not any(released.consumed_capacity(dev("shared")).values())


def test_removing_a_dedicated_device_frees_its_counters() -> None:
    held = AllocatedState(SNAP).with_allocation(allocation(result("r", "mig-a")), "a")
    assert held.counter_used(COUNTER) == 4
    freed = held.without_allocation(allocation(result("r", "mig-a")), "a")
    assert not freed.in_use(dev("mig-a")) and freed.counter_used(COUNTER) == 0


def test_from_claims_uses_each_claims_allocation() -> None:
    held = claim("train", "team-a").allocated(allocation(result("r", "gpu-0")))
    state = AllocatedState.from_claims(SNAP, [held, claim("pending").build()])
    assert state.owners(dev("gpu-0")) == ("team-a/train",)


def test_devices_unknown_to_the_snapshot_are_held_without_counters() -> None:
    state = AllocatedState.build(SNAP, [("x", allocation(result("r", "gone")))])
    assert state.in_use(dev("gone")) and state.counter_used(COUNTER) == 0


def test_rebase_resolves_counters_against_a_new_snapshot() -> None:
    held = AllocatedState.build(SNAP, [("x", allocation(result("r", "mig-a")))])
    bigger = snapshot(
        slice_("s", device("mig-a").consumes("g", memory="6")).counter_set("g", memory="8")
    )
    assert held.rebase(bigger).counter_used(COUNTER) == 6
    assert held.counter_used(COUNTER) == 4


def test_a_batch_of_changes_hands_over_holds_without_freeing_them() -> None:
    exclusive = allocation(result("r", "gpu-0"), result("r", "mig-a"))
    share = allocation(result("r", "shared", share_id="s1", consumed={"memory": "3"}))
    base = AllocatedState(SNAP).with_changes([(None, "pending:1", exclusive), (None, "p2", share)])
    groups = base.node_groups(SNAP)

    after = base.with_changes([("pending:1", "res-1", exclusive), ("p2", "res-2", share)])

    assert after.owners(dev("gpu-0")) == ("res-1",) and after.owners(dev("mig-a")) == ("res-1",)
    assert after.owners(dev("shared")) == ("res-2",)
    assert after.counter_used(COUNTER) == base.counter_used(COUNTER) == 6
    assert after.consumed_capacity(dev("shared")) == {"memory": Fraction(3)}
    assert after.node_groups(SNAP).in_use == groups.in_use
    assert base.owners(dev("gpu-0")) == ("pending:1",)  # the old state is untouched
    freed = after.with_changes([("res-1", None, exclusive), ("res-2", None, share)])
    assert freed.devices_in_use == frozenset() and freed.counter_used(COUNTER) == 0


def test_handing_over_what_the_old_owner_does_not_hold_adds_it() -> None:
    exclusive = allocation(result("r", "gpu-0"))

    state = AllocatedState(SNAP).with_changes([("pending:9", "res-1", exclusive)])

    assert state.owners(dev("gpu-0")) == ("res-1",)


def test_a_long_chain_of_states_keeps_every_state_and_equals_one_built_at_once() -> None:
    # Past the size where a state folds the devices it changed into new maps: every state of
    # the chain still answers for itself, and the last equals one built from scratch.
    names = [f"gpu-{i}" for i in range(120)]
    snap = snapshot(slice_("s", *(device(n) for n in names)))
    states = [AllocatedState(snap)]
    states[0].node_groups(snap)  # kept up to date along the chain too
    for index, name in enumerate(names):
        held = allocation(result("r", name))
        states.append(states[-1].with_allocation(held, f"res-{index}"))
        if index % 3 == 2:  # free every third one again
            states.append(states[-1].without_allocation(held, f"res-{index}"))
    freed = {n for i, n in enumerate(names) if i % 3 == 2}
    kept = [n for n in names if n not in freed]
    want = AllocatedState.build(
        snap, [(f"res-{names.index(n)}", allocation(result("r", n))) for n in kept]
    )
    last = states[-1]
    assert last.devices_in_use == want.devices_in_use == frozenset(dev(n) for n in kept)
    assert {n: last.owners(dev(n)) for n in names} == {n: want.owners(dev(n)) for n in names}
    assert last.node_groups(snap).in_use == want.node_groups(snap).in_use
    assert states[0].devices_in_use == frozenset()
    assert [len(s.devices_in_use) for s in states[1:5]] == [1, 2, 3, 2]
    assert states[50].in_use(dev(names[0])) and not states[50].in_use(dev(names[100]))
