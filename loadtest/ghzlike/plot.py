"""A PNG of a ghz report for people who would rather look than read.

Left: the latency histogram of successful calls (finer than ghz's 11 buckets) with the p50, p90
and p99 the report states. Right: the timeline, every call's latency at the moment it ended (errors
in red) and the completed calls per second. Drawn from the report's `details`, so it works on
reports from ghz itself too. matplotlib is imported here only: the runner works without it.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["plot_report", "plot_title"]

_BINS = 60


def plot_report(report: dict[str, Any], path: str | Path, *, title: str = "") -> Path:
    """Write the PNG; raises ImportError (with the fix) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(f"the plot needs matplotlib (pip install matplotlib): {error}") from None
    details = report.get("details") or []
    ends = [datetime.fromisoformat(d["timestamp"]).timestamp() for d in details]
    first = min(ends, default=0.0)
    ok = [
        (end - first, d["latency"] / 1e6)
        for end, d in zip(ends, details, strict=True)
        if not d["error"]
    ]
    failed = [
        (end - first, d["latency"] / 1e6)
        for end, d in zip(ends, details, strict=True)
        if d["error"]
    ]

    figure, (histogram, timeline) = plt.subplots(1, 2, figsize=(13, 4.8))
    figure.suptitle(title or plot_title(report))
    _draw_histogram(histogram, [ms for _, ms in ok], report)
    _draw_timeline(timeline, ok, failed, [end - first for end in ends])
    figure.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=110)
    plt.close(figure)
    return target


def plot_title(report: dict[str, Any]) -> str:
    """What was measured where: the call, the target host and the store behind it (the
    report's `store` tag; "store not stated" without one), then the count and rate."""
    options = report.get("options", {})
    what = report.get("name") or options.get("call", "")
    store = (report.get("tags") or {}).get("store")
    where = f"{options.get('host', '?')}, " + (f"store {store}" if store else "store not stated")
    return f"{what} on {where}: {report['count']} calls, {report['rps']:.0f} calls/s"


def _draw_histogram(axes: Any, latencies_ms: list[float], report: dict[str, Any]) -> None:
    """Up to twice the p99, so a few slow outliers (warm-up) do not squash the shape."""
    p99 = next(
        (
            r["latency"] / 1e6
            for r in report.get("latencyDistribution") or []
            if r["percentage"] == 99
        ),
        0.0,
    )
    cut = 2 * p99 if p99 else max(latencies_ms, default=0.0)
    shown = [ms for ms in latencies_ms if ms <= cut]
    if shown:
        axes.hist(shown, bins=_BINS, color="#4c72b0")
    for row in report.get("latencyDistribution") or []:
        if row["percentage"] in (50, 90, 99):
            milliseconds = row["latency"] / 1e6
            axes.axvline(milliseconds, color="#dd8452", linestyle="--", linewidth=1)
            axes.annotate(
                f"p{row['percentage']} {milliseconds:.2f} ms",
                (milliseconds, 0.95),
                xycoords=("data", "axes fraction"),
                rotation=90,
                va="top",
                ha="right",
                fontsize=8,
            )
    axes.set_xlabel("latency (ms)")
    axes.set_ylabel("calls")
    hidden = len(latencies_ms) - len(shown)
    axes.set_title(
        "latency of OK calls" + (f" ({hidden} above {cut:.1f} ms not shown)" if hidden else "")
    )


def _rate(ends: list[float]) -> tuple[list[float], list[float]]:
    """Calls per second over whole seconds; the last, partial second divided by its length
    (merged into the one before when shorter than a quarter second)."""
    last = max(ends)
    edges = [float(s) for s in range(int(last) + 1)]
    if last - edges[-1] < 0.25 and len(edges) > 1:
        edges.pop()
    edges.append(max(last, edges[-1] + 1e-3))
    counts = [0] * (len(edges) - 1)
    for end in ends:
        index = min(int(end), len(counts) - 1)
        counts[index] += 1
    return edges, [n / (hi - lo) for n, lo, hi in zip(counts, edges, edges[1:], strict=False)]


def _draw_timeline(
    axes: Any,
    ok: list[tuple[float, float]],
    failed: list[tuple[float, float]],
    ends: list[float],
) -> None:
    if ok:
        axes.scatter([t for t, _ in ok], [ms for _, ms in ok], s=2, alpha=0.4, label="OK")
    if failed:
        axes.scatter(
            [t for t, _ in failed], [ms for _, ms in failed], s=4, color="red", label="error"
        )
    axes.set_xlabel("seconds since the first call ended")
    axes.set_ylabel("latency (ms)")
    axes.set_title("timeline")
    if ends:
        edges, rates = _rate(ends)
        rate = axes.twinx()
        rate.stairs(rates, edges, color="#55a868", label="calls/s")
        rate.set_ylabel("calls completed per second")
        rate.set_ylim(0, max(rates) * 1.15 or 1)
        rate.legend(loc="upper right")
    if ok or failed:
        axes.legend(loc="upper left", markerscale=4)
