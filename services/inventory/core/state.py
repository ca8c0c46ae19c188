"""The inventory's state: applied ResourceSlices, Nodes and NVML reports per node, one monotonic
generation, a bounded change log.

Pure values. Every operation takes an `InventoryState` and returns a new one plus the `Change`
it made (None when nothing visible changed); nothing is half-applied because an operation checks
everything before building the new state. Watchers resume from a generation through
`changes_since`; when the bounded log no longer reaches that far back they get a reset.

The state is keyed by *node* (the unit an allocator re-indexes): each key holds a `NodeEntry`
with that node's applied slices, Node object, latest report and the effective `NodeView` built
from them. A change rebuilds only the entries it touches and copies only the top-level map, so
the cost of an update does not grow with the number of devices in the cluster. Slices that are
not bound to one node (allNodes, nodeSelector, perDeviceNodeSelection) live under the key "".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from services.common.dra.model import Node, ResourceSlice
from services.common.errors import NotFound, clip
from services.inventory.core.checks import check_apply, check_report
from services.inventory.core.persistent import ChunkedLog, ShardedMap
from services.inventory.core.pools import PoolStatus, pool_status
from services.inventory.core.report import NodeReport
from services.inventory.core.view import NodeView, ReportRecord, build_view

__all__ = [
    "CLUSTER_SCOPE",
    "Change",
    "InventoryState",
    "NodeEntry",
    "PoolStatus",
    "ReportRecord",
    "apply",
    "apply_nodes",
    "apply_slices",
    "changes_since",
    "delete_slices",
    "mark_stale",
    "node_key",
    "pool_status",
    "record_report",
    "refresh_observed",
    "restore",
    "rfc3339",
]

CLUSTER_SCOPE = ""  # the change key of slices that are not bound to a single node
DEFAULT_LOG_LIMIT = 4096


def node_key(resource_slice: ResourceSlice) -> str:
    """The node a slice belongs to for change tracking, or CLUSTER_SCOPE."""
    return resource_slice.node_name or CLUSTER_SCOPE


@dataclass(frozen=True)
class Change:
    """What one generation changed: the node keys whose view differs."""

    generation: int
    nodes: frozenset[str]
    reason: str  # "apply", "delete", "report", "stale"


@dataclass(frozen=True)
class NodeEntry:
    """Everything known about one node key, and the view built from it."""

    view: NodeView
    slices: Mapping[str, ResourceSlice] = field(default_factory=dict)
    node: Node | None = None
    record: ReportRecord | None = None

    @property
    def empty(self) -> bool:
        return not self.slices and self.node is None and self.record is None


def _entry(
    key: str,
    slices: Mapping[str, ResourceSlice],
    node: Node | None,
    record: ReportRecord | None,
    before: NodeEntry | None,
) -> NodeEntry:
    """Build the entry; the synthesized pool's generation bumps when its device set changes."""
    previous = before.view if before is not None else None
    view = build_view(key, slices, node, record, previous)
    if (
        record is not None
        and before is not None
        and before.record is not None
        and view.synthesized != before.view.synthesized
    ):
        record = replace(record, pool_generation=before.record.pool_generation + 1)
        view = build_view(key, slices, node, record, previous)
    return NodeEntry(view, slices, node, record)


@dataclass(frozen=True)
class InventoryState:
    generation: int = 0
    entries: ShardedMap[str, NodeEntry] = field(default_factory=ShardedMap)
    slice_keys: ShardedMap[str, str] = field(default_factory=ShardedMap)  # slice -> node key
    log: ChunkedLog[Change] = field(default_factory=lambda: ChunkedLog(DEFAULT_LOG_LIMIT))

    # --- reads --------------------------------------------------------------------------

    @property
    def slices(self) -> dict[str, ResourceSlice]:
        """Every applied slice by name (a fresh dict: O(slices))."""
        return {n: s for e in self.entries.values() for n, s in e.slices.items()}

    @property
    def nodes(self) -> dict[str, Node]:
        return {k: e.node for k, e in self.entries.items() if e.node is not None}

    @property
    def reports(self) -> dict[str, ReportRecord]:
        return {k: e.record for k, e in self.entries.items() if e.record is not None}

    def slices_of(self, key: str) -> tuple[ResourceSlice, ...]:
        """The applied slices under one key, sorted by name."""
        entry = self.entries.get(key)
        return () if entry is None else tuple(entry.slices[n] for n in sorted(entry.slices))

    def view(self, key: str) -> NodeView | None:
        entry = self.entries.get(key)
        return None if entry is None else entry.view

    def node_keys(self) -> frozenset[str]:
        return frozenset(self.entries)

    @property
    def node_count(self) -> int:
        """Nodes held (the cluster-scoped slices' key is not a node); O(1)."""
        return len(self.entries) - (CLUSTER_SCOPE in self.entries)

    # --- writes -------------------------------------------------------------------------

    def _commit(
        self, updated: Mapping[str, NodeEntry | None], reason: str, **extra: object
    ) -> tuple[InventoryState, Change]:
        entries = self.entries.updated(
            {k: None if e is None or e.empty else e for k, e in updated.items()}
        )
        generation = self.generation + 1
        change = Change(generation, frozenset(updated), reason)
        new_state = replace(
            self,
            generation=generation,
            entries=entries,
            log=self.log.append(change),
            **extra,  # type: ignore[arg-type]
        )
        return new_state, change


def apply(
    state: InventoryState,
    slices: Sequence[ResourceSlice],
    nodes: Sequence[Node] = (),
    *,
    delete: Iterable[str] = (),
) -> tuple[InventoryState, Change | None]:
    """Create or replace slices (by name) and Nodes, and remove the slices named in `delete`
    that exist (others are ignored; a name that is also in `slices` is replaced, not removed),
    atomically, in one generation; None when nothing differs. Slices must be validated by the
    caller (validate_resource_slice)."""
    check_apply(slices, nodes, max_objects=None)
    parts: dict[str, tuple[dict[str, ResourceSlice], Node | None]] = {}

    def part(key: str) -> tuple[dict[str, ResourceSlice], Node | None]:
        if key not in parts:
            entry = state.entries.get(key)
            parts[key] = (dict(entry.slices), entry.node) if entry else ({}, None)
        return parts[key]

    slice_keys: dict[str, str | None] = {}
    for resource_slice in slices:
        key = node_key(resource_slice)
        previous_key = state.slice_keys.get(resource_slice.name)
        if previous_key is not None:
            if state.entries[previous_key].slices.get(resource_slice.name) == resource_slice:
                continue
            del part(previous_key)[0][resource_slice.name]
        part(key)[0][resource_slice.name] = resource_slice
        slice_keys[resource_slice.name] = key
    kept = {s.name for s in slices}
    for name in delete:
        previous_key = state.slice_keys.get(name)
        if previous_key is not None and name not in kept and name not in slice_keys:
            del part(previous_key)[0][name]
            slice_keys[name] = None
    for node in nodes:
        entry = state.entries.get(node.name)
        if entry is None or entry.node != node:
            parts[node.name] = (part(node.name)[0], node)
    if not parts:
        return state, None
    updated = {}
    for key, (key_slices, key_node) in parts.items():
        before = state.entries.get(key)
        record = before.record if before else None
        updated[key] = _entry(key, key_slices, key_node, record, before)
    return state._commit(updated, "apply", slice_keys=state.slice_keys.updated(slice_keys))


def apply_slices(
    state: InventoryState, slices: Sequence[ResourceSlice]
) -> tuple[InventoryState, Change | None]:
    return apply(state, slices)


def apply_nodes(
    state: InventoryState, nodes: Sequence[Node]
) -> tuple[InventoryState, Change | None]:
    return apply(state, (), nodes)


def delete_slices(
    state: InventoryState, names: Sequence[str]
) -> tuple[InventoryState, Change | None]:
    """Delete slices by name, atomically: a missing name fails the whole call (NotFound)."""
    missing = sorted(set(names) - set(state.slice_keys))
    if missing:
        raise NotFound(f"resourceslices not found: {clip(', '.join(missing))}")
    if not names:
        return state, None
    by_key: dict[str, dict[str, ResourceSlice]] = {}
    slice_keys: dict[str, str | None] = {}
    for name in set(names):
        key = state.slice_keys[name]
        slice_keys[name] = None
        if key not in by_key:
            by_key[key] = dict(state.entries[key].slices)
        del by_key[key][name]
    updated = {}
    for key, key_slices in by_key.items():
        before = state.entries[key]
        updated[key] = _entry(key, key_slices, before.node, before.record, before)
    return state._commit(updated, "delete", slice_keys=state.slice_keys.updated(slice_keys))


def _same_report(a: NodeReport, b: NodeReport) -> bool:
    """Equal but for the observation time: a periodic report that brings nothing new."""
    return a == b or replace(a, timestamp="") == replace(b, timestamp="")


def record_report(
    state: InventoryState, report: NodeReport, observed_at: float
) -> tuple[InventoryState, Change | None]:
    """Keep `report` as the node's latest. A report equal to the previous one but for its
    timestamp only refreshes `observed_at` (no generation, unless it ends a staleness)."""
    check_report(report)
    key = report.node
    before = state.entries.get(key)
    slices = before.slices if before else {}
    node = before.node if before else None
    previous = before.record if before else None
    if previous is not None and _same_report(previous.report, report):
        record = replace(previous, observed_at=observed_at, stale_since=None)
        if not previous.stale:
            assert before is not None
            entries = state.entries.updated({key: replace(before, record=record)})
            return replace(state, entries=entries), None
        return state._commit({key: _entry(key, slices, node, record, before)}, "report")
    generation = previous.pool_generation if previous else 1
    record = ReportRecord(report, observed_at, generation)
    return state._commit({key: _entry(key, slices, node, record, before)}, "report")


def mark_stale(
    state: InventoryState, now: float, ttl: float
) -> tuple[InventoryState, Change | None]:
    """Mark reports older than `ttl` stale (their synthesized devices get the unreachable
    taint). A new generation only when some node's taints change."""
    flipped: dict[str, NodeEntry] = {}
    for key, entry in state.entries.items():
        record = entry.record
        if record is not None and (now - record.observed_at > ttl) != record.stale:
            since = None if record.stale else rfc3339(record.observed_at + ttl)
            stale = replace(record, stale_since=since)
            flipped[key] = _entry(key, entry.slices, entry.node, stale, entry)
    if not flipped:
        return state, None
    visible = {k: e for k, e in flipped.items() if e.view.taints != state.entries[k].view.taints}
    if not visible:
        return replace(state, entries=state.entries.updated(flipped)), None
    new_state, change = state._commit(visible, "stale")
    quiet = {k: e for k, e in flipped.items() if k not in visible}
    if quiet:
        new_state = replace(new_state, entries=new_state.entries.updated(quiet))
    return new_state, change


def rfc3339(seconds: float) -> str:
    """Seconds since the epoch as RFC 3339 UTC, to the second (a taint's timeAdded)."""
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def refresh_observed(state: InventoryState, now: float) -> InventoryState:
    """Every report counts as heard `now`: a restarted inventory gives each node a full TTL
    before calling it stale (its own downtime says nothing about the nodes)."""
    entries = ShardedMap(
        (key, replace(e, record=replace(e.record, observed_at=now)) if e.record else e)
        for key, e in state.entries.items()
    )
    return replace(state, entries=entries)


def restore(
    generation: int,
    slices: Iterable[ResourceSlice],
    nodes: Iterable[Node],
    records: Iterable[ReportRecord],
    log_limit: int = DEFAULT_LOG_LIMIT,
) -> InventoryState:
    """A state rebuilt from persisted parts, at `generation`, with an empty log (watchers that
    resume from an older generation get a reset)."""
    by_key: dict[str, dict[str, ResourceSlice]] = {}
    for resource_slice in slices:
        by_key.setdefault(node_key(resource_slice), {})[resource_slice.name] = resource_slice
    node_by_name = {n.name: n for n in nodes}
    record_by_node = {r.report.node: r for r in records}
    entries = {}
    for key in sorted(set(by_key) | set(node_by_name) | set(record_by_node)):
        key_slices = by_key.get(key, {})
        record = record_by_node.get(key)
        view = build_view(key, key_slices, node_by_name.get(key), record)
        entries[key] = NodeEntry(view, key_slices, node_by_name.get(key), record)
    slice_keys = ShardedMap((name, key) for key, names in by_key.items() for name in names)
    return InventoryState(generation, ShardedMap(entries), slice_keys, ChunkedLog(log_limit))


def changes_since(state: InventoryState, generation: int) -> tuple[Change, ...] | None:
    """The changes after `generation`, oldest first; None when the log no longer reaches back
    that far (the watcher must take a full snapshot)."""
    if generation >= state.generation:
        return ()
    if generation < 0 or not state.log:
        return None
    first = state.log.first().generation
    if generation + 1 < first:
        return None
    return state.log.since(generation + 1 - first)
