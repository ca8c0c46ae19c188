"""ghz's JSON report (`runner/reporter.go`), computed and serialised as ghz does it.

Units are ghz's: `total`, `average`, `fastest`, `slowest`, every `latency` and the options'
durations are integer nanoseconds (Go's time.Duration); `rps` is calls per second; histogram
`mark`s are float seconds; `date` is RFC 3339 and detail timestamps RFC 3339 with nanoseconds,
in local time. The arithmetic follows `Finalize` step by step (float seconds, truncation to ns,
percentile index p/100*N minus one when integral, 11 histogram buckets between fastest and
slowest) so that the same calls give the same numbers as ghz. Keys come in ghz's order, map keys
sorted and `<`, `>`, `&` escaped as Go's encoding/json writes them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import grpc

__all__ = [
    "MAX_DETAILS",
    "PERCENTILES",
    "CallResult",
    "Options",
    "build_report",
    "error_text",
    "go_status_name",
    "go_time",
    "report_json",
]

MAX_DETAILS = 1_000_000  # ghz's maxResult
PERCENTILES = (10, 25, 50, 75, 90, 95, 99)
_BUCKETS = 10

# grpc-go's codes.Code.String(): CamelCase, and CANCELLED is spelled "Canceled".
_GO_NAMES = {
    grpc.StatusCode.OK: "OK",
    grpc.StatusCode.CANCELLED: "Canceled",
    grpc.StatusCode.UNKNOWN: "Unknown",
    grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgument",
    grpc.StatusCode.DEADLINE_EXCEEDED: "DeadlineExceeded",
    grpc.StatusCode.NOT_FOUND: "NotFound",
    grpc.StatusCode.ALREADY_EXISTS: "AlreadyExists",
    grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "ResourceExhausted",
    grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition",
    grpc.StatusCode.ABORTED: "Aborted",
    grpc.StatusCode.OUT_OF_RANGE: "OutOfRange",
    grpc.StatusCode.UNIMPLEMENTED: "Unimplemented",
    grpc.StatusCode.INTERNAL: "Internal",
    grpc.StatusCode.UNAVAILABLE: "Unavailable",
    grpc.StatusCode.DATA_LOSS: "DataLoss",
    grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated",
}


def go_status_name(code: grpc.StatusCode) -> str:
    return _GO_NAMES[code]


def error_text(code: grpc.StatusCode, details: str | None) -> str:
    """What grpc-go's status error prints: `rpc error: code = Internal desc = ...`."""
    return f"rpc error: code = {go_status_name(code)} desc = {details or ''}"


@dataclass(frozen=True)
class CallResult:
    """One finished call (ghz's callResult): when it ended, how long it took, how it ended."""

    end_ns: int  # wall clock, Unix ns: the detail's timestamp (ghz: stats End.EndTime)
    latency_ns: int
    status: str  # grpc-go code name: "OK", "Unavailable", ...
    error: str = ""  # "" when OK, else error_text(...)


@dataclass(frozen=True)
class Options:
    """The `options` echo, field for field as ghz's reporter.go Options (durations in ns)."""

    call: str = ""
    host: str = ""
    proto: str = ""
    import_paths: tuple[str, ...] = ()
    insecure: bool = False
    rps: int = 0
    load_schedule: str = ""
    concurrency_schedule: str = ""
    concurrency_start: int = 0
    concurrency: int = 0
    total: int = 0
    connections: int = 0
    duration_ns: int = 0
    timeout_ns: int = 0
    dial_timeout_ns: int = 0
    keepalive_ns: int = 0
    data: Any = None
    metadata: dict[str, str] | None = None
    cpus: int = 0
    name: str = ""
    skip_first: int = 0
    count_errors: bool = False

    def to_json(self) -> dict[str, Any]:
        """ghz's key order; omitempty fields only when set, the others always."""
        out: dict[str, Any] = {}
        _put(out, "call", self.call, omitempty=True)
        _put(out, "host", self.host, omitempty=True)
        _put(out, "proto", self.proto, omitempty=True)
        _put(out, "import-paths", list(self.import_paths), omitempty=True)
        out["insecure"] = self.insecure
        _put(out, "rps", self.rps, omitempty=True)
        out["load-schedule"] = self.load_schedule
        out.update({"load-start": 0, "load-end": 0, "load-step": 0})
        out.update({"load-step-duration": 0, "load-max-duration": 0})
        _put(out, "concurrency", self.concurrency, omitempty=True)
        out["concurrency-schedule"] = self.concurrency_schedule
        out["concurrency-start"] = self.concurrency_start
        out.update({"concurrency-end": 0, "concurrency-step": 0})
        out.update({"concurrency-step-duration": 0, "concurrency-max-duration": 0})
        _put(out, "total", self.total, omitempty=True)
        _put(out, "connections", self.connections, omitempty=True)
        _put(out, "duration", self.duration_ns, omitempty=True)
        _put(out, "timeout", self.timeout_ns, omitempty=True)
        _put(out, "dial-timeout", self.dial_timeout_ns, omitempty=True)
        _put(out, "keepalive", self.keepalive_ns, omitempty=True)
        _put(out, "data", self.data, omitempty=True)
        out["binary"] = False
        _put(out, "metadata", self.metadata, omitempty=True)
        out["CPUs"] = self.cpus
        _put(out, "name", self.name, omitempty=True)
        _put(out, "skipFirst", self.skip_first, omitempty=True)
        _put(out, "count-errors", self.count_errors, omitempty=True)
        return out


def _put(out: dict[str, Any], key: str, value: Any, *, omitempty: bool) -> None:
    if omitempty and (value is None or value in ("", 0, False) or value == {} or value == []):
        return
    out[key] = value


@dataclass(frozen=True)
class Report:
    """Inputs of the report besides the calls (what ghz's Finalize gets)."""

    options: Options
    total_ns: int
    end_reason: str = "normal"  # normal | cancel | timeout
    date: datetime = field(default_factory=lambda: datetime.now().astimezone())
    tags: dict[str, str] | None = None


def build_report(
    results: Iterable[CallResult], run: Report, *, skip_first: int = 0, count_errors: bool = False
) -> dict[str, Any]:
    """The report as ghz's Finalize computes it, ready for `report_json`."""
    kept = list(results)[skip_first:]
    details = kept[:MAX_DETAILS]
    count = len(kept)
    status_codes: dict[str, int] = {}
    errors: dict[str, int] = {}
    total_latency_s = 0.0
    for result in kept:
        total_latency_s += _seconds(result.latency_ns)
        status_codes[result.status] = status_codes.get(result.status, 0) + 1
        if result.error:
            errors[result.error] = errors.get(result.error, 0) + 1
    report: dict[str, Any] = {"date": go_time(run.date, nanos=False)}
    _put(report, "name", run.options.name, omitempty=True)
    _put(report, "endReason", run.end_reason, omitempty=True)
    report["options"] = run.options.to_json()
    report.update({"count": count, "total": run.total_ns, "average": 0, "fastest": 0})
    report.update({"slowest": 0, "rps": 0.0})
    report["errorDistribution"] = dict(sorted(errors.items()))
    report["statusCodeDistribution"] = dict(sorted(status_codes.items()))
    report.update({"latencyDistribution": None, "histogram": None, "details": None})
    if details:
        report["average"] = int(total_latency_s / count * 1e9)
        report["rps"] = count / (run.total_ns / 1e9) if run.total_ns else 0.0
        ok = sorted(_seconds(d.latency_ns) for d in details if not d.error or count_errors)
        if ok:
            report["fastest"], report["slowest"] = int(ok[0] * 1e9), int(ok[-1] * 1e9)
            report["latencyDistribution"] = _latencies(ok)
            report["histogram"] = _histogram(ok, ok[-1], ok[0])
        report["details"] = [_detail(d) for d in details]
    _put(report, "tags", run.tags, omitempty=True)
    return report


def _seconds(ns: int) -> float:
    """Go's Duration.Seconds(): whole seconds plus the remainder, so values match ghz's."""
    whole, rest = divmod(ns, 1_000_000_000)
    return whole + rest / 1e9


def _latencies(latencies: Sequence[float]) -> list[dict[str, int]]:
    """ghz's `latencies`: index p/100*N, minus one when that is a whole number."""
    out = []
    for percentage in PERCENTILES:
        position = percentage / 100.0 * len(latencies)
        index = int(position)
        if position == float(index):
            index -= 1
        value = latencies[max(index, 0)]
        # ghz leaves a zero struct when the latency is not positive
        out.append(
            {"percentage": percentage, "latency": int(value * 1e9)}
            if value > 0
            else {"percentage": 0, "latency": 0}
        )
    return out


def _histogram(latencies: Sequence[float], slowest: float, fastest: float) -> list[dict[str, Any]]:
    """ghz's `histogram`: 11 marks fastest + i*(slowest-fastest)/10, the last one = slowest;
    a latency counts in the first bucket whose mark it does not exceed."""
    size = (slowest - fastest) / _BUCKETS
    marks = [fastest + size * i for i in range(_BUCKETS)] + [slowest]
    counts = [0] * len(marks)
    bucket = 0
    for latency in latencies:  # sorted
        while latency > marks[bucket] and bucket < len(marks) - 1:
            bucket += 1
        counts[bucket] += 1
    return [
        {"mark": mark, "count": n, "frequency": n / len(latencies)}
        for mark, n in zip(marks, counts, strict=True)
    ]


def _detail(result: CallResult) -> dict[str, Any]:
    moment = datetime.fromtimestamp(result.end_ns // 1_000_000_000, tz=UTC).astimezone()
    return {
        "timestamp": go_time(moment, nanos=True, fraction_ns=result.end_ns % 1_000_000_000),
        "latency": result.latency_ns,
        "error": result.error,
        "status": result.status,
    }


def go_time(moment: datetime, *, nanos: bool, fraction_ns: int | None = None) -> str:
    """Go's RFC3339 (`nanos=False`) or RFC3339Nano (trailing zeros trimmed; `Z` for UTC)."""
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if nanos:
        fraction = moment.microsecond * 1000 if fraction_ns is None else fraction_ns
        if fraction:
            text += "." + f"{fraction:09d}".rstrip("0")
    offset = moment.utcoffset()
    if offset is None or offset.total_seconds() == 0:
        return text + "Z"
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    return f"{text}{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def report_json(report: Any, *, pretty: bool) -> str:
    """`-O json` (compact) or `-O pretty` (json.Indent, two spaces), written as Go's
    encoding/json writes: floats in shortest form without exponent between 1e-6 and 1e21 (`0`,
    `1156.3378484317677`, `0.00001`), `<`, `>`, `&` escaped, map keys in the order given."""
    return _encode(report, "  " if pretty else "", 0)


def _encode(value: Any, indent: str, depth: int) -> str:
    if isinstance(value, dict):
        items = [f"{_string(str(k))}:{' ' if indent else ''}{_encode(v, indent, depth + 1)}"
                 for k, v in value.items()]  # fmt: skip
        return _container("{", "}", items, indent, depth)
    if isinstance(value, list | tuple):
        return _container("[", "]", [_encode(v, indent, depth + 1) for v in value], indent, depth)
    if isinstance(value, str):
        return _string(value)
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _container(opening: str, closing: str, items: list[str], indent: str, depth: int) -> str:
    if not items:
        return opening + closing
    if not indent:
        return opening + ",".join(items) + closing
    inner = "\n" + indent * (depth + 1)
    return opening + inner + ("," + inner).join(items) + "\n" + indent * depth + closing


def _string(text: str) -> str:
    encoded = json.dumps(text, ensure_ascii=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        encoded = encoded.replace(char, escape)
    return encoded.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _go_float(value: float) -> str:
    """strconv.AppendFloat(f, 'f' or 'e', -1, 64) as encoding/json chooses and tidies it."""
    if not math.isfinite(value):
        raise ValueError(f"JSON has no {value}")
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        mantissa, _, exponent = repr(value).partition("e")
        sign, digits = exponent[0], exponent[1:].lstrip("0")
        return f"{mantissa}e{sign}{digits.zfill(1)}"
    text = format(Decimal(repr(value)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text
