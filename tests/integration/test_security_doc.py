"""docs/security.md's five-minute setup, run as it stands: each command of the block, in order.

`cmd &` starts a server (the test waits until it serves, over mutual TLS), `! cmd` must fail,
`export` sets variables for the commands after it; every other command must succeed. The
commands run in a scratch directory with the repository's examples/ beside them and the
virtualenv's scripts first on PATH; the only thing the test adds is a free port for the server
(GPUALLOC_LISTEN, and the clients' GPUALLOC_ALLOCATOR_ADDR / GPUALLOC_INVENTORY_ADDR).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"

pytestmark = pytest.mark.timeout(240)


def setup_commands() -> list[str]:
    text = DOC.read_text()
    block = text[text.index("<!-- setup:begin") : text.index("<!-- setup:end -->")]
    body = block.split("```sh\n", 1)[1].split("```", 1)[0]
    commands, current = [], ""
    for line in body.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


def _wait_serving(port: int, pki: Path, process: subprocess.Popen[str]) -> None:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.crt").read_bytes(),
        private_key=(pki / "ops-admin" / "tls.key").read_bytes(),
        certificate_chain=(pki / "ops-admin" / "tls.crt").read_bytes(),
    )
    deadline = time.monotonic() + 60
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="gpualloc.allocator.v1.Allocator")
        while time.monotonic() < deadline:
            assert process.poll() is None, "the server exited"
            try:
                if stub.Check(request, timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise AssertionError("the server did not serve within 60 s")


def test_the_five_minute_setup_runs_as_written(tmp_path: Path):
    commands = setup_commands()
    assert commands[0].startswith("gpualloc certs") and len(commands) >= 6
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "GPUALLOC_LOG_FORMAT": "text",
        "GPUALLOC_REDIS_URL": "",
        "GPUALLOC_LISTEN": f"127.0.0.1:{port}",
        "GPUALLOC_ALLOCATOR_ADDR": f"127.0.0.1:{port}",
        "GPUALLOC_INVENTORY_ADDR": f"127.0.0.1:{port}",
    }
    servers: list[subprocess.Popen[str]] = []
    outputs: dict[str, str] = {}
    try:
        for command in commands:
            if command.startswith("export "):
                for assignment in shlex.split(command)[1:]:
                    name, _, value = assignment.partition("=")
                    env[name] = value
                continue
            if command.endswith("&"):
                server = subprocess.Popen(
                    ["bash", "-c", f"exec {command.removesuffix('&').strip()}"],
                    cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    text=True,
                )  # fmt: skip
                servers.append(server)
                _wait_serving(port, tmp_path / "pki", server)
                continue
            expect_failure = command.startswith("! ")
            done = subprocess.run(
                ["bash", "-c", command.removeprefix("! ")],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            output = done.stdout + done.stderr
            outputs[command] = output
            assert "Traceback" not in output, output
            if expect_failure:
                assert done.returncode != 0, f"{command}\n{output}"
            else:
                assert done.returncode == 0, f"{command}\n{output}"
    finally:
        for server in servers:
            server.terminate()
            server.wait(20)
    denied = next(o for c, o in outputs.items() if c.startswith("!"))
    assert "lacks permission inventory.write" in denied
    assert any("CUDA_VISIBLE_DEVICES" in o for o in outputs.values())
    listed = outputs["gpualloc get reservations"]
    assert re.search(r"hpc/slurm/job/7\s+h100-node-1\s+Reserved\s+gpu-\d,gpu-\d", listed), listed
    described = outputs["gpualloc describe node h100-node-1"]
    assert described.count("hpc/slurm/job/7 (res-") == 2, described
