"""The inventory's state: applied ResourceSlices and Nodes, one monotonic generation, a change log.

Pure values. Every operation takes an `InventoryState` and returns a new one plus the `Change`
it made; nothing is half-applied because an operation validates everything before building the
new state. Watchers resume from a generation through `changes_since`; when the bounded log no
longer reaches that far back they get a reset (a full snapshot) instead.

A change is keyed by *node*: the unit the allocator re-indexes. Slices that are not bound to one
node (allNodes, nodeSelector, perDeviceNodeSelection) live under the cluster-wide key "".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from services.common.dra.model import Node, ResourceSlice
from services.common.errors import InvalidArgument, NotFound

__all__ = [
    "CLUSTER_SCOPE",
    "Change",
    "InventoryState",
    "PoolStatus",
    "apply_nodes",
    "apply_slices",
    "changes_since",
    "delete_slices",
    "node_key",
    "pool_status",
]

CLUSTER_SCOPE = ""  # the change key of slices that are not bound to a single node
DEFAULT_LOG_LIMIT = 4096


def node_key(resource_slice: ResourceSlice) -> str:
    """The node a slice belongs to for change tracking, or CLUSTER_SCOPE."""
    return resource_slice.node_name or CLUSTER_SCOPE


@dataclass(frozen=True)
class Change:
    """What one generation changed: the nodes (change keys) whose slices or labels differ."""

    generation: int
    nodes: frozenset[str]
    reason: str  # "apply", "delete", "nodes", "report"


@dataclass(frozen=True)
class InventoryState:
    generation: int = 0
    slices: Mapping[str, ResourceSlice] = field(default_factory=dict)
    nodes: Mapping[str, Node] = field(default_factory=dict)
    log: tuple[Change, ...] = ()
    log_limit: int = DEFAULT_LOG_LIMIT

    def slices_of(self, key: str) -> tuple[ResourceSlice, ...]:
        """The slices under one change key, sorted by name (stable output)."""
        return tuple(s for name, s in sorted(self.slices.items()) if node_key(s) == key)

    def node_keys(self) -> frozenset[str]:
        return frozenset(node_key(s) for s in self.slices.values()) | frozenset(self.nodes)

    def _commit(
        self, touched: Iterable[str], reason: str, **updates: object
    ) -> tuple[InventoryState, Change]:
        generation = self.generation + 1
        change = Change(generation, frozenset(touched), reason)
        log = (*self.log, change)[-self.log_limit :]
        new_state = replace(self, generation=generation, log=log, **updates)  # type: ignore[arg-type]
        return new_state, change


def apply_slices(
    state: InventoryState, slices: Sequence[ResourceSlice]
) -> tuple[InventoryState, Change | None]:
    """Create or replace slices by name, atomically; no new generation when nothing differs."""
    seen: dict[str, int] = {}
    for index, resource_slice in enumerate(slices):
        if resource_slice.name in seen:
            first = seen[resource_slice.name]
            raise InvalidArgument.at(
                f"slices[{index}].metadata.name",
                f"duplicate slice name {resource_slice.name!r} (also slices[{first}])",
            )
        seen[resource_slice.name] = index
    touched: set[str] = set()
    updated = dict(state.slices)
    for resource_slice in slices:
        previous = updated.get(resource_slice.name)
        if previous == resource_slice:
            continue
        if previous is not None:
            touched.add(node_key(previous))
        touched.add(node_key(resource_slice))
        updated[resource_slice.name] = resource_slice
    if not touched:
        return state, None
    return state._commit(touched, "apply", slices=updated)


def delete_slices(
    state: InventoryState, names: Sequence[str]
) -> tuple[InventoryState, Change | None]:
    """Delete slices by name, atomically: a missing name fails the whole call (NotFound)."""
    missing = sorted(set(names) - set(state.slices))
    if missing:
        raise NotFound(f"resourceslices not found: {', '.join(missing)}")
    if not names:
        return state, None
    updated = dict(state.slices)
    touched = {node_key(updated.pop(name)) for name in set(names)}
    return state._commit(touched, "delete", slices=updated)


def apply_nodes(
    state: InventoryState, nodes: Sequence[Node]
) -> tuple[InventoryState, Change | None]:
    """Create or replace Node objects (name + labels), atomically."""
    updated = dict(state.nodes)
    touched = set()
    for node in nodes:
        if updated.get(node.name) != node:
            updated[node.name] = node
            touched.add(node.name)
    if not touched:
        return state, None
    return state._commit(touched, "nodes", nodes=updated)


def changes_since(state: InventoryState, generation: int) -> tuple[Change, ...] | None:
    """The changes after `generation`, oldest first; None when the log no longer reaches back
    that far (the watcher must take a full snapshot)."""
    if generation >= state.generation:
        return ()
    if generation < 0:
        return None
    newer = tuple(c for c in state.log if c.generation > generation)
    if not newer or newer[0].generation != generation + 1:
        return None
    return newer


@dataclass(frozen=True)
class PoolStatus:
    """One pool as the allocator will see it: only the highest generation counts."""

    driver: str
    pool: str
    generation: int
    resource_slice_count: int
    slices: int  # slices present at that generation
    stale_slices: int  # slices of older generations, ignored
    duplicate_devices: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return self.slices == self.resource_slice_count

    @property
    def valid(self) -> bool:
        return not self.duplicate_devices


def pool_status(slices: Iterable[ResourceSlice]) -> tuple[PoolStatus, ...]:
    """Pool completeness and validity, as upstream's GatherPools judges them; sorted by pool."""
    by_pool: dict[tuple[str, str], list[ResourceSlice]] = {}
    for resource_slice in slices:
        by_pool.setdefault((resource_slice.driver, resource_slice.pool.name), []).append(
            resource_slice
        )
    result = []
    for (driver, pool), members in sorted(by_pool.items()):
        newest = max(s.pool.generation for s in members)
        current = [s for s in members if s.pool.generation == newest]
        names: set[str] = set()
        duplicates: set[str] = set()
        for resource_slice in current:
            for device in resource_slice.devices:
                (duplicates if device.name in names else names).add(device.name)
        result.append(
            PoolStatus(
                driver=driver,
                pool=pool,
                generation=newest,
                resource_slice_count=current[0].pool.resource_slice_count,
                slices=len(current),
                stale_slices=len(members) - len(current),
                duplicate_devices=tuple(sorted(duplicates)),
            )
        )
    return tuple(result)
