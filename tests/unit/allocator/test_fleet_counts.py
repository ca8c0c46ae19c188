"""core/fleet.py on the demo cluster (examples/cluster): GPUs by state, MIG partitions free,
held shares, fragmentation; fleet_metrics.py's tenant bound."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from services.allocator.app.fleet_gauges import MAX_TENANTS, OTHER_TENANTS, _bounded
from services.allocator.app.inventory_feed import StaticFeed
from services.allocator.core import AllocatedState, ClusterSnapshot
from services.allocator.core.fleet import count_fleet
from services.common.dra.model import AllocationResult, DeviceRequestAllocationResult
from tests.builders import with_taint

ROOT = Path(__file__).resolve().parents[3]
DRIVER = "gpu.nvidia.com"
A100, H100 = "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"
A100_NODE = ("a100-node-1", "a100-node-1", A100)


def demo(tainted: frozenset[str] = frozenset()) -> ClusterSnapshot:
    """The demo cluster; devices named `node/device` in `tainted` carry an NVML health taint."""
    feed = StaticFeed.from_paths([str(ROOT / "examples" / "cluster")])
    update = feed.update()
    slices = [with_taint(s, tainted) for found in update.slices.values() for s in found]
    nodes = [n for n in update.nodes.values() if n is not None]
    return ClusterSnapshot.build(slices, nodes)


SNAPSHOT = demo()


def held(owner: str, node: str, *devices: str) -> tuple[str, AllocationResult]:
    results = tuple(DeviceRequestAllocationResult("r", DRIVER, node, d) for d in devices)
    return owner, AllocationResult(results)


def counted(*holds: tuple[str, AllocationResult], committed: frozenset[str] = frozenset()):
    state = AllocatedState.build(SNAPSHOT, holds)
    return count_fleet(SNAPSHOT, state, lambda owner: owner in committed)


def test_an_empty_fleet_is_all_free_and_unfragmented():
    count = counted()
    assert sum(count.capacity().values()) == 24
    assert count.gpus[("h100-node-1", "h100-node-1", H100, "free")] == 8
    assert count.gpus[(*A100_NODE, "free")] == 4
    assert not [key for key in count.gpus if key[3] != "free"]
    # each profile on each of the four A100s: 7 1g.5gb partitions fit per GPU
    assert count.partitions_free[(*A100_NODE, "1g.5gb")] == 28
    assert count.partitions_free[(*A100_NODE, "7g.40gb")] == 4
    assert set(count.fragmentation.values()) == {0}
    assert count.held == {}


@pytest.mark.parametrize(
    ("holds", "committed", "node", "expected"),
    [
        pytest.param(
            [held("res-1", "h100-node-1", "gpu-3")],
            frozenset(),
            ("h100-node-1", "h100-node-1", H100),
            {"free": 7, "reserved": 1},
            id="one-leased-gpu",
        ),
        pytest.param(
            [held("res-1", "h100-node-1", "gpu-3"), held("res-2", "h100-node-1", "gpu-4")],
            frozenset({"res-2"}),
            ("h100-node-1", "h100-node-1", H100),
            {"free": 6, "reserved": 1, "committed": 1},
            id="one-leased-one-committed",
        ),
        pytest.param(
            [held("res-1", "a100-node-1", "gpu-0-mig-1g5gb-19-0")],
            frozenset(),
            A100_NODE,
            {"free": 3, "reserved": 1},
            id="one-mig-slice-holds-its-gpu",
        ),
        pytest.param(
            [
                held("res-1", "a100-node-1", "gpu-0-mig-1g5gb-19-0"),
                held("res-2", "a100-node-1", "gpu-0-mig-1g5gb-19-1"),
            ],
            frozenset({"res-2"}),
            A100_NODE,
            {"free": 3, "committed": 1},
            id="a-committed-slice-makes-its-gpu-committed",
        ),
    ],
)
def test_gpus_by_state(holds, committed, node, expected):
    count = counted(*holds, committed=committed)
    states = {key[3]: n for key, n in count.gpus.items() if key[:3] == node}
    assert states == expected


@pytest.mark.parametrize(
    ("tainted", "holds", "node", "expected"),
    [
        pytest.param(
            {"h100-node-1/gpu-3"},
            [],
            ("h100-node-1", "h100-node-1", H100),
            {"free": 7, "tainted": 1},
            id="a-tainted-gpu-is-not-free",
        ),
        pytest.param(
            {"h100-node-1/gpu-3"},
            [held("res-1", "h100-node-1", "gpu-3")],
            ("h100-node-1", "h100-node-1", H100),
            {"free": 7, "reserved": 1},
            id="a-held-tainted-gpu-is-held",
        ),
        pytest.param(
            {"a100-node-1/gpu-0-mig-1g5gb-19-0"},
            [],
            A100_NODE,
            {"free": 3, "tainted": 1},
            id="a-tainted-mig-slice-taints-its-gpu",
        ),
    ],
)
def test_a_tainted_gpu_is_its_own_state(tainted, holds, node, expected):
    snapshot = demo(frozenset(tainted))
    state = AllocatedState.build(snapshot, holds)
    count = count_fleet(snapshot, state, lambda owner: False)
    states = {key[3]: n for key, n in count.gpus.items() if key[:3] == node}
    assert states == expected


def test_a_tainted_whole_gpu_fragments_its_node_when_its_slices_are_not():
    """A whole-GPU request cannot have A100 gpu-0 (its whole device is tainted), MIG requests
    still can have its slices: that free capacity is not in a free whole GPU."""
    snapshot = demo(frozenset({"a100-node-1/gpu-0"}))
    count = count_fleet(snapshot, AllocatedState.build(snapshot, []), lambda owner: False)
    assert count.fragmentation["a100-node-1"] > 0
    assert count.fragmentation["h100-node-1"] == 0


def test_a_tainted_partition_is_not_free():
    snapshot = demo(frozenset({"a100-node-1/gpu-0-mig-1g5gb-19-0"}))
    count = count_fleet(snapshot, AllocatedState.build(snapshot, []), lambda owner: False)
    assert count.partitions_free[(*A100_NODE, "1g.5gb")] == 27


def test_a_mig_slice_takes_its_partition_and_fragments_the_node():
    count = counted(held("res-1", "a100-node-1", "gpu-0-mig-1g5gb-19-0"))
    assert count.partitions_free[(*A100_NODE, "1g.5gb")] == 27
    assert count.partitions_free[(*A100_NODE, "7g.40gb")] == 3  # gpu-0 cannot take one now
    score = count.fragmentation["a100-node-1"]
    assert 0 < score < Fraction(1, 4)  # 3 whole GPUs free, part of a fourth
    ((owner, model), share) = next(iter(count.held.items()))
    assert (owner, model) == ("res-1", A100) and 0 < share < 1


def test_a_whole_gpu_leaves_no_partition_on_it_and_no_fragmentation():
    count = counted(held("res-1", "a100-node-1", "gpu-0"))
    assert count.partitions_free[(*A100_NODE, "7g.40gb")] == 3
    assert count.partitions_free[(*A100_NODE, "1g.5gb")] == 21
    assert count.fragmentation["a100-node-1"] == 0
    assert count.held == {("res-1", A100): 1}


def test_a_slice_on_every_gpu_leaves_nothing_whole():
    holds = [held(f"res-{i}", "a100-node-1", f"gpu-{i}-mig-1g5gb-19-0") for i in range(4)]
    count = counted(*holds)
    assert count.fragmentation["a100-node-1"] == 1
    assert (*A100_NODE, "free") not in count.gpus


def test_tenants_past_the_bound_are_summed_under_other():
    tenants = {(f"t{i:03}", H100, "reserved"): Fraction(i + 1) for i in range(MAX_TENANTS + 10)}
    bounded = _bounded(tenants)
    kept = {tenant for tenant, _, _ in bounded}
    assert len(kept) == MAX_TENANTS + 1 and OTHER_TENANTS in kept
    assert "t000" not in kept and f"t{MAX_TENANTS + 9:03}" in kept  # the biggest are kept
    assert sum(bounded.values()) == sum(tenants.values())
