"""The cohort tree's shape: Kueue's hierarchical cohorts as the policy declares them.

A tree's nodes are tenants (Kueue's ClusterQueues, always leaves) and cohorts (Kueue's Cohort
objects: a parent, quotas of their own, lending and borrowing limits). This module is the
model's half: each node's parent, children, root and quotas, built by QuotaModel
(services/common/quota/model.py) from the tenants' and cohorts' quotas. The rule's half, the
arithmetic of what every node may still take, is services/allocator/core/quota/levels.py.

Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, Protocol

__all__ = [
    "CohortCycle",
    "CohortTree",
    "Limits",
    "NodeKey",
    "TreeNode",
    "cohort_node",
    "tenant_node",
]

Kind = Literal["tenant", "cohort"]
NodeKey = tuple[Kind, str]  # ("tenant", name) or ("cohort", name)


def tenant_node(name: str) -> NodeKey:
    return ("tenant", name)


def cohort_node(name: str) -> NodeKey:
    return ("cohort", name)


class Limits(Protocol):
    """One node's quota of one resource (model.py's QuotaLimits)."""

    @property
    def nominal(self) -> int: ...

    @property
    def borrowing_limit(self) -> int | None: ...

    @property
    def lending_limit(self) -> int | None: ...


@dataclass(frozen=True)
class TreeNode:
    """A tenant or a cohort: its parent cohort ("" for a root), its quotas per resource and its
    fair-sharing weight."""

    key: NodeKey
    parent: str
    limits: Mapping[str, Limits]
    weight: Fraction = Fraction(1)


class CohortCycle(ValueError):
    """Cohorts whose parents lead back to themselves."""


_NO_LIMITS: Mapping[str, Limits] = {}


class CohortTree:
    """The shape of the forest: each node's parent, children and root. A cohort that a tenant
    or another cohort names but nobody declares is a root with no quotas of its own (as Kueue
    creates an implicit Cohort)."""

    def __init__(self, nodes: Iterable[TreeNode]) -> None:
        self._nodes: dict[NodeKey, TreeNode] = {}
        for node in nodes:
            self._nodes[node.key] = node
        for node in list(self._nodes.values()):
            if node.parent and cohort_node(node.parent) not in self._nodes:
                self._nodes[cohort_node(node.parent)] = TreeNode(
                    cohort_node(node.parent), "", _NO_LIMITS
                )
        self._children: dict[NodeKey, list[NodeKey]] = {}
        for node in self._nodes.values():
            if node.parent:
                self._children.setdefault(cohort_node(node.parent), []).append(node.key)
        for kids in self._children.values():
            kids.sort(key=lambda key: (key[0] == "tenant", key[1]))  # cohorts, then tenants
        self._roots: dict[NodeKey, NodeKey] = {}
        for key in self._nodes:
            self._roots[key] = self._find_root(key)

    def _find_root(self, key: NodeKey) -> NodeKey:
        seen = {key}
        while True:
            parent = self.parent(key)
            if parent is None:
                return key
            if parent in seen:
                raise CohortCycle(f"cohort {parent[1]!r} is its own ancestor")
            seen.add(parent)
            key = parent

    def __contains__(self, key: object) -> bool:
        return key in self._nodes

    def node(self, key: NodeKey) -> TreeNode:
        return self._nodes[key]

    def nodes(self) -> Iterable[NodeKey]:
        return self._nodes.keys()

    def parent(self, key: NodeKey) -> NodeKey | None:
        name = self._nodes[key].parent
        return cohort_node(name) if name else None

    def children(self, key: NodeKey) -> tuple[NodeKey, ...]:
        """A cohort's children: its cohorts, then its tenants, each by name."""
        return tuple(self._children.get(key, ()))

    def ancestors(self, key: NodeKey) -> tuple[NodeKey, ...]:
        """From the node's parent up to its root."""
        found = []
        parent = self.parent(key)
        while parent is not None:
            found.append(parent)
            parent = self.parent(parent)
        return tuple(found)

    def root(self, key: NodeKey) -> NodeKey:
        return self._roots[key]

    def path(self, key: NodeKey) -> tuple[str, ...]:
        """The cohorts from the root down to the node's parent, by name."""
        return tuple(reversed([name for _, name in self.ancestors(key)]))

    def subtree(self, key: NodeKey) -> tuple[NodeKey, ...]:
        """The node and everything below it, parents before children."""
        found = [key]
        for child in self.children(key):
            found.extend(self.subtree(child))
        return tuple(found)

    def tenants_under(self, key: NodeKey) -> tuple[str, ...]:
        return tuple(sorted(name for kind, name in self.subtree(key) if kind == "tenant"))

    def limits(self, key: NodeKey, resource: str) -> Limits | None:
        return self._nodes[key].limits.get(resource)
