"""Placement quality benchmark: the replay of loadtest/replay.py, policies side by side.

    python -m loadtest.bench quality [--quick] [--json]

FIRST_FIT (upstream-like), BINPACK and FRAGMENTATION_AWARE replay the same seeded job streams on
the same MIG-heavy 256-GPU cluster, at every load of `replay.LOADS` (saturated, and about 90% of
capacity). Per load: the bound (requests no policy can exceed before its first rejection), then
per policy the requests placed before the first rejection (mean, and per seed), the allocation
rate (mean, and per seed), the ratio to first fit and to the bound, and the median solve time.
Quick runs two seeds instead of six.

Target (issue 5): fragmentation-aware places >= 15% more requests than first fit before the first
rejection, at the load where fragmentation rather than saturation decides (docs/performance.md).
"""

from __future__ import annotations

import statistics
import sys

from loadtest.replay import GPUS, LOADS, offered_load, replay_policies
from loadtest.report import BenchReport, Target
from services.allocator.core import Policy

TARGET_LOAD = "load90"


def run(quick: bool) -> BenchReport:
    seeds = (1, 2) if quick else (1, 2, 3, 4, 5, 6)
    report = BenchReport(
        "quality",
        setup={
            "cluster": f"{GPUS} GPUs",
            "loads": ", ".join(
                f"{x.name} ({x.requests} jobs, mean duration {x.mean_duration})" for x in LOADS
            ),
            "seeds": " ".join(str(s) for s in seeds),
            "python": sys.version.split()[0],
        },
    )
    replayed = replay_policies(seeds)
    for load in LOADS:
        bound = replayed.bounds[load.name]
        bound_mean = statistics.mean(bound)
        report.add(
            f"{load.name}/bound",
            offered_load=round(offered_load(load), 3),
            placed_before_rejection=round(bound_mean, 1),
            per_seed=" ".join(str(n) for n in bound),
        )
        results = [r for r in replayed.results if r.load == load]
        baseline = next(r for r in results if r.policy is Policy.FIRST_FIT)
        for result in results:
            report.add(
                f"{load.name}/{result.policy}",
                offered_load=round(offered_load(load), 3),
                placed_before_rejection=round(result.placed_before_rejection, 1),
                per_seed=" ".join(str(n) for n in result.first_rejection),
                allocation_rate=round(statistics.mean(result.allocation_rate), 4),
                rate_per_seed=" ".join(f"{r:.3f}" for r in result.allocation_rate),
                vs_first_fit=round(
                    result.placed_before_rejection / max(baseline.placed_before_rejection, 1), 3
                ),
                of_bound=round(result.placed_before_rejection / max(bound_mean, 1), 3),
                solve_median_ms=round(result.solve_ms, 3),
            )
    report.targets.append(
        Target(f"{TARGET_LOAD}/{Policy.FRAGMENTATION_AWARE}", "vs_first_fit", 1.15, at_least=True)
    )
    return report
