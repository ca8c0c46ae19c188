"""A call's time as a value: when the work done for it must stop.

The servicer turns a gRPC call's deadline into a `Deadline` (grpc_server.call_deadline: the
client's deadline capped by the server's, and an event set when the call ends or its client
cancels) and passes it down explicitly; callers that are not gRPC calls pass their own
(`Deadline.after(seconds)`) or `UNBOUNDED`. Nothing below the servicer reads the time of the
call from anywhere else.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Protocol

from services.common.errors import DeadlineExceeded

__all__ = ["UNBOUNDED", "Cancellation", "Deadline", "Ended"]


class Cancellation(Protocol):
    """What tells work that its call ended (a `threading.Event`, an `Ended`)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Ended:
    """A flag set once, when a call ends or its client cancels it: a `threading.Event` whose
    lock and condition are made only when someone waits (the servicer makes one per call, and
    work for the call only asks `is_set`)."""

    __slots__ = ("_ended", "_event")

    def __init__(self) -> None:
        self._ended = False
        self._event: threading.Event | None = None

    def set(self) -> None:
        self._ended = True
        event = self._event
        if event is not None:
            event.set()

    def is_set(self) -> bool:
        return self._ended

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it is set, waiting at most `timeout` seconds for it."""
        if self._ended:
            return True
        with _WAITING:
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        # `set` may have run before the event existed: it set the flag before looking for it
        return self._ended or event.wait(timeout)


_WAITING = threading.Lock()  # makes an Ended's event once


@dataclass(frozen=True)
class Deadline:
    """When work must stop: `at` on the monotonic clock (None: never), or as soon as
    `cancelled` is set (the client went away)."""

    at: float | None
    cancelled: Cancellation | None = None

    @classmethod
    def within(
        cls,
        remaining: float | None,
        margin: float = 0.1,
        cancelled: Cancellation | None = None,
    ) -> Deadline:
        """`remaining` seconds from now, less a margin for answering (at most 10%)."""
        if remaining is None:
            return cls(None, cancelled)
        return cls(time.monotonic() + remaining - min(margin, remaining * 0.1), cancelled)

    @classmethod
    def after(cls, seconds: float | None, cancelled: Cancellation | None = None) -> Deadline:
        """`seconds` from now (None: never), with no margin."""
        return cls(None if seconds is None else time.monotonic() + seconds, cancelled)

    @property
    def bounded(self) -> bool:
        return self.at is not None or self.cancelled is not None

    def passed(self) -> bool:
        if self.cancelled is not None and self.cancelled.is_set():
            return True
        return self.at is not None and time.monotonic() >= self.at

    def left(self) -> float | None:
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    def answering(self, margin: float = 0.1) -> Deadline:
        """The deadline of a search whose answer must still reach the client: `margin`
        seconds earlier (at most 10% of the time left now), the same cancellation."""
        return Deadline.within(self.left(), margin, self.cancelled)

    def check(self, doing: str = "call") -> None:
        """Raise DeadlineExceeded when the time is up; call it before each slow step."""
        left = self.left()
        if left is not None and left <= 0:
            raise DeadlineExceeded(f"{doing}: ran out of time")


UNBOUNDED = Deadline(None)
"""No time limit and no cancellation: for in-process callers (tests, benchmarks, the CLI)."""
