"""Keep Python's cyclic garbage collector from pausing a server for a second at a time.

Both services hold millions of small immutable objects (at 10,000 nodes: slices, devices,
attributes, reports and views in the inventory; the allocator's cluster view, its snapshot and
node templates, and the live reservations). CPython's full collection walks every tracked
object and runs each time a quarter of the long-lived objects is new, which under a steady
stream of reports (inventory) or placements (allocator) means a pause of ~0.5-1 s every few
seconds, paid by whichever call allocates at that moment. Those objects never form reference
cycles (frozen dataclasses of values, tuples and dicts), so reference counting frees them and
the cyclic collector has nothing to find there.

`GcPolicy` therefore moves the survivors into the permanent generation (`gc.freeze()`, a cheap
list splice) every `freeze_every` seconds: collections only walk what was allocated since.
Cyclic garbage that was alive at a freeze would never be collected, so each freeze first collects
the young generation (what became garbage since the last young collection: a few ms, once a
second), and once every `full_every` seconds everything is unfrozen and collected once (one full
pause per hour by default) for the cyclic garbage that was older than that at a freeze.

The young generation is collected after `young_threshold` new container objects instead of
CPython's 700. A young collection visits every reference of every young object, and a call
makes a few large young containers (a solve's node lists, a reserve's copies of the state's
maps): at 700 the allocator collected every ~5 unary calls, each collection walking those
containers again; ~40-80 us of CPU per Allocate(reserve) went to it
(loadtest.profile_service with a gc callback, 16 threads). At 20,000 it collects ~30x less
often for ~half the CPU, and cyclic garbage (exception tracebacks, mostly) waits for at most
that many new objects.
"""

from __future__ import annotations

import gc
import threading

__all__ = ["GcPolicy"]


class GcPolicy:
    def __init__(
        self,
        freeze_every: float = 1.0,
        full_every: float = 3600.0,
        *,
        young_threshold: int = 20_000,
        name: str = "gc-policy",
    ) -> None:
        """`name`: the thread's (which service's policy it is)."""
        self.freeze_every = freeze_every
        self.full_every = full_every
        self.young_threshold = young_threshold
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._thresholds: tuple[int, int, int] | None = None

    def start(self) -> GcPolicy:
        self._thresholds = gc.get_threshold()
        _, older, oldest = self._thresholds
        gc.set_threshold(self.young_threshold, older, oldest)
        gc.freeze()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        since_full = 0.0
        while not self._stop.wait(self.freeze_every):
            since_full += self.freeze_every
            if since_full >= self.full_every:
                since_full = 0.0
                gc.unfreeze()
                gc.collect()
            else:  # what became cyclic garbage since the last young collection: not frozen
                gc.collect(0)
            gc.freeze()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        gc.unfreeze()
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
