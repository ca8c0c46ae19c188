"""ghz's call-data templates (`runner/calldata.go`), the part config files use.

ghz runs data and metadata through Go's text/template with a `CallData` (`{{.RequestNumber}}`,
`{{.WorkerID}}`, `{{.UUID}}`, timestamps, method names) and three functions (`{{newUUID}}`,
`{{randomString 8}}`, `{{randomInt 1 10}}`). This is that subset: an action outside it is a
TemplateError naming the action, never left in the request as text. Sprig's hundred-odd
functions are not supported.
"""

from __future__ import annotations

import random
import re
import string
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

__all__ = ["CallData", "TemplateError", "has_actions", "render"]

_ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.DOTALL)
_CHARSET = string.ascii_lowercase + string.ascii_uppercase + string.digits  # ghz's charset


class TemplateError(ValueError):
    """A template action this runner cannot evaluate."""


@dataclass(frozen=True)
class CallData:
    """What one call's template sees, named as in ghz's CallData."""

    worker_id: str
    request_number: int
    fully_qualified_name: str  # gpualloc.allocator.v1.Allocator.Allocate
    method_name: str
    service_name: str
    input_name: str
    output_name: str


def has_actions(text: str) -> bool:
    return _ACTION.search(text) is not None


def render(text: str, call: CallData, *, functions: bool = True) -> str:
    """`text` with every `{{ ... }}` action replaced, as Go's text/template prints values."""
    now_ns = time.time_ns()
    fields = _fields(call, now_ns)

    def action(match: re.Match[str]) -> str:
        expression = match[1]
        if expression.startswith("."):
            if expression[1:] not in fields:
                raise TemplateError(f"{{{{{expression}}}}}: CallData has no field {expression[1:]}")
            return fields[expression[1:]]()
        words = expression.split()
        function = _FUNCTIONS.get(words[0]) if functions else None
        if function is None:
            raise TemplateError(
                f"{{{{{expression}}}}}: not supported by the Python runner (fields of CallData, "
                f"{', '.join(sorted(_FUNCTIONS))})"
            )
        try:
            return function(*(int(word) for word in words[1:]))
        except (TypeError, ValueError):
            raise TemplateError(f"{{{{{expression}}}}}: bad arguments") from None

    return _ACTION.sub(action, text)


def _fields(call: CallData, now_ns: int) -> dict[str, Callable[[], str]]:
    seconds = now_ns // 1_000_000_000
    return {
        "WorkerID": lambda: call.worker_id,
        "RequestNumber": lambda: str(call.request_number),
        "FullyQualifiedName": lambda: call.fully_qualified_name,
        "MethodName": lambda: call.method_name,
        "ServiceName": lambda: call.service_name,
        "InputName": lambda: call.input_name,
        "OutputName": lambda: call.output_name,
        "IsClientStreaming": lambda: "false",
        "IsServerStreaming": lambda: "false",
        "Timestamp": lambda: datetime.fromtimestamp(seconds).astimezone().isoformat(),
        "TimestampUnix": lambda: str(seconds),
        "TimestampUnixMilli": lambda: str(now_ns // 1_000_000),
        "TimestampUnixNano": lambda: str(now_ns),
        "UUID": lambda: str(uuid.uuid4()),
    }


def _random_string(length: int = 0) -> str:
    # ghz: length <= 0 means a random length from 2 to 16
    size = length if length > 0 else random.randint(2, 16)
    return "".join(random.choice(_CHARSET) for _ in range(size))


def _random_int(low: int, high: int) -> str:
    # ghz: min < 0 -> 0, max <= 0 -> 1, then rand.Intn(max-min) + min (`high` excluded)
    low, high = max(low, 0), (high if high > 0 else 1)
    if high <= low:
        raise ValueError("randomInt needs min < max")
    return str(random.randrange(low, high))


_FUNCTIONS: dict[str, Callable[..., str]] = {
    "newUUID": lambda: str(uuid.uuid4()),
    "randomString": _random_string,
    "randomInt": _random_int,
}
