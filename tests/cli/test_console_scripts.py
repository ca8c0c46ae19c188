"""Every console script of pyproject.toml, run for real, under bad input and a closed pipe: a
message and an exit code, never a Python traceback (issue 15).

A closed pipe is a pipe whose reading end is closed before the command starts, so its first
write fails as `gpualloc solve ... | head -1` does; services/common/console.py answers 141.
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

from services.common.console import EXIT_CLOSED_PIPE

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
SOLVE = ("-f", "examples/cluster", "-f", "examples/deviceclasses.yaml")
CLAIM = ("-f", "examples/claims/one-h100.yaml")
XML = "tests/data/nvidia-smi-xml/2x-rtx-a5000_drv590.44.01_telegraf.xml"
BUSY = "{busy}"  # replaced by the address of a port some socket already holds


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
}


def test_every_console_script_has_cases() -> None:
    covered = {case.args[0] for case in CASES.values()}
    assert covered == set(SCRIPTS)


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


def _environ(case: Case, home: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("GPUALLOC_", "KUBE"))}
    return {**keep, "HOME": str(home), **case.env}  # no kubeconfig, no cluster


@pytest.mark.parametrize("case", [pytest.param(c, id=name) for name, c in CASES.items()])
def test_no_traceback(case: Case, busy_address: str, files: dict[str, str], tmp_path: Path) -> None:
    args = [a.format(busy=busy_address, **files) for a in case.args]
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
            env=_environ(case, tmp_path),
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
