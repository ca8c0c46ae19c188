"""Every `grpcurl` and `ghz` command of README.md and docs/ runs, as written, with the real grpcurl
and ghz (built by `make peers` from their Go modules: tools/peers/) against `gpualloc serve
--demo` on a free port, in the order the page gives them.

What a command's text cannot carry here is the only thing changed: the host (127.0.0.1:50051,
10.0.0.5:50051, localhost:50051 become the test server's), a file a command writes (`-o`) goes
to a private directory, and a ghz config's 10 s duration is cut to 2 s (`-z`, which the docs say
overrides the file); docs/deploy.md's two run against a mutual-TLS server with `gpualloc
certs`'s certificates in compose-certs/ and its plaintext health port (DEPLOYED). Server streams
(WatchInventory, WatchReservations) get `-max-time`: they answer their first messages and then
DeadlineExceeded. The answer each command should get is in EXPECTED (OK unless named); a
request body real grpcurl cannot parse fails the test, which the protobuf-JSON stand-in of
test_readme.py cannot show. It found two documented commands that did not work: ghz's `--call`
(reflection could not resolve a method's own name) and grpcurl on the health-only port (no
reflection there); both servers now answer them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.peers import peer
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HOSTS = ("127.0.0.1:50051", "10.0.0.5:50051", "localhost:50051")
STREAMS = ("/WatchInventory", "/WatchReservations")
_TOOL = re.compile(r"(?:^|\|\s*)(grpcurl|ghz)\s")
_INLINE = re.compile(r"`((?:[^`|]*\|\s*)?(?:grpcurl|ghz) [^`]+)`")

# Commands whose documented answer is not OK, by id: the placeholder reservation r-5f3a9c of
# docs/api.md does not exist on a fresh server (the page shows the request's shape), and the
# page's Reserve names node-a's gpu-0 and gpu-1 after its DeleteResourceSlices removed node-a.
EXPECTED = {
    "api-Reserve": "InvalidArgument",
    "api-Commit": "NotFound",
    "api-Renew": "NotFound",
    "api-GetReservation": "NotFound",
    "api-ReportDeviceConditions": "NotFound",
    "api-WatchInventory": "DeadlineExceeded",
    "api-WatchReservations": "DeadlineExceeded",
}
# docs/deploy.md's commands address a deployment: its compose layout (mutual TLS with the
# `gpualloc certs` CA copied to compose-certs/) and its plaintext health port (8086, through a
# kubectl port-forward). They run against `deployed`: the same server with those certificates
# in a private compose-certs/ and a `--health-listen` port.
DEPLOYED = ("deploy-list", "deploy-Check")


@dataclass(frozen=True)
class DocCommand:
    page: str  # README, api, performance ...
    text: str  # the shell command as the page writes it (continuations joined)

    @property
    def tool(self) -> str:
        found = _TOOL.search(self.text)
        assert found, self.text
        return found[1]

    @property
    def what(self) -> str:
        if "--config" in self.text:
            return Path(shlex.split(self.text)[shlex.split(self.text).index("--config") + 1]).stem
        method = re.search(r"\s([\w.]+/(\w+))(?:\s|$)", self.text)
        if method:
            return method[2]
        return shlex.split(self.text, comments=True)[-1]  # `list`, `describe X` -> its last word


def _shell_commands(block: str) -> Iterator[str]:
    """The grpcurl/ghz commands of one ```sh block, their quoted and `\\` continuations joined."""
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not _TOOL.search(line):
            continue
        command = line
        while (command.count("'") % 2 or command.rstrip().endswith("\\")) and i < len(lines):
            if command.rstrip().endswith("\\"):  # a shell continuation: one line
                command = command.rstrip().removesuffix("\\") + " " + lines[i].lstrip()
            else:  # inside a quoted JSON body: the newline is the body's
                command += "\n" + lines[i]
            i += 1
        yield command


def doc_commands() -> list[DocCommand]:
    found: list[DocCommand] = []
    for path in PAGES:
        text = path.read_text()
        page = path.stem
        for block in re.findall(r"```sh\n(.*?)\n```", text, flags=re.S):
            found.extend(DocCommand(page, c) for c in _shell_commands(block))
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for inline in _INLINE.findall(prose):
            if any(h in inline for h in HOSTS):  # a command, not a mention (`grpcurl list`)
                found.append(DocCommand(page, inline))
    return found


COMMANDS = doc_commands()


def _ids(commands: list[DocCommand]) -> list[str]:
    ids: list[str] = []
    for c in commands:
        base = f"{c.page}-{c.what}".replace(".", "-")
        ids.append(base if base not in ids else f"{base}-{sum(i.startswith(base) for i in ids)}")
    return ids


IDS = _ids(COMMANDS)


def test_the_pages_have_the_commands_they_show():
    by_page = {page: sum(c.page == page for c in COMMANDS) for page in {c.page for c in COMMANDS}}
    assert by_page == {"README": 6, "api": 22, "performance": 2, "deploy": 2}, by_page
    assert len(set(IDS)) == len(IDS)


@contextlib.contextmanager
def _serving(directory: Path, flags: list[str], health_target: str) -> Iterator[None]:
    """`gpualloc serve --demo FLAGS` until it is killed; ready once `health_target` (a
    plaintext port) answers."""
    log = directory / "serve.log"
    env = {**os.environ, "GPUALLOC_LOG_FORMAT": "text", "GPUALLOC_REDIS_URL": ""}
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "serve", "--demo", *flags,
             "--web-listen", f"127.0.0.1:{free_port()}"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        with grpc.insecure_channel(health_target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 60
            while True:
                try:
                    health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    break
                except grpc.RpcError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        pytest.fail(f"gpualloc serve did not start: {log.read_text()}")
                    time.sleep(0.2)
        yield
    finally:
        process.kill()
        process.wait(10)


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    target = f"127.0.0.1:{free_port()}"
    with _serving(tmp_path_factory.mktemp("serve"), ["--listen", target], target):
        yield target


@dataclass(frozen=True)
class Deployed:
    directory: Path  # holds compose-certs/
    target: str
    health: str


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    directory = tmp_path_factory.mktemp("deployed")
    certs = directory / "compose-certs"
    subprocess.run(
        [sys.executable, "-m", "services.cli", "certs", "--out", str(certs),
         "--server", "allocator:localhost,127.0.0.1", "--client", "dev"],
        cwd=ROOT, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    port, health = free_port(), free_port()
    tls = [
        "--tls-cert",
        str(certs / "allocator" / "tls.crt"),
        "--tls-key",
        str(certs / "allocator" / "tls.key"),
        "--tls-client-ca",
        str(certs / "ca.crt"),
    ]
    with _serving(
        directory,
        ["--listen", f"127.0.0.1:{port}", *tls, "--health-listen", f"127.0.0.1:{health}"],
        f"127.0.0.1:{health}",
    ):
        yield Deployed(directory, f"localhost:{port}", f"localhost:{health}")  # fmt: skip


def _as_run_here(command: DocCommand, target: str, scratch: Path) -> str:
    text = command.text
    for host in HOSTS:
        text = text.replace(host, target)
    if command.tool == "grpcurl" and any(s in text for s in STREAMS):
        text = text.replace("grpcurl ", "grpcurl -max-time 3 ", 1)
    if command.tool == "ghz" and "--config" in text:
        text = re.sub(r"(-o\s+)(\S+)", lambda m: f"{m[1]}{scratch / m[2]}", text)
        text = text.split("#")[0].rstrip() + " -z 2s"
        if target not in text:
            text += f" {target}"  # the config's host is 127.0.0.1:50051; a host argument wins
    return text


def _grpc_code(output: str) -> str:
    found = re.search(r"Code: (\w+)", output)
    return found[1] if found else "OK"


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_each_command_runs_with_the_real_tool(command, demo_server, tmp_path, request):
    key = request.node.callspec.id
    tools = {"grpcurl": peer("grpcurl"), "ghz": peer("ghz")}
    shutil.copy(ROOT / "examples" / "cluster" / "h100-node-1.yaml", tmp_path / "slices.yaml")
    text = _as_run_here(command, demo_server, tmp_path)
    cwd = tmp_path if "slices.yaml" in text else ROOT  # ghz's data files are repo-relative
    if key in DEPLOYED:
        where: Deployed = request.getfixturevalue("deployed")
        text = command.text.replace("localhost:50051", where.target)
        text = text.replace("localhost:8086", where.health)
        cwd = where.directory
    env = {**os.environ, "PATH": f"{tools['grpcurl'].parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", text],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    if command.tool == "ghz":
        assert done.returncode == 0, output
        assert re.search(r"\[OK\]\s+\d+ responses", output) or "-o" in text, output
        return
    code = _grpc_code(output)
    assert code == EXPECTED.get(key, "OK"), f"{text}\n{output}"
    assert done.returncode in (0, 64 + _CODES[code]), output  # grpcurl: 64 + the status code
    if key.endswith(("WatchInventory", "WatchReservations")):
        assert output.lstrip().startswith("{"), output  # the stream's first message came


_CODES = {"OK": 0, "InvalidArgument": 3, "NotFound": 5, "DeadlineExceeded": 4}
