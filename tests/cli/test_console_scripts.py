"""Every console script of pyproject.toml, and every `gpualloc` subcommand, run for real under
bad input, a closed pipe, a missing server or cluster and a busy port: a message and an exit
code, never a Python traceback (issues 15 and 19).

A closed pipe is a pipe whose reading end is closed before the command starts, so its first
write fails as `gpualloc solve ... | head -1` does; services/common/console.py answers 141.
`{server}` is the address of a real `gpualloc serve --demo` (tests/integration/test_serve.py's
fixture, started only for the cases that name it), `{busy}` a port some socket already holds.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.cli import SUBCOMMANDS
from services.common.console import EXIT_CLOSED_PIPE
from tests.integration.test_serve import served  # noqa: F401 - the running server fixture

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
SOLVE = ("-f", "examples/cluster", "-f", "examples/deviceclasses.yaml")
CLAIM = ("-f", "examples/claims/one-h100.yaml")
XML = "tests/data/nvidia-smi-xml/2x-rtx-a5000_drv590.44.01_telegraf.xml"
BUSY = "{busy}"  # replaced by the address of a port some socket already holds
SERVER = "{server}"  # replaced by the address of a running `gpualloc serve --demo`
NOWHERE = ("-s", "127.0.0.1:1")  # a port nothing listens on
LOAD_HEALTH = ("gpualloc-load", "--insecure", "--call", "grpc.health.v1.Health/Check", "-n", "5")


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    code: int
    stdin: bytes = b""
    closed_pipe: bool = False
    env: dict[str, str] = field(default_factory=dict)
    stderr: str = ""  # a part of the message the command must print


CASES = {
    "solve-yaml-into-a-closed-pipe": Case(
        ("gpualloc", "solve", *SOLVE, *CLAIM, "-o", "yaml"), EXIT_CLOSED_PIPE, closed_pipe=True
    ),
    "solve-text-into-a-closed-pipe": Case(
        ("gpualloc", "solve", *SOLVE, *CLAIM), EXIT_CLOSED_PIPE, closed_pipe=True
    ),
    "solve-stdin-invalid-utf8": Case(
        ("gpualloc", "solve", *SOLVE, "-f", "-"), 2, b"kind: \xff\xfe\n", stderr="not UTF-8"
    ),
    "solve-stdin-twice": Case(("gpualloc", "solve", "-f", "-", "-f", "-"), 2, stderr="only once"),
    "solve-stdin-over-the-size-limit": Case(
        ("gpualloc", "solve", *SOLVE, "-f", "-"),
        2,
        b"# padding\n" * 100_000,
        env={"GPUALLOC_MAX_DOCUMENT_BYTES": "64Ki"},
        stderr="GPUALLOC_MAX_DOCUMENT_BYTES",
    ),
    "solve-bad-limit-setting": Case(
        ("gpualloc", "solve", *SOLVE, *CLAIM),
        2,
        env={"GPUALLOC_MAX_DOCUMENT_NODES": "many"},
        stderr="GPUALLOC_MAX_DOCUMENT_NODES",
    ),
    "inventory-stdin-985-brackets": Case(
        ("gpualloc", "inventory", "-f", "-"), 2, b"[" * 985 + b"]" * 985, stderr="nested deeper"
    ),
    "inventory-stdin-deep-json-object": Case(
        ("gpualloc", "inventory", "-f", "-"), 2, b'{"a":' * 3000, stderr="nested deeper"
    ),
    "inventory-stdin-invalid-utf8": Case(
        ("gpualloc", "inventory", "-f", "-"), 2, b"\xff", stderr="not UTF-8"
    ),
    "inventory-yaml-into-a-closed-pipe": Case(
        ("gpualloc", "inventory", "-f", "examples/cluster", "-o", "yaml"),
        EXIT_CLOSED_PIPE,
        closed_pipe=True,
    ),
    "apply-stdin-invalid-utf8": Case(
        ("gpualloc", "apply", "-f", "-", "--inventory", "127.0.0.1:1"), 2, b"\xff"
    ),
    "apply-without-an-inventory": Case(
        ("gpualloc", "apply", "-f", "examples/cluster", "--inventory", "127.0.0.1:1"),
        1,
        stderr="cannot reach",
    ),
    "serve-on-a-busy-port": Case(("gpualloc", "serve", "--demo", "--listen", BUSY), 2),
    "allocator-on-a-busy-port": Case(
        ("gpualloc-allocator", "--seed", "examples/cluster", "--listen", BUSY), 2
    ),
    "allocator-workers-on-a-busy-port": Case(
        ("gpualloc-allocator", "--workers", "2", "--seed", "examples/cluster", "--listen", BUSY),
        2,
        env={"GPUALLOC_REDIS_URL": "redis://127.0.0.1:1/0"},
        stderr="cannot listen",
    ),
    "inventory-server-on-a-busy-port": Case(("gpualloc-inventory", "--listen", BUSY), 2),
    "agent-once-stdout-into-a-closed-pipe": Case(
        ("gpualloc-agent", "--once", "--stdout", "--xml", XML, "--node", "n1"),
        EXIT_CLOSED_PIPE,
        closed_pipe=True,
    ),
    "agent-xml-not-utf8": Case(
        ("gpualloc-agent", "--once", "--stdout", "--xml", "{not_utf8}", "--node", "n1"), 1
    ),
    "load-deep-json-config": Case(("gpualloc-load", "--config", "{deep_json}"), 2),
    "load-config-not-utf8": Case(("gpualloc-load", "--config", "{not_utf8}"), 2),
    "slurm-translate-into-a-closed-pipe": Case(
        ("gpualloc-slurm", "translate", "--gpus", "h100:2"), EXIT_CLOSED_PIPE, closed_pipe=True
    ),
    "slurm-prolog-outside-slurm": Case(("gpualloc-slurm", "prolog"), 2, stderr="SLURM_JOB_ID"),
    "kueue-once-without-a-cluster": Case(
        ("gpualloc-kueue", "--once"), 3, stderr="no Kubernetes cluster"
    ),
    # --- issue 19: the live verbs, completion, config, a second server, the load runner's flags
    "certs-bad-server-name": Case(
        ("gpualloc", "certs", "--out", "{scratch}/pki", "--server", ":::"), 2, stderr="--server"
    ),
    "get-nodes-without-a-server": Case(
        ("gpualloc", "get", "nodes", *NOWHERE), 1, stderr="cannot reach gpualloc at 127.0.0.1:1"
    ),
    "get-nodes-into-a-closed-pipe": Case(
        ("gpualloc", "get", "nodes", "-s", SERVER), EXIT_CLOSED_PIPE, closed_pipe=True
    ),
    "get-devices-yaml-into-a-closed-pipe": Case(
        ("gpualloc", "get", "devices", "-o", "yaml", "-s", SERVER),
        EXIT_CLOSED_PIPE,
        closed_pipe=True,
    ),
    "get-an-unknown-context": Case(
        ("gpualloc", "get", "nodes", "--context", "prod"), 4, stderr='context "prod" not found'
    ),
    "get-bad-selector": Case(
        ("gpualloc", "get", "nodes", "-l", "a in (", *NOWHERE), 2, stderr="--selector"
    ),
    "describe-without-a-name": Case(("gpualloc", "describe", "node"), 2, stderr="NAME"),
    "describe-node-into-a-closed-pipe": Case(
        ("gpualloc", "describe", "node", "a100-node-1", "-s", SERVER),
        EXIT_CLOSED_PIPE,
        closed_pipe=True,
    ),
    "describe-an-unknown-node": Case(
        ("gpualloc", "describe", "node", "nope", "-s", SERVER), 4, stderr="NotFound"
    ),
    "allocate-stdin-invalid-utf8": Case(
        ("gpualloc", "allocate", "-f", "-", *NOWHERE), 2, b"\xff", stderr="not UTF-8"
    ),
    "allocate-stdin-twice": Case(
        ("gpualloc", "allocate", "-f", "-", "-f", "-", *NOWHERE), 2, stderr="only once"
    ),
    "allocate-without-a-server": Case(
        ("gpualloc", "allocate", *CLAIM, "--reserve", *NOWHERE), 1, stderr="cannot reach"
    ),
    "explain-yaml-into-a-closed-pipe": Case(
        ("gpualloc", "explain", *CLAIM, "-o", "yaml", "-s", SERVER),
        EXIT_CLOSED_PIPE,
        closed_pipe=True,
    ),
    "explain-deep-json": Case(
        ("gpualloc", "explain", "-f", "{deep_json}", *NOWHERE), 2, stderr="nested deeper"
    ),
    "capacity-bad-policy": Case(
        ("gpualloc", "capacity", *CLAIM, "--policy", "best"), 2, stderr="invalid choice"
    ),
    "commit-an-unknown-reservation": Case(
        ("gpualloc", "commit", "res-0", "-s", SERVER), 4, stderr="NotFound"
    ),
    "renew-bad-lease": Case(
        ("gpualloc", "renew", "res-0", "--lease", "soon", *NOWHERE), 2, stderr="--lease"
    ),
    "release-without-a-server": Case(
        ("gpualloc", "release", "res-0", *NOWHERE), 1, stderr="cannot reach"
    ),
    "config-file-not-yaml": Case(
        ("gpualloc", "config", "view"),
        2,
        env={"GPUALLOC_CONFIG": "{not_utf8}"},
        stderr="cannot read",
    ),
    "config-view-into-a-closed-pipe": Case(
        ("gpualloc", "config", "view"), EXIT_CLOSED_PIPE, closed_pipe=True
    ),
    "completion-into-a-closed-pipe": Case(
        ("gpualloc", "completion", "bash"), EXIT_CLOSED_PIPE, closed_pipe=True
    ),
    "completion-unknown-shell": Case(("gpualloc", "completion", "ksh"), 2),
    "apply-into-a-closed-pipe": Case(
        ("gpualloc", "apply", "-f", "examples/cluster", "--inventory", SERVER, "--dry-run"),
        EXIT_CLOSED_PIPE,
        closed_pipe=True,
    ),
    "serve-on-a-port-another-server-holds": Case(
        ("gpualloc", "serve", "--demo", "--listen", SERVER), 2
    ),
    "policy-check-of-a-missing-file": Case(
        ("gpualloc", "policy", "check", "nowhere/policy.yaml"), 2, stderr="No such file"
    ),
    "policy-check-of-an-invalid-file": Case(
        ("gpualloc", "policy", "check", "examples/deviceclasses.yaml"), 2, stderr="not valid YAML"
    ),
    "load-flag-only-without-a-host": Case(
        ("gpualloc-load", "--insecure", "--call", "grpc.health.v1.Health/Check"),
        2,
        stderr="host: required",
    ),
    "load-flag-only-into-a-closed-pipe": Case(
        (*LOAD_HEALTH, "--no-progress", SERVER), EXIT_CLOSED_PIPE, closed_pipe=True
    ),
    "load-without-a-server": Case(
        (*LOAD_HEALTH, "--connect-timeout", "1s", "127.0.0.1:1"), 2, stderr="cannot connect"
    ),
}


def test_every_console_script_has_cases() -> None:
    covered = {case.args[0] for case in CASES.values()}
    assert covered == set(SCRIPTS)


def test_every_gpualloc_subcommand_has_cases() -> None:
    covered = {case.args[1] for case in CASES.values() if case.args[0] == "gpualloc"}
    assert covered == set(SUBCOMMANDS)


@pytest.fixture(scope="module")
def busy_address() -> Iterator[str]:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    yield f"127.0.0.1:{holder.getsockname()[1]}"
    holder.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("bad-input")
    (folder / "deep.json").write_text("[" * 3000)
    (folder / "not-utf8.json").write_bytes(b"\xff\xfe{}")
    return {"deep_json": str(folder / "deep.json"), "not_utf8": str(folder / "not-utf8.json")}


def _environ(case: Case, home: Path, places: dict[str, str]) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("GPUALLOC_", "KUBE"))}
    env = {k: v.format(**places) for k, v in case.env.items()}
    return {**keep, "HOME": str(home), **env}  # no kubeconfig, no cluster, no gpualloc config


@pytest.mark.parametrize("case", [pytest.param(c, id=name) for name, c in CASES.items()])
def test_no_traceback(
    case: Case,
    busy_address: str,
    files: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    places = {"busy": busy_address, "scratch": str(tmp_path), **files}
    if any(SERVER in a for a in case.args):
        process, _ = request.getfixturevalue("served")
        listen = list(process.args)
        places["server"] = str(listen[listen.index("--listen") + 1])
    args = [a.format(**places) for a in case.args]
    command = [str(BIN / args[0]), *args[1:]]
    reader, writer = os.pipe()
    if case.closed_pipe:
        os.close(reader)
    try:
        done = subprocess.run(
            command,
            input=case.stdin,
            stdout=writer if case.closed_pipe else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=_environ(case, tmp_path, places),
            timeout=60,
        )
    finally:
        os.close(writer)
        if not case.closed_pipe:
            os.close(reader)
    stderr = done.stderr.decode(errors="replace")
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert done.returncode == case.code, stderr
    assert case.stderr in stderr
