"""examples/README.md keeps its promises: every command of its "Using them" block runs as shown,
in order (later ones read what earlier ones wrote under /tmp, here a private directory): the
offline ones with the exit code the text gives, `apply` against a real inventory server on
port 0. Commands that the text says are refused are refused."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from protos.inventory.v1 import inventory_pb2, inventory_pb2_grpc
from services.inventory.bootstrap import build_inventory

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "examples" / "README.md").read_text()


@dataclass(frozen=True)
class Command:
    args: tuple[str, ...]  # after `gpualloc`
    redirect: str | None  # `> FILE`

    @property
    def id(self) -> str:
        files = [a for i, a in enumerate(self.args) if i and self.args[i - 1] == "-f"]
        parts = [self.args[0], Path(files[-1]).stem if files else "", *self.flags()]
        return "-".join(p for p in parts if p).replace(".", "-")

    def flags(self) -> list[str]:
        wanted = ("--gang", "--emit", "-o")
        return [a.lstrip("-") for a in self.args if a in wanted]


def _commands() -> list[Command]:
    section = README[README.index("## Using them") :]
    block = section[section.index("```sh\n") + 6 : section.index("\n```", section.index("```sh"))]
    joined = re.sub(r"\\\n\s*", " ", block)
    commands = []
    for line in joined.splitlines():
        if not line.startswith("gpualloc "):
            continue
        words = shlex.split(line)[1:]
        redirect = None
        if ">" in words:
            redirect = words[words.index(">") + 1]
            words = words[: words.index(">")]
        commands.append(Command(tuple(words), redirect))
    return commands


COMMANDS = _commands()
OFFLINE = [c for c in COMMANDS if c.args[0] != "apply"]
EXPECTED_EXIT = {"solve-sixteen-h100-one-node": 3}  # "explains itself (exit 3)"


def test_the_block_has_the_commands_the_text_describes():
    ids = [c.id for c in COMMANDS]
    assert len(ids) == len(set(ids)), ids
    assert {c.args[0] for c in COMMANDS} == {"solve", "inventory", "apply"}
    assert "--explain" not in README  # not a flag of solve: an unsatisfiable solve explains


def _run(args: tuple[str, ...], tmp: Path, redirect: str | None = None) -> tuple[int, str, str]:
    args = tuple(a.replace("/tmp/", f"{tmp}/") for a in args)
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if redirect is not None:
        Path(redirect.replace("/tmp/", f"{tmp}/")).write_text(done.stdout)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def offline_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[int, str, str]]]:
    tmp = tmp_path_factory.mktemp("examples-readme")
    yield {c.id: _run(c.args, tmp, c.redirect) for c in OFFLINE}


@pytest.mark.parametrize("command", OFFLINE, ids=[c.id for c in OFFLINE])
def test_each_offline_command_runs_with_the_exit_code_the_text_gives(offline_runs, command):
    code, out, err = offline_runs[command.id]
    assert code == EXPECTED_EXIT.get(command.id, 0), err
    assert out
    if code == 3:
        assert out.startswith("UNSATISFIABLE")


def test_the_replayed_state_moves_the_next_claim_to_the_other_h100_node(offline_runs):
    _, out, _ = offline_runs["solve-eight-h100"]
    assert out.startswith("ALLOCATED on node h100-node-2")


def test_apply_loads_the_cluster_into_a_real_inventory(grpc_channel_factory, tmp_path):
    [apply] = [c for c in COMMANDS if c.args[0] == "apply"]
    app = build_inventory()
    served = grpc_channel_factory([app.registration])
    try:
        args = tuple(served.target if a == "localhost:50052" else a for a in apply.args)
        code, out, err = _run(args, tmp_path)
        assert code == 0, err
        assert out.count("resourceslice/") == 7
        stub = inventory_pb2_grpc.InventoryStub(served.channel)
        nodes = stub.GetInventory(inventory_pb2.GetInventoryRequest()).inventory.nodes
        assert sorted(n.node.name for n in nodes) == [
            "a100-node-1",
            "h100-node-1",
            "h100-node-2",
            "l40s-node-1",
        ]

        code, out, err = _run(("apply", "-f", "examples/deviceclasses.yaml", *args[-2:]), tmp_path)
        assert (code, out) == (2, "")  # "is refused (exit 2, naming the file and line)"
        assert "examples/deviceclasses.yaml:10: " in err
        assert "GPUALLOC_DEVICE_CLASSES" in err
    finally:
        app.service.close()
