"""`make bench`: run every benchmark suite, or the ones named, and print their tables.

    python -m loadtest.bench                 # all suites, human-readable tables
    python -m loadtest.bench solver --json   # one suite, one JSON document on stdout
    python -m loadtest.bench slurm --quick   # the Slurm bridge (root; only when named)

Each suite is a module `loadtest.bench_<name>` exposing `run(quick: bool) -> BenchReport`. Speed
targets live here and in docs/performance.md, never in unit tests.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
from collections.abc import Sequence

from loadtest.report import BenchReport

SUITES = ("solver", "quality", "inventory", "service", "store", "tenants", "ghz")
ON_REQUEST = ("slurm",)
"""Run only when named: a real Slurm, as root, for minutes (loadtest/bench_slurm.py)."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench",
        description=__doc__.split("\n")[0],
        epilog="How a suite measures: its module's docstring (loadtest/bench_<suite>.py). "
        "solver: its timed columns are the bench thread's CPU time under the allocator "
        "server's collector policy (GcPolicy); streams of 300 solves (--quick; 1,000 otherwise) "
        "whose p99s count every solve (beside them *_no_gc_ms: without the solves a collection "
        "landed in, counted as gc_solves); "
        "explain_again_ms and batch_again_ms medians of five.",
    )
    parser.add_argument(
        "suites", nargs="*", choices=[*SUITES, *ON_REQUEST, []], help="suites to run (default: all)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document instead of tables"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller sizes and fewer repetitions (smoke)"
    )
    parser.add_argument(
        "--rows",
        metavar="REGEX",
        help="only the rows whose name matches (suites that take it: solver), e.g. "
        "'^100000/mig' for the MIG kind at 100,000 GPUs",
    )
    args = parser.parse_args(argv)
    chosen = args.suites or list(SUITES)
    reports: list[BenchReport] = []
    for name in chosen:
        try:
            module = importlib.import_module(f"loadtest.bench_{name}")
        except ModuleNotFoundError as err:
            if err.name != f"loadtest.bench_{name}":
                raise
            print(f"(suite {name!r} not available yet)", file=sys.stderr)
            continue
        options = {"rows": args.rows} if args.rows else {}
        if options and "rows" not in inspect.signature(module.run).parameters:
            print(f"(suite {name!r} runs every row: no --rows filter)", file=sys.stderr)
            options = {}
        report: BenchReport = module.run(quick=args.quick, **options)
        reports.append(report)
        if not args.json:
            print(report.table(), flush=True)
    if args.json:
        json.dump({"suites": [r.to_json() for r in reports]}, sys.stdout, indent=2)
        print()
    return 0 if all(r.targets_met() for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
