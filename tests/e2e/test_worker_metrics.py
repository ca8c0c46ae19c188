"""`gpualloc-allocator --workers 2 --metrics-listen HOST:P`: worker k serves its own /metrics
on P + k (one process per scrape target: counters must not jump between processes)."""

from __future__ import annotations

import re
import time
import urllib.request

import pytest

from tests.ports import free_port

pytestmark = pytest.mark.redis


def instance(port: int, timeout: float = 20.0) -> str:
    """The service.instance.id the endpoint on `port` reports (its process's)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                text = reply.read().decode()
            found = re.search(r'target_info\{[^}]*service_instance_id="([^"]+)"', text)
            if found and "gpualloc_fleet_gpus{" in text:
                return found.group(1)
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"no metrics on port {port}")
        time.sleep(0.2)


def test_each_worker_serves_its_own_metrics_port(allocator_processes, redis_url):
    port = free_port(following=1)  # P and P + 1
    allocator_processes(redis_url, workers=2, extra=["--metrics-listen", f"127.0.0.1:{port}"])
    first, second = instance(port), instance(port + 1)
    assert first != second  # two processes, one endpoint each
