"""`gpualloc-load` / `python -m loadtest`: run a ghz config file or ghz's flags, write a ghz
report.

    gpualloc-load --insecure --call grpc.health.v1.Health/Check -n 20000 127.0.0.1:50051
    python -m loadtest --config loadtest/ghz/allocate.json                # ghz's summary
    python -m loadtest --config loadtest/ghz/allocate.json -O pretty -o out/a.json --png out/a.png
    python -m loadtest --config loadtest/ghz/allocate-reserve.json --cycle release -z 10s --cpus 2
    ghz --config loadtest/ghz/allocate.json                               # the same run, with ghz

Flags override the file, as ghz's do; the host may also be given last, as to ghz. Without
`--config`, the flags are the whole run, as ghz's flag-only form: `--call` and the host are
then required, the rest has ghz's defaults (`-c 50`, `-n 200`). `-n` given without `-z` stops
after n calls even when the file sets a duration (a flag asks for n calls; ghz's `-z` ignores
`-n`, so `-z` still wins when both are given). `--tags '{"store": "redis"}'` goes into the
report, and the `--png` plot's title names the target host and that store. TLS as ghz:
TLS with the system's roots unless `--insecure`; `--cacert` (the server's CA), `--cert` and
`--key` (mutual TLS), `--cname` (the name to check), each of which also overrides the file's
`"insecure": true` (ghz would stay plaintext); a bearer token goes as call metadata, best
`-M token.json` holding `{"authorization": "Bearer <jwt>"}` (reports show it redacted). The
config keys are the same (`insecure`, `cacert`, `cert`, `key`, `cname`, `metadata`,
`metadata-file`). Exit codes: 0 the run completed (whatever the calls answered), 2 a bad config
or an unreachable server.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.ghzlike.config import (
    FORMATS,
    UNSUPPORTED_KEYS,
    ConfigError,
    LoadConfig,
    load_config,
    metadata_option,
    parse_config,
    parse_go_duration,
)
from loadtest.ghzlike.cycle import CYCLES
from loadtest.ghzlike.engine import RunOutcome, run_load, unary_invoke
from loadtest.ghzlike.html import html_text
from loadtest.ghzlike.method import import_paths_of
from loadtest.ghzlike.report import Options, Report, build_report, report_json
from loadtest.ghzlike.summary import client_line, csv_text, make_progress, summary_text
from services.common.console import console_main

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
        proto=config.proto,
        import_paths=import_paths_of(config) if config.proto else (),
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
        metadata=_redacted(config.metadata),
        cpus=processes,
        name=config.name,
        skip_first=config.skip_first,
        count_errors=config.count_errors,
    )


def _redacted(metadata: dict[str, str] | None) -> dict[str, str] | None:
    """The metadata echo without credentials: reports are shared and kept (ghz writes them)."""
    if metadata is None:
        return None
    return {k: "<redacted>" if k.lower() == "authorization" else v for k, v in metadata.items()}


def render_report(report: dict[str, Any], output_format: str) -> str:
    if output_format == "summary":
        return summary_text(report)
    if output_format == "csv":
        return csv_text(report)
    if output_format == "html":
        return html_text(report)
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
    parser.add_argument("--config", help="a ghz JSON config file (without it: ghz's flags only)")
    parser.add_argument("--call", help="package.Service/Method")
    parser.add_argument("-c", "--concurrency", type=int, help="workers")
    parser.add_argument("-n", "--total", type=int, help="calls")
    parser.add_argument("-z", "--duration", help="run for this long, e.g. 10s (ignores -n)")
    parser.add_argument("-x", "--max-duration", help="stop after this long, -n still respected")
    parser.add_argument("-r", "--rps", type=int, help="calls per second, all workers together")
    parser.add_argument("--connections", type=int, help="gRPC connections the workers share")
    parser.add_argument("-t", "--timeout", help="each call's timeout, e.g. 20s")
    parser.add_argument("--connect-timeout", help="how long to wait for the connection, e.g. 10s")
    parser.add_argument("--cpus", type=int, help="client processes (ghz: CPU cores)")
    parser.add_argument("--name", help="run name")
    parser.add_argument("-d", "--data", metavar="JSON", help="the request message(s) as JSON")
    parser.add_argument("-D", "--data-file", metavar="PATH", help="the request(s) from a file")
    parser.add_argument(
        "--tags", metavar="JSON", help='report tags, e.g. \'{"store": "redis"}\' (plot title)'
    )
    parser.add_argument("--proto", metavar="FILE", help="the .proto of --call (else reflection)")
    parser.add_argument(
        "-i", "--import-paths", metavar="DIRS", help="comma-separated -I directories for --proto"
    )
    parser.add_argument(
        "-O", "--format", choices=FORMATS, help="summary, csv, json, pretty or html"
    )
    parser.add_argument("-o", "--output", help="write the report here instead of stdout")
    parser.add_argument("--png", help="also write a latency histogram + timeline PNG here")
    parser.add_argument(
        "--cycle", choices=sorted(CYCLES), help="release: Release what each call reserved"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    _tls_flags(parser)
    return parser


def _tls_flags(parser: argparse.ArgumentParser) -> None:
    """ghz's TLS and metadata flags (a bearer token goes in metadata, best from a file)."""
    tls = parser.add_argument_group("TLS and metadata (ghz's flags)")
    plain = "use plaintext (the config's `insecure`)"
    tls.add_argument("--insecure", action="store_const", const=True, default=None, help=plain)
    tls.add_argument("--cacert", metavar="PATH", help="PEM CA of the server's certificate")
    tls.add_argument("--cert", metavar="PATH", help="PEM client certificate (with --key: mTLS)")
    tls.add_argument("--key", metavar="PATH", help="PEM private key of --cert")
    tls.add_argument("--cname", metavar="NAME", help="server name to check the certificate for")
    tls.add_argument("--skipTLS", action="store_true", help="not supported (gRPC Python)")
    tls.add_argument("-m", "--metadata", metavar="JSON", help='call metadata, e.g. \'{"k":"v"}\'')
    tls.add_argument(
        "-M",
        "--metadata-file",
        metavar="PATH",
        help='call metadata from a JSON file, e.g. {"authorization": "Bearer <jwt>"}',
    )


@console_main
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
    config = load_config(args.config) if args.config else _from_flags(args)
    if args.skipTLS:
        raise ConfigError(
            f"--skipTLS: the ghz option is not supported here ({UNSUPPORTED_KEYS['skipTLS'][1]})"
        )
    # A certificate flag asks for TLS: it overrides the file's `insecure` (flags win).
    tls_flags = any((args.cacert, args.cert, args.key, args.cname))
    return config.with_overrides(
        insecure=False if tls_flags and args.insecure is None else args.insecure,
        cacert=args.cacert,
        cert=args.cert,
        key=args.key,
        cname=args.cname,
        metadata=metadata_option(args.metadata, args.metadata_file),
        host=args.host,
        call=args.call,
        proto=args.proto,
        import_paths=None
        if args.import_paths is None
        else tuple(p for p in args.import_paths.split(",") if p),
        concurrency=args.concurrency,
        total=args.total,
        duration=_duration(args),
        max_duration=None
        if args.max_duration is None
        else parse_go_duration(args.max_duration, "-x"),
        rps=args.rps,
        connections=args.connections,
        timeout=None if args.timeout is None else parse_go_duration(args.timeout, "-t"),
        connect_timeout=None
        if args.connect_timeout is None
        else parse_go_duration(args.connect_timeout, "--connect-timeout"),
        cpus=args.cpus,
        name=args.name,
        data=None if args.data is None and args.data_file is None else _data(args),
        tags=None if args.tags is None else {**(config.tags or {}), **_json_map(args.tags)},
        format=args.format,
        output=args.output,
    )


def _from_flags(args: argparse.Namespace) -> LoadConfig:
    """ghz's flag-only form: what the config file would hold comes from the flags."""
    for flag, value in (("--call", args.call), ("host", args.host)):
        if not value:
            raise ConfigError(f"{flag}: required without --config (as with ghz)")
    return parse_config({"call": args.call, "host": args.host}, source="the command line")


def _duration(args: argparse.Namespace) -> float | None:
    """`-z`; `-n` alone clears the file's duration, so that the run stops after n calls."""
    if args.duration is not None:
        return parse_go_duration(args.duration, "-z")
    return 0.0 if args.total is not None else None


def _data(args: argparse.Namespace) -> Any:
    key = "data-file" if args.data_file else "data"
    raw = {"data-file": args.data_file} if args.data_file else {"data": _json(args.data, "-d")}
    return parse_config({"call": "x", "host": "x", **raw}, source=f"--{key}").data


def _json(text: str, flag: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{flag}: not JSON: {error}") from None
    except RecursionError:
        raise ConfigError(f"{flag}: not JSON: nested too deeply") from None


def _json_map(text: str) -> dict[str, str]:
    value = _json(text, "--tags")
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(f"--tags: an object of string values, got {text!r}")
    return {str(k): v for k, v in value.items()}
