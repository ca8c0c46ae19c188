"""ClusterView: the allocator's current GPU view, rebuilt from feed updates off the request path.

A feed may deliver a thousand updates a second (a node agent storm, a big apply); rebuilding
the ClusterSnapshot for each would burn the CPU the solver needs. So `apply` only files the
update (a few dict writes under a lock) and wakes one builder thread, which coalesces: it waits
until at least `min_interval` has passed since its last build — and at least as long as that
build took, so rebuilding never takes more than half the process — then builds one snapshot
from the latest content. Latest wins; intermediate generations are skipped.

Readers call `current()`: one attribute read of an immutable `ViewSnapshot` (generation,
snapshot), no lock. `wait_for(generation, timeout)` blocks until the view has caught up, for
requests that carry `min_inventory_generation` (read-your-writes after an inventory apply).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from services.allocator.app.inventory_feed import InventoryUpdate
from services.allocator.core import ClusterSnapshot, NodeTopology
from services.common.dra.model import Node, ResourceSlice
from services.common.errors import Unavailable

__all__ = ["ClusterView", "ViewSnapshot"]

log = logging.getLogger(__name__)

DEFAULT_MIN_INTERVAL = 0.05  # seconds between two rebuilds at most 20 per second


@dataclass(frozen=True, eq=False)
class ViewSnapshot:
    """One published view: the inventory generation it reflects and its index."""

    generation: int
    snapshot: ClusterSnapshot
    devices: int
    build_seconds: float


class ClusterView:
    """Feed consumer; thread-safe. Pass `on_publish` to learn about each new view (metrics,
    health); it runs on the builder thread."""

    def __init__(
        self,
        *,
        min_interval: float = DEFAULT_MIN_INTERVAL,
        on_publish: Callable[[ViewSnapshot], None] | None = None,
        max_waiters: int = 4,
        binding_conditions: bool = True,
    ) -> None:
        self._min_interval = min_interval
        self._binding_conditions = binding_conditions  # GPUALLOC_DEVICE_BINDING_CONDITIONS
        self._max_waiters = max_waiters  # calls parked for a future generation, at most
        self._waiters = 0
        self._on_publish = on_publish
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # builder waits for updates
        self._published = threading.Condition(self._lock)  # readers wait for generations
        self._slices: dict[str, tuple[ResourceSlice, ...]] = {}
        self._nodes: dict[str, Node] = {}
        self._topologies: dict[str, NodeTopology] = {}
        self._received = -1  # generation of the newest update filed
        self._filed = 0  # updates filed so far
        self._attempted = 0  # updates covered by the newest build attempt
        self._closed = False
        self._current: ViewSnapshot | None = None
        self.builds = 0
        self._thread = threading.Thread(target=self._run, name="cluster-view", daemon=True)
        self._thread.start()

    # --- the feed side ---------------------------------------------------------------------

    def apply(self, update: InventoryUpdate) -> None:
        """File an update (the feed's callback); the builder picks it up."""
        with self._lock:
            if update.reset:
                self._slices = {}
                self._nodes = {}
                self._topologies = {}
            for name, topology in update.topologies.items():
                if topology is None:
                    self._topologies.pop(name, None)
                else:
                    self._topologies[name] = topology
            for key, slices in update.slices.items():
                if slices:
                    self._slices[key] = tuple(slices)
                else:
                    self._slices.pop(key, None)
            for name, node in update.nodes.items():
                if node is None:
                    self._nodes.pop(name, None)
                else:
                    self._nodes[name] = node
            self._received = update.generation
            self._filed += 1
            self._changed.notify()

    # --- the reader side -------------------------------------------------------------------

    def current(self) -> ViewSnapshot | None:
        """The newest published view (None until the first build)."""
        return self._current

    @property
    def received_generation(self) -> int:
        """The newest generation the feed delivered (-1: none yet)."""
        return self._received

    def require(self, min_generation: int = 0, timeout: float | None = 0.0) -> ViewSnapshot:
        """The current view, waiting up to `timeout` seconds (None: forever) for one at
        `min_generation` or later. Raises Unavailable when there is none in time, or at once
        when `max_waiters` calls already wait (each holds a server thread while it waits)."""
        current = self._current
        if current is not None and current.generation >= min_generation:
            return current
        with self._published:
            if timeout != 0.0 and self._waiters >= self._max_waiters:
                raise Unavailable(
                    f"{self._waiters} calls already wait for a newer inventory generation (at "
                    f"most {self._max_waiters} wait at once); retry shortly"
                )
            self._waiters += 1
            try:
                self._published.wait_for(
                    lambda: (
                        self._closed
                        or (
                            self._current is not None and self._current.generation >= min_generation
                        )
                    ),
                    timeout,
                )
            finally:
                self._waiters -= 1
            current = self._current
        if current is None:
            raise Unavailable("the allocator has no inventory snapshot yet; retry shortly")
        if current.generation < min_generation:
            raise Unavailable(
                f"inventory generation {min_generation} not reached in time "
                f"(the allocator is at {current.generation}); retry shortly"
            )
        return current

    def flush(self, timeout: float = 5.0) -> ViewSnapshot:
        """Wait until everything received so far is published (tests, start-up)."""
        deadline = time.monotonic() + timeout
        with self._published:
            self._published.wait_for(
                lambda: self._closed or self._attempted == self._filed,
                max(0.0, deadline - time.monotonic()),
            )
        return self.require(0)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._changed.notify_all()
            self._published.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    # --- the builder thread ----------------------------------------------------------------

    def _run(self) -> None:
        last_start = -float("inf")
        pause = 0.0
        while True:
            with self._lock:
                self._changed.wait_for(lambda: self._filed > self._attempted or self._closed)
                if self._closed:
                    return
            wait = last_start + pause - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # coalesce: updates arriving meanwhile join this build
            with self._lock:
                if self._closed:
                    return
                slices = [s for key in sorted(self._slices) for s in self._slices[key]]
                nodes = list(self._nodes.values())
                topologies = dict(self._topologies)
                generation = self._received
                filed = self._filed
            last_start = time.monotonic()
            view = self._build(generation, slices, nodes, topologies)
            pause = max(self._min_interval, time.monotonic() - last_start)
            with self._lock:
                self._attempted = filed
                if view is not None:
                    self._current = view
                    self.builds += 1
                self._published.notify_all()
            if view is not None and self._on_publish is not None:
                self._on_publish(view)

    def _build(
        self,
        generation: int,
        slices: list[ResourceSlice],
        nodes: list[Node],
        topologies: dict[str, NodeTopology],
    ) -> ViewSnapshot | None:
        started = time.perf_counter()
        try:
            snapshot = ClusterSnapshot.build(
                slices, nodes, topologies=topologies, binding_conditions=self._binding_conditions
            )
        except Exception:
            # Bad data from the feed must not kill the builder: keep serving the last view.
            log.exception("cannot index inventory generation %d; keeping the last view", generation)
            return None
        seconds = time.perf_counter() - started
        devices = sum(len(s.devices) for s in slices)
        log.debug(
            "indexed inventory",
            extra={"generation": generation, "devices": devices, "seconds": round(seconds, 4)},
        )
        return ViewSnapshot(generation, snapshot, devices, seconds)
