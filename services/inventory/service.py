"""Inventory use cases: apply and delete slices, register nodes, publish one versioned view.

The state is an immutable `InventoryState` swapped under a lock, so readers (GetInventory, the
in-process allocator, watchers) take a snapshot without blocking writers. Watchers do not own
queues: each one remembers the generation it has delivered and, when woken, reads the changes
since then from the shared bounded log. A slow watcher therefore costs no memory; it receives the
*current* content of the nodes that changed (deltas coalesce), or a reset with a full snapshot
when the log no longer reaches back to its generation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from services.common.dra.model import Node, ResourceSlice
from services.common.dra.validate import validate_resource_slice
from services.inventory.core.state import (
    Change,
    InventoryState,
    PoolStatus,
    apply_nodes,
    apply_slices,
    changes_since,
    delete_slices,
    pool_status,
)

__all__ = ["ApplyResult", "InventoryService", "WatchEvent"]

Listener = Callable[[InventoryState, Change], None]


@dataclass(frozen=True)
class ApplyResult:
    generation: int
    applied: tuple[str, ...]
    unchanged: tuple[str, ...]
    pools: tuple[PoolStatus, ...]


@dataclass(frozen=True)
class WatchEvent:
    """`reset`: `nodes` holds every node key and the receiver replaces its whole view.
    Otherwise `nodes` lists the changed node keys; their current slices are in `state`."""

    state: InventoryState
    nodes: frozenset[str]
    reset: bool


class InventoryService:
    def __init__(self, state: InventoryState | None = None) -> None:
        self._state = state or InventoryState()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._listeners: list[Listener] = []
        self._closed = False

    # --- reads ------------------------------------------------------------------------

    def snapshot(self) -> InventoryState:
        return self._state

    @property
    def generation(self) -> int:
        return self._state.generation

    # --- writes -----------------------------------------------------------------------

    def apply_slices(self, slices: Sequence[ResourceSlice], dry_run: bool = False) -> ApplyResult:
        """Validate every slice, then apply all of them in one generation (or none)."""
        for index, resource_slice in enumerate(slices):
            validate_resource_slice(resource_slice, path=f"slices[{index}]")
        with self._lock:
            before = self._state
            after, change = apply_slices(before, slices)
            applied = tuple(s.name for s in slices if before.slices.get(s.name) != s)
            unchanged = tuple(s.name for s in slices if before.slices.get(s.name) == s)
            if not dry_run:
                self._publish(after, change)
            pools = pool_status(after.slices.values())
            return ApplyResult(
                after.generation if not dry_run else before.generation, applied, unchanged, pools
            )

    def delete_slices(self, names: Sequence[str]) -> int:
        with self._lock:
            after, change = delete_slices(self._state, names)
            self._publish(after, change)
            return after.generation

    def apply_nodes(self, nodes: Sequence[Node]) -> int:
        with self._lock:
            after, change = apply_nodes(self._state, nodes)
            self._publish(after, change)
            return after.generation

    def _publish(self, state: InventoryState, change: Change | None) -> None:
        """Called with the lock held."""
        if change is None:
            return
        self._state = state
        self._changed.notify_all()
        for listener in self._listeners:
            listener(state, change)

    # --- following ------------------------------------------------------------------------

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
        is_active: Callable[[], bool] = lambda: True,
    ) -> Iterator[WatchEvent]:
        """Events from `from_generation` on: a reset first unless resuming within the log, then
        deltas. Ends when the service closes or `is_active()` turns false (checked every
        `wait_seconds`, so a cancelled RPC never pins a thread for long)."""
        state = self._state
        delivered = from_generation
        if (
            from_generation < 0
            or from_generation > state.generation  # the watcher saw a previous incarnation
            or changes_since(state, from_generation) is None
        ):
            yield WatchEvent(state, state.node_keys(), reset=True)
            delivered = state.generation
        while is_active():
            with self._lock:
                while self._state.generation <= delivered and not self._closed:
                    self._changed.wait(wait_seconds)
                    if not is_active():
                        return
                if self._closed:
                    return
                state = self._state
            changes = changes_since(state, delivered)
            if changes is None:
                yield WatchEvent(state, state.node_keys(), reset=True)
            else:
                touched = frozenset().union(*(c.nodes for c in changes))
                yield WatchEvent(state, touched, reset=False)
            delivered = state.generation

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._changed.notify_all()
