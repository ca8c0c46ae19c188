"""Runtime of CEL comprehensions: all, exists, exists_one, map, filter, the two-variable forms
(ext TwoVarComprehensions: all, exists, existsOne, transformList, transformMap) and cel.bind.

Each builder takes compiled sub-expressions (`Eval`: Frame -> value) and returns one. Loop
variables live in `frame.vars` for the duration of the loop and are restored afterwards, so
nested comprehensions may shadow names. Every iteration charges STEP_COST units before running
the body; this, with the body's own charges, is what stops `[..].all(x, [..].all(y, ...))` chains.

Error semantics follow cel-go: `all` is false as soon as one predicate is false, even if another
errored; `exists` is true as soon as one is true; otherwise the first error wins. `exists_one`,
`map` and `filter` propagate the first error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from services.cel.values import EvalError, Frame, type_name

__all__ = ["Eval", "bind", "count_one", "quantifier", "transform_list", "transform_map"]

Eval = Callable[[Frame], Any]
STEP_COST = 2  # cel-go charges a loop condition and a loop step per iteration
_UNSET = object()


def _rows(value: Any, width: int) -> list[tuple[Any, ...]]:
    """The loop rows: list elements / map keys, or (index, element) / (key, value) pairs."""
    if isinstance(value, list):
        return [(v,) for v in value] if width == 1 else list(enumerate(value))
    if isinstance(value, dict):
        return [(k,) for k in value] if width == 1 else list(value.items())
    raise EvalError(f"expression of type '{type_name(value)}' cannot be range of a comprehension")


class _Scope:
    """Binds loop variables in a frame and restores the outer values on exit."""

    __slots__ = ("frame", "names", "saved")

    def __init__(self, frame: Frame, names: Sequence[str]) -> None:
        self.frame = frame
        self.names = names
        self.saved = [frame.vars.get(n, _UNSET) for n in names]

    def bind(self, row: tuple[Any, ...]) -> None:
        self.frame.charge(STEP_COST)
        for name, value in zip(self.names, row, strict=True):
            self.frame.vars[name] = value

    def restore(self) -> None:
        for name, value in zip(self.names, self.saved, strict=True):
            if value is _UNSET:
                self.frame.vars.pop(name, None)
            else:
                self.frame.vars[name] = value


def quantifier(target: Eval, names: Sequence[str], predicate: Eval, decisive: bool) -> Eval:
    """`all` (decisive=False: one false decides) or `exists` (decisive=True)."""

    def run(frame: Frame) -> bool:
        rows = _rows(target(frame), len(names))
        scope = _Scope(frame, names)
        error: EvalError | None = None
        try:
            for row in rows:
                scope.bind(row)
                try:
                    value = predicate(frame)
                except EvalError as exc:
                    error = error or exc
                    continue
                if type(value) is bool and value == decisive:
                    return value
                if type(value) is not bool:
                    error = error or EvalError(f"predicate must be bool, not {type_name(value)}")
        finally:
            scope.restore()
        if error is not None:
            raise error
        return not decisive

    return run


def count_one(target: Eval, names: Sequence[str], predicate: Eval) -> Eval:
    """`exists_one` / `existsOne`: exactly one row satisfies the predicate."""

    def run(frame: Frame) -> bool:
        rows = _rows(target(frame), len(names))
        scope = _Scope(frame, names)
        count = 0
        try:
            for row in rows:
                scope.bind(row)
                value = predicate(frame)
                if type(value) is not bool:
                    raise EvalError(f"predicate must be bool, not {type_name(value)}")
                count += value
        finally:
            scope.restore()
        return count == 1

    return run


def _keep(frame: Frame, keep: Eval | None) -> bool:
    if keep is None:
        return True
    value = keep(frame)
    if type(value) is not bool:
        raise EvalError(f"filter must be bool, not {type_name(value)}")
    return bool(value)


def transform_list(
    target: Eval, names: Sequence[str], keep: Eval | None, value: Eval | None
) -> Eval:
    """`map(x, [keep,] t)`, `filter(x, p)` (value None: keep the element itself) and
    `transformList(i, v, [keep,] t)`."""

    def run(frame: Frame) -> list[Any]:
        rows = _rows(target(frame), len(names))
        scope = _Scope(frame, names)
        result: list[Any] = []
        try:
            for row in rows:
                scope.bind(row)
                if _keep(frame, keep):
                    result.append(row[-1] if value is None else value(frame))
        finally:
            scope.restore()
        return result

    return run


def transform_map(target: Eval, names: Sequence[str], keep: Eval | None, value: Eval) -> Eval:
    """`transformMap(k, v, [keep,] t)`: same keys, transformed values."""

    def run(frame: Frame) -> dict[Any, Any]:
        rows = _rows(target(frame), len(names))
        scope = _Scope(frame, names)
        result: dict[Any, Any] = {}
        try:
            for row in rows:
                scope.bind(row)
                if _keep(frame, keep):
                    result[row[0]] = value(frame)
        finally:
            scope.restore()
        return result

    return run


def bind(name: str, init: Eval, body: Eval) -> Eval:
    """`cel.bind(name, init, body)`: evaluate init once, then body with `name` bound to it."""

    def run(frame: Frame) -> Any:
        scope = _Scope(frame, (name,))
        try:
            scope.bind((init(frame),))
            return body(frame)
        finally:
            scope.restore()

    return run
