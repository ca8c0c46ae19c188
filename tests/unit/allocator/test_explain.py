"""Explain: the reasons the same search records, grouped, ranked and stable."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    Explanation,
    Policy,
    ReasonCode,
    RejectionGroup,
    SearchBudget,
    SelectorCache,
    Unsatisfiable,
    solve,
)
from services.allocator.core.explain import (
    ConstraintMiss,
    ConstraintProblem,
    ConstraintRef,
    Fact,
    IncompletePool,
    NodeReason,
    OtherNodes,
    Picked,
    SelectorMiss,
    Shortage,
    ShortageKind,
    Taint,
    detail_text,
    note_text,
    summary_text,
)
from services.allocator.core.plan import ConstraintKind
from services.common.dra.model import AllocationResult, ResourceClaim
from tests.builders import (
    DRIVER,
    allocation,
    claim,
    classes,
    cls,
    device,
    result,
    slice_,
    snapshot,
    toleration,
)

GPU = classes(
    cls("gpu", f'device.driver == "{DRIVER}"'),
    cls("h100", f'device.driver == "{DRIVER}"', f'device.attributes["{DRIVER}"].model == "H100"'),
)
MIXED = slice_(
    "s",
    device("a100-0").attr("model", "A100"),
    device("h100-0").attr("model", "H100").attr("numa", 0),
    device("h100-1").attr("model", "H100").attr("numa", 1).taint("xid", "79", "NoExecute"),
    device("h100-2").attr("model", "H100").attr("numa", 1),
    device("h100-3").attr("model", "H100").attr("numa", 1).consumes("gpu-3", memory="80Gi"),
    device("h100-3-half").attr("model", "H100").attr("numa", 1).consumes("gpu-3", memory="40Gi"),
).counter_set("gpu-3", memory="80Gi")


def explain(
    claims: list[ResourceClaim],
    snap: ClusterSnapshot,
    held: Sequence[tuple[str, AllocationResult]] = (),
    *,
    node: str | None = "node-1",
    budget: SearchBudget | None = None,
    flag: bool = True,
) -> Unsatisfiable | Allocated:
    state = AllocatedState.build(snap, held)
    return solve(
        snap,
        state,
        GPU,
        claims,
        node=node,
        policy=Policy.FIRST_FIT,
        selectors=SelectorCache(),
        budget=budget or SearchBudget(),
        explain=flag,
    )


def unsatisfiable(outcome: Unsatisfiable | Allocated) -> Explanation:
    assert isinstance(outcome, Unsatisfiable), outcome
    return outcome.explanation


def test_request_groups_name_every_reason_with_examples() -> None:
    held = [("default/train", allocation(result("x", "h100-0"), result("y", "h100-3-half")))]
    why = unsatisfiable(
        explain([claim("c").request("gpus", "h100", 3).build()], snapshot(MIXED), held)
    )
    (request,) = why.requests
    assert (request.claim, request.request, request.considered) == ("default/c", "gpus", 6)
    groups = {(g.code, detail_text(g)): (g.count, g.examples) for g in request.rejections}
    assert groups == {
        (
            ReasonCode.CLASS_SELECTOR,
            f'class h100 selector #1 `device.attributes["{DRIVER}"].model == "H100"` is false',
        ): (
            1,
            (f"{DRIVER}/node-1/a100-0",),
        ),
        (ReasonCode.TAINTED, "tainted xid=79:NoExecute, not tolerated"): (
            1,
            (f"{DRIVER}/node-1/h100-1",),
        ),
        (ReasonCode.IN_USE, "in use by default/train"): (
            2,
            (f"{DRIVER}/node-1/h100-0", f"{DRIVER}/node-1/h100-3-half"),
        ),
    }
    assert why.nodes[0].message() == (
        "node-1: 2 of 3 devices for request gpus of claim default/c; "
        "the others are in use (2), tainted (1)"
    )
    (in_use,) = (g for g in request.rejections if g.code is ReasonCode.IN_USE)
    assert (in_use.holders, in_use.fact) == (("default/train",), None)
    (tainted,) = (g for g in request.rejections if g.code is ReasonCode.TAINTED)
    assert tainted.fact == Taint("xid", "79", "NoExecute")
    assert why.nodes[0].reasons == (
        NodeReason(ReasonCode.IN_USE, 2),
        NodeReason(ReasonCode.TAINTED, 1),
    )


def test_counters_and_capacity_say_what_is_needed_and_free() -> None:
    held = [("default/half", allocation(result("x", "h100-3-half"), result("y", "h100-2")))]
    claims = [
        claim("c").request("gpus", "h100", 1, f'device.attributes["{DRIVER}"].numa == 1').build()
    ]
    snap = snapshot(MIXED)
    why = unsatisfiable(explain(claims, snap, held))
    details = {detail_text(g) for g in why.requests[0].rejections}
    assert "counter memory of set gpu-3 exhausted (needs 80Gi, free 40Gi)" in details
    shortages = {g.shortage for g in why.requests[0].rejections if g.code is ReasonCode.COUNTERS}
    assert shortages == {Shortage(ShortageKind.EXHAUSTED, "memory", "gpu-3", "80Gi", "40Gi")}
    assert "tainted xid=79:NoExecute, not tolerated" in details
    shared = snapshot(slice_("s", device("gpu-0").multi().capacity("memory", "80Gi")))
    held_share = [
        ("default/a", allocation(result("x", "gpu-0", share_id="s", consumed={"memory": "60Gi"})))
    ]
    why = unsatisfiable(
        explain([claim("c").request("g", capacity={"memory": "40Gi"}).build()], shared, held_share)
    )
    assert detail_text(why.requests[0].rejections[0]) == "capacity memory: needs 40Gi, free 20Gi"
    assert why.requests[0].rejections[0].shortage == Shortage(
        ShortageKind.SHORT, "memory", needed="40Gi", free="20Gi"
    )


def test_constraint_explanation_lists_the_values_that_disagreed() -> None:
    tolerate_all = [toleration(exists=True)]
    claims = [
        claim("c")
        .request("gpus", "h100", 4, tolerations=tolerate_all)
        .match(f"{DRIVER}/numa")
        .build()
    ]
    why = unsatisfiable(explain(claims, snapshot(MIXED)))
    (constraint,) = why.constraints
    assert (constraint.kind, constraint.attribute, constraint.values) == (
        "matchAttribute",
        f"{DRIVER}/numa",
        ("0", "1"),
    )
    assert detail_text(constraint.problems[0]) == "value differs from the devices already picked"


def test_nodes_are_ranked_closest_miss_first_then_by_name() -> None:
    snap = snapshot(
        slice_("a", device("gpu-0")).node("node-a"),
        slice_("b", device("gpu-0"), device("gpu-1"), device("gpu-2")).node("node-b"),
        slice_("c", device("gpu-0"), device("gpu-1"), device("gpu-2")).node("node-c"),
    )
    held = [("default/x", allocation(result("x", "gpu-2", pool="node-c")))]
    why = unsatisfiable(
        explain([claim("c").request("gpus", "gpu", 4).build()], snap, held, node=None)
    )
    assert [m.message() for m in why.nodes] == [
        "node-b: 3 of 4 devices for request gpus of claim default/c; "
        "the others are not on this node (1)",
        "node-c: 2 of 4 devices for request gpus of claim default/c; "
        "the others are in use (1), not on this node (1)",
        "node-a: 1 of 4 devices for request gpus of claim default/c; "
        "the others are not on this node (3)",
    ]
    assert summary_text(why.summary).startswith("no node fits the claims; closest: node-b: 3 of 4")


def test_explanations_are_stable() -> None:
    claims = [claim("c").request("gpus", "h100", 3).match(f"{DRIVER}/numa").build()]
    first = unsatisfiable(explain(claims, snapshot(MIXED))).lines()
    second = unsatisfiable(explain(claims, snapshot(MIXED))).lines()
    assert first == second


def test_budget_exhaustion_is_reported_distinctly() -> None:
    snap = snapshot(
        slice_("s", *(device(f"gpu-{k}").attr("i", k // 2).attr("j", k) for k in range(10)))
    )
    claims = [
        claim("c")
        .request("r0", "gpu", 2, f'device.attributes["{DRIVER}"].j >= 0')
        .request("r1", "gpu", 2)
        .match(f"{DRIVER}/i")
        .build()
    ]
    outcome = explain(claims, snap, budget=SearchBudget(max_steps=15))
    assert isinstance(outcome, Unsatisfiable) and outcome.budget_exhausted
    assert outcome.explanation.budget_exhausted
    assert "search budget exhausted" in summary_text(outcome.explanation.summary)
    assert (
        outcome.explanation.lines()[-1] == "search budget exhausted: the answer may be incomplete"
    )
    finished = explain(claims, snap)
    assert isinstance(finished, Unsatisfiable) and not finished.budget_exhausted


def test_chosen_node_explanation_names_score_and_runner_up() -> None:
    snap = snapshot(
        slice_("a", device("gpu-0"), device("gpu-1")).node("node-a"),
        slice_("b", device("gpu-0"), device("gpu-1")).node("node-b"),
    )
    held = [("default/x", allocation(result("x", "gpu-0", pool="node-b")))]
    state = AllocatedState.build(snap, held)
    outcome = solve(
        snap, state, GPU, [claim("c").request("g").build()], selectors=SelectorCache(), explain=True
    )
    assert isinstance(outcome, Allocated) and outcome.explanation is not None
    choice = outcome.explanation.choice
    assert choice is not None and (choice.node, choice.runner_up) == ("node-b", "node-a")
    assert choice.message() == (
        "node-b chosen by BinPack from 2 feasible nodes: 0 of 2 devices (0.00 GPU-equivalents) "
        "free after placement, 100% of counters free; runner-up node-a: 1 of 2 devices "
        "(1.00 GPU-equivalents) free after placement, 100% of counters free"
    )


def test_pinned_node_reports_matching_devices_on_other_nodes() -> None:
    snap = snapshot(
        slice_("a", device("gpu-0")).node("node-a"), slice_("b", device("gpu-0")).node("node-b")
    )
    held = [("default/x", allocation(result("x", "gpu-0", pool="node-a")))]
    why = unsatisfiable(explain([claim("c").request("g").build()], snap, held, node="node-a"))
    codes = {(g.code, g.examples) for g in why.requests[0].rejections}
    assert (ReasonCode.OTHER_NODE, (f"{DRIVER}/node-b/gpu-0",)) in codes


def test_incomplete_pools_are_noted() -> None:
    snap = snapshot(slice_("s", device("gpu-0"), device("gpu-1")).pool("node-1", count=2))
    outcome = explain([claim("c").request("g", "gpu", 3).build()], snap)
    notes = unsatisfiable(outcome).notes
    assert notes == (IncompletePool("gpu.example.com/node-1", seen=1, slices=2),)
    assert [note_text(n) for n in notes] == [
        "pool gpu.example.com/node-1 is incomplete (1 of 2 slices of its newest generation seen); "
        "its devices were used anyway, as upstream does",
    ]


@pytest.mark.parametrize("flag", [True, False], ids=["explain", "no-explain"])
def test_unsatisfiable_always_carries_the_closest_miss(flag: bool) -> None:
    why = unsatisfiable(
        explain([claim("c").request("gpus", "gpu", 7).build()], snapshot(MIXED), flag=flag)
    )
    assert why.nodes[0].message() == (
        "node-1: 5 of 7 devices for request gpus of claim default/c; "
        "the others are not on this node (1), tainted (1)"
    )
    assert bool(why.requests) is flag


@pytest.mark.parametrize(
    ("shortage", "text"),
    [
        pytest.param(
            Shortage(ShortageKind.EXHAUSTED, "memory", "gpu-3", "80Gi", "40Gi"),
            "counter memory of set gpu-3 exhausted (needs 80Gi, free 40Gi)",
            id="counter-exhausted",
        ),
        pytest.param(
            Shortage(ShortageKind.OVERDRAWN, "memory", "gpu-3"),
            "counter memory of set gpu-3 already overdrawn",
            id="counter-overdrawn",
        ),
        pytest.param(
            Shortage(ShortageKind.SHORT, "memory", needed="40Gi", free="20Gi"),
            "capacity memory: needs 40Gi, free 20Gi",
            id="capacity-short",
        ),
        pytest.param(
            Shortage(ShortageKind.MISSING, "cores"), "has no capacity cores", id="capacity-missing"
        ),
        pytest.param(
            Shortage(ShortageKind.NOT_ALLOWED, "memory", needed="6"),
            "capacity memory: 6 is not allowed by its requestPolicy",
            id="capacity-not-allowed",
        ),
    ],
)
def test_shortages_are_fields_rendered_in_the_words_of_the_api(
    shortage: Shortage, text: str
) -> None:
    group = RejectionGroup(ReasonCode.COUNTERS, 2, ("d",), fact=shortage)
    assert detail_text(group) == text
    assert group.message() == f"2 {text} (e.g. d)"


def test_an_overdrawn_counter_set_refuses_the_slices_other_devices() -> None:
    """Existing allocations already take more of a counter than the (shrunk) set holds."""
    snap = snapshot(
        slice_(
            "s",
            device("gpu-0").consumes("gpu", memory="80Gi"),
            device("gpu-1").consumes("gpu", cores="1"),
        ).counter_set("gpu", memory="40Gi", cores="8")
    )
    held = [("default/old", allocation(result("x", "gpu-0")))]
    why = unsatisfiable(explain([claim("c").request("g", "gpu").build()], snap, held))
    groups = {g.code: g for g in why.requests[0].rejections}
    assert groups[ReasonCode.COUNTERS].shortage == Shortage(
        ShortageKind.OVERDRAWN, "memory", counter_set="gpu"
    )
    assert detail_text(groups[ReasonCode.COUNTERS]) == "counter memory of set gpu already overdrawn"
    assert groups[ReasonCode.IN_USE].holders == ("default/old",)


# --- every rejection is a fact: the fields, then the words the edges render -----------------

H100_SELECTOR = f'device.attributes["{DRIVER}"].model == "H100"'
NUMA = f"{DRIVER}/numa"
EVERYTHING = [toleration(exists=True)]


@dataclass(frozen=True)
class FactCase:
    claims: list[ResourceClaim]
    where: str  # "request" (a request's rejections) or "constraint" (a constraint's problems)
    code: ReasonCode
    fact: Fact
    text: str
    count: int
    node: str | None = "node-1"
    snap: ClusterSnapshot | None = None


FACT_CASES = {
    "class-selector-false": FactCase(
        [claim("c").request("gpus", "h100", 5).build()],
        "request",
        ReasonCode.CLASS_SELECTOR,
        SelectorMiss(1, H100_SELECTOR, "h100"),
        f"class h100 selector #1 `{H100_SELECTOR}` is false",
        1,
    ),
    "request-selector-false": FactCase(
        [claim("c").request("g", "h100", 1, f'device.attributes["{DRIVER}"].numa == 7').build()],
        "request",
        ReasonCode.REQUEST_SELECTOR,
        SelectorMiss(0, f'device.attributes["{DRIVER}"].numa == 7'),
        f'request selector #0 `device.attributes["{DRIVER}"].numa == 7` is false',
        5,
    ),
    "picked-for-another-request": FactCase(
        [claim("c").request("a", "gpu", 1).request("b", "gpu", 5).build()],
        "request",
        ReasonCode.PICKED,
        Picked(),
        "picked for another request in this solve",
        3,
    ),
    "match-value-differs-in-the-request": FactCase(
        [claim("c").request("gpus", "h100", 4, tolerations=EVERYTHING).match(NUMA).build()],
        "request",
        ReasonCode.CONSTRAINT,
        ConstraintMiss(
            ConstraintProblem.DIFFERS, constraint=ConstraintRef(0, ConstraintKind.MATCH, NUMA)
        ),
        f"constraint #0 (matchAttribute {NUMA}): value differs from the devices already picked",
        4,
    ),
    "match-value-differs-in-the-constraint": FactCase(
        [claim("c").request("gpus", "h100", 4, tolerations=EVERYTHING).match(NUMA).build()],
        "constraint",
        ReasonCode.CONSTRAINT,
        ConstraintMiss(ConstraintProblem.DIFFERS),
        "value differs from the devices already picked",
        4,
    ),
    "match-too-few-share-a-value": FactCase(
        [claim("c").request("a", "gpu", 5).match(NUMA).build()],
        "constraint",
        ReasonCode.CONSTRAINT,
        ConstraintMiss(ConstraintProblem.FEW_SHARE, bound=3, needed=5),
        "at most 3 devices share a value, 5 needed",
        4,
    ),
    "match-attribute-missing": FactCase(
        [claim("c").request("a", "gpu", 5).match(NUMA).build()],
        "constraint",
        ReasonCode.CONSTRAINT,
        ConstraintMiss(ConstraintProblem.MISSING),
        "attribute missing",
        1,
    ),
    "distinct-too-few-values": FactCase(
        [claim("c").request("gpus", "h100", 3, tolerations=EVERYTHING).distinct(NUMA).build()],
        "constraint",
        ReasonCode.CONSTRAINT,
        ConstraintMiss(ConstraintProblem.FEW_DISTINCT, bound=2, needed=3),
        "only 2 distinct values, 3 needed",
        5,
    ),
    "usable-only-from-another-node": FactCase(
        [claim("c").request("g", "gpu", 2).build()],
        "request",
        ReasonCode.OTHER_NODE,
        OtherNodes("node-a"),
        "usable only from other nodes than node-a",
        1,
        node="node-a",
        snap=snapshot(
            slice_("a", device("gpu-0")).node("node-a"), slice_("b", device("gpu-0")).node("node-b")
        ),
    ),
}


@pytest.mark.parametrize("case", list(FACT_CASES.values()), ids=list(FACT_CASES))
def test_every_rejection_is_a_fact(case: FactCase) -> None:
    """The core says why as fields (no text in the explanation); detail_text, called only by
    the edges, renders the words the wire and the CLI show."""
    why = unsatisfiable(explain(case.claims, case.snap or snapshot(MIXED), node=case.node))
    if case.where == "request":
        groups = [g for r in why.requests for g in r.rejections]
    else:
        groups = [g for c in why.constraints for g in c.problems]
    found = [g for g in groups if g.code is case.code and g.fact == case.fact]
    assert [(detail_text(g), g.count) for g in found] == [(case.text, case.count)], groups
