"""Process-wide logging: JSON lines for machines, or plain text for people.

JSON mode writes one object per line — `ts` (UTC, RFC 3339, milliseconds), `level`, `logger`,
`msg`, `exc` when there is a traceback, any `extra={...}` fields, and `trace_id`/`span_id` when an
OpenTelemetry span is active — so log collectors need no parsing rules and a log line leads to
its trace. Text mode prints the same facts on one readable line.

OpenTelemetry is looked up lazily and optionally: logging must work in a process (or a test)
that never configured tracing, and importing this module must not import the SDK.

(Named `log` rather than `logging` so that it never shadows the standard library module.)
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = ["JsonFormatter", "TextFormatter", "configure_logging", "current_trace_ids"]

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def current_trace_ids() -> tuple[str, str] | None:
    """(trace_id, span_id) in W3C hex of the active OpenTelemetry span, or None."""
    try:
        from opentelemetry import trace
    except ImportError:  # pragma: no cover - opentelemetry-api is a dependency, but optional here
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRIBUTES}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        ids = current_trace_ids()
        if ids is not None:
            entry["trace_id"], entry["span_id"] = ids
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        for key, value in _extras(record).items():
            entry.setdefault(key, value)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`ts LEVEL logger: msg key=value ...`, then the traceback, if any, on following lines."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        fields = _extras(record)
        ids = current_trace_ids()
        if ids is not None:
            fields["trace_id"], fields["span_id"] = ids
        if fields:
            line += " " + " ".join(f"{key}={value}" for key, value in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


def configure_logging(
    level: str = "INFO",
    fmt: str = "json",
    stream: TextIO | None = None,
    *,
    route_native: bool = False,
) -> None:
    """Send every logger's records to `stream` (stderr) in `fmt` ("json" or "text").

    Replaces the root logger's handlers, so calling it twice does not duplicate lines. With
    `route_native` (the servers) and JSON, grpc-core's own lines on stderr become records of
    logger `grpc.core` too (services/common/native_log.py), so the stream stays JSON.
    """
    if fmt not in ("json", "text"):
        raise ValueError(f"log format must be json or text, got {fmt!r}")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    if route_native and fmt == "json" and stream is None:
        from services.common.native_log import route_native_stderr

        route_native_stderr()
