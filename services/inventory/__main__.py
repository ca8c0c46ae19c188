"""`gpualloc-inventory`: the inventory service on its own (default 127.0.0.1:50052)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import replace

from services.common.config import read_document_limits
from services.common.console import console_main
from services.common.errors import GpuallocError
from services.common.grpc_server import create_server, security_summary, serve_until_signal
from services.common.health import Health
from services.common.log import configure_logging
from services.common.server_flags import (
    add_security_flags,
    metrics_listen_source,
    with_security_flags,
)
from services.common.telemetry import configure_telemetry
from services.inventory.app.telemetry import instrument_inventory
from services.inventory.bootstrap import build_inventory, seed_inventory, start_kube_watch
from services.inventory.config import InventorySettings

log = logging.getLogger("gpualloc.inventory")


@console_main
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpualloc-inventory", description="Serve the gpualloc inventory over gRPC."
    )
    parser.add_argument("--listen", help="host:port (env GPUALLOC_LISTEN, default 127.0.0.1:50052)")
    parser.add_argument(
        "--seed",
        action="append",
        default=[],
        metavar="PATH",
        help="ResourceSlices/Nodes to apply at start (file or dir; repeatable; env GPUALLOC_SEED)",
    )
    add_security_flags(parser)
    args = parser.parse_args(argv)
    try:
        settings = InventorySettings.from_env(os.environ)
        if args.listen:
            settings = replace(
                settings, server=replace(settings.server, listen_address=args.listen)
            )
        settings = replace(settings, server=with_security_flags(settings.server, args))
        configure_logging(settings.server.log_level, settings.server.log_format, route_native=True)
        log.info("gpualloc-inventory: %s", security_summary(settings.server))
        app = build_inventory(settings=settings)
        seeds = [*settings.seed_paths, *args.seed]
        seeded: list[str] = []
        if seeds:
            seeded = seed_inventory(app.service, seeds, read_document_limits(os.environ))
            log.info("seeded inventory", extra={"slices": len(seeded), "paths": seeds})
        telemetry = configure_telemetry(
            os.environ,
            service_name="gpualloc-inventory",
            metrics_listen=settings.server.metrics_listen_address,
            metrics_listen_source=metrics_listen_source(args),
        )
        app.background.append(telemetry.shutdown)
        instrument_inventory(app.service, telemetry)
        health = Health()
        server, port = create_server(
            settings.server.listen_address,
            [app.registration],
            settings.server,
            health=health,
            interceptors=telemetry.interceptors(),
        )
        start_kube_watch(app, settings, health, seeded)
    except GpuallocError as err:
        print(f"gpualloc-inventory: {err}", file=sys.stderr)
        return 2
    server.start()
    log.info("inventory serving", extra={"address": settings.server.listen_address, "port": port})
    serve_until_signal(server, health, settings.server.grace_seconds)
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
