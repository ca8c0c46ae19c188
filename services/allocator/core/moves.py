"""Where a moved reservation goes: consolidation's devices (preemption rule 3, beyond Kueue).

A grant within its tenant's nominal quota may find the free devices spread over nodes, none
with room. Consolidation then moves reservations of a movable priority class to *equivalent*
free devices on other nodes (KAI Scheduler's Consolidate action); the planner
(core/preemption.py, `plan_consolidation`) chooses the node and who moves, this module the
devices they move to.

Only a reservation of exactly one node-local device (a MIG slice, a whole GPU; not a share of
a device, not admin access, not a gang's member) is movable: the allocator keeps a
reservation's result, not its request, and for one device "the same request" is "a device
nobody could tell apart by what a request can select". Equivalent: the same driver, the same
attributes apart from the device's identity (`IDENTITY`: uuid, parent uuid, PCI addresses,
indexes), the same capacities, the same sharing mode, and counters of the same kinds consumed
in the same amounts (a 1g slice at another position of its GPU takes `memory-slice-3`, not
`-0`); and no taint the original's tolerations do not tolerate. Nodes are not compared: a
class marked `movable` in the access policy says its holders accept any node.

Pure: values in, values out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from services.allocator.core.candidates import untolerated_taint
from services.allocator.core.nodeselect import allocation_node_selector
from services.allocator.core.snapshot import ClusterSnapshot, DeviceEntry
from services.allocator.core.state import AllocatedState
from services.common.dra.model import AllocationResult, DeviceToleration

__all__ = ["IDENTITY", "Move", "Movable", "device_group", "movable_device", "place_moves"]

# Attributes that name one device rather than describe it (their local names, any domain).
IDENTITY = frozenset(
    {"uuid", "parentUUID", "pciBusID", "pcieRoot", "index", "minor", "parentIndex", "parentMinor"}
)

_TRAILING_INDEX = re.compile(r"-?[0-9]+$")


@dataclass(frozen=True)
class Movable:
    """A reservation as a move sees it: its id, holder, node and allocations."""

    id: str
    owner: str
    node: str
    allocations: tuple[AllocationResult, ...]


@dataclass(frozen=True)
class Move:
    """A reservation moved: its id, and the node and allocation its replacement holds."""

    id: str
    node: str
    allocation: AllocationResult


def movable_device(snapshot: ClusterSnapshot, held: Movable) -> DeviceEntry | None:
    """The one node-local device `held` holds, or None when it is not movable."""
    if len(held.allocations) != 1 or len(held.allocations[0].results) != 1:
        return None
    result = held.allocations[0].results[0]
    if result.admin_access or result.share_id or result.consumed_capacity:
        return None
    entry = snapshot.device(result.device_id)
    if entry is None or entry.multi or entry.access.node_name != held.node:
        return None
    return entry


def device_group(entry: DeviceEntry) -> str:
    """The GPU a device is part of: the counter set it consumes (itself when it consumes
    none)."""
    for counter, _ in entry.counters:
        return f"{counter.driver}/{counter.pool}/{counter.counter_set}"
    return str(entry.id)


def place_moves(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    held: Sequence[Movable],
    away_from: str,
) -> list[Move] | None:
    """A device for each of `held` on a node other than `away_from`, each equivalent to the
    one it holds and free in `state` (which already holds whatever the moves make room for)
    and in the moves placed before it; the largest first, each on the fullest GPU that takes
    it (as the fragmentation-aware search packs). None when one finds no device."""
    index = snapshot.derived(_equivalents)
    entries = {h.id: movable_device(snapshot, h) for h in held}
    order = sorted(held, key=lambda h: (-_size(entries[h.id]), h.id))
    moves: list[Move] = []
    for each in order:
        entry = entries[each.id]
        if entry is None:
            return None
        tolerations = each.allocations[0].results[0].tolerations
        target = _best_free(state, index.get(_key(entry), ()), away_from, tolerations)
        if target is None:
            return None
        node = target.access.node_name or ""
        allocation = _moved(each.allocations[0], target, node)
        state = state.with_changes([(None, each.owner, allocation)])
        moves.append(Move(each.id, node, allocation))
    return moves


def _size(entry: DeviceEntry | None) -> Fraction:
    return entry.size if entry is not None else Fraction(0)


def _best_free(
    state: AllocatedState,
    entries: Iterable[DeviceEntry],
    away_from: str,
    tolerations: tuple[DeviceToleration, ...],
) -> DeviceEntry | None:
    best: tuple[Fraction, int, DeviceEntry] | None = None
    for entry in entries:
        if entry.access.node_name in (None, "", away_from) or state.in_use(entry.id):
            continue
        if untolerated_taint(entry, tolerations) is not None:
            continue  # what Allocate's candidates refuse: a taint the original did not tolerate
        used = Fraction(0)
        fits = True
        for (counter, _), amount in zip(entry.counters, entry.amounts, strict=True):
            taken = state.counter_amount(counter)
            if taken + amount > entry.slice.totals.get(counter, 0):
                fits = False
                break
            used += Fraction(taken) / max(Fraction(1), entry.slice.counter_totals[counter])
        if not fits:
            continue
        rank = (-used, entry.position, entry)
        if best is None or rank[:2] < best[:2]:
            best = rank
    return best[2] if best is not None else None


def _moved(allocation: AllocationResult, target: DeviceEntry, node: str) -> AllocationResult:
    result = allocation.results[0]
    moved = replace(result, driver=target.id.driver, pool=target.id.pool, device=target.id.device)
    return replace(
        allocation,
        results=(moved,),
        node_selector=allocation_node_selector([target.access], node),
    )


def _key(entry: DeviceEntry) -> tuple[object, ...]:
    device = entry.device
    attributes = tuple(
        sorted(
            (name, value.type, str(value.value))
            for name, value in device.attributes.items()
            if name.rsplit("/", 1)[-1] not in IDENTITY
        )
    )
    capacity = tuple(sorted((name, c.value) for name, c in device.capacity.items()))
    counters = tuple(  # by kind: a slice at another position consumes memory-slice-3, not -0
        sorted(
            (_TRAILING_INDEX.sub("", counter.counter), amount) for counter, amount in entry.counters
        )
    )
    return (entry.id.driver, attributes, capacity, counters, entry.multi)


def _equivalents(snapshot: ClusterSnapshot) -> Mapping[tuple[object, ...], list[DeviceEntry]]:
    found: dict[tuple[object, ...], list[DeviceEntry]] = {}
    for entry in snapshot.all_devices():
        if entry.access.node_name:
            found.setdefault(_key(entry), []).append(entry)
    return found
