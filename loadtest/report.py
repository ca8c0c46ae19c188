"""Benchmark results: rows of measurements plus targets, printed as a table or as JSON."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BenchReport", "Row", "Target", "percentile", "summarize_ms"]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank on sorted values; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))
    return ordered[index]


def summarize_ms(seconds: Sequence[float]) -> dict[str, float]:
    """Median, p99 and max of durations given in seconds, in milliseconds."""
    ms = [s * 1000 for s in seconds]
    return {
        "median_ms": statistics.median(ms) if ms else 0.0,
        "p99_ms": percentile(ms, 0.99),
        "max_ms": max(ms) if ms else 0.0,
        "n": float(len(ms)),
    }


@dataclass(frozen=True)
class Row:
    name: str
    values: dict[str, float | int | str]


@dataclass(frozen=True)
class Target:
    """`metric` of row `row` must be <= limit (or >= when `at_least`)."""

    row: str
    metric: str
    limit: float
    at_least: bool = False

    def met(self, rows: Sequence[Row]) -> bool | None:
        for row in rows:
            if row.name == self.row and self.metric in row.values:
                value = float(row.values[self.metric])
                return value >= self.limit if self.at_least else value <= self.limit
        return None

    def describe(self) -> str:
        return f"{self.row}: {self.metric} {'>=' if self.at_least else '<='} {self.limit:g}"


@dataclass
class BenchReport:
    suite: str
    setup: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)

    def add(self, name: str, **values: float | int | str) -> None:
        self.rows.append(Row(name, dict(values)))

    def targets_met(self) -> bool:
        return all(t.met(self.rows) is not False for t in self.targets)

    def to_json(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "setup": self.setup,
            "rows": [{"name": r.name, **r.values} for r in self.rows],
            "targets": [{"target": t.describe(), "met": t.met(self.rows)} for t in self.targets],
        }

    def table(self) -> str:
        columns: list[str] = []
        for row in self.rows:
            columns.extend(k for k in row.values if k not in columns)
        header = ["case", *columns]
        body = [[row.name, *(_fmt(row.values.get(c, "")) for c in columns)] for row in self.rows]
        widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=False)]
        lines = [f"## {self.suite}  " + ", ".join(f"{k}={v}" for k, v in self.setup.items())]
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
        lines.extend(
            "  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)) for r in body
        )
        for target in self.targets:
            verdict = {True: "met", False: "MISSED", None: "not measured"}[target.met(self.rows)]
            lines.append(f"target {target.describe()}: {verdict}")
        return "\n".join(lines) + "\n"


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)
