"""The requests of an AllocateStream that have arrived and wait for the next pass.

A sync gRPC handler can only block on its request iterator; it cannot ask what has arrived. So
an `Inbox` reads the stream on a thread of its own into a bounded list, and the handler takes
every request waiting there at once (`take`): the items a pipelining client sent while the
previous pass ran are placed together in the next one. When `bound` requests wait, or requests
of `byte_bound` bytes together, the reader stops reading, and gRPC's flow control makes the
client wait instead of the server's memory: a stream holds at most `byte_bound` bytes of waiting
requests plus the one message the reader has in hand (itself at most the server's
max_receive_message_length), however large the client's messages are.

Each entry is the decoded request, or the InvalidArgument of a message that did not decode
(services/common/grpc_errors.py: DecodedRequests), in the order read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import grpc

from services.common.errors import InvalidArgument

__all__ = ["Inbox"]

T = TypeVar("T")


class Inbox(Generic[T]):
    """Requests read from a stream, waiting to be taken; thread-safe. `read` is called once per
    message read (a metric); `size` gives a request's bytes (the byte bound counts them; a
    message that did not decode counts 0)."""

    def __init__(
        self,
        requests: Iterator[T],
        bound: int,
        read: Callable[[], None] | None = None,
        *,
        size: Callable[[T], int] | None = None,
        byte_bound: int | None = None,
    ) -> None:
        self._requests = requests
        self._bound = max(1, bound)
        self._read = read
        self._size = size
        self._byte_bound = byte_bound
        self._waiting: list[T | InvalidArgument] = []
        self._sizes: list[int] = []  # each waiting request's bytes, in step with _waiting
        self._waiting_bytes = 0
        self._ended = False  # the client half-closed, the call ended, or close() was called
        self._closed = False
        self._failed: Exception | None = None  # a bug met reading: take() raises it
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read_all, name="allocate-stream", daemon=True)

    def start(self) -> None:
        self._reader.start()

    def take(self, most: int) -> list[T | InvalidArgument]:
        """At least one request (waiting for it), at most `most`, in order; [] once the stream
        has ended and nothing waits (or after close())."""
        with self._changed:
            while not self._waiting and not self._ended:
                self._changed.wait()
            if self._failed is not None:
                raise self._failed
            if self._closed:
                return []
            taken, self._waiting = self._waiting[:most], self._waiting[most:]
            self._waiting_bytes -= sum(self._sizes[:most])
            del self._sizes[:most]
            self._changed.notify_all()  # room for the reader
            return taken

    def close(self) -> None:
        """No more takes; the reader stops at its next message (the call's end — grpc's
        callback — ends its read at once). Requests waiting are dropped, never placed."""
        with self._changed:
            self._ended = self._closed = True
            self._waiting.clear()
            self._sizes.clear()
            self._waiting_bytes = 0
            self._changed.notify_all()

    def _full(self) -> bool:
        """No room for one more request: `bound` wait, or `byte_bound` bytes do (one request
        alone always has room, however large: the server's message limit bounds it)."""
        if len(self._waiting) >= self._bound:
            return True
        limit = self._byte_bound
        return limit is not None and bool(self._waiting) and self._waiting_bytes >= limit

    def _read_all(self) -> None:
        try:
            while True:
                try:
                    entry: T | InvalidArgument = next(self._requests)
                except InvalidArgument as undecodable:  # this message only: read on
                    entry = undecodable
                if self._read is not None:
                    self._read()
                size = 0
                if self._size is not None and not isinstance(entry, InvalidArgument):
                    size = self._size(entry)
                with self._changed:
                    while self._full() and not self._closed:
                        self._changed.wait()
                    if self._closed:
                        return
                    self._waiting.append(entry)
                    self._sizes.append(size)
                    self._waiting_bytes += size
                    self._changed.notify_all()
        except StopIteration:  # the client half-closed: what waits is still placed
            pass
        except grpc.RpcError:  # the call ended (cancelled, deadline): nothing more is placed
            self.close()
        except Exception as bug:  # the handler raises it (INTERNAL), not a quiet end
            with self._changed:
                self._failed = bug
        finally:
            with self._changed:
                self._ended = True
                self._changed.notify_all()
