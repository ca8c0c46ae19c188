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

`measure_layouts` is the layout dimension itself: the service benchmark
(`make bench ARGS=service`) runs it too, for `allocate-reserve` (Allocate(reserve=true) of one
H100 on any node, reservations kept).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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
LAYOUTS = ("standalone", "cluster")
WAITS = {"off": 0, "on": 1}  # GPUALLOC_REDIS_WAIT_REPLICAS
STANDALONE = "redis-server + 1 replica"
CLUSTER = "3 primaries + 3 replicas (deploy/local/redis-cluster.sh)"


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


@contextmanager
def store_layouts(directory: Path, cpus: set[int]) -> Iterator[dict[str, str]]:
    """Both layouts started on `cpus` (standalone with its replica, the cluster by
    deploy/local/redis-cluster.sh): {layout: GPUALLOC_REDIS_URL}; stopped on exit."""
    (directory / "standalone").mkdir(parents=True)
    primary = _Redis(directory / "standalone", cpus)
    replica = _Replica(directory / "replica", cpus, primary)
    cluster_env = {**os.environ, "GPUALLOC_CLUSTER_PORT": str(free_cluster_base())}
    cluster_dir = str(directory / "cluster")
    try:
        started = subprocess.run(
            [str(SCRIPT), "start", cluster_dir], env=cluster_env, capture_output=True,
            text=True, check=True, preexec_fn=_pinned(cpus),
        )  # fmt: skip
        yield {"standalone": primary.url, "cluster": started.stdout.strip()}
    finally:
        subprocess.run([str(SCRIPT), "stop", cluster_dir], env=cluster_env, check=False)
        replica.stop()
        primary.stop()


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


def measure_layouts(
    report: BenchReport,
    directory: Path,
    phases: Sequence[str],
    seconds: float,
    cpus: tuple[set[int], set[int]],
    prefix: str = "",
) -> None:
    """Rows `<prefix><layout>-wait-<off|on>:<phase>` (rps, p50/p99 ms, calls, aborted) for each
    layout x WAIT, one fresh 2-process allocator per case on `directory`'s inventory.json and
    nodes.json (generate_inventory), then the ratios (`_add_layout_ratios`)."""
    server_cpus, client_cpus = cpus
    nodes_file = directory / "nodes.json"
    max_calls = int(RESERVE_SHARE * H100_PER_NODE * len(json.loads(nodes_file.read_text())))
    with store_layouts(directory / "layouts", client_cpus) as urls:
        for layout, url in urls.items():
            for mode, replicas in WAITS.items():
                env = {**os.environ, "GPUALLOC_LOG_LEVEL": "WARNING"}
                env["GPUALLOC_MAX_WORKERS"] = "16"
                env.update(SEED_DOCUMENT_LIMITS)
                env["GPUALLOC_REDIS_WAIT_REPLICAS"] = str(replicas)
                env["GPUALLOC_REDIS_WAIT_TIMEOUT"] = "500ms"
                env["GPUALLOC_REDIS_PREFIX"] = f"bench-{layout}-{mode}"  # a fresh store each
                server, target = _serve(url, directory / "inventory.json", server_cpus, env)
                try:
                    for phase in phases:
                        result = _client(
                            target, phase, seconds, nodes_file, client_cpus, max_calls=max_calls
                        )
                        report.add(
                            f"{prefix}{layout}-wait-{mode}:{phase}",
                            rps=round(result["rps"], 1),
                            p50_ms=round(result["p50_ms"], 2),
                            p99_ms=round(result["p99_ms"], 2),
                            calls=result["calls"],
                            aborted=result["aborted"],
                        )
                finally:
                    server.terminate()
                    server.wait(timeout=30)
    _add_layout_ratios(report, phases, prefix)


def _add_layout_ratios(report: BenchReport, phases: Sequence[str], prefix: str) -> None:
    """Side by side: `<prefix>cluster/standalone-wait-<mode>:<phase>` and
    `<prefix><layout>-wait-on/off:<phase>`, each with the ratio of RPS (`ratio`) and of p99
    (`p99_ratio`), and the target on the cluster's RPS with WAIT off (>= 0.85 x standalone)."""
    rows = {row.name: row.values for row in report.rows}

    def add(name: str, over: str, under: str) -> None:
        top, bottom = rows.get(prefix + over), rows.get(prefix + under)
        if top is None or bottom is None or not float(bottom["rps"]) > 0:
            return
        p99 = float(bottom["p99_ms"])
        report.add(
            prefix + name,
            ratio=round(float(top["rps"]) / float(bottom["rps"]), 3),
            p99_ratio=round(float(top["p99_ms"]) / p99, 3) if p99 > 0 else 0.0,
        )

    for phase in phases:
        for mode in WAITS:
            add(
                f"cluster/standalone-wait-{mode}:{phase}",
                f"cluster-wait-{mode}:{phase}",
                f"standalone-wait-{mode}:{phase}",
            )
        for layout in LAYOUTS:
            add(
                f"{layout}-wait-on/off:{phase}",
                f"{layout}-wait-on:{phase}",
                f"{layout}-wait-off:{phase}",
            )
        target = f"{prefix}cluster/standalone-wait-off:{phase}"
        report.targets.append(Target(target, "ratio", 0.85, at_least=True))


def run(quick: bool) -> BenchReport:
    seconds = 2.0 if quick else 6.0
    scale = 0.1 if quick else 1.0
    server_cpus, client_cpus = _cpu_split()
    report = BenchReport(
        "store",
        setup={
            "server": f"gpualloc-allocator --workers 2, cpus {sorted(server_cpus)}",
            "client": f"the service benchmark's {PHASE}, cpus {sorted(client_cpus)} (with Redis)",
            "standalone": STANDALONE,
            "cluster": CLUSTER,
            "seconds_per_case": seconds,
            "cpus": os.cpu_count() or 0,
        },
    )
    with tempfile.TemporaryDirectory(prefix="gpualloc-bench-store-") as tmp:
        directory = Path(tmp)
        _, h100_nodes = generate_inventory(directory, scale)
        (directory / "nodes.json").write_text(json.dumps(h100_nodes))
        measure_layouts(report, directory, [PHASE], seconds, (server_cpus, client_cpus))
    return report
