"""`gpualloc-allocator`: the allocator service on its own (default 127.0.0.1:50051).

    gpualloc-allocator --inventory 127.0.0.1:50052 --redis-url redis://127.0.0.1:6379/0
    gpualloc-allocator --seed examples/cluster              # fixed slices, embedded store
    gpualloc-allocator --workers 4 --redis-url redis://…    # 4 processes on one port

The GPU view comes from an inventory (`--inventory`, WatchInventory) or from files (`--seed`:
ResourceSlices and Nodes, no inventory needed). With `--workers N` the parent starts N worker
processes that listen on the same port (SO_REUSEPORT: the kernel spreads connections), each
with its own view and reservation copy, all sharing one Redis; the parent restarts a worker
that dies and stops them all on SIGTERM. Workers need Redis: embedded stores are per process.
Each worker serves its own metrics (GPUALLOC_METRICS_LISTEN host:P: worker k on P + k).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from types import FrameType

from services.allocator.adapters.inventory.watch_client import InventoryClient
from services.allocator.app.inventory_feed import InventoryFeed, StaticFeed
from services.allocator.bootstrap import build_allocator, start_web_view
from services.allocator.config import AllocatorSettings
from services.client.config import ClientSettings
from services.common.config import read_document_limits
from services.common.console import console_main
from services.common.errors import GpuallocError, InvalidArgument
from services.common.gc_policy import GcPolicy
from services.common.grpc_server import create_server, security_summary, serve_until_signal
from services.common.health import Health
from services.common.log import configure_logging
from services.common.server_flags import (
    add_security_flags,
    metrics_listen_source,
    with_security_flags,
)
from services.common.telemetry import METRICS_LISTEN_VARIABLE

log = logging.getLogger("gpualloc.allocator")

_READY_WAIT_SECONDS = 10.0
_RESTART_PAUSE_SECONDS = 1.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpualloc-allocator", description="Serve the gpualloc allocator over gRPC."
    )
    parser.add_argument("--listen", help="host:port (env GPUALLOC_LISTEN, default 127.0.0.1:50051)")
    parser.add_argument(
        "--inventory", metavar="ADDR", help="inventory host:port (env GPUALLOC_INVENTORY_ADDR)"
    )
    parser.add_argument(
        "--redis-url", help="reservation store (env GPUALLOC_REDIS_URL; empty: embedded)"
    )
    parser.add_argument(
        "--seed",
        action="append",
        default=[],
        metavar="PATH",
        help="ResourceSlices/Nodes to serve without an inventory (file or dir; repeatable)",
    )
    parser.add_argument(
        "--workers", type=int, help="processes sharing the port (env GPUALLOC_WORKERS, default 1)"
    )
    parser.add_argument(
        "--web-listen",
        metavar="ADDR",
        help="host:port of the read-only web view of the fleet (env GPUALLOC_WEB_LISTEN)",
    )
    parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    add_security_flags(parser)
    return parser


@console_main
def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = _settings(args)
        configure_logging(settings.server.log_level, settings.server.log_format, route_native=True)
        log.info("gpualloc-allocator: %s", security_summary(settings.server))
        if settings.workers > 1:
            return _supervise(settings, list(sys.argv[1:] if argv is None else argv))
        return _serve(
            settings,
            args.seed,
            reuse_port=args.reuse_port,
            metrics_source=metrics_listen_source(args),
        )
    except GpuallocError as err:
        print(f"gpualloc-allocator: {err}", file=sys.stderr)
        return 2


def _settings(args: argparse.Namespace) -> AllocatorSettings:
    settings = AllocatorSettings.from_env(os.environ)
    if args.listen:
        settings = replace(settings, server=replace(settings.server, listen_address=args.listen))
    settings = replace(settings, server=with_security_flags(settings.server, args))
    if args.inventory:
        settings = replace(settings, inventory_address=args.inventory)
    if args.redis_url is not None:
        settings = replace(settings, redis_url=args.redis_url)
    if args.web_listen is not None:
        settings = replace(settings, web_listen_address=args.web_listen)
    if args.workers is not None:
        if args.workers < 1:
            raise InvalidArgument.at("--workers", f"must be >= 1, got {args.workers}")
        settings = replace(settings, workers=args.workers)
    if settings.workers > 1 and not settings.redis_url:
        raise InvalidArgument.at(
            "--workers", "several workers need a shared store: set --redis-url"
        )
    if not settings.inventory_address and not args.seed:
        raise InvalidArgument.at(
            "--inventory", "the allocator needs a GPU view: give --inventory ADDR or --seed PATH"
        )
    return settings


def _feed(
    settings: AllocatorSettings, seeds: Sequence[str]
) -> tuple[InventoryFeed, InventoryClient | None]:
    if seeds:
        return StaticFeed.from_paths(seeds, read_document_limits(os.environ)), None
    dial = ClientSettings.from_env(os.environ)  # GPUALLOC_CLIENT_TLS_*, _TOKEN_FILE
    client = InventoryClient(settings.inventory_address, tls=dial.tls, token_file=dial.token_file)
    return client, client


def _serve(
    settings: AllocatorSettings,
    seeds: Sequence[str],
    *,
    reuse_port: bool,
    metrics_source: str = METRICS_LISTEN_VARIABLE,
) -> int:
    feed, client = _feed(settings, seeds)
    app = build_allocator(
        settings,
        feed,
        metrics_listen_source=metrics_source,
        feed_connected=(lambda: client.status().connected) if client else None,
        feed_target=settings.inventory_address,
    )
    # The view (at 10,000 GPUs millions of objects) would make every full collection walk it:
    # ~0.5 s each, every few seconds of placements (docs/performance.md).
    gc_policy = GcPolicy(name="allocator-gc").start()
    try:
        health = Health()
        server, port = create_server(
            settings.server.listen_address,
            [app.registration],
            settings.server,
            health=health,
            interceptors=app.interceptors(),
            reuse_port=reuse_port,
        )
        app.attach_health(health)
        web = start_web_view(app, settings, read_document_limits(os.environ), reuse_port=reuse_port)
        server.start()
        log.info(
            "allocator serving",
            extra={
                "address": settings.server.listen_address,
                "port": port,
                "pid": os.getpid(),
                "store": "redis" if settings.redis_url else "embedded",
                "ready": app.wait_ready(_READY_WAIT_SECONDS),
                "web": web.url if web is not None else "",
            },
        )
        serve_until_signal(server, health, settings.server.grace_seconds)
    finally:
        gc_policy.stop()
        app.close()
    return 0


# --- several worker processes on one port ------------------------------------------------------


def _supervise(settings: AllocatorSettings, argv: list[str]) -> int:
    """Run `settings.workers` copies of this command with one worker each, restart those that
    die, stop all on SIGTERM/SIGINT."""
    host, _, port_text = settings.server.listen_address.rpartition(":")
    holder = _hold_port(host, int(port_text))  # port 0: pick one the workers will share
    port = holder.getsockname()[1]
    child_argv = [
        *_without_flags(argv, ("--workers", "--listen", "--metrics-listen")),
        "--workers",
        "1",
        "--listen",
        f"{host}:{port}",
        "--reuse-port",
    ]
    commands = [
        [sys.executable, "-m", "services.allocator", *child_argv, *_metrics_flag(settings, i)]
        for i in range(settings.workers)
    ]
    stopping: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    workers = [subprocess.Popen(command) for command in commands]
    log.info(
        "allocator workers started",
        extra={"port": port, "workers": [w.pid for w in workers]},
    )
    try:
        while not stopping:
            time.sleep(0.2)
            for index, worker in enumerate(workers):
                if worker.poll() is not None and not stopping:
                    log.warning(
                        "allocator worker exited; restarting",
                        extra={"pid": worker.pid, "code": worker.returncode},
                    )
                    time.sleep(_RESTART_PAUSE_SECONDS)
                    workers[index] = subprocess.Popen(commands[index])
    finally:
        holder.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=settings.server.grace_seconds + 5)
            except subprocess.TimeoutExpired:
                worker.kill()
    return 0


def _metrics_flag(settings: AllocatorSettings, index: int) -> list[str]:
    """Worker `index`'s metrics address: one port each (a scrape must reach one process, or its
    counters would jump between workers): the configured port + index (0: any free port)."""
    address = settings.server.metrics_listen_address
    if not address:
        return []
    host, _, port_text = address.rpartition(":")
    port = int(port_text) if port_text.isdigit() else 0
    return ["--metrics-listen", f"{host}:{port + index if port else 0}"]


def _hold_port(host: str, port: int) -> socket.socket:
    """A bound, never listening, SO_REUSEPORT socket that keeps the port ours while workers
    come and go (only listening sockets get connections)."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host.strip("[]") or "0.0.0.0", port))
    except OSError as error:  # the same words as a single worker's (grpc_server.py)
        sock.close()
        raise InvalidArgument.at(
            "--listen",
            f"cannot listen on {host}:{port}: the address is in use or not local "
            f"({error.strerror})",
        ) from None
    return sock


def _without_flags(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in flags:
            skip = True
            continue
        if any(arg.startswith(flag + "=") for flag in flags):
            continue
        kept.append(arg)
    return kept


if __name__ == "__main__":
    sys.exit(main())
