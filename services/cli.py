"""`gpualloc` — one command line for the whole project.

Each subcommand lives next to the code it drives and exposes `register(subparsers)`; this module
only collects them, so importing the CLI does not import every service.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

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
    "policy": "services.common.security.policy_cli",
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


# the live verbs' "where and as whom" flags (services/client/live_cli.py), which kubectl also
# takes before the verb (`gpualloc -s ADDR get nodes`, `gpualloc --context prod get nodes`);
# each takes a value
GLOBAL_FLAGS = frozenset(
    {"-s", "--server", "--inventory", "--context", "--as"}
    | {"--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name", "--token-file"}
)
EXIT_USAGE = 2


class CommandParser(argparse.ArgumentParser):
    """argparse with the command line's error policy (docs/cli.md): a usage error is one line,
    `gpualloc VERB: invalid: message (did you mean X?); see 'gpualloc VERB --help'`, exit 2.
    Subcommands' parsers are of this class too (argparse makes them of their parent's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: invalid: {message}; see '{self.prog} --help'\n")

    def _check_value(self, action: argparse.Action, value: object) -> None:
        choices = action.choices
        if choices is None or value in choices:
            return
        known = [str(c) for c in choices]
        close = difflib.get_close_matches(str(value), known, n=1)
        hint = f"did you mean {close[0]}?" if close else f"one of {', '.join(known)}"
        raise argparse.ArgumentError(action, f"invalid choice: {value!r} ({hint})")


def hoist_global_flags(argv: Sequence[str]) -> list[str]:
    """`argv` with the GLOBAL_FLAGS given before the verb moved to just after it, where each
    live verb's parser takes them: `-s X get nodes` is `get -s X nodes`."""
    before: list[str] = []
    index = 0
    while index < len(argv) and argv[index] not in SUBCOMMANDS:
        word = argv[index]
        flag = word.partition("=")[0]
        if flag not in GLOBAL_FLAGS:
            return list(argv)  # something else before the verb: argparse says what is wrong
        takes_next = "=" not in word and index + 1 < len(argv)
        before += argv[index : index + (2 if takes_next else 1)]
        index += 2 if takes_next else 1
    if not before or index == len(argv):
        return list(argv)
    return [argv[index], *before, *argv[index + 1 :]]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = CommandParser(
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
    args_list = hoist_global_flags(list(sys.argv[1:] if argv is None else argv))
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
