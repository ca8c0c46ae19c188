"""How much text a document may be, how deep and how many values: bounded work per input.

Every YAML/JSON text gpualloc reads — a `-f` file, stdin, ApplyResourceSlices' `manifest`, an
annotation — is checked against `DocumentLimits` before it can cost much: its size first (a
file or stdin is read no further than the limit), then, while it is decoded, its nesting depth
and its number of values. YAML aliases count as often as they are used, so a few KiB of
`*anchor` references ("billion laughs") cannot stand for millions of values to decode.

Going over a limit is a ParseError (INVALID_ARGUMENT over gRPC, exit 2 in a CLI) whose message
names the limit and the variable that raises it. Deeply nested JSON never reaches Python's
recursion limit as a RecursionError: it is the same ParseError.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from services.common.errors import ParseError

__all__ = [
    "MAX_DEPTH",
    "MAX_SUGGESTION_CANDIDATES",
    "MAX_UNKNOWN_FIELDS",
    "DocumentLimits",
    "check_size",
    "check_yaml_node",
    "checked_json_loads",
    "check_value",
]

MAX_DEPTH = 100
"""Levels of nesting a document may have. A kubectl-printed ResourceSlice List is 8 deep; the
CPython JSON decoder gives up near 1,000 (less in a deep call stack); 100 is far from both."""

MAX_UNKNOWN_FIELDS = 20
"""Unknown fields reported per object (strict decoding, _schema.py); the rest are counted."""

MAX_SUGGESTION_CANDIDATES = 1_000
"""Names a "did you mean" compares a typo with (suggest.py). difflib took 42 ms for 1,000 node
names on the 2-core development machine under load (and 0.4 s for 10,000): past this many, an
error message would cost more than the request that caused it, so no suggestion is made."""


@dataclass(frozen=True)
class DocumentLimits:
    """The bounds of one text (all its documents together)."""

    max_bytes: int = 8 * 2**20
    max_nodes: int = 1_000_000
    max_depth: int = MAX_DEPTH

    def size_message(self, size: int | None = None) -> str:
        """`size`: the document's size, when known (a stream read up to the limit is not)."""
        measured = f"is {_mib(size)}, " if size is not None else "is "
        return (
            f"{measured}more than the {_mib(self.max_bytes)} a document may be "
            "(GPUALLOC_MAX_DOCUMENT_BYTES)"
        )

    def nodes_message(self) -> str:
        return (
            f"has more than {self.max_nodes:,} values (aliases counted each time they are used; "
            "the limit is GPUALLOC_MAX_DOCUMENT_NODES)"
        )

    def depth_message(self) -> str:
        return f"is nested deeper than {self.max_depth} levels (the limit of a document's depth)"


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size:,} bytes"


def check_size(text: str, source: str, limits: DocumentLimits) -> None:
    """ParseError when `text` is larger (in UTF-8 bytes) than the limit."""
    if len(text) <= limits.max_bytes // 4:
        return  # cheap: even 4 bytes per character would fit
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise ParseError(limits.size_message(size), source)


def checked_json_loads(text: str, source: str, limits: DocumentLimits | None = None) -> Any:
    """`json.loads` that answers ParseError, never RecursionError, for a deep document, and
    checks depth and value count. JSONDecodeError passes through for the caller to word."""
    limits = limits or DocumentLimits()
    check_size(text, source, limits)
    try:
        value = json.loads(text)
    except RecursionError:
        raise ParseError(limits.depth_message(), source) from None
    check_value(value, source, limits)
    return value


def check_value(value: object, source: str, limits: DocumentLimits, used: int = 0) -> int:
    """Depth and value count of decoded JSON (`used`: values counted before this one); returns
    the new count. Iterative, so that it cannot itself run out of stack."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        used += 1
        if used > limits.max_nodes:
            raise ParseError(limits.nodes_message(), source)
        if depth > limits.max_depth:
            raise ParseError(limits.depth_message(), source)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return used


def check_yaml_node(node: yaml.Node, source: str, limits: DocumentLimits, used: int = 0) -> int:
    """Depth and value count of a composed YAML document, walking aliases as often as they are
    used (the walk stops at the limit, so it is bounded even for a recursive alias)."""
    for depth, child in _walk(node):
        used += 1
        if used > limits.max_nodes:
            raise ParseError(limits.nodes_message(), source, child.start_mark.line + 1)
        if depth > limits.max_depth:
            raise ParseError(limits.depth_message(), source, child.start_mark.line + 1)
    return used


def _walk(root: yaml.Node) -> Iterator[tuple[int, yaml.Node]]:
    stack: list[tuple[int, yaml.Node]] = [(1, root)]
    while stack:
        depth, node = stack.pop()
        yield depth, node
        if isinstance(node, yaml.SequenceNode):
            stack.extend((depth + 1, child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, child in node.value:
                stack.append((depth + 1, key))
                stack.append((depth + 1, child))
