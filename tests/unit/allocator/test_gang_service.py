"""Gangs in the service layer: request validation and mapping, reserving every member (and a
shared pool once), idempotency, Explain's holders, and the Capacity bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from services.allocator.adapters.grpc.mapping import (
    QueryRequest,
    allocate_response,
    explain_response,
    proto_path,
    query_from_pb,
)
from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.app.capacity_count import gangs_that_fit
from services.allocator.app.cluster_view import ClusterView
from services.allocator.app.gang_answers import placement_requests
from services.allocator.app.inventory_feed import InventoryUpdate
from services.allocator.app.live_reservations import Holdings
from services.allocator.app.messages import GangSpec, LeaseOptions, Outcome, Query
from services.allocator.app.placing import PlacementSearch
from services.allocator.app.service import AllocatorService, ServiceLimits, _requests
from services.allocator.core import Policy, SelectorCache, summary_text
from services.allocator.reservations.holds import placement_holds
from services.common.dra.model import ResourceClaim
from services.common.errors import FailedPrecondition, InvalidArgument
from services.common.pb.dra_mapping import to_pb_resource_claim
from tests.builders import claim, classes, cls, device, node, node_selector, req, slice_

DRIVER = "gpu.example.com"
GPU = cls(
    "gpu", f"device.driver == '{DRIVER}'", "device.attributes['gpu.example.com'].kind == 'gpu'"
)
SWITCH = cls("switch", "device.attributes['gpu.example.com'].kind == 'switch'")
RACK = "rack"

ONE = claim("one").request("gpu").build()
TWO = claim("two").request("gpu", count=2).build()
WIRED = claim("wired").request("gpu").request("link", "switch").build()


def _pb_gang(count: int, *claims: ResourceClaim, label: str = "") -> pb.Gang:
    return pb.Gang(
        node_count=count,
        group_by_label=label,
        claims_per_node=[to_pb_resource_claim(c) for c in claims or (ONE,)],
    )


# --- request validation and mapping ----------------------------------------------------------


def _nameless() -> pb.AllocateRequest:
    request = pb.AllocateRequest(gang=_pb_gang(2))
    request.gang.claims_per_node[0].name = ""
    return request


@pytest.mark.parametrize(
    ("build", "path"),
    [
        pytest.param(
            lambda: pb.AllocateRequest(gang=_pb_gang(2), claims=[to_pb_resource_claim(ONE)]),
            "claims",
            id="gang-and-claims",
        ),
        pytest.param(
            lambda: pb.AllocateRequest(gang=_pb_gang(2), node_name="a1"),
            "node_name",
            id="gang-pinned-to-a-node",
        ),
        pytest.param(
            lambda: pb.AllocateRequest(gang=_pb_gang(0)), "gang.node_count", id="no-nodes"
        ),
        pytest.param(
            lambda: pb.ExplainRequest(gang=_pb_gang(-3)), "gang.node_count", id="negative-nodes"
        ),
        pytest.param(
            lambda: pb.AllocateRequest(gang=pb.Gang(node_count=2)),
            "gang.claims_per_node",
            id="no-claims-per-node",
        ),
        pytest.param(
            lambda: pb.AllocateRequest(gang=_pb_gang(2, ONE, ONE)),
            "gang.claims_per_node[1].name",
            id="claim-twice",
        ),
        pytest.param(_nameless, "gang.claims_per_node[0].name", id="claim-without-name"),
        pytest.param(
            lambda: pb.AllocateRequest(gang=_pb_gang(2, label="not a label!")),
            "gang.group_by_label",
            id="bad-label-key",
        ),
        pytest.param(
            lambda: pb.CapacityRequest(gang=_pb_gang(2), claims=[to_pb_resource_claim(ONE)]),
            "claims",
            id="capacity-gang-and-claims",
        ),
    ],
)
def test_bad_gang_requests_name_the_field(build: Callable[[], QueryRequest], path: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        query_from_pb(build())
    assert caught.value.field_path == path


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(pb.AllocateRequest(gang=_pb_gang(3, TWO, label=RACK)), id="allocate"),
        pytest.param(pb.ExplainRequest(gang=_pb_gang(3, TWO, label=RACK)), id="explain"),
        pytest.param(pb.CapacityRequest(gang=_pb_gang(3, TWO, label=RACK)), id="capacity"),
    ],
)
def test_gang_requests_become_gang_queries(request_) -> None:
    query = query_from_pb(request_)
    assert query.gang == GangSpec(3, RACK)
    assert [c.name for c in query.claims] == ["two"]
    assert query.node == ""


def test_core_paths_of_gang_claims_point_into_the_gang() -> None:
    core = "claims[0].spec.devices.requests[1].exactly.deviceClassName"
    assert (
        proto_path(core, "gang.claims_per_node")
        == "gang.claims_per_node[0].requests[1].exactly.device_class_name"
    )
    assert proto_path("claims[2].name", "gang.claims_per_node") == "gang.claims_per_node[2].name"


@pytest.mark.parametrize(
    ("units", "count", "gangs"),
    [
        pytest.param([1, 1, 1], 2, 1, id="three-single-slots-one-pair"),
        pytest.param([7, 7], 2, 7, id="two-roomy-nodes"),
        pytest.param([3, 1, 1, 1], 2, 3, id="one-roomy-node-pairs-with-each-small-one"),
        pytest.param([4, 1], 2, 1, id="a-roomy-node-cannot-pair-with-itself"),
        pytest.param([5], 2, 0, id="one-node-never-a-pair"),
        pytest.param([2, 2, 2], 3, 2, id="triples"),
        pytest.param([10, 1, 1], 3, 1, id="a-triple-needs-three-nodes"),
        pytest.param([1, 1, 1, 1, 1], 1, 5, id="gangs-of-one-are-units"),
        pytest.param([], 2, 0, id="no-nodes"),
    ],
)
def test_gangs_that_fit(units: list[int], count: int, gangs: int) -> None:
    assert gangs_that_fit(units, count) == gangs


# --- the service on a small cluster ----------------------------------------------------------


@pytest.fixture
def service():
    """Racks a (a1, a2) and b (b1), two GPUs per node; a fabric pool of two switches every
    node can use (allNodes), reserved under its own scope."""
    gpus = [
        slice_(
            f"{name}-gpus", device("gpu-0").attr("kind", "gpu"), device("gpu-1").attr("kind", "gpu")
        )
        .node(name)
        .build()
        for name in ("a1", "a2", "b1")
    ]
    fabric = (
        slice_(
            "fabric", device("sw-0").attr("kind", "switch"), device("sw-1").attr("kind", "switch")
        )
        .pool("fabric")
        .all_nodes()
        .build()
    )
    nodes = [node("a1", rack="a"), node("a2", rack="a"), node("b1", rack="b")]
    view = ClusterView(min_interval=0.0)
    by_node = {s.node_name or "": (s,) for s in gpus}
    by_node["fabric"] = (fabric,)
    view.apply(InventoryUpdate(3, True, by_node, {n.name: n for n in nodes}))
    view.flush()
    store = MemoryReservationStore()
    holdings = Holdings(store, expire_interval=60)
    holdings.start()
    made = AllocatorService(
        view,
        holdings,
        store,
        PlacementSearch(SelectorCache(), policy=Policy.BINPACK),
        classes(GPU, SWITCH),
        limits=ServiceLimits(lease_seconds=30, max_lease_seconds=60),
    )
    yield made
    holdings.close()
    view.close()


def _gang(count: int, *claims, label: str = RACK, **fields) -> Query:
    return Query(tuple(claims or (TWO,)), gang=GangSpec(count, label), **fields)


def test_gang_reserves_every_member_and_the_next_gang_goes_elsewhere(service):
    first = service.allocate(_gang(2), LeaseOptions("job-1"))
    assert first.outcome is Outcome.ALLOCATED
    assert sorted(m.node for m in first.placements) == ["a1", "a2"]
    assert first.node is None and first.allocations == ()  # on two nodes
    assert sorted(r.node for r in first.reservations) == ["a1", "a2"]
    for member, reservation in zip(
        sorted(first.placements, key=lambda m: m.node),
        sorted(first.reservations, key=lambda r: r.node),
        strict=True,
    ):
        assert reservation.allocations == member.allocations
        assert {r.pool for a in member.allocations for r in a.results} == {member.node}
    response = allocate_response(first, gang=True)
    assert [p.node_name for p in response.gang_placements] == [m.node for m in first.placements]
    assert all(
        len(p.allocations) == 1 and p.allocations[0].name == "two" for p in response.gang_placements
    )
    assert not response.node_name and not response.allocations
    assert len(response.reservations) == 2
    # rack a is full now; rack b has one node only
    second = service.allocate(_gang(2))
    assert second.outcome is Outcome.UNSATISFIABLE
    assert "at most 1 nodes fit" in summary_text(second.explanation.summary)


def test_a_gang_of_one_answers_in_the_gang_fields(service):
    answer = service.allocate(_gang(1, ONE), LeaseOptions("job-1"))
    assert answer.outcome is Outcome.ALLOCATED
    [member] = answer.placements  # one shape: a gang of one's placement is a single node's
    assert allocate_response(answer).node_name == member.node
    response = allocate_response(answer, gang=True)
    assert [p.node_name for p in response.gang_placements] == [member.node]
    assert not response.node_name and not response.allocations
    [reservation] = answer.reservations
    assert reservation.node == member.node and reservation.allocations == member.allocations


def test_gang_of_one_per_rack_without_label_spans_racks(service):
    answer = service.allocate(_gang(3, label=""))
    assert sorted(m.node for m in answer.placements) == ["a1", "a2", "b1"]


def test_members_sharing_a_pool_reserve_it_once(service):
    answer = service.allocate(_gang(2, WIRED), LeaseOptions("job-1"))
    assert answer.outcome is Outcome.ALLOCATED
    scopes = sorted(r.node for r in answer.reservations)
    assert scopes == sorted([*(m.node for m in answer.placements), f"{DRIVER}/fabric"])
    [shared] = [r for r in answer.reservations if r.node == f"{DRIVER}/fabric"]
    assert sorted(shared.hold.devices) == [f"{DRIVER}/fabric/sw-0", f"{DRIVER}/fabric/sw-1"]
    # both switches are taken: no third member anywhere
    assert service.allocate(_gang(1, WIRED)).outcome is Outcome.UNSATISFIABLE


def test_idempotency_key_returns_the_same_reservations(service):
    lease = LeaseOptions("job-7", idempotency_key="job-7-try-1")
    first = service.allocate(_gang(2, ONE), lease)
    again = service.allocate(_gang(2, ONE), lease)
    assert sorted(r.id for r in again.reservations) == sorted(r.id for r in first.reservations)
    assert sorted(m.node for m in again.placements) == sorted(m.node for m in first.placements)
    assert len(service.list_reservations(owner="job-7")[0]) == 2


class _SlowStore:
    """The real store, taking 50 ms per reserve: duplicates overlap for sure."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def reserve(self, placements: Any) -> Any:
        time.sleep(0.05)
        return self._store.reserve(placements)


@pytest.mark.parametrize(
    "query",
    [
        pytest.param(Query((ONE,)), id="one-node"),
        pytest.param(_gang(2, ONE), id="gang"),
    ],
)
def test_the_same_key_sent_concurrently_reserves_once(service, query):
    service.store = _SlowStore(service.store)
    lease = LeaseOptions("job-9", idempotency_key="job-9-try-1")
    start = threading.Barrier(8)

    def call() -> list[str]:
        start.wait()
        return sorted(r.id for r in service.allocate(query, lease).reservations)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: call(), range(8)))

    assert all(answer == answers[0] for answer in answers)
    assert sorted(r.id for r in service.list_reservations(owner="job-9")[0]) == answers[0]


def test_a_key_whose_gang_was_partly_released_is_not_allocated_again(service):
    lease = LeaseOptions("job-7", idempotency_key="job-7-try-1")
    first = service.allocate(_gang(2, ONE), lease)
    service.release(first.reservations[0].id, "job-7")
    with pytest.raises(FailedPrecondition, match="not a placement on 2"):
        service.allocate(_gang(2, ONE), lease)


def test_explain_names_the_gang_that_holds_the_rack(service):
    held = service.allocate(_gang(2), LeaseOptions("job-1"))
    answer = service.explain(_gang(2))
    assert answer.outcome is Outcome.UNSATISFIABLE
    assert {h.reservation_id for h in answer.holders} == {r.id for r in held.reservations}
    lines = explain_response(answer).explanation.messages
    assert lines[0].startswith("gang of 2 nodes")
    assert any(line.startswith("a1:") for line in lines)  # the per-node detail


def test_explain_of_a_fitting_gang_says_where(service):
    answer = service.explain(_gang(2))
    assert answer.outcome is Outcome.ALLOCATED
    assert summary_text(answer.explanation.summary) == "gang of 2 nodes in rack=a: a1, a2"
    assert [p.node_name for p in explain_response(answer, gang=True).gang_placements] == [
        "a1",
        "a2",
    ]


@pytest.mark.parametrize(
    ("query", "nodes"),
    [
        pytest.param(
            _gang(2, label="", node_selector=node_selector(req(RACK, "In", "a"))),
            ["a1", "a2"],
            id="selector",
        ),
        pytest.param(_gang(2, label="", max_nodes=2), ["a1", "a2"], id="max-nodes"),
        pytest.param(
            _gang(2, label="", node_selector=node_selector(req(RACK, "In", "b"))),
            None,
            id="selector-too-small",
        ),
    ],
)
def test_node_restrictions_bound_the_members(service, query, nodes):
    answer = service.allocate(query)
    if nodes is None:
        assert answer.outcome is Outcome.UNSATISFIABLE
    else:
        assert sorted(m.node for m in answer.placements) == nodes


@pytest.mark.parametrize(
    ("query", "total", "counted"),
    [
        pytest.param(_gang(2, ONE), 2, {"a1": 2, "a2": 2, "b1": 2}, id="pairs-per-rack"),
        pytest.param(_gang(1, ONE), 6, {"a1": 2, "a2": 2, "b1": 2}, id="gang-of-one-counts-units"),
        pytest.param(_gang(3, ONE, label=""), 2, {"a1": 2, "a2": 2, "b1": 2}, id="anywhere"),
        pytest.param(_gang(2, ONE, label="zone"), 0, {}, id="no-node-has-the-label"),
    ],
)
def test_capacity_counts_gangs(service, query, total, counted):
    answer = service.capacity(query)
    assert answer.total == total
    assert {n.node: n.count for n in answer.nodes} == counted
    assert answer.models == {}


def test_one_node_placement_requests_are_its_holds_scope_by_scope(service):
    """A single node is a gang of one: its store requests (node scope, then the shared pool)
    are what the Reserve path builds from its holds."""
    lease = LeaseOptions("job-1", idempotency_key="k", labels=(("team", "a"),))
    answer = service.allocate(Query((WIRED,)))
    assert answer.outcome is Outcome.ALLOCATED and len(answer.placements) == 1
    snapshot = service.view.require(0).snapshot
    names = ("default/wired",)
    got = placement_requests(snapshot, answer.placements, names, lease, 30.0)
    holds = placement_holds(snapshot, answer.node or "", answer.allocations)
    assert [r.node for r in got] == [answer.node, f"{DRIVER}/fabric"]
    assert got == _requests(holds, names, answer.allocations, lease, 30.0)
    reserved = service.allocate(Query((WIRED,)), LeaseOptions("job-2"))
    assert sorted(r.node for r in reserved.reservations) == sorted(
        [reserved.node or "", f"{DRIVER}/fabric"]
    )
