"""CEL string functions for selectors: the standard ones, cel-go ext Strings v2 and the Kubernetes
regex library, on Python `str` (code points, which is what CEL's rune indexes count).

Regular expressions are RE2 (google-re2), as in cel-go, so matching is linear-time and a pattern
like `(a+)+$` cannot backtrack exponentially. Each function charges `1 + len/10` cost units for
reading its input and charges for its output size before building it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import re2  # type: ignore[import-untyped]

from services.cel.lib_format import format_string, quote
from services.cel.values import (
    EvalError,
    Frame,
    Function,
    Impl,
    equal,
    fn,
    int_arg,
    no_overload,
    str_args,
)

__all__ = ["STRING_FUNCTIONS", "STRING_METHODS", "regex"]

# --- regular expressions (RE2, linear time) --------------------------------------------

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


@functools.lru_cache(maxsize=512)
def regex(pattern: str) -> Any:
    """Compile an RE2 pattern once; EvalError if it is not valid RE2."""
    try:
        return re2.compile(pattern, options=_RE2_OPTIONS)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise EvalError(f"invalid regular expression {pattern!r}: {detail}") from None


def _regex_cost(text: str, pattern: str) -> int:
    """A call plus RE2's linear scan: cel-go/k8s charge text size times pattern size, / 10."""
    return 1 + (len(text) + 1) * (len(pattern) + 1) // 10


def _matches(frame: Frame, text: Any, pattern: Any) -> bool:
    str_args("matches", text, pattern)
    frame.charge(_regex_cost(text, pattern))
    return regex(pattern).search(text) is not None


def _find(frame: Frame, text: Any, pattern: Any) -> str:
    str_args("find", text, pattern)
    frame.charge(_regex_cost(text, pattern))
    match = regex(pattern).search(text)
    return "" if match is None else str(match.group(0))


def _find_all(frame: Frame, text: Any, pattern: Any, limit: Any = -1) -> list[Any]:
    str_args("findAll", text, pattern)
    limit = int_arg("findAll", text, limit)
    frame.charge(_regex_cost(text, pattern))
    found: list[Any] = []
    if limit == 0:
        return found
    for match in regex(pattern).finditer(text):
        found.append(match.group(0))
        if len(found) == limit:
            break
    return found


def _string_test(name: str, test: Callable[[str, str], bool]) -> Impl:
    def impl(frame: Frame, text: Any, part: Any) -> bool:
        str_args(name, text, part)
        frame.charge(1 + len(text) // 10)
        return test(text, part)

    return impl


# --- ext Strings v2 ---------------------------------------------------------------------


def _char_at(frame: Frame, text: Any, at: Any) -> str:
    str_args("charAt", text)
    at = int_arg("charAt", text, at)
    frame.charge(1)
    if not 0 <= at <= len(text):
        raise EvalError(f"index out of range: {at}")
    return str(text[at : at + 1])


def _index_of(frame: Frame, receiver: Any, item: Any, offset: Any = 0) -> int:
    if isinstance(receiver, list):
        if offset != 0:
            raise no_overload("indexOf", receiver, item, offset)
        frame.charge(1 + len(receiver))
        return next((i for i, v in enumerate(receiver) if equal(v, item)), -1)
    str_args("indexOf", receiver, item)
    offset = int_arg("indexOf", receiver, offset)
    frame.charge(1 + len(receiver) // 10)
    if not 0 <= offset <= len(receiver):
        raise EvalError(f"index out of range: {offset}")
    return int(receiver.find(item, offset))


def _last_index_of(frame: Frame, receiver: Any, item: Any, *offset: Any) -> int:
    if isinstance(receiver, list):
        if offset:
            raise no_overload("lastIndexOf", receiver, item, *offset)
        frame.charge(1 + len(receiver))
        found = [i for i, v in enumerate(receiver) if equal(v, item)]
        return found[-1] if found else -1
    str_args("lastIndexOf", receiver, item)
    at = int_arg("lastIndexOf", receiver, offset[0]) if offset else len(receiver)
    frame.charge(1 + len(receiver) // 10)
    if not 0 <= at <= len(receiver):
        raise EvalError(f"index out of range: {at}")
    if item == "":
        return at
    return int(receiver.rfind(item, 0, at + len(item)))


_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
# Go's unicode.IsSpace, which strings.TrimSpace uses.
_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
_SPACE += "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


def _translate(name: str, table: dict[int, int]) -> Impl:
    def impl(frame: Frame, text: Any) -> str:
        str_args(name, text)
        frame.charge(1 + len(text) // 10)
        return str(text.translate(table))

    return impl


def _trim(frame: Frame, text: Any) -> str:
    str_args("trim", text)
    frame.charge(1 + len(text) // 10)
    return str(text.strip(_SPACE))


def _replace(frame: Frame, text: Any, old: Any, new: Any, limit: Any = -1) -> str:
    str_args("replace", text, old, new)
    limit = int_arg("replace", text, limit)
    count = text.count(old) if old else len(text) + 1
    if limit >= 0:
        count = min(count, limit)
    frame.charge(1 + (len(text) + count * max(len(new) - len(old), 0)) // 10)
    return str(text.replace(old, new, limit if limit >= 0 else -1))


def _split(frame: Frame, text: Any, separator: Any, limit: Any = -1) -> list[Any]:
    str_args("split", text, separator)
    limit = int_arg("split", text, limit)
    frame.charge(1 + len(text))
    if limit == 0:
        return []
    if separator:
        return list(text.split(separator, limit - 1 if limit > 0 else -1))
    chars = list(text)
    if 0 < limit < len(chars):
        return chars[: limit - 1] + ["".join(chars[limit - 1 :])]
    return chars


def _substring(frame: Frame, text: Any, start: Any, *end: Any) -> str:
    str_args("substring", text)
    start = int_arg("substring", text, start)
    stop = int_arg("substring", text, end[0]) if end else len(text)
    frame.charge(1 + len(text) // 10)
    if not 0 <= start <= len(text) or not start <= stop <= len(text):
        raise EvalError(f"index out of range: substring({start}, {stop}) of length {len(text)}")
    return str(text[start:stop])


def _join(frame: Frame, items: Any, separator: Any = "") -> str:
    if not isinstance(items, list) or type(separator) is not str:
        raise no_overload("join", items, separator)
    if any(type(item) is not str for item in items):
        raise EvalError("join: list must contain only strings")
    frame.charge(1 + (sum(map(len, items)) + len(separator) * len(items)) // 10)
    return separator.join(items)


def _format(frame: Frame, template: Any, args: Any) -> str:
    if type(template) is not str or not isinstance(args, list):
        raise no_overload("format", template, args)
    return format_string(frame, template, args)


def _quote(frame: Frame, text: Any) -> str:
    str_args("strings.quote", text)
    frame.charge(1 + len(text) // 2)
    return quote(text)


STRING_FUNCTIONS: dict[str, Function] = {
    "matches": fn((2,), _matches, "bool"),
    "strings.quote": fn((1,), _quote, "string"),
}

STRING_METHODS: dict[str, Function] = {
    "contains": fn((1,), _string_test("contains", lambda s, p: p in s), "bool"),
    "startsWith": fn((1,), _string_test("startsWith", str.startswith), "bool"),
    "endsWith": fn((1,), _string_test("endsWith", str.endswith), "bool"),
    "matches": fn((1,), _matches, "bool"),
    "find": fn((1,), _find, "string"),
    "findAll": fn((1, 2), _find_all, "list"),
    "charAt": fn((1,), _char_at, "string"),
    "indexOf": fn((1, 2), _index_of, "int"),
    "lastIndexOf": fn((1, 2), _last_index_of, "int"),
    "lowerAscii": fn((0,), _translate("lowerAscii", _LOWER), "string"),
    "upperAscii": fn((0,), _translate("upperAscii", _UPPER), "string"),
    "replace": fn((2, 3), _replace, "string"),
    "split": fn((1, 2), _split, "list"),
    "substring": fn((1, 2), _substring, "string"),
    "trim": fn((0,), _trim, "string"),
    "join": fn((0, 1), _join, "string"),
    "format": fn((1,), _format, "string"),
}
