"""Solver benchmark: allocation speed on generated clusters of 1,000 / 10,000 / 100,000 GPUs.

    python -m loadtest.bench solver [--quick] [--json] [--rows REGEX]

`--rows` runs only the rows whose name (`<gpus>/<kind>`, `<gpus>/gang-4x8`,
`<gpus>/<kind>/vs-upstream`) matches the regular expression, and only the sizes that have one:
`--rows '^100000/mig'` is the MIG kind at 100,000 GPUs alone (its setup row comes with it).

Clusters come from loadtest/clusters.py (8-GPU nodes: H100 NVSwitch, A100 NVLink pairs, L40S
PCIe; one A100/H100 node in ten MIG-partitioned; a third of the plain nodes partly allocated).
Quick runs 1,000 and 10,000 GPUs with fewer solves and Explain/Capacity repetitions.

Per request kind, on its own copy of the cluster state, a stream of solves without a pinned node
(the solver chooses the node, BINPACK): each placement is committed into the state as a service
would after Reserve, and the oldest is released once 20 are held, so the cluster stays partly
full and the node groups change under the solver. Measured per kind:

- unpinned median / p99 solve time (the first solve, which builds the snapshot's templates and
  the state's node groups, is reported apart as `first_ms`); see "How it times" below;
- pinned median / p99: the same claims, pinned to the node the unpinned solve chose, same state;
- Explain time (unpinned, reason recording on: every node is explained, one search per node
  group, core/replay.py), on the initial state; `explain_again_ms`: one more Explain of the same
  question on the same state, which reads the searches the first one kept (median of
  `REPEATS`, each with a fresh selector cache as the first);
- Capacity time: the service's Capacity count (`services/allocator/app/capacity_count.py`, the
  core's `count_units`: how many more copies of the claims fit, per node, on every node), on the
  initial state;
- a batch of 64 identical items (`solve_many`, each on the state holding the ones before it) on
  the initial state: `batch_ms` and the claims it placed per second (`batch_claims_s`) of the
  first, and `batch_gcs`, the collections that landed in it; `batch_again_ms`, the median of
  `REPEATS` more (each with a fresh selector cache);
- CEL evaluations of a cold Explain (fresh selector cache, every device looked at) against the
  bound: the number of distinct device profiles the kind's selectors read;
- memory: the peak traced allocation of one solve (tracemalloc, after the timed runs), and the
  process's resident set after building each cluster;
- a 4-node x 8-GPU gang in one NVLink domain (`solve_gang`, grouped by the clique label);
- beside Kubernetes' own structured allocator on the same files (loadtest/upstream_allocator.py:
  `<gpus>/<kind>/vs-upstream` rows, pinned and fleet-wide, with the ratios).

How it times (so that a before/after comparison measures the solver, not the collector or
the machine's other work):

- The timed parts of a size run under the allocator server's own garbage-collector policy
  (services/common/gc_policy.py `GcPolicy`, started as services/allocator/__main__.py starts
  it: young collections after 20,000 new container objects instead of CPython's 700, the
  survivors frozen every second), so the bench times what the server runs, collector pauses
  included.
- Every timed column (not the setup row's seconds, not the vs-upstream rows) is the bench
  thread's CPU time (`time.thread_time`), not wall time. The bench is one thread doing CPU
  work, so the two differ by the time the OS gave other processes: on a shared machine,
  scheduler slices of several ms in the p99 columns. The collector runs in this thread, so its
  pauses count. A read costs ~0.28 us against perf_counter's ~0.07 (timeit, 20:12 UTC).
- The stream is 300 solves per kind (quick; 1,000 otherwise), the gang's too (was 60 / 20).
- The p99 columns (`p99_ms`, `pinned_p99_ms`, the gang's `p99_ms`) are of every solve, as a
  caller sees them, collector pauses included: the targets are read from them. Beside each,
  `p99_no_gc_ms` / `pinned_p99_no_gc_ms` are the p99 of the solves no collection landed in
  (gc.callbacks counts them): the solver's own tail, for before/after comparisons. The
  solves a collection landed in are counted, `gc_solves` (unpinned and pinned), with their
  median time `gc_solve_ms`. Under the server's policy a young collection is rare and large
  (at 10,000 GPUs it costs the gang solve it lands in ~10 ms of CPU and comes every 40-50 gang
  solves), so its share of the solves sits near 1% and decides the full p99 by whether 3 or 4
  landed in a run (the same commit read 0.26 or 0.52 ms): compare the `no_gc` columns, and
  check the targets on the full ones.
- `explain_again_ms` and `batch_again_ms` are medians of `REPEATS` runs; `batch_ms` is the
  first batch (it works out what later batches of the question read).

Compare before/after only with one method: run this module against the other checkout's code
(e.g. copy it into a throwaway worktree of that commit), alternating, under the bench lock.

The placement quality replay (loadtest/replay.py) is its own suite: loadtest/bench_quality.py.

Targets (docs/performance.md): pinned median <= 5 ms and unpinned median <= 2 ms, p99 <= 20 ms at
10,000 GPUs for single-node kinds (the p99 of every solve, collector pauses included); CEL
evaluations <= distinct profiles read; the unpinned median grows at most 3x from 1,000 to
100,000 GPUs.
"""

from __future__ import annotations

import gc
import re
import statistics
import sys
import time
import tracemalloc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from loadtest.clusters import CLIQUE_LABEL, DRIVER, GeneratedCluster, device_classes, generate
from loadtest.report import BenchReport, Target, percentile
from loadtest.upstream_allocator import COMPARED_KINDS
from loadtest.upstream_allocator import compare as compare_upstream
from services.allocator.core import (
    Allocated,
    AllocatedState,
    ClusterSnapshot,
    SelectorCache,
    node_templates,
    solve,
    solve_gang,
    solve_many,
)
from services.common.dra.model import (
    AllocationResult,
    DeviceClass,
    DeviceRequest,
    DeviceSelector,
    DeviceSubRequest,
    ExactDeviceRequest,
    ResourceClaim,
)
from services.common.gc_policy import GcPolicy

__all__ = ["KINDS", "Collections", "Kind", "Timed", "run", "server_gc"]

SINGLE_NODE_LIMITS = {"pinned_median_ms": 5.0, "median_ms": 2.0, "p99_ms": 20.0}
HELD_WINDOW = 20  # placements kept before the oldest is released
_now = time.thread_time  # what the timed columns read: this thread's CPU time (module docstring)
REPEATS = 5  # runs of explain_again and of the batch (their median)


@dataclass(frozen=True)
class Kind:
    name: str
    claims: tuple[ResourceClaim, ...]
    solve_options: dict[str, Any] = field(default_factory=dict)
    single_node: bool = True


def _claim(name: str, *requests: DeviceRequest) -> ResourceClaim:
    return ResourceClaim(name, "bench", requests=requests)


def _exact(name: str, count: int = 1, cel: str | None = None) -> DeviceRequest:
    selectors = (DeviceSelector(cel),) if cel else ()
    return DeviceRequest(name, ExactDeviceRequest("gpu.nvidia.com", selectors, count=count))


def _sub(name: str, device_class: str, cel: str) -> DeviceSubRequest:
    return DeviceSubRequest(name, device_class, (DeviceSelector(cel),))


_ATTR = f"device.attributes['{DRIVER}']"
_CAP = f"device.capacity['{DRIVER}']"
ONE_GPU_CEL = (
    f"{_ATTR}.productName == 'NVIDIA H100 80GB HBM3' && 'memory' in {_CAP} && "
    f"{_CAP}.memory.compareTo(quantity('40Gi')) >= 0"
)


def _kinds() -> tuple[Kind, ...]:
    mig = DeviceRequest(
        "mig",
        first_available=(
            _sub("small", "mig.nvidia.com", f"{_ATTR}.profile.startsWith('1g.')"),
            _sub("medium", "mig.nvidia.com", f"{_ATTR}.profile.startsWith('2g.')"),
            _sub("large", "mig.nvidia.com", f"{_ATTR}.profile.startsWith('3g.')"),
            _sub("whole", "gpu.nvidia.com", "true"),
        ),
    )
    return (
        Kind("one-gpu-cel", (_claim("one-gpu", _exact("gpu", cel=ONE_GPU_CEL)),)),
        Kind("four-nvlink", (_claim("four", _exact("gpus", 4)),), four_nvlink_options()),
        Kind("eight-gpus", (_claim("eight", _exact("gpus", 8)),)),
        Kind("mig-1g-fallback", (_claim("mig", mig),)),
    )


def four_nvlink_options() -> dict[str, Any]:
    """Four GPUs, all pairwise NVLink-connected (a topology constraint, when available)."""
    try:
        from services.allocator.core import TopologyConstraint, TopologyKind
    except ImportError:
        return {}
    return {"topology_constraints": (TopologyConstraint(TopologyKind.NVLINK_CONNECTED),)}


KINDS = _kinds()
GANG_KIND = "gang-4x8"


def run(quick: bool, rows: str | None = None) -> BenchReport:
    sizes: tuple[int, ...] = (1_000, 10_000) if quick else (1_000, 10_000, 100_000)
    wanted = _Rows(rows)
    sizes = tuple(s for s in sizes if wanted.size(s))
    solves = 300 if quick else 1_000  # per kind, and the gang's (module docstring)
    report = BenchReport(
        "solver",
        setup={
            "sizes": ",".join(str(s) for s in sizes),
            "solves_per_kind": solves,
            "repeats": REPEATS,
            "gc": "server policy (GcPolicy)",
            "policy": "BinPack",
            "python": sys.version.split()[0],
            **({"rows": rows} if rows else {}),
        },
    )
    medians: dict[tuple[int, str], float] = {}
    for gpus in sizes:
        _run_size(report, gpus, solves, quick, medians, wanted)
    for kind in KINDS:
        if kind.single_node and (10_000, kind.name) in medians:
            row = f"10000/{kind.name}"
            for metric, limit in SINGLE_NODE_LIMITS.items():
                report.targets.append(Target(row, metric, limit))
            report.targets.append(Target(row, "cel_excess", 0))
        first, last = (sizes[0], kind.name), (sizes[-1], kind.name)
        if len(sizes) == 3 and first in medians and last in medians:
            ratio = medians[last] / max(medians[first], 1e-6)
            report.add(f"growth/{kind.name}", median_ratio=round(ratio, 2))
            report.targets.append(Target(f"growth/{kind.name}", "median_ratio", 3.0))
    return report


def _run_size(
    report: BenchReport,
    gpus: int,
    solves: int,
    quick: bool,
    medians: dict[tuple[int, str], float],
    wanted: _Rows,
) -> None:
    gc.collect()
    rss_before = _rss_mib()
    started = time.perf_counter()
    cluster = generate(gpus, seed=gpus)
    generated = time.perf_counter()
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    built = time.perf_counter()
    state = AllocatedState.build(snapshot, cluster.held)
    node_templates(snapshot)
    state.node_groups(snapshot)
    indexed = time.perf_counter()
    gc.collect()
    report.add(
        f"{gpus}/setup",
        nodes=len(cluster.nodes),
        devices=cluster.device_count,
        generate_s=round(generated - started, 2),
        snapshot_s=round(built - generated, 2),
        groups_s=round(indexed - built, 2),
        templates=len(node_templates(snapshot).templates),
        groups=len(state.node_groups(snapshot).members),
        rss_mib=round(_rss_mib() - rss_before, 1),
    )
    with server_gc():
        _run_rows(report, gpus, solves, quick, medians, wanted, cluster, snapshot, state)


class Collections:
    """Counts the collector's runs (gc.callbacks) while in use, so a timed call can tell
    whether one landed in it."""

    def __init__(self) -> None:
        self.count = 0

    def _seen(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.count += 1

    def __enter__(self) -> Collections:
        gc.callbacks.append(self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._seen)


@dataclass
class Timed:
    """A stream's solve times, apart by whether a collection landed in the solve."""

    clean: list[float] = field(default_factory=list)
    collected: list[float] = field(default_factory=list)

    def add(self, seconds: float, collected: bool) -> None:
        (self.collected if collected else self.clean).append(seconds)

    def median_ms(self) -> float:
        every = self.clean + self.collected
        return _ms(statistics.median(every)) if every else 0.0

    def p99_ms(self) -> float:
        """The p99 of every solve, collector pauses included (what a caller sees)."""
        return _ms(percentile(self.clean + self.collected, 0.99))

    def p99_no_gc_ms(self) -> float:
        """The p99 of the solves no collection landed in: the solver's own tail."""
        return _ms(percentile(self.clean, 0.99))


@contextmanager
def server_gc() -> Iterator[None]:
    """The collector as the allocator server runs it (GcPolicy: what was built so far frozen,
    young collections after 20,000 new objects), so the bench times what the server runs
    (module docstring); CPython's settings again after."""
    policy = GcPolicy(name="bench-gc").start()
    try:
        yield
    finally:
        policy.stop()


def _run_rows(
    report: BenchReport,
    gpus: int,
    solves: int,
    quick: bool,
    medians: dict[tuple[int, str], float],
    wanted: _Rows,
    cluster: GeneratedCluster,
    snapshot: ClusterSnapshot,
    state: AllocatedState,
) -> None:
    classes = device_classes()
    for kind in KINDS:
        if not wanted.row(f"{gpus}/{kind.name}"):
            continue
        explains = 1 if gpus >= 100_000 or quick else 3
        values = _run_kind(kind, snapshot, state, classes, solves, explains)
        values.update(_cel_bound(kind, cluster, snapshot, state, classes))
        medians[(gpus, kind.name)] = float(values["median_ms"])
        report.add(f"{gpus}/{kind.name}", **values)
    if wanted.row(f"{gpus}/{GANG_KIND}"):
        gang = _run_gang(snapshot, state, classes, solves)
        report.add(f"{gpus}/{GANG_KIND}", **gang)
    compared = {
        k.name: k.claims
        for k in KINDS
        if k.name in COMPARED_KINDS and wanted.row(f"{gpus}/{k.name}/vs-upstream")
    }
    if compared:
        compare_upstream(report, gpus, cluster, snapshot, state, classes, compared, quick=quick)


class _Rows:
    """`--rows`: which rows run (None: all), and so which sizes."""

    def __init__(self, pattern: str | None) -> None:
        self.pattern = re.compile(pattern) if pattern else None

    def row(self, name: str) -> bool:
        return self.pattern is None or self.pattern.search(name) is not None

    def size(self, gpus: int) -> bool:
        names = [f"{gpus}/{k.name}" for k in KINDS] + [f"{gpus}/{GANG_KIND}"]
        names += [f"{gpus}/{k}/vs-upstream" for k in COMPARED_KINDS]
        return any(self.row(name) for name in names)


def _run_kind(
    kind: Kind,
    snapshot: ClusterSnapshot,
    initial: AllocatedState,
    classes: dict[str, DeviceClass],
    solves: int,
    explains: int,
) -> dict[str, float | int | str]:
    selectors = SelectorCache()
    state = initial
    held: list[tuple[str, AllocationResult]] = []
    unpinned, pinned = Timed(), Timed()
    updates: list[float] = []
    first_ms = 0.0
    unsatisfiable = 0
    steps = 0
    collections = Collections()
    with collections:  # counted around the timed calls, not inside them
        for round_ in range(solves + 1):
            claims = _named(kind.claims, round_)
            seen = collections.count
            started = _now()
            result = solve(
                snapshot, state, classes, claims, selectors=selectors, **kind.solve_options
            )
            elapsed = _now() - started
            if round_ == 0:
                first_ms = elapsed * 1000
            else:
                unpinned.add(elapsed, collections.count > seen)
            steps += result.stats.steps
            if not isinstance(result, Allocated):
                unsatisfiable += 1
                state, updates = _release_oldest(state, held, updates)
                continue
            seen = collections.count
            started = _now()
            solve(
                snapshot,
                state,
                classes,
                claims,
                selectors=selectors,
                node=result.node,
                **kind.solve_options,
            )
            pinned.add(_now() - started, collections.count > seen)
            started = _now()
            for claim, allocation in zip(claims, result.allocations, strict=True):
                owner = f"bench/{claim.name}"
                state = state.with_allocation(allocation, owner)
                held.append((owner, allocation))
            if len(held) > HELD_WINDOW * len(claims):
                state, updates = _release_oldest(state, held, updates, len(claims))
            updates.append(_now() - started)
    explain = _timed_explains(kind, snapshot, initial, classes, explains)
    explain_again = [  # each with a fresh selector cache, as the first
        _timed_explains(kind, snapshot, initial, classes, 1)[0] for _ in range(REPEATS)
    ]
    capacity_ms, capacity_total = _timed_capacity(kind, snapshot, initial, classes, explains)
    batch_ms, batch_gcs, batch_again_ms, batch_placed = _timed_batch(
        kind, snapshot, initial, classes
    )
    peak = _peak_kib(kind, snapshot, initial, classes)
    return {
        "median_ms": unpinned.median_ms(),
        "p99_ms": unpinned.p99_ms(),
        "p99_no_gc_ms": unpinned.p99_no_gc_ms(),
        "pinned_median_ms": pinned.median_ms(),
        "pinned_p99_ms": pinned.p99_ms(),
        "pinned_p99_no_gc_ms": pinned.p99_no_gc_ms(),
        **_collected(unpinned, pinned),
        "first_ms": round(first_ms, 1),
        "explain_ms": _ms(statistics.median(explain)),
        "explain_again_ms": _ms(statistics.median(explain_again)),
        "capacity_ms": capacity_ms,
        "capacity_total": capacity_total,
        "batch_ms": batch_ms,
        "batch_claims_s": round(batch_placed / (batch_ms / 1000)) if batch_ms else 0,
        "batch_gcs": batch_gcs,
        "batch_again_ms": batch_again_ms,
        "update_ms": _ms(statistics.median(updates)) if updates else 0.0,
        "steps": round(steps / (solves + 1), 1),
        "unsat": unsatisfiable,
        "peak_kib": peak,
    }


def _run_gang(
    snapshot: ClusterSnapshot, initial: AllocatedState, classes: dict[str, DeviceClass], solves: int
) -> dict[str, float | int | str]:
    """4 nodes x 8 GPUs in one NVLink domain (the clique label of the H100 racks), as a stream
    like the single-node kinds: each gang is committed, the oldest released after five."""
    selectors = SelectorCache()
    claim = _claim("gang", _exact("gpus", 8))
    state, held, unsatisfiable = initial, [], 0
    times, collections = Timed(), Collections()
    first_ms = 0.0
    with collections:  # counted around the timed calls, not inside them
        for round_ in range(solves + 1):
            seen = collections.count
            started = _now()
            result = solve_gang(
                snapshot,
                state,
                classes,
                [claim],
                node_count=4,
                group_by_label=CLIQUE_LABEL,
                selectors=selectors,
            )
            elapsed = _now() - started
            if round_ == 0:
                first_ms = elapsed * 1000
            else:
                times.add(elapsed, collections.count > seen)
            if not isinstance(result, Allocated):
                unsatisfiable += 1
                continue
            owners = []
            for member in result.placements:
                owner = f"bench/gang-{round_}@{member.node}"
                state = state.with_allocation(member.allocations[0], owner)
                owners.append((owner, member.allocations[0]))
            held.append(owners)
            if len(held) > 5:
                for owner, allocation in held.pop(0):
                    state = state.without_allocation(allocation, owner)
    return {
        "median_ms": times.median_ms(),
        "p99_ms": times.p99_ms(),
        "p99_no_gc_ms": times.p99_no_gc_ms(),
        **_collected(times),
        "first_ms": round(first_ms, 1),
        "unsat": unsatisfiable,
    }


def _collected(*streams: Timed) -> dict[str, float | int | str]:
    """How many of the streams' solves a collection landed in, and their median time."""
    hit = [t for stream in streams for t in stream.collected]
    return {"gc_solves": len(hit), "gc_solve_ms": _ms(statistics.median(hit)) if hit else 0.0}


def _named(claims: Sequence[ResourceClaim], round_: int) -> tuple[ResourceClaim, ...]:
    return tuple(
        ResourceClaim(
            f"{c.name}-{round_}", c.namespace, requests=c.requests, constraints=c.constraints
        )
        for c in claims
    )


def _release_oldest(
    state: AllocatedState,
    held: list[tuple[str, AllocationResult]],
    updates: list[float],
    count: int = 1,
) -> tuple[AllocatedState, list[float]]:
    for _ in range(min(count, len(held))):
        owner, allocation = held.pop(0)
        state = state.without_allocation(allocation, owner)
    return state, updates


def _timed_explains(
    kind: Kind,
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: dict[str, DeviceClass],
    repeat: int,
) -> list[float]:
    times = []
    selectors = SelectorCache()
    for _ in range(repeat):
        started = _now()
        solve(
            snapshot,
            state,
            classes,
            kind.claims,
            selectors=selectors,
            explain=True,
            **kind.solve_options,
        )
        times.append(_now() - started)
    return times


def _timed_capacity(
    kind: Kind,
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: dict[str, DeviceClass],
    repeat: int,
) -> tuple[float, int]:
    """(median ms, copies that fit) of the service's Capacity count for the kind's claims."""
    from services.allocator.app.capacity_count import count_capacity  # noqa: PLC0415
    from services.allocator.app.messages import Query  # noqa: PLC0415 (service layer, not core)
    from services.allocator.app.placing import Deadline, PlacementSearch  # noqa: PLC0415

    solver = PlacementSearch(SelectorCache())
    query = Query(
        claims=tuple(kind.claims),
        topology_constraints=tuple(kind.solve_options.get("topology_constraints", ())),
    )
    times, total = [], 0
    for _ in range(repeat):
        started = _now()
        answer = count_capacity(
            solver, snapshot, state, classes, query, Deadline(None), generation=0
        )
        times.append(_now() - started)
        total = answer.total
    return _ms(statistics.median(times)), total


BATCH = 64


def _timed_batch(
    kind: Kind, snapshot: ClusterSnapshot, state: AllocatedState, classes: dict[str, DeviceClass]
) -> tuple[float, int, float, int]:
    """(ms of the first, collections that landed in it, median ms of REPEATS more, claims
    placed) of batches of BATCH
    identical items (`solve_many`: each item on the state holding the ones before it) on the
    initial state, each with a fresh selector cache. The first works out what later batches
    of the question read (MIG at 1,000 GPUs: ~120 ms, then 6-10)."""
    claims = _named(kind.claims, 0)
    times, placed, first_collections, collections = [], 0, 0, Collections()
    with collections:
        for _ in range(1 + REPEATS):
            started = _now()
            results = solve_many(
                snapshot,
                state,
                classes,
                claims,
                BATCH,
                selectors=SelectorCache(),
                **kind.solve_options,
            )
            times.append(_now() - started)
            placed = sum(isinstance(r, Allocated) for r in results) * len(claims)
            if len(times) == 1:
                first_collections = collections.count
    return _ms(times[0]), first_collections, _ms(statistics.median(times[1:])), placed


def _peak_kib(
    kind: Kind, snapshot: ClusterSnapshot, state: AllocatedState, classes: dict[str, DeviceClass]
) -> float:
    selectors = SelectorCache()
    solve(snapshot, state, classes, kind.claims, selectors=selectors, **kind.solve_options)
    tracemalloc.start()
    try:
        solve(snapshot, state, classes, kind.claims, selectors=selectors, **kind.solve_options)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return round(peak / 1024, 1)


def _cel_bound(
    kind: Kind,
    cluster: GeneratedCluster,
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: dict[str, DeviceClass],
) -> dict[str, float | int | str]:
    """CEL evaluations of a cold Explain (every device looked at) and the bound: per selector,
    the distinct values it reads, summed."""
    selectors = SelectorCache()
    result = solve(
        snapshot,
        state,
        classes,
        kind.claims,
        selectors=selectors,
        explain=True,
        **kind.solve_options,
    )
    expressions = _expressions(kind, classes)
    bound = 0
    for expression in expressions:
        compiled = selectors.compile(expression)
        bound += len({compiled.profile_key(entry.cel) for entry in snapshot.all_devices()})
    evaluations = result.stats.cel_evaluations
    return {"cel_evals": evaluations, "profiles_read": bound, "cel_excess": evaluations - bound}


def _expressions(kind: Kind, classes: dict[str, DeviceClass]) -> list[str]:
    found: list[str] = []
    for claim in kind.claims:
        for request in claim.requests:
            subs: list[Any] = (
                [request.exactly] if request.exactly else list(request.first_available)
            )
            for sub in subs:
                class_name = sub.device_class_name
                for selector in (*classes[class_name].selectors, *sub.selectors):
                    if selector.cel not in found:
                        found.append(selector.cel)
    return found


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _rss_mib() -> float:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource  # noqa: PLC0415

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
