"""Store layout benchmark: the reservation store on standalone Redis vs a 3-shard Redis Cluster,
with and without WAIT, in one run.

    python -m loadtest.bench store [--quick] [--json]      (make bench ARGS=store)

For each layout x WAIT, a fresh `gpualloc-allocator --workers 2` (two processes on one port) on
the inventory of the service benchmark (loadtest/bench_service.py: 10,000 GPUs), and the
service benchmark's `reserve-release-cycle` client (Allocate(reserve=true) of one H100 on a named
node, then Release; RPS counts cycles). Standalone is a redis-server with one replica; the
cluster is deploy/local/redis-cluster.sh's 3 primaries + 3 replicas. WAIT on is
GPUALLOC_REDIS_WAIT_REPLICAS=1 (timeout 500 ms). Redis and the client share the client's CPUs,
the allocator processes the server's. Target (issue 17): the cluster costs no more than ~15% per
call (cycle RPS on the cluster >= 0.85 x standalone, WAIT off).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest.bench_service import (
    H100_PER_NODE,
    RESERVE_SHARE,
    ROOT,
    SEED_DOCUMENT_LIMITS,
    _client,
    _cpu_split,
    _free_port,
    _pinned,
    _Redis,
    _wait_serving,
    generate_inventory,
)
from loadtest.report import BenchReport, Target

SCRIPT = ROOT / "deploy" / "local" / "redis-cluster.sh"
PHASE = "reserve-release-cycle"


def free_cluster_base() -> int:
    """A base port with base..base+5 and their cluster bus ports (+100) free."""
    for base in range(21000, 60000, 211):
        try:
            for port in [*range(base, base + 6), *range(base + 100, base + 106)]:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range for the cluster")


class _Replica(_Redis):
    def __init__(self, directory: Path, cpus: set[int], primary: _Redis) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        super().__init__(directory, cpus)
        subprocess.run(
            ["redis-cli", "-p", str(self.port), "replicaof", "127.0.0.1", str(primary.port)],
            check=True,
            capture_output=True,
        )
        time.sleep(1.0)  # the first sync of an empty primary


def _serve(url: str, inventory: Path, cpus: set[int], env: dict[str, str]) -> Any:
    port = _free_port()
    with (inventory.parent / f"allocator-{port}.log").open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "services.allocator", "--seed", str(inventory),
             "--listen", f"127.0.0.1:{port}", "--redis-url", url, "--workers", "2"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_pinned(cpus),
        )  # fmt: skip
    target = f"127.0.0.1:{port}"
    try:
        _wait_serving(target, server, timeout=120)
    except RuntimeError:
        server.terminate()
        server.wait(timeout=30)
        tail = (inventory.parent / f"allocator-{port}.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"allocator on {url} did not serve:\n{tail}") from None
    return server, target


def run(quick: bool) -> BenchReport:
    seconds = 2.0 if quick else 6.0
    scale = 0.1 if quick else 1.0
    server_cpus, client_cpus = _cpu_split()
    report = BenchReport(
        "store",
        setup={
            "server": f"gpualloc-allocator --workers 2, cpus {sorted(server_cpus)}",
            "client": f"the service benchmark's {PHASE}, cpus {sorted(client_cpus)} (with Redis)",
            "standalone": "redis-server + 1 replica",
            "cluster": "3 primaries + 3 replicas (deploy/local/redis-cluster.sh)",
            "seconds_per_case": seconds,
            "cpus": os.cpu_count() or 0,
        },
    )
    with tempfile.TemporaryDirectory(prefix="gpualloc-bench-store-") as tmp:
        directory = Path(tmp)
        _, h100_nodes = generate_inventory(directory, scale)
        nodes_file = directory / "nodes.json"
        nodes_file.write_text(json.dumps(h100_nodes))
        (directory / "standalone").mkdir()
        primary = _Redis(directory / "standalone", client_cpus)
        replica = _Replica(directory / "replica", client_cpus, primary)
        cluster_env = {**os.environ, "GPUALLOC_CLUSTER_PORT": str(free_cluster_base())}
        cluster_dir = str(directory / "cluster")
        try:
            started = subprocess.run(
                [str(SCRIPT), "start", cluster_dir], env=cluster_env, capture_output=True,
                text=True, check=True, preexec_fn=_pinned(client_cpus),
            )  # fmt: skip
            urls = {"standalone": primary.url, "cluster": started.stdout.strip()}
            for layout, url in urls.items():
                for wait in (0, 1):
                    env = {**os.environ, "GPUALLOC_LOG_LEVEL": "WARNING"}
                    env["GPUALLOC_MAX_WORKERS"] = "16"
                    env.update(SEED_DOCUMENT_LIMITS)
                    env["GPUALLOC_REDIS_WAIT_REPLICAS"] = str(wait)
                    env["GPUALLOC_REDIS_WAIT_TIMEOUT"] = "500ms"
                    env["GPUALLOC_REDIS_PREFIX"] = f"bench-{layout}-{wait}"
                    server, target = _serve(url, directory / "inventory.json", server_cpus, env)
                    try:
                        result = _client(
                            target, PHASE, seconds, nodes_file, client_cpus,
                            max_calls=int(RESERVE_SHARE * H100_PER_NODE * len(h100_nodes)),
                        )  # fmt: skip
                    finally:
                        server.terminate()
                        server.wait(timeout=30)
                    report.add(
                        f"{layout}-wait-{'on' if wait else 'off'}",
                        rps=round(result["rps"], 1),
                        p50_ms=round(result["p50_ms"], 2),
                        p99_ms=round(result["p99_ms"], 2),
                        calls=result["calls"],
                    )
        finally:
            subprocess.run([str(SCRIPT), "stop", cluster_dir], env=cluster_env, check=False)
            replica.stop()
            primary.stop()
    rps = {row.name: float(row.values["rps"]) for row in report.rows}
    for mode in ("off", "on"):
        base = rps.get(f"standalone-wait-{mode}", 0.0)
        if base > 0:
            ratio = rps.get(f"cluster-wait-{mode}", 0.0) / base
            report.add(f"cluster/standalone-wait-{mode}", ratio=round(ratio, 3))
    for layout in ("standalone", "cluster"):
        off = rps.get(f"{layout}-wait-off", 0.0)
        if off > 0:
            report.add(f"{layout}-wait-on/off", ratio=round(rps[f"{layout}-wait-on"] / off, 3))
    report.targets.append(Target("cluster/standalone-wait-off", "ratio", 0.85, at_least=True))
    return report
