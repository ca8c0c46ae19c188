"""Semantic versions (semver 2.0.0) as CEL selectors see them: version attributes and `semver()`.

Parsing follows github.com/blang/semver/v4, which Kubernetes uses for DRA version attributes and
for the CEL `semver()` function: `Parse` is strict semver 2.0.0 (no `v` prefix, no leading zeros,
all three components), `ParseTolerant` (selected by `semver(s, true)`) trims spaces, strips a `v`
prefix, drops leading zeros and fills a missing minor/patch with 0. Precedence follows semver.org
§11: numeric core, then a release ranks above any of its pre-releases, pre-release identifiers
compare numerically when both are numeric, numeric below alphanumeric, and otherwise ASCII-wise;
build metadata never counts, so it is also ignored by `==` (as upstream's `Semver.Equal`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

__all__ = ["Version"]

_IDENTIFIER = re.compile(r"[0-9A-Za-z-]+")
_NUMERIC = re.compile(r"0|[1-9][0-9]*")
_MAX_COMPONENT = 2**64 - 1  # blang/semver stores uint64


@total_ordering
@dataclass(frozen=True, eq=False)
class Version:
    """A parsed semantic version; compare with `compare`, `<`, `==` (build metadata ignored)."""

    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()
    build: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str, *, normalize: bool = False) -> Version:
        """Strict semver 2.0.0, or blang's tolerant form when `normalize`; ValueError otherwise."""
        if normalize:
            text = _tolerant(text)
        core, plus, build_text = text.partition("+")
        core, dash, pre_text = core.partition("-")
        parts = core.split(".")
        if len(parts) != 3:
            raise ValueError(f"version {text!r} must have the form MAJOR.MINOR.PATCH")
        numbers = [_component(part, text) for part in parts]
        prerelease = _identifiers(pre_text, text, numeric_rule=True) if dash else ()
        build = _identifiers(build_text, text, numeric_rule=False) if plus else ()
        return cls(numbers[0], numbers[1], numbers[2], prerelease, build)

    @classmethod
    def is_valid(cls, text: str, *, normalize: bool = False) -> bool:
        try:
            cls.parse(text, normalize=normalize)
        except ValueError:
            return False
        return True

    def compare(self, other: Version) -> int:
        """-1, 0 or 1 by semver precedence."""
        mine = (self.major, self.minor, self.patch)
        theirs = (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        return _compare_prerelease(self.prerelease, other.prerelease)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self.compare(other) == 0

    def __lt__(self, other: Version) -> bool:
        return self.compare(other) < 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.prerelease))

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text


def _component(part: str, text: str) -> int:
    if not _NUMERIC.fullmatch(part):
        raise ValueError(f"version {text!r}: {part!r} is not a number without leading zeros")
    value = int(part)
    if value > _MAX_COMPONENT:
        raise ValueError(f"version {text!r}: {part!r} is out of range")
    return value


def _identifiers(text: str, version: str, *, numeric_rule: bool) -> tuple[str, ...]:
    identifiers = tuple(text.split("."))
    for identifier in identifiers:
        if not _IDENTIFIER.fullmatch(identifier):
            raise ValueError(f"version {version!r}: invalid identifier {identifier!r}")
        if numeric_rule and identifier.isdigit() and not _NUMERIC.fullmatch(identifier):
            raise ValueError(f"version {version!r}: {identifier!r} has a leading zero")
    return identifiers


def _tolerant(text: str) -> str:
    """blang/semver ParseTolerant's rewriting, before the strict parse."""
    text = text.strip().removeprefix("v")
    parts = text.split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            stripped = part.lstrip("0")
            if not stripped or not stripped[0].isdigit():
                stripped = "0" + stripped
            parts[i] = stripped
    if len(parts) < 3:
        if any(c in parts[-1] for c in "+-"):
            raise ValueError(f"short version {text!r} cannot carry pre-release or build metadata")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


def _compare_prerelease(mine: tuple[str, ...], theirs: tuple[str, ...]) -> int:
    if mine == theirs:
        return 0
    if not mine:
        return 1  # a release ranks above its pre-releases
    if not theirs:
        return -1
    for a, b in zip(mine, theirs, strict=False):
        if a == b:
            continue
        a_num, b_num = a.isdigit(), b.isdigit()
        if a_num and b_num:
            return -1 if int(a) < int(b) else 1
        if a_num != b_num:
            return -1 if a_num else 1
        return -1 if a < b else 1
    return -1 if len(mine) < len(theirs) else 1
