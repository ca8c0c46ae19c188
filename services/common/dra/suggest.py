""" "Did you mean …?" for a name that is not known: a device class, a field, an attribute, a node.

difflib's closest match (ratio 0.6 or better, as `difflib.get_close_matches` defaults), worded
for the end of an error message. Bounded: a suggestion is looked for among at most
`MAX_SUGGESTION_CANDIDATES` names (limits.py); past that many (a fleet of more than 1,000
nodes), none is made rather than a slow one. Fields, classes, attributes are far fewer.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Collection

from services.common.dra.limits import MAX_SUGGESTION_CANDIDATES

__all__ = ["closest", "did_you_mean"]


def closest(word: str, candidates: Collection[str]) -> str | None:
    """The known name closest to `word`, or None when none is close (or there are too many)."""
    if not word or not candidates or len(candidates) > MAX_SUGGESTION_CANDIDATES:
        return None
    found = difflib.get_close_matches(word, sorted(candidates), n=1)
    return found[0] if found else None


def did_you_mean(word: str, candidates: Collection[str]) -> str:
    """` (did you mean "x"?)`, or "" when no known name is close."""
    match = closest(word, candidates)
    return "" if match is None or match == word else f" (did you mean {json.dumps(match)}?)"
