"""DRA fidelity against Kubernetes' own allocator: on a generated 1,000-GPU cluster (the files
`make bench ARGS=solver` writes, loadtest/upstream_allocator.py), every claim kind both can
express is placed by gpualloc on a node where k8s.io/dynamic-resource-allocation v0.34.4's
structured allocator (loadtest/upstream, built by `make peers`) also finds it feasible, with
free devices of that node; and upstream, asked node by node, finds feasible nodes too."""

from __future__ import annotations

from typing import Any

import pytest

from loadtest import upstream_allocator
from loadtest.bench_solver import KINDS
from loadtest.clusters import device_classes, generate
from loadtest.report import BenchReport
from services.allocator.core import AllocatedState, ClusterSnapshot
from tests.peers import peer

GPUS = 1_000


@pytest.fixture(scope="module")
def compared() -> tuple[BenchReport, dict[str, Any], set[str]]:
    peer("upstream-allocator")
    cluster = generate(GPUS, seed=GPUS)
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    state = AllocatedState.build(snapshot, cluster.held)
    kinds = {k.name: k.claims for k in KINDS if k.name in upstream_allocator.COMPARED_KINDS}
    report = BenchReport("fidelity")
    raw = upstream_allocator.compare(
        report, GPUS, cluster, snapshot, state, device_classes(), kinds, quick=True
    )
    held = {f"{r.pool}/{r.device}" for _, a in cluster.held for r in a.results}
    return report, raw, held


@pytest.mark.parametrize("kind", upstream_allocator.COMPARED_KINDS)
def test_upstream_finds_gpualloc_s_node_feasible_with_free_devices(compared, kind):
    report, raw, held = compared
    (row,) = [r for r in report.rows if r.name == f"{GPUS}/{kind}/vs-upstream"]
    assert row.values["same_node"] == "yes", raw[kind]
    devices = raw[kind]["pinned_devices"]
    assert devices and not set(devices) & held, devices
    assert {d.split("/")[0] for d in devices} == {row.values["node"]}  # pool = node here
    assert raw[kind]["feasible_nodes"] > 0
    assert row.values["up_pinned_ms"] > 0 and row.values["pinned_ms"] > 0
