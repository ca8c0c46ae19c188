"""Node access: does a node see a slice or device, and which NodeSelector does an allocation get.

Matching follows core/v1 node affinity as kube-scheduler's `nodeaffinity.NodeSelector` does it:
terms are ORed, requirements inside a term ANDed, `matchExpressions` read the node's labels and
`matchFields` read `metadata.name`; an empty term matches nothing and a nil node matches no
selector. `allocation_node_selector` is upstream's `createNodeSelector`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from services.common.dra.model import (
    Node,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceSlice,
)
from services.common.errors import FailedPrecondition

__all__ = [
    "METADATA_NAME",
    "InvalidNodeSelector",
    "NodeAccess",
    "allocation_node_selector",
    "check_node_selector",
    "node_selector_matches",
]

METADATA_NAME = "metadata.name"
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class InvalidNodeSelector(ValueError):
    """A node selector the node-affinity matcher would refuse to parse."""


@dataclass(frozen=True)
class NodeAccess:
    """Where a device can be used: exactly one of the three is set (or none: nowhere).
    `binds_to_node` (the device's bindsToNode) pins an allocation of it to the node it was
    made for, wherever the device is reachable from."""

    node_name: str | None = None
    node_selector: NodeSelector | None = None
    all_nodes: bool = False
    binds_to_node: bool = False

    @classmethod
    def of_slice(cls, slice_: ResourceSlice) -> NodeAccess:
        return cls(slice_.node_name or None, slice_.node_selector, slice_.all_nodes)

    def matches(self, node: Node | None) -> bool:
        """Upstream `nodeMatches`: node name first, then allNodes, then the selector."""
        if self.node_name:
            return node is not None and node.name == self.node_name
        if self.all_nodes:
            return True
        if self.node_selector is not None:
            return node_selector_matches(self.node_selector, node)
        return False


def check_node_selector(selector: NodeSelector) -> None:
    """Raise InvalidNodeSelector where upstream's `nodeaffinity.NewNodeSelector` fails."""
    for t, term in enumerate(selector.node_selector_terms):
        for i, req in enumerate(term.match_expressions):
            problem = _expression_problem(req)
            if problem:
                raise InvalidNodeSelector(
                    f"nodeSelectorTerms[{t}].matchExpressions[{i}]: {problem}"
                )
        for i, req in enumerate(term.match_fields):
            problem = _field_problem(req)
            if problem:
                raise InvalidNodeSelector(f"nodeSelectorTerms[{t}].matchFields[{i}]: {problem}")


def _expression_problem(req: NodeSelectorRequirement) -> str | None:
    op, values = req.operator, req.values
    if op in ("In", "NotIn"):
        return None if values else f"values: must be specified for operator {op}"
    if op in ("Exists", "DoesNotExist"):
        return f"values: may not be specified for operator {op}" if values else None
    if op in ("Gt", "Lt"):
        if len(values) != 1:
            return f"values: must have exactly one value for operator {op}"
        return None if _parse_int64(values[0]) is not None else "values: must be an integer"
    return f"operator: unsupported value {op!r}"


def _field_problem(req: NodeSelectorRequirement) -> str | None:
    if req.operator not in ("In", "NotIn"):
        return f"operator: unsupported value {req.operator!r}: supported values: In, NotIn"
    return None if len(req.values) == 1 else "values: must have one element"


def node_selector_matches(selector: NodeSelector, node: Node | None) -> bool:
    if node is None:
        return False
    return any(_term_matches(term, node) for term in selector.node_selector_terms)


def _term_matches(term: NodeSelectorTerm, node: Node) -> bool:
    if not term.match_expressions and not term.match_fields:
        return False
    labels = node.labels
    if not all(_label_matches(req, labels) for req in term.match_expressions):
        return False
    fields = {METADATA_NAME: node.name}
    return all(_field_matches(req, fields) for req in term.match_fields)


def _label_matches(req: NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    op, key = req.operator, req.key
    if op == "In":
        return key in labels and labels[key] in req.values
    if op == "NotIn":
        return key not in labels or labels[key] not in req.values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and len(req.values) == 1:
        have, want = _parse_int64(labels[key]), _parse_int64(req.values[0])
        if have is None or want is None:
            return False
        return have > want if op == "Gt" else have < want
    return False


def _field_matches(req: NodeSelectorRequirement, fields: Mapping[str, str]) -> bool:
    if len(req.values) != 1:
        return False
    value = fields.get(req.key, "")
    if req.operator == "In":
        return value == req.values[0]
    if req.operator == "NotIn":
        return value != req.values[0]
    return False


def _parse_int64(text: str) -> int | None:
    try:
        value = int(text, 10)
    except ValueError:
        return None
    return value if _INT64_MIN <= value <= _INT64_MAX else None


def allocation_node_selector(
    accesses: Iterable[NodeAccess], node_name: str | None
) -> NodeSelector | None:
    """Upstream `createNodeSelector` over the picked devices' node access, in pick order.

    A node-local device, or one that binds to its node (bindsToNode), pins the result to
    `node_name`; otherwise the single terms of all node selectors merge into one (requirements
    de-duplicated by key, operator and value set); allNodes contributes nothing, and if nothing
    remains the result is available everywhere.
    """
    fields: list[NodeSelectorRequirement] = []
    expressions: list[NodeSelectorRequirement] = []
    for access in accesses:
        if access.node_name or access.binds_to_node:
            pinned = NodeSelectorRequirement(METADATA_NAME, "In", (node_name or "",))
            return NodeSelector((NodeSelectorTerm(match_fields=(pinned,)),))
        if access.node_selector is None:
            continue
        terms = access.node_selector.node_selector_terms
        if len(terms) > 1:
            raise FailedPrecondition(
                f"unsupported ResourceSlice.NodeSelector with {len(terms)} terms"
            )
        if terms:
            _add_new(terms[0].match_fields, fields)
            _add_new(terms[0].match_expressions, expressions)
    if not fields and not expressions:
        return None
    term = NodeSelectorTerm(match_expressions=tuple(expressions), match_fields=tuple(fields))
    return NodeSelector((term,))


def _add_new(
    source: Iterable[NodeSelectorRequirement], target: list[NodeSelectorRequirement]
) -> None:
    for req in source:
        values = set(req.values)
        duplicate = any(
            have.key == req.key and have.operator == req.operator and set(have.values) == values
            for have in target
        )
        if not duplicate:
            target.append(req)
