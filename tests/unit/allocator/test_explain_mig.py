"""Explaining MIG fleets: by node groups (core/replay.py) it gives what searching every node gives.

MIG nodes are where node groups are many (every packing of every GPU is its own group) and where
a template's candidate order depends on the state (a GPU whose counter set is in use is tried
first, or last): core/candidates.py keeps that order per (alternative, whether each counter set
is fresh) and builds candidates only as a search reaches them. The reference here never uses
either: the solver with replays off searches every node on its own, without a template's lists.

- a property over generated MIG fleets (loadtest/clusters.py, one MIG node in one to three),
  random extra holdings (valid packings or not: overdrawn counters too), random taints, random
  claims of the bench's shapes and every policy: the same explanation, answer and statistics,
  and a plain solve by node groups places what the explaining one places;
- table cases with kebab-case ids: one MIG node in a known state each, with the reasons the
  explanation must give.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadtest.clusters import DRIVER as BENCH_DRIVER
from loadtest.clusters import GeneratedCluster, device_classes, generate
from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    Explanation,
    Policy,
    ReasonCode,
    SelectorCache,
    SolveResult,
    solve,
)
from services.allocator.core import solver as solver_module
from services.common.dra.model import (
    AllocationResult,
    DeviceRequestAllocationResult,
    ResourceSlice,
)
from tests.builders import XID_TAINT, with_taint
from tests.unit.allocator.test_batch import KINDS, SETTINGS
from tests.unit.allocator.test_explain_groups import explained


def _per_node(call: Any) -> SolveResult | str:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(solver_module.NodeRun, "_replaying", lambda self: None)
        return explained(call)


def _fleet(
    cluster: GeneratedCluster, tainted: set[str], extra: list[tuple[str, AllocationResult]]
) -> tuple[ClusterSnapshot, AllocatedState]:
    slices = [with_taint(s, tainted, XID_TAINT) if tainted else s for s in cluster.slices]
    snapshot = ClusterSnapshot.build(slices, cluster.nodes, topologies=cluster.topologies)
    return snapshot, AllocatedState.build(snapshot, [*cluster.held, *extra])


def _mig_devices(cluster: GeneratedCluster) -> list[tuple[str, str]]:
    """(node, device) of every device of the MIG nodes, in a stable order."""
    migs = set(cluster.mig_nodes)
    return [
        (s.node_name or "", d.name)
        for s in cluster.slices
        if s.node_name in migs
        for d in s.devices
    ]


def _held(node: str, device: str, owner: str) -> tuple[str, AllocationResult]:
    result = DeviceRequestAllocationResult("held", BENCH_DRIVER, node, device)
    return owner, AllocationResult((result,))


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    mig_every=st.integers(1, 3),
    kind=st.sampled_from(sorted(KINDS)),
    policy=st.sampled_from(list(Policy)),
    data=st.data(),
)
def test_explaining_a_mig_fleet_by_groups_equals_searching_every_node(
    seed: int, mig_every: int, kind: str, policy: Policy, data: st.DataObject
) -> None:
    cluster = generate(48, seed=seed, mig_every=mig_every)
    devices = _mig_devices(cluster)
    held = {f"{n}/{d}" for s in cluster.held for n, d in _ids(s[1])}
    free = [(n, d) for n, d in devices if f"{n}/{d}" not in held]
    extra_picks = data.draw(st.lists(st.sampled_from(free), max_size=12, unique=True))
    extra = [_held(n, d, f"extra/{i}") for i, (n, d) in enumerate(extra_picks)]
    tainted = data.draw(st.sets(st.sampled_from([f"{n}/{d}" for n, d in devices]), max_size=6))
    snapshot, state = _fleet(cluster, tainted, extra)
    claims_, options = KINDS[kind]
    classes = device_classes()

    def call(explain: bool) -> Any:
        return lambda: solve(
            snapshot,
            state,
            classes,
            claims_,
            policy=policy,
            selectors=SelectorCache(),
            explain=explain,
            **options,
        )

    grouped = explained(call(True))
    assert explained(call(True)) == grouped  # again, from the tapes the first one kept
    assert grouped == _per_node(call(True))
    plain = explained(call(False))
    if isinstance(grouped, Allocated):  # by groups, kept orders and all: the same placement
        assert isinstance(plain, Allocated)
        assert (plain.node, plain.allocations) == (grouped.node, grouped.allocations)
    else:
        assert not isinstance(plain, Allocated)


def _ids(allocation: AllocationResult) -> list[tuple[str, str]]:
    return [(r.pool, r.device) for r in allocation.results]


# --- table: one MIG node in a known state -------------------------------------------------------


def _one_mig_node() -> GeneratedCluster:
    """A fleet whose first A100/H100 node publishes MIG (mig_every=1), nothing held."""
    cluster = generate(24, seed=3, mig_every=1)
    return replace(cluster, held=[])


def _gpu_devices(cluster: GeneratedCluster, gpu: int) -> tuple[str, ResourceSlice]:
    node = cluster.mig_nodes[0]
    found = next(s for s in cluster.slices if s.name == f"{node}-{BENCH_DRIVER}-{gpu}")
    return node, found


def _case_gpu_taken_whole(cluster: GeneratedCluster) -> tuple[set[str], list[Any]]:
    node, _ = _gpu_devices(cluster, 0)
    return set(), [_held(node, "gpu-0", "job/whole")]


def _case_slices_packed(cluster: GeneratedCluster) -> tuple[set[str], list[Any]]:
    node, gpu = _gpu_devices(cluster, 1)
    small = [d.name for d in gpu.devices if "-mig-1g" in d.name][:3]
    return set(), [_held(node, name, f"job/{i}") for i, name in enumerate(small)]


def _case_overdrawn(cluster: GeneratedCluster) -> tuple[set[str], list[Any]]:
    node, gpu = _gpu_devices(cluster, 2)
    first = next(d.name for d in gpu.devices if "-mig-" in d.name)  # under the whole GPU's
    return set(), [_held(node, "gpu-2", "job/whole"), _held(node, first, "job/slice")]


def _case_tainted(cluster: GeneratedCluster) -> tuple[set[str], list[Any]]:
    node, gpu = _gpu_devices(cluster, 3)
    return {f"{node}/{d.name}" for d in gpu.devices}, []


def _case_every_gpu_whole(cluster: GeneratedCluster) -> tuple[set[str], list[Any]]:
    node = cluster.mig_nodes[0]
    return set(), [_held(node, f"gpu-{g}", f"job/{g}") for g in range(8)]


_ALL = frozenset(Policy)
_USED_FIRST = frozenset({Policy.BINPACK, Policy.FIRST_FIT})  # reach the used GPUs' slices

# case -> (its holdings and taints, a reason the explanation gives, under which policies): a
# counter shortage shows only where the search meets the used GPU before a fitting slice (SPREAD
# tries fresh GPUs first, FIRST_FIT goes by position: GPU 0 first); devices in use and taints
# show under every policy.
CASES = {
    "mig-gpu-taken-whole": (_case_gpu_taken_whole, ReasonCode.COUNTERS, _USED_FIRST),
    "mig-slices-packed": (_case_slices_packed, ReasonCode.IN_USE, _ALL),
    "mig-counters-overdrawn": (_case_overdrawn, ReasonCode.COUNTERS, {Policy.BINPACK}),
    "mig-gpu-tainted": (_case_tainted, ReasonCode.TAINTED, _ALL),
    "mig-every-gpu-whole": (_case_every_gpu_whole, ReasonCode.IN_USE, _ALL),
}


@pytest.mark.parametrize("policy", list(Policy), ids=lambda p: str(p).lower())
@pytest.mark.parametrize("case", list(CASES))
def test_a_mig_node_is_explained_alike_by_groups_and_node_by_node(
    case: str, policy: Policy
) -> None:
    build, reason, policies = CASES[case]
    cluster = _one_mig_node()
    tainted, extra = build(cluster)
    snapshot, state = _fleet(cluster, tainted, extra)
    claims_, options = KINDS["mig-fallback"]

    def call() -> SolveResult:
        return solve(
            snapshot,
            state,
            device_classes(),
            claims_,
            policy=policy,
            selectors=SelectorCache(),
            explain=True,
            nodes={cluster.mig_nodes[0]},
            **options,
        )

    grouped = explained(call)
    assert grouped == _per_node(call)
    assert not isinstance(grouped, str)
    explanation = grouped.explanation
    assert isinstance(explanation, Explanation)
    codes = {g.code for r in explanation.requests for g in r.rejections}
    assert reason in codes or policy not in policies, (case, codes)
