"""A real allocator whose inventory is down: not ready, says so once, and recovers.

Real processes: `gpualloc-allocator --inventory` started before any inventory listens, then a
real `gpualloc-inventory` on that port, then stopped again. Readiness is what the Kubernetes
probe asks (`gpualloc.allocator.v1.Allocator` on the health port); the logs and the metrics
endpoint are read as an operator would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.e2e.allocator_harness import start_allocator_process, wait_serving
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ALLOCATOR = "gpualloc.allocator.v1.Allocator"
UNREACHABLE = "inventory unreachable at"
RECOVERED = "inventory reachable again after"


def status(target: str, service: str) -> int:
    with grpc.insecure_channel(target) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=2
        )
        return int(response.status)


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(0.1)


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith((name + " ", name + "{")):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def start_inventory(port: int, log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.inventory",
                "--listen",
                f"127.0.0.1:{port}",
                "--seed",
                str(ROOT / "examples" / "cluster"),
            ],
            cwd=ROOT,
            env={**os.environ, "GPUALLOC_LOG_FORMAT": "text", "GPUALLOC_REDIS_URL": ""},
            stdout=log,
            stderr=subprocess.STDOUT,
        )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.terminate()
            process.wait(15)


def test_allocator_without_inventory_is_not_ready_logs_it_once_and_recovers(tmp_path, processes):
    inventory_port, port, health_port, metrics_port = (free_port() for _ in range(4))
    log_path: Path = tmp_path / "allocator.log"
    allocator = start_allocator_process(
        [
            "--listen",
            f"127.0.0.1:{port}",
            "--inventory",
            f"127.0.0.1:{inventory_port}",
            "--health-listen",
            f"127.0.0.1:{health_port}",
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
        ],
        log_path,
        env={"GPUALLOC_REDIS_URL": ""},
    )
    processes.append(allocator)
    probe = f"127.0.0.1:{health_port}"
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"

    def logged(text: str) -> int:
        return log_path.read_text().count(text)

    # Down from the start: the probe's service is NOT_SERVING, the server itself SERVING.
    wait_until(lambda: logged(UNREACHABLE) == 1, 15, "the unreachable inventory is logged")
    assert status(probe, ALLOCATOR) == health_pb2.HealthCheckResponse.NOT_SERVING
    assert status(probe, "") == health_pb2.HealthCheckResponse.SERVING
    assert "not ready (no view yet)" in log_path.read_text()
    assert metric(metrics, "gpualloc_inventory_connected") == 0
    time.sleep(3)  # the feed retries meanwhile (backoff from 0.1 s): not one more line
    assert logged(UNREACHABLE) == 1

    inventory = start_inventory(inventory_port, tmp_path / "inventory.log")
    processes.append(inventory)
    wait_serving(f"127.0.0.1:{port}")
    assert status(probe, ALLOCATOR) == health_pb2.HealthCheckResponse.SERVING
    wait_until(lambda: logged(RECOVERED) == 1, 10, "the recovery is logged")
    assert metric(metrics, "gpualloc_inventory_connected") == 1
    assert metric(metrics, "gpualloc_inventory_disconnects_total") == 0

    # Lost after it had a view: logged once, counted, still ready (it serves the last view).
    inventory.terminate()
    inventory.wait(15)
    wait_until(lambda: logged(UNREACHABLE) == 2, 30, "the lost inventory is logged")
    assert "serving the last view" in log_path.read_text()
    assert metric(metrics, "gpualloc_inventory_disconnects_total") == 1
    assert status(probe, ALLOCATOR) == health_pb2.HealthCheckResponse.SERVING
    time.sleep(2)
    assert logged(UNREACHABLE) == 2
    assert logged(RECOVERED) == 1
