"""Kubernetes label selectors as `kubectl get -l` reads them, for the CLI's `get` verbs.

    parse_selector("topology.kubernetes.io/zone=zone-a,gpu!=none,env in (prod, dev),!spot")

Equality (`k=v`, `k==v`, `k!=v`), set (`k in (a,b)`, `k notin (a,b)`) and existence (`k`,
`!k`) requirements, comma-separated, all of which must hold (as in apimachinery's
labels.Parse). A value that is not a label value, or a dangling operator, is an
InvalidArgument naming the selector.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from services.common.errors import InvalidArgument

__all__ = ["Requirement", "Selector", "parse_selector"]

_KEY = r"(?:[A-Za-z0-9.\-]+/)?[A-Za-z0-9](?:[A-Za-z0-9_.\-]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9](?:[A-Za-z0-9_.\-]*[A-Za-z0-9])?)?"
_SET = re.compile(rf"^({_KEY})\s+(in|notin)\s+\(([^)]*)\)$")
_EQUALITY = re.compile(rf"^({_KEY})\s*(==|!=|=)\s*({_VALUE})$")
_EXISTS = re.compile(rf"^(!?)\s*({_KEY})$")
_VALUE_ONLY = re.compile(rf"^{_VALUE}$")


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "exists":
            return value is not None
        if self.operator == "!exists":
            return value is None
        if self.operator == "in":
            return value is not None and value in self.values
        return value is None or value not in self.values  # notin, != : absent keys match


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def __call__(self, labels: Mapping[str, str]) -> bool:
        return self.matches(labels)


def parse_selector(text: str) -> Selector:
    """The selector `text` (empty: everything matches)."""
    return Selector(tuple(_requirement(part.strip(), text) for part in _split(text)))


def _split(text: str) -> list[str]:
    """Commas outside parentheses separate requirements."""
    parts, depth, current = [], 0, ""
    for character in text:
        depth += {"(": 1, ")": -1}.get(character, 0)
        if character == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += character
    parts.append(current)
    return [p for p in parts if p.strip()] if text.strip() else []


def _requirement(part: str, text: str) -> Requirement:
    bad: Callable[[str], InvalidArgument] = lambda why: InvalidArgument.at(  # noqa: E731
        "--selector", f"{text!r}: {why}"
    )
    if match := _SET.match(part):
        values = [v.strip() for v in match[3].split(",") if v.strip()]
        if not values or not all(_VALUE_ONLY.match(v) for v in values):
            raise bad(f"{part!r} needs label values in its parentheses")
        return Requirement(match[1], match[2], frozenset(values))
    if match := _EQUALITY.match(part):
        operator = "notin" if match[2] == "!=" else "in"
        return Requirement(match[1], operator, frozenset({match[3]}))
    if match := _EXISTS.match(part):
        return Requirement(match[2], "!exists" if match[1] else "exists")
    raise bad(f"cannot read {part!r} (key=value, key!=value, key in (a,b), key, !key)")
