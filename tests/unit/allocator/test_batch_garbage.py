"""A batch's solve leaves no cyclic garbage: what it made is freed by reference counting.

Cyclic garbage waits for the cyclic collector, whose young collections then walk it (and
every object it holds) while a call waits: a closure over a NodeRun kept in the run's own
_Founds (`rescore`) made one such cycle per node move, ~40 objects each, which took about
half of the collector's time in a reserving batch (docs/performance.md, session 8).
"""

from __future__ import annotations

import gc

import pytest

from loadtest.clusters import device_classes, generate
from services.allocator.core import AllocatedState, ClusterSnapshot, Policy
from tests.unit.allocator.test_batch import KINDS
from tests.unit.allocator.test_batch_again import batch


@pytest.mark.parametrize("policy", list(Policy), ids=lambda p: str(p).lower())
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_batch_on_a_generated_fleet_leaves_no_cyclic_garbage(kind: str, policy: Policy) -> None:
    cluster = generate(320, seed=7)
    claims_, options = KINDS[kind]
    classes = device_classes()
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    state = AllocatedState.build(snapshot, cluster.held)
    batch(snapshot, state, classes, claims_, 60, policy=policy, **options)  # lazy caches
    gc.collect()
    gc.disable()
    try:
        results, _ = batch(snapshot, state, classes, claims_, 60, policy=policy, **options)
        unreachable = gc.collect()
    finally:
        gc.enable()
    assert not isinstance(results, str), results
    assert unreachable == 0
