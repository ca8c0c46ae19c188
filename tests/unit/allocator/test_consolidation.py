"""Consolidation (preemption rule 3): a grant within nominal quota that finds no node with room
moves reservations of a movable priority class to equivalent free devices on other nodes.

The real AllocatorService over the embedded store and quota ledger (and over a real Redis:
the same cases, each marked `redis`), on three H100 nodes of 8
GPUs in the DynamicMIG layout (loadtest/clusters.py). Tenants `a` and `b` share a cohort:
`a` has a nominal 8 GPUs, `b` 17 (GPU shares: a 1g slice counts 1/8). The default priority
class is movable, `fixed` is not. Each case lays out b's holdings, then `a` asks for 8 whole
GPUs, and asserts the exact victims, where each went, and what the quota counts."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from loadtest.clusters import H100, device_classes, generate
from loadtest.replay import MIX
from services.allocator.adapters.grpc.mapping import allocate_response
from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.adapters.store.memory_quota import MemoryQuotaLedger
from services.allocator.adapters.store.redis_quota import RedisQuotaLedger
from services.allocator.adapters.store.redis_store import RedisReservationStore
from services.allocator.app.cluster_view import ClusterView
from services.allocator.app.consolidation import MOVED_FROM_LABEL
from services.allocator.app.inventory_feed import InventoryUpdate
from services.allocator.app.live_reservations import Holdings
from services.allocator.app.messages import GangSpec, LeaseOptions, Outcome, Query
from services.allocator.app.placing import PlacementSearch
from services.allocator.app.quotas import QuotaGuard
from services.allocator.app.service import AllocatorService
from services.allocator.core import IDENTITY, ClusterSnapshot, Policy, SelectorCache, device_group
from services.allocator.reservations.model import Reservation, ReservationState
from services.client.mapping import placement_from_pb
from services.common.deadline import UNBOUNDED
from services.common.dra.model import ResourceSlice
from services.common.errors import Conflict, Preempted
from services.common.quota.model import (
    PriorityClass,
    QuotaLimits,
    QuotaModel,
    QuotaResource,
    TenantQuota,
)

KINDS = {k.name: k for k in MIX}
NODES = ("h100-00000", "h100-00001", "h100-00002")
GPUS = QuotaResource("gpus", ("gpu.nvidia.com", "mig.nvidia.com"), gpu_share=True)
MODEL = QuotaModel(
    (GPUS,),
    {
        "a": TenantQuota("a", "lab", {"gpus": QuotaLimits(8000)}),
        "b": TenantQuota("b", "lab", {"gpus": QuotaLimits(17000)}),
    },
    priority_classes={"fixed": PriorityClass("fixed", 0)},
    default_priority=PriorityClass("", 0, movable=True),
)


@dataclass
class Fleet:
    service: AllocatorService
    guard: QuotaGuard

    def hold(
        self, name: str, kind: str, node: str, priority: str = "", commit: bool = False
    ) -> Reservation:
        """b's reservation `name` of `kind` (replay.MIX) on `node`."""
        query = Query((KINDS[kind].claim,), node=node)
        lease = LeaseOptions(f"b/{name}", priority_class=priority, idempotency_key=name)
        answer = self.service.allocate(query, lease)
        assert answer.outcome is Outcome.ALLOCATED, (name, answer.outcome)
        made = answer.reservations[0]
        if commit:
            made = self.service.commit(made.id, made.owner)
        return made

    def used(self) -> dict[str, int]:
        return {row.tenant: row.used for row in self.guard.status()}


@pytest.fixture(params=["embedded", pytest.param("redis", marks=pytest.mark.redis)])
def fleet(request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """The service on the embedded store, or on a real Redis (store and quota ledger)."""
    cluster = generate(24, seed=0, mig_every=1, partly_used=False, mix=(H100,))
    assert tuple(n.name for n in cluster.nodes) == NODES
    view = ClusterView(min_interval=0.0)
    by_node: dict[str, list[ResourceSlice]] = {}
    for s in cluster.slices:
        by_node.setdefault(s.node_name or "", []).append(s)
    view.apply(
        InventoryUpdate(
            1, True, {k: tuple(v) for k, v in by_node.items()}, {n.name: n for n in cluster.nodes}
        )
    )
    view.flush()
    store: MemoryReservationStore | RedisReservationStore
    ledger: MemoryQuotaLedger | RedisQuotaLedger
    if request.param == "redis":
        store = RedisReservationStore(request.getfixturevalue("redis_url"))
        ledger = RedisQuotaLedger(store)
    else:
        store, ledger = MemoryReservationStore(), MemoryQuotaLedger()
    holdings = Holdings(store, expire_interval=3600)
    holdings.start()
    selectors = SelectorCache()
    classes = device_classes()
    guard = QuotaGuard(lambda: MODEL, ledger, lambda: classes, selectors)
    service = AllocatorService(
        view,
        holdings,
        store,
        PlacementSearch(selectors, policy=Policy.FRAGMENTATION_AWARE),
        classes,
        quotas=guard,
    )
    try:
        yield Fleet(service, guard)
    finally:
        holdings.close()
        view.close()
        guard.close()


WHOLE_NODE = Query((KINDS["gpus-8"].claim,))


def described(snapshot: ClusterSnapshot, reservation: Reservation) -> dict[str, object]:
    """What a request can tell of the reservation's device: its attributes but identity."""
    entry = snapshot.device(reservation.allocations[0].results[0].device_id)
    assert entry is not None
    attributes = entry.device.attributes.items()
    return {k: v for k, v in attributes if k.rsplit("/", 1)[-1] not in IDENTITY}


# (id, b's holdings as (name, kind, node index, priority class), the victims expected in
#  order with the node index each moves to; a's node when it fits)
CASES = [
    (
        "one-slice-in-the-way-moves-to-the-fullest-gpu",
        [("s0", "mig-1g", 0, ""), ("s1", "mig-1g", 1, ""), ("s2", "mig-1g", 2, "")],
        [("s0", 1)],
        0,
    ),
    (
        "the-node-with-the-least-to-move",
        [
            ("s0", "mig-1g", 0, ""),
            ("s1", "mig-1g", 0, ""),
            ("s2", "mig-1g", 1, ""),
            ("s3", "mig-2g", 2, ""),
        ],
        [("s2", 0)],
        1,
    ),
    (
        "every-slice-of-a-node-moves-largest-first",
        [
            ("s0", "mig-1g", 0, ""),
            ("s1", "mig-3g", 0, ""),
            ("big", "gpus-8", 1, ""),
            ("s2", "mig-3g", 2, ""),
            ("s3", "mig-3g", 2, ""),
        ],
        [("s1", 2), ("s0", 2)],
        0,
    ),
    (
        "a-class-that-is-not-movable-stays",
        [("s0", "mig-1g", 0, "fixed"), ("s1", "mig-1g", 1, "fixed"), ("s2", "mig-1g", 2, "")],
        [("s2", 0)],
        2,
    ),
    (
        "nothing-movable-in-the-way-no-proposal",
        [("s0", "mig-1g", 0, "fixed"), ("s1", "mig-1g", 1, "fixed"), ("s2", "mig-1g", 2, "fixed")],
        [],
        None,
    ),
    (
        "a-move-needs-an-equivalent-free-device",
        [("s0", "mig-1g", 0, ""), ("n1", "gpus-8", 1, ""), ("n2", "gpus-8", 2, "")],
        [],
        None,
    ),
    (
        "a-whole-gpu-moves-like-a-slice",
        [("g0", "gpus-1", 0, ""), ("g1", "gpus-1", 1, ""), ("n2", "gpus-8", 2, "")],
        [("g0", 1)],
        0,
    ),
]


@pytest.mark.parametrize(
    ("holdings", "moved", "placed_on"), [pytest.param(*c[1:], id=c[0]) for c in CASES]
)
def test_consolidation_table(
    fleet: Fleet,
    holdings: list[tuple[str, str, int, str]],
    moved: list[tuple[str, int]],
    placed_on: int | None,
) -> None:
    held = {
        name: fleet.hold(name, kind, NODES[node], priority, commit=name.startswith("s"))
        for name, kind, node, priority in holdings
    }
    before = fleet.used()
    explained = fleet.service.explain(WHOLE_NODE, owner="a/job")
    assert [v.holder.reservation_id for v in explained.preemption] == [
        held[name].id for name, _ in moved
    ]
    assert [v.moved_to_node for v in explained.preemption] == [NODES[to] for _, to in moved]
    assert {v.reason for v in explained.preemption} <= {"consolidate"}
    asked = fleet.service.allocate(WHOLE_NODE, LeaseOptions("a/job"))  # without preempt
    assert asked.outcome is Outcome.UNSATISFIABLE and not asked.reservations
    assert len(asked.preemption) == len(moved)

    answer = fleet.service.allocate(WHOLE_NODE, LeaseOptions("a/job", preempt=True))
    if placed_on is None:
        assert answer.outcome is Outcome.UNSATISFIABLE and not answer.preemption
        assert fleet.used() == before
        assert all(fleet.service.get(r.id) == r for r in held.values())
        return
    assert answer.outcome is Outcome.ALLOCATED
    assert answer.node == NODES[placed_on]
    assert [v.holder.reservation_id for v in answer.preemption] == [
        held[name].id for name, _ in moved
    ]
    snapshot = fleet.service.view.require(0).snapshot
    for victim, (name, to) in zip(answer.preemption, moved, strict=True):
        old = held[name]
        with pytest.raises(Preempted, match=f"moved to reservation {victim.replacement_id}"):
            fleet.service.renew(old.id, old.owner)
        new = fleet.service.get(victim.replacement_id)
        assert (new.owner, new.node, new.idempotency_key) == (old.owner, NODES[to], name)
        assert new.state is ReservationState.RESERVED  # leased until its holder adopts it
        if old.state is ReservationState.COMMITTED:
            fleet.service.commit(new.id, new.owner)
        assert dict(new.labels)[MOVED_FROM_LABEL] == old.id
        assert described(snapshot, new) == described(snapshot, old)
    # the holders' quota went with them; a's grant counts once
    assert fleet.used() == {**before, "a": 8000}


def test_a_moved_slice_goes_to_the_gpu_already_in_use(fleet: Fleet) -> None:
    s0 = fleet.hold("s0", "mig-1g", NODES[0])
    s1 = fleet.hold("s1", "mig-1g", NODES[1])
    fleet.hold("s2", "mig-1g", NODES[2])
    answer = fleet.service.allocate(WHOLE_NODE, LeaseOptions("a/job", preempt=True))
    assert answer.outcome is Outcome.ALLOCATED and answer.node == NODES[0]
    (victim,) = answer.preemption
    snapshot = fleet.service.view.require(0).snapshot

    def gpu(reservation: Reservation) -> str:
        entry = snapshot.device(reservation.allocations[0].results[0].device_id)
        assert entry is not None
        return device_group(entry)

    assert victim.holder.reservation_id == s0.id
    assert gpu(fleet.service.get(victim.replacement_id)) == gpu(s1)  # packed, not spread


def test_over_nominal_never_consolidates(fleet: Fleet) -> None:
    for index, node in enumerate(NODES):
        fleet.hold(f"s{index}", "mig-1g", node)
    mine = fleet.service.allocate(Query((KINDS["mig-1g"].claim,)), LeaseOptions("a/first"))
    assert mine.outcome is Outcome.ALLOCATED  # a holds 1/8: 8 more GPUs would pass nominal
    answer = fleet.service.allocate(WHOLE_NODE, LeaseOptions("a/job", preempt=True))
    assert answer.outcome is not Outcome.ALLOCATED and not answer.preemption


def test_a_replacement_nobody_adopts_lapses(fleet: Fleet) -> None:
    fleet.hold("s0", "mig-1g", NODES[0], commit=True)
    fleet.hold("n1", "gpus-8", NODES[1])
    fleet.hold("s2", "mig-1g", NODES[2])
    answer = fleet.service.allocate(WHOLE_NODE, LeaseOptions("a/job", preempt=True))
    (victim,) = answer.preemption
    new = fleet.service.get(victim.replacement_id)
    limits = fleet.service.limits
    assert new.state is ReservationState.RESERVED and new.expires_at is not None
    assert abs(new.expires_at - new.created_at - limits.lease_seconds) < 5  # the default lease


def test_a_reserved_victim_keeps_its_lease_and_idempotency_key(fleet: Fleet) -> None:
    s0 = fleet.hold("s0", "mig-1g", NODES[0])
    fleet.hold("n1", "gpus-8", NODES[1])
    fleet.hold("s2", "mig-1g", NODES[2])
    answer = fleet.service.allocate(WHOLE_NODE, LeaseOptions("a/job", preempt=True))
    (victim,) = answer.preemption
    new = fleet.service.get(victim.replacement_id)
    assert new.state is ReservationState.RESERVED
    assert s0.expires_at is not None and new.expires_at is not None
    assert abs(new.expires_at - s0.expires_at) < 5
    # the holder asking again with its key gets the replacement, not other devices
    again = fleet.service.allocate(
        Query((KINDS["mig-1g"].claim,), node=NODES[0]),
        LeaseOptions("b/s0", idempotency_key="s0"),
    )
    assert [r.id for r in again.reservations] == [new.id]


def test_the_answer_names_the_replacement_on_the_wire(fleet: Fleet) -> None:
    fleet.hold("s0", "mig-1g", NODES[0])
    fleet.hold("n1", "gpus-8", NODES[1])
    fleet.hold("s2", "mig-1g", NODES[2])
    answer = fleet.service.allocate(WHOLE_NODE, LeaseOptions("a/job", preempt=True))
    (victim,) = answer.preemption
    message = allocate_response(answer)
    (sent,) = message.preemption.victims
    assert (sent.reason, sent.moved_to_node) == ("consolidate", NODES[2])
    assert sent.replacement_reservation_id == victim.replacement_id
    (shown,) = placement_from_pb(message).preemption
    assert shown.endswith(f"moved to {victim.replacement_id} on {NODES[2]})")


def test_a_replacement_whose_device_was_taken_meanwhile_revokes_nothing(fleet: Fleet) -> None:
    """The race the grant path answers: between the proposal and its execution another grant
    takes the device a move would go to. Nothing is revoked, no replacement is left, the
    quota counts only what is held."""
    s0 = fleet.hold("s0", "mig-1g", NODES[0])
    fleet.hold("n1", "gpus-8", NODES[1])
    fleet.hold("s2", "mig-1g", NODES[2])
    service = fleet.service
    view, state = service._read(WHOLE_NODE, UNBOUNDED)
    answer = service._answer(view, state, WHOLE_NODE, UNBOUNDED, explain=False)
    lease = LeaseOptions("a/job", preempt=True)
    proposal = service._proposal(view, state, WHOLE_NODE, answer, lease, (), UNBOUNDED)
    assert proposal is not None
    (move,) = proposal.moves
    taken = service.reserve(move.node, [("other", move.allocation)], LeaseOptions("b/other"))
    before = fleet.used()
    with pytest.raises(Conflict):
        service._revoke(proposal, "a/job", UNBOUNDED)
    assert service.get(s0.id) == s0
    assert {r.owner for r in service.holdings.reservations()} == {
        "b/s0",
        "b/n1",
        "b/s2",
        taken[0].owner,
    }
    assert fleet.used() == before


def test_a_gangs_member_is_never_moved(fleet: Fleet) -> None:
    """A gang's members share their owner and idempotency key, one per node: moving one would
    break the gang (and the store would answer a sibling's reservation for the key)."""
    gang = Query((KINDS["mig-1g"].claim,), gang=GangSpec(3))
    made = fleet.service.allocate(gang, LeaseOptions("b/gang", idempotency_key="gang"))
    assert made.outcome is Outcome.ALLOCATED and len(made.reservations) == 3
    before = fleet.used()
    answer = fleet.service.allocate(WHOLE_NODE, LeaseOptions("a/job", preempt=True))
    assert answer.outcome is Outcome.UNSATISFIABLE and not answer.preemption
    assert {r.id for r in fleet.service.holdings.reservations()} == {
        r.id for r in made.reservations
    }
    assert fleet.used() == before


def test_a_victim_released_meanwhile_leaves_no_replacement(fleet: Fleet) -> None:
    s0 = fleet.hold("s0", "mig-1g", NODES[0])
    fleet.hold("n1", "gpus-8", NODES[1])
    fleet.hold("s2", "mig-1g", NODES[2])
    service = fleet.service
    view, state = service._read(WHOLE_NODE, UNBOUNDED)
    answer = service._answer(view, state, WHOLE_NODE, UNBOUNDED, explain=False)
    lease = LeaseOptions("a/job", preempt=True)
    proposal = service._proposal(view, state, WHOLE_NODE, answer, lease, (), UNBOUNDED)
    assert proposal is not None
    service.release(s0.id, s0.owner)  # its holder let go between the proposal and the move
    before = fleet.used()
    (victim,) = service._revoke(proposal, "a/job", UNBOUNDED)
    assert victim.replacement_id == ""
    assert {r.owner for r in service.holdings.reservations()} == {"b/n1", "b/s2"}
    assert fleet.used() == before


@pytest.mark.parametrize(
    ("nodes_tried", "placed_on"),
    [
        pytest.param(16, NODES[1], id="the-default-tries-the-next-node"),
        pytest.param(1, None, id="one-node-tried-finds-no-room"),
    ],
)
def test_consolidation_tries_at_most_max_consolidation_nodes(
    fleet: Fleet, nodes_tried: int, placed_on: str | None
) -> None:
    """Node 0 holds the least to move, but a reservation that is not movable stays there;
    node 1 makes room once its slice moves."""
    fleet.hold("f0", "mig-1g", NODES[0], "fixed")
    fleet.hold("s0", "mig-1g", NODES[0])
    fleet.hold("s1", "mig-3g", NODES[1])
    fleet.hold("n2", "gpus-4", NODES[2])
    limits = fleet.service.limits
    fleet.service.limits = dataclasses.replace(limits, max_consolidation_nodes=nodes_tried)
    answer = fleet.service.allocate(WHOLE_NODE, LeaseOptions("a/job", preempt=True))
    assert (answer.node or None) == placed_on
    assert [v.reason for v in answer.preemption] == (["consolidate"] if placed_on else [])
