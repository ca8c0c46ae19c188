"""Shared by the bridges' tests: the example cluster as inventory values, offline solving,
test data, and a way to give every reservation back between tests."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

import yaml

from services.allocator.cli.solve import run_solve
from services.client.client import AllocatorClient
from services.client.inventory import (
    CounterTotals,
    InventoryDevice,
    NodeInventory,
    NvLink,
    TopologyGpu,
)
from services.common.dra.model import DeviceID, ResourceClaim, ResourceSlice
from services.common.dra.serialize import to_dict
from services.common.manifests import load_manifests

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data"
CLUSTER = ROOT / "examples" / "cluster"
CLASSES = ROOT / "examples" / "deviceclasses.yaml"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def example_nodes(nvlink: Sequence[str] = ("h100-node-1", "h100-node-2")) -> list[NodeInventory]:
    """examples/cluster as the inventory shows it; the GPUs of the `nvlink` nodes fully meshed
    with NV18, as their `nvidia-smi topo -m` (examples/nvml) says."""
    slices = [o for o in load_manifests([str(CLUSTER)]) if isinstance(o, ResourceSlice)]
    nodes = []
    for name in sorted({s.node_name for s in slices if s.node_name}):
        mine = [s for s in slices if s.node_name == name]
        devices = tuple(
            InventoryDevice(DeviceID(s.driver, s.pool.name, d.name), d)
            for s in mine
            for d in s.devices
        )
        gpus = tuple(
            TopologyGpu(
                uuid=str(d.device.attributes["uuid"].value),
                device=d.id,
                pci_bus_id=str(d.device.attributes["resource.kubernetes.io/pciBusID"].value),
            )
            for d in devices
            if d.type == "gpu" and "uuid" in d.device.attributes
        )
        links = (
            tuple(NvLink(a.uuid, b.uuid, 18) for a, b in combinations(gpus, 2))
            if name in nvlink
            else ()
        )
        counters = tuple(
            CounterTotals(s.driver, s.pool.name, c.name, dict(c.counters))
            for s in mine
            for c in s.shared_counters
        )
        nodes.append(NodeInventory(name, {}, devices, counters, gpus, links))
    return nodes


def solve(claims: Sequence[ResourceClaim], tmp_path: Path) -> tuple[int, dict[str, Any]]:
    """`gpualloc solve` of the claims on the example cluster: (exit code, JSON report)."""
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump_all([to_dict(c) for c in claims]))
    out, err = io.StringIO(), io.StringIO()
    code = run_solve(
        [str(CLUSTER), str(CLASSES), str(path)],
        node=None,
        output="json",
        stdout=out,
        stderr=err,
        stdin=io.StringIO(""),
    )
    return code, json.loads(out.getvalue()) if out.getvalue() else {"stderr": err.getvalue()}


def release_everything(target: str) -> None:
    """Give back every reservation of the allocator at `target`, as its owner."""
    with AllocatorClient(target) as client:
        for reservation in client.list():
            client.release(reservation, owner=reservation.owner, allow_missing=True)
