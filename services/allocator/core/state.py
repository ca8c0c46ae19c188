"""AllocatedState: what existing allocations hold, in the shape the solver checks it.

As kube-scheduler builds it for the allocator (`foreachAllocatedDevice`): results with
`adminAccess: true` hold nothing; a result with a `shareID` holds a capacity share of a
multi-allocatable device; any other result holds its device exclusively. On top, we keep the
counters consumed by the devices in use (upstream recomputes them per slice on every call) and,
for Explain, which owner (claim or reservation) holds each device.

A device that is in use — exclusively or by at least one share — consumes its counters once.
(Upstream 1.34 ignores the counters of shared devices; see docs/dra-compatibility.md.)

Values are immutable: `with_allocation` / `without_allocation` / `with_changes` return a new
state, so a service can keep one live state per snapshot and swap it atomically. A new state
shares its parent's maps and records the devices it changed in small delta maps, folded into new
maps once they outgrow ~sqrt(holdings): a change costs about the devices it touches, not a copy
of everything held (thousands of live reservations).
Once the solver has asked for the node groups (groups.py), each new state updates a copy of them
for the devices that became used or free, so choosing a node stays cheap as holdings change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from math import isqrt

from services.allocator.core.groups import GroupIndex
from services.allocator.core.snapshot import (
    Amount,
    ClusterSnapshot,
    CounterID,
    DeviceEntry,
    NodeView,
)
from services.allocator.core.templates import node_templates
from services.common.dra.model import (
    AllocationResult,
    DeviceID,
    DeviceRequestAllocationResult,
    ResourceClaim,
)
from services.common.dra.quantity import Quantity

__all__ = ["AllocatedState"]

_ZERO = Fraction(0)
_FOLD_MIN = 32  # deltas up to 32 + sqrt(holdings) entries are copied, larger ones folded

# (share id, owner) -> consumed: the same share may be held twice for a moment (a placement
# pending in one process while its reservation arrives), each holder releasing its own.
_Shares = Mapping[tuple[str, str], Mapping[str, Quantity]]
_Device = tuple[tuple[str, ...], _Shares, Mapping[str, Fraction] | None]
_NO_SHARES: _Shares = {}


class AllocatedState:
    """Devices, capacity shares and counters held by existing (non-admin) allocations."""

    __slots__ = (
        "_capacity", "_counter_delta", "_counters", "_delta", "_exclusive", "_groups",
        "_scratch", "_shares", "_snapshot",
    )  # fmt: skip

    def __init__(self, snapshot: ClusterSnapshot | None = None) -> None:
        """An empty state; `snapshot` resolves which counters a device consumes."""
        self._snapshot = snapshot
        # The base maps, shared by the states derived from this one: never changed once
        # shared. What a derived state changed is in the deltas (see `_copy`).
        self._exclusive: dict[DeviceID, tuple[str, ...]] = {}
        self._shares: dict[DeviceID, _Shares] = {}
        self._capacity: dict[DeviceID, Mapping[str, Fraction]] = {}
        self._counters: dict[CounterID, Amount] = {}
        self._delta: dict[DeviceID, _Device] = {}  # every device changed since the base
        self._counter_delta: dict[CounterID, Amount] = {}
        self._groups: GroupIndex | None = None
        self._scratch = False  # a detached copy, changed in place by its one caller

    @classmethod
    def build(
        cls, snapshot: ClusterSnapshot, allocations: Iterable[tuple[str, AllocationResult]]
    ) -> AllocatedState:
        """A state holding every `(owner, allocation)`; owner names the claim or reservation."""
        state = cls(snapshot)
        for owner, allocation in allocations:
            state._add(allocation, owner)
        state._flatten()
        return state

    @classmethod
    def from_claims(
        cls, snapshot: ClusterSnapshot, claims: Iterable[ResourceClaim]
    ) -> AllocatedState:
        """A state holding the `allocation` of every allocated claim (owner `namespace/name`)."""
        return cls.build(
            snapshot,
            ((f"{c.namespace}/{c.name}", c.allocation) for c in claims if c.allocation is not None),
        )

    # --- updates (copy, then change the copy) ----------------------------------------

    def with_allocation(self, allocation: AllocationResult, owner: str = "") -> AllocatedState:
        state = self._copy()
        state._add(allocation, owner)
        return state

    def without_allocation(self, allocation: AllocationResult, owner: str = "") -> AllocatedState:
        state = self._copy()
        state._remove(allocation, owner)
        return state

    def with_changes(
        self, changes: Iterable[tuple[str | None, str | None, AllocationResult]]
    ) -> AllocatedState:
        """`(old owner, new owner, allocation)` applied in order to ONE copy (a batch costs one
        copy of the changes since the last flattening, not of every holding): `(None, new, a)`
        adds `a`, `(old, None, a)` removes it, `(old, new, a)` hands what `old` holds of `a`
        to `new` (nothing is freed or taken: no counter or node group moves). The node groups
        move once at the end, each node straight to where the changes leave it (a run of 64
        placements on 8 nodes is 8 moves, not 64)."""
        state = self._copy()
        state._apply(changes)
        return state

    def changed_in_place(
        self, changes: Iterable[tuple[str | None, str | None, AllocationResult]]
    ) -> AllocatedState:
        """`with_changes` applied to this detached state itself, which is its last change:
        it returns this state, no longer detached (a value from now on, its node groups
        settled), for a caller that has the only reference to it (a batch's solve state,
        app/live_reservations.py's `offer`): no copy of its changes since the last
        flattening, nor of its node groups."""
        assert self._scratch, "only a detached state changes in place"
        self._apply(changes, by_name=True)
        if self._groups is not None:
            self._groups.settle()  # the moves `hold_in_place` deferred: none left to readers
        self._scratch = False
        return self

    def _apply(
        self,
        changes: Iterable[tuple[str | None, str | None, AllocationResult]],
        *,
        by_name: bool = False,
    ) -> None:
        """`with_changes`' changes, to this state itself. `by_name`: a rename from owner ""
        (a batch's holds, core solve_many) of one whole device held by "" alone finds the
        device among the changed ones by its names, not by a DeviceID built from its result
        (for a run's renames: one map of the ""-held devices instead of an id per item)."""
        changed: list[DeviceID] = []  # devices that became used or free on the way
        delta = self._delta
        named: dict[tuple[str, str, str], DeviceID] | None = None
        alone = ("",)
        for old, new, allocation in changes:
            if old == "" and by_name and new is not None:  # a batch's hold renamed (first)
                results = allocation.results
                if len(results) == 1:
                    result = results[0]
                    if result.share_id is None and not result.admin_access:
                        if named is None:  # the devices held by "" alone (never deleted)
                            named = {
                                (d.driver, d.pool, d.device): d
                                for d, (owners, _, _) in delta.items()
                                if owners == alone
                            }
                        device_id = named.get((result.driver, result.pool, result.device))
                        if device_id is not None:
                            owners, shares, consumed = delta[device_id]
                            if owners == alone:  # not renamed by an earlier step
                                delta[device_id] = ((new,), shares, consumed)
                                continue
                self._rename(allocation, old, new, changed)
                continue
            if old is None:
                if new is not None:
                    self._add(allocation, new, changed)
                continue
            if new is None:
                self._remove(allocation, old, changed)
                continue
            self._rename(allocation, old, new, changed)
        if changed and self._groups is not None:
            self._groups.devices_settled(changed, self.in_use)

    def detached(self, *, groups: bool = False) -> AllocatedState:
        """The same holdings in a copy of its own, which `hold_in_place` / `take_in_place`
        may change: for a run of placements one caller makes and reads alone (a batch, a
        gang's members, a Capacity count). `groups`: keep the node groups up to date too
        (unpinned solves read them), else drop them (pinned solves do not)."""
        state = self._copy(groups=groups)  # the groups' copy has maps of its own, too
        state._scratch = True
        return state

    def hold_in_place(self, allocation: AllocationResult, owner: str = "") -> None:
        """`with_allocation`, changing this state itself (only one made by `detached`). The
        nodes it fills move to their new node groups when the groups are next read
        (`node_groups`; groups.py): a batch's items between two walks move a node once."""
        assert self._scratch, "only a detached state changes in place"
        self._add(allocation, owner, defer=True)

    def hold_whole_in_place(
        self, snapshot: ClusterSnapshot, view: NodeView, indices: Sequence[int], owner: str = ""
    ) -> None:
        """`hold_in_place` of an allocation that holds whole the devices at `indices` of the
        node `view` of `snapshot` (its results without a share ID or admin access), a node of
        a template (templates.py: it sees only its own devices, index i of its view is slot i
        of its node groups): the same changes, without building the devices' ids from the
        results or looking them up."""
        assert self._scratch, "only a detached state changes in place"
        devices, node, groups = view.devices(), view.name, self._groups
        if snapshot is not self._snapshot or node is None or groups is None:
            self._hold_whole([devices[index].id for index in indices], owner)
            return
        delta, exclusive, shared, capacity = (
            self._delta,
            self._exclusive,
            self._shares,
            self._capacity,
        )
        for index in indices:
            entry = devices[index]
            device_id = entry.id  # the snapshot's own: the maps find it by identity
            found = delta.get(device_id)
            if found is None:  # `_based`, inline (a batch holds each of its devices here)
                owners = exclusive.get(device_id, ())
                shares = shared.get(device_id, _NO_SHARES) if shared else _NO_SHARES
                delta[device_id] = (
                    (*owners, owner),
                    shares,
                    capacity.get(device_id) if capacity else None,
                )
            else:
                owners, shares, consumed = found
                delta[device_id] = ((*owners, owner), shares, consumed)
            if not (owners or shares):
                if entry.counters:
                    self._count_entry(entry, 1)
                groups.device_taken(node, index)

    def _hold_whole(self, devices: Sequence[DeviceID], owner: str) -> None:
        """`hold_whole_in_place` of the devices with these ids."""
        delta, snapshot = self._delta, self._snapshot
        taken: list[DeviceID] = []
        for device_id in devices:
            entry = snapshot.device(device_id) if snapshot is not None else None
            if entry is not None:
                device_id = entry.id  # the snapshot's own: the maps find it by identity
            found = delta.get(device_id)
            owners, shares, consumed = self._based(device_id) if found is None else found
            delta[device_id] = ((*owners, owner), shares, consumed)
            if not (owners or shares):
                if entry is not None:
                    self._count_entry(entry, 1)
                taken.append(device_id)
        if taken and self._groups is not None:
            self._groups.devices_taken(taken)

    def take_in_place(self, devices: Iterable[DeviceID], owner: str) -> None:
        """Hold `devices` whole, changing this state itself (only one made by `detached`;
        its node groups are not moved: for pinned solves)."""
        assert self._scratch and self._groups is None, "a detached state without groups only"
        for device_id in devices:
            owners, shares, consumed = self._device(device_id)
            self._delta[device_id] = ((*owners, owner), shares, consumed)
            if not (owners or shares):
                self._count(device_id, 1)

    def rebase(self, snapshot: ClusterSnapshot) -> AllocatedState:
        """The same holdings over a new snapshot (counter consumption is re-resolved)."""
        state = self._copy()
        state._flatten()
        state._snapshot = snapshot
        state._counters = {}
        state._groups = None
        for device_id in set(state._exclusive) | set(state._shares):
            state._count(device_id, 1)
        state._flatten()
        return state

    def _copy(self, *, groups: bool = True) -> AllocatedState:
        """A state sharing this one's base maps and copying its deltas; the deltas are
        folded into new base maps once they outgrow ~sqrt(holdings), so that a change costs
        O(its devices) amortized, not O(every device held)."""
        state = AllocatedState.__new__(AllocatedState)
        state._snapshot = self._snapshot
        state._exclusive = self._exclusive
        state._shares = self._shares
        state._capacity = self._capacity
        state._counters = self._counters
        state._delta = dict(self._delta)
        state._counter_delta = dict(self._counter_delta)
        state._groups = self._groups.copy() if groups and self._groups is not None else None
        state._scratch = False
        held = len(self._exclusive) + len(self._shares)
        if len(state._delta) + len(state._counter_delta) > _FOLD_MIN + isqrt(held):
            state._flatten()
        return state

    def _flatten(self) -> None:
        """Fold the deltas into new base maps (the old ones may be shared: not changed)."""
        if not self._delta and not self._counter_delta:
            return
        exclusive, shares = dict(self._exclusive), dict(self._shares)
        capacity = dict(self._capacity)
        for device_id, (owners, shared, consumed) in self._delta.items():
            if owners:
                exclusive[device_id] = owners
            else:
                exclusive.pop(device_id, None)
            if shared:
                shares[device_id] = shared
            else:
                shares.pop(device_id, None)
            if consumed is not None:
                capacity[device_id] = consumed
        counters = dict(self._counters)
        counters.update(self._counter_delta)
        self._exclusive, self._shares, self._capacity = exclusive, shares, capacity
        self._counters = counters
        self._delta, self._counter_delta = {}, {}

    def _device(self, device_id: DeviceID) -> _Device:
        """(exclusive owners, shares, consumed capacity or None) of a device."""
        found = self._delta.get(device_id)
        return self._based(device_id) if found is None else found

    def _based(self, device_id: DeviceID) -> _Device:
        """`_device` from the base maps (the maps no share touched are empty: not looked in,
        a DeviceID hashes in Python)."""
        return (
            self._exclusive.get(device_id, ()),
            self._shares.get(device_id, _NO_SHARES) if self._shares else _NO_SHARES,
            self._capacity.get(device_id) if self._capacity else None,
        )

    def _add(
        self,
        allocation: AllocationResult,
        owner: str,
        changed: list[DeviceID] | None = None,
        *,
        defer: bool = False,
    ) -> None:
        """Hold `allocation` for `owner`; the devices it takes move their node groups now (or
        when the groups are next read: `defer`), or are added to `changed` for the caller to
        move (`with_changes`)."""
        taken: list[DeviceID] = [] if changed is None else changed
        delta, snapshot = self._delta, self._snapshot
        for result in allocation.results:
            if result.admin_access:
                continue
            device_id = result.device_id
            entry = snapshot.device(device_id) if snapshot is not None else None
            if entry is not None:
                device_id = entry.id  # the snapshot's own: the maps find it by identity
            found = delta.get(device_id)
            owners, shares, consumed = self._based(device_id) if found is None else found
            was_in_use = bool(owners or shares)
            if result.share_id is not None:
                shares = {**shares, (result.share_id, owner): result.consumed_capacity}
                consumed = _plus(consumed, result.consumed_capacity, 1)
            else:
                owners = (*owners, owner)
            delta[device_id] = (owners, shares, consumed)
            if not was_in_use:
                if entry is not None:
                    self._count_entry(entry, 1)
                taken.append(device_id)
        if changed is None and taken and self._groups is not None:
            self._groups.devices_changed(taken, True, defer=defer)

    def _remove(
        self, allocation: AllocationResult, owner: str, changed: list[DeviceID] | None = None
    ) -> None:
        """Release what `owner` holds of `allocation` (`changed`: as for `_add`)."""
        freed: list[DeviceID] = [] if changed is None else changed
        for result in allocation.results:
            if result.admin_access:
                continue
            device_id = result.device_id
            owners, shares, consumed = self._device(device_id)
            if not (owners or shares):
                continue
            if result.share_id is not None:
                key = (result.share_id, owner)
                if key not in shares:
                    continue
                held = shares[key]
                shares = {k: v for k, v in shares.items() if k != key}
                consumed = _plus(consumed, held, -1)
            else:
                if not owners:
                    continue
                left = list(owners)
                left.remove(owner if owner in left else left[0])
                owners = tuple(left)
            self._delta[device_id] = (owners, shares, consumed)
            if not (owners or shares):
                self._count(device_id, -1)
                freed.append(device_id)
        if changed is None and freed and self._groups is not None:
            self._groups.devices_changed(freed, False)

    def _rename(
        self, allocation: AllocationResult, old: str, new: str, changed: list[DeviceID]
    ) -> None:
        """Hand what `old` holds of `allocation` to `new`; when `old` does not hold all of it
        (not expected), add it for `new` instead (`changed`: as for `_add`)."""
        delta = self._delta
        results = allocation.results
        if len(results) == 1 and results[0].share_id is None and not results[0].admin_access:
            device_id = results[0].device_id  # the common case: one device, held by `old` alone
            found = delta.get(device_id)
            owners, shares, consumed = self._based(device_id) if found is None else found
            if owners == (old,):
                delta[device_id] = ((new,), shares, consumed)
                return
        held: list[tuple[DeviceRequestAllocationResult, DeviceID, _Device]] = []
        for result in allocation.results:
            if result.admin_access:
                continue
            device_id = result.device_id
            found = delta.get(device_id)
            device = self._based(device_id) if found is None else found
            if result.share_id is None:
                if old not in device[0]:
                    break
            elif (result.share_id, old) not in device[1]:
                break
            held.append((result, device_id, device))
        else:
            for result, device_id, device in held:
                owners, shares, consumed = delta.get(device_id) or device
                if result.share_id is None:
                    if len(owners) == 1:
                        owners = (new,)
                    else:
                        renamed = list(owners)
                        renamed[renamed.index(old)] = new
                        owners = tuple(renamed)
                else:
                    moved = shares[(result.share_id, old)]
                    shares = {k: v for k, v in shares.items() if k != (result.share_id, old)}
                    shares[(result.share_id, new)] = moved
                delta[device_id] = (owners, shares, consumed)
            return
        self._add(allocation, new, changed)

    def _count(self, device_id: DeviceID, sign: int) -> None:
        entry = self._snapshot.device(device_id) if self._snapshot else None
        if entry is not None:
            self._count_entry(entry, sign)

    def _count_entry(self, entry: DeviceEntry, sign: int) -> None:
        """The counters the device consumes, taken (sign 1) or given back (-1)."""
        if not entry.counters:
            return
        delta = self._counter_delta
        for (counter, _), amount in zip(entry.counters, entry.amounts, strict=True):
            delta[counter] = self.counter_amount(counter) + sign * amount

    # --- queries ---------------------------------------------------------------------

    def node_groups(self, snapshot: ClusterSnapshot) -> GroupIndex:
        """Nodes grouped by template and free state (built on first use, then kept up to date
        by `with_allocation` / `without_allocation`); built afresh for another snapshot."""
        if snapshot is not self._snapshot:
            return GroupIndex.build(node_templates(snapshot), self.devices_in_use)
        if self._groups is None:
            self._groups = GroupIndex.build(node_templates(snapshot), self.devices_in_use)
        else:
            self._groups.settle()  # the moves `hold_in_place` deferred
        return self._groups

    def node_in_use(self, snapshot: ClusterSnapshot, view: NodeView) -> frozenset[int]:
        """The node's devices in use, by their index in its view (its group's key, groups.py):
        from the node groups when they are kept, else from the devices themselves."""
        if self._groups is not None and snapshot is self._snapshot and view.name is not None:
            return self._groups.node_in_use(view.name)
        return frozenset(i for i, entry in enumerate(view.devices()) if self.in_use(entry.id))

    def is_exclusive(self, device_id: DeviceID) -> bool:
        """Held whole by some allocation (a dedicated device, not a capacity share)."""
        found = self._delta.get(device_id)
        return device_id in self._exclusive if found is None else bool(found[0])

    def in_use(self, device_id: DeviceID) -> bool:
        """Held whole or by a share: its counters count and no one else may take it whole."""
        found = self._delta.get(device_id)
        if found is None:
            return device_id in self._exclusive or device_id in self._shares
        return bool(found[0] or found[1])

    def owners(self, device_id: DeviceID) -> tuple[str, ...]:
        """Who holds the device (exclusive holders, then share holders), for explanations."""
        found = self._delta.get(device_id)  # `_device`, without the capacity Explain never reads
        if found is None:
            owners = self._exclusive.get(device_id, ())
            shares = self._shares.get(device_id, _NO_SHARES)
        else:
            owners, shares, _ = found
        return owners + tuple(owner for _, owner in shares) if shares else owners

    def consumed_capacity(self, device_id: DeviceID) -> Mapping[str, Fraction]:
        """Sum of the capacity shares other allocations hold on a multi-allocatable device."""
        return self._device(device_id)[2] or {}

    def counter_used(self, counter: CounterID) -> Fraction:
        return Fraction(self.counter_amount(counter))

    def counter_amount(self, counter: CounterID) -> Amount:
        """`counter_used` as an `exact` amount (an int when whole): for the solver's loops."""
        found = self._counter_delta.get(counter)
        return self._counters.get(counter, 0) if found is None else found

    def share_ids(self, device_id: DeviceID) -> frozenset[str]:
        return frozenset(share_id for share_id, _ in self._device(device_id)[1])

    @property
    def devices_in_use(self) -> frozenset[DeviceID]:
        delta = self._delta
        based = (d for d in (*self._exclusive, *self._shares) if d not in delta)
        changed = (d for d, (owners, shares, _) in delta.items() if owners or shares)
        return frozenset(based) | frozenset(changed)


def _plus(
    consumed: Mapping[str, Fraction] | None, quantities: Mapping[str, Quantity], sign: int
) -> dict[str, Fraction]:
    """A device's consumed capacity with a share's `quantities` added (sign 1) or taken out."""
    total = dict(consumed or {})
    for name, quantity in quantities.items():
        total[name] = total.get(name, _ZERO) + sign * quantity.value
    return total
