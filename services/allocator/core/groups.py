"""Node groups: the nodes of one template in one free state, kept up to date as devices are taken.

Nodes of one template (templates.py) with the same devices in use answer every search alike:
the solver searches the group's first node by name and knows the answer for all of them. This
index lists, per (template, in-use device indices), its nodes in name order, and per template
its groups in order of free capacity, so a BINPACK or SPREAD choice reads the few groups at the
right end instead of every node.

AllocatedState owns one index per snapshot and updates it when devices become used or free
(`devices_changed`: each node moves once). A detached state's holds (a batch's items, state.py)
may defer the moves: the node's devices in use change at once (`node_in_use`), its group only
when someone next reads the groups (`settle`), so a node that takes eight items one by one
between two walks moves once, not eight times. States stay immutable values: a copy shares every
list with its original, and a list is copied the first time a move changes it; after that, the
copy edits its own lists in place (a node moving in or out of a group of thousands costs a
bisect and a slot, not a copy of the group), until the next copy shares them again. So a list
that a shared state holds never changes (gang.py keeps member lists' splits by identity); only
a detached state's (state.py) lists change in place between its one caller's holds.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from fractions import Fraction
from math import isqrt
from typing import NamedTuple

from services.allocator.core.templates import NodeTemplate, NodeTemplates
from services.common.dra.model import DeviceID

__all__ = ["EMPTY", "GroupIndex", "GroupKey", "OrderEntry"]

EMPTY: frozenset[int] = frozenset()
_FOLD_MIN = 32  # moved nodes up to 32 + sqrt(nodes in use) are copied, more are folded
_CAPACITIES_KEPT = 65536  # (template, in-use indices) -> free capacity, shared by the copies
GroupKey = tuple[int, frozenset[int]]  # (template id, device indices in use)
_SortKey = tuple[int | Fraction, str]  # an OrderEntry's (capacity, node), an int when whole


class OrderEntry(NamedTuple):
    """One group in a template's order (sorted: by free capacity, then first node)."""

    capacity: Fraction  # free capacity of each of its nodes
    node: str  # its first node by name
    used: frozenset[int]  # the template's device indices in use


class GroupIndex:
    """Nodes by (template, in-use indices); per template, groups by (free capacity, first node)."""

    __slots__ = (
        "_capacities", "_keys", "_moved", "_own_members", "_own_order", "_pending", "_used",
        "members", "order", "templates",
    )  # fmt: skip

    def __init__(self, templates: NodeTemplates) -> None:
        self.templates = templates
        # In-use indices per node: a base map (shared by copies, never changed once shared;
        # only nodes with something in use) and the nodes moved since (EMPTY: nothing in use),
        # folded into a new base once they outgrow ~sqrt(nodes in use).
        self._used: dict[str, frozenset[int]] = {}
        self._moved: dict[str, frozenset[int]] = {}
        self.members: dict[GroupKey, list[str]] = {}
        self.order: list[list[OrderEntry]] = [[] for _ in templates.templates]
        # Per template, `order`'s (capacity, first node) with the capacity an int when whole:
        # the same order, bisected by C comparisons instead of Fraction's.
        self._keys: list[list[_SortKey]] = [[] for _ in templates.templates]
        # The lists this index made since it was last copied (or built): changed in place.
        self._own_members: dict[GroupKey, list[str]] = {}
        self._own_order: set[int] = set()  # template ids: their `order` and `_keys` lists
        self._capacities: dict[GroupKey, tuple[Fraction, int | Fraction]] = {}
        # Nodes whose move is deferred (devices_changed(defer=True)): node -> the in-use
        # indices of the group it is still listed in.
        self._pending: dict[str, frozenset[int]] = {}

    @classmethod
    def build(cls, templates: NodeTemplates, devices_in_use: Iterable[DeviceID]) -> GroupIndex:
        index = cls(templates)
        per_node: dict[str, set[int]] = {}
        for device in devices_in_use:
            slot = templates.slot.get(device)
            if slot is not None:
                per_node.setdefault(slot[0], set()).add(slot[1])
        index._used = {node: frozenset(used) for node, used in per_node.items()}
        for template in templates.templates:
            for node in template.nodes:  # sorted, so every member list is sorted
                key = (template.id, index._used.get(node, EMPTY))
                index.members.setdefault(key, []).append(node)
        for (template_id, used), nodes in index.members.items():
            capacity = index._capacity(templates.templates[template_id], used)[0]
            index.order[template_id].append(OrderEntry(capacity, nodes[0], used))
        for template_id, entries in enumerate(index.order):
            entries.sort()
            index._keys[template_id] = [(_exact(e.capacity), e.node) for e in entries]
        return index

    def copy(self) -> GroupIndex:
        """A copy whose maps may change; it shares every list with this index until a move
        changes one (then it is copied, once), and so does this index from now on."""
        self.settle()
        index = GroupIndex.__new__(GroupIndex)
        index.templates = self.templates
        index._pending = {}
        index._used = self._used
        index._moved = dict(self._moved)
        if len(index._moved) > _FOLD_MIN + isqrt(len(self._used)):
            used = dict(self._used)
            for node, indices in index._moved.items():
                if indices:
                    used[node] = indices
                else:
                    used.pop(node, None)
            index._used, index._moved = used, {}
        index.members = dict(self.members)
        index.order = list(self.order)
        index._keys = list(self._keys)
        index._own_members, index._own_order = {}, set()
        if self._own_members or self._own_order:  # shared now: not changed in place any more
            self._own_members, self._own_order = {}, set()
        index._capacities = self._capacities
        return index

    @property
    def in_use(self) -> dict[str, frozenset[int]]:
        """In-use device indices of every node with something in use."""
        used = {node: self.node_in_use(node) for node in (*self._used, *self._moved)}
        return {node: indices for node, indices in used.items() if indices}

    def node_in_use(self, node: str) -> frozenset[int]:
        moved = self._moved.get(node)
        return self._used.get(node, EMPTY) if moved is None else moved

    def group_of(self, node: str) -> GroupKey | None:
        template = self.templates.of_node.get(node)
        return None if template is None else (template.id, self.node_in_use(node))

    def devices_changed(
        self, devices: Iterable[DeviceID], used: bool, *, defer: bool = False
    ) -> None:
        """`devices` became used (True) or free (False): each node they are on moves once;
        `defer`: its in-use indices change now, its group when the groups are next read
        (`settle`; only for an index one caller changes and reads alone)."""
        if self._pending and not defer:
            self.settle()
        positions: dict[str, set[int]] = {}
        slots = self.templates.slot
        for device in devices:
            slot = slots.get(device)
            if slot is not None:
                found = positions.get(slot[0])
                if found is None:
                    positions[slot[0]] = {slot[1]}
                else:
                    found.add(slot[1])
        for node, changed in positions.items():
            before = self.node_in_use(node)
            after = before | changed if used else before - changed
            if after == before:
                continue
            if defer:
                self._pending.setdefault(node, before)
                self._moved[node] = after
            else:
                self._move(node, before, after)

    def devices_taken(self, devices: Iterable[DeviceID]) -> None:
        """`devices_changed(devices, True, defer=True)`, device by device: the same in-use
        indices and deferred moves, without grouping the devices by node first."""
        slots, moved, pending = self.templates.slot, self._moved, self._pending
        for device in devices:
            slot = slots.get(device)
            if slot is not None:
                node, index = slot
                before = self.node_in_use(node)
                if index not in before:
                    pending.setdefault(node, before)
                    moved[node] = before | {index}

    def device_taken(self, node: str, index: int) -> None:
        """`devices_taken` of the device at `index` of the node `node` (its slot, known)."""
        before = self.node_in_use(node)
        if index not in before:
            self._pending.setdefault(node, before)
            self._moved[node] = before | {index}

    def settle(self) -> None:
        """Move the nodes whose moves were deferred, each straight to its group of now."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        for node, listed in pending.items():
            now = self.node_in_use(node)
            if now != listed:
                self._move(node, listed, now)

    def devices_settled(
        self, devices: Iterable[DeviceID], in_use: Callable[[DeviceID], bool]
    ) -> None:
        """`devices` may have become used or free, `in_use` says which they are now: each
        node they are on moves once, straight to its group of now."""
        self.settle()
        per_node: dict[str, dict[int, DeviceID]] = {}
        slots = self.templates.slot
        for device in devices:
            slot = slots.get(device)
            if slot is not None:
                found = per_node.get(slot[0])
                if found is None:
                    per_node[slot[0]] = {slot[1]: device}
                else:
                    found[slot[1]] = device
        for node, changed in per_node.items():
            before = self.node_in_use(node)
            after = before.difference(changed).union(i for i, d in changed.items() if in_use(d))
            if after != before:
                self._move(node, before, after)

    def _move(self, node: str, before: frozenset[int], after: frozenset[int]) -> None:
        template = self.templates.of_node[node]
        self._moved[node] = after
        if template.id not in self._own_order:
            self.order[template.id] = list(self.order[template.id])
            self._keys[template.id] = list(self._keys[template.id])
            self._own_order.add(template.id)
        self._leave(template, node, before)
        self._join(template, node, after)

    def _leave(self, template: NodeTemplate, node: str, used: frozenset[int]) -> None:
        key = (template.id, used)
        nodes = self.members[key]
        capacity, exact = self._capacity(template, used)
        if len(nodes) == 1:
            del self.members[key]
            self._own_members.pop(key, None)
            self._unlist(template.id, (exact, node))
            return
        position = bisect.bisect_left(nodes, node)  # member lists are sorted
        if self._own_members.get(key) is nodes:
            del nodes[position]
        else:
            nodes = self.members[key] = self._own_members[key] = [
                *nodes[:position],
                *nodes[position + 1 :],
            ]
        if position == 0:  # the group's first node changed: so did its place in the order
            self._unlist(template.id, (exact, node))
            self._list(template.id, (exact, nodes[0]), OrderEntry(capacity, nodes[0], used))

    def _join(self, template: NodeTemplate, node: str, used: frozenset[int]) -> None:
        key = (template.id, used)
        nodes = self.members.get(key)
        capacity, exact = self._capacity(template, used)
        if nodes is None:
            self.members[key] = self._own_members[key] = [node]
            self._list(template.id, (exact, node), OrderEntry(capacity, node, used))
            return
        position = bisect.bisect_left(nodes, node)
        first = nodes[0]
        if self._own_members.get(key) is nodes:
            nodes.insert(position, node)
        else:
            self.members[key] = self._own_members[key] = [
                *nodes[:position],
                node,
                *nodes[position:],
            ]
        if position == 0:
            self._unlist(template.id, (exact, first))
            self._list(template.id, (exact, node), OrderEntry(capacity, node, used))

    def _list(self, template_id: int, key: _SortKey, entry: OrderEntry) -> None:
        keys = self._keys[template_id]
        position = bisect.bisect_left(keys, key)
        keys.insert(position, key)
        self.order[template_id].insert(position, entry)

    def _unlist(self, template_id: int, key: _SortKey) -> None:
        keys = self._keys[template_id]
        position = bisect.bisect_left(keys, key)
        assert position < len(keys) and keys[position] == key, "group order out of step"
        del keys[position]
        del self.order[template_id][position]

    def _capacity(
        self, template: NodeTemplate, used: frozenset[int]
    ) -> tuple[Fraction, int | Fraction]:
        """The group's free capacity, and the same as an int when whole (its sort key)."""
        key = (template.id, used)
        found = self._capacities.get(key)
        if found is None:
            capacity = template.free_capacity(used)
            found = (capacity, _exact(capacity))
            if len(self._capacities) < _CAPACITIES_KEPT:
                self._capacities[key] = found
        return found


def _exact(capacity: Fraction) -> int | Fraction:
    return capacity.numerator if capacity.denominator == 1 else capacity
