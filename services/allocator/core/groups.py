"""Node groups: the nodes of one template in one free state, kept up to date as devices are taken.

Nodes of one template (templates.py) with the same devices in use answer every search alike:
the solver searches the group's first node by name and knows the answer for all of them. This
index lists, per (template, in-use device indices), its nodes in name order, and per template
its groups in order of free capacity, so a BINPACK or SPREAD choice reads the few groups at the
right end instead of every node.

AllocatedState owns one index per snapshot and updates it when devices become used or free
(`devices_changed`: each node moves once), copying only what changes (the nodes moved since the
last fold, the group maps): states stay immutable values.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from fractions import Fraction
from math import isqrt
from typing import NamedTuple

from services.allocator.core.templates import NodeTemplates
from services.common.dra.model import DeviceID

__all__ = ["EMPTY", "GroupIndex", "GroupKey", "OrderEntry"]

EMPTY: frozenset[int] = frozenset()
_FOLD_MIN = 32  # moved nodes up to 32 + sqrt(nodes in use) are copied, more are folded
GroupKey = tuple[int, frozenset[int]]  # (template id, device indices in use)


class OrderEntry(NamedTuple):
    """One group in a template's order (sorted: by free capacity, then first node)."""

    capacity: Fraction  # free capacity of each of its nodes
    node: str  # its first node by name
    used: frozenset[int]  # the template's device indices in use


class GroupIndex:
    """Nodes by (template, in-use indices); per template, groups by (free capacity, first node)."""

    __slots__ = ("_moved", "_used", "members", "order", "templates")

    def __init__(self, templates: NodeTemplates) -> None:
        self.templates = templates
        # In-use indices per node: a base map (shared by copies, never changed once shared;
        # only nodes with something in use) and the nodes moved since (EMPTY: nothing in use),
        # folded into a new base once they outgrow ~sqrt(nodes in use).
        self._used: dict[str, frozenset[int]] = {}
        self._moved: dict[str, frozenset[int]] = {}
        self.members: dict[GroupKey, list[str]] = {}
        self.order: list[list[OrderEntry]] = [[] for _ in templates.templates]

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
            template = templates.templates[template_id]
            index.order[template_id].append(
                OrderEntry(template.free_capacity(used), nodes[0], used)
            )
        for entries in index.order:
            entries.sort()
        return index

    def copy(self) -> GroupIndex:
        """A copy whose top-level maps may change; lists are replaced, never edited in place."""
        index = GroupIndex.__new__(GroupIndex)
        index.templates = self.templates
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

    def devices_changed(self, devices: Iterable[DeviceID], used: bool) -> None:
        """`devices` became used (True) or free (False): each node they are on moves once."""
        positions: dict[str, set[int]] = {}
        for device in devices:
            slot = self.templates.slot.get(device)
            if slot is not None:
                positions.setdefault(slot[0], set()).add(slot[1])
        for node, changed in positions.items():
            before = self.node_in_use(node)
            after = before | changed if used else before - changed
            if after != before:
                self._move(node, before, after)

    def _move(self, node: str, before: frozenset[int], after: frozenset[int]) -> None:
        template = self.templates.of_node[node]
        self._moved[node] = after
        order = list(self.order[template.id])
        self._leave(order, template.id, node, before)
        self._join(order, template.id, node, after)
        self.order[template.id] = order

    def _leave(
        self, order: list[OrderEntry], template_id: int, node: str, used: frozenset[int]
    ) -> None:
        key = (template_id, used)
        nodes = self.members[key]
        capacity = self.templates.templates[template_id].free_capacity(used)
        _remove(order, OrderEntry(capacity, nodes[0], used))
        position = bisect.bisect_left(nodes, node)  # member lists are sorted: slice, not scan
        rest = nodes[:position] + nodes[position + 1 :]
        if rest:
            self.members[key] = rest
            bisect.insort(order, OrderEntry(capacity, rest[0], used))
        else:
            del self.members[key]

    def _join(
        self, order: list[OrderEntry], template_id: int, node: str, used: frozenset[int]
    ) -> None:
        key = (template_id, used)
        nodes = self.members.get(key)
        capacity = self.templates.templates[template_id].free_capacity(used)
        if nodes:
            _remove(order, OrderEntry(capacity, nodes[0], used))
            joined = list(nodes)
            bisect.insort(joined, node)
        else:
            joined = [node]
        self.members[key] = joined
        bisect.insort(order, OrderEntry(capacity, joined[0], used))


def _remove(order: list[OrderEntry], entry: OrderEntry) -> None:
    position = bisect.bisect_left(order, entry)
    assert position < len(order) and order[position] == entry, "group order out of step"
    del order[position]
