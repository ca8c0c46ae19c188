"""Inventory use cases: apply and delete slices, record node reports, publish one versioned view.

The state is an immutable `InventoryState` swapped under a lock, so readers (GetInventory, the
in-process allocator, watchers) take a snapshot without blocking writers. Each change is saved
to the repository *before* it is published: when the save fails the caller gets the error and
nobody saw the change. Watchers do not own queues: each one remembers the generation it has
delivered and, when woken, reads the changes since then from the shared bounded log. A slow
watcher therefore costs no memory; it receives the *current* view of the nodes that changed
(deltas coalesce), or a reset with a full snapshot when the log no longer reaches back.

A sweeper thread marks reports older than the TTL stale (`start_sweeper`); the staleness rule
itself is the pure `mark_stale`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from services.common.dra.model import Node, ResourceSlice
from services.common.dra.validate import validate_resource_slice
from services.common.errors import PermissionDenied, ResourceExhausted
from services.inventory.config import DEFAULT_MAX_NODES
from services.inventory.core.checks import MAX_OBJECTS_PER_APPLY, check_apply
from services.inventory.core.report import NodeReport
from services.inventory.core.repository import InventoryRepository
from services.inventory.core.state import (
    Change,
    InventoryState,
    PoolStatus,
    apply,
    changes_since,
    delete_slices,
    mark_stale,
    pool_status,
    record_report,
)
from services.inventory.core.view import NodeView

__all__ = ["DEFAULT_REPORT_TTL", "ApplyResult", "InventoryService", "ReportResult", "WatchEvent"]

Listener = Callable[[InventoryState, Change], None]
Clock = Callable[[], float]
DEFAULT_REPORT_TTL = 120.0


@dataclass(frozen=True)
class ApplyResult:
    generation: int
    applied: tuple[str, ...]
    unchanged: tuple[str, ...]
    pools: tuple[PoolStatus, ...]  # the pools of the nodes the request touched
    warnings: tuple[str, ...] = ()
    unchanged_nodes: tuple[str, ...] = ()  # Nodes already there with the same labels


@dataclass(frozen=True)
class ReportResult:
    generation: int
    view: NodeView  # matched, synthesized, taints and warnings of the node after the report
    unchanged: bool = False  # the node's last report said the same: only its TTL was refreshed


@dataclass(frozen=True)
class WatchEvent:
    """`reset`: `nodes` holds every node key and the receiver replaces its whole view.
    `heartbeat`: nothing changed for a while. Otherwise `nodes` lists the changed node keys;
    their current views are in `state`."""

    state: InventoryState
    nodes: frozenset[str]
    reset: bool
    heartbeat: bool = False


class InventoryService:
    def __init__(
        self,
        state: InventoryState | None = None,
        *,
        repository: InventoryRepository | None = None,
        clock: Clock = time.time,
        report_ttl: float = DEFAULT_REPORT_TTL,
        max_objects_per_apply: int = MAX_OBJECTS_PER_APPLY,
        max_nodes: int | None = DEFAULT_MAX_NODES,
    ) -> None:
        self._state = state or InventoryState()
        self._repository = repository
        self._clock = clock
        self.report_ttl = report_ttl
        self._max_objects = max_objects_per_apply
        self.max_nodes = max_nodes  # None: no limit
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._listeners: list[Listener] = []
        self._closed = False
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    # --- reads ------------------------------------------------------------------------

    def snapshot(self) -> InventoryState:
        return self._state

    @property
    def generation(self) -> int:
        return self._state.generation

    # --- writes -----------------------------------------------------------------------

    def apply(
        self, slices: Sequence[ResourceSlice], nodes: Sequence[Node] = (), dry_run: bool = False
    ) -> ApplyResult:
        """Validate every slice, then apply slices and Nodes in one generation (or nothing)."""
        check_apply(slices, nodes, self._max_objects)
        for index, resource_slice in enumerate(slices):
            validate_resource_slice(resource_slice, path=f"slices[{index}]")
        with self._lock:
            before = self._state
            after, change = apply(before, slices, nodes)
            self._check_node_limit(before, after)
            applied: list[str] = []
            unchanged: list[str] = []
            for s in slices:
                key = before.slice_keys.get(s.name)
                same = key is not None and before.entries[key].slices.get(s.name) == s
                (unchanged if same else applied).append(s.name)
            if not dry_run:
                self._publish(after, change)
            touched = change.nodes if change else frozenset()
            pools = pool_status(s for key in touched for s in after.slices_of(key))
            generation = before.generation if dry_run else after.generation
            same_nodes = [
                n.name for n in nodes if (e := before.entries.get(n.name)) and e.node == n
            ]
            return ApplyResult(
                generation,
                tuple(sorted(applied)),
                tuple(sorted(unchanged)),
                pools,
                _old_generation_warnings(slices, pools),
                tuple(sorted(same_nodes)),
            )

    def apply_slices(self, slices: Sequence[ResourceSlice], dry_run: bool = False) -> ApplyResult:
        return self.apply(slices, (), dry_run)

    def apply_nodes(self, nodes: Sequence[Node]) -> int:
        return self.apply((), nodes).generation

    def sync_slices(self, slices: Sequence[ResourceSlice], delete: Iterable[str] = ()) -> int:
        """Create or replace `slices` and remove the slices named in `delete` that exist, in one
        generation (or nothing): for a source that mirrors another store (the Kubernetes watch,
        adapters/sources/kube_slices.py). No request size limit; a name in both is replaced. Returns
        the generation after the change."""
        check_apply(slices, (), None)
        for index, resource_slice in enumerate(slices):
            validate_resource_slice(resource_slice, path=f"slices[{index}]")
        with self._lock:
            after, change = apply(self._state, slices, (), delete=delete)
            self._publish(after, change)
            return after.generation

    def delete_slices(self, names: Sequence[str]) -> int:
        with self._lock:
            after, change = delete_slices(self._state, names)
            self._publish(after, change)
            return after.generation

    def report(self, report: NodeReport, *, published_only: bool = False) -> ReportResult:
        """Record a node's report (observed now, on the service's clock). `published_only`:
        refused (PermissionDenied, nothing recorded) when it describes a GPU none of the
        node's ResourceSlices publish, which would become a synthesized device."""
        with self._lock:
            after, change = record_report(self._state, report, self._clock())
            if published_only:
                _check_published(after.view(report.node), report)
            self._check_node_limit(self._state, after)
            if change is None:
                self._state = after  # only the node's observed time moved
            else:
                self._publish(after, change)
            view = after.view(report.node)
            assert view is not None
            return ReportResult(after.generation, view, unchanged=change is None)

    def _check_node_limit(self, before: InventoryState, after: InventoryState) -> None:
        """ResourceExhausted when a change would grow the inventory past its node limit (a
        change that adds no node passes even when an operator lowered the limit below the
        count): made-up node names cannot grow the state, its views and watches without bound."""
        limit = self.max_nodes
        if limit is None or after.node_count <= max(limit, before.node_count):
            return
        raise ResourceExhausted(
            f"the inventory holds at most {limit:,} nodes (GPUALLOC_INVENTORY_MAX_NODES); this "
            f"change would make {after.node_count:,} (it holds {before.node_count:,})"
        )

    def sweep(self) -> Change | None:
        """Mark stale the reports older than the TTL; returns the change, if any."""
        with self._lock:
            after, change = mark_stale(self._state, self._clock(), self.report_ttl)
            if change is None:
                self._state = after
            else:
                self._publish(after, change)
            return change

    def _publish(self, state: InventoryState, change: Change | None) -> None:
        """Called with the lock held: save, then make the change visible."""
        if change is None:
            return
        if self._repository is not None:
            self._repository.save(state, change)
        self._state = state
        self._changed.notify_all()
        for listener in self._listeners:
            listener(state, change)

    # --- background -------------------------------------------------------------------

    def start_sweeper(self, interval: float) -> None:
        """Run `sweep` every `interval` seconds until `close`."""
        if self._sweeper is not None:
            return

        def loop() -> None:
            while not self._stop.wait(interval):
                self.sweep()

        self._sweeper = threading.Thread(target=loop, name="inventory-sweeper", daemon=True)
        self._sweeper.start()

    # --- following ----------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> InventoryState:
        """Call `listener(state, change)` after every change (under the write lock, so keep it
        quick); returns the current state to start from, atomically with the subscription."""
        with self._lock:
            self._listeners.append(listener)
            return self._state

    def watch(
        self,
        from_generation: int = -1,
        *,
        wait_seconds: float = 1.0,
        heartbeat_seconds: float | None = None,
        min_interval: float = 0.0,
        is_active: Callable[[], bool] = lambda: True,
    ) -> Iterator[WatchEvent]:
        """Events from `from_generation` on: a reset first unless resuming within the log, then
        deltas (at most one per `min_interval`: changes in between merge into one), and a
        heartbeat after `heartbeat_seconds` of silence. Ends when the service closes or
        `is_active()` turns false (checked every `wait_seconds`)."""
        state = self._state
        delivered = from_generation
        if (
            from_generation < 0
            or from_generation > state.generation  # the watcher saw a previous incarnation
            or changes_since(state, from_generation) is None
        ):
            yield WatchEvent(state, state.node_keys(), reset=True)
            delivered = state.generation
        last_sent = time.monotonic()
        while is_active():
            due = None if heartbeat_seconds is None else last_sent + heartbeat_seconds
            state, why = self._next_state(delivered, due, last_sent + min_interval, wait_seconds)
            if why == "closed" or not is_active():
                return
            if why == "idle":
                continue
            if why == "heartbeat":
                yield WatchEvent(state, frozenset(), reset=False, heartbeat=True)
            else:
                changes = changes_since(state, delivered)
                if changes is None:
                    yield WatchEvent(state, state.node_keys(), reset=True)
                else:
                    touched = frozenset().union(*(c.nodes for c in changes))
                    yield WatchEvent(state, touched, reset=False)
                delivered = state.generation
            last_sent = time.monotonic()

    def _next_state(
        self, delivered: int, heartbeat_due: float | None, not_before: float, wait_seconds: float
    ) -> tuple[InventoryState, str]:
        """Wait for a state newer than `delivered` ("changed"; not before `not_before`, so that
        close changes merge), for `heartbeat_due` ("heartbeat"), for `wait_seconds` ("idle": the
        caller checks that its client is still there), or for the service to close ("closed")."""
        with self._lock:
            deadline = time.monotonic() + wait_seconds
            while self._state.generation <= delivered and not self._closed:
                now = time.monotonic()
                if heartbeat_due is not None and now >= heartbeat_due:
                    return self._state, "heartbeat"
                if now >= deadline:
                    return self._state, "idle"
                until = deadline if heartbeat_due is None else min(deadline, heartbeat_due)
                self._changed.wait(until - now)
            pause = not_before - time.monotonic()
            if pause > 0 and not self._closed:
                self._changed.wait(pause)  # let more changes join this delta
            return self._state, "closed" if self._closed else "changed"

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._closed = True
            self._changed.notify_all()
        if self._sweeper is not None:
            self._sweeper.join(timeout=5)
        if self._repository is not None:
            self._repository.close()


def _old_generation_warnings(
    slices: Sequence[ResourceSlice], pools: Sequence[PoolStatus]
) -> tuple[str, ...]:
    newest = {(p.driver, p.pool): p.generation for p in pools}
    warnings = []
    for s in slices:
        current = newest.get((s.driver, s.pool.name))
        if current is not None and s.pool.generation < current:
            warnings.append(
                f"slice {s.name}: pool {s.pool.name} generation {s.pool.generation} "
                f"is older than {current}, ignored"
            )
    return tuple(sorted(warnings))


def _check_published(view: NodeView | None, report: NodeReport) -> None:
    """PermissionDenied when `report` would add devices no slice of its node publishes."""
    made = view.synthesized if view is not None else ()
    if made:
        shown = ", ".join(d.device for d in made[:5]) + (" ..." if len(made) > 5 else "")
        raise PermissionDenied(
            f"node {report.node}: {len(made)} reported device(s) no ResourceSlice of the node "
            f"publishes ({shown}); this agent may report only published GPUs (its binding's "
            "reportedGpus: published)"
        )
