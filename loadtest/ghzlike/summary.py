"""What a person reads: ghz's summary and CSV outputs, a progress bar, the client's CPU line.

The summary is ghz's `defaultTmpl` (printer/template.go) with its number formats, so someone
used to ghz reads it the same way. The progress bar uses rich when it is installed and the
output is a terminal, and is silent otherwise (CI logs stay clean).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from loadtest.ghzlike.engine import RunOutcome

__all__ = ["client_line", "csv_text", "make_progress", "summary_text"]

_BAR = "∎"


def format_nano_unit(nanoseconds: int) -> str:
    """ghz's formatNanoUnit: ns below 10 µs, else ms below 1 s, else s."""
    if nanoseconds < 10_000:
        return f"{nanoseconds} ns"
    milliseconds = nanoseconds / 1e6
    if milliseconds < 1000:
        return f"{milliseconds:4.2f} ms"
    return f"{milliseconds / 1000:4.2f} s"


def summary_text(report: dict[str, Any]) -> str:
    lines = ["", "Summary:"]
    if report.get("name"):
        lines.append(f"  Name:\t\t{report['name']}")
    lines += [
        f"  Count:\t{report['count']}",
        f"  Total:\t{format_nano_unit(report['total'])}",
        f"  Slowest:\t{format_nano_unit(report['slowest'])}",
        f"  Fastest:\t{format_nano_unit(report['fastest'])}",
        f"  Average:\t{format_nano_unit(report['average'])}",
        f"  Requests/sec:\t{report['rps']:4.2f}",
        "",
        "Response time histogram:",
        *_histogram_lines(report["histogram"] or []),
        "Latency distribution:",
    ]
    lines += [
        f"  {row['percentage']} % in {format_nano_unit(row['latency'])} "
        for row in report["latencyDistribution"] or []
    ]
    lines.append("")
    if report["statusCodeDistribution"]:
        lines.append("Status code distribution:")
        lines += _table(
            [f"[{status}]", f"{n} responses"]
            for status, n in report["statusCodeDistribution"].items()
        )
    lines.append("")
    if report["errorDistribution"]:
        lines.append("Error distribution:")
        lines += _table([f"[{n}]", error] for error, n in report["errorDistribution"].items())
    return "\n".join(lines) + "\n"


def _histogram_lines(buckets: list[dict[str, Any]]) -> list[str]:
    marks = [f"{b['mark'] * 1000:.3f}" for b in buckets]
    counts = [str(b["count"]) for b in buckets]
    most = max((b["count"] for b in buckets), default=0)
    mark_width = max((len(m) for m in marks), default=0)
    count_width = max((len(c) for c in counts), default=0)
    lines = []
    for bucket, mark, count in zip(buckets, marks, counts, strict=True):
        bar = (bucket["count"] * 40 + most // 2) // most if most else 0
        lines.append(
            f"  {mark:<{mark_width}} [{count}]{' ' * (count_width - len(count))} |{_BAR * bar}"
        )
    return lines + [""]


def _table(rows: Any) -> list[str]:
    """Go's tabwriter with padding 3, as ghz prints its distributions."""
    rows = [list(row) for row in rows]
    width = max(len(row[0]) for row in rows)
    return [f"  {row[0]:<{width}}   {row[1]}   " for row in rows]


def csv_text(report: dict[str, Any]) -> str:
    """ghz's `-O csv`: one line per call, latency in ms."""
    lines = ["", "duration (ms),status,error"]
    for detail in report["details"] or []:
        lines.append(f"{detail['latency'] / 1e6:4.2f},{detail['status']},{detail['error']}")
    return "\n".join(lines) + "\n"


def client_line(outcome: RunOutcome) -> str:
    """How busy the client was: if it used about a core per process, the client (not the
    server) may have set the pace; add processes (`cpus`) and compare."""
    seconds = outcome.total_ns / 1e9
    cores = outcome.client_cpu_seconds / seconds if seconds else 0.0
    per_process = cores / outcome.processes
    verdict = "client-bound? add --cpus" if per_process >= 0.9 else "not client-bound"
    return (
        f"Client: {outcome.processes} process(es), {outcome.client_cpu_seconds:.2f} CPU-s in "
        f"{seconds:.2f} s = {cores:.2f} cores ({per_process:.0%} per process; {verdict})"
    )


class _RichProgress:
    def __init__(self, total: int | None, duration_s: float, label: str, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._by_time = total is None
        self._total = duration_s if self._by_time else float(total or 1)
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[calls]} calls, {task.fields[rate]:.0f}/s"),
            TimeElapsedColumn(),
            console=Console(file=stream),
            transient=True,
        )
        self._task = self._progress.add_task(label, total=self._total, calls=0, rate=0.0)
        self._progress.start()

    def update(self, done: int, elapsed_s: float) -> None:
        completed = elapsed_s if self._by_time else float(done)
        rate = done / elapsed_s if elapsed_s > 0 else 0.0
        self._progress.update(
            self._task, completed=min(completed, self._total), calls=done, rate=rate
        )

    def close(self) -> None:
        self._progress.stop()


def make_progress(
    total: int | None, duration_s: float, label: str, stream: TextIO | None = None
) -> _RichProgress | None:
    """A progress bar on a terminal when rich is installed; None otherwise."""
    stream = stream or sys.stderr
    if not stream.isatty():
        return None
    try:
        return _RichProgress(total, duration_s, label, stream)
    except ImportError:
        return None
