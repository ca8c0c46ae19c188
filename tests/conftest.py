"""Shared fixtures: a real redis-server, and real gRPC servers on port 0 with their channels.

Redis is never faked or skipped: tests that need it start the actual `redis-server` binary on a
free port in a temporary directory. If the binary is missing the tests FAIL, because a green run
that silently skipped the store tests would be a lie. Tests that use a Redis fixture get the
`redis` marker automatically, so `pytest -m "not redis"` deselects them on purpose.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
import redis
from hypothesis import HealthCheck, settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from services.common.config import ServerSettings
from services.common.grpc_server import ServiceRegistration, create_server
from services.common.health import Health
from tests.ports import free_port

pytest_plugins = ("tests.tls_fixtures",)  # `pki` and `tls_server`: real certificates and TLS

# Property tests judge generated inputs, not speed: on a shared 2-core machine input generation
# can be slow (HealthCheck.too_slow) and one example can take longer than Hypothesis' default
# 200 ms deadline while the suite's other servers run. Example counts stay as each test sets.
settings.register_profile("gpualloc", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gpualloc")

if TYPE_CHECKING:
    from tests.redis_topologies import RedisClusterGroup, SentinelGroup

REDIS_MISSING = (
    "redis-server not found on PATH: install it (apt-get install redis-server) — .ci/run does this"
)
_REDIS_FIXTURES = frozenset(
    {
        "redis_server",
        "redis_url",
        "redis_server_factory",
        "redis_cluster",
        "redis_cluster_url",
        "redis_sentinel",
        "redis_sentinel_url",
        "redis_topology_factory",
    }
)
_START_TIMEOUT_SECONDS = 10.0
_STOP_TIMEOUT_SECONDS = 10.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _REDIS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.redis)


# --- Redis ------------------------------------------------------------------------------------


@dataclass
class RedisServer:
    """One redis-server process; `stop()` and `start()` again keep the port and the directory.

    With `appendonly=True` the data survives a stop (even `stop(kill=True)`, up to the fsync
    policy: pass `extra_args=("--appendfsync", "always")` to lose nothing).
    """

    binary: str
    port: int
    directory: Path
    appendonly: bool = False
    extra_args: tuple[str, ...] = ()
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path:
        return self.directory / "redis-server.log"

    def command(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--dir", str(self.directory),
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> None:
        """Start (or restart) and wait until PING answers; fails the test if it cannot."""
        if self.running:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + _START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if not self.running:
                self._process = None
                pytest.fail(f"redis-server exited at start:\n{self.log_tail()}", pytrace=False)
            if self.ping():
                return
            time.sleep(0.02)
        self.stop(kill=True)
        pytest.fail(
            f"redis-server on port {self.port} did not answer PING within "
            f"{_START_TIMEOUT_SECONDS:g}s:\n{self.log_tail()}",
            pytrace=False,
        )

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (a clean shutdown, AOF flushed) or, with `kill`, SIGKILL (a crash)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout=_STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def ping(self) -> bool:
        try:
            with redis.Redis(
                host=self.host,
                port=self.port,
                socket_timeout=0.5,
                socket_connect_timeout=0.5,
                retry=Retry(NoBackoff(), 0),  # one try: the caller polls
            ) as client:
                return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            return False

    def client(self) -> redis.Redis:
        """A new client with decoded strings; close it (or use `with`)."""
        return redis.Redis.from_url(self.url, decode_responses=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(REDIS_MISSING, pytrace=False)
    return binary


def _start_redis(
    directory: Path, *, appendonly: bool = False, extra_args: Sequence[str] = ()
) -> RedisServer:
    """A started server on a free port; retries with another port if one was taken meanwhile
    (another process may grab the free port between the probe and redis-server's bind)."""
    binary = redis_binary()
    attempts = 3
    for attempt in range(1, attempts + 1):
        server = RedisServer(binary, free_port(), directory, appendonly, tuple(extra_args))
        try:
            server.start()
        except pytest.fail.Exception:
            port_taken = "Address already in use" in server.log_tail()
            if attempt == attempts or not port_taken:
                raise
            continue
        return server
    raise AssertionError("unreachable")


class RedisServerFactory:
    """Starts private redis-servers (e.g. with AOF) that a test may stop, kill and restart."""

    def __init__(self, base: Path) -> None:
        self._base = base
        self._servers: list[RedisServer] = []

    def __call__(self, *, appendonly: bool = False, extra_args: Sequence[str] = ()) -> RedisServer:
        directory = self._base / f"redis-{len(self._servers)}"
        server = _start_redis(directory, appendonly=appendonly, extra_args=extra_args)
        self._servers.append(server)
        return server

    def close(self) -> None:
        for server in self._servers:
            server.stop(kill=True)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """The shared redis-server of the whole run (no persistence)."""
    server = _start_redis(tmp_path_factory.mktemp("redis-session"))
    try:
        yield server
    finally:
        server.stop(kill=True)


@pytest.fixture
def redis_server_factory(tmp_path: Path) -> Iterator[RedisServerFactory]:
    """`redis_server_factory(appendonly=True)`: a private server, killed when the test ends."""
    factory = RedisServerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the shared server, emptied (FLUSHALL) before the test; restarted if it was stopped."""
    redis_server.start()
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
    return redis_server.url


class RedisTopologyFactory:
    """Private clusters and Sentinel groups that a test may break (kill a primary, ...)."""

    def __init__(self, base: Path) -> None:
        self._base = base
        self._groups: list[RedisClusterGroup | SentinelGroup] = []

    def cluster(self, *, extra_args: Sequence[str] = ()) -> RedisClusterGroup:
        from tests.redis_topologies import start_cluster

        group = start_cluster(self._base / f"cluster-{len(self._groups)}", extra_args=extra_args)
        self._groups.append(group)
        return group

    def sentinel(self, *, replicas: int = 1, extra_args: Sequence[str] = ()) -> SentinelGroup:
        from tests.redis_topologies import start_sentinel_group

        directory = self._base / f"sentinel-{len(self._groups)}"
        group = start_sentinel_group(directory, replicas=replicas, extra_args=extra_args)
        self._groups.append(group)
        return group

    def close(self) -> None:
        for group in self._groups:
            group.stop()


@pytest.fixture
def redis_topology_factory(tmp_path: Path) -> Iterator[RedisTopologyFactory]:
    factory = RedisTopologyFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterGroup]:
    """The shared 3-primary + 3-replica Redis Cluster of the whole run."""
    from tests.redis_topologies import start_cluster

    group = start_cluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield group
    finally:
        group.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisClusterGroup) -> str:
    """`redis+cluster://…` of the shared cluster, emptied (data and functions) before the test."""
    redis_cluster.wait_ok()
    redis_cluster.flush()
    return redis_cluster.url


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    """The shared Sentinel group (primary, replica, 3 Sentinels) of the whole run."""
    from tests.redis_topologies import start_sentinel_group

    group = start_sentinel_group(tmp_path_factory.mktemp("redis-sentinel"))
    try:
        yield group
    finally:
        group.stop()


@pytest.fixture
def redis_sentinel_url(redis_sentinel: SentinelGroup) -> str:
    """`redis+sentinel://…/gpualloc/0` of the shared group, emptied before the test."""
    redis_sentinel.wait_ready()
    redis_sentinel.flush()
    return redis_sentinel.url


# --- gRPC -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServedGrpc:
    """A started server on 127.0.0.1:<port>, its health, and a channel to it."""

    server: grpc.Server
    port: int
    health: Health
    channel: grpc.Channel

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def unary(self, method: str) -> grpc.UnaryUnaryMultiCallable[bytes, bytes]:
        """A bytes-in, bytes-out callable for `/package.Service/Method` (generic test services)."""
        callable_: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self.channel.unary_unary(method)
        return callable_

    def unary_stream(self, method: str) -> grpc.UnaryStreamMultiCallable[bytes, bytes]:
        callable_: grpc.UnaryStreamMultiCallable[bytes, bytes] = self.channel.unary_stream(method)
        return callable_


class GrpcChannelFactory:
    """Starts servers (`create_server` on port 0) and opens channels; closes all at the end."""

    def __init__(self) -> None:
        self._servers: list[grpc.Server] = []
        self._channels: list[grpc.Channel] = []

    def __call__(
        self,
        services: Sequence[ServiceRegistration],
        settings: ServerSettings | None = None,
        *,
        health: Health | None = None,
        interceptors: Sequence[grpc.ServerInterceptor] = (),
    ) -> ServedGrpc:
        health = Health() if health is None else health
        server, port = create_server(
            "127.0.0.1:0",
            services,
            ServerSettings() if settings is None else settings,
            health=health,
            interceptors=interceptors,
        )
        self.adopt(server)
        server.start()
        return ServedGrpc(server, port, health, self.channel(f"127.0.0.1:{port}"))

    def channel(self, target: str, options: Sequence[tuple[str, int | str]] = ()) -> grpc.Channel:
        """Another channel (e.g. to a server built elsewhere), closed at the end of the test."""
        channel = grpc.insecure_channel(target, options=list(options))
        self._channels.append(channel)
        return channel

    def adopt(self, server: grpc.Server) -> grpc.Server:
        """Stop this server at the end of the test too."""
        self._servers.append(server)
        return server

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        for server in self._servers:
            server.stop(None).wait()


@pytest.fixture
def grpc_channel_factory() -> Iterator[GrpcChannelFactory]:
    factory = GrpcChannelFactory()
    try:
        yield factory
    finally:
        factory.close()
