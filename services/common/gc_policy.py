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
Cyclic garbage that was alive at a freeze would never be collected, so once every `full_every`
seconds everything is unfrozen and collected once (one full pause per hour by default).
"""

from __future__ import annotations

import gc
import threading

__all__ = ["GcPolicy"]


class GcPolicy:
    def __init__(
        self, freeze_every: float = 1.0, full_every: float = 3600.0, *, name: str = "gc-policy"
    ) -> None:
        """`name`: the thread's (which service's policy it is)."""
        self.freeze_every = freeze_every
        self.full_every = full_every
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> GcPolicy:
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
            gc.freeze()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        gc.unfreeze()
