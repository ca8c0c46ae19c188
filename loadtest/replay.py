"""Placement quality: replay a seeded stream of jobs with arrivals and departures, per policy.

    rows = replay_policies(seeds=(1, 2, 3))

A MIG-heavy cluster (loadtest/clusters.py, 256 GPUs: every A100/H100 node in the DynamicMIG
layout, the L40S nodes plain; nothing allocated at the start) receives one job per step, drawn
from `MIX` (MIG slices by profile prefix, 1/2/4/8 whole GPUs), each running for an exponentially
distributed number of steps (mean `MEAN_DURATION`); a finished job releases its devices before
the next one arrives. A job that does not fit is rejected and dropped. Every policy sees the same
streams. Reported per policy: requests placed before the first rejection and the allocation
rate (placed / offered), each averaged over the seeds, and the median solve time.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.clusters import DRIVER, device_classes, generate
from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    Policy,
    SelectorCache,
    solve,
)
from services.common.dra.model import (
    AllocationResult,
    DeviceRequest,
    DeviceSelector,
    ExactDeviceRequest,
    ResourceClaim,
)

__all__ = ["MIX", "PolicyResult", "replay", "replay_policies"]

GPUS = 256
MEAN_DURATION = 700
REQUESTS = 1000
_ATTR = f"device.attributes['{DRIVER}']"


def _mig(prefix: str) -> ResourceClaim:
    selector = DeviceSelector(f"{_ATTR}.profile.startsWith('{prefix}')")
    request = DeviceRequest("mig", ExactDeviceRequest("mig.nvidia.com", (selector,)))
    return ResourceClaim("job", "replay", requests=(request,))


def _gpus(count: int) -> ResourceClaim:
    request = DeviceRequest("gpus", ExactDeviceRequest("gpu.nvidia.com", count=count))
    return ResourceClaim("job", "replay", requests=(request,))


# (weight, kind, claim): 85% MIG slices, 15% whole-GPU jobs.
MIX: tuple[tuple[float, str, ResourceClaim], ...] = (
    (0.40, "mig-1g", _mig("1g.")),
    (0.25, "mig-2g", _mig("2g.")),
    (0.20, "mig-3g", _mig("3g.")),
    (0.08, "gpus-1", _gpus(1)),
    (0.04, "gpus-2", _gpus(2)),
    (0.02, "gpus-4", _gpus(4)),
    (0.01, "gpus-8", _gpus(8)),
)


@dataclass(frozen=True)
class Job:
    kind: str
    claim: ResourceClaim
    duration: int


@dataclass(frozen=True)
class PolicyResult:
    policy: Policy
    first_rejection: tuple[int, ...]  # per seed: requests placed before it (all if none)
    allocation_rate: tuple[float, ...]
    solve_ms: float  # median over every solve of every seed

    @property
    def placed_before_rejection(self) -> float:
        return statistics.mean(self.first_rejection)


def stream(seed: int, requests: int = REQUESTS) -> list[Job]:
    rng = random.Random(seed)
    weights = [w for w, _, _ in MIX]
    jobs = []
    for _ in range(requests):
        _, kind, claim = rng.choices(MIX, weights)[0]
        jobs.append(Job(kind, claim, max(1, round(rng.expovariate(1 / MEAN_DURATION)))))
    return jobs


def replay(
    snapshot: ClusterSnapshot, jobs: Sequence[Job], policy: Policy
) -> tuple[int, float, list[float]]:
    """(requests placed before the first rejection, allocation rate, solve times)."""
    classes = device_classes()
    selectors = SelectorCache()
    state = AllocatedState(snapshot)
    running: list[tuple[int, str, tuple[AllocationResult, ...]]] = []
    first: int | None = None
    placed = 0
    times: list[float] = []
    for step, job in enumerate(jobs):
        still = []
        for end, owner, allocations in running:
            if end > step:
                still.append((end, owner, allocations))
                continue
            for allocation in allocations:
                state = state.without_allocation(allocation, owner)
        running = still
        started = time.perf_counter()
        result = solve(snapshot, state, classes, [job.claim], policy=policy, selectors=selectors)
        times.append(time.perf_counter() - started)
        if isinstance(result, Allocated):
            owner = f"replay/job-{step}"
            for allocation in result.allocations:
                state = state.with_allocation(allocation, owner)
            running.append((step + job.duration, owner, result.allocations))
            placed += 1
        elif first is None:
            first = placed
    return (placed if first is None else first), placed / len(jobs), times


def replay_policies(
    seeds: Sequence[int],
    policies: Sequence[Policy] = (Policy.FIRST_FIT, Policy.BINPACK, Policy.FRAGMENTATION_AWARE),
) -> list[PolicyResult]:
    cluster = generate(GPUS, seed=0, mig_every=1, partly_used=False)
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    streams = {seed: stream(seed) for seed in seeds}
    results = []
    for policy in policies:
        firsts, rates, times = [], [], []
        for seed in seeds:
            first, rate, solve_times = replay(snapshot, streams[seed], policy)
            firsts.append(first)
            rates.append(rate)
            times.extend(solve_times)
        results.append(
            PolicyResult(policy, tuple(firsts), tuple(rates), statistics.median(times) * 1000)
        )
    return results
