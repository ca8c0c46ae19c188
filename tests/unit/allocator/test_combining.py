"""The combiner's leadership and passes (services/allocator/app/combining.py), on a service whose
every pass waits until the test lets it go: who runs each pass, what it places, in which order.
No timing: each step waits for an event that always comes (bounded by WAIT)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from services.allocator.app.combining import Combiner
from services.allocator.app.messages import Answer, LeaseOptions, Outcome
from services.common.deadline import UNBOUNDED, Deadline
from services.common.errors import DeadlineExceeded, GpuallocError, InvalidArgument

WAIT = 20.0


def _until(condition: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.002)


def _answer(label: Any) -> Answer:
    return Answer(Outcome.ALLOCATED, label, ())  # the generation carries the item's label


class HeldPasses:
    """A service whose passes (a unary allocate: a pass of one; allocate_run) each wait for
    `let_go`, recording the thread that ran each and the items it placed."""

    def __init__(self) -> None:
        self.passes: list[tuple[str, list[Any]]] = []
        self._let_go = threading.Semaphore(0)
        self.fail: BaseException | None = None

    def let_go(self) -> None:
        self._let_go.release()

    def _pass(self, labels: list[Any]) -> None:
        self.passes.append((threading.current_thread().name, labels))
        assert self._let_go.acquire(timeout=WAIT)
        if self.fail is not None:
            raise self.fail

    def allocate(
        self, query: Any, lease: LeaseOptions | None = None, *, deadline: Deadline = UNBOUNDED
    ) -> Answer:
        if query == "bad":
            raise InvalidArgument("bad item")
        self._pass([query])
        return _answer(query)

    def allocate_run(
        self,
        items: Sequence[tuple[Any, LeaseOptions]],
        *,
        deadline: Deadline = UNBOUNDED,
        deadlines: Sequence[Deadline] | None = None,
    ) -> list[Answer | GpuallocError]:
        assert deadlines is not None and len(deadlines) == len(items)
        labels = [query for (query, _), mine in zip(items, deadlines, strict=True)]
        self._pass(labels)
        return [_answer(query) for query in labels]


LEASE = LeaseOptions(owner="team/a")


class Calls:
    """Calls made on their own threads (named after their labels), in a fixed arrival order."""

    def __init__(self, combiner: Combiner) -> None:
        self.combiner = combiner
        self.results: dict[Any, Answer | BaseException] = {}
        self.threads: dict[Any, threading.Thread] = {}

    def send(
        self,
        label: Any,
        deadline: Deadline = UNBOUNDED,
        *,
        waits: bool = True,
        lease: LeaseOptions | None = LEASE,
        key: Any = None,
    ) -> None:
        """Call with `label` as the query; its result under `key` (default: the label)."""
        key = label if key is None else key
        waiting = self.combiner.waiting

        def call() -> None:
            try:  # a label for the query
                self.results[key] = self.combiner.allocate(label, lease, deadline=deadline)
            except BaseException as error:
                self.results[key] = error

        thread = threading.Thread(target=call, name=str(key))
        self.threads[key] = thread
        thread.start()
        if waits:
            _until(lambda: self.combiner.waiting == waiting + 1, f"{key} waits")

    def done(self, key: Any) -> Answer | BaseException:
        self.threads[key].join(WAIT)
        assert not self.threads[key].is_alive()
        return self.results[key]


def test_a_call_alone_is_the_unary_allocate() -> None:
    service = HeldPasses()
    service.let_go()
    combiner = Combiner(service)
    answer = combiner.allocate("a", LEASE)  # type: ignore[arg-type]
    assert answer == _answer("a")
    assert service.passes == [(threading.current_thread().name, ["a"])]
    assert combiner.passes == 1 and combiner.waiting == 0


@pytest.mark.parametrize(
    ("max_items", "followers", "passes"),
    [
        pytest.param(64, 5, [[0], [1, 2, 3, 4, 5]], id="every-waiting-call-in-the-next-pass"),
        pytest.param(2, 5, [[0], [1, 2], [3, 4], [5]], id="at-most-max-items-a-pass"),
        pytest.param(64, 0, [[0]], id="no-company-no-wait"),
    ],
)
def test_calls_waiting_during_a_pass_are_the_next_pass_in_arrival_order(
    max_items: int, followers: int, passes: list[list[int]]
) -> None:
    service = HeldPasses()
    combiner = Combiner(service, max_items=max_items)
    calls = Calls(combiner)
    calls.send(0, waits=False)
    _until(lambda: len(service.passes) == 1, "the first pass runs")
    for label in range(1, followers + 1):
        calls.send(label)
    for _ in passes:
        service.let_go()
    for label in range(followers + 1):
        assert calls.done(label) == _answer(label)
    assert [labels for _, labels in service.passes] == passes
    # each pass is run by the thread of its first call: its leader
    assert [thread for thread, _ in service.passes] == [str(p[0]) for p in passes]
    assert combiner.passes == len(passes) and combiner.waiting == 0


def test_a_leader_answers_its_own_call_once_its_pass_ends() -> None:
    """The lead goes on to the oldest waiting call: the first leader returns while the pass
    after it still runs (a leader never serves the passes of others), and a call arriving
    during the second pass is in the third."""
    service = HeldPasses()
    combiner = Combiner(service)
    calls = Calls(combiner)
    calls.send("first", waits=False)
    _until(lambda: len(service.passes) == 1, "the first pass runs")
    calls.send("second")
    calls.send("third")
    service.let_go()  # the first pass ends; the second (second, third) starts
    assert calls.done("first") == _answer("first")
    _until(lambda: len(service.passes) == 2, "the second pass runs")
    calls.send("fourth")
    assert "second" not in calls.results  # its pass is held
    service.let_go()
    service.let_go()
    assert [calls.done(label) for label in ("second", "third", "fourth")] == [
        _answer("second"),
        _answer("third"),
        _answer("fourth"),
    ]
    assert service.passes == [
        ("first", ["first"]),
        ("second", ["second", "third"]),
        ("fourth", ["fourth"]),
    ]


def test_a_waiting_call_whose_deadline_passes_leaves_unsolved() -> None:
    service = HeldPasses()
    combiner = Combiner(service)
    calls = Calls(combiner)
    calls.send("first", waits=False)
    _until(lambda: len(service.passes) == 1, "the first pass runs")
    calls.send("short", Deadline.after(0.2))
    calls.send("long", Deadline.after(WAIT * 10))
    ended = calls.done("short")  # its deadline passed while the first pass ran
    assert isinstance(ended, DeadlineExceeded) and "deadline passed" in ended.message
    service.let_go()
    service.let_go()
    assert calls.done("long") == _answer("long")
    assert [labels for _, labels in service.passes] == [["first"], ["long"]]


def test_a_cancelled_waiting_call_leaves_unsolved() -> None:
    service = HeldPasses()
    combiner = Combiner(service)
    calls = Calls(combiner)
    calls.send("first", waits=False)
    _until(lambda: len(service.passes) == 1, "the first pass runs")
    gone = threading.Event()
    calls.send("cancelled", Deadline(None, gone))
    calls.send("kept")
    gone.set()  # its client went away
    ended = calls.done("cancelled")
    assert isinstance(ended, DeadlineExceeded) and ended.message.startswith("cancelled")
    service.let_go()
    service.let_go()
    assert calls.done("kept") == _answer("kept")
    assert [labels for _, labels in service.passes] == [["first"], ["kept"]]


def test_a_call_whose_time_is_up_at_its_turn_is_answered_unsolved() -> None:
    """Taken into a pass, a call whose client went away meanwhile is not placed there (here
    one without `reserve` between two runs; allocate_run does the same for each reserving
    item: tests/integration/test_allocate_combining.py)."""
    service = HeldPasses()
    combiner = Combiner(service)
    calls = Calls(combiner)
    calls.send("first", waits=False)
    _until(lambda: len(service.passes) == 1, "the first pass runs")
    calls.send("a")
    calls.send("b")
    gone = threading.Event()
    calls.send("gone", Deadline(None, gone), lease=None)
    calls.send("c")
    service.let_go()  # the second pass (a, b, gone, c) starts and is held in a's run
    _until(lambda: len(service.passes) == 2, "the second pass runs")
    gone.set()
    service.let_go()
    service.let_go()
    ended = calls.done("gone")
    assert isinstance(ended, DeadlineExceeded) and ended.message.startswith("cancelled")
    assert [labels for _, labels in service.passes] == [["first"], ["a", "b"], ["c"]]
    assert [calls.done(label) for label in "abc"] == [_answer(label) for label in "abc"]


def test_a_bad_item_fails_its_own_call_only() -> None:
    service = HeldPasses()
    combiner = Combiner(service)
    calls = Calls(combiner)
    calls.send("first", waits=False)
    _until(lambda: len(service.passes) == 1, "the first pass runs")
    calls.send("a")
    calls.send("bad", lease=None)  # its (fake) unary path raises for it
    calls.send("b")
    for _ in range(3):
        service.let_go()
    assert isinstance(calls.done("bad"), InvalidArgument)
    assert calls.done("a") == _answer("a") and calls.done("b") == _answer("b")


def test_a_bug_in_a_pass_reaches_every_caller_of_the_pass_and_the_lead_goes_on() -> None:
    service = HeldPasses()
    combiner = Combiner(service)
    calls = Calls(combiner)
    calls.send("first", waits=False)
    _until(lambda: len(service.passes) == 1, "the first pass runs")
    calls.send("a")
    calls.send("b")
    service.let_go()
    _until(lambda: len(service.passes) == 2, "the second pass runs")
    calls.send("after")
    service.fail = RuntimeError("a bug")
    service.let_go()
    assert all(isinstance(calls.done(label), RuntimeError) for label in "ab")
    service.fail = None
    service.let_go()
    assert calls.done("after") == _answer("after")


def test_max_items_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Combiner(HeldPasses(), max_items=0)


@pytest.mark.parametrize(
    ("queries", "solved"),
    [
        pytest.param(["q", "q", "q"], [["q"]], id="identical-calls-one-solve"),
        pytest.param(["q", "r", "q"], [["q"], ["r"]], id="by-query-not-by-position"),
        pytest.param(["q", "r"], [["q"], ["r"]], id="different-calls-each-solved"),
    ],
)
def test_calls_without_reserve_share_a_solve_by_query(
    queries: list[str], solved: list[list[str]]
) -> None:
    service = HeldPasses()
    combiner = Combiner(service)
    calls = Calls(combiner)
    calls.send("first", waits=False)
    _until(lambda: len(service.passes) == 1, "the first pass runs")
    for index, query in enumerate(queries):
        calls.send(query, lease=None, key=f"call-{index}")
    for _ in range(1 + len(solved)):
        service.let_go()
    for index, query in enumerate(queries):
        assert calls.done(f"call-{index}") == _answer(query)
    assert [labels for _, labels in service.passes][1:] == solved
