"""CEL list and set functions for selectors: Kubernetes lists (isSorted, sum, min, max, indexOf,
lastIndexOf — the last two live with the string versions in cel_strings), cel-go ext lists
(slice, flatten, distinct, reverse, sort, lists.range) and ext Sets.

Element comparisons use CEL equality and ordering from cel_values; quadratic helpers (distinct,
sets.*) charge for their pairwise work up front.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.cel.values import (
    EvalError,
    Frame,
    Function,
    Impl,
    add,
    equal,
    fn,
    int_arg,
    less,
    no_overload,
    ordered,
)

__all__ = ["COLLECTION_FUNCTIONS", "COLLECTION_METHODS"]


def _list_arg(name: str, value: Any, *rest: Any) -> list[Any]:
    if not isinstance(value, list):
        raise no_overload(name, value, *rest)
    return value


def _is_sorted(frame: Frame, value: Any) -> bool:
    items = _list_arg("isSorted", value)
    frame.charge(1 + len(items))
    return not any(less(b, a) for a, b in zip(items, items[1:], strict=False))


def _sum(frame: Frame, value: Any) -> Any:
    items = _list_arg("sum", value)
    if not items:
        return 0
    total = items[0]
    for item in items[1:]:
        total = add(frame, total, item)
    return total


def _extreme(name: str, pick_second: Callable[[Any, Any], bool]) -> Impl:
    def impl(frame: Frame, value: Any) -> Any:
        items = _list_arg(name, value)
        frame.charge(1 + len(items))
        if not items:
            raise EvalError(f"{name} called on empty list")
        best = items[0]
        for item in items[1:]:
            if pick_second(best, item):
                best = item
        return best

    return impl


def _slice(frame: Frame, value: Any, start: Any, stop: Any) -> list[Any]:
    items = _list_arg("slice", value, start, stop)
    start, stop = int_arg("slice", items, start), int_arg("slice", items, stop)
    frame.charge(1 + (stop - start if 0 <= start <= stop else 0))
    if not 0 <= start <= stop <= len(items):
        raise EvalError(f"cannot slice({start}, {stop}) a list of size {len(items)}")
    return items[start:stop]


def _flatten(frame: Frame, value: Any, depth: Any = 1) -> list[Any]:
    items = _list_arg("flatten", value, depth)
    depth = int_arg("flatten", items, depth)
    if depth < 0:
        raise EvalError("flatten: level must be non-negative")
    frame.charge(1 + len(items))
    flat: list[Any] = []
    for item in items:
        if isinstance(item, list) and depth > 0:
            flat.extend(_flatten(frame, item, depth - 1))
        else:
            flat.append(item)
    return flat


def _distinct(frame: Frame, value: Any) -> list[Any]:
    items = _list_arg("distinct", value)
    frame.charge(1 + len(items) * len(items) // 10)
    unique: list[Any] = []
    for item in items:
        if not any(equal(item, seen) for seen in unique):
            unique.append(item)
    return unique


def _reverse(frame: Frame, value: Any) -> list[Any]:
    items = _list_arg("reverse", value)
    frame.charge(1 + len(items))
    return items[::-1]


def _sort(frame: Frame, value: Any) -> list[Any]:
    items = _list_arg("sort", value)
    frame.charge(1 + len(items) * max(1, len(items).bit_length()))
    for a, b in zip(items, items[1:], strict=False):
        ordered("sort", a, b)
        if type(a) is not type(b):
            raise EvalError("sort: list elements must have the same type")
    return sorted(items)


def _range(frame: Frame, count: Any) -> list[Any]:
    count = int_arg("lists.range", count, count)
    frame.charge(1 + max(count, 0))
    return list(range(max(count, 0)))


def _set_test(name: str, test: Callable[[list[Any], list[Any]], bool]) -> Impl:
    def impl(frame: Frame, first: Any, second: Any) -> bool:
        if not isinstance(first, list) or not isinstance(second, list):
            raise no_overload(name, first, second)
        frame.charge(1 + len(first) * len(second) // 10)
        return test(first, second)

    return impl


def _contains_all(whole: list[Any], part: list[Any]) -> bool:
    return all(any(equal(p, w) for w in whole) for p in part)


def _equivalent(first: list[Any], second: list[Any]) -> bool:
    return _contains_all(first, second) and _contains_all(second, first)


def _intersects(first: list[Any], second: list[Any]) -> bool:
    return any(equal(a, b) for a in first for b in second)


COLLECTION_FUNCTIONS: dict[str, Function] = {
    "lists.range": fn((1,), _range, "list"),
    "sets.contains": fn((2,), _set_test("sets.contains", _contains_all), "bool"),
    "sets.equivalent": fn((2,), _set_test("sets.equivalent", _equivalent), "bool"),
    "sets.intersects": fn((2,), _set_test("sets.intersects", _intersects), "bool"),
}

COLLECTION_METHODS: dict[str, Function] = {
    "isSorted": fn((0,), _is_sorted, "bool"),
    "sum": fn((0,), _sum),
    "min": fn((0,), _extreme("min", lambda best, x: less(x, best))),
    "max": fn((0,), _extreme("max", lambda best, x: less(best, x))),
    "slice": fn((2,), _slice, "list"),
    "flatten": fn((0, 1), _flatten, "list"),
    "distinct": fn((0,), _distinct, "list"),
    "reverse": fn((0,), _reverse, "list"),
    "sort": fn((0,), _sort, "list"),
}
