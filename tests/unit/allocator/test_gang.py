"""Gangs: the same claims on N nodes of one domain, all or nothing (solve_gang)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    Policy,
    SelectorCache,
    Unsatisfiable,
    summary_text,
)
from services.allocator.core.gang import solve_gang
from services.common.dra.model import AllocationResult, Node, ResourceSlice
from services.common.errors import InvalidArgument
from tests.builders import DRIVER, allocation, claim, classes, cls, device, result, slice_

GPU = classes(cls("gpu", f'device.driver == "{DRIVER}"'))
RACK = "example.com/rack"


def machine(name: str, gpus: int = 4) -> ResourceSlice:
    devices = (device(f"gpu-{i}").attr("uuid", f"{name}-{i}") for i in range(gpus))
    return slice_(f"{name}-gpus", *devices).node(name).build()


def held_on(node: str, *devices: str) -> tuple[str, AllocationResult]:
    return (f"default/held-{node}", allocation(*(result("x", d, pool=node) for d in devices)))


# Racks: a has 3 nodes, b has 2, c has 4 (one of them partly used); n-x has no rack label.
NODES = {
    "a-1": "a", "a-2": "a", "a-3": "a",
    "b-1": "b", "b-2": "b",
    "c-1": "c", "c-2": "c", "c-3": "c", "c-4": "c",
    "n-x": None,
}  # fmt: skip


@dataclass
class Case:
    count: int
    gpus: int
    want: tuple[str | None, list[str]] | None  # (domain, nodes) or None: unsatisfiable
    label: str | None = RACK
    policy: Policy = Policy.BINPACK
    held: list[tuple[str, AllocationResult]] = field(default_factory=list)
    reason: str = ""


CASES = {
    "binpack-takes-the-tightest-rack-that-fits": Case(2, 4, ("b", ["b-1", "b-2"])),
    "first-fit-takes-the-first-rack-by-label": Case(
        2, 4, ("a", ["a-1", "a-2"]), policy=Policy.FIRST_FIT
    ),
    "spread-takes-the-roomiest-rack": Case(2, 4, ("c", ["c-1", "c-2"]), policy=Policy.SPREAD),
    "a-rack-must-hold-every-member": Case(4, 4, ("c", ["c-1", "c-2", "c-3", "c-4"])),
    "partly-used-node-does-not-count-for-whole-node-members": Case(
        4,
        4,
        None,
        held=[held_on("c-3", "gpu-0")],
        reason="at most 3 nodes fit the claims in one domain",
    ),
    "members-that-fit-partly-used-nodes-binpack-them": Case(
        2,
        2,
        ("c", ["c-3", "c-4"]),
        held=[held_on("c-3", "gpu-0", "gpu-1"), held_on("c-4", "gpu-0")],
    ),
    "without-a-label-any-nodes": Case(
        5, 4, (None, ["a-1", "a-2", "a-3", "b-1", "b-2"]), label=None
    ),
    "too-many-members-for-any-rack": Case(5, 4, None, reason="at most 4 nodes fit"),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_gangs(case: Case) -> None:
    nodes = [Node(n, {RACK: r} if r else {}) for n, r in NODES.items()]
    snapshot = ClusterSnapshot.build([machine(n) for n in NODES], nodes)
    state = AllocatedState.build(snapshot, case.held)
    outcome = solve_gang(
        snapshot,
        state,
        GPU,
        [claim("worker").request("g", "gpu", case.gpus).build()],
        node_count=case.count,
        group_by_label=case.label,
        policy=case.policy,
        selectors=SelectorCache(),
    )
    if case.want is None:
        assert isinstance(outcome, Unsatisfiable)
        assert case.reason in summary_text(outcome.explanation.summary)
        return
    assert isinstance(outcome, Allocated), outcome
    domain, members = case.want
    assert outcome.domain == domain
    assert sorted(m.node for m in outcome.placements if m.node) == members
    for member in outcome.placements:  # every member's devices are its own node's
        assert {r.pool for a in member.allocations for r in a.results} == {member.node}
        assert len(member.allocations[0].results) == case.gpus


def test_gang_needs_a_member() -> None:
    snapshot = ClusterSnapshot.build([machine("a-1")])
    with pytest.raises(InvalidArgument, match="gang.nodeCount"):
        solve_gang(
            snapshot,
            AllocatedState(snapshot),
            GPU,
            [claim("w").request("g").build()],
            node_count=0,
            selectors=SelectorCache(),
        )
