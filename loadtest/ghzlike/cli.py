"""`gpualloc-load` / `python -m loadtest`: run a ghz config file, write a ghz report.

    python -m loadtest --config loadtest/ghz/allocate.json                # ghz's summary
    python -m loadtest --config loadtest/ghz/allocate.json -O pretty -o out/a.json --png out/a.png
    python -m loadtest --config loadtest/ghz/allocate-reserve.json --cycle release -z 10s --cpus 2
    ghz --config loadtest/ghz/allocate.json                               # the same run, with ghz

Flags override the file, as ghz's do; the host may also be given last, as to ghz. Exit codes:
0 the run completed (whatever the calls answered), 2 a bad config or an unreachable server.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.ghzlike.config import FORMATS, ConfigError, LoadConfig, load_config, parse_go_duration
from loadtest.ghzlike.cycle import CYCLES
from loadtest.ghzlike.engine import RunOutcome, run_load, unary_invoke
from loadtest.ghzlike.report import Options, Report, build_report, report_json
from loadtest.ghzlike.summary import client_line, csv_text, make_progress, summary_text

__all__ = ["execute", "main", "options_of", "render_report"]


def execute(
    config: LoadConfig, *, cycle: str | None = None, show_progress: bool = False
) -> tuple[dict[str, Any], RunOutcome]:
    """Run `config` and build its ghz report; `cycle` names an entry of CYCLES."""
    factory = CYCLES[cycle] if cycle else unary_invoke
    processes = max(config.cpus, 1)
    total = None if config.total_calls > 2**30 else config.total_calls
    progress = (
        make_progress(total, config.stop_after, config.name or config.call)
        if show_progress
        else None
    )
    try:
        outcome = run_load(config, processes=processes, invoke_factory=factory, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    run = Report(
        options=options_of(config, processes),
        total_ns=outcome.total_ns,
        end_reason=outcome.end_reason,
        tags=config.tags,
    )
    report = build_report(
        outcome.results, run, skip_first=config.skip_first, count_errors=config.count_errors
    )
    return report, outcome


def options_of(config: LoadConfig, processes: int) -> Options:
    """The report's `options` echo of a config (ghz's units: durations in ns)."""
    return Options(
        call=config.call,
        host=config.host,
        insecure=config.insecure,
        rps=config.rps,
        load_schedule="const",
        concurrency_schedule="const",
        concurrency_start=1,
        concurrency=config.concurrency,
        total=config.total_calls,
        connections=config.connections,
        duration_ns=int(config.stop_after * 1e9),
        timeout_ns=int(config.timeout * 1e9),
        dial_timeout_ns=int(config.connect_timeout * 1e9),
        keepalive_ns=int(config.keepalive * 1e9),
        data=config.data,
        metadata=config.metadata,
        cpus=processes,
        name=config.name,
        skip_first=config.skip_first,
        count_errors=config.count_errors,
    )


def render_report(report: dict[str, Any], output_format: str) -> str:
    if output_format == "summary":
        return summary_text(report)
    if output_format == "csv":
        return csv_text(report)
    return report_json(report, pretty=output_format == "pretty") + (
        "\n" if output_format == "pretty" else ""
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpualloc-load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("host", nargs="?", help="host:port (overrides the config's host)")
    parser.add_argument("--config", required=True, help="a ghz JSON config file")
    parser.add_argument("--call", help="package.Service/Method")
    parser.add_argument("-c", "--concurrency", type=int, help="workers")
    parser.add_argument("-n", "--total", type=int, help="calls")
    parser.add_argument("-z", "--duration", help="run for this long, e.g. 10s (ignores -n)")
    parser.add_argument("-x", "--max-duration", help="stop after this long, -n still respected")
    parser.add_argument("-r", "--rps", type=int, help="calls per second, all workers together")
    parser.add_argument("--connections", type=int, help="gRPC connections the workers share")
    parser.add_argument("--cpus", type=int, help="client processes (ghz: CPU cores)")
    parser.add_argument("--name", help="run name")
    parser.add_argument("-O", "--format", choices=FORMATS, help="summary, csv, json or pretty")
    parser.add_argument("-o", "--output", help="write the report here instead of stdout")
    parser.add_argument("--png", help="also write a latency histogram + timeline PNG here")
    parser.add_argument(
        "--cycle", choices=sorted(CYCLES), help="release: Release what each call reserved"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = _configured(args)
        report, outcome = execute(config, cycle=args.cycle, show_progress=not args.no_progress)
    except ConfigError as error:
        print(f"gpualloc-load: {error}", file=sys.stderr)
        return 2
    text = render_report(report, config.format)
    if config.output:
        Path(config.output).parent.mkdir(parents=True, exist_ok=True)
        Path(config.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    print(client_line(outcome), file=sys.stderr)
    if args.png:
        try:
            from loadtest.ghzlike.plot import plot_report

            print(f"plot: {plot_report(report, args.png)}", file=sys.stderr)
        except ImportError as error:
            print(f"gpualloc-load: no plot: {error}", file=sys.stderr)
    return 0


def _configured(args: argparse.Namespace) -> LoadConfig:
    config = load_config(args.config)
    return config.with_overrides(
        host=args.host,
        call=args.call,
        concurrency=args.concurrency,
        total=args.total,
        duration=None if args.duration is None else parse_go_duration(args.duration, "-z"),
        max_duration=None
        if args.max_duration is None
        else parse_go_duration(args.max_duration, "-x"),
        rps=args.rps,
        connections=args.connections,
        cpus=args.cpus,
        name=args.name,
        format=args.format,
        output=args.output,
    )
