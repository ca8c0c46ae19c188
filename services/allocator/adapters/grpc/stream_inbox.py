"""The requests of an AllocateStream that have arrived and wait for the next pass.

A sync gRPC handler can only block on its request iterator; it cannot ask what has arrived. So
an `Inbox` reads the stream on a thread of its own into a bounded list, and the handler takes
every request waiting there at once (`take`): the items a pipelining client sent while the
previous pass ran are placed together in the next one. When `bound` requests wait, the reader
stops reading, and gRPC's flow control makes the client wait instead of the server's memory.

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
    message read (a metric)."""

    def __init__(
        self, requests: Iterator[T], bound: int, read: Callable[[], None] | None = None
    ) -> None:
        self._requests = requests
        self._bound = max(1, bound)
        self._read = read
        self._waiting: list[T | InvalidArgument] = []
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
            self._changed.notify_all()  # room for the reader
            return taken

    def close(self) -> None:
        """No more takes; the reader stops at its next message (the call's end — grpc's
        callback — ends its read at once). Requests waiting are dropped, never placed."""
        with self._changed:
            self._ended = self._closed = True
            self._waiting.clear()
            self._changed.notify_all()

    def _read_all(self) -> None:
        try:
            while True:
                try:
                    entry: T | InvalidArgument = next(self._requests)
                except InvalidArgument as undecodable:  # this message only: read on
                    entry = undecodable
                if self._read is not None:
                    self._read()
                with self._changed:
                    while len(self._waiting) >= self._bound and not self._closed:
                        self._changed.wait()
                    if self._closed:
                        return
                    self._waiting.append(entry)
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
