"""Concurrent unary Allocates placed together over real gRPC (services/allocator/app/combining.py).

On the embedded store and on real Redis. A test makes calls wait for a pass deterministically,
not by timing: the first call's pass (a call placed alone is the service's unary `allocate`) is
held at a gate until the calls sent meanwhile are waiting in the combiner, in the order sent;
then they are placed together in the next pass. The GPU view is examples/cluster (two 8-H100
nodes, an A100 node of MIG partitions, a 4-L40S node).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from services.allocator.adapters.grpc.mapping import ClaimReader, query_from_pb
from services.allocator.app.messages import Answer, LeaseOptions, Outcome
from services.allocator.config import AllocatorSettings
from services.common.deadline import Deadline
from services.common.errors import DeadlineExceeded
from tests.e2e.allocator_harness import (
    ServedAllocator,
    allocate_request,
    pb_claims,
    serve_allocator,
)
from tests.integration.test_allocator_batch import _made_afresh_cleared
from tests.unit.bridges.support import release_everything

WAIT = 20.0  # seconds a synchronisation step may take at most on a loaded machine


def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait (not a timed assertion: a bound for a step that always happens) for `condition`."""
    end = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.005)


class Gate:
    """Holds the first pass (the first call, placed alone) until `open`, so that the calls sent
    meanwhile wait for the next pass, in the order sent (`send`)."""

    def __init__(self, served: ServedAllocator, monkeypatch: pytest.MonkeyPatch) -> None:
        self.served = served
        combiner = served.app.combiner
        assert combiner is not None
        self.combiner = combiner
        self._passes_before = combiner.passes
        service = served.app.service
        unary = service.allocate
        self.entered = threading.Event()
        self._opened = threading.Event()
        first = [True]

        def allocate(*args: Any, **kwargs: Any) -> Answer:
            if first[0]:
                first[0] = False
                self.entered.set()
                assert self._opened.wait(WAIT)
            return unary(*args, **kwargs)

        monkeypatch.setattr(service, "allocate", allocate)

    def lead(self, request: pb.AllocateRequest) -> grpc.Future[pb.AllocateResponse]:
        """The first call: it runs its pass at once and stops at the gate."""
        future = self.served.stub.Allocate.future(request, timeout=WAIT * 2)
        assert self.entered.wait(WAIT)
        return future

    def send(
        self, request: pb.AllocateRequest, timeout: float = WAIT * 2
    ) -> grpc.Future[pb.AllocateResponse]:
        """A call that waits for the next pass (after the ones sent before it)."""
        waiting = self.combiner.waiting
        future = self.served.stub.Allocate.future(request, timeout=timeout)
        _until(lambda: self.combiner.waiting == waiting + 1, "the call waits for a pass")
        return future

    def open(self) -> None:
        self._opened.set()

    @property
    def passes(self) -> int:
        """Passes run since the gate was made."""
        return self.combiner.passes - self._passes_before


def _one_h100(owner: str, **fields: Any) -> pb.AllocateRequest:
    return allocate_request("one-h100", reserve=True, owner=owner, **fields)


def _devices(response: pb.AllocateResponse) -> list[str]:
    return [f"{r.pool}/{r.device}" for a in response.allocations for r in a.allocation.results]


def _held(served: ServedAllocator) -> list[str]:
    """Every device the store holds, once per reservation holding it."""
    return [f"{r.node}/{device}" for r in served.app.store.live() for device in r.hold.devices]


def test_concurrent_reserving_calls_are_placed_together_on_distinct_devices(
    allocator: ServedAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 one-H100 reservations, 15 sent while the first's pass runs: two passes, 16
    distinct H100s, each held by one reservation."""
    gate = Gate(allocator, monkeypatch)
    first = gate.lead(_one_h100("team/0"))
    rest = [gate.send(_one_h100(f"team/{i}")) for i in range(1, 16)]
    gate.open()
    answers = [future.result() for future in (first, *rest)]
    assert all(a.outcome == pb.OUTCOME_ALLOCATED for a in answers)
    devices = [d for a in answers for d in _devices(a)]
    assert len(devices) == len(set(devices)) == 16
    held = _held(allocator)
    assert len(held) == len(set(held)) == 16
    assert gate.passes == 2  # the first alone, the 15 others together


def test_many_threads_racing_hold_every_device_once(allocator: ServedAllocator) -> None:
    """16 threads x 3 one-H100 reservations at once on 16 H100s: each call is ALLOCATED or
    UNSATISFIABLE, every H100 is held exactly once, and no more passes than calls ran."""
    combiner = allocator.app.combiner
    assert combiner is not None
    outcomes: list[int] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        for call in range(3):
            answer = allocator.stub.Allocate(_one_h100(f"team/{index}-{call}"), timeout=WAIT * 2)
            with lock:
                outcomes.append(answer.outcome)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(set(outcomes)) <= [pb.OUTCOME_ALLOCATED, pb.OUTCOME_UNSATISFIABLE]
    assert outcomes.count(pb.OUTCOME_ALLOCATED) == 16
    held = _held(allocator)
    assert len(held) == len(set(held)) == 16
    assert combiner.passes <= 48


def test_a_combined_call_s_answer_is_the_unary_answer_field_for_field(
    allocator: ServedAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls placed together answer every field as the same calls sent one by one in their
    arrival order (but what a new reservation makes afresh)."""
    pair = pb.Gang(node_count=2, claims_per_node=pb_claims("one-h100"))
    requests = [
        allocate_request("one-h100", reserve=True, owner="team/a"),
        allocate_request("one-h100", reserve=True, owner="team/a"),
        allocate_request("one-h100", "mig-small-else-medium", reserve=True, owner="team/b"),
        allocate_request("two-gpus-same-pcie-root", owner="team/a"),
        allocate_request("two-gpus-same-pcie-root", owner="team/a"),
        pb.AllocateRequest(gang=pair, reserve=True, owner="team/b"),
        allocate_request("four-nvlink-gpus", reserve=True, owner="team/a", idempotency_key="k"),
        allocate_request("four-nvlink-gpus", reserve=True, owner="team/a", idempotency_key="k"),
        allocate_request("sixteen-h100-one-node", reserve=True, owner="team/a"),
        allocate_request("all-l40s", owner="team/b"),
    ]
    unary = [allocator.stub.Allocate(request, timeout=WAIT) for request in requests]
    release_everything(allocator.target)
    gate = Gate(allocator, monkeypatch)
    first = gate.lead(requests[0])
    rest = [gate.send(request) for request in requests[1:]]
    gate.open()
    combined = [future.result() for future in (first, *rest)]
    assert gate.passes == 2
    assert unary[0].reservations and unary[5].gang_placements  # reserving, a gang among them
    assert [_made_afresh_cleared(a) for a in combined] == [_made_afresh_cleared(a) for a in unary]


def test_a_short_deadline_ends_its_own_call_only(
    allocator: ServedAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call whose deadline passes while it waits leaves unsolved (DEADLINE_EXCEEDED, nothing
    held); the calls around it, with long deadlines, are placed in the next pass."""
    gate = Gate(allocator, monkeypatch)
    first = gate.lead(_one_h100("team/0"))
    long_before = gate.send(_one_h100("team/1"))
    short = gate.send(_one_h100("team/2"), timeout=0.5)
    long_after = gate.send(_one_h100("team/3"))
    with pytest.raises(grpc.RpcError) as ended:
        short.result()
    assert ended.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    _until(lambda: gate.combiner.waiting == 2, "the short call left the queue")
    gate.open()
    answers = [f.result() for f in (first, long_before, long_after)]
    assert [a.outcome for a in answers] == [pb.OUTCOME_ALLOCATED] * 3
    assert len(_held(allocator)) == 3
    assert {r.owner for r in allocator.app.store.live()} == {"team/0", "team/1", "team/3"}


def test_a_cancelled_waiting_call_leaves_unsolved(
    allocator: ServedAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(allocator, monkeypatch)
    first = gate.lead(_one_h100("team/0"))
    cancelled = gate.send(_one_h100("team/1"))
    assert cancelled.cancel()
    _until(lambda: gate.combiner.waiting == 0, "the cancelled call left the queue")
    gate.open()
    assert first.result().outcome == pb.OUTCOME_ALLOCATED
    assert [r.owner for r in allocator.app.store.live()] == ["team/0"]
    assert gate.passes == 1


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        pytest.param(
            _one_h100("team/x", priority_class_name="no-such-class"),
            grpc.StatusCode.INVALID_ARGUMENT,
            id="unknown-priority-class-fails-in-the-pass",
        ),
        pytest.param(
            pb.AllocateRequest(claims=[], reserve=True, owner="team/x"),
            grpc.StatusCode.INVALID_ARGUMENT,
            id="a-request-that-does-not-map-fails-before-it-joins",
        ),
        pytest.param(
            _one_h100("team/x", lease_ttl={"seconds": 10**9}),
            grpc.StatusCode.INVALID_ARGUMENT,
            id="a-lease-too-long-fails-in-the-pass",
        ),
    ],
)
def test_a_bad_call_among_good_ones_fails_alone_with_the_unary_status(
    allocator: ServedAllocator,
    monkeypatch: pytest.MonkeyPatch,
    request_: pb.AllocateRequest,
    code: grpc.StatusCode,
) -> None:
    with pytest.raises(grpc.RpcError) as alone:
        allocator.stub.Allocate(request_, timeout=WAIT)
    gate = Gate(allocator, monkeypatch)
    first = gate.lead(_one_h100("team/0"))
    before = gate.send(_one_h100("team/1"))
    bad = allocator.stub.Allocate.future(request_, timeout=WAIT * 2)
    if request_.claims:  # it maps: it waits for the pass
        _until(lambda: gate.combiner.waiting == 2, "the bad call waits for the pass")
    after = gate.send(_one_h100("team/2"))
    gate.open()
    with pytest.raises(grpc.RpcError) as combined:
        bad.result()
    assert combined.value.code() is alone.value.code() is code
    assert combined.value.details() == alone.value.details()
    answers = [f.result() for f in (first, before, after)]
    assert [a.outcome for a in answers] == [pb.OUTCOME_ALLOCATED] * 3
    held = _held(allocator)
    assert len(held) == len(set(held)) == 3


def test_each_item_of_a_run_is_solved_under_its_own_deadline(
    allocator: ServedAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """allocate_run with each item's deadline (a pass's reserving calls): identical items are
    searched together under the earliest deadline; the one whose call ended is answered
    DeadlineExceeded unsolved, and the others, whose shared search that deadline cut, are
    solved again under their own: never cut by another caller's."""
    service = allocator.app.service
    searched: list[tuple[int, list[Outcome]]] = []  # (items searched together, outcomes)
    answers = service._answers

    def spied(*args: Any, **kwargs: Any) -> list[Answer]:
        found = answers(*args, **kwargs)
        searched.append((kwargs.get("count", 1), [a.outcome for a in found]))
        return found

    monkeypatch.setattr(service, "_answers", spied)
    query = query_from_pb(allocate_request("one-h100"), ClaimReader())
    ended = threading.Event()
    ended.set()  # its client went away
    late = Deadline.after(1000.0)
    earliest = Deadline(time.monotonic() + 500.0, ended)
    items = [(query, LeaseOptions(owner=f"team/{i}")) for i in range(3)]
    results = service.allocate_run(items, deadlines=[late, earliest, late])
    first, cut, third = results
    assert isinstance(first, Answer) and first.outcome is Outcome.ALLOCATED
    assert isinstance(cut, DeadlineExceeded) and cut.message.startswith("cancelled")
    assert isinstance(third, Answer) and third.outcome is Outcome.ALLOCATED
    assert sorted(r.owner for r in allocator.app.store.live()) == ["team/0", "team/2"]
    assert searched == [
        (3, [Outcome.BUDGET_EXHAUSTED]),  # the three together, cut by the ended call's
        (1, [Outcome.ALLOCATED]),  # the first again, under its own deadline
        (1, [Outcome.ALLOCATED]),  # the third (the one before it left the run unsolved)
    ]


@pytest.mark.parametrize("how", ["client-went-away", "deadline-passed"])
def test_a_placed_call_that_ends_before_the_run_is_written_holds_nothing(
    allocator: ServedAllocator, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A pass's first reserving call is placed (held pending), then its call ends while the
    next call is solved: the run's write leaves it out (DeadlineExceeded, nothing held, its
    pending hold dropped) and writes the other, as a unary Allocate's write is refused once its
    call ended. Without this the ended caller's devices stayed reserved until the lease ran out."""
    service = allocator.app.service
    answers = service._answers
    ended = threading.Event()
    first = Deadline(None, ended) if how == "client-went-away" else Deadline.after(2.0)
    solves = [0]

    def spied(*args: Any, **kwargs: Any) -> list[Answer]:
        solves[0] += 1
        if solves[0] == 2:  # the first call is placed: its call ends now, before the write
            ended.set()
            _until(first.passed, "the first call's deadline passed")
        return answers(*args, **kwargs)

    monkeypatch.setattr(service, "_answers", spied)
    requests = [_one_h100(f"team/{i}") for i in range(2)]
    for index, request in enumerate(requests):
        request.claims[0].name = f"h100-{index}"  # distinct claims: solved one after the other
    reader = ClaimReader()
    queries = [query_from_pb(request, reader) for request in requests]
    items = [(q, LeaseOptions(owner=f"team/{i}")) for i, q in enumerate(queries)]
    results = service.allocate_run(items, deadlines=[first, Deadline.after(1000.0)])
    gone, placed = results
    assert isinstance(gone, DeadlineExceeded) and "before the write" in gone.message
    assert isinstance(placed, Answer) and placed.outcome is Outcome.ALLOCATED
    assert [r.owner for r in allocator.app.store.live()] == ["team/1"]
    assert not service.holdings._pending_on  # no pending hold left behind


@pytest.fixture
def uncombined(grpc_channel_factory: Any) -> Iterator[ServedAllocator]:
    settings = AllocatorSettings(expire_interval=0.1, combine_allocates=False)
    served = serve_allocator(grpc_channel_factory, settings=settings)
    yield served
    served.app.close()


def test_with_combining_off_each_call_is_placed_alone(uncombined: ServedAllocator) -> None:
    """GPUALLOC_COMBINE_ALLOCATES=false: no combiner; concurrent calls still hold distinct
    devices."""
    assert uncombined.app.combiner is None
    answers: list[pb.AllocateResponse] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        answer = uncombined.stub.Allocate(_one_h100(f"team/{index}"), timeout=WAIT * 2)
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    devices = [d for a in answers for d in _devices(a)]
    assert len(devices) == len(set(devices)) == 16
