"""The allocator's use-case layer without gRPC: holds, scopes, node restrictions, leases, paging,
and proto field paths."""

from __future__ import annotations

import threading

import pytest

from services.allocator.adapters.grpc.mapping import proto_path
from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.app.cluster_view import ClusterView
from services.allocator.app.inventory_feed import InventoryUpdate
from services.allocator.app.live_reservations import Holdings
from services.allocator.app.messages import LeaseOptions, Outcome, Query
from services.allocator.app.placing import PlacementSearch
from services.allocator.app.service import AllocatorService, ServiceLimits
from services.allocator.core import Policy, SelectorCache
from services.allocator.reservations.holds import placement_holds
from services.allocator.reservations.model import Hold, LimitedUse, ReservationState
from services.common.deadline import Deadline
from services.common.errors import DeadlineExceeded, InvalidArgument
from tests.builders import (
    allocation,
    claim,
    classes,
    cls,
    device,
    node,
    node_selector,
    req,
    result,
    slice_,
    snapshot,
)

DRIVER = "gpu.example.com"
GPU = cls("gpu", f"device.driver == '{DRIVER}'")

PARTITIONED = (
    slice_(
        "n1-parts",
        device("whole").consumes("set", memory="8", slices="2"),
        device("half-a").consumes("set", memory="4", slices="1"),
        device("shared").multi().capacity("bandwidth", "100"),
    )
    .node("n1")
    .counter_set("set", memory="8", slices="2")
)
NETWORK = slice_("fabric", device("switch-0")).pool("fabric").all_nodes()
SNAPSHOT = snapshot(PARTITIONED, NETWORK, slice_("n2-gpus", device("gpu-0")).node("n2"))


@pytest.mark.parametrize(
    ("results", "holds"),
    [
        pytest.param(
            [result("r", "whole", "n1")],
            {
                "n1": Hold(
                    (f"{DRIVER}/n1/whole",),
                    (
                        LimitedUse(f"counter:{DRIVER}/n1/set/memory", 8000, 8000),
                        LimitedUse(f"counter:{DRIVER}/n1/set/slices", 2000, 2000),
                    ),
                )
            },
            id="partition-takes-the-device-and-its-counters",
        ),
        pytest.param(
            [result("r", "shared", "n1", share_id="s-1", consumed={"bandwidth": "30"})],
            {
                "n1": Hold(
                    (), (LimitedUse(f"capacity:{DRIVER}/n1/shared/bandwidth", 30000, 100000),)
                )
            },
            id="share-takes-capacity-not-the-device",
        ),
        pytest.param(
            [result("r", "whole", "n1", admin=True)],
            {"n1": Hold()},
            id="admin-access-takes-nothing",
        ),
        pytest.param(
            [result("r", "half-a", "n1"), result("s", "switch-0", "fabric")],
            {
                "n1": Hold(
                    (f"{DRIVER}/n1/half-a",),
                    (
                        LimitedUse(f"counter:{DRIVER}/n1/set/memory", 4000, 8000),
                        LimitedUse(f"counter:{DRIVER}/n1/set/slices", 1000, 2000),
                    ),
                ),
                f"{DRIVER}/fabric": Hold((f"{DRIVER}/fabric/switch-0",)),
            },
            id="shared-pool-devices-get-their-own-scope",
        ),
    ],
)
def test_placement_holds(results, holds):
    assert placement_holds(SNAPSHOT, "n1", [allocation(*results)]) == holds


@pytest.mark.parametrize(
    ("results", "path", "message"),
    [
        pytest.param(
            [result("r", "nope", "n1")],
            "allocations[0].allocation.results[0]",
            "not in the inventory",
            id="unknown-device",
        ),
        pytest.param(
            [result("r", "gpu-0", "n2")],
            "allocations[0].allocation.results[0]",
            "not usable from n1",
            id="device-of-another-node",
        ),
        pytest.param(
            [result("r", "whole", "n1"), result("s", "whole", "n1")],
            "allocations[0].allocation.results[1]",
            "allocated twice",
            id="device-twice",
        ),
        pytest.param(
            [result("r", "shared", "n1")],
            "allocations[0].allocation.results[0].shareID",
            "share id is needed",
            id="share-without-id",
        ),
        pytest.param(
            [result("r", "shared", "n1", share_id="s", consumed={"flops": "1"})],
            'allocations[0].allocation.results[0].consumedCapacity["flops"]',
            "no capacity flops",
            id="share-of-an-unknown-capacity",
        ),
    ],
)
def test_bad_placements_name_the_result(results, path, message):
    with pytest.raises(InvalidArgument, match=message) as caught:
        placement_holds(SNAPSHOT, "n1", [allocation(*results)])
    assert caught.value.field_path == path


@pytest.mark.parametrize(
    ("core", "proto"),
    [
        pytest.param(
            "claims[2].spec.devices.requests[0].exactly.deviceClassName",
            "claims[2].requests[0].exactly.device_class_name",
            id="class-name",
        ),
        pytest.param(
            "claims[0].spec.devices.requests[1].firstAvailable[3].selectors[0].cel.expression",
            "claims[0].requests[1].first_available[3].selectors[0].cel",
            id="subrequest-selector",
        ),
        pytest.param(
            "claims[0].spec.devices.constraints[1]",
            "claims[0].constraints[1]",
            id="constraint",
        ),
        pytest.param(
            'classes["gpu.nvidia.com"].spec.selectors[0].cel.expression',
            'device_classes["gpu.nvidia.com"].selectors[0].cel',
            id="class-selector",
        ),
    ],
)
def test_core_field_paths_become_proto_paths(core, proto):
    assert proto_path(core) == proto


# --- the service on a small cluster ------------------------------------------------------


@pytest.fixture
def service():
    slices = [
        slice_(f"{name}-gpus", device("gpu-0"), device("gpu-1")).node(name).build()
        for name in ("a1", "a2", "b1")
    ]
    nodes = [node("a1", rack="a"), node("a2", rack="a"), node("b1", rack="b")]
    view = ClusterView(min_interval=0.0)
    view.apply(
        InventoryUpdate(
            7, True, {s.node_name or "": (s,) for s in slices}, {n.name: n for n in nodes}
        )
    )
    view.flush()
    store = MemoryReservationStore()
    holdings = Holdings(store, expire_interval=60)
    holdings.start()
    made = AllocatorService(
        view,
        holdings,
        store,
        PlacementSearch(SelectorCache(), policy=Policy.SPREAD),
        classes(GPU),
        limits=ServiceLimits(lease_seconds=30, max_lease_seconds=60),
    )
    yield made
    holdings.close()
    view.close()


ONE = claim("one").request("gpu").build()
TWO = claim("two").request("gpu", count=2).build()


def test_node_selector_restricts_the_nodes_considered(service):
    rack_b = node_selector(req("rack", "In", "b"))
    answer = service.allocate(Query((ONE,), node_selector=rack_b))
    assert (answer.outcome, answer.node, answer.generation) == (Outcome.ALLOCATED, "b1", 7)
    service.allocate(Query((TWO,), node="b1"), LeaseOptions("o"))
    full = service.allocate(Query((ONE,), node_selector=rack_b))
    assert full.outcome is Outcome.UNSATISFIABLE
    assert [m.node for m in full.explanation.nodes] == ["b1"]
    assert full.holders and full.holders[0].node == "b1"


def test_max_nodes_bounds_the_candidates(service):
    answer = service.allocate(Query((ONE,), max_nodes=1))
    assert answer.node == "a1"  # the first node by name, though SPREAD would rank all equal


def test_lease_defaults_and_bounds(service):
    reserved = service.allocate(Query((ONE,)), LeaseOptions("o"))
    [reservation] = reserved.reservations
    assert reservation.expires_at - reservation.created_at == pytest.approx(30)
    with pytest.raises(InvalidArgument) as caught:
        service.allocate(Query((ONE,)), LeaseOptions("o", lease_seconds=61))
    assert caught.value.field_path == "lease_ttl"


def test_list_pages_and_filters_by_state(service):
    ids = [service.allocate(Query((ONE,)), LeaseOptions("o")).reservations[0].id for _ in range(3)]
    service.commit(ids[1], "o")
    committed, token = service.list_reservations(state=ReservationState.COMMITTED)
    assert ([r.id for r in committed], token) == ([ids[1]], "")
    first, token = service.list_reservations(owner="o", page_size=2)
    second, last = service.list_reservations(owner="o", page_size=2, page_token=token)
    assert [r.id for r in first + second] == sorted(ids) and last == ""
    with pytest.raises(InvalidArgument) as caught:
        service.list_reservations(owner="someone-else", page_token=token)
    assert caught.value.field_path == "page_token"


# --- the call's deadline, passed as a value ---------------------------------------------------


def _cancelled() -> Deadline:
    ended = threading.Event()
    ended.set()
    return Deadline.after(60.0, ended)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: Deadline.after(0.0), id="deadline-passed"),
        pytest.param(_cancelled, id="client-cancelled"),
    ],
)
def test_a_spent_deadline_answers_budget_exhausted(service, make):
    answer = service.allocate(Query((ONE,)), deadline=make())
    assert answer.outcome is Outcome.BUDGET_EXHAUSTED
    assert answer.explanation is not None and answer.explanation.budget_exhausted
    reserving = service.allocate(Query((ONE,)), LeaseOptions("o"), deadline=make())
    assert reserving.outcome is Outcome.BUDGET_EXHAUSTED and not reserving.reservations
    assert service.explain(Query((ONE,)), deadline=make()).outcome is Outcome.BUDGET_EXHAUSTED
    assert service.allocate(Query((ONE,))).outcome is Outcome.ALLOCATED  # UNBOUNDED by default


@pytest.mark.parametrize(
    ("call", "doing"),
    [
        pytest.param(lambda s, rid, d: s.commit(rid, "o", deadline=d), "commit", id="commit"),
        pytest.param(lambda s, rid, d: s.renew(rid, "o", deadline=d), "renew", id="renew"),
        pytest.param(lambda s, rid, d: s.release(rid, "o", deadline=d), "release", id="release"),
        pytest.param(lambda s, rid, d: s.get(rid, deadline=d), "get", id="get"),
        pytest.param(
            lambda s, rid, d: s.list_reservations(owner="o", deadline=d), "list", id="list"
        ),
    ],
)
def test_a_store_call_does_not_start_once_the_deadline_has_passed(service, call, doing):
    [reservation] = service.allocate(Query((ONE,)), LeaseOptions("o")).reservations
    with pytest.raises(DeadlineExceeded, match=f"{doing}: ran out of time"):
        call(service, reservation.id, Deadline.after(0.0))
    assert service.get(reservation.id).state is ReservationState.RESERVED  # nothing done
