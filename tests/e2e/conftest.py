"""End-to-end fixtures: allocator processes (`python -m services.allocator`) on real ports."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from protos.allocator.v1 import allocator_pb2_grpc
from tests.e2e.allocator_harness import (
    CLUSTER,
    start_allocator_process,
    wait_serving,
)
from tests.ports import free_port


@dataclass
class AllocatorProcess:
    """One `gpualloc-allocator` command (a supervisor when --workers > 1)."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    channels: list[grpc.Channel] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stub(self) -> allocator_pb2_grpc.AllocatorStub:
        """A stub on a new channel (a new connection: with workers, maybe another one)."""
        # A private subchannel pool: otherwise channels to one target share one connection.
        channel = grpc.insecure_channel(self.target, [("grpc.use_local_subchannel_pool", 1)])
        self.channels.append(channel)
        return allocator_pb2_grpc.AllocatorStub(channel)

    def children(self) -> list[int]:
        path = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(pid) for pid in path.read_text().split()]

    def kill(self) -> None:
        """SIGKILL: no shutdown, no lease release (a supervisor's workers die with it)."""
        for pid in [*self.children(), self.process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        for channel in self.channels:
            channel.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class AllocatorProcesses:
    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._started: list[AllocatorProcess] = []

    def __call__(
        self,
        redis_url: str,
        *,
        workers: int = 1,
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> AllocatorProcess:
        port = free_port()
        log = self._directory / f"allocator-{len(self._started)}.log"
        args = [
            "--seed", str(CLUSTER),
            "--listen", f"127.0.0.1:{port}",
            "--redis-url", redis_url,
            "--workers", str(workers),
            *extra,
        ]  # fmt: skip
        started = AllocatorProcess(start_allocator_process(args, log, env), port, log)
        self._started.append(started)
        try:
            wait_serving(started.target)
        except AssertionError:
            pytest.fail(f"allocator did not start:\n{started.log_tail()}", pytrace=False)
        return started

    def close(self) -> None:
        for started in self._started:
            started.stop()


@pytest.fixture
def allocator_processes(tmp_path: Path) -> Iterator[AllocatorProcesses]:
    made = AllocatorProcesses(tmp_path)
    try:
        yield made
    finally:
        made.close()
