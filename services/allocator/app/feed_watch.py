"""Say when the inventory becomes unreachable and when it is back: once per change, not per retry.

The feed retries by itself (adapters/inventory/watch_client.py: backoff, `wait_for_ready`); what an
operator needs is one WARNING when the allocator loses it (or cannot reach it within
`grace` seconds of starting: until then connecting is normal) and one INFO when it is back,
with how long it was gone; `gpualloc.inventory.disconnects` counts the losses and the
`gpualloc.inventory.connected` gauge says the present state. Polls `connected()` on a thread
of its own (the feed's status is a few attribute reads).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from opentelemetry.metrics import Counter

__all__ = ["FeedWatch"]

log = logging.getLogger("gpualloc.allocator.inventory")

_POLL_SECONDS = 0.25


class FeedWatch:
    """Logs the feed's transitions between reachable and unreachable; `close()` stops it."""

    def __init__(
        self,
        connected: Callable[[], bool],
        disconnects: Counter,
        *,
        target: str,
        has_view: Callable[[], bool],
        grace: float = 2.0,
        poll: float = _POLL_SECONDS,
    ) -> None:
        self._connected = connected
        self._disconnects = disconnects
        self._target = target
        self._has_view = has_view
        self._grace = grace
        self._poll = poll
        self._stop = threading.Event()
        self._reachable: bool | None = None  # None: still connecting after start
        self._since = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="feed-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            self.check()

    def check(self) -> None:
        """Compare the feed's state with the last one seen; log a change (the thread's step)."""
        now = time.monotonic()
        connected = self._connected()
        if connected == self._reachable:
            return
        if connected:
            if self._reachable is False:
                log.info(
                    "inventory reachable again after %.1fs",
                    now - self._since,
                    extra={"target": self._target, "down_seconds": round(now - self._since, 3)},
                )
            else:
                log.info("inventory feed connected", extra={"target": self._target})
        else:
            if self._reachable is None and now - self._since < self._grace:
                return  # still connecting: not news yet
            if self._reachable:
                self._disconnects.add(1)
            log.warning(
                "inventory unreachable at %s; %s, retrying",
                self._target,
                "serving the last view" if self._has_view() else "not ready (no view yet)",
                extra={"target": self._target},
            )
        if connected or self._reachable is not None:
            self._since = now  # from start: how long it has been unreachable since then
        self._reachable = connected
