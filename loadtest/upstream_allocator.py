"""gpualloc's solver beside Kubernetes' structured allocator, on the same cluster and claims.

`make bench ARGS=solver` writes each generated cluster as Kubernetes JSON (write_cluster, the
files loadtest/upstream/main.go reads: ResourceSlices, Nodes, DeviceClasses, the held devices
and per kind its claims) and runs `upstream-allocator` (built by `make peers` from
loadtest/upstream: k8s.io/dynamic-resource-allocation v0.34.4's `structured` package, the
library kube-scheduler's DynamicResources plugin calls). Both answer the same questions on the
initial state (nothing committed between repetitions):

- pinned: one claim on one node, the node gpualloc's unpinned solve chose (upstream: one
  Allocate, what Filter asks of one node; gpualloc: `solve(..., node=...)`);
- fleet: where does it fit (gpualloc: one unpinned solve, which searches the whole fleet and
  scores; upstream has no fleet-wide search, so: NewAllocator as PreFilter does, then Allocate
  on every node in turn, as Filter does, on one goroutine; first fit: until the first node that
  fits).

Kinds upstream cannot express are left out (four-nvlink: NVLink connectivity is a gpualloc
topology constraint, not DRA).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.clusters import GeneratedCluster
from loadtest.peers import peer_binary
from loadtest.report import BenchReport, percentile
from services.allocator.core import Allocated, AllocatedState, ClusterSnapshot, SelectorCache, solve
from services.common.dra.model import DeviceClass, ResourceClaim
from services.common.dra.serialize import to_dict

__all__ = ["COMPARED_KINDS", "compare", "run_upstream", "write_cluster"]
COMPARED_KINDS = ("one-gpu-cel", "eight-gpus", "mig-1g-fallback")


def _kube(obj: Any, api_version: str, kind: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, **to_dict(obj)}


def write_cluster(
    directory: Path,
    cluster: GeneratedCluster,
    classes: dict[str, DeviceClass],
    kinds: dict[str, dict[str, Any]],
) -> None:
    """The files upstream-allocator reads; `kinds`: name -> {claims, node, repeat, fleet_repeat}."""
    v1 = "resource.k8s.io/v1"
    documents = {
        "slices.json": [_kube(s, v1, "ResourceSlice") for s in cluster.slices],
        "nodes.json": [_kube(n, "v1", "Node") for n in cluster.nodes],
        "classes.json": [_kube(c, v1, "DeviceClass") for c in classes.values()],
        "allocated.json": sorted(
            {(r.driver, r.pool, r.device) for _, a in cluster.held for r in a.results}
        ),
        "claims.json": {
            name: {**spec, "claims": [_kube(c, v1, "ResourceClaim") for c in spec["claims"]]}
            for name, spec in kinds.items()
        },
    }
    for name, document in documents.items():
        (directory / name).write_text(json.dumps(document), encoding="utf-8")


def run_upstream(directory: Path, timeout_s: float = 1800) -> dict[str, dict[str, Any]]:
    done = subprocess.run(
        [str(peer_binary("upstream-allocator")), str(directory)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"upstream-allocator: exit {done.returncode}: {done.stderr.strip()}")
    results: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return results


def _timed(repeat: int, call: Any, *args: Any, **kwargs: Any) -> tuple[list[float], Any]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = call(*args, **kwargs)
        times.append((time.perf_counter() - started) * 1000)
    return times, result


def _median(values: Sequence[float]) -> float:
    return round(statistics.median(values), 3) if values else 0.0


def _p99(values: Sequence[float]) -> float:
    return round(percentile(values, 0.99), 3)


def _ratio(upstream: float, ours: float) -> float:
    return round(upstream / ours, 2) if ours else 0.0


def compare(
    report: BenchReport,
    gpus: int,
    cluster: GeneratedCluster,
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: dict[str, DeviceClass],
    kinds: dict[str, tuple[ResourceClaim, ...]],
    *,
    quick: bool,
) -> dict[str, dict[str, Any]]:
    """One row per kind, `<gpus>/<kind>/vs-upstream`; returns upstream's raw results too."""
    repeat = 20 if quick else 50
    fleet_repeat = {1_000: 10, 10_000: 3}.get(gpus, 1)
    ours: dict[str, dict[str, Any]] = {}
    inputs: dict[str, dict[str, Any]] = {}
    for name, claims in kinds.items():
        selectors = SelectorCache()
        question = (snapshot, state, classes, claims)
        fleet, placed = _timed(repeat, solve, *question, selectors=selectors)
        node = placed.node if isinstance(placed, Allocated) else ""
        pinned, _ = _timed(repeat if node else 0, solve, *question, selectors=selectors, node=node)
        ours[name] = {"fleet": fleet, "pinned": pinned, "node": node, "placed": placed}
        inputs[name] = {"claims": claims, "node": node, "repeat": repeat,
                        "fleet_repeat": fleet_repeat}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpualloc-upstream-") as scratch:
        write_cluster(Path(scratch), cluster, classes, inputs)
        upstream = run_upstream(Path(scratch))
    for name, mine in ours.items():
        theirs = upstream[name]
        if theirs.get("error"):
            raise RuntimeError(f"upstream-allocator {name}: {theirs['error']}")
        report.add(
            f"{gpus}/{name}/vs-upstream",
            pinned_ms=_median(mine["pinned"]),
            up_pinned_ms=_median(theirs["pinned_ms"]),
            pinned_ratio=_ratio(_median(theirs["pinned_ms"]), _median(mine["pinned"])),
            pinned_p99_ms=_p99(mine["pinned"]),
            up_pinned_p99_ms=_p99(theirs["pinned_ms"]),
            fleet_ms=_median(mine["fleet"]),
            up_all_nodes_ms=_median(theirs["all_nodes_ms"]),
            up_first_fit_ms=_median(theirs["first_fit_ms"] or []),
            fleet_ratio=_ratio(_median(theirs["all_nodes_ms"]), _median(mine["fleet"])),
            fleet_p99_ms=_p99(mine["fleet"]),
            up_all_nodes_p99_ms=_p99(theirs["all_nodes_ms"]),
            up_feasible_nodes=int(theirs["feasible_nodes"]),
            same_node="yes" if theirs["pinned_fits"] else "NO",
            node=mine["node"],
        )
    return upstream
