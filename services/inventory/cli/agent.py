"""`gpualloc-agent`: report this node's GPUs to the inventory, or print the report.

    gpualloc-agent --stdout                       one report from NVML, as JSON
    gpualloc-agent --inventory ADDR --interval 30 push a report every 30 s (ReportNode)
    gpualloc-agent --xml smi.xml --topo topo.txt --stdout
                                                  the same from saved `nvidia-smi -q -x` and
                                                  `nvidia-smi topo -m` output (no GPU needed)
    gpualloc-agent --inventory ADDR --tls-ca ca.crt --tls-cert tls.crt --tls-key tls.key
                                                  push over mutual TLS (or --token-file)

NVML comes from nvidia-ml-py (`pip install 'gpualloc[agent]'`). Where it is missing or cannot
initialise (no driver, no GPU) the agent exits 1 and says so. XID events are gathered between
reports from an NVML event set. Pushing goes through a `ReportSink`; `push_to_inventory` makes
the gRPC one (ReportNode). A periodic agent reports a failed push on stderr and retries at the
next interval; `--once` exits 1.
Exit codes: 0 done, 1 failed (message on stderr), 2 bad flags.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import grpc

from protos.inventory.v1 import inventory_pb2, inventory_pb2_grpc
from services.client.calls import open_channel
from services.client.cli_flags import add_client_flags, client_settings
from services.client.config import ClientSettings, TlsConfig
from services.common.console import console_main
from services.common.errors import GpuallocError, InvalidArgument, Unavailable
from services.inventory.adapters.grpc.report_pb import to_pb_node_report
from services.inventory.adapters.sources.nvidia_smi_xml import parse_nvidia_smi_xml
from services.inventory.adapters.sources.nvml_reader import XidWatcher, read_node_report
from services.inventory.adapters.sources.report_json import to_json
from services.inventory.adapters.sources.topo_matrix import parse_topo_matrix
from services.inventory.core.report import NodeReport
from services.inventory.core.topology import apply_topology

__all__ = ["InventoryPush", "ReportSink", "build_parser", "main", "push_to_inventory"]

ReportSink = Callable[[NodeReport], None]
"""Where reports go: called once per report, raises GpuallocError when it cannot deliver."""

_NVML_HINT = "run on a GPU node with the NVIDIA driver, or use --xml FILE"
_XID_POLL_MS = 200  # how long a one-shot report waits for queued XID events
_PUSH_TIMEOUT_S = 10.0


class InventoryPush:
    """A ReportSink that sends each report to the inventory's ReportNode RPC (one channel for
    the agent's life). RPC failures raise Unavailable with the status and its details."""

    def __init__(
        self,
        address: str,
        timeout_s: float = _PUSH_TIMEOUT_S,
        *,
        tls: TlsConfig | None = None,
        token_file: Path | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = open_channel(address, tls, token_file=token_file)
        self._stub = inventory_pb2_grpc.InventoryStub(self._channel)

    def __call__(self, report: NodeReport) -> None:
        request = inventory_pb2.ReportNodeRequest(report=to_pb_node_report(report))
        try:
            self._stub.ReportNode(request, timeout=self.timeout_s)
        except grpc.RpcError as error:
            code = error.code().name if isinstance(error, grpc.Call) else "UNKNOWN"
            details = error.details() if isinstance(error, grpc.Call) else str(error)
            raise Unavailable(f"ReportNode to {self.address} failed: {code}: {details}") from None

    def close(self) -> None:
        self._channel.close()


def push_to_inventory(address: str, settings: ClientSettings | None = None) -> InventoryPush:
    """The gRPC push hook: a sink for `address` (host:port of the inventory), over TLS and
    with a bearer token when `settings` say so."""
    settings = settings or ClientSettings()
    return InventoryPush(address, tls=settings.tls, token_file=settings.token_file)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpualloc-agent",
        description="Report this node's GPUs (NVML, or saved nvidia-smi output) to gpualloc.",
    )
    parser.add_argument("--once", action="store_true", help="one report, then exit")
    parser.add_argument("--stdout", action="store_true", help="print the report as JSON")
    parser.add_argument("--node", help="node name (default: $NODE_NAME, else the hostname)")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--inventory", metavar="ADDR", help="push reports to this inventory")
    parser.add_argument("--interval", type=float, default=30.0, metavar="SECONDS")
    parser.add_argument("--xml", type=Path, metavar="FILE", help="saved `nvidia-smi -q -x` output")
    parser.add_argument("--topo", type=Path, metavar="FILE", help="saved `nvidia-smi topo -m`")
    add_client_flags(parser)
    return parser


@console_main
def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not args.stdout and not args.inventory:
        parser.error("nothing to do: pass --stdout to print a report or --inventory ADDR")
    if args.interval <= 0:
        parser.error("--interval must be positive")
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--label {item!r} is not KEY=VALUE")
        labels[key] = value
    node = args.node or os.environ.get("NODE_NAME") or socket.gethostname()
    try:  # bad TLS or token settings are bad flags (exit 2), found before the first report
        settings = client_settings(args, os.environ)
        sink = push_to_inventory(args.inventory, settings) if args.inventory else None
    except InvalidArgument as error:
        parser.error(str(error))
    try:
        periodic = sink is not None and not args.once
        with (
            _stop_on_signals(periodic) as stop,
            _report_source(args, node, labels, stop) as (make_report, wait),
        ):
            while True:
                report = make_report()
                if args.stdout:
                    print(json.dumps(to_json(report), indent=2), flush=True)
                if sink is not None:
                    _deliver(sink, report, keep_going=periodic)
                if not periodic or not wait(args.interval):
                    return 0
    except GpuallocError as error:
        print(f"gpualloc-agent: {error.message}", file=sys.stderr)
        return 1
    finally:
        if sink is not None:
            sink.close()


def _deliver(sink: ReportSink, report: NodeReport, keep_going: bool) -> None:
    """Push one report; a periodic agent says what failed and tries again next interval."""
    try:
        sink(report)
    except GpuallocError as error:
        if not keep_going:
            raise
        print(f"gpualloc-agent: {error.message}; retrying in the next interval", file=sys.stderr)


# --- report sources: (make one report, wait up to N seconds -> False when asked to stop) ----

Source = tuple[Callable[[], NodeReport], Callable[[float], bool]]


@contextmanager
def _report_source(
    args: argparse.Namespace, node: str, labels: dict[str, str], stop: threading.Event
) -> Iterator[Source]:
    topo = _read(args.topo) if args.topo else None
    if args.xml is not None:
        path: Path = args.xml

        def from_xml() -> NodeReport:
            report = parse_nvidia_smi_xml(_read(path), node, str(path), labels=labels)
            return _with_topo(report, topo, args.topo)

        yield from_xml, lambda seconds: not stop.wait(seconds)
        return
    nvml = _load_nvml()
    try:
        watcher = XidWatcher.start(nvml)
    except nvml.NVMLError as error:
        nvml.nvmlShutdown()
        raise Unavailable(f"NVML cannot watch XID events: {error}") from None

    def from_nvml() -> NodeReport:
        try:
            watcher.poll(_XID_POLL_MS, _now)
            report = read_node_report(nvml, node, _now(), labels, watcher)
        except nvml.NVMLError as error:
            raise Unavailable(f"NVML failed while reading the GPUs: {error}") from None
        return _with_topo(report, topo, args.topo)

    def wait(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        try:
            while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
                watcher.poll(int(min(left, 1.0) * 1000), _now)
        except nvml.NVMLError as error:
            raise Unavailable(f"NVML failed while waiting for XID events: {error}") from None
        return not stop.is_set()

    try:
        yield from_nvml, wait
    finally:
        watcher.close()
        nvml.nvmlShutdown()


def _load_nvml() -> ModuleType:
    """Import pynvml and initialise NVML, or raise Unavailable with what to do instead."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        raise Unavailable(
            "NVML not available: the nvidia-ml-py package is not installed"
            f" (pip install 'gpualloc[agent]'); {_NVML_HINT}"
        ) from None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        raise Unavailable(f"NVML not available: {error}; {_NVML_HINT}") from None
    return nvml


def _with_topo(report: NodeReport, topo: str | None, path: Path | None) -> NodeReport:
    if topo is None:
        return report
    return apply_topology(report, parse_topo_matrix(topo, str(path)))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise Unavailable(f"cannot read {path}: {error}") from None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@contextmanager
def _stop_on_signals(install: bool) -> Iterator[threading.Event]:
    """An event that SIGTERM/SIGINT set while a periodic agent runs (handlers restored after)."""
    stop = threading.Event()
    if not install or threading.current_thread() is not threading.main_thread():
        yield stop
        return
    signals = (signal.SIGTERM, signal.SIGINT)
    previous = {signum: signal.getsignal(signum) for signum in signals}
    for signum in signals:
        signal.signal(signum, lambda *_: stop.set())
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
