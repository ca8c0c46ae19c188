"""AllocatedState: what existing allocations hold, in the shape the solver checks it.

As kube-scheduler builds it for the allocator (`foreachAllocatedDevice`): results with
`adminAccess: true` hold nothing; a result with a `shareID` holds a capacity share of a
multi-allocatable device; any other result holds its device exclusively. On top, we keep the
counters consumed by the devices in use (upstream recomputes them per slice on every call) and,
for Explain, which owner (claim or reservation) holds each device.

A device that is in use — exclusively or by at least one share — consumes its counters once.
(Upstream 1.34 ignores the counters of shared devices; see docs/dra-compatibility.md.)

Values are immutable: `with_allocation` / `without_allocation` return a new state and copy only
the top-level maps, so a service can keep one live state per snapshot and swap it atomically.
Once the solver has asked for the node groups (groups.py), each new state updates a copy of them
for the devices that became used or free, so choosing a node stays cheap as holdings change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction

from services.allocator.core.groups import GroupIndex
from services.allocator.core.snapshot import Amount, ClusterSnapshot, CounterID
from services.common.dra.model import AllocationResult, DeviceID, ResourceClaim
from services.common.dra.quantity import Quantity

__all__ = ["AllocatedState"]

_ZERO = Fraction(0)


class AllocatedState:
    """Devices, capacity shares and counters held by existing (non-admin) allocations."""

    __slots__ = ("_capacity", "_counters", "_exclusive", "_groups", "_shares", "_snapshot")

    def __init__(self, snapshot: ClusterSnapshot | None = None) -> None:
        """An empty state; `snapshot` resolves which counters a device consumes."""
        self._snapshot = snapshot
        self._exclusive: dict[DeviceID, tuple[str, ...]] = {}
        self._shares: dict[DeviceID, dict[str, tuple[str, Mapping[str, Quantity]]]] = {}
        self._capacity: dict[DeviceID, dict[str, Fraction]] = {}
        self._counters: dict[CounterID, Amount] = {}
        self._groups: GroupIndex | None = None

    @classmethod
    def build(
        cls, snapshot: ClusterSnapshot, allocations: Iterable[tuple[str, AllocationResult]]
    ) -> AllocatedState:
        """A state holding every `(owner, allocation)`; owner names the claim or reservation."""
        state = cls(snapshot)
        for owner, allocation in allocations:
            state._add(allocation, owner)
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
        copy of the maps, not one per change): `(None, new, a)` adds `a`, `(old, None, a)`
        removes it, `(old, new, a)` hands what `old` holds of `a` to `new` (nothing is freed
        or taken: no counter or node group moves)."""
        state = self._copy()
        for old, new, allocation in changes:
            if old is None:
                if new is not None:
                    state._add(allocation, new)
            elif new is None:
                state._remove(allocation, old)
            else:
                state._rename(allocation, old, new)
        return state

    def rebase(self, snapshot: ClusterSnapshot) -> AllocatedState:
        """The same holdings over a new snapshot (counter consumption is re-resolved)."""
        state = self._copy()
        state._snapshot = snapshot
        state._counters = {}
        state._groups = None
        for device_id in set(self._exclusive) | set(self._shares):
            state._count(device_id, 1)
        return state

    def _copy(self) -> AllocatedState:
        state = AllocatedState(self._snapshot)
        state._exclusive = dict(self._exclusive)
        state._shares = dict(self._shares)
        state._capacity = dict(self._capacity)
        state._counters = dict(self._counters)
        state._groups = self._groups.copy() if self._groups is not None else None
        return state

    def _add(self, allocation: AllocationResult, owner: str) -> None:
        for result in allocation.results:
            if result.admin_access:
                continue
            device_id = result.device_id
            was_in_use = self.in_use(device_id)
            if result.share_id is not None:
                shares = dict(self._shares.get(device_id, {}))
                shares[result.share_id] = (owner, result.consumed_capacity)
                self._shares[device_id] = shares
                self._add_capacity(device_id, result.consumed_capacity, 1)
            else:
                self._exclusive[device_id] = (*self._exclusive.get(device_id, ()), owner)
            if not was_in_use:
                self._count(device_id, 1)
                if self._groups is not None:
                    self._groups.device_changed(device_id, True)

    def _remove(self, allocation: AllocationResult, owner: str) -> None:
        for result in allocation.results:
            if result.admin_access:
                continue
            device_id = result.device_id
            if not self.in_use(device_id):
                continue
            if result.share_id is not None:
                shares = dict(self._shares.get(device_id, {}))
                held = shares.pop(result.share_id, None)
                if held is None:
                    continue
                self._add_capacity(device_id, held[1], -1)
                if shares:
                    self._shares[device_id] = shares
                else:
                    del self._shares[device_id]
            else:
                owners = list(self._exclusive.get(device_id, ()))
                if not owners:
                    continue
                owners.remove(owner if owner in owners else owners[0])
                if owners:
                    self._exclusive[device_id] = tuple(owners)
                else:
                    del self._exclusive[device_id]
            if not self.in_use(device_id):
                self._count(device_id, -1)
                if self._groups is not None:
                    self._groups.device_changed(device_id, False)

    def _rename(self, allocation: AllocationResult, old: str, new: str) -> None:
        held = [r for r in allocation.results if not r.admin_access]
        if not all(
            old in self._exclusive.get(r.device_id, ())
            if r.share_id is None
            else self._shares.get(r.device_id, {}).get(r.share_id, ("",))[0] == old
            for r in held
        ):
            self._add(allocation, new)  # `old` does not hold it (not expected): just add
            return
        for result in held:
            device_id = result.device_id
            if result.share_id is None:
                owners = list(self._exclusive[device_id])
                owners[owners.index(old)] = new
                self._exclusive[device_id] = tuple(owners)
            else:
                shares = dict(self._shares[device_id])
                shares[result.share_id] = (new, shares[result.share_id][1])
                self._shares[device_id] = shares

    def _add_capacity(
        self, device_id: DeviceID, consumed: Mapping[str, Quantity], sign: int
    ) -> None:
        capacity = dict(self._capacity.get(device_id, {}))
        for name, quantity in consumed.items():
            capacity[name] = capacity.get(name, _ZERO) + sign * quantity.value
        self._capacity[device_id] = capacity

    def _count(self, device_id: DeviceID, sign: int) -> None:
        entry = self._snapshot.device(device_id) if self._snapshot else None
        if entry is None:
            return
        for (counter, _), amount in zip(entry.counters, entry.amounts, strict=True):
            self._counters[counter] = self._counters.get(counter, 0) + sign * amount

    # --- queries ---------------------------------------------------------------------

    def node_groups(self, snapshot: ClusterSnapshot) -> GroupIndex:
        """Nodes grouped by template and free state (built on first use, then kept up to date
        by `with_allocation` / `without_allocation`); built afresh for another snapshot."""
        if snapshot is not self._snapshot:
            return GroupIndex.build(snapshot.templates(), self.devices_in_use)
        if self._groups is None:
            self._groups = GroupIndex.build(snapshot.templates(), self.devices_in_use)
        return self._groups

    def is_exclusive(self, device_id: DeviceID) -> bool:
        """Held whole by some allocation (a dedicated device, not a capacity share)."""
        return device_id in self._exclusive

    def in_use(self, device_id: DeviceID) -> bool:
        """Held whole or by a share: its counters count and no one else may take it whole."""
        return device_id in self._exclusive or device_id in self._shares

    def owners(self, device_id: DeviceID) -> tuple[str, ...]:
        """Who holds the device (exclusive holders, then share holders), for explanations."""
        shares = self._shares.get(device_id, {})
        return self._exclusive.get(device_id, ()) + tuple(owner for owner, _ in shares.values())

    def consumed_capacity(self, device_id: DeviceID) -> Mapping[str, Fraction]:
        """Sum of the capacity shares other allocations hold on a multi-allocatable device."""
        return self._capacity.get(device_id, {})

    def counter_used(self, counter: CounterID) -> Fraction:
        return Fraction(self._counters.get(counter, 0))

    def counter_amount(self, counter: CounterID) -> Amount:
        """`counter_used` as an `exact` amount (an int when whole): for the solver's loops."""
        return self._counters.get(counter, 0)

    def share_ids(self, device_id: DeviceID) -> frozenset[str]:
        return frozenset(self._shares.get(device_id, {}))

    @property
    def devices_in_use(self) -> frozenset[DeviceID]:
        return frozenset(self._exclusive) | frozenset(self._shares)
