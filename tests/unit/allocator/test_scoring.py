"""Placement policies: the pure key functions, and which node/device a solve ends up with."""

from __future__ import annotations

from fractions import Fraction

import pytest

from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    Policy,
    Score,
    SelectorCache,
    Unsatisfiable,
    solve,
)
from services.allocator.core.scoring import candidate_key, measure, node_key
from services.common.dra.model import AllocationResult, ResourceClaim
from services.common.errors import FailedPrecondition
from tests.builders import (
    DRIVER,
    DeviceBuilder,
    SliceBuilder,
    allocation,
    claim,
    classes,
    cls,
    device,
    node,
    result,
    slice_,
    snapshot,
)

GPU = classes(cls("gpu", f'device.driver == "{DRIVER}"'))


def gpus(node_name: str, count: int) -> SliceBuilder:
    return slice_(f"{node_name}-gpus", *(device(f"gpu-{i}") for i in range(count))).node(node_name)


def run(
    snap: ClusterSnapshot,
    claims: list[ResourceClaim],
    policy: Policy,
    held: list[tuple[str, AllocationResult]] | None = None,
    *,
    explain: bool = False,
) -> Allocated | Unsatisfiable:
    state = AllocatedState.build(snap, held or [])
    return solve(
        snap, state, GPU, claims, policy=policy, selectors=SelectorCache(), explain=explain
    )


def held_on(node_name: str, *devices: str) -> tuple[str, AllocationResult]:
    return ("default/other", allocation(*(result("x", d, pool=node_name) for d in devices)))


# --- pure keys --------------------------------------------------------------------------------

SCORES = {
    "full": Score(0, 8, Fraction(1), free_capacity=Fraction(0)),
    "half": Score(4, 8, Fraction(1), free_capacity=Fraction(4)),
    "empty": Score(8, 8, Fraction(1), free_capacity=Fraction(8)),
}


@pytest.mark.parametrize(
    ("policy", "want"),
    [
        pytest.param(Policy.BINPACK, ["full", "half", "empty"], id="binpack-fewest-free-first"),
        pytest.param(Policy.SPREAD, ["empty", "half", "full"], id="spread-most-free-first"),
        pytest.param(Policy.FIRST_FIT, ["empty", "full", "half"], id="first-fit-by-name"),
    ],
)
def test_node_key_orders_nodes(policy: Policy, want: list[str]) -> None:
    assert sorted(SCORES, key=lambda name: node_key(policy, name, SCORES[name])) == want


def test_node_key_ranks_by_capacity_then_name() -> None:
    tight = Score(2, 8, Fraction(1, 4), free_capacity=Fraction(5, 4))
    loose = Score(2, 8, Fraction(3, 4), free_capacity=Fraction(7, 4))
    assert node_key(Policy.BINPACK, "b", tight) < node_key(Policy.BINPACK, "a", loose)
    assert node_key(Policy.BINPACK, "a", tight) < node_key(Policy.BINPACK, "b", tight)


@pytest.mark.parametrize("policy", list(Policy))
def test_node_key_puts_better_subrequest_ranks_first(policy: Policy) -> None:
    first = Score(8, 8, Fraction(1), free_capacity=Fraction(8), ranks=(0, 1))
    later = Score(0, 8, Fraction(0), free_capacity=Fraction(0), ranks=(1, 0))
    assert node_key(policy, "z", first) < node_key(policy, "a", later)


def test_candidate_key_prefers_small_partitions_of_used_gpus_for_binpack() -> None:
    snap = snapshot(
        slice_(
            "s",
            device("gpu-0-7g").consumes("gpu-0", memory="8"),
            device("gpu-0-1g").consumes("gpu-0", memory="1"),
            device("gpu-1-1g").consumes("gpu-1", memory="1"),
        )
        .counter_set("gpu-0", memory="8")
        .counter_set("gpu-1", memory="8")
    )
    entries = list(snap.view("node-1").devices())
    used = {e.counters[0][0]: Fraction(0) for e in entries}
    gpu1 = entries[2].counters[0][0]
    used[gpu1] = Fraction(1)  # gpu-1 already has a partition in use

    def order(policy: Policy) -> list[str]:
        return [
            e.id.device
            for e in sorted(
                entries, key=lambda e: candidate_key(policy, e, used.__getitem__, False)
            )
        ]

    assert order(Policy.BINPACK) == ["gpu-1-1g", "gpu-0-1g", "gpu-0-7g"]
    assert order(Policy.SPREAD) == ["gpu-0-1g", "gpu-0-7g", "gpu-1-1g"]
    assert order(Policy.FIRST_FIT) == ["gpu-0-7g", "gpu-0-1g", "gpu-1-1g"]


def test_measure_counts_free_devices_and_counter_share() -> None:
    snap = snapshot(
        slice_("s", device("a").consumes("g", m="4"), device("b").consumes("g", m="4")).counter_set(
            "g", m="8"
        )
    )
    entries = list(snap.view("node-1").devices())
    counter = entries[0].counters[0][0]
    score = measure(entries, lambda e: e.id.device == "b", {counter: Fraction(4)}.__getitem__)
    assert score == Score(
        free_devices=1, total_devices=2, free_counters=Fraction(1, 2), free_capacity=Fraction(1, 2)
    )


# --- node choice ------------------------------------------------------------------------------


CHOICE = [
    pytest.param(Policy.FIRST_FIT, "node-a", id="first-fit-takes-first-node-by-name"),
    pytest.param(Policy.BINPACK, "node-b", id="binpack-takes-fullest-node"),
    pytest.param(Policy.SPREAD, "node-c", id="spread-takes-emptiest-node"),
]


@pytest.mark.parametrize(("policy", "want"), CHOICE)
def test_policy_chooses_node(policy: Policy, want: str) -> None:
    snap = snapshot(gpus("node-a", 4), gpus("node-b", 4), gpus("node-c", 4))
    held = [held_on("node-a", "gpu-0"), held_on("node-b", "gpu-0", "gpu-1", "gpu-2")]
    outcome = run(snap, [claim("c").request("g").build()], policy, held)
    assert isinstance(outcome, Allocated)
    assert outcome.node == want


def test_binpack_prefers_exact_fit_over_partly_used_node() -> None:
    snap = snapshot(gpus("node-a", 8), gpus("node-b", 8))
    held = [held_on("node-b", "gpu-0", "gpu-1")]
    outcome = run(snap, [claim("c").request("g", "gpu", 6).build()], Policy.BINPACK, held)
    assert isinstance(outcome, Allocated) and outcome.node == "node-b"
    assert outcome.score == Score(0, 8, Fraction(1), free_capacity=Fraction(0), ranks=(0,))


def test_binpack_ties_break_by_node_name() -> None:
    snap = snapshot(gpus("node-b", 2), gpus("node-a", 2))
    outcome = run(snap, [claim("c").request("g").build()], Policy.BINPACK)
    assert isinstance(outcome, Allocated) and outcome.node == "node-a"


def test_binpack_packs_partitions_onto_used_gpu() -> None:
    def mig_gpu(gpu: str) -> list[DeviceBuilder]:
        return [device(f"{gpu}-1g-{i}").consumes(gpu, memory="1") for i in range(2)]

    snap = snapshot(
        slice_("s", *mig_gpu("gpu-0"), *mig_gpu("gpu-1"))
        .counter_set("gpu-0", memory="2")
        .counter_set("gpu-1", memory="2")
    )
    held = [held_on("node-1", "gpu-1-1g-0")]
    outcome = run(snap, [claim("c").request("g").build()], Policy.BINPACK, held)
    assert isinstance(outcome, Allocated)
    assert [r.device for r in outcome.allocations[0].results] == ["gpu-1-1g-1"]
    first_fit = run(snap, [claim("c").request("g").build()], Policy.FIRST_FIT, held)
    assert isinstance(first_fit, Allocated)
    assert [r.device for r in first_fit.allocations[0].results] == ["gpu-0-1g-0"]


def test_all_claims_land_on_one_node() -> None:
    snap = snapshot(gpus("node-a", 1), gpus("node-b", 2))
    claims = [claim("c0").request("g").build(), claim("c1").request("g").build()]
    outcome = run(snap, claims, Policy.FIRST_FIT)
    assert isinstance(outcome, Allocated) and outcome.node == "node-b"
    assert {r.pool for a in outcome.allocations for r in a.results} == {"node-b"}


def test_nodes_without_enough_free_devices_are_pruned_before_searching() -> None:
    snap = snapshot(gpus("node-a", 1), gpus("node-b", 1), gpus("node-c", 2))
    outcome = run(snap, [claim("c").request("g", "gpu", 2).build()], Policy.BINPACK)
    assert isinstance(outcome, Allocated) and outcome.node == "node-c"
    assert (
        outcome.stats.nodes_total,
        outcome.stats.nodes_pruned,
        outcome.stats.nodes_searched,
    ) == (3, 2, 1)


def test_node_error_skips_the_node_when_choosing() -> None:
    snap = snapshot(
        slice_("a", device("gpu-0")).node("node-a").pool("node-a", count=2),
        gpus("node-b", 1),
    )
    outcome = run(
        snap, [claim("c").request("g", "gpu", all_devices=True).build()], Policy.FIRST_FIT
    )
    assert isinstance(outcome, Allocated) and outcome.node == "node-b"


def test_node_error_is_raised_when_no_node_fits() -> None:
    snap = snapshot(slice_("a", device("gpu-0")).node("node-a").pool("node-a", count=2))
    with pytest.raises(
        FailedPrecondition, match="resource pool gpu.example.com/node-a is currently being updated"
    ):
        run(snap, [claim("c").request("g", "gpu", all_devices=True).build()], Policy.BINPACK)


def test_without_nodes_network_devices_allocate_without_a_node() -> None:
    snap = ClusterSnapshot.build(
        [slice_("fabric", device("gpu-0")).all_nodes().pool("fabric").build()]
    )
    outcome = run(snap, [claim("c").request("g").build()], Policy.BINPACK)
    assert isinstance(outcome, Allocated) and outcome.node is None
    assert outcome.allocations[0].node_selector is None


def test_node_labels_select_network_attached_slices() -> None:
    rack = slice_("rack-a", device("gpu-0")).pool("rack-a")
    from tests.builders import node_selector, req

    snap = snapshot(
        rack.nodes(node_selector(req("rack", "In", "a"))),
        nodes=[node("node-1", rack="b"), node("node-2", rack="a")],
    )
    outcome = run(snap, [claim("c").request("g").build()], Policy.FIRST_FIT)
    assert isinstance(outcome, Allocated) and outcome.node == "node-2"


def test_share_ids_are_deterministic_and_replaceable() -> None:
    snap = snapshot(slice_("s", device("gpu-0").multi().capacity("memory", "4")))
    claims = [claim("c", uid="uid-1").request("g", capacity={"memory": "1"}).build()]
    first = run(snap, claims, Policy.BINPACK)
    second = run(snap, claims, Policy.BINPACK)
    assert isinstance(first, Allocated) and isinstance(second, Allocated)
    assert first.allocations[0].results[0].share_id == second.allocations[0].results[0].share_id
    custom = solve(
        snap,
        AllocatedState(snap),
        GPU,
        claims,
        selectors=SelectorCache(),
        share_id=lambda c, request, device_id, position: f"{c.uid}-{request}-{position}",
    )
    assert isinstance(custom, Allocated)
    assert custom.allocations[0].results[0].share_id == "uid-1-g-0"
