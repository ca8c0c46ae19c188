"""The placement quality replay (loadtest/replay.py): offered load, the bound, and that no policy
places more before its first rejection than the bound allows, on a real (small) cluster."""

from __future__ import annotations

import pytest

from loadtest.clusters import A100, L40S, generate
from loadtest.replay import LOADS, MIX, POLICIES, Job, Load, bound, offered_load, replay, stream
from services.allocator.core import ClusterSnapshot, Policy

KINDS = {k.name: k for k in MIX}


def jobs(*spec: tuple[str, int]) -> list[Job]:
    return [Job(KINDS[name], duration) for name, duration in spec]


@pytest.mark.parametrize(
    ("load", "low", "high"),
    [
        pytest.param(LOADS[0], 1.4, 1.5, id="saturated-is-about-146-percent"),
        pytest.param(LOADS[1], 0.88, 0.92, id="load90-is-about-90-percent"),
    ],
)
def test_offered_load(load: Load, low: float, high: float) -> None:
    assert low <= offered_load(load) <= high


@pytest.mark.parametrize(
    ("stream_", "mig_gpus", "plain_gpus", "expected"),
    [
        pytest.param(jobs(("mig-3g", 9), ("mig-3g", 9), ("mig-3g", 9)), 1, 0, 2, id="two-3g-a-gpu"),
        pytest.param(jobs(*[("mig-1g", 99)] * 8), 1, 0, 7, id="seven-1g-a-gpu"),
        pytest.param(jobs(("mig-3g", 99), *[("mig-1g", 99)] * 5), 1, 0, 5, id="3g-and-four-1g"),
        pytest.param(jobs(("gpus-1", 9), ("gpus-1", 9), ("gpus-1", 9)), 1, 1, 2, id="whole-gpus"),
        pytest.param(jobs(("gpus-1", 9), ("mig-1g", 9)), 1, 1, 2, id="plain-gpu-first"),
        pytest.param(jobs(("gpus-2", 9), ("mig-1g", 9)), 1, 1, 1, id="no-gpu-left-for-mig"),
        pytest.param(jobs(("gpus-1", 1), ("gpus-1", 1), ("gpus-1", 1)), 1, 0, 3, id="departures"),
    ],
)
def test_bound(stream_: list[Job], mig_gpus: int, plain_gpus: int, expected: int) -> None:
    assert bound(stream_, mig_gpus, plain_gpus) == expected


def test_streams_are_seeded() -> None:
    load = Load("tiny", 5, 50)
    assert stream(3, load) == stream(3, load)
    assert stream(3, load) != stream(4, load)


@pytest.mark.parametrize("policy", [pytest.param(p, id=str(p).lower()) for p in POLICIES])
def test_no_policy_beats_the_bound(policy: Policy) -> None:
    """Two nodes: an A100 node in the MIG layout and a plain L40S node; a stream that overfills
    them. Every policy places the same jobs up to its first rejection, so none passes the bound."""
    cluster = generate(16, mig_every=1, partly_used=False, mix=(A100, L40S))
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    replayed = stream(7, Load("tiny", 80, 80))
    limit = bound(replayed, 8, 8)
    first, rate, times = replay(snapshot, replayed, policy)
    assert 0 < first <= limit < len(replayed)
    assert 0 < rate < 1
    assert len(times) == len(replayed)
