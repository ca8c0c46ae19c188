"""AllocateStream over real gRPC: a long-lived scheduler connection whose requests that arrive
together are placed in one pass, answered in order (servicer.AllocateStream, stream_inbox.py).

The GPU view is examples/cluster (two 8-H100 nodes, an A100 node of MIG partitions, a 4-L40S
node); the mTLS cases run the secured fleet of tests/security_fixtures.py.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.app.telemetry import configure_telemetry
from services.allocator.reservations.model import ReservationStore
from services.client import AllocatorClient, claim_from_spec
from services.client.client import AllocateItem
from services.common.errors import InvalidArgument, NotFound
from tests.e2e.allocator_harness import ServedAllocator, allocate_request, serve_allocator
from tests.integration.test_security import _allocate
from tests.security_fixtures import SecuredFleet, secured_fleet
from tests.unit.bridges.support import release_everything

pytestmark = pytest.mark.timeout(180)

OK = "ok"
INVALID = grpc.StatusCode.INVALID_ARGUMENT.name
DENIED = grpc.StatusCode.PERMISSION_DENIED.name
NOT_FOUND = grpc.StatusCode.NOT_FOUND.name
CODES = {code.value[0]: code.name for code in grpc.StatusCode}
GARBAGE = b"\xff\xff\xff\xff\x0f"  # a truncated varint field: protobuf's DecodeError


def _request(name: str, reserve: bool = False, owner: str = "team/a") -> pb.AllocateRequest:
    """An example claim's request; "bad" maps to nothing (no claims), "elsewhere" names a node
    that does not exist."""
    if name == "bad":
        return pb.AllocateRequest(claims=[], reserve=reserve, owner=owner)
    if name == "elsewhere":
        return allocate_request("one-h100", reserve=reserve, owner=owner, node_name="no-node")
    return allocate_request(name, reserve=reserve, owner=owner)


def _seen(item: pb.AllocateBatchItem) -> tuple[Any, ...]:
    """What must be equal: the outcome, the node and devices placed, who holds them; or the
    error's code and message."""
    if item.HasField("error"):  # a stream's path prefix as a batch's
        message = re.sub(r"requests\[(\d+)\]\.item", r"items[\1]", item.error.message)
        return ("error", CODES[item.error.code], message)
    answer = item.response
    devices = sorted(
        f"{r.pool}/{r.device}" for a in answer.allocations for r in a.allocation.results
    )
    held = sorted((r.node_name, r.owner) for r in answer.reservations)
    return (answer.outcome, answer.node_name, tuple(devices), tuple(held))


def _streamed(
    stub: allocator_pb2_grpc.AllocatorStub, items: list[pb.AllocateRequest], **call: Any
) -> list[pb.AllocateStreamResponse]:
    requests = (pb.AllocateStreamRequest(item=item) for item in items)
    return list(stub.AllocateStream(requests, timeout=30, **call))


# --- the same answers as AllocateBatch --------------------------------------------------------

SAME = {
    "reserving-one-h100s-until-none-is-left": [("one-h100", True)] * 18,
    "mixed-reserving-and-placing-items": [
        ("eight-h100", True),
        ("one-h100", False),
        ("eight-h100", True),
        ("eight-h100", False),
        ("mig-small-else-medium", True),
        ("all-l40s", False),
    ],
    "a-bad-item-and-a-missing-node-fail-alone": [
        ("one-h100", True),
        ("bad", True),
        ("elsewhere", False),
        ("four-nvlink-gpus", True),
        ("sixteen-h100-one-node", False),
    ],
}


@pytest.mark.parametrize("specs", SAME.values(), ids=SAME.keys())
def test_a_stream_answers_as_allocate_batch_does(allocator: ServedAllocator, specs):
    """The same items, on the same (empty) state, in the same order: the same answers, one per
    item, each with its position in the stream."""
    items = [_request(name, reserve) for name, reserve in specs]
    try:
        batch = allocator.stub.AllocateBatch(pb.AllocateBatchRequest(items=items), timeout=30)
    finally:
        release_everything(allocator.target)
    try:
        streamed = _streamed(allocator.stub, items)
    finally:
        release_everything(allocator.target)
    assert [r.index for r in streamed] == list(range(len(items)))
    assert [_seen(r.item) for r in streamed] == [_seen(i) for i in batch.items]


def test_a_bad_item_answers_its_own_error_and_the_rest_go_on(allocator: ServedAllocator):
    items = [_request("one-h100", True), _request("bad"), _request("one-h100", True)]
    try:
        first, bad, third = _streamed(allocator.stub, items)
    finally:
        release_everything(allocator.target)
    assert first.item.response.outcome == third.item.response.outcome == pb.OUTCOME_ALLOCATED
    assert CODES[bad.item.error.code] == INVALID
    assert bad.item.error.message.startswith("requests[1].item: ")
    devices = {
        d.device
        for r in (first, third)
        for a in r.item.response.allocations
        for d in a.allocation.results
    }
    assert len(devices) == 2  # the third item saw the first one's reservation


def test_the_client_streams_items_and_gets_typed_results(allocator: ServedAllocator):
    items = [
        AllocateItem([claim_from_spec("8 x h100", name="a")], reserve=True),
        AllocateItem([claim_from_spec("8 x h100", name="b")], reserve=True),
        AllocateItem([claim_from_spec("8 x h100", name="c")], reserve=True),
        AllocateItem([claim_from_spec("1 x h100", name="x")], node_name="no-such-node"),
        AllocateItem([]),
    ]
    try:
        with AllocatorClient(allocator.target, owner="team/a") as client:
            a, b, c, elsewhere, bad = client.allocate_stream(iter(items), window=2)
    finally:
        release_everything(allocator.target)
    assert not isinstance(a, Exception) and a.fits and a.reservations
    assert not isinstance(b, Exception) and b.fits and b.node_name != a.node_name
    assert not isinstance(c, Exception) and not c.fits and not c.reservations
    assert isinstance(elsewhere, NotFound) and elsewhere.message.startswith("requests[3].item: ")
    assert isinstance(bad, InvalidArgument)


# --- undecodable messages ---------------------------------------------------------------------

METHOD = "/gpualloc.allocator.v1.Allocator/AllocateStream"


def test_an_undecodable_message_answers_invalid_argument_and_the_stream_goes_on(
    allocator: ServedAllocator,
):
    """Raw bytes on the wire: each undecodable message is that position's INVALID_ARGUMENT
    (decoded inside the call: grpcio's deserializer would leak a stream slot per failure), the
    messages around it are answered, and the connection still serves after hundreds."""
    valid = pb.AllocateStreamRequest(item=_request("one-h100")).SerializeToString()
    raw: grpc.StreamStreamMultiCallable[bytes, bytes] = allocator.channel.stream_stream(METHOD)
    sent = [valid, GARBAGE, valid] + [GARBAGE] * 300 + [valid]
    answers = [pb.AllocateStreamResponse.FromString(r) for r in raw(iter(sent), timeout=60)]
    assert [a.index for a in answers] == list(range(len(sent)))
    kinds = [CODES[a.item.error.code] if a.item.HasField("error") else OK for a in answers]
    assert kinds == [OK if message == valid else INVALID for message in sent]
    undecodable = answers[1].item.error.message
    assert "message 1 of the stream is not a valid protobuf message" in undecodable
    listed = allocator.stub.ListReservations(pb.ListReservationsRequest(), timeout=10)
    assert not listed.reservations  # the same connection still answers


# --- one pass for what arrived together -------------------------------------------------------


class _Gate:
    def __init__(self) -> None:
        self.entered = threading.Event()  # the write waits
        self.opened = threading.Event()  # the test lets it go on
        self.written = threading.Event()  # the write is done


class _GatedStore:
    """The real store, whose next `reserve` after `arm()` waits for its gate to open: a pass
    held mid-write, deterministically."""

    def __init__(self, store: ReservationStore) -> None:
        self.inner = store
        self._armed: _Gate | None = None
        self.gates: list[_Gate] = []

    def arm(self) -> _Gate:
        self._armed = gate = _Gate()
        self.gates.append(gate)
        return gate

    def reserve(self, placements: Any) -> Any:
        gate, self._armed = self._armed, None
        if gate is None:
            return self.inner.reserve(placements)
        gate.entered.set()
        assert gate.opened.wait(30)
        try:
            return self.inner.reserve(placements)
        finally:
            gate.written.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _metric(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    if data is None:
        return []
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def _until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Wait until `condition` holds (a server-side fact the test cannot be told of)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g}s: {what}"
        time.sleep(0.01)


@pytest.fixture
def gated(grpc_channel_factory: Any) -> Iterator[tuple[ServedAllocator, _GatedStore, Any]]:
    reader = InMemoryMetricReader()
    store = _GatedStore(MemoryReservationStore())
    telemetry = configure_telemetry({}, metric_readers=[reader])
    served = serve_allocator(grpc_channel_factory, store, telemetry=telemetry)
    yield served, store, reader
    for gate in store.gates:
        gate.opened.set()
    served.app.close()


def _read(reader: InMemoryMetricReader) -> float:
    """Requests the server's AllocateStream calls have read."""
    return float(sum(p.value for p in _metric(reader, "gpualloc.allocate_stream.items")))


def test_items_that_arrive_while_a_pass_runs_are_placed_together_in_the_next(gated):
    """The first item's pass is held in its store write; eight more arrive meanwhile (the
    server has read all nine: its items counter says so). They are placed in one pass of
    eight: the pass sizes recorded are exactly 1 and 8."""
    served, store, reader = gated
    gate = store.arm()

    def requests() -> Iterator[pb.AllocateStreamRequest]:
        yield pb.AllocateStreamRequest(item=_request("one-h100", True))
        assert gate.entered.wait(30)
        for index in range(8):
            yield pb.AllocateStreamRequest(item=_request("one-h100", index % 2 == 0))

    responses = served.stub.AllocateStream(requests(), timeout=60)
    _until(lambda: _read(reader) == 9, "nine requests read")
    gate.opened.set()
    answers = list(responses)
    release_everything(served.target)
    assert [a.item.response.outcome for a in answers] == [pb.OUTCOME_ALLOCATED] * 9
    [passes] = _metric(reader, "gpualloc.allocate_stream.pass_items")
    assert (passes.count, passes.sum, passes.min, passes.max) == (2, 9, 1, 8)


def test_a_client_that_cancels_mid_pass_leaves_nothing_it_was_not_answered_for(gated):
    """Items 0 and 1 are answered: their reservations are the client's. Items 2-4 arrive while
    item 1's pass is held, and are placed together in the next pass, held in its store write
    while the client cancels; once the server has seen the cancel (a call after it on the same
    connection has been answered) the write completes, but the call has ended, so their
    answers are never sent and the server releases their reservations: what the store holds
    in the end is exactly items 0 and 1's."""
    served, store, reader = gated
    answered = threading.Event()
    gates: list[_Gate] = []

    def requests() -> Iterator[pb.AllocateStreamRequest]:
        yield pb.AllocateStreamRequest(item=_request("one-h100", True))
        assert answered.wait(30)
        yield pb.AllocateStreamRequest(item=_request("one-h100", True))
        assert gates[0].entered.wait(30)
        for _ in range(3):
            yield pb.AllocateStreamRequest(item=_request("one-h100", True))

    responses = served.stub.AllocateStream(requests(), timeout=60)
    [first] = next(responses).item.response.reservations  # item 0: written at once
    gates.append(store.arm())  # item 1's pass waits
    answered.set()
    _until(lambda: _read(reader) == 5, "five requests read")
    second_pass = store.arm()  # items 2-4's pass waits
    gates[0].opened.set()
    [second] = next(responses).item.response.reservations
    assert second_pass.entered.wait(30)
    responses.cancel()
    served.check("")  # on the same connection, after the cancel: the server has seen it
    second_pass.opened.set()
    assert second_pass.written.wait(30)
    _until(lambda: len(store.inner.list()) == 2, "the unsent answers' reservations released")
    left = {r.id for r in store.inner.list()}
    release_everything(served.target)
    assert left == {first.id, second.id}
    [passes] = _metric(reader, "gpualloc.allocate_stream.pass_items")
    assert (passes.count, passes.sum, passes.max) == (3, 5, 3)  # 2-4 were placed together


# --- under an access policy: each item authorized, the streams counted ------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredFleet]:
    """mTLS and the test policy; at most 2 streams open, 1 per tenant."""
    with secured_fleet(tmp_path_factory.mktemp("stream-pki"), max_streams=2) as made:
        yield made


AUTHORIZED = {
    "a-readers-reserving-item-is-denied-its-placing-items-fit": (
        "reader",
        [_allocate(), _allocate(reserve=True), _allocate()],
        [OK, DENIED, OK],
    ),
    "an-admin-access-item-is-denied-without-the-tenants-leave": (
        "scheduler-b",
        [_allocate(reserve=True, admin_access=True), _allocate(reserve=True)],
        [DENIED, OK],
    ),
    "an-owner-outside-act-for-is-denied-alone": (
        "scheduler-a",
        [_allocate(reserve=True, owner="kueue/ns/workload"), _allocate()],
        [DENIED, OK],
    ),
}


@pytest.mark.parametrize(("who", "items", "outcomes"), AUTHORIZED.values(), ids=AUTHORIZED.keys())
def test_each_item_is_authorized_on_its_own(secured: SecuredFleet, who, items, outcomes):
    stub = allocator_pb2_grpc.AllocatorStub(secured.channel(who))
    try:
        answers = _streamed(stub, items)
    finally:
        release_everything_secured(secured)
    seen = [CODES[a.item.error.code] if a.item.HasField("error") else OK for a in answers]
    assert seen == outcomes
    denied = [a.item.error.message for a in answers if CODES.get(a.item.error.code) == DENIED]
    assert all(m.startswith("requests[") for m in denied)


def test_an_identity_that_may_not_place_cannot_open_the_stream(secured: SecuredFleet):
    stub = allocator_pb2_grpc.AllocatorStub(secured.channel("agent"))
    with pytest.raises(grpc.RpcError) as caught:
        _streamed(stub, [_allocate()])
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED


def test_streams_count_against_the_stream_admission(secured: SecuredFleet):
    """max_streams=2, one per tenant: team-a's second stream is refused (its tenant's share),
    team-b's first is served, then the reader's is refused (the server's streams are all
    open); once they close, a stream opens again."""
    opened: list[tuple[threading.Event, Any]] = []

    def open_stream(who: str) -> Any:
        done = threading.Event()

        def requests() -> Iterator[pb.AllocateStreamRequest]:
            yield pb.AllocateStreamRequest(item=_allocate())
            done.wait(60)

        stub = allocator_pb2_grpc.AllocatorStub(secured.channel(who))
        responses = stub.AllocateStream(requests(), timeout=60)
        opened.append((done, responses))
        return responses

    def refused(who: str) -> str:
        with pytest.raises(grpc.RpcError) as caught:
            next(open_stream(who))
        assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        return str(caught.value.details())

    try:
        assert next(open_stream("scheduler-a")).item.response.outcome == pb.OUTCOME_ALLOCATED
        assert "tenant team-a already has 1 streams open" in refused("scheduler-a")
        assert next(open_stream("scheduler-b")).item.response.outcome == pb.OUTCOME_ALLOCATED
        assert "2 streams are open" in refused("reader")
    finally:
        for done, responses in opened:
            done.set()
            responses.cancel()
    stub = allocator_pb2_grpc.AllocatorStub(secured.channel("reader"))
    _until(lambda: _opens(stub), "a stream opens once the others closed")


def _opens(stub: allocator_pb2_grpc.AllocatorStub) -> bool:
    try:
        _streamed(stub, [_allocate()])
    except grpc.RpcError as error:
        assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        return False
    return True


def release_everything_secured(fleet: SecuredFleet) -> None:
    """Every reservation, released by an identity that may change any tenant's."""
    stub = allocator_pb2_grpc.AllocatorStub(fleet.channel("admin"))
    listed = stub.ListReservations(pb.ListReservationsRequest(page_size=1000), timeout=10)
    for reservation in listed.reservations:
        if reservation.id == "":
            continue
        try:
            stub.Release(pb.ReleaseRequest(reservation_id=reservation.id), timeout=10)
        except grpc.RpcError as error:
            if error.code() is not grpc.StatusCode.NOT_FOUND:
                raise
