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

from services.common.errors import DeadlineExceeded

__all__ = ["UNBOUNDED", "Deadline"]


@dataclass(frozen=True)
class Deadline:
    """When work must stop: `at` on the monotonic clock (None: never), or as soon as
    `cancelled` is set (the client went away)."""

    at: float | None
    cancelled: threading.Event | None = None

    @classmethod
    def within(
        cls,
        remaining: float | None,
        margin: float = 0.1,
        cancelled: threading.Event | None = None,
    ) -> Deadline:
        """`remaining` seconds from now, less a margin for answering (at most 10%)."""
        if remaining is None:
            return cls(None, cancelled)
        return cls(time.monotonic() + remaining - min(margin, remaining * 0.1), cancelled)

    @classmethod
    def after(cls, seconds: float | None, cancelled: threading.Event | None = None) -> Deadline:
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
