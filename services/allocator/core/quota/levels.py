"""One resource's quota and usage at every node of a cohort tree: Kueue's hierarchical cohorts
as arithmetic.

The rule's half of the cohort tree; the tree's shape (each node's parent, children, root and
quotas) is the model's, services/common/quota/tree.py. Per quota resource every node has, as
Kueue's resource nodes do (pkg/cache/scheduler/resource_node.go):

- a **subtree quota** `S`: a tenant's nominal; a cohort's own nominal plus what each child
  makes available to it (the child's `S` less the part of it the child keeps);
- a **local quota** (what the node keeps, never lent to its parent): `S - lendingLimit` when
  the node has a lending limit (a tenant's guaranteed part), else 0;
- a **usage** `U`: a tenant's usage; a cohort's, what its children use beyond their local
  quotas (the usage "stored" at this level).

Borrowing goes up the tree and lending down: what a node may still take (`available`) is what
its local quota has left, plus what its parent may still give it, capped by the node's own
borrowing limit (its usage in the parent may not pass what it lends there plus the limit).
The root has only its subtree quota. This is Kueue's rule with one difference: an overrun
elsewhere in the tree (usage above quota after a policy shrank it) never eats a node's local
quota: what a parent can give is never counted below zero (docs/tenancy.md), where Kueue
lets it make every node's available capacity 0 ("oversubscription spills into cohort").

Pure: values in, values out. Amounts are integer milli-units.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from services.common.quota.tree import CohortTree, NodeKey

__all__ = ["Levels", "tree_levels"]


def tree_levels(tree: CohortTree, resource: str, usage: Mapping[str, int], key: NodeKey) -> Levels:
    """One resource's quota and usage at every node of `key`'s tree, from `usage`
    (tenant -> its usage of the resource)."""
    root = tree.root(key)
    levels = Levels(tree, resource)
    levels.fill(root, usage)
    return levels


@dataclass
class Levels:
    """One resource across one tree: subtree quota, local quota and usage of every node."""

    tree: CohortTree
    resource: str
    subtree: dict[NodeKey, int] = field(default_factory=dict)
    local: dict[NodeKey, int] = field(default_factory=dict)
    usage: dict[NodeKey, int] = field(default_factory=dict)

    def fill(self, key: NodeKey, usage: Mapping[str, int]) -> None:
        limits = self.tree.limits(key, self.resource)
        own = limits.nominal if limits is not None else 0
        if key[0] == "tenant":
            self.subtree[key] = own
            self.usage[key] = usage.get(key[1], 0)
        else:
            quota, used = own, 0
            for child in self.tree.children(key):
                self.fill(child, usage)
                quota += self.subtree[child] - self.local[child]
                used += max(0, self.usage[child] - self.local[child])
            self.subtree[key], self.usage[key] = quota, used
        lending = limits.lending_limit if limits is not None else None
        self.local[key] = 0 if lending is None else max(0, self.subtree[key] - lending)

    def _borrowing_limit(self, key: NodeKey) -> int | None:
        limits = self.tree.limits(key, self.resource)
        return limits.borrowing_limit if limits is not None else None

    def available(self, key: NodeKey) -> int:
        """What the node may still take: its local quota left, plus what its parent may still
        give it within its borrowing limit (negative only at an overrun root; an overrun
        above a node never takes its local quota)."""
        used, local = self.usage[key], self.local[key]
        parent = self.tree.parent(key)
        if parent is None:
            return self.subtree[key] - used
        from_parent = max(0, self.available(parent))
        limit = self._borrowing_limit(key)
        if limit is not None:
            stored = self.subtree[key] - local  # what it lends to its parent
            used_there = max(0, used - local)
            from_parent = max(0, min(from_parent, stored - used_there + limit))
        return max(0, local - used) + from_parent

    def potential(self, key: NodeKey) -> int:
        """What the node could take with nothing used anywhere, within its borrowing limits
        (Kueue's potentialAvailable: what a cohort can lend, for fair sharing)."""
        parent = self.tree.parent(key)
        if parent is None:
            return self.subtree[key]
        most = self.local[key] + self.potential(parent)
        limit = self._borrowing_limit(key)
        if limit is not None:
            most = min(most, self.subtree[key] + limit)
        return most

    def borrowing(self, key: NodeKey, extra: int = 0) -> bool:
        """Whether the node uses more than its subtree quota (with `extra` more)."""
        return self.usage[key] + extra > self.subtree[key]

    def lent(self) -> dict[NodeKey, int]:
        """How much of each node's unused lendable quota others use now. At each cohort, what
        its children use beyond what they make available (and what its parent's other
        children use of it) is charged to its own quota first, then to its children's unused
        lendable parts in name order (cohorts first): a deterministic attribution."""
        charged: dict[NodeKey, int] = {}

        def visit(key: NodeKey, from_parent: int) -> None:
            charged[key] = from_parent
            if key[0] == "tenant":
                return
            kids = self.tree.children(key)
            spare: list[tuple[NodeKey, int]] = []
            demand = from_parent
            for child in kids:
                gives = self.subtree[child] - self.local[child]
                takes = max(0, self.usage[child] - self.local[child])
                demand += max(0, takes - gives)
                spare.append((child, max(0, gives - takes)))
            limits = self.tree.limits(key, self.resource)
            demand -= min(demand, limits.nominal if limits is not None else 0)
            for child, left in spare:
                take = min(left, demand)
                demand -= take
                visit(child, take)

        for key in self.subtree:
            if self.tree.parent(key) is None:
                visit(key, 0)
        return charged
