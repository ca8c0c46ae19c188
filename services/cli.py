"""`gpualloc` — one command line for the whole project.

Each subcommand lives next to the code it drives and exposes `register(subparsers)`; this module
only collects them, so importing the CLI does not import every service.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from services.common.console import console_main

# subcommand name -> module with `register(subparsers) -> None` (or `module:function` naming
# another registering function); the parser's `func(args) -> int` does the work. Modules are
# imported lazily so `gpualloc --help` stays fast.
SUBCOMMANDS: dict[str, str] = {
    "serve": "services.serve",
    "solve": "services.allocator.cli.solve",
    "inventory": "services.inventory.cli.inventory",
    "apply": "services.inventory.cli.apply",
    "certs": "services.common.security.certs_cli",
    # the live service, kubectl-shaped (services/client/live_cli.py); `module:function`
    # registers one verb of a module that holds several
    "get": "services.client.live_cli:register_get",
    "describe": "services.client.live_cli:register_describe",
    "allocate": "services.client.live_cli:register_allocate",
    "explain": "services.client.live_cli:register_explain",
    "capacity": "services.client.live_cli:register_capacity",
    "commit": "services.client.live_cli:register_commit",
    "renew": "services.client.live_cli:register_renew",
    "release": "services.client.live_cli:register_release",
    "config": "services.client.live_cli:register_config",
    "completion": "services.completion",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpualloc",
        description="GPU allocation-as-a-service: Kubernetes DRA semantics over gRPC.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in SUBCOMMANDS.items():
        if only is not None and name != only:
            subparsers.add_parser(name, help=f"see `gpualloc {name} --help`")
            continue
        module_path, _, function = module_name.partition(":")
        register = getattr(importlib.import_module(module_path), function or "register")
        register(subparsers)
    return parser


@console_main
def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in args_list if a in SUBCOMMANDS), None)
    parser = build_parser(only=chosen)
    args = parser.parse_args(args_list)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    code: int = func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
