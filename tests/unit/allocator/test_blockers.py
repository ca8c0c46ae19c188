"""Blockers: the reservations an Explain names come from the explanation's fields (the holders
of IN_USE rejections, the reason codes of the closest misses), never from its text."""

from __future__ import annotations

import pytest

from services.allocator.app.holders import blocking_holders, holder_ids
from services.allocator.app.messages import Answer, Outcome
from services.allocator.app.tenancy import visible_answer
from services.allocator.core import (
    AllocatedState,
    Explanation,
    NodeMiss,
    ReasonCode,
    RejectionGroup,
    RequestExplanation,
    SelectorCache,
    Unsatisfiable,
    solve,
)
from services.allocator.core.explain import (
    NodeReason,
    Picked,
    Shortage,
    ShortageKind,
    Summary,
    SummaryKind,
    Taint,
    detail_text,
)
from services.allocator.reservations.model import Hold, Reservation, ReservationState
from services.common.security.principal import Identity, IdentityKind, Principal
from tests.builders import DRIVER, allocation, claim, classes, cls, device, result, slice_, snapshot

GPU = classes(cls("gpu", f'device.driver == "{DRIVER}"'))


def reservation(rid: str, node: str, expires_at: float | None = 60.0) -> Reservation:
    return Reservation(
        rid, "sched", node, ("default/c",), (), Hold(), ReservationState.RESERVED, 1, 0.0,
        expires_at,
    )  # fmt: skip


def in_use(*holders: str, count: int = 1) -> RejectionGroup:
    return RejectionGroup(ReasonCode.IN_USE, count, (), holders)


def miss(node: str, *reasons: NodeReason) -> NodeMiss:
    return NodeMiss(node, 1, 2, "default/c", "gpus", 1, 2, reasons)


def unsatisfiable(
    groups: tuple[RejectionGroup, ...] = (), nodes: tuple[NodeMiss, ...] = ()
) -> Answer:
    request = RequestExplanation("default/c", "gpus", 4, groups)
    explanation = Explanation(
        summary=Summary(SummaryKind.NO_DEVICES), nodes=nodes, requests=(request,)
    )
    return Answer(Outcome.UNSATISFIABLE, 1, (), explanation=explanation)


LIVE = (
    reservation("res-a", "node-1", 30.0),
    reservation("res-b", "node-1", None),
    reservation("res-c", "node-2", 10.0),
    reservation("res-d", "node-3", 20.0),
)


@pytest.mark.parametrize(
    ("answer", "max_nodes", "named"),
    [
        pytest.param(
            unsatisfiable((in_use("res-c", "res-d", count=2),)),
            10,
            ["res-c", "res-d"],
            id="in-use-rejection-names-its-holders-soonest-free-first",
        ),
        pytest.param(
            unsatisfiable((in_use("res-a"), in_use("res-d"))),
            0,
            ["res-d", "res-a"],
            id="every-in-use-group-counts-without-any-node",
        ),
        pytest.param(
            unsatisfiable((in_use("res-gone"),)),
            10,
            [],
            id="a-holder-no-longer-live-is-not-named",
        ),
        pytest.param(
            unsatisfiable(
                (RejectionGroup(ReasonCode.TAINTED, 1, (), fact=Taint("k", "v", "NoSchedule")),)
            ),
            10,
            [],
            id="a-taint-has-no-holder",
        ),
        pytest.param(
            unsatisfiable(nodes=(miss("node-1", NodeReason(ReasonCode.COUNTERS, 1)),)),
            10,
            ["res-a", "res-b"],
            id="counter-shortage-names-that-nodes-reservations",
        ),
        pytest.param(
            unsatisfiable(nodes=(miss("node-2", NodeReason(ReasonCode.CAPACITY, 3)),)),
            10,
            ["res-c"],
            id="capacity-shortage-names-that-nodes-reservations",
        ),
        pytest.param(
            unsatisfiable(nodes=(miss("node-2", NodeReason(ReasonCode.IN_USE, 1)),)),
            10,
            ["res-c"],
            id="devices-in-use-name-that-nodes-reservations",
        ),
        pytest.param(
            unsatisfiable(
                nodes=(
                    miss("node-1", NodeReason(ReasonCode.TAINTED, 2)),
                    miss("node-3", NodeReason(ReasonCode.NO_DEVICES, 1)),
                )
            ),
            10,
            [],
            id="nodes-short-for-other-reasons-name-nobody",
        ),
        pytest.param(
            unsatisfiable(
                nodes=(
                    miss("node-2", NodeReason(ReasonCode.COUNTERS, 1)),
                    miss("node-1", NodeReason(ReasonCode.COUNTERS, 1)),
                )
            ),
            1,
            ["res-c"],
            id="only-the-closest-max-nodes-count",
        ),
        pytest.param(
            Answer(
                Outcome.ALLOCATED,
                1,
                (),
                explanation=unsatisfiable((in_use("res-a"),)).explanation,
            ),
            10,
            [],
            id="an-allocated-answer-names-nobody",
        ),
    ],
)
def test_blocking_holders_read_the_fields(answer: Answer, max_nodes: int, named: list[str]) -> None:
    found = blocking_holders(answer, LIVE, max_nodes)
    assert [h.reservation_id for h in found] == named


@pytest.mark.parametrize(
    ("group", "ids"),
    [
        pytest.param(in_use("res-a", "res-b"), ("res-a", "res-b"), id="in-use-names-holders"),
        pytest.param(in_use(), (), id="in-use-by-an-unnamed-owner"),
        pytest.param(
            RejectionGroup(ReasonCode.PICKED, 1, (), ("res-a",), Picked()),
            (),
            id="only-in-use-groups-name-holders",
        ),
    ],
)
def test_holder_ids(group: RejectionGroup, ids: tuple[str, ...]) -> None:
    assert holder_ids(group) == ids


@pytest.mark.parametrize(
    ("group", "text"),
    [
        pytest.param(in_use("res-b", "res-a"), "in use by res-a, res-b", id="holders-sorted"),
        pytest.param(in_use(), "in use", id="no-holder-named"),
        pytest.param(
            RejectionGroup(
                ReasonCode.CAPACITY,
                1,
                (),
                fact=Shortage(ShortageKind.SHORT, "memory", "", "1", "0"),
            ),
            "capacity memory: needs 1, free 0",
            id="a-fact-rendered",
        ),
        pytest.param(
            RejectionGroup(ReasonCode.EQUIVALENT, 1, ()),
            "equivalent to devices that did not fit",
            id="no-fact-the-reason-phrase",
        ),
    ],
)
def test_detail_text_renders_holders(group: RejectionGroup, text: str) -> None:
    assert detail_text(group) == text


def test_the_solver_names_the_holders_and_blockers_find_them() -> None:
    """End to end: devices held by two reservations; the explanation carries both ids, and
    blocking_holders names exactly those (not the reservation on another node)."""
    snap = snapshot(
        slice_("s", device("gpu-0"), device("gpu-1"), device("gpu-2")).node("node-1"),
    )
    held = [
        ("res-a", allocation(result("x", "gpu-0"))),
        ("res-b", allocation(result("y", "gpu-1"))),
    ]
    state = AllocatedState.build(snap, held)
    claims = [claim("c").request("gpus", "gpu", 3).build()]
    outcome = solve(snap, state, GPU, claims, selectors=SelectorCache(), explain=True)
    assert isinstance(outcome, Unsatisfiable), outcome
    (request,) = outcome.explanation.requests
    groups = [g for g in request.rejections if g.code is ReasonCode.IN_USE]
    assert sorted(h for g in groups for h in g.holders) == ["res-a", "res-b"]
    assert all(g.fact is None for g in groups)
    (closest,) = outcome.explanation.nodes
    assert NodeReason(ReasonCode.IN_USE, 2) in closest.reasons
    answer = Answer(Outcome.UNSATISFIABLE, 1, (), explanation=outcome.explanation)
    live = (*LIVE[:2], reservation("res-x", "node-9"))
    found = blocking_holders(answer, live, max_nodes=0)
    assert [h.reservation_id for h in found] == ["res-a", "res-b"]


@pytest.mark.parametrize(
    ("tenant", "holders", "text"),
    [
        pytest.param(
            "team-a",
            ("a reservation of tenant team-b", "res-a"),
            "in use by a reservation of tenant team-b, res-a",
            id="team-a-sees-its-own-holder-not-team-bs",
        ),
        pytest.param(
            "team-b",
            ("a reservation of tenant team-a", "res-b"),
            "in use by a reservation of tenant team-a, res-b",
            id="team-b-sees-its-own-holder-not-team-as",
        ),
        pytest.param(
            "team-c",
            ("a reservation of tenant team-a", "a reservation of tenant team-b"),
            "in use by a reservation of tenant team-a, a reservation of tenant team-b",
            id="a-third-tenant-sees-no-holder-id",
        ),
    ],
)
def test_visible_answer_redacts_the_holders_field(
    tenant: str, holders: tuple[str, ...], text: str
) -> None:
    owners = {"res-a": "team-a/sched", "res-b": "team-b/sched"}
    viewer = Principal(Identity(IdentityKind.CERTIFICATE, "sched"), tenant=tenant)
    shown = visible_answer(unsatisfiable((in_use("res-a", "res-b"),)), viewer, owners.get)
    assert shown.explanation is not None
    (group,) = shown.explanation.requests[0].rejections
    assert group.holders == holders
    assert detail_text(group) == text
