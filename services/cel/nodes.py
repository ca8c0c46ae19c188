"""Building blocks of compiled selectors: the compile-time `Node`, the lark-tree helpers, the
call/fold/select closures, and `Reads`, the part of `device` an expression can observe.

Split out of cel_compile so that the compiler reads as one visitor over the grammar.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lark

from services.cel.macros import Eval
from services.cel.values import (
    CostExceeded,
    EvalError,
    Frame,
    Uint,
    equal,
    no_overload,
    select,
)

__all__ = [
    "FOLD_BUDGET",
    "PASS_THROUGH",
    "Branch",
    "CompileError",
    "Node",
    "Reads",
    "Tree",
    "bare_ident",
    "charged_select",
    "const",
    "contains",
    "extendable",
    "fold",
    "invoke",
    "trailing",
    "parse_integer",
    "unwrap",
    "where",
]

Tree = lark.Tree[lark.Token]
Branch = Tree | lark.Token
FOLD_BUDGET = 1000
# Grammar rules that, with one child, only wrap it (precedence levels, parentheses).
PASS_THROUGH = {"expr", "conditionalor", "conditionaland", "relation", "addition"}
PASS_THROUGH |= {"multiplication", "unary", "member", "primary", "paren_expr"}


class CompileError(Exception):
    """The expression is not a valid selector; the message says why (and where, if known)."""


@dataclass(eq=False)
class Node:
    """A compiled sub-expression: its closure, static type, `device` path and constant value."""

    run: Eval
    type: str | None = None  # static type, None = dyn
    path: tuple[str, ...] | None = None  # access path when rooted at `device`
    constant: Any = field(default=None)
    is_constant: bool = False


def const(value: Any, kind: str | None) -> Node:
    return Node(lambda frame: value, kind, constant=value, is_constant=True)


def where(tree: Tree | lark.Token) -> str:
    line = getattr(tree, "line", None) or getattr(getattr(tree, "meta", None), "line", None)
    column = getattr(tree, "column", None)
    if column is None:
        column = getattr(getattr(tree, "meta", None), "column", None)
    return f" at {line}:{column}" if line else ""


@dataclass(frozen=True)
class Reads:
    """The device values an expression can observe. `whole_device` means: all of them."""

    whole_device: bool = False
    driver: bool = False
    allow_multiple_allocations: bool = False
    attributes_all: bool = False
    attribute_domains: tuple[str, ...] = ()
    attribute_ids: tuple[tuple[str, str], ...] = ()
    capacity_all: bool = False
    capacity_domains: tuple[str, ...] = ()
    capacity_ids: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, leaves: list[tuple[str, ...]]) -> Reads:
        """From the maximal access paths, e.g. ("device", "attributes", "d", "id")."""
        if any(p == ("device",) for p in leaves):
            return cls(whole_device=True)
        attrs = _collect(leaves, "attributes")
        caps = _collect(leaves, "capacity")
        return cls(
            driver=("device", "driver") in leaves,
            allow_multiple_allocations=("device", "allowMultipleAllocations") in leaves,
            attributes_all=attrs[0],
            attribute_domains=attrs[1],
            attribute_ids=attrs[2],
            capacity_all=caps[0],
            capacity_domains=caps[1],
            capacity_ids=caps[2],
        )


def _collect(
    leaves: list[tuple[str, ...]], kind: str
) -> tuple[bool, tuple[str, ...], tuple[tuple[str, str], ...]]:
    mine = [p[2:] for p in leaves if p[1] == kind]
    if any(not p for p in mine):
        return True, (), ()
    domains = sorted({p[0] for p in mine if len(p) == 1})
    ids = sorted({(p[0], p[1]) for p in mine if len(p) == 2 and p[0] not in domains})
    return False, tuple(domains), tuple(ids)


def trailing(rest: list[Branch]) -> list[Branch]:
    """The children of an optional trailing exprlist/mapinits."""
    if rest and isinstance(rest[0], lark.Tree):
        return list(rest[0].children)
    return []


def fold(node: Node) -> Node:
    """Evaluate a call of constants once, at compile time (`quantity("40Gi")`, `semver(..)`).

    The folded node still charges what the call cost, so limits do not depend on folding. A
    call that fails or costs more than FOLD_BUDGET is left to fail (or run) at evaluation time.
    """
    frame = Frame({}, FOLD_BUDGET)
    try:
        value = node.run(frame)
    except (EvalError, CostExceeded):
        return node
    cost = FOLD_BUDGET - frame.budget

    def run(frame: Frame) -> Any:
        frame.charge(cost)
        return value

    return Node(run, node.type, constant=value, is_constant=True)


def extendable(path: tuple[str, ...] | None) -> bool:
    """`device.attributes`, `device.capacity` and their domain maps continue a path."""
    return path is not None and len(path) in (2, 3) and path[1] in ("attributes", "capacity")


def unwrap(tree: Any) -> Tree | None:
    while isinstance(tree, lark.Tree) and tree.data in PASS_THROUGH and len(tree.children) == 1:
        child = tree.children[0]
        if not isinstance(child, lark.Tree):
            break
        tree = child
    return tree if isinstance(tree, lark.Tree) else None


def bare_ident(tree: Any) -> str | None:
    inner = unwrap(tree)
    if inner is not None and inner.data == "ident":
        return str(inner.children[0])
    return None


def parse_integer(text: str, low: int, high: int, token: lark.Token) -> int:
    negative = text.startswith("-")
    digits = text.lstrip("-")
    value = int(digits, 16) if digits[:2].lower() == "0x" else int(digits)
    value = -value if negative else value
    if not low <= value <= high:
        raise CompileError(f"integer literal {text} is out of range{where(token)}")
    return value


def charged_select(frame: Frame, value: Any, name: str) -> Any:
    frame.charge(1)
    return select(value, name)


def contains(frame: Frame, item: Any, container: Any) -> bool:
    frame.charge(1)
    if isinstance(container, dict):
        if type(item) not in (str, int, Uint, bool, float):
            return False
        return item in container
    if isinstance(container, list):
        frame.charge(len(container) // 10)
        return any(equal(item, element) for element in container)
    raise no_overload("@in", item, container)


def invoke(name: str, impl: Callable[..., Any], arg_runs: list[Eval]) -> Eval:
    """A call node: evaluate the arguments left to right, then the implementation.

    Python errors an implementation did not anticipate (a TypeError from odd argument types,
    an OverflowError) become CEL errors naming the function rather than crashing the caller.
    One- and two-argument calls (most of them) skip building an argument list.
    """
    unexpected = (TypeError, ValueError, ArithmeticError, LookupError)
    if len(arg_runs) == 1:
        (only,) = arg_runs

        def run_one(frame: Frame) -> Any:
            value = only(frame)
            try:
                return impl(frame, value)
            except unexpected as exc:
                raise EvalError(f"{name}: {exc}") from None

        return run_one
    if len(arg_runs) == 2:
        first, second = arg_runs

        def run_two(frame: Frame) -> Any:
            a, b = first(frame), second(frame)
            try:
                return impl(frame, a, b)
            except unexpected as exc:
                raise EvalError(f"{name}: {exc}") from None

        return run_two

    def run(frame: Frame) -> Any:
        args = [arg(frame) for arg in arg_runs]
        try:
            return impl(frame, *args)
        except unexpected as exc:
            raise EvalError(f"{name}: {exc}") from None

    return run
