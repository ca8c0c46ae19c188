"""Values of frozen dataclasses made without their generated `__init__`.

A frozen dataclass's `__init__` sets each field through `object.__setattr__` (its own
`__setattr__` refuses): for a result of ten fields that is most of what making it costs, and a
batch makes one per item (results.py). `made` gives the instance `__init__` would give — the
same fields in the same order in its `__dict__`, so equal, hashed and shown alike — from a dict
of every field, for dataclasses whose `__init__` does nothing else (no `__post_init__`, no
slots, no `InitVar`); `check_made` says whether a class is one, and
tests/unit/allocator/test_made.py compares both ways of making each class this is used for.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["check_made", "made"]

_T = TypeVar("_T")
_new = object.__new__
_set = object.__setattr__


def made(cls: type[_T], fields: dict[str, Any]) -> _T:
    """`cls(**fields)` for a dataclass `check_made` accepts; `fields` holds every field, in
    the class's field order, and becomes the instance's own (the caller's new dict)."""
    value = _new(cls)
    _set(value, "__dict__", fields)
    return value


def check_made(cls: type, names: tuple[str, ...]) -> None:
    """Raise TypeError unless `made(cls, ...)` with exactly `names` (in order) is what
    `cls(...)` makes: a dataclass with those fields whose `__init__` only sets them."""
    if not dataclasses.is_dataclass(cls) or "__slots__" in vars(cls):
        raise TypeError(f"{cls.__name__}: not a dataclass with a __dict__")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: its __init__ runs __post_init__")
    fields = tuple(f.name for f in dataclasses.fields(cls))
    if fields != names or len(dataclasses.fields(cls)) != len(cls.__dataclass_fields__):
        raise TypeError(f"{cls.__name__}: fields {fields}, not {names}")
