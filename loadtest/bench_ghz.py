"""`make bench ARGS=ghz`: the ghz configs of loadtest/ghz/ run with the real ghz and with
gpualloc-load (the Python runner) against the same `gpualloc serve --demo`, in the same run.

ghz is built by `make peers` (tools/peers/ghz, into .peers/bin). Each config runs first with
ghz, then with gpualloc-load, with the file's concurrency and connections, the same duration,
and the same client CPU budget (`--cpus 1`: one Go thread for ghz, one client process for the
runner). Rows: calls per second and p99 of each, and the runner over ghz (a runner ratio
below 1 is the client's cost, not the server's: the server and its answers are the same).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from loadtest.ghzlike.cli import execute
from loadtest.ghzlike.config import load_config
from loadtest.peers import peer_binary
from loadtest.report import BenchReport
from loadtest.smoke import CONFIGS, ROOT, gpualloc_serve

__all__ = ["compare", "ghz_report", "p99_ms", "run"]

COMPARED = ("health.json", "allocate.json", "explain.json", "allocate-reserve-batch-64.json")
"""The configs run by both tools (ghz calls one method per run); AllocateBatch's is issue 29's."""
CPUS = 1


def ghz_report(config: Path, target: str, duration_s: float) -> dict[str, Any]:
    """The real ghz's JSON report of `config` against `target` (data files are repo-relative)."""
    command = [str(peer_binary("ghz")), "--config", str(config), "-z", f"{duration_s:g}s",
               "--cpus", str(CPUS), "-O", "json", target]  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=duration_s + 60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"ghz {config.name}: exit {done.returncode}: {done.stderr.strip()}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def p99_ms(report: dict[str, Any]) -> float:
    rows = {row["percentage"]: row["latency"] for row in report.get("latencyDistribution") or []}
    return float(rows.get(99, 0)) / 1e6


def _ok(report: dict[str, Any]) -> int:
    return int(report.get("statusCodeDistribution", {}).get("OK", 0))


def compare(name: str, target: str, duration_s: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """loadtest/ghz/`name` with ghz, then with gpualloc-load: their two reports."""
    path = CONFIGS / name
    ghz = ghz_report(path, target, duration_s)
    config = load_config(path).with_overrides(host=target, duration=duration_s, cpus=CPUS)
    load, _ = execute(config)
    return ghz, load


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else 0.0


def run(quick: bool) -> BenchReport:
    duration_s = 2.0 if quick else 5.0
    report = BenchReport(
        "ghz",
        setup={"server": "gpualloc serve --demo (embedded)", "duration_s": duration_s,
               "client_cpus": CPUS},
    )  # fmt: skip
    with gpualloc_serve(None) as target:
        for name in COMPARED:
            ghz, load = compare(name, target, duration_s)
            report.add(
                Path(name).stem,
                ghz_rps=round(float(ghz["rps"]), 1),
                load_rps=round(float(load["rps"]), 1),
                rps_ratio=_ratio(float(load["rps"]), float(ghz["rps"])),
                ghz_p99_ms=round(p99_ms(ghz), 3),
                load_p99_ms=round(p99_ms(load), 3),
                p99_ratio=_ratio(p99_ms(load), p99_ms(ghz)),
                ghz_ok=_ok(ghz),
                load_ok=_ok(load),
            )
    return report
