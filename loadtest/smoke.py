"""`make loadtest`: a short load smoke on loopback, embedded store then Redis (about 30 s).

    python -m loadtest.smoke                      # both modes, 3 s per measurement
    python -m loadtest.smoke --modes redis --duration 10s --cpus 2

For each mode it starts `gpualloc serve --demo` on a free port (with a real `redis-server` on
another free port and GPUALLOC_REDIS_URL for the Redis mode), then runs the ghz configs of
loadtest/ghz/ with the Python runner against it, one after the other on the same server:
grpc.health.v1.Health/Check (the floor of what a gRPC call costs here), Allocate of one H100,
and Allocate+Reserve with Release (`--cycle release`). It prints one line per run and the ratio
of Allocate to Check calls per second measured in that same run, and writes each ghz report
(`<mode>-<config>.json`) and plot (`.png`) under loadtest/out/. Exit code 1 when a server does
not start or a run has no successful call.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loadtest.ghzlike.cli import execute
from loadtest.ghzlike.config import ConfigError, load_config, parse_go_duration
from loadtest.ghzlike.report import report_json
from loadtest.ghzlike.summary import client_line

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "loadtest" / "ghz"
OUT = ROOT / "loadtest" / "out"
_START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Step:
    config: str  # file name under loadtest/ghz/
    cycle: str | None = None


STEPS = (Step("health.json"), Step("allocate.json"), Step("allocate-reserve.json", "release"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def redis_server(directory: Path) -> Iterator[str]:
    """A throwaway redis-server on a free port, as tests/conftest.py starts it; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server not found on PATH (apt-get install redis-server)")
    port = _free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", str(directory)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, process, "redis-server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop(process)


@contextmanager
def gpualloc_serve(redis_url: str | None) -> Iterator[str]:
    """`gpualloc serve --demo` on a free port, until it answers SERVING; yields host:port."""
    port = _free_port()
    env = {**os.environ, "GPUALLOC_LOG_LEVEL": "WARNING"}
    env.pop("GPUALLOC_REDIS_URL", None)
    if redis_url:
        env["GPUALLOC_REDIS_URL"] = redis_url
    command = [sys.executable, "-m", "services.cli", "serve", "--demo",
               "--listen", f"127.0.0.1:{port}"]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, env=env)
    try:
        _wait_serving(f"127.0.0.1:{port}", process)
        yield f"127.0.0.1:{port}"
    finally:
        _stop(process)


def _wait_for_port(port: int, process: subprocess.Popen[Any], what: str) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within {_START_TIMEOUT_S:g}s")


def _wait_serving(target: str, process: subprocess.Popen[Any]) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"gpualloc serve exited with code {process.returncode}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise RuntimeError(f"gpualloc serve on {target} not SERVING within {_START_TIMEOUT_S:g}s")


def _stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_mode(
    mode: str, target: str, duration_s: float, cpus: int, out: Path
) -> dict[str, dict[str, Any]]:
    """Every step against `target`; returns the reports by config name."""
    reports: dict[str, dict[str, Any]] = {}
    for step in STEPS:
        config = load_config(CONFIGS / step.config)
        config = config.with_overrides(
            host=target, duration=duration_s, cpus=cpus, tags={**(config.tags or {}), "store": mode}
        )
        report, outcome = execute(config, cycle=step.cycle)
        stem = f"{mode}-{Path(step.config).stem}"
        (out / f"{stem}.json").write_text(report_json(report, pretty=True) + "\n", encoding="utf-8")
        plotted = _plot(report, out / f"{stem}.png")
        reports[step.config] = report
        print(_line(mode, step, report) + ("" if plotted else "  (no plot: matplotlib missing)"))
        print(f"    {client_line(outcome)}")
    return reports


def _plot(report: dict[str, Any], path: Path) -> bool:
    try:
        from loadtest.ghzlike.plot import plot_report
    except ImportError:
        return False
    try:
        plot_report(report, path)
    except ImportError:
        return False
    return True


def _line(mode: str, step: Step, report: dict[str, Any]) -> str:
    percentiles = {row["percentage"]: row["latency"] for row in report["latencyDistribution"] or []}
    errors = sum(report["errorDistribution"].values())
    label = Path(step.config).stem + (f" --cycle {step.cycle}" if step.cycle else "")
    return (
        f"{mode:<8} {label:<32} {report['count']:>7} calls {report['rps']:>9.1f}/s  "
        f"p50 {percentiles.get(50, 0) / 1e6:7.2f} ms  p99 {percentiles.get(99, 0) / 1e6:7.2f} ms  "
        f"errors {errors}"
    )


def ratio_line(mode: str, reports: dict[str, dict[str, Any]]) -> str:
    check = reports["health.json"]["rps"]
    allocate = reports["allocate.json"]["rps"]
    ratio = allocate / check if check else 0.0
    return (
        f"{mode}: Allocate / Check = {ratio:.2f} "
        f"({allocate:.0f} / {check:.0f} calls/s, same server, same run)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.smoke", description=__doc__)
    parser.add_argument("--modes", default="embedded,redis", help="embedded, redis or both")
    parser.add_argument("--duration", default="3s", help="per measurement (Go duration)")
    parser.add_argument("--cpus", type=int, default=1, help="client processes")
    parser.add_argument("--out", type=Path, default=OUT, help="where reports and plots go")
    args = parser.parse_args(argv)
    duration_s = parse_go_duration(args.duration, "--duration")
    args.out.mkdir(parents=True, exist_ok=True)
    ratios, healthy = [], True
    try:
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            with tempfile.TemporaryDirectory(prefix="gpualloc-load-") as scratch:
                reports = _run_in_mode(mode, Path(scratch), duration_s, args.cpus, args.out)
            ratios.append(ratio_line(mode, reports))
            healthy &= all(r["statusCodeDistribution"].get("OK", 0) > 0 for r in reports.values())
    except (RuntimeError, ConfigError) as error:
        print(f"loadtest smoke: {error}", file=sys.stderr)
        return 1
    print(*ratios, sep="\n")
    print(f"reports and plots: {args.out}")
    return 0 if healthy else 1


def _run_in_mode(
    mode: str, scratch: Path, duration_s: float, cpus: int, out: Path
) -> dict[str, dict[str, Any]]:
    if mode == "embedded":
        with gpualloc_serve(None) as target:
            return run_mode(mode, target, duration_s, cpus, out)
    if mode == "redis":
        with redis_server(scratch) as url, gpualloc_serve(url) as target:
            return run_mode(mode, target, duration_s, cpus, out)
    raise RuntimeError(f"--modes: unknown mode {mode!r} (embedded, redis)")


if __name__ == "__main__":
    sys.exit(main())
