"""What a placement leaves free on its node: the full Score of the chosen node.

Free devices need a per-device check (does each device still fit its counters?); for MIG nodes
that is most of a solve's arithmetic, so it is counted slice by slice and memoised on the slice
by its counter use and which of its devices are taken: a GPU state seen before costs a lookup.
Only the nodes an answer shows (the winner, the runner-up) are scored this way; nodes are ranked
by the cheap key (capacity taken, scoring.capacity_key).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from services.allocator.core.candidates import NodeCandidates, SolveContext
from services.allocator.core.plan import Alternative
from services.allocator.core.scoring import Score, measure_counts
from services.allocator.core.snapshot import (
    Amount,
    CounterID,
    DeviceEntry,
    NodeView,
    SliceEntry,
    by_slice,
)
from services.common.dra.model import DeviceID
from services.common.dra.quantity import Quantity

__all__ = ["NodePlacement", "leftover_score"]

_SLICE_MEMO = 256


class _Pick(Protocol):
    @property
    def alternative(self) -> Alternative: ...
    @property
    def entry(self) -> DeviceEntry: ...
    @property
    def consumed(self) -> Mapping[str, Quantity] | None: ...


class NodePlacement(Protocol):
    """What scoring a placement reads of the node search that found it (search.NodeSearch):
    a Protocol here, so that this module does not import the search that calls it."""

    @property
    def ctx(self) -> SolveContext: ...
    @property
    def cands(self) -> NodeCandidates: ...
    @property
    def view(self) -> NodeView: ...
    @property
    def picks(self) -> Sequence[Sequence[_Pick]]: ...
    @property
    def consuming(self) -> set[DeviceID]: ...
    @property
    def totals(self) -> Mapping[CounterID, Amount]: ...

    def counters_used(self) -> dict[CounterID, Amount]: ...
    def ranks(self) -> tuple[int, ...]: ...
    def consuming_device(self, entry: DeviceEntry) -> bool: ...


def leftover_score(search: NodePlacement) -> Score:
    """What the placement found leaves free on its node."""
    held = {
        p.entry.id
        for claim in search.picks
        for p in claim
        if not p.alternative.admin and p.consumed is None
    }
    used = search.counters_used()
    free = plain = 0
    for slice_, entries in by_slice(search.view.devices()):
        slice_free, slice_plain = _slice_free(search, slice_, entries, held, used)
        free += slice_free
        plain += slice_plain
    return measure_counts(search.view.devices(), free, plain, used.__getitem__, search.ranks())


def _slice_free(
    search: NodePlacement,
    slice_: SliceEntry,
    entries: list[DeviceEntry],
    held: set[DeviceID],
    used: dict[CounterID, Amount],
) -> tuple[int, int]:
    """(available devices, available devices without counters) of one slice, memoised
    on the slice by its counter use and which of its devices are taken."""
    state = search.ctx.state
    memo_key: Any = None
    if slice_.counter_totals and not search.consuming.difference(held):
        blocked = frozenset(i for i, e in enumerate(entries) if e.id in held or state.in_use(e.id))
        usage = tuple(used[c] for c in slice_.totals)
        memo_key = ("free", blocked, usage, search.cands.overdrawn(slice_))
        found = slice_.memo.get(memo_key)
        if found is not None:
            return found  # type: ignore[no-any-return]
    available = _availability(search, held, used)
    free = plain = 0
    for entry in entries:
        if available(entry):
            free += 1
            plain += not entry.counters
    if memo_key is not None:
        if len(slice_.memo) >= _SLICE_MEMO:
            slice_.memo.clear()
        slice_.memo[memo_key] = (free, plain)
    return free, plain


def _availability(
    search: NodePlacement, held: set[DeviceID], used: dict[CounterID, Amount]
) -> Callable[[DeviceEntry], bool]:
    state, totals = search.ctx.state, search.totals

    def available(entry: DeviceEntry) -> bool:
        if entry.multi:
            return not state.is_exclusive(entry.id) and entry.id not in held
        if state.in_use(entry.id) or entry.id in held:
            return False
        if not entry.counters or search.consuming_device(entry):
            return True
        fits = all(
            amount <= totals[c] - used[c]
            for (c, _), amount in zip(entry.counters, entry.amounts, strict=True)
        )
        return fits and search.cands.overdrawn(entry.slice) is None

    return available
