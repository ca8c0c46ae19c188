"""Real Redis Cluster and Sentinel groups on free loopback ports, for the fixtures in conftest.

- `RedisClusterGroup`: 6 `redis-server --cluster-enabled yes` (3 primaries + 3 replicas) joined by
  `redis-cli --cluster create … --cluster-replicas 1`; URL `redis+cluster://h:p,h:p,…`.
  With `tls=RedisTls.create(dir)` the nodes speak TLS only (clients, cluster bus and
  replication) with a private CA and require client certificates; URL
  `rediss+cluster://h:p,…?ssl_ca_certs=…&ssl_certfile=…&ssl_keyfile=…`.
- `SentinelGroup`: a primary, a replica and 3 `redis-server --sentinel` (quorum 2); URL
  `redis+sentinel://h:p,h:p,h:p/<service>/0`.

Timeouts are short (node timeout 1 s, Sentinel down-after 1 s) so that a failover in a test takes
a few seconds. Every process lives in the test's temporary directory and is killed at the end.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import redis

from services.common.security.devcerts import CertificateAuthority, write_certificate
from tests.conftest import RedisServer, redis_binary
from tests.ports import free_port

__all__ = [
    "SENTINEL_SERVICE",
    "RedisClusterGroup",
    "RedisTls",
    "SentinelGroup",
    "SentinelProcess",
    "start_cluster",
    "start_sentinel_group",
]

SENTINEL_SERVICE = "gpualloc"
_READY_TIMEOUT_S = 30.0
CLUSTER_NODE_TIMEOUT_MS = 1000
SENTINEL_DOWN_AFTER_MS = 1000


def _wait_for(what: str, ready: Callable[[], bool], timeout: float = _READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            pass
        time.sleep(0.05)
    pytest.fail(f"{what}: not ready within {timeout:g}s", pytrace=False)


def _client(host: str, port: int, tls: RedisTls | None = None) -> redis.Redis:
    secure = tls.client_options() if tls else {}
    return redis.Redis(host=host, port=port, socket_timeout=1.0, decode_responses=True, **secure)


# --- TLS --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RedisTls:
    """A private CA and one certificate (server and client usage, 127.0.0.1) that every node
    serves and presents to its peers, and clients present to the nodes."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def create(cls, directory: Path) -> RedisTls:
        authority = CertificateAuthority.create()
        authority.save(directory)
        leaf = authority.issue("redis", dns_names=("localhost",), ip_addresses=("127.0.0.1",))
        files = write_certificate(directory / "redis", leaf)
        return cls(directory / "ca.crt", files / "tls.crt", files / "tls.key")

    def server_args(self) -> tuple[str, ...]:
        return (
            "--tls-cert-file", str(self.cert),
            "--tls-key-file", str(self.key),
            "--tls-ca-cert-file", str(self.ca),
            "--tls-auth-clients", "yes",
            "--tls-cluster", "yes",
            "--tls-replication", "yes",
        )  # fmt: skip

    def client_options(self) -> dict[str, Any]:
        return {
            "ssl": True,
            "ssl_ca_certs": str(self.ca),
            "ssl_certfile": str(self.cert),
            "ssl_keyfile": str(self.key),
        }

    def query(self) -> str:
        """The URL query that carries client_options (as a `rediss://` URL does)."""
        options = self.client_options()
        return urlencode({k: v for k, v in options.items() if k != "ssl"})

    def cli_args(self) -> tuple[str, ...]:
        return ("--tls", "--cacert", str(self.ca), "--cert", str(self.cert), "--key", str(self.key))


@dataclass
class TlsRedisServer(RedisServer):
    """A redis-server whose port is its TLS port (the plaintext one is off)."""

    tls: RedisTls | None = None

    def command(self) -> list[str]:
        assert self.tls is not None
        command = super().command()
        at = command.index("--port")
        command[at : at + 2] = ["--port", "0", "--tls-port", str(self.port)]
        return [*command, *self.tls.server_args()]

    def ping(self) -> bool:
        try:
            with _client(self.host, self.port, self.tls) as client:
                return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            return False

    def client(self) -> redis.Redis:
        return _client(self.host, self.port, self.tls)


# --- Cluster ----------------------------------------------------------------------------------


@dataclass
class RedisClusterGroup:
    """A started 3+3 cluster; `servers[i]` may be stopped/killed/restarted by a test."""

    servers: list[RedisServer]
    tls: RedisTls | None = None

    @property
    def url(self) -> str:
        nodes = ",".join(f"{s.host}:{s.port}" for s in self.servers)
        if self.tls is None:
            return f"redis+cluster://{nodes}"
        return f"rediss+cluster://{nodes}?{self.tls.query()}"

    def primaries(self) -> list[RedisServer]:
        """The servers that are primaries now (asked of each running server)."""
        found = []
        for server in self.servers:
            if not server.running:
                continue
            with _client(server.host, server.port, self.tls) as client:
                role = client.execute_command("ROLE")
            if role[0] == "master":
                found.append(server)
        return found

    def state_ok(self) -> bool:
        """Every running node reports cluster_state:ok and sees 3 primaries with slots."""
        for server in self.servers:
            if not server.running:
                continue
            with _client(server.host, server.port, self.tls) as client:
                info = client.cluster("INFO")
            if info.get("cluster_state") != "ok":
                return False
        return len(self.primaries()) == 3

    def wait_ok(self, timeout: float = _READY_TIMEOUT_S) -> None:
        _wait_for("redis cluster state ok", self.state_ok, timeout)

    def flush(self) -> None:
        """FLUSHALL and FUNCTION FLUSH on every primary (replicas follow)."""
        for server in self.primaries():
            with _client(server.host, server.port, self.tls) as client:
                client.flushall()
                client.function_flush()

    def stop(self) -> None:
        for server in self.servers:
            server.stop(kill=True)


def start_cluster(
    base: Path, *, extra_args: Sequence[str] = (), tls: RedisTls | None = None
) -> RedisClusterGroup:
    binary = redis_binary()
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.fail("redis-cli not found on PATH (Debian package redis-tools)", pytrace=False)
    servers = []
    try:
        for index in range(6):
            args = (
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS),
                "--cluster-port", str(free_port()),  # the default, port + 10000, may be > 65535
                *extra_args,
            )  # fmt: skip
            directory = base / f"cluster-{index}"
            server = (
                RedisServer(binary, free_port(), directory, False, args)
                if tls is None
                else TlsRedisServer(binary, free_port(), directory, False, args, tls=tls)
            )
            server.start()
            servers.append(server)
        create = [cli, *(tls.cli_args() if tls else ())]
        create += ["--cluster", "create", *(f"{s.host}:{s.port}" for s in servers)]
        create += ["--cluster-replicas", "1", "--cluster-yes"]
        done = subprocess.run(create, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            pytest.fail(f"redis-cli --cluster create failed:\n{done.stdout}{done.stderr}")
        group = RedisClusterGroup(servers, tls)
        group.wait_ok()
        _wait_for("cluster replicas in sync", lambda: _replicas_synced(servers, tls))
        return group
    except BaseException:
        for server in servers:
            server.stop(kill=True)
        raise


def _replicas_synced(servers: Sequence[RedisServer], tls: RedisTls | None = None) -> bool:
    synced = 0
    for server in servers:
        with _client(server.host, server.port, tls) as client:
            role = client.execute_command("ROLE")
        if role[0] == "slave" and role[3] == "connected":
            synced += 1
    return synced == 3


# --- Sentinel ---------------------------------------------------------------------------------


@dataclass
class SentinelProcess(RedisServer):
    """A `redis-server <conf> --sentinel`, monitoring `SENTINEL_SERVICE` with quorum 2."""

    monitored: tuple[str, int] = ("127.0.0.1", 0)

    @property
    def log_path(self) -> Path:
        return self.directory / "sentinel.log"

    def command(self) -> list[str]:
        conf = self.directory / "sentinel.conf"
        if not conf.exists():  # Sentinel rewrites its file: keep it across restarts
            host, port = self.monitored
            conf.write_text(
                f"port {self.port}\nbind {self.host}\ndir {self.directory}\n"
                f"sentinel monitor {SENTINEL_SERVICE} {host} {port} 2\n"
                f"sentinel down-after-milliseconds {SENTINEL_SERVICE} {SENTINEL_DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SENTINEL_SERVICE} 10000\n"
                f"sentinel parallel-syncs {SENTINEL_SERVICE} 1\n"
            )
        return [self.binary, str(conf), "--sentinel"]


@dataclass
class SentinelGroup:
    """Data servers (`data[0]` the first primary, `data[1]` its replica) and 3 Sentinels."""

    data: list[RedisServer]
    sentinels: list[SentinelProcess]

    @property
    def url(self) -> str:
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SENTINEL_SERVICE}/0"

    def primary_address(self) -> tuple[str, int] | None:
        """What a running Sentinel says the primary is."""
        for sentinel in self.sentinels:
            if not sentinel.running:
                continue
            with _client(sentinel.host, sentinel.port) as client:
                found = client.execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_SERVICE
                )
            if found:
                return str(found[0]), int(found[1])
        return None

    def primary(self) -> RedisServer:
        address = self.primary_address()
        for server in self.data:
            if address == (server.host, server.port):
                return server
        raise AssertionError(f"no data server at {address}")

    def ready(self) -> bool:
        """The Sentinels agree on a running primary that has every other running data server
        connected as a replica, and each Sentinel knows the other two."""
        address = self.primary_address()
        primary = next((s for s in self.data if (s.host, s.port) == address), None)
        if primary is None or not primary.running:
            return False
        with _client(primary.host, primary.port) as client:
            role = client.execute_command("ROLE")
        replicas = sum(1 for s in self.data if s.running) - 1
        if role[0] != "master" or len(role[2]) < replicas:
            return False
        for sentinel in self.sentinels:
            with _client(sentinel.host, sentinel.port) as client:
                fields = client.sentinel_master(SENTINEL_SERVICE)
            if int(fields["num-other-sentinels"]) < 2 or (fields["ip"], int(fields["port"])) != (
                primary.host,
                primary.port,
            ):
                return False
        return True

    def wait_ready(self, timeout: float = _READY_TIMEOUT_S) -> None:
        _wait_for("sentinel group ready", self.ready, timeout)

    def flush(self) -> None:
        primary = self.primary()
        with _client(primary.host, primary.port) as client:
            client.flushall()
            client.function_flush()

    def stop(self) -> None:
        for process in [*self.sentinels, *self.data]:
            process.stop(kill=True)


def start_sentinel_group(
    base: Path, *, replicas: int = 1, extra_args: Sequence[str] = ()
) -> SentinelGroup:
    binary = redis_binary()
    data: list[RedisServer] = []
    sentinels: list[SentinelProcess] = []
    try:
        primary = RedisServer(binary, free_port(), base / "data-0", False, tuple(extra_args))
        primary.start()
        data.append(primary)
        for index in range(1, replicas + 1):
            args = (*extra_args, "--replicaof", primary.host, str(primary.port))
            replica = RedisServer(binary, free_port(), base / f"data-{index}", False, args)
            replica.start()
            data.append(replica)
        for index in range(3):
            sentinel = SentinelProcess(
                binary,
                free_port(),
                base / f"sentinel-{index}",
                monitored=(primary.host, primary.port),
            )
            sentinel.start()
            sentinels.append(sentinel)
        group = SentinelGroup(data, sentinels)
        group.wait_ready()
        return group
    except BaseException:
        for process in [*sentinels, *data]:
            process.stop(kill=True)
        raise
