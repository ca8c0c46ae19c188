"""Placement quality: replay seeded streams of jobs with arrivals and departures, per policy.

    results = replay_policies(seeds=(1, 2, 3))

A MIG-heavy cluster (loadtest/clusters.py, 256 GPUs: every A100/H100 node in the DynamicMIG
layout, the L40S nodes plain; nothing allocated at the start) receives one job per step, drawn
from `MIX` (MIG slices by profile prefix, 1/2/4/8 whole GPUs), each running for an exponentially
distributed number of steps; a finished job releases its devices before the next one arrives. A
job that does not fit is rejected and dropped. Every policy sees the same streams.

The offered load is the mean GPU demand of the running jobs over the cluster's GPUs: mean
duration x mean share per job (0.534 GPU: a MIG slice is its compute slices out of 7, a
whole-GPU job its GPUs) / 256. Two loads (`LOADS`), side by side:

- `saturated`: mean duration 700, 1,000 jobs, 146% of the cluster: it fills up and every policy
  is rejected soon after, for lack of capacity more than by fragmentation;
- `load90`: mean duration 430, 2,000 jobs, 90%: rejections come from bursts of demand (the
  number of running 8-GPU jobs alone swings between 1 and 11) and from fragmentation (free
  GPUs, but not where the job fits).

Up to its first rejection a policy holds exactly the jobs of the stream, so no policy can place
more before its first rejection than the jobs that arrive before the running ones outgrow the
cluster counted as fluid: whole GPUs, MIG compute slices (7 per GPU), memory slices (8) and 3g
slots (2) apart (`bound`; it ignores which node holds what, so it is optimistic).

Reported per load and policy: requests placed before the first rejection and the allocation
rate (placed / offered), per seed and averaged, and the median solve time.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from loadtest.clusters import DRIVER, GPUS_PER_NODE, device_classes, generate
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

__all__ = [
    "GPUS",
    "LOADS",
    "MIX",
    "POLICIES",
    "Job",
    "Kind",
    "Load",
    "PolicyResult",
    "bound",
    "offered_load",
    "replay",
    "replay_policies",
    "stream",
]

GPUS = 256
POLICIES = (Policy.FIRST_FIT, Policy.BINPACK, Policy.FRAGMENTATION_AWARE)
_ATTR = f"device.attributes['{DRIVER}']"
_MIG_SLICES = 7  # compute slices of an A100/H100
_MIG_MEMORY = 8  # memory slices


@dataclass(frozen=True)
class Kind:
    """One kind of job: its share of the stream, its claim and what it needs at least."""

    name: str
    weight: float
    claim: ResourceClaim
    gpus: int = 0  # whole GPUs on one node
    slices: int = 0  # MIG compute slices
    memory: int = 0  # MIG memory slices

    @property
    def share(self) -> Fraction:
        """Its share of a GPU (the offered load's unit)."""
        return Fraction(self.gpus) + Fraction(self.slices, _MIG_SLICES)


def _mig(prefix: str) -> ResourceClaim:
    selector = DeviceSelector(f"{_ATTR}.profile.startsWith('{prefix}')")
    request = DeviceRequest("mig", ExactDeviceRequest("mig.nvidia.com", (selector,)))
    return ResourceClaim("job", "replay", requests=(request,))


def _gpus(count: int) -> ResourceClaim:
    request = DeviceRequest("gpus", ExactDeviceRequest("gpu.nvidia.com", count=count))
    return ResourceClaim("job", "replay", requests=(request,))


# 85% MIG slices, 15% whole-GPU jobs.
MIX: tuple[Kind, ...] = (
    Kind("mig-1g", 0.40, _mig("1g."), slices=1, memory=1),
    Kind("mig-2g", 0.25, _mig("2g."), slices=2, memory=2),
    Kind("mig-3g", 0.20, _mig("3g."), slices=3, memory=4),
    Kind("gpus-1", 0.08, _gpus(1), gpus=1),
    Kind("gpus-2", 0.04, _gpus(2), gpus=2),
    Kind("gpus-4", 0.02, _gpus(4), gpus=4),
    Kind("gpus-8", 0.01, _gpus(8), gpus=8),
)


@dataclass(frozen=True)
class Load:
    name: str
    mean_duration: int  # steps
    requests: int


LOADS = (Load("saturated", 700, 1000), Load("load90", 430, 2000))


def offered_load(load: Load, mix: Sequence[Kind] = MIX, gpus: int = GPUS) -> float:
    """Mean GPU demand of the running jobs in steady state, over the cluster's GPUs."""
    total = sum(k.weight for k in mix)
    share = sum(k.weight * float(k.share) for k in mix) / total
    return load.mean_duration * share / gpus


@dataclass(frozen=True)
class Job:
    kind: Kind
    duration: int


@dataclass(frozen=True)
class PolicyResult:
    load: Load
    policy: Policy
    first_rejection: tuple[int, ...]  # per seed: requests placed before it (all if none)
    allocation_rate: tuple[float, ...]
    solve_ms: float  # median over every solve of every seed

    @property
    def placed_before_rejection(self) -> float:
        return statistics.mean(self.first_rejection)


def stream(seed: int, load: Load, mix: Sequence[Kind] = MIX) -> list[Job]:
    rng = random.Random(seed)
    weights = [k.weight for k in mix]
    jobs = []
    for _ in range(load.requests):
        kind = rng.choices(mix, weights)[0]
        jobs.append(Job(kind, max(1, round(rng.expovariate(1 / load.mean_duration)))))
    return jobs


def bound(jobs: Sequence[Job], mig_gpus: int, plain_gpus: int) -> int:
    """Requests any policy can place at most before its first rejection (module doc)."""
    running: list[tuple[int, Kind]] = []
    whole = slices = memory = thirds = 0
    for step, job in enumerate(jobs):
        still = []
        for end, kind in running:
            if end > step:
                still.append((end, kind))
                continue
            whole, slices, memory = whole - kind.gpus, slices - kind.slices, memory - kind.memory
            thirds -= kind.memory * 2 > _MIG_MEMORY
        running = still
        kind = job.kind
        whole, slices, memory = whole + kind.gpus, slices + kind.slices, memory + kind.memory
        thirds += kind.memory * 2 > _MIG_MEMORY
        for_mig = max(
            math.ceil(slices / _MIG_SLICES), math.ceil(memory / _MIG_MEMORY), math.ceil(thirds / 2)
        )
        if whole > mig_gpus + plain_gpus or for_mig > mig_gpus - max(0, whole - plain_gpus):
            return step
        running.append((step + job.duration, kind))
    return len(jobs)


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
        claim = job.kind.claim
        started = time.perf_counter()
        result = solve(snapshot, state, classes, [claim], policy=policy, selectors=selectors)
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


@dataclass(frozen=True)
class Replayed:
    """Every load's results per policy, and the bound per load and seed."""

    results: tuple[PolicyResult, ...]
    bounds: dict[str, tuple[int, ...]]  # load name -> per seed


def replay_policies(
    seeds: Sequence[int],
    policies: Sequence[Policy] = POLICIES,
    loads: Sequence[Load] = LOADS,
) -> Replayed:
    cluster = generate(GPUS, seed=0, mig_every=1, partly_used=False)
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    mig_gpus = len(cluster.mig_nodes) * GPUS_PER_NODE
    results, bounds = [], {}
    for load in loads:
        streams = {seed: stream(seed, load) for seed in seeds}
        bounds[load.name] = tuple(
            bound(streams[s], mig_gpus, cluster.gpus - mig_gpus) for s in seeds
        )
        for policy in policies:
            firsts, rates, times = [], [], []
            for seed in seeds:
                first, rate, solve_times = replay(snapshot, streams[seed], policy)
                firsts.append(first)
                rates.append(rate)
                times.extend(solve_times)
            median = statistics.median(times) * 1000
            results.append(PolicyResult(load, policy, tuple(firsts), tuple(rates), median))
    return Replayed(tuple(results), bounds)
