"""From a placement to the `Hold`s a reservation store checks and takes.

What a placement takes, exactly as `AllocatedState` counts it (so that a reservation blocks
precisely what the solver treats as used):

- results with adminAccess take nothing;
- a device that allows multiple allocations is never taken whole; each of its results takes a
  capacity share `capacity:<driver>/<pool>/<device>/<capacity>` up to the device's capacity;
- any other device is taken whole (`driver/pool/device`);
- every device taken, whole or by a share, consumes its counters once per placement:
  `counter:<driver>/<pool>/<counterSet>/<counter>` up to the total its slice publishes. (Two
  placements holding shares of one partitionable device both count its counters: safe, never
  more than the limit, at worst a spurious conflict on such rare devices.)

Scopes. A store step sees one scope (in Redis: one hash slot), and a device must always be
taken under the same scope or two scopes could both take it. A device local to a node is taken
under that node's name; a device of a slice shared by several nodes (allNodes, nodeSelector)
under its pool, `<driver>/<pool>` (a "/" never occurs in node names). A placement that uses
both becomes one reservation per scope, taken all or nothing (one placement of `reserve`).

`placement_holds` also validates placements that clients send to Reserve: every device must
exist in the snapshot and be usable from the node; field paths name the offending result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

from services.allocator.core import (
    ClusterSnapshot,
    CounterID,
    DeviceEntry,
    taint_detail,
    untolerated_taint,
)
from services.allocator.reservations.model import Hold, LimitedUse, milli
from services.common.dra.model import AllocationResult, DeviceID, DeviceRequestAllocationResult
from services.common.dra.quantity import Quantity
from services.common.errors import FailedPrecondition, InvalidArgument

__all__ = [
    "capacity_key",
    "counter_key",
    "device_key",
    "placement_holds",
    "scope_of",
    "whole_hold",
]


def device_key(device_id: DeviceID) -> str:
    return f"{device_id.driver}/{device_id.pool}/{device_id.device}"


def counter_key(counter: CounterID) -> str:
    return f"counter:{counter}"


def capacity_key(device_id: DeviceID, capacity: str) -> str:
    return f"capacity:{device_key(device_id)}/{capacity}"


def scope_of(entry: DeviceEntry) -> str:
    """The scope a device is always reserved under (see the module docstring)."""
    return entry.access.node_name or f"{entry.id.driver}/{entry.id.pool}"


class _Builder:
    __slots__ = ("charged", "devices", "uses")

    def __init__(self) -> None:
        self.devices: list[str] = []
        self.uses: list[LimitedUse] = []
        self.charged: set[DeviceID] = set()

    def hold(self) -> Hold:
        return Hold(tuple(self.devices), tuple(self.uses))


def placement_holds(
    snapshot: ClusterSnapshot,
    node: str,
    allocations: Sequence[AllocationResult],
    *,
    path: str = "allocations",
    result_path: str = "allocation.results",
) -> dict[str, Hold]:
    """Scope -> Hold for the placement of `allocations` on `node` (the node's scope first).

    Raises InvalidArgument (field path `<path>[i].<result_path>[j]`) for a device the snapshot
    lacks or the node cannot use, a device taken twice, or a share that does not fit the
    device's kind."""
    pieces = snapshot.derived(_Pieces)
    if node and len(allocations) == 1 and len(allocations[0].results) == 1:
        # the common placement: one device of the node, taken whole (a batch's every item)
        whole = whole_hold(snapshot, node, allocations[0].results[0])
        if whole is not None:
            return {node: whole}
    usable = _usable(snapshot, pieces, node) if node else None  # NotFound for an unknown node
    known = pieces.known
    builders: dict[str, _Builder] = {node: _Builder()} if node else {}
    for i, allocation in enumerate(allocations):
        for j, result in enumerate(allocation.results):
            found = known.get((result.driver, result.pool, result.device))
            if found is None or (usable is not None and id(found[0]) not in usable):
                where = f"{path}[{i}].{result_path}[{j}]"
                found = _known(snapshot, known, result.device_id, usable, node, where)
            entry, key, scope, _ = found
            if entry.device.taints:  # the rule Allocate's candidates apply, here for Reserve
                taint = untolerated_taint(entry, result.tolerations)
                if taint is not None:
                    raise FailedPrecondition(
                        f"{path}[{i}].{result_path}[{j}]: device {key} is "
                        f"{taint_detail(taint)} by the allocation's tolerations"
                    )
            if result.admin_access:
                continue
            builder = builders.get(scope) or builders.setdefault(scope, _Builder())
            if not entry.multi and result.share_id is None and key not in builder.devices:
                builder.devices.append(key)  # a device taken whole (what _take checks first)
                if entry.counters and entry.id not in builder.charged:
                    builder.charged.add(entry.id)
                    builder.uses.extend(_counter_uses(snapshot, entry))
                continue
            where = f"{path}[{i}].{result_path}[{j}]"
            _take(snapshot, builder, entry, result.share_id, result.consumed_capacity, where)
    return {scope: b.hold() for scope, b in builders.items()}


def whole_hold(
    snapshot: ClusterSnapshot, node: str, result: DeviceRequestAllocationResult
) -> Hold | None:
    """The hold of a placement on `node` of one allocation of this one result where it takes
    its device whole and nothing else (the device is the node's own, in the snapshot, not
    multi-allocatable, untainted; the result names no share and no admin access): what
    `placement_holds` returns as the node's scope's then, in one lookup. None for any other
    (`placement_holds` then decides, or raises). Raises NotFound for an unknown node."""
    pieces = snapshot.derived(_Pieces)
    wholes = pieces.wholes.get(node)
    if wholes is None:
        wholes = _node_pieces(snapshot, pieces, node)  # NotFound for an unknown node
    whole = wholes.get((result.driver, result.pool, result.device))
    if whole is not None and result.share_id is None and not result.admin_access:
        return whole
    return None


_Known = tuple[DeviceEntry, str, str, Hold | None]
"""A device's entry, its key, its scope, and the hold of taking it whole where that is all a
result of it takes (not multi-allocatable, untainted: its key and its counters' uses)."""


class _Pieces:
    """What `placement_holds` keeps with an (immutable) snapshot, made as placements need it:
    `known`, a device's `_Known` by (driver, pool, device) (a result names its device by those
    strings, and looking them up so is cheaper than making and hashing a DeviceID); per node,
    `usable`, its device entries by identity, and `wholes`, the hold of taking each of its own
    devices whole where that is all a result of it takes (the `_Known`'s hold of an entry
    scoped to the node, usable there, the snapshot's entry for its id) — a common placement's
    hold in one lookup."""

    __slots__ = ("known", "usable", "wholes")

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.known: dict[tuple[str, str, str], _Known] = {}
        self.usable: dict[str, frozenset[int]] = {}
        self.wholes: dict[str, dict[tuple[str, str, str], Hold]] = {}


def _piece(snapshot: ClusterSnapshot, entry: DeviceEntry) -> _Known:
    device_id = entry.id
    key = f"{device_id.driver}/{device_id.pool}/{device_id.device}"  # device_key
    whole = None
    if not entry.device.allow_multiple_allocations and not entry.device.taints:
        whole = _hold((key,), _counter_uses(snapshot, entry) if entry.counters else ())
    return entry, key, entry.access.node_name or f"{device_id.driver}/{device_id.pool}", whole


def _hold(devices: tuple[str, ...], uses: tuple[LimitedUse, ...]) -> Hold:
    """`Hold(devices, uses)` without the frozen dataclass's `__init__` (its per-field
    `object.__setattr__`): a node's devices' holds are made at its first placement."""
    hold: Hold = object.__new__(Hold)
    object.__setattr__(hold, "__dict__", {"devices": devices, "uses": uses})
    return hold


def _node_pieces(
    snapshot: ClusterSnapshot, pieces: _Pieces, node: str
) -> dict[tuple[str, str, str], Hold]:
    """The node's devices known at once (not one miss per device), and its `wholes`."""
    known = pieces.known
    wholes: dict[tuple[str, str, str], Hold] = {}
    device = snapshot.device
    for entry in snapshot.view(node).devices():
        device_id = entry.id
        at = (device_id.driver, device_id.pool, device_id.device)
        found = known.get(at)
        if found is None:
            if device(device_id) is not entry:
                continue
            found = known[at] = _piece(snapshot, entry)
        elif found[0] is not entry:
            continue
        if found[3] is not None and found[2] == node:
            wholes[at] = found[3]
    pieces.wholes[node] = wholes
    return wholes


def _known(
    snapshot: ClusterSnapshot,
    known: dict[tuple[str, str, str], _Known],
    device_id: DeviceID,
    usable: frozenset[int] | None,
    node: str,
    where: str,
) -> _Known:
    """A device's entry, key and scope (raising as `_usable_entry`), kept by (driver, pool,
    device) with the immutable snapshot (`_Pieces.known`)."""
    entry = _usable_entry(snapshot, device_id, usable, node, where)
    found = known[(device_id.driver, device_id.pool, device_id.device)] = _piece(snapshot, entry)
    return found


def _entry_uses(snapshot: ClusterSnapshot) -> dict[int, tuple[LimitedUse, ...]]:
    return {}


def _counter_uses(snapshot: ClusterSnapshot, entry: DeviceEntry) -> tuple[LimitedUse, ...]:
    """What taking the device consumes of its slice's counters (made once per entry and
    snapshot: the exact amounts are Fractions, slow to turn into milli-units every time)."""
    by_entry = snapshot.derived(_entry_uses)
    found = by_entry.get(id(entry))
    if found is None:
        totals = entry.slice.counter_totals
        found = by_entry[id(entry)] = tuple(
            LimitedUse(counter_key(counter), _milli(amount), _milli(totals[counter]))
            for counter, amount in entry.counters
        )
    return found


def _usable(snapshot: ClusterSnapshot, pieces: _Pieces, node: str) -> frozenset[int]:
    """The node's device entries by identity (cheaper than hashing their ids), made once per
    node and snapshot (kept with the immutable snapshot, whose entries they name)."""
    found = pieces.usable.get(node)
    if found is None:
        if node not in pieces.wholes:
            _node_pieces(snapshot, pieces, node)
        entries = snapshot.view(node).devices()
        found = pieces.usable[node] = frozenset(id(entry) for entry in entries)
    return found


def _usable_entry(
    snapshot: ClusterSnapshot,
    device_id: DeviceID,
    usable: frozenset[int] | None,
    node: str,
    where: str,
) -> DeviceEntry:
    entry = snapshot.device(device_id)
    if entry is None:
        raise InvalidArgument.at(where, f"device {device_key(device_id)} is not in the inventory")
    if usable is not None and id(entry) not in usable and not _on(snapshot, node, device_id):
        raise InvalidArgument.at(where, f"device {device_key(device_id)} is not usable from {node}")
    return entry


def _on(snapshot: ClusterSnapshot, node: str, device_id: DeviceID) -> bool:
    """Whether a device with this id is usable from `node` (by id: another entry of it)."""
    return any(entry.id == device_id for entry in snapshot.view(node).devices())


def _take(
    snapshot: ClusterSnapshot,
    builder: _Builder,
    entry: DeviceEntry,
    share_id: str | None,
    consumed: Mapping[str, Quantity],
    where: str,
) -> None:
    device_id = entry.id
    if entry.multi:
        if share_id is None:
            raise InvalidArgument.at(
                f"{where}.shareID",
                f"device {device_key(device_id)} allows multiple allocations: a share id is needed",
            )
        _take_share(builder, entry, consumed, where)
    else:
        if share_id is not None:
            raise InvalidArgument.at(
                f"{where}.shareID",
                f"device {device_key(device_id)} does not allow multiple allocations",
            )
        key = device_key(device_id)
        if key in builder.devices:
            raise InvalidArgument.at(where, f"device {key} is allocated twice")
        builder.devices.append(key)
    if entry.counters and device_id not in builder.charged:
        builder.charged.add(device_id)
        builder.uses.extend(_counter_uses(snapshot, entry))


def _take_share(
    builder: _Builder, entry: DeviceEntry, consumed: Mapping[str, Quantity], where: str
) -> None:
    capacity = entry.device.capacity
    for name, quantity in sorted(consumed.items()):
        if name not in capacity:
            raise InvalidArgument.at(
                f'{where}.consumedCapacity["{name}"]',
                f"device {device_key(entry.id)} has no capacity {name}",
            )
        builder.uses.append(
            LimitedUse(capacity_key(entry.id, name), milli(quantity), milli(capacity[name].value))
        )


def _milli(amount: Fraction) -> int:
    """Milli-units of an exact amount, rounded up as `reservations.milli` does."""
    return math.ceil(amount * 1000)
