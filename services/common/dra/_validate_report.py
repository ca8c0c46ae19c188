"""What the validation modules share: the violation collector and the field-path helpers.

Descriptions are worded like k8s.io/apimachinery/pkg/util/validation/field (`Required value`,
`Invalid value: "x": ...`, `Duplicate value: ...`, `Too many: ...`), so an error from gpualloc
reads like one from the API server. Private to `services.common.dra`; `validate` is the face.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence

from services.common.errors import FieldViolation

__all__ = [
    "MULTIPLE",
    "Checker",
    "CounterSets",
    "Report",
    "RequestNames",
    "byte_length",
    "key_path",
    "show",
]

MULTIPLE = ", but multiple fields are set"  # appended to an "exactly one of ..." description

RequestNames = Mapping[str, frozenset[str]]  # request name -> its subrequest names
CounterSets = Mapping[str, frozenset[str]]  # counter-set name -> its counter names
Checker = Callable[[str], tuple[str, ...]]


def key_path(path: str, key: str) -> str:
    """`path["key"]`: the field path of a map entry."""
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def show(value: object) -> str:
    text = json.dumps(value) if isinstance(value, str | int | bool) else str(value)
    return text if len(text) <= 80 else text[:60] + "..." + text[-10:]


class Report(list[FieldViolation]):
    """The violations found so far; one short method per kind of finding."""

    def required(self, path: str, detail: str = "") -> None:
        self.append(
            FieldViolation(path, f"Required value: {detail}" if detail else "Required value")
        )

    def invalid(self, path: str, value: object, detail: str) -> None:
        self.append(FieldViolation(path, f"Invalid value: {show(value)}: {detail}"))

    def too_many(self, path: str, count: int, limit: int) -> None:
        self.append(FieldViolation(path, f"Too many: {count}: must have at most {limit} items"))

    def too_long(self, path: str, limit: int) -> None:
        self.append(FieldViolation(path, f"Too long: may not be more than {limit} bytes"))

    def forbidden(self, path: str, detail: str) -> None:
        self.append(FieldViolation(path, f"Forbidden: {detail}"))

    def not_supported(self, path: str, value: object, supported: Iterable[str]) -> None:
        choices = ", ".join(json.dumps(s) for s in sorted(supported))
        self.append(
            FieldViolation(path, f"Unsupported value: {show(value)}: supported values: {choices}")
        )

    def check(self, path: str, value: str, checker: Checker) -> None:
        """Attach the findings of a `names` checker."""
        for error in checker(value):
            if error == "Required value":
                self.required(path)
            else:
                self.invalid(path, value, error)

    def name(self, path: str, value: str, checker: Checker) -> None:
        """A required name: empty is `Required value`, otherwise the checker's findings."""
        if value:
            self.check(path, value, checker)
        else:
            self.required(path)

    def duplicates(self, path: str, keys: Sequence[str], field: str = "") -> None:
        """`Duplicate value` at `path[i]` (or `path[i].field`) for each repeated key."""
        seen: set[str] = set()
        for i, key in enumerate(keys):
            if key in seen:
                self.append(FieldViolation(f"{path}[{i}]{field}", f"Duplicate value: {show(key)}"))
            seen.add(key)

    def within(self, path: str, items: Sequence[object], limit: int) -> bool:
        """False (after reporting) when a list is over its limit; upstream then skips the items."""
        if len(items) <= limit:
            return True
        self.too_many(path, len(items), limit)
        return False


def byte_length(text: str) -> int:
    """Go measures strings in UTF-8 bytes; a lone surrogate (JSON "\\ud800") counts as 3."""
    return len(text.encode("utf-8", "surrogatepass"))
