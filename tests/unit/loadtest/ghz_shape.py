"""What every ghz JSON report satisfies, checked the same way on ghz's own sample and on ours.

Each check states a relation between fields that ghz's reporter.go guarantees (units included):
if our report and the real one both pass, they agree on keys, types and units, not just names.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

GHZ_DATA = Path(__file__).resolve().parents[2] / "data" / "ghz"
PERCENTAGES = [10, 25, 50, 75, 90, 95, 99]
REPORT_KEYS = [
    "date", "name", "endReason", "options", "count", "total", "average", "fastest", "slowest",
    "rps", "errorDistribution", "statusCodeDistribution", "latencyDistribution", "histogram",
    "details", "tags",
]  # fmt: skip


def ghz_sample() -> dict[str, Any]:
    result: dict[str, Any] = json.loads((GHZ_DATA / "pretty.json").read_text(encoding="utf-8"))
    return result


def is_rfc3339(text: str) -> bool:
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return False
    return parsed.tzinfo is not None and "T" in text


def check_latency_distribution(report: dict[str, Any]) -> None:
    rows = report["latencyDistribution"]
    assert [list(row) for row in rows] == [["percentage", "latency"]] * len(rows)
    assert [row["percentage"] for row in rows] == PERCENTAGES
    latencies = [row["latency"] for row in rows]
    assert all(isinstance(ns, int) for ns in latencies), "latencies are integer nanoseconds"
    assert latencies == sorted(latencies)
    assert report["fastest"] <= latencies[0] and latencies[-1] <= report["slowest"]


def check_histogram(report: dict[str, Any]) -> None:
    buckets = report["histogram"]
    assert len(buckets) == 11
    assert [list(b) for b in buckets] == [["mark", "count", "frequency"]] * 11
    marks = [b["mark"] for b in buckets]
    # marks are float SECONDS from fastest to slowest (which are integer nanoseconds)
    assert abs(marks[0] * 1e9 - report["fastest"]) <= 1
    assert abs(marks[-1] * 1e9 - report["slowest"]) <= 1
    step = (marks[-1] - marks[0]) / 10
    assert all(abs(marks[i] - (marks[0] + i * step)) < 1e-12 for i in range(11))
    counted = sum(b["count"] for b in buckets)
    assert all(isinstance(b["count"], int) for b in buckets)
    assert all(abs(b["frequency"] - b["count"] / counted) < 1e-15 for b in buckets)


def check_details(report: dict[str, Any]) -> None:
    for detail in report["details"]:
        assert list(detail) == ["timestamp", "latency", "error", "status"]
        assert is_rfc3339(detail["timestamp"]), detail["timestamp"]
        assert isinstance(detail["latency"], int) and detail["latency"] > 0
        if detail["status"] == "OK":
            assert detail["error"] == ""
        else:
            assert detail["error"].startswith(f"rpc error: code = {detail['status']} desc = ")


def check_totals(report: dict[str, Any]) -> None:
    for key in ("count", "total", "average", "fastest", "slowest"):
        assert isinstance(report[key], int), f"{key} is an integer (nanoseconds for durations)"
    assert isinstance(report["rps"], float)
    assert abs(report["rps"] - report["count"] / (report["total"] / 1e9)) < 1e-6
    assert report["fastest"] <= report["average"] <= report["slowest"] * 2
    assert is_rfc3339(report["date"])
    assert report["endReason"] in ("normal", "cancel", "timeout")
    for distribution in ("errorDistribution", "statusCodeDistribution"):
        assert all(isinstance(n, int) for n in report[distribution].values())
        assert list(report[distribution]) == sorted(report[distribution])


def check_report(report: dict[str, Any]) -> None:
    """Every check above, on a report with at least one successful call."""
    check_totals(report)
    check_latency_distribution(report)
    check_histogram(report)
    check_details(report)
