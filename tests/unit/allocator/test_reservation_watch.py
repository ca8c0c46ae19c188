"""The WatchReservations fan-out: store events become changes (a revocation is PREEMPTED), a
stream starts with a HEARTBEAT once registered, then gets what its view shows, a slow stream
gets RESYNC in place of what it lost (and a stream that cannot tell an owner-less change was
its own), a quiet one a HEARTBEAT, and close() ends them all."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from services.allocator.app.reservation_watch import (
    ChangeKind,
    ReservationChange,
    ReservationWatch,
)
from services.allocator.reservations.model import ReservationEvent
from services.allocator.reservations.model import ReservationEventOp as Op


@pytest.mark.parametrize(
    ("event", "kind"),
    [
        pytest.param(ReservationEvent(Op.RESERVE, "r", "n", 1, "a/x"), ChangeKind.RESERVED,
                     id="reserve-is-reserved"),
        pytest.param(ReservationEvent(Op.COMMIT, "r", "n", 1, "a/x"), ChangeKind.COMMITTED,
                     id="commit-is-committed"),
        pytest.param(ReservationEvent(Op.RENEW, "r", "n", 1, "a/x"), ChangeKind.RENEWED,
                     id="renew-is-renewed"),
        pytest.param(ReservationEvent(Op.RELEASE, "r", "n", 1, "a/x"), ChangeKind.RELEASED,
                     id="release-is-released"),
        pytest.param(ReservationEvent(Op.EXPIRE, "r", "n", 1, "a/x"), ChangeKind.EXPIRED,
                     id="expire-is-expired"),
        pytest.param(ReservationEvent(Op.RELEASE, "r", "n", 1, "a/x", "b/y"),
                     ChangeKind.PREEMPTED, id="a-release-that-names-a-preemptor-is-preempted"),
        pytest.param(ReservationEvent(Op.CONDITIONS, "r", "n", 1, "a/x"), ChangeKind.CONDITIONS,
                     id="a-condition-report-is-conditions"),
        pytest.param(ReservationEvent(Op.RELEASE, "r", "n", 1, "a/x", "binding: binding failed"),
                     ChangeKind.BINDING_FAILED, id="a-release-by-its-binding-is-binding-failed"),
    ],
)  # fmt: skip
def test_a_store_event_is_a_change(event: ReservationEvent, kind: ChangeKind) -> None:
    change = ReservationChange.of(event)
    assert change == ReservationChange(kind, "r", "n", "a/x", 1, event.preempted_by)


class Stream:
    """One watch() read on a thread, into `got` (after the first HEARTBEAT, which says the
    stream is registered: the constructor returns once it came)."""

    def __init__(self, changes: Iterator[ReservationChange]) -> None:
        self.got: list[ReservationChange] = []
        self._changes = changes
        self._registered = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        assert self._registered.wait(3)

    def _read(self) -> None:
        first = next(self._changes, None)
        assert first is not None and first.kind is ChangeKind.HEARTBEAT
        self._registered.set()
        for change in self._changes:
            self.got.append(change)

    def kinds(self) -> list[str]:
        return [c.kind.value for c in self.got]


def wait_until(condition: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.005)
    raise AssertionError("condition not met in time")


def event(op: Op, reservation_id: str, owner: str = "a/x", node: str = "n") -> ReservationEvent:
    return ReservationEvent(op, reservation_id, node, 1, owner)


def test_each_stream_gets_what_its_view_shows() -> None:
    watch = ReservationWatch()
    mine = Stream(watch.watch(lambda c: c if c.owner.startswith("a/") else None, wait_seconds=0.05))
    everything = Stream(watch.watch(lambda c: c, wait_seconds=0.05))
    watch.publish(event(Op.RESERVE, "r1", owner="a/x"))
    watch.publish(event(Op.RESERVE, "r2", owner="b/y"))
    watch.publish(ReservationEvent(Op.RELEASE, "r1", "n", 1, "a/x", preempted_by="b/y"))
    wait_until(lambda: len(everything.got) == 3 and len(mine.got) == 2)
    watch.close()
    mine.thread.join(timeout=2)
    everything.thread.join(timeout=2)
    assert [(c.kind.value, c.reservation_id) for c in mine.got] == [
        ("reserved", "r1"),
        ("preempted", "r1"),
    ]
    assert [c.reservation_id for c in everything.got] == ["r1", "r2", "r1"]
    assert not mine.thread.is_alive() and not everything.thread.is_alive()  # close() ended them
    assert watch.watchers == 0


def test_a_stream_that_falls_behind_gets_resync_for_what_it_lost() -> None:
    watch = ReservationWatch(queue_size=3)
    changes = watch.watch(lambda c: c, wait_seconds=0.05)
    got = [next(changes)]  # registered
    watch.publish(event(Op.RESERVE, "r0"))
    got.append(next(changes))
    for index in range(1, 6):  # nobody reads: r1 and r2 are dropped, r3-r5 kept
        watch.publish(event(Op.RESERVE, f"r{index}"))
    got.extend(next(changes) for _ in range(4))
    watch.close()
    assert [(c.kind.value, c.reservation_id) for c in got] == [
        ("heartbeat", ""),
        ("reserved", "r0"),
        ("resync", ""),
        ("reserved", "r3"),
        ("reserved", "r4"),
        ("reserved", "r5"),
    ]


def test_a_quiet_stream_gets_heartbeats_and_a_busy_one_does_not() -> None:
    watch = ReservationWatch()
    quiet = Stream(watch.watch(lambda c: None, heartbeat_seconds=0.1, wait_seconds=0.02))
    wait_until(lambda: len(quiet.got) >= 2)
    watch.close()
    quiet.thread.join(timeout=2)
    assert set(quiet.kinds()) == {"heartbeat"}

    watch = ReservationWatch()
    busy = Stream(watch.watch(lambda c: c, heartbeat_seconds=0.5, wait_seconds=0.02))
    for index in range(20):  # one change every 50 ms for a second: never 0.5 s quiet
        watch.publish(event(Op.RENEW, f"r{index}"))
        time.sleep(0.05)
    watch.close()
    busy.thread.join(timeout=2)
    assert busy.kinds() == ["renewed"] * 20


def test_a_stream_ends_when_its_client_goes() -> None:
    watch = ReservationWatch()
    active = threading.Event()
    active.set()
    stream = Stream(watch.watch(lambda c: c, wait_seconds=0.02, is_active=active.is_set))
    active.clear()
    stream.thread.join(timeout=2)
    assert not stream.thread.is_alive() and watch.watchers == 0


def test_watch_after_close_ends_at_once() -> None:
    watch = ReservationWatch()
    watch.close()
    assert list(watch.watch(lambda c: c)) == []
    with pytest.raises(ValueError, match="queue_size"):
        ReservationWatch(queue_size=0)


def test_a_change_without_an_owner_is_a_resync_for_a_stream_that_cannot_tell() -> None:
    """During a rolling upgrade a replica from before owners were published sends owner-less
    events: a stream that sees every tenant gets them, a tenant's gets RESYNC (list again);
    a change with an owner that is not the tenant's stays unseen."""
    watch = ReservationWatch()
    tenant = Stream(watch.watch(lambda c: c if c.owner.startswith("a/") else None))
    admin = Stream(watch.watch(lambda c: c))
    watch.publish(event(Op.RESERVE, "r1", owner="b/y"))  # another tenant's: not a/'s business
    watch.publish(event(Op.RESERVE, "r2", owner=""))  # whose? a/ cannot tell
    wait_until(lambda: len(admin.got) == 2 and len(tenant.got) == 1)
    watch.close()
    assert [(c.kind.value, c.reservation_id) for c in tenant.got] == [("resync", "")]
    assert [c.reservation_id for c in admin.got] == ["r1", "r2"]


def test_a_view_that_fails_costs_its_stream_a_resync_and_no_one_else_anything() -> None:
    def broken(change: ReservationChange) -> ReservationChange | None:
        raise RuntimeError("a bug in a filter")

    watch = ReservationWatch()
    failing = Stream(watch.watch(broken))
    fine = Stream(watch.watch(lambda c: c))
    watch.publish(event(Op.RESERVE, "r1"))
    wait_until(lambda: len(fine.got) == 1 and len(failing.got) == 1)
    watch.close()
    assert failing.kinds() == ["resync"] and fine.kinds() == ["reserved"]
