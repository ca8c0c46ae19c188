"""AllocateStream's inbox (adapters/grpc/stream_inbox.py) and the decoding of streamed
requests (services/common/grpc_errors.py DecodedRequests): what a pass takes, the bound that
holds the reader back, and an undecodable message that fails alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from services.allocator.adapters.grpc.stream_inbox import Inbox
from services.common.errors import InvalidArgument
from services.common.grpc_errors import DecodedRequests

GARBAGE = b"\xff\xff\xff\xff\x0f"  # a truncated varint field: protobuf's DecodeError


def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait until the reader thread has got where `condition` says (no timing assertion)."""
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


class _Source:
    """A request stream: the items given, then the client's half-close (StopIteration), or
    with `cancelled` the call's end (grpc.RpcError, as grpc's request iterator raises)."""

    def __init__(self, items: list[str], *, cancelled: bool = False) -> None:
        self._items = iter(items)
        self._cancelled = cancelled
        self.read = 0

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        try:
            item = next(self._items)
        except StopIteration:
            if self._cancelled:
                raise _Cancelled() from None
            raise
        self.read += 1
        return item


class _Cancelled(grpc.RpcError):
    pass


def test_a_take_gets_every_request_waiting_and_the_bound_holds_the_reader_back():
    """Bound 2: the reader has read a third request (counted) only when two wait, and waits
    with it in hand; a take gets exactly the two, then the rest come as they are read."""
    source = _Source([f"r{i}" for i in range(5)])
    read: list[int] = []
    inbox: Inbox[str] = Inbox(source, 2, read=lambda: read.append(1))
    inbox.start()
    _until(lambda: len(read) == 3, "the reader reads a third request")
    assert inbox.take(10) == ["r0", "r1"]
    taken: list[str | InvalidArgument] = []
    while batch := inbox.take(10):
        taken.extend(batch)
    assert taken == ["r2", "r3", "r4"]  # then the half-close: [] once nothing waits


@pytest.mark.parametrize(
    ("sizes", "waiting_when_held"),
    [
        pytest.param([3, 3, 3, 3], 2, id="two-requests-reach-the-byte-bound"),
        pytest.param([9, 1, 1], 1, id="one-request-over-the-byte-bound-alone-gets-in"),
        pytest.param([1, 1, 1, 1, 1, 1], 5, id="small-requests-stop-at-the-byte-bound"),
    ],
)
def test_the_byte_bound_holds_the_reader_back(sizes: list[int], waiting_when_held: int):
    """Byte bound 5, count bound 8: the reader adds requests until their bytes reach 5 (one
    request alone always gets in), then waits with the next in hand until a take makes room;
    every request is still taken, in order."""
    source = _Source([f"r{i}:{n}" for i, n in enumerate(sizes)])
    read: list[int] = []
    inbox: Inbox[str] = Inbox(
        source,
        8,
        read=lambda: read.append(1),
        size=lambda request: int(request.split(":")[1]),
        byte_bound=5,
    )
    inbox.start()
    _until(lambda: len(read) == min(waiting_when_held + 1, len(sizes)), "the reader holds one")
    first = inbox.take(8)
    assert len(first) == waiting_when_held
    taken = list(first)
    while batch := inbox.take(8):
        taken.extend(batch)
    assert taken == [f"r{i}:{n}" for i, n in enumerate(sizes)]


def test_a_stream_request_s_bytes_are_its_wire_size():
    """The servicer counts a waiting request's bytes with the unbound ByteSize."""
    request = pb.AllocateStreamRequest(item=pb.AllocateRequest(node_name="n" * 100))
    assert pb.AllocateStreamRequest.ByteSize(request) == len(request.SerializeToString())


def test_a_take_gets_at_most_what_it_asks():
    source = _Source([f"r{i}" for i in range(4)])
    inbox: Inbox[str] = Inbox(source, 8)
    inbox.start()
    _until(lambda: source.read == 4, "all read")
    assert inbox.take(3) == ["r0", "r1", "r2"]
    assert inbox.take(3) == ["r3"]
    assert inbox.take(3) == []


@pytest.mark.parametrize(
    ("cancelled", "left"),
    [
        pytest.param(False, ["r0", "r1"], id="a-half-close-leaves-what-waits-to-be-placed"),
        pytest.param(True, [], id="a-cancel-drops-what-waits"),
    ],
)
def test_how_the_stream_ends(cancelled: bool, left: list[str]):
    source = _Source(["r0", "r1"], cancelled=cancelled)
    inbox: Inbox[str] = Inbox(source, 8)
    inbox.start()
    _until(lambda: source.read == 2, "both read")
    inbox._reader.join(10)  # the reader met the end
    assert inbox.take(8) == left
    assert inbox.take(8) == []


def test_close_wakes_a_waiting_take_and_drops_what_waits():
    blocker = threading.Event()

    def forever() -> Iterator[str]:
        yield "r0"
        blocker.wait(10)
        yield "late"

    inbox: Inbox[str] = Inbox(forever(), 8)
    inbox.start()
    assert inbox.take(8) == ["r0"]
    taken: list[list[str | InvalidArgument]] = []
    waiter = threading.Thread(target=lambda: taken.append(inbox.take(8)))
    waiter.start()
    inbox.close()  # grpc's callback when the call ends
    waiter.join(10)
    assert taken == [[]]
    blocker.set()
    inbox._reader.join(10)
    assert inbox.take(8) == []  # "late" was read after the close: never placed


def test_an_undecodable_message_fails_alone_and_the_stream_goes_on():
    valid = pb.AllocateStreamRequest(item=pb.AllocateRequest(node_name="n")).SerializeToString()
    decoded = DecodedRequests(
        iter([valid, GARBAGE, valid]), pb.AllocateStreamRequest.FromString, "AllocateStream"
    )
    inbox: Inbox[pb.AllocateStreamRequest] = Inbox(decoded, 8)
    inbox.start()
    inbox._reader.join(10)
    first, bad, third = inbox.take(8)
    assert isinstance(first, pb.AllocateStreamRequest) and first.item.node_name == "n"
    assert isinstance(bad, InvalidArgument)
    assert bad.message == (
        "AllocateStream: message 1 of the stream is not a valid protobuf message (5 bytes)"
    )
    assert isinstance(third, pb.AllocateStreamRequest) and decoded.read == 3
