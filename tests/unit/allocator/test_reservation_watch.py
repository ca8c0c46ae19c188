"""The WatchReservations fan-out: store events become changes (a revocation is PREEMPTED), each
stream gets those its filter accepts, a slow stream gets RESYNC in place of what it lost, a
quiet one a HEARTBEAT, and close() ends them all."""

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
    ],
)  # fmt: skip
def test_a_store_event_is_a_change(event: ReservationEvent, kind: ChangeKind) -> None:
    change = ReservationChange.of(event)
    assert change == ReservationChange(kind, "r", "n", "a/x", 1, event.preempted_by)


class Stream:
    """One watch() read on a thread, into `got`."""

    def __init__(self, changes: Iterator[ReservationChange]) -> None:
        self.got: list[ReservationChange] = []
        self._changes = changes
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
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


def test_each_stream_gets_what_its_filter_accepts() -> None:
    watch = ReservationWatch()
    mine = Stream(watch.watch(lambda c: c.owner.startswith("a/"), wait_seconds=0.05))
    everything = Stream(watch.watch(lambda c: True, wait_seconds=0.05))
    wait_until(lambda: watch.watchers == 2)
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
    changes = watch.watch(lambda c: True, wait_seconds=0.05)
    first = threading.Thread(target=lambda: got.append(next(changes)))
    got: list[ReservationChange] = []
    first.start()
    wait_until(lambda: watch.watchers == 1)
    watch.publish(event(Op.RESERVE, "r0"))
    first.join(timeout=2)
    for index in range(1, 6):  # nobody reads: r1 and r2 are dropped, r3-r5 kept
        watch.publish(event(Op.RESERVE, f"r{index}"))
    got.extend(next(changes) for _ in range(4))
    watch.close()
    assert [(c.kind.value, c.reservation_id) for c in got] == [
        ("reserved", "r0"),
        ("resync", ""),
        ("reserved", "r3"),
        ("reserved", "r4"),
        ("reserved", "r5"),
    ]


def test_a_quiet_stream_gets_heartbeats_and_a_busy_one_does_not() -> None:
    watch = ReservationWatch()
    quiet = Stream(watch.watch(lambda c: False, heartbeat_seconds=0.1, wait_seconds=0.02))
    wait_until(lambda: len(quiet.got) >= 2)
    watch.close()
    quiet.thread.join(timeout=2)
    assert set(quiet.kinds()) == {"heartbeat"}

    watch = ReservationWatch()
    busy = Stream(watch.watch(lambda c: True, heartbeat_seconds=0.5, wait_seconds=0.02))
    wait_until(lambda: watch.watchers == 1)
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
    stream = Stream(watch.watch(lambda c: True, wait_seconds=0.02, is_active=active.is_set))
    wait_until(lambda: watch.watchers == 1)
    active.clear()
    stream.thread.join(timeout=2)
    assert not stream.thread.is_alive() and watch.watchers == 0


def test_watch_after_close_ends_at_once() -> None:
    watch = ReservationWatch()
    watch.close()
    assert list(watch.watch(lambda c: True)) == []
    with pytest.raises(ValueError, match="queue_size"):
        ReservationWatch(queue_size=0)
