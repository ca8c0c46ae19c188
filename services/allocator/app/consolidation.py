"""Consolidation: where a movable reservation goes when its devices are needed on its node.

Rule 3 of the preemption rules (services/common/security/quota.py, docs/tenancy.md) moves a
reservation of a movable priority class to an *equivalent* free device on another node, so
that a grant within its tenant's nominal quota finds a whole node (or whole GPUs) that the
fleet has, spread, but no node holds. This module answers the two questions that need the
fleet: which device of a node a reservation holds (its GPU, to free GPUs emptiest first), and
where it can go.

Only a reservation of exactly one node-local device (a MIG slice, a whole GPU; not a share of
a device, not admin access, not a gang's member) is movable: the allocator keeps no request,
only its result, and for one device "the same request" is "a device nobody could tell apart
by what a request can select". Equivalent: the same driver, the same attributes apart from
the device's identity (`IDENTITY`: uuid, parent uuid, PCI addresses, indexes), the same
capacities, the same sharing mode, and counters of the same kinds consumed in the same
amounts (a 1g slice at another position of its GPU takes `memory-slice-3`, not `-0`); and no
taint the original's tolerations do not tolerate. Nodes are not compared: a class marked
`movable` in the access policy says its holders accept any node (docs/tenancy.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from services.allocator.core import (
    AllocatedState,
    ClusterSnapshot,
    DeviceEntry,
    allocation_node_selector,
    untolerated_taint,
)
from services.allocator.reservations.model import Reservation
from services.common.dra.model import AllocationResult, DeviceToleration

__all__ = ["IDENTITY", "MOVED_FROM_LABEL", "Move", "device_group", "movable_device", "place_moves"]

MOVED_FROM_LABEL = "gpualloc.dev/moved-from"  # on a replacement: the reservation it replaces

# Attributes that name one device rather than describe it (their local names, any domain).
IDENTITY = frozenset(
    {"uuid", "parentUUID", "pciBusID", "pcieRoot", "index", "minor", "parentIndex", "parentMinor"}
)

_TRAILING_INDEX = re.compile(r"-?[0-9]+$")


@dataclass(frozen=True)
class Move:
    """A reservation moved: the one revoked and the allocation its replacement holds."""

    reservation: Reservation
    node: str
    allocation: AllocationResult


def movable_device(snapshot: ClusterSnapshot, reservation: Reservation) -> DeviceEntry | None:
    """The one node-local device `reservation` holds, or None when it is not movable."""
    if len(reservation.allocations) != 1 or len(reservation.allocations[0].results) != 1:
        return None
    result = reservation.allocations[0].results[0]
    if result.admin_access or result.share_id or result.consumed_capacity:
        return None
    entry = snapshot.device(result.device_id)
    if entry is None or entry.multi or entry.access.node_name != reservation.node:
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
    reservations: Sequence[Reservation],
    away_from: str,
) -> list[Move] | None:
    """A device for each of `reservations` on a node other than `away_from`, each equivalent
    to the one it holds and free in `state` (which already holds whatever the moves make
    room for) and in the moves placed before it; the largest first, each on the fullest GPU
    that takes it (as the fragmentation-aware search packs). None when one finds no device."""
    index = snapshot.derived(_equivalents)
    entries = {r.id: movable_device(snapshot, r) for r in reservations}
    order = sorted(reservations, key=lambda r: (-_size(entries[r.id]), r.id))
    moves: list[Move] = []
    for reservation in order:
        entry = entries[reservation.id]
        if entry is None:
            return None
        tolerations = reservation.allocations[0].results[0].tolerations
        target = _best_free(state, index.get(_key(entry), ()), away_from, tolerations)
        if target is None:
            return None
        node = target.access.node_name or ""
        allocation = _moved(reservation.allocations[0], target, node)
        state = state.with_changes([(None, reservation.owner, allocation)])
        moves.append(Move(reservation, node, allocation))
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
