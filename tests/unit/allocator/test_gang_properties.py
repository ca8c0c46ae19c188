"""Properties of solve_gang on small random clusters, against an independent count.

Every node has a few interchangeable GPUs, some of them held, and a rack label or none. The
count knows nothing of the solver: a node can host a member iff it has as many free GPUs as
the claims ask for, and a gang fits iff some domain (a rack, or every node without a label) has
`node_count` such nodes. Properties:

1. a returned gang has `node_count` distinct nodes, all with the domain's label value;
2. every member satisfies the claims with free devices of its own node, none used twice;
3. the solver finds a gang iff the count says one fits.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    Policy,
    SelectorCache,
    Unsatisfiable,
    solve,
)
from services.allocator.core.gang import solve_gang
from services.allocator.core.scoring import node_key
from services.common.dra.model import AllocationResult, Node, ResourceClaim, ResourceSlice
from tests.builders import DRIVER, allocation, claim, classes, cls, device, result, slice_

GPU = classes(cls("gpu", f'device.driver == "{DRIVER}"'))
RACK = "example.com/rack"


@dataclass(frozen=True)
class World:
    gpus: dict[str, int]  # node -> GPUs
    racks: dict[str, str | None]  # node -> rack label value
    held: dict[str, frozenset[int]]  # node -> indices of held GPUs


@st.composite
def worlds(draw: st.DrawFn) -> World:
    count = draw(st.integers(1, 7))
    names = [f"n-{i}" for i in range(count)]
    gpus = {n: draw(st.integers(1, 4)) for n in names}
    racks = {n: draw(st.sampled_from(["r0", "r1", "r2", None])) for n in names}
    held = {n: frozenset(draw(st.sets(st.integers(0, gpus[n] - 1)))) for n in names}
    return World(gpus, racks, held)


def _build(world: World) -> tuple[ClusterSnapshot, AllocatedState]:
    slices: list[ResourceSlice] = [
        slice_(f"{n}-gpus", *(device(f"gpu-{i}") for i in range(g))).node(n).build()
        for n, g in world.gpus.items()
    ]
    nodes = [Node(n, {RACK: r} if r else {}) for n, r in world.racks.items()]
    snapshot = ClusterSnapshot.build(slices, nodes)
    held: list[tuple[str, AllocationResult]] = [
        (f"default/held-{n}", allocation(*(result("x", f"gpu-{i}", pool=n) for i in sorted(ids))))
        for n, ids in world.held.items()
        if ids
    ]
    return snapshot, AllocatedState.build(snapshot, held)


def _fits(world: World, need: int, count: int, label: bool) -> bool:
    domains: dict[str | None, int] = {}
    for name, gpus in world.gpus.items():
        rack = world.racks[name] if label else None
        if label and rack is None:
            continue
        if gpus - len(world.held[name]) >= need:
            domains[rack] = domains.get(rack, 0) + 1
    return any(n >= count for n in domains.values())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=worlds(),
    sizes=st.lists(st.integers(1, 2), min_size=1, max_size=2),
    count=st.integers(1, 4),
    label=st.booleans(),
    policy=st.sampled_from(list(Policy)),
)
def test_gangs_are_distinct_same_domain_and_complete(
    world: World, sizes: list[int], count: int, label: bool, policy: Policy
) -> None:
    snapshot, state = _build(world)
    claims: list[ResourceClaim] = [
        claim(f"c-{i}").request("g", "gpu", size).build() for i, size in enumerate(sizes)
    ]
    outcome = solve_gang(
        snapshot,
        state,
        GPU,
        claims,
        node_count=count,
        group_by_label=RACK if label else None,
        policy=policy,
        selectors=SelectorCache(),
    )
    assert isinstance(outcome, Allocated | Unsatisfiable)
    assert isinstance(outcome, Allocated) == _fits(world, sum(sizes), count, label)
    if not isinstance(outcome, Allocated):
        return
    nodes = [m.node for m in outcome.placements]
    assert len(nodes) == count and len(set(nodes)) == count
    if label:
        assert outcome.domain is not None
        assert all(world.racks[n or ""] == outcome.domain for n in nodes)
    used: set[tuple[str, str]] = set()
    for member in outcome.placements:
        assert member.node is not None
        assert len(member.allocations) == len(claims)
        for size, allocated in zip(sizes, member.allocations, strict=True):
            assert len(allocated.results) == size
            for r in allocated.results:
                assert r.pool == member.node
                assert int(r.device.removeprefix("gpu-")) not in world.held[member.node]
                assert (r.pool, r.device) not in used
                used.add((r.pool, r.device))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=worlds(),
    size=st.integers(1, 2),
    count=st.integers(1, 3),
    label=st.booleans(),
    policy=st.sampled_from(list(Policy)),
)
def test_the_gang_takes_the_best_domain_and_its_best_nodes(
    world: World, size: int, count: int, label: bool, policy: Policy
) -> None:
    """Against node keys from pinned solves of every node (no groups): the domain the policy's
    domain key ranks first, and in it the nodes with the best keys."""
    snapshot, state = _build(world)
    claims = [claim("c").request("g", "gpu", size).build()]
    keys = {}
    for name in snapshot.node_names:
        pinned = solve(
            snapshot, state, GPU, claims, node=name, policy=policy, selectors=SelectorCache()
        )
        if isinstance(pinned, Allocated):
            keys[name] = node_key(policy, name, pinned.score)
    domains: dict[str | None, list[str]] = {}
    for name in keys:
        rack = world.racks[name] if label else None
        if not label or rack is not None:
            domains.setdefault(rack, []).append(name)
    ranked = []
    for rack, members in domains.items():
        members.sort(key=keys.__getitem__)
        if len(members) >= count:
            chosen = [keys[m] for m in members[:count]]
            ranked.append((policy.rules.domain_key(rack, members, chosen), rack, members[:count]))
    outcome = solve_gang(
        snapshot,
        state,
        GPU,
        claims,
        node_count=count,
        group_by_label=RACK if label else None,
        policy=policy,
        selectors=SelectorCache(),
    )
    if not ranked:
        assert isinstance(outcome, Unsatisfiable)
        return
    _, rack, members = min(ranked)
    assert isinstance(outcome, Allocated)
    assert (outcome.domain, [m.node for m in outcome.placements]) == (rack, members)
