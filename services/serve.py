"""`gpualloc serve`: the inventory and the allocator in one process, on one port.

This is the only module that imports both services: it plugs the inventory service into the
allocator's feed port in process (no WatchInventory round trip), then serves both gRPC services,
health and reflection on one address (default 127.0.0.1:50051). `--demo` seeds the inventory
with the example cluster so a newcomer can call it at once; `GPUALLOC_REDIS_URL` switches
reservations and inventory state from embedded to Redis. Both services share one telemetry,
so `--metrics-listen` (GPUALLOC_METRICS_LISTEN) serves the metrics of both on one `/metrics`;
`--demo` serves them on 127.0.0.1:9464 unless either is set (a busy port there: a warning).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from services.allocator.adapters.inventory.topology_pb import topology_from_pb
from services.allocator.adapters.web.server import WebView
from services.allocator.app.inventory_feed import Closeable, InventoryUpdate
from services.allocator.bootstrap import AllocatorApp, build_allocator, start_web_view
from services.allocator.config import AllocatorSettings
from services.allocator.core import NodeTopology
from services.common.config import ServerSettings, read_document_limits
from services.common.dra.model import Node
from services.common.errors import FailedPrecondition, GpuallocError, InvalidArgument
from services.common.grpc_server import create_server, security_summary, serve_until_signal
from services.common.health import Health
from services.common.log import configure_logging
from services.common.server_flags import (
    add_security_flags,
    metrics_listen_source,
    with_security_flags,
)
from services.common.telemetry import (
    DEFAULT_METRICS_LISTEN,
    METRICS_LISTEN_VARIABLE,
    Telemetry,
    configure_telemetry,
)
from services.inventory.adapters.grpc.mapping import to_pb_node_topology
from services.inventory.app.service import InventoryService
from services.inventory.app.telemetry import instrument_inventory
from services.inventory.bootstrap import (
    build_inventory,
    seed_inventory,
    seed_reports,
    start_kube_watch,
)
from services.inventory.config import InventorySettings
from services.inventory.core.state import Change, InventoryState

__all__ = ["DEMO_PATHS", "InProcessFeed", "register", "run_serve"]

log = logging.getLogger("gpualloc.serve")

_ROOT = Path(__file__).resolve().parents[1]
DEMO_PATHS = (str(_ROOT / "examples" / "cluster"),)
DEMO_TOPOLOGY = (str(_ROOT / "examples" / "nvml"),)  # `nvidia-smi topo -m` of the demo nodes
DEMO_CLASSES = (str(_ROOT / "examples" / "deviceclasses.yaml"),)
DEMO_WEB_LISTEN = "127.0.0.1:8080"  # the web view of `--demo` (`make run`) unless set
DEMO_METRICS_LISTEN = DEFAULT_METRICS_LISTEN  # /metrics of `--demo` (`make run`) unless set


class InProcessFeed:
    """The allocator's InventoryFeed over an InventoryService in the same process."""

    def __init__(self, inventory: InventoryService) -> None:
        self._inventory = inventory

    def follow(self, on_update: Callable[[InventoryUpdate], None]) -> Closeable:
        handle = _Following(on_update)
        # The listener runs under the inventory's write lock; `handle` makes it wait until the
        # initial reset has been delivered, so no change can overtake it.
        with handle.lock:
            state = self._inventory.subscribe(handle.on_change)
            on_update(_update(state, state.node_keys(), reset=True))
        return handle


class _Following:
    def __init__(self, on_update: Callable[[InventoryUpdate], None]) -> None:
        self.lock = threading.Lock()
        self._on_update = on_update
        self._closed = False

    def on_change(self, state: InventoryState, change: Change) -> None:
        with self.lock:
            if not self._closed:
                self._on_update(_update(state, change.nodes, reset=False))

    def close(self) -> None:
        with self.lock:
            self._closed = True


def _update(state: InventoryState, keys: frozenset[str], *, reset: bool) -> InventoryUpdate:
    slices = {}
    nodes: dict[str, Node | None] = {}
    topologies: dict[str, NodeTopology | None] = {}
    for key in keys:
        view = state.view(key)
        slices[key] = view.slices if view is not None else ()
        if key:
            entry = state.entries.get(key)
            nodes[key] = entry.node if entry is not None else None
            # The same translation the WatchInventory path makes, through the wire format.
            topology = view.topology if view is not None else None
            topologies[key] = (
                topology_from_pb(to_pb_node_topology(topology)) if topology is not None else None
            )
    return InventoryUpdate(
        generation=state.generation,
        reset=reset,
        slices=slices,
        nodes=nodes,
        topologies=topologies,
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the inventory and the allocator in one process (default 127.0.0.1:50051)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--listen", help="host:port (env GPUALLOC_LISTEN, default 127.0.0.1:50051)")
    parser.add_argument(
        "--demo",
        action="store_true",
        help="seed the inventory with examples/cluster, its topology and DeviceClasses",
    )
    parser.add_argument(
        "--seed",
        action="append",
        default=[],
        metavar="PATH",
        help="ResourceSlices/Nodes to apply at start (file or directory; repeatable)",
    )
    parser.add_argument(
        "--redis-url", help="Redis for reservations and inventory state (env GPUALLOC_REDIS_URL)"
    )
    parser.add_argument(
        "--web-listen",
        metavar="ADDR",
        help="host:port of the read-only web view of the fleet (env GPUALLOC_WEB_LISTEN; "
        f"with --demo default {DEMO_WEB_LISTEN}; '' turns it off)",
    )
    add_security_flags(parser)
    parser.set_defaults(func=lambda args: run_serve(args, os.environ))


def run_serve(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    env = dict(environ)
    if args.redis_url:
        env["GPUALLOC_REDIS_URL"] = args.redis_url
    try:
        server_settings = ServerSettings.from_env(env)
        if args.listen:
            server_settings = replace(server_settings, listen_address=args.listen)
        server_settings = with_security_flags(server_settings, args)
        configure_logging(server_settings.log_level, server_settings.log_format, route_native=True)
        log.info("gpualloc serve: %s", security_summary(server_settings))
        inventory_settings = replace(InventorySettings.from_env(env), server=server_settings)
        allocator_settings = replace(AllocatorSettings.from_env(env), server=server_settings)
        if args.demo:
            allocator_settings = replace(
                allocator_settings,
                device_classes=(*allocator_settings.device_classes, *DEMO_CLASSES),
            )
        allocator_settings = _with_web_listen(allocator_settings, args, env)
        telemetry = _telemetry(server_settings, args, env)
        inventory = build_inventory(settings=inventory_settings)
        inventory.background.append(telemetry.shutdown)
        instrument_inventory(inventory.service, telemetry)
        seeds = [*inventory_settings.seed_paths, *args.seed, *(DEMO_PATHS if args.demo else ())]
        seeded: list[str] = []
        if seeds:
            seeded = seed_inventory(inventory.service, seeds, read_document_limits(env))
            log.info("seeded the inventory with %d slices from %s", len(seeded), ", ".join(seeds))
        if args.demo:
            seed_reports(inventory.service, list(DEMO_TOPOLOGY))
        allocator = build_allocator(
            allocator_settings, InProcessFeed(inventory.service), telemetry=telemetry
        )
        health = Health()
        server, port = create_server(
            server_settings.listen_address,
            [inventory.registration, allocator.registration],
            server_settings,
            health=health,
            interceptors=allocator.interceptors(),
        )
        allocator.attach_health(health)
        start_kube_watch(inventory, inventory_settings, health, seeded)
        web = _start_web(allocator, allocator_settings, env, demo_default=_demo_web(args, env))
    except GpuallocError as error:
        print(f"gpualloc serve: {error}", file=sys.stderr)
        return 2
    server.start()
    log.info(
        "serving inventory and allocator on %s (port %d, ready: %s)",
        server_settings.listen_address,
        port,
        allocator.wait_ready(10.0),
    )
    if web is not None:
        log.info("web view of the fleet on %s", web.url)
    try:
        serve_until_signal(server, health, server_settings.grace_seconds)
    finally:
        allocator.close()
        inventory.close()
    return 0


def _telemetry(
    settings: ServerSettings, args: argparse.Namespace, env: Mapping[str, str]
) -> Telemetry:
    """Telemetry with the metrics endpoint on --metrics-listen, else GPUALLOC_METRICS_LISTEN,
    else with --demo DEMO_METRICS_LISTEN; a busy port is an error naming where the address
    came from, but only a warning for the demo's default (a second `make run`)."""
    address, source = settings.metrics_listen_address, metrics_listen_source(args)
    demo_default = bool(args.demo) and args.metrics_listen is None
    demo_default = demo_default and METRICS_LISTEN_VARIABLE not in env
    if demo_default:
        address, source = DEMO_METRICS_LISTEN, "the --demo default"
    try:
        return configure_telemetry(
            env, service_name="gpualloc", metrics_listen=address, metrics_listen_source=source
        )
    except FailedPrecondition as error:
        if not demo_default:
            raise
        log.warning("no metrics endpoint: %s; choose another with --metrics-listen", error)
        return configure_telemetry(env, service_name="gpualloc")


def _demo_web(args: argparse.Namespace, env: Mapping[str, str]) -> bool:
    return bool(args.demo) and args.web_listen is None and "GPUALLOC_WEB_LISTEN" not in env


def _start_web(
    allocator: AllocatorApp,
    settings: AllocatorSettings,
    env: Mapping[str, str],
    *,
    demo_default: bool,
) -> WebView | None:
    """The web view; when it is only the demo's default and its port is busy (a second `make
    run`), a warning instead of a refusal to start."""
    limits = read_document_limits(env)
    try:
        return start_web_view(allocator, settings, limits)
    except InvalidArgument as error:
        if not demo_default:
            raise
        log.warning("no web view: %s; choose another with --web-listen", error)
        return None


def _with_web_listen(
    settings: AllocatorSettings, args: argparse.Namespace, env: Mapping[str, str]
) -> AllocatorSettings:
    """--web-listen wins, then GPUALLOC_WEB_LISTEN; with --demo and neither, DEMO_WEB_LISTEN."""
    if args.web_listen is not None:
        return replace(settings, web_listen_address=args.web_listen)
    if args.demo and "GPUALLOC_WEB_LISTEN" not in env:
        return replace(settings, web_listen_address=DEMO_WEB_LISTEN)
    return settings
