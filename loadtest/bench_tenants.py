"""Fair sharing benchmark: three tenants with bursty demand on one MIG-heavy fleet, three ways.

    python -m loadtest.bench tenants [--quick] [--json]

The fleet: H100 and A100 nodes, every GPU in the DynamicMIG layout (loadtest/clusters.py), so
whole GPUs and MIG slices compete for the same counters. The quota resource is `gpus`, in GPU
shares (`gpuShare`: a whole GPU 1, a MIG slice the memory slices it takes over its GPU's, a 1g
1/8, a 3g 1/2), the one unit that counts the same on H100 and A100. Three
tenants submit through three paths, as the bridges do: `hpc` like the Slurm bridge (Allocate
with reserve, then Commit), `ml` like the Kueue sidecar (Allocate to place, then Reserve the
placement), `lab` directly (Allocate with reserve). Each alternates busy and idle periods
(seeded; while busy it offers about 70% of the fleet, so bursts of two or three tenants overlap
and exceed it; the full run repeats everything at 40% and 55%, rows `mode@0.40`, because how much
borrowing gains over static depends on the offered load: at 70% every tenant's backlog keeps its
static third full long after its burst, so static already wastes little but fragmentation);
jobs are replay.MIX (85% MIG slices, 15% 1-8 whole GPUs), queue per tenant, and a job that does
not fit waits in its tenant's queue while the next ones (up to 32 a minute) are tried, as
Kueue's BestEffortFIFO does.

The same streams run three ways, through the real AllocatorService (embedded store and quota
ledger, the production code path):

- `static`: the fleet's nodes split into thirds, one per tenant (a node selector per tenant: what
  sites do today with Slurm partitions or dedicated node pools);
- `borrowing`: one cohort, a nominal third of the fleet's GPUs each, unused quota lent;
- `preemption`: the same, and a tenant within its nominal quota reclaims what others borrowed
  (Allocate(preempt)); a preempted job goes back to the head of its tenant's queue and runs
  its remaining time again. Every job's priority class is movable, so when no reclaim makes
  room the slices in the way move to equivalent devices elsewhere (consolidation,
  docs/tenancy.md): a moved job goes on on its replacement (checkpointed jobs; counted as
  moves, not preemptions).
- `fair-sharing`: the same with the policy's fair sharing on (Kueue's default strategies,
  every weight 1): a tenant may also preempt while it borrows, from a tenant whose share of
  what the cohort lends stays at least its own (docs/tenancy.md, "Fair sharing").

A step is one minute of simulated time. Reported per mode: fleet utilization (mean share of the
fleet's GPUs held), jobs placed, each tenant's share of the GPU-hours it asked for within
its nominal (`nominal_served`: over the minutes in which its demand reached its nominal, the
mean of min(used, nominal) / nominal; `min_within_served`, the worst tenant and seed, the same
over what it may claim: what it holds plus the queued jobs that fit within nominal, since a
job that would take it over nominal may only borrow), preemptions per hour, and the service
time of each reclaiming Allocate (p50, p99). Targets (issue 16): borrowing and preemption
raise utilization by >= 20% over static; with preemption every tenant gets >= 95% of its
nominal whenever it asks for it; reclaim p99 <= 1 s.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from loadtest.clusters import A100, GPUS_PER_NODE, H100, device_classes, generate
from loadtest.replay import MIX, Kind
from loadtest.report import BenchReport, Target, percentile
from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.adapters.store.memory_quota import MemoryQuotaLedger
from services.allocator.app.cluster_view import ClusterView
from services.allocator.app.inventory_feed import InventoryUpdate
from services.allocator.app.live_reservations import Holdings
from services.allocator.app.messages import LeaseOptions, Outcome, Query
from services.allocator.app.placing import PlacementSearch
from services.allocator.app.quotas import QuotaExceeded, QuotaGuard
from services.allocator.app.service import AllocatorService, ServiceLimits
from services.allocator.core import ClusterSnapshot, Policy, SelectorCache
from services.common.dra.model import (
    Node,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceSlice,
)
from services.common.quota.model import (
    FairSharing,
    PriorityClass,
    QuotaLimits,
    QuotaModel,
    QuotaResource,
    TenantQuota,
)

TENANTS = ("hpc", "ml", "lab")
PATHS = {"hpc": "slurm-like", "ml": "kueue-like", "lab": "direct"}
MODES = ("static", "borrowing", "preemption", "fair-sharing")
PREEMPTING = ("preemption", "fair-sharing")
PARTITION_LABEL = "bench.gpualloc.dev/partition"
BACKFILL = 32  # queued jobs tried per tenant and minute
MAIN_LOAD = 0.7  # a busy tenant's offered load, of the fleet: the rows without a suffix
LOADS = (0.4, 0.55, MAIN_LOAD)  # the full run's sweep; rows "mode@0.40" ...
GPUS = QuotaResource("gpus", ("gpu.nvidia.com", "mig.nvidia.com"), gpu_share=True)
MOVABLE = PriorityClass("", 0, movable=True)  # every job may be moved (checkpointed jobs)


@dataclass(frozen=True)
class Job:
    tenant: str
    arrives: int
    kind: Kind
    duration: int


@dataclass
class Running:
    job: Job
    ends: int
    reservation_id: str
    owner: str
    gpus: int  # milli-GPUs (GPU shares)


@dataclass
class ModeResult:
    mode: str
    utilization: float
    placed: int
    preemptions: int
    reclaim_seconds: list[float]
    nominal_served: dict[str, float]
    within_served: dict[str, float]  # the same, of what its queued jobs within nominal ask
    used_share: dict[str, float]  # of the fleet's GPU-minutes
    allocate_seconds: list[float] = field(default_factory=list)
    moves: int = 0  # consolidation: jobs moved to an equivalent device
    # of nominal_served's shortfall, per tenant: the part no queued job could fill within
    # nominal (every queued job larger than the gap: only borrowing serves it), and the rest
    lumps: dict[str, float] = field(default_factory=dict)
    unserved: dict[str, float] = field(default_factory=dict)
    demand_bound: float = 0.0  # mean over minutes of min(held + queued, fleet) / fleet


def streams(
    seed: int, steps: int, mean_duration: int, fleet_gpus: int, busy_load: float = MAIN_LOAD
) -> list[Job]:
    """Per tenant, busy and idle periods (each 40-160 minutes) and jobs from replay.MIX; while
    busy, arrivals such that its running jobs would hold `busy_load` of the fleet's GPUs."""
    rng = random.Random(seed)
    weights = [k.weight for k in MIX]
    jobs: list[Job] = []
    mean_share = sum(k.weight * float(k.share) for k in MIX) / sum(weights)
    for index, tenant in enumerate(TENANTS):
        step, busy = 0, index % 2 == 0
        while step < steps:
            period = rng.randint(40, 160)
            if busy:
                rate = busy_load * fleet_gpus / (mean_duration * mean_share)
                for minute in range(step, min(steps, step + period)):
                    for _ in range(_poisson(rng, rate)):
                        kind = rng.choices(MIX, weights)[0]
                        duration = max(1, round(rng.expovariate(1 / mean_duration)))
                        jobs.append(Job(tenant, minute, kind, duration))
            step += period
            busy = not busy
    jobs.sort(key=lambda j: (j.arrives, TENANTS.index(j.tenant)))
    return jobs


def _poisson(rng: random.Random, rate: float) -> int:
    count, total = 0, rng.expovariate(1.0)
    while total < rate:
        count += 1
        total += rng.expovariate(1.0)
    return count


def fleet(gpus: int) -> tuple[list[ResourceSlice], list[Node]]:
    cluster = generate(gpus, seed=0, mig_every=1, partly_used=False, mix=(H100, A100))
    nodes = [
        replace(n, labels={**n.labels, PARTITION_LABEL: TENANTS[i % len(TENANTS)]})
        for i, n in enumerate(cluster.nodes)
    ]
    return list(cluster.slices), nodes


def simulate(
    mode: str,
    jobs: Sequence[Job],
    slices: Sequence[ResourceSlice],
    nodes: Sequence[Node],
    steps: int,
) -> ModeResult:
    view = ClusterView(min_interval=0.0)
    by_node: dict[str, list[ResourceSlice]] = {}
    for s in slices:
        by_node.setdefault(s.node_name or "", []).append(s)
    view.apply(
        InventoryUpdate(
            1, True, {k: tuple(v) for k, v in by_node.items()}, {n.name: n for n in nodes}
        )
    )
    view.flush()
    snapshot = view.require(0).snapshot
    total = _fleet_gpus(snapshot)  # milli-GPUs
    store = MemoryReservationStore()
    holdings = Holdings(store, expire_interval=3600)
    holdings.start()
    selectors = SelectorCache()
    classes = device_classes()
    if mode == "static":  # counted (same ledger work), never limiting: the nodes are
        everything = QuotaLimits(total)
        model = QuotaModel((GPUS,), {t: TenantQuota(t, "", {"gpus": everything}) for t in TENANTS})
    else:
        nominal = total // len(TENANTS)
        model = QuotaModel(
            (GPUS,),
            {t: TenantQuota(t, "fleet", {"gpus": QuotaLimits(nominal)}) for t in TENANTS},
            default_priority=MOVABLE,
            fair_sharing=FairSharing(enabled=mode == "fair-sharing"),
        )
    guard = QuotaGuard(lambda: model, MemoryQuotaLedger(), lambda: classes, selectors)
    service = AllocatorService(
        view,
        holdings,
        store,
        PlacementSearch(selectors, policy=Policy.FRAGMENTATION_AWARE),
        classes,
        limits=ServiceLimits(lease_seconds=86_400, max_lease_seconds=86_400),
        quotas=guard,
    )
    try:
        return _run(mode, service, jobs, steps, total, model)
    finally:
        holdings.close()
        view.close()


def _run(
    mode: str,
    service: AllocatorService,
    jobs: Sequence[Job],
    steps: int,
    total: int,
    model: QuotaModel,
) -> ModeResult:
    queues: dict[str, deque[Job]] = {t: deque() for t in TENANTS}
    running: dict[str, Running] = {}
    arrivals = deque(jobs)
    used_minutes = {t: 0 for t in TENANTS}
    served: dict[str, list[float]] = {t: [] for t in TENANTS}
    within: dict[str, list[float]] = {t: [] for t in TENANTS}
    lumps: dict[str, list[float]] = {t: [] for t in TENANTS}
    unserved: dict[str, list[float]] = {t: [] for t in TENANTS}
    bound = 0.0
    nominal = total // len(TENANTS)
    result = ModeResult(mode, 0.0, 0, 0, [], {}, {}, {})
    held_total = 0
    serial = 0
    gpus_of: dict[str, int] = {}  # a kind's GPU share as first placed (for queued demand)
    for step in range(steps):
        for rid, entry in list(running.items()):
            if entry.ends <= step:
                service.release(rid, entry.owner)
                del running[rid]
        while arrivals and arrivals[0].arrives <= step:
            job = arrivals.popleft()
            queues[job.tenant].append(job)
        for tenant in TENANTS:
            queue = queues[tenant]
            tried = 0
            for job in list(queue)[:BACKFILL]:  # best-effort FIFO: a blocked head waits,
                tried += 1  # the jobs behind it may go first (Kueue's BestEffortFIFO)
                serial += 1
                owner = f"{tenant}/{PATHS[tenant]}/job-{serial}"
                placed = _place(mode, service, tenant, owner, job, serial)
                result.allocate_seconds.append(placed.seconds)
                if placed.reservation_id is None:
                    continue
                queue.remove(job)
                result.placed += 1
                usage = service.reservation_usage(
                    service.holdings.get(placed.reservation_id)
                    or service.get(placed.reservation_id)
                )
                gpus = usage.get("gpus", 0)
                gpus_of.setdefault(job.kind.name, gpus)
                running[placed.reservation_id] = Running(
                    job, step + job.duration, placed.reservation_id, owner, gpus
                )
                if placed.victims:
                    result.reclaim_seconds.append(placed.seconds)
                for victim, replacement in placed.victims:
                    gone = running.pop(victim, None)
                    if gone is None:
                        continue
                    if replacement:  # moved: the job goes on on its replacement
                        result.moves += 1
                        if PATHS[gone.job.tenant] == "slurm-like":  # adopted, as it was
                            service.commit(replacement, gone.owner)
                        running[replacement] = replace(gone, reservation_id=replacement)
                        continue
                    result.preemptions += 1
                    left = max(1, gone.ends - step)
                    queues[gone.job.tenant].appendleft(replace(gone.job, duration=left))
        held = {t: 0 for t in TENANTS}
        for entry in running.values():
            held[entry.job.tenant] += entry.gpus
        held_total += sum(held.values())
        demands = 0
        for tenant in TENANTS:
            used_minutes[tenant] += held[tenant]
            demand = held[tenant] + sum(gpus_of.get(j.kind.name, 0) for j in queues[tenant])
            demands += demand
            if demand >= nominal:
                served[tenant].append(min(held[tenant], nominal) / nominal)
                asked = _within_nominal(held[tenant], queues[tenant], gpus_of, nominal)
                within[tenant].append(min(held[tenant], asked) / asked if asked else 1.0)
                lumps[tenant].append((nominal - asked) / nominal)
                unserved[tenant].append((asked - min(held[tenant], asked)) / nominal)
        bound += min(demands, total) / total
    result.utilization = held_total / (total * steps)
    result.nominal_served = {t: statistics.mean(v) if v else 1.0 for t, v in served.items()}
    result.within_served = {t: statistics.mean(v) if v else 1.0 for t, v in within.items()}
    result.used_share = {t: used_minutes[t] / (total * steps) for t in TENANTS}
    result.lumps = {t: statistics.mean(v) if v else 0.0 for t, v in lumps.items()}
    result.unserved = {t: statistics.mean(v) if v else 0.0 for t, v in unserved.items()}
    result.demand_bound = bound / steps
    return result


def _within_nominal(held: int, queue: deque[Job], gpus_of: dict[str, int], nominal: int) -> int:
    """What the tenant may claim of its nominal now: what it holds plus the queued jobs, in
    queue order, that still fit within nominal (a job that would take it over nominal is not
    the quota's promise: it may only borrow)."""
    asked = held
    for job in queue:
        amount = gpus_of.get(job.kind.name, 0)
        if asked + amount <= nominal:
            asked += amount
    return min(asked, nominal)


@dataclass(frozen=True)
class _Placed:
    reservation_id: str | None
    victims: tuple[tuple[str, str], ...]  # (revoked, its replacement when it was moved)
    seconds: float


def _place(
    mode: str, service: AllocatorService, tenant: str, owner: str, job: Job, serial: int
) -> _Placed:
    selector = None
    if mode == "static":
        requirement = NodeSelectorRequirement(PARTITION_LABEL, "In", (tenant,))
        selector = NodeSelector((NodeSelectorTerm((requirement,)),))
    query = Query((job.kind.claim,), node_selector=selector)
    lease = LeaseOptions(owner, preempt=mode in PREEMPTING)
    started = time.perf_counter()
    if PATHS[tenant] == "kueue-like":  # place, then reserve the placement
        answer = service.allocate(query)
        if answer.outcome is Outcome.ALLOCATED:
            claims = [(f"replay/job-{serial}", a) for a in answer.allocations]
            try:
                reserved = service.reserve(answer.node or "", claims, lease)
                return _Placed(reserved[0].id, (), time.perf_counter() - started)
            except QuotaExceeded:  # RESOURCE_EXHAUSTED: preempt, or wait at the queue head
                pass
        if mode not in PREEMPTING:
            return _Placed(None, (), time.perf_counter() - started)
    answer = service.allocate(query, lease)
    seconds = time.perf_counter() - started
    if answer.outcome is not Outcome.ALLOCATED:
        return _Placed(None, (), seconds)
    reservation = answer.reservations[0]
    if PATHS[tenant] == "slurm-like":
        service.commit(reservation.id, owner)
    victims = tuple((v.holder.reservation_id, v.replacement_id) for v in answer.preemption)
    return _Placed(reservation.id, victims, seconds)


def _fleet_gpus(snapshot: ClusterSnapshot) -> int:
    """The fleet's GPUs in milli-GPUs (the quota's unit): one counter set per GPU."""
    sets = {
        (c.driver, c.pool, c.counter_set)
        for e in snapshot.all_devices()
        for c in e.slice.counter_totals
    }
    return 1000 * len(sets)


def run(quick: bool) -> BenchReport:
    gpus = 48 if quick else 96
    steps = 240 if quick else 480
    mean_duration = 30 if quick else 45
    seeds = (1,) if quick else (1, 2)
    loads = (MAIN_LOAD,) if quick else LOADS
    slices, nodes = fleet(gpus)
    report = BenchReport(
        "tenants",
        setup={
            "fleet": f"{gpus} GPUs ({gpus // GPUS_PER_NODE} nodes, H100 and A100, DynamicMIG)",
            "tenants": ", ".join(f"{t} ({PATHS[t]})" for t in TENANTS),
            "minutes": steps,
            "mean job minutes": mean_duration,
            "seeds": " ".join(str(s) for s in seeds),
            "busy load": " ".join(f"{load:.2f}" for load in loads),
            "python": sys.version.split()[0],
        },
    )
    for load in loads:
        results: dict[str, list[ModeResult]] = {m: [] for m in MODES}
        for seed in seeds:
            jobs = streams(seed, steps, mean_duration, gpus, load)
            for mode in MODES:
                results[mode].append(simulate(mode, jobs, slices, nodes, steps))
        _add_rows(report, results, steps, "" if load == MAIN_LOAD else f"@{load:.2f}")
    return report


def _add_rows(
    report: BenchReport, results: dict[str, list[ModeResult]], steps: int, suffix: str
) -> None:
    """One row per mode (named mode + suffix) and the issue's targets on them."""
    static = statistics.mean(r.utilization for r in results["static"])
    for mode in MODES:
        runs = results[mode]
        utilization = statistics.mean(r.utilization for r in runs)
        reclaim = [s for r in runs for s in r.reclaim_seconds]
        hours = steps / 60 * len(runs)
        values: dict[str, float | int | str] = {
            "utilization": round(utilization, 3),
            "vs_static": round(utilization / static, 3) if static else 0.0,
            "jobs_placed": round(statistics.mean(r.placed for r in runs)),
            "preemptions_per_hour": round(sum(r.preemptions for r in runs) / hours, 1),
            "moves_per_hour": round(sum(r.moves for r in runs) / hours, 1),
            "allocate_p50_ms": round(
                statistics.median([s for r in runs for s in r.allocate_seconds]) * 1000, 2
            ),
        }
        for tenant in TENANTS:
            values[f"{tenant}_nominal_served"] = round(
                min(r.nominal_served[tenant] for r in runs), 3
            )
            values[f"{tenant}_share"] = round(
                statistics.mean(r.used_share[tenant] for r in runs), 3
            )
        values["min_nominal_served"] = min(float(values[f"{t}_nominal_served"]) for t in TENANTS)
        worst = min(
            ((r, t) for r in runs for t in TENANTS), key=lambda p: p[0].nominal_served[p[1]]
        )
        values["worst_lumps"] = round(worst[0].lumps[worst[1]], 3)  # no queued job fits the gap
        values["worst_unserved"] = round(worst[0].unserved[worst[1]], 3)  # a job fit: not served
        values["demand_bound"] = round(statistics.mean(r.demand_bound for r in runs), 3)
        values["min_within_served"] = round(
            min(r.within_served[t] for r in runs for t in TENANTS), 3
        )
        if reclaim:
            values["reclaim_p50_ms"] = round(statistics.median(reclaim) * 1000, 1)
            values["reclaim_p99_ms"] = round(percentile(reclaim, 0.99) * 1000, 1)
        report.add(mode + suffix, **values)
    report.targets += [
        Target("borrowing" + suffix, "vs_static", 1.2, at_least=True),
        Target("preemption" + suffix, "vs_static", 1.2, at_least=True),
        Target("preemption" + suffix, "min_nominal_served", 0.95, at_least=True),
        Target("preemption" + suffix, "min_within_served", 0.95, at_least=True),
        Target("preemption" + suffix, "reclaim_p99_ms", 1000.0),
        Target("fair-sharing" + suffix, "vs_static", 1.2, at_least=True),
        Target("fair-sharing" + suffix, "min_nominal_served", 0.95, at_least=True),
        Target("fair-sharing" + suffix, "min_within_served", 0.95, at_least=True),
        Target("fair-sharing" + suffix, "reclaim_p99_ms", 1000.0),
    ]
