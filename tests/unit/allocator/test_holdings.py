"""Holdings: the local copy of live reservations, kept by events, own operations and refreshes,
and turned into an AllocatedState that equals one built from scratch."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.app.cluster_view import ViewSnapshot
from services.allocator.app.granting import GrantRun
from services.allocator.app.inventory_feed import StaticFeed
from services.allocator.app.live_reservations import Holdings
from services.allocator.app.reservation_limit import ReservationLimit
from services.allocator.core import AllocatedState, ClusterSnapshot
from services.allocator.reservations.holds import placement_holds
from services.allocator.reservations.model import (
    Reservation,
    ReservationEvent,
    ReservationEventOp,
    ReservationState,
    ReserveRequest,
    reserve_placement,
)
from services.common.deadline import UNBOUNDED
from services.common.dra.model import AllocationResult, DeviceID, DeviceRequestAllocationResult
from services.common.errors import Conflict

CLUSTER = Path(__file__).resolve().parents[3] / "examples" / "cluster"
FEED = StaticFeed.from_paths([str(CLUSTER)]).update()
SNAPSHOT = ClusterSnapshot.build([s for slices in FEED.slices.values() for s in slices])
VIEW = ViewSnapshot(1, SNAPSHOT, 0, 0.0)
A100 = "a100-node-1"
MIG = [e.id for e in SNAPSHOT.view(A100).devices() if "-mig-" in e.id.device]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_750_000_000.0

    def __call__(self) -> float:
        return self.now


def _allocation(*devices: DeviceID) -> AllocationResult:
    return AllocationResult(
        tuple(DeviceRequestAllocationResult("r", d.driver, d.pool, d.device) for d in devices)
    )


def _request(node: str, *devices: DeviceID, lease: float = 60.0) -> ReserveRequest:
    allocation = _allocation(*devices)
    [hold] = placement_holds(SNAPSHOT, node, [allocation]).values()
    return ReserveRequest("o", node, ("default/c",), (allocation,), hold, lease)


def _reservation(rid: str, *devices: DeviceID) -> Reservation:
    request = _request(A100, *devices)
    return Reservation(
        rid, "o", A100, request.claim_names, request.allocations, request.hold,
        ReservationState.RESERVED, 1, 0.0, 60.0,
    )  # fmt: skip


def _until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@pytest.fixture
def store():
    clock = FakeClock()
    made = MemoryReservationStore(clock=clock)
    made.clock = clock  # type: ignore[attr-defined]
    return made


@pytest.fixture
def holdings(store):
    events: list[ReservationEvent] = []
    made = Holdings(store, expire_interval=0.02, refresh_interval=3600, on_event=events.append)
    made.events = events  # type: ignore[attr-defined]
    yield made
    made.close()


def test_start_loads_what_is_live(store, holdings):
    reserve_placement(store, [_request(A100, MIG[0])])[0]
    holdings.start()
    assert holdings.synced
    assert holdings.state_for(VIEW).in_use(MIG[0])


def test_other_replicas_changes_arrive_as_events(store, holdings):
    holdings.start()
    reservation = reserve_placement(store, [_request(A100, MIG[0])])[0]
    _until(lambda: holdings.state_for(VIEW).in_use(MIG[0]))
    assert holdings.state_for(VIEW).owners(MIG[0]) == (reservation.id,)
    store.release(reservation.id, "o")
    _until(lambda: not holdings.state_for(VIEW).in_use(MIG[0]))


def test_expired_leases_are_freed_by_the_janitor(store, holdings):
    holdings.start()
    reserve_placement(store, [_request(A100, MIG[0], lease=1.0)])[0]
    _until(lambda: holdings.state_for(VIEW).in_use(MIG[0]))
    store.clock.now += 2.0
    _until(lambda: not holdings.state_for(VIEW).in_use(MIG[0]))
    assert ReservationEventOp.EXPIRE in {event.op for event in holdings.events}


def test_state_is_cached_per_view_and_version_and_rebased_on_a_new_view(holdings):
    holdings.added([_reservation("res-1", MIG[0])])
    first = holdings.state_for(VIEW)
    assert holdings.state_for(VIEW) is first
    newer = ViewSnapshot(2, ClusterSnapshot.build(FEED.slices[A100]), 0, 0.0)
    rebased = holdings.state_for(newer)
    assert rebased is not first and rebased.in_use(MIG[0])
    entry = SNAPSHOT.device(MIG[0])
    assert entry is not None
    counter = entry.counters[0][0]
    assert rebased.counter_used(counter) == first.counter_used(counter) > 0


def test_a_removed_id_is_not_resurrected_by_a_late_add(holdings):
    late = _reservation("res-late", MIG[1])
    holdings.removed([late.id])
    holdings.added([late])
    assert holdings.get(late.id) is None


def test_refresh_of_a_node_replaces_only_that_node(store, holdings):
    holdings.start()
    h100 = next(iter(SNAPSHOT.view("h100-node-1").devices())).id
    other = _request("h100-node-1", h100)
    stranger = Reservation(
        "res-gone", "o", "h100-node-1", other.claim_names, other.allocations, other.hold,
        ReservationState.RESERVED, 1, 0.0, 60.0,
    )  # fmt: skip
    holdings.added([stranger])  # known here, but not in the store
    kept = _reservation("res-local", MIG[2])
    holdings.added([kept])  # a100 reservation not in the store either
    holdings.refresh("h100-node-1")
    assert holdings.get("res-gone") is None
    assert holdings.get("res-local") is not None


def test_a_nodes_refresh_applies_what_it_finds_without_a_rebuild(store):
    holdings = Holdings(store, expire_interval=3600, refresh_interval=3600)
    holdings.refresh()
    before = holdings.state_for(VIEW)
    missed = reserve_placement(store, [_request(A100, MIG[0])])[
        0
    ]  # another replica's: no event applied here
    assert holdings.refresh(A100) is True
    assert holdings._journal is not None  # the change goes in incrementally
    state = holdings.state_for(VIEW)
    assert MIG[0] in state.devices_in_use and MIG[0] not in before.devices_in_use
    assert state.owners(MIG[0]) == (missed.id,)


def test_a_nodes_refresh_that_finds_nothing_says_so_and_rebuild_heals(store):
    holdings = Holdings(store, expire_interval=3600, refresh_interval=3600)
    holdings.added([reserve_placement(store, [_request(A100, MIG[1])])[0]])
    holdings.state_for(VIEW)
    assert holdings.refresh(A100) is False
    holdings.rebuild()
    assert holdings._journal is None  # the next solve builds the state from the copy
    assert MIG[1] in holdings.state_for(VIEW).devices_in_use


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["theirs", "ours", "release", "refresh"]),
            st.integers(0, 11),
            st.lists(st.integers(0, len(MIG) - 1), min_size=1, max_size=3),
        ),
        max_size=60,
    )
)
def test_node_refreshes_keep_the_incremental_state_exact(operations):
    """Reservations made in the store by another replica (no events here), by this process,
    and released in the store; node refreshes now and then: the state always equals one built
    from scratch out of the copy, and after a refresh the copy is the store's."""
    store = MemoryReservationStore()
    holdings = Holdings(store, expire_interval=3600, refresh_interval=3600)
    holdings.refresh()
    for index, (op, slot, picks) in enumerate(operations):
        devices = sorted({MIG[p] for p in picks})
        if op in ("theirs", "ours"):
            try:
                made = reserve_placement(store, [_request(A100, *devices)])[0]
            except Conflict:
                continue
            if op == "ours":
                holdings.added([made])
        elif op == "release":
            live = sorted(r.id for r in store.live())
            if live:
                store.release(live[slot % len(live)], "o")
        else:
            holdings.refresh(A100)
            assert {r.id for r in holdings.reservations()} == {r.id for r in store.live()}
        if index % 3 == 0:
            holdings.state_for(VIEW)  # cache now and then: later changes apply incrementally
        got = holdings.state_for(VIEW)
        held = [(r.id, a) for r in holdings.reservations() for a in r.allocations]
        want = AllocatedState.build(SNAPSHOT, held)
        assert got.devices_in_use == want.devices_in_use
        counters = {c for e in SNAPSHOT.all_devices() for c, _ in e.counters}
        assert {c: got.counter_used(c) for c in counters} == {
            c: want.counter_used(c) for c in counters
        }


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.integers(0, 11),
            st.lists(st.integers(0, len(MIG) - 1), min_size=1, max_size=3),
        ),
        max_size=90,
    )
)
def test_incremental_state_equals_a_state_built_from_scratch(operations):
    holdings = Holdings(MemoryReservationStore())
    live: dict[str, Reservation] = {}
    for index, (add, slot, picks) in enumerate(operations):
        rid = f"res-{slot}"
        if add and rid not in live:
            reservation = _reservation(f"{rid}", *sorted({MIG[p] for p in picks}))
            live[rid] = reservation
            holdings.added([reservation])
        elif not add and rid in live:
            holdings.removed([rid])
            del live[rid]
            holdings._tombstones.clear()  # ids are reused by this test on purpose
        if index % 7 == 0:
            holdings.state_for(VIEW)  # cache now and then: later changes apply incrementally
    got = holdings.state_for(VIEW)
    want = AllocatedState.build(SNAPSHOT, ((r.id, a) for r in live.values() for a in r.allocations))
    assert got.devices_in_use == want.devices_in_use
    counters = {c for e in SNAPSHOT.all_devices() for c, _ in e.counters}
    assert {c: got.counter_used(c) for c in counters} == {c: want.counter_used(c) for c in counters}
    assert {d: got.owners(d) for d in want.devices_in_use} == {
        d: want.owners(d) for d in want.devices_in_use
    }


def test_a_pending_placement_is_held_until_it_settles_or_is_dropped(holdings):
    placement = _allocation(MIG[0])
    token = holdings.hold_pending([A100], [placement])
    assert holdings.state_for(VIEW).owners(MIG[0]) == (token,)
    assert holdings.reservations() == []  # pending is not a reservation (Explain, idempotency)

    granted = dataclasses.replace(_reservation("res-1", MIG[0]), allocations=(placement,))
    holdings.settle_pending(token, [granted])
    assert holdings.state_for(VIEW).owners(MIG[0]) == ("res-1",)

    refused = holdings.hold_pending([A100], [_allocation(MIG[1])])
    assert holdings.state_for(VIEW).in_use(MIG[1])
    holdings.drop_pending(refused)
    assert not holdings.state_for(VIEW).in_use(MIG[1])


def _grant_run_trace(limit: int | None, taken: int) -> list[object]:
    """What a grant run of three one-device placements holds while pending and after its
    write (device `taken` reserved elsewhere meanwhile: a conflict), owners by placement."""
    store = MemoryReservationStore(clock=FakeClock())
    holdings = Holdings(store, expire_interval=3600, refresh_interval=3600)
    run = GrantRun(store, holdings, None, ReservationLimit(holdings.reservations))
    requests = [_request(A100, device) for device in MIG[:3]]
    trace: list[object] = [run.add(SNAPSHOT, [request], limit=limit) for request in requests]
    state = holdings.state_for(VIEW)
    trace.append([state.owners(device) for device in MIG[:4]])
    store.reserve([[_request(A100, MIG[taken])]])
    outcomes = run.write(UNBOUNDED)
    trace.append([type(o).__name__ if isinstance(o, Exception) else len(o) for o in outcomes])
    ids = {r.id: i for i, o in enumerate(outcomes) if isinstance(o, list) for r in o}
    state = holdings.state_for(VIEW)
    trace.append([[ids.get(o, o) for o in state.owners(device)] for device in MIG[:4]])
    return trace


@pytest.mark.parametrize("taken", [3, 1], ids=["all-granted", "one-conflict"])
def test_a_runs_unbounded_placements_are_held_and_written_as_bounded_ones(taken):
    """GrantRun.add's path for a one-device placement without a bound or quotas holds and
    writes what its general path (a bound that admits every placement) does."""
    assert _grant_run_trace(None, taken) == _grant_run_trace(100, taken)


class CountingGets:
    """A real store that counts `get` calls (the fetches of reservations made elsewhere)."""

    def __init__(self, store) -> None:
        self._store = store
        self.gets: list[str] = []

    def get(self, reservation_id):
        self.gets.append(reservation_id)
        return self._store.get(reservation_id)

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_own_reserves_are_not_fetched_back_but_other_replicas_are(store):
    counting = CountingGets(store)
    holdings = Holdings(counting, expire_interval=3600, refresh_interval=3600)
    holdings.start()
    try:
        request = _request(A100, MIG[0])
        token = holdings.hold_pending([A100], request.allocations)
        own = reserve_placement(store, [request])[
            0
        ]  # its event arrives while the placement is pending
        holdings.settle_pending(token, [own])
        other = reserve_placement(store, [_request(A100, MIG[1])])[
            0
        ]  # no placement pending: another replica
        _until(lambda: holdings.get(other.id) is not None)
        time.sleep(0.1)  # past the grace an unknown id on a pending node waits
        assert counting.gets == [other.id]
    finally:
        holdings.close()


def test_other_replicas_commits_arrive_as_events(store, holdings):
    holdings.start()
    reservation = reserve_placement(store, [_request(A100, MIG[0])])[0]
    _until(lambda: holdings.get(reservation.id) is not None)
    store.commit(reservation.id, "o")
    _until(lambda: holdings.get(reservation.id).state is ReservationState.COMMITTED)
    assert holdings.get(reservation.id).expires_at is None


def test_another_replicas_reserve_on_a_node_with_a_pending_placement_is_fetched_after_grace(
    store,
):
    counting = CountingGets(store)
    holdings = Holdings(counting, expire_interval=3600, refresh_interval=3600)
    holdings.start()
    try:
        token = holdings.hold_pending([A100], [_allocation(MIG[0])])
        other = reserve_placement(store, [_request(A100, MIG[1])])[
            0
        ]  # not this process's: never settled here
        _until(lambda: holdings.get(other.id) is not None)
        assert counting.gets == [other.id]
        assert holdings.state_for(VIEW).owners(MIG[1]) == (other.id,)
        holdings.drop_pending(token)
    finally:
        holdings.close()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "remove", "hold", "settle", "drop"]),
            st.integers(0, 5),
            st.lists(st.integers(0, len(MIG) - 1), min_size=1, max_size=3),
        ),
        max_size=60,
    )
)
def test_pending_placements_keep_the_incremental_state_exact(operations):
    holdings = Holdings(MemoryReservationStore())
    live: dict[str, Reservation] = {}
    pending: dict[int, tuple[str, AllocationResult]] = {}
    for index, (op, slot, picks) in enumerate(operations):
        devices = sorted({MIG[p] for p in picks})
        rid = f"res-{index}"
        if op == "add":
            live[rid] = _reservation(rid, *devices)
            holdings.added([live[rid]])
        elif op == "remove" and live:
            gone = sorted(live)[slot % len(live)]
            holdings.removed([gone])
            del live[gone]
        elif op == "hold" and slot not in pending:
            placement = _allocation(*devices)
            pending[slot] = (holdings.hold_pending([A100], [placement]), placement)
        elif op == "settle" and slot in pending:
            token, placement = pending.pop(slot)
            granted = dataclasses.replace(_reservation(rid, *devices), allocations=(placement,))
            live[rid] = granted
            holdings.settle_pending(token, [granted])
        elif op == "drop" and slot in pending:
            holdings.drop_pending(pending.pop(slot)[0])
        if index % 5 == 0:
            holdings.state_for(VIEW)  # cache now and then: later changes apply incrementally
    got = holdings.state_for(VIEW)
    held = [(r.id, a) for r in live.values() for a in r.allocations]
    held += [(token, placement) for token, placement in pending.values()]
    want = AllocatedState.build(SNAPSHOT, held)
    assert got.devices_in_use == want.devices_in_use
    counters = {c for e in SNAPSHOT.all_devices() for c, _ in e.counters}
    assert {c: got.counter_used(c) for c in counters} == {c: want.counter_used(c) for c in counters}
    assert {d: sorted(got.owners(d)) for d in want.devices_in_use} == {
        d: sorted(want.owners(d)) for d in want.devices_in_use
    }


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "remove", "hold", "settle-run", "read"]),
            st.integers(0, 7),
            st.lists(st.integers(0, len(MIG) - 1), min_size=1, max_size=3),
            st.sampled_from(["granted", "dropped", "partly", "more"]),
        ),
        max_size=60,
    )
)
def test_a_runs_placements_settled_together_keep_the_state_exact(operations):
    """A run's pending placements (one or more allocations each) settled in one step: granted
    as they were held, dropped, granted for part of their allocations, or granted with one
    more; states read at any point, between a run's holds and its settling too. The state
    always equals one built from scratch — devices, counters, owners and node groups."""
    holdings = Holdings(MemoryReservationStore())
    holdings.state_for(VIEW).node_groups(SNAPSHOT)  # kept up to date by the later states
    live: dict[str, Reservation] = {}
    run: list[tuple[str, tuple[AllocationResult, ...], str]] = []
    for index, (op, slot, picks, outcome) in enumerate(operations):
        devices = sorted({MIG[p] for p in picks})
        rid = f"res-{index}"
        if op == "add":
            live[rid] = _reservation(rid, *devices)
            holdings.added([live[rid]])
        elif op == "remove" and live:
            gone = sorted(live)[slot % len(live)]
            holdings.removed([gone])
            del live[gone]
        elif op == "hold":
            placed = tuple(_allocation(device) for device in devices)
            run.append((holdings.hold_pending([A100], placed), placed, outcome))
        elif op == "settle-run":
            settled: list[tuple[str, list[Reservation] | None]] = []
            for number, (token, placed, how) in enumerate(run):
                if how == "dropped":
                    settled.append((token, None))
                    continue
                kept = placed[:1] if how == "partly" else placed
                if how == "more":
                    kept = (*placed, _allocation(MIG[slot % len(MIG)]))
                made = dataclasses.replace(
                    _reservation(f"{rid}-{number}", MIG[0]), allocations=kept
                )
                live[made.id] = made
                settled.append((token, [made]))
            holdings.settle_all(settled)
            run = []
        elif op == "read":
            holdings.state_for(VIEW)  # a state that has the run's holds: settling renames
    got = holdings.state_for(VIEW)
    held = [(r.id, a) for r in live.values() for a in r.allocations]
    held += [(token, a) for token, placed, _ in run for a in placed]
    want = AllocatedState.build(SNAPSHOT, held)
    assert got.devices_in_use == want.devices_in_use
    counters = {c for e in SNAPSHOT.all_devices() for c, _ in e.counters}
    assert {c: got.counter_used(c) for c in counters} == {c: want.counter_used(c) for c in counters}
    assert {d: sorted(got.owners(d)) for d in want.devices_in_use} == {
        d: sorted(want.owners(d)) for d in want.devices_in_use
    }
    groups, fresh = got.node_groups(SNAPSHOT), want.node_groups(SNAPSHOT)
    assert groups.in_use == fresh.in_use
    assert groups.order == fresh.order


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "remove", "solve", "take", "settle-run", "read"]),
            st.integers(0, 7),
            st.lists(st.integers(0, len(MIG) - 1), min_size=1, max_size=3),
            st.sampled_from(["granted", "dropped", "more"]),
        ),
        max_size=60,
    )
)
def test_the_next_state_from_a_runs_solve_state_equals_a_state_built_from_scratch(operations):
    """A run's solve holds its placements in a state of its own (owner "", as core
    solve_many) and offers it (`Holdings.offer`); the run then holds some of them pending (in
    order, maybe not all), settles them (granted, dropped, granted with one more) while other
    reservations come and go, and states are read at any point. The next state, started from
    the offered one where it still can be, always equals one built from scratch."""
    holdings = Holdings(MemoryReservationStore())
    holdings.state_for(VIEW).node_groups(SNAPSHOT)
    live: dict[str, Reservation] = {}
    solved: list[AllocationResult] = []  # the last solve's placements not taken yet
    run: list[tuple[str, AllocationResult, str]] = []
    for index, (op, slot, picks, outcome) in enumerate(operations):
        devices = sorted({MIG[p] for p in picks})
        rid = f"res-{index}"
        if op == "add":
            live[rid] = _reservation(rid, *devices)
            holdings.added([live[rid]])
        elif op == "remove" and live:
            gone = sorted(live)[slot % len(live)]
            holdings.removed([gone])
            del live[gone]
        elif op == "solve":
            base = holdings.state_for(VIEW)
            held = base.detached(groups=True)
            solved = [_allocation(MIG[(slot + n) % len(MIG)]) for n in range(len(picks))]
            for allocation in solved:
                held.hold_in_place(allocation)
            holdings.offer(base, held, solved)
        elif op == "take" and solved:
            allocation = solved.pop(0)
            run.append((holdings.hold_pending([A100], [allocation]), allocation, outcome))
        elif op == "settle-run":
            settled: list[tuple[str, list[Reservation] | None]] = []
            for number, (token, allocation, how) in enumerate(run):
                if how == "dropped":
                    settled.append((token, None))
                    continue
                kept: tuple[AllocationResult, ...] = (allocation,)
                if how == "more":
                    kept = (allocation, _allocation(MIG[slot % len(MIG)]))
                made = dataclasses.replace(
                    _reservation(f"{rid}-{number}", MIG[0]), allocations=kept
                )
                live[made.id] = made
                settled.append((token, [made]))
            holdings.settle_all(settled)
            run = []
        elif op == "read":
            holdings.state_for(VIEW)
    got = holdings.state_for(VIEW)
    held_now = [(r.id, a) for r in live.values() for a in r.allocations]
    held_now += [(token, allocation) for token, allocation, _ in run]
    want = AllocatedState.build(SNAPSHOT, held_now)
    assert got.devices_in_use == want.devices_in_use
    counters = {c for e in SNAPSHOT.all_devices() for c, _ in e.counters}
    assert {c: got.counter_used(c) for c in counters} == {c: want.counter_used(c) for c in counters}
    assert {d: sorted(got.owners(d)) for d in want.devices_in_use} == {
        d: sorted(want.owners(d)) for d in want.devices_in_use
    }
    groups, fresh = got.node_groups(SNAPSHOT), want.node_groups(SNAPSHOT)
    assert groups.in_use == fresh.in_use
    assert groups.order == fresh.order


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "remove", "solve", "take", "settle-run", "read", "rebuild"]),
            st.integers(0, 7),
            st.lists(st.integers(0, len(MIG) - 1), min_size=1, max_size=3),
            st.sampled_from(["granted", "dropped", "more", "known"]),
        ),
        max_size=60,
    )
)
def test_a_run_held_under_one_token_equals_a_state_built_from_scratch(operations):
    """The same runs as above, their placements held as one PendingRun's items
    (`pending_run`, `hold_in_run`, `settle_run`) while states are read, rebuilt (the journal
    dropped) and offered: granted, dropped, granted with one more allocation, or answered with
    a reservation already known (freed). The next state always equals one built from scratch,
    a run's unsettled items held by its token."""
    holdings = Holdings(MemoryReservationStore())
    holdings.state_for(VIEW).node_groups(SNAPSHOT)
    live: dict[str, Reservation] = {}
    solved: list[AllocationResult] = []
    run = holdings.pending_run()
    taken: list[tuple[AllocationResult, str]] = []
    for index, (op, slot, picks, outcome) in enumerate(operations):
        devices = sorted({MIG[p] for p in picks})
        rid = f"res-{index}"
        if op == "add":
            live[rid] = _reservation(rid, *devices)
            holdings.added([live[rid]])
        elif op == "remove" and live:
            gone = sorted(live)[slot % len(live)]
            holdings.removed([gone])
            del live[gone]
        elif op == "solve":
            base = holdings.state_for(VIEW)
            held = base.detached(groups=True)
            solved = [_allocation(MIG[(slot + n) % len(MIG)]) for n in range(len(picks))]
            for allocation in solved:
                held.hold_in_place(allocation)
            holdings.offer(base, held, solved)
        elif op == "take":  # the solve's next placement, or one of its own
            allocation = solved.pop(0) if solved else _allocation(MIG[slot % len(MIG)])
            assert holdings.hold_in_run(run, A100, allocation) == len(taken)
            taken.append((allocation, outcome))
        elif op == "settle-run":
            settled: list[list[Reservation] | None] = []
            for number, (allocation, how) in enumerate(taken):
                if how == "dropped":
                    settled.append(None)
                    continue
                if how == "known" and live:
                    settled.append([live[sorted(live)[slot % len(live)]]])
                    continue
                kept: tuple[AllocationResult, ...] = (allocation,)
                if how == "more":
                    kept = (allocation, _allocation(MIG[slot % len(MIG)]))
                made = dataclasses.replace(
                    _reservation(f"{rid}-{number}", MIG[0]), allocations=kept
                )
                live[made.id] = made
                settled.append([made])
            holdings.settle_run(run, settled)
            run, taken = holdings.pending_run(), []
        elif op == "read":
            holdings.state_for(VIEW)
        elif op == "rebuild":
            holdings.rebuild()
    got = holdings.state_for(VIEW)
    held_now = [(r.id, a) for r in live.values() for a in r.allocations]
    held_now += [(run.token, allocation) for allocation, _ in taken]
    want = AllocatedState.build(SNAPSHOT, held_now)
    assert got.devices_in_use == want.devices_in_use
    counters = {c for e in SNAPSHOT.all_devices() for c, _ in e.counters}
    assert {c: got.counter_used(c) for c in counters} == {c: want.counter_used(c) for c in counters}
    assert {d: sorted(got.owners(d)) for d in want.devices_in_use} == {
        d: sorted(want.owners(d)) for d in want.devices_in_use
    }
    groups, fresh = got.node_groups(SNAPSHOT), want.node_groups(SNAPSHOT)
    assert groups.in_use == fresh.in_use
    assert groups.order == fresh.order


def test_the_next_state_starts_from_the_offered_solve_state():
    """While the offered state's base is the cached state, the next state is derived from the
    offered one (its "" holds renamed), not from the base again; once only."""
    holdings = Holdings(MemoryReservationStore())
    base = holdings.state_for(VIEW)
    held = base.detached(groups=True)
    placed = [_allocation(MIG[0]), _allocation(MIG[1])]
    for allocation in placed:
        held.hold_in_place(allocation)
    held.hold_in_place(_allocation(MIG[2]), "marker")  # only a state derived from `held` has it
    holdings.offer(base, held, placed)
    token = holdings.hold_pending([A100], [placed[0]])
    state = holdings.state_for(VIEW)
    assert state.owners(MIG[0]) == (token,)
    assert not state.in_use(MIG[1])  # placed by the solve, never held: freed
    assert state.owners(MIG[2]) == ("marker",)

    stale = holdings.state_for(VIEW).detached(groups=True)
    stale.hold_in_place(_allocation(MIG[3]), "marker")
    holdings.offer(base, stale, [_allocation(MIG[4])])  # `base` is not the cached state now
    holdings.hold_pending([A100], [_allocation(MIG[4])])
    assert not holdings.state_for(VIEW).in_use(MIG[3])
