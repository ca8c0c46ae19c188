"""One Redis client for a URL, whatever the layout: standalone, Sentinel or Cluster.

Schemes (`s` after `redis` = TLS, as for plain redis-py URLs):

- `redis://[user:password@]host:port/db`, `rediss://…`, `unix://…`: one server (redis-py
  `from_url`, query parameters included).
- `redis+sentinel://[user:password@]host:port[,host:port…]/service[/db]` (`rediss+sentinel`):
  the Sentinels to ask for the primary of `service`; the client follows failovers (each new
  connection asks the Sentinels again; READONLY from a demoted primary reconnects). The
  user/password are those of the data nodes; Sentinels are asked without AUTH unless the query
  has `sentinel_password=…` (and `sentinel_username=…`).
- `redis+cluster://[user:password@]host:port[,host:port…]` (`rediss+cluster`): Redis Cluster
  seed nodes; redis-py's cluster client routes by slot, follows MOVED/ASK and refreshes the
  topology. A cluster has one database: no `/db`.
- With TLS (`rediss+cluster`, `rediss+sentinel`) the query's `ssl_*` options
  (`?ssl_ca_certs=ca.pem&ssl_certfile=client.pem&ssl_keyfile=client.key`) reach every data
  node's connection, as `from_url` passes them for `rediss://` (not the Sentinels').

`RedisClient` is what every gpualloc adapter takes: `redis.Redis` or `redis.RedisCluster`.
`primaries(client)` lists plain clients for every primary (function loading, WAIT on the right
node); `UNAVAILABLE_ERRORS` are the exceptions that mean "the store cannot answer now".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import redis
from redis._parsers import CommandsParser
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import parse_url
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MasterDownError,
    MovedError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    TryAgainError,
)
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from services.common.errors import InvalidArgument, Unavailable

__all__ = [
    "CLUSTER_SCHEMES",
    "SENTINEL_SCHEMES",
    "UNAVAILABLE_ERRORS",
    "RedisClient",
    "StoreLayout",
    "connect",
    "is_cluster",
    "parse_layout",
    "wait_milliseconds",
]

RedisClient = redis.Redis | RedisCluster

SENTINEL_SCHEMES = frozenset({"redis+sentinel", "rediss+sentinel"})
CLUSTER_SCHEMES = frozenset({"redis+cluster", "rediss+cluster"})

UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,  # includes BusyLoadingError, AuthenticationError
    redis.TimeoutError,
    ReadOnlyError,  # a replica promoted away from us (Sentinel reconnects on the next call)
    OutOfMemoryError,  # maxmemory reached: the write was refused, nothing changed
    MasterDownError,  # a replica that lost its primary
    MasterNotFoundError,  # no Sentinel knows a primary (a failover in progress)
    ClusterDownError,
    TryAgainError,  # a multi-key step during resharding of its slot
    MovedError,  # a plain client pointed at one cluster node, or redirections exhausted
    AskError,
    ClusterError,  # the cluster client ran out of redirections
    RedisClusterException,  # no reachable seed node, slot not covered
)


@dataclass(frozen=True)
class StoreLayout:
    """What a URL asks for: `kind` standalone | sentinel | cluster, and its parts."""

    kind: str
    url: str
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    options: tuple[tuple[str, str], ...] = ()


def parse_layout(url: str) -> StoreLayout:
    """Parse a store URL; InvalidArgument (field `redis_url`) names what is wrong."""
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme not in SENTINEL_SCHEMES | CLUSTER_SCHEMES:
        return StoreLayout("standalone", url)
    parts = urlsplit("redis://" + rest)
    netloc = parts.netloc
    credentials, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = credentials.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    nodes = tuple(_host_port(item, url) for item in hosts.split(",") if item)
    if not nodes:
        raise InvalidArgument.at("redis_url", f"{_redact(url)}: no host:port")
    options = tuple((k, v[-1]) for k, v in parse_qs(parts.query).items())
    path = [p for p in parts.path.split("/") if p]
    tls = scheme.startswith("rediss")
    if scheme in CLUSTER_SCHEMES:
        if path:
            raise InvalidArgument.at(
                "redis_url", f"{_redact(url)}: a cluster has one database, drop /{path[0]}"
            )
        return StoreLayout("cluster", url, nodes, "", 0, username, password, tls, options)
    if not path or len(path) > 2:
        raise InvalidArgument.at(
            "redis_url", f"{_redact(url)}: expected /<service name>[/<db>] after the Sentinels"
        )
    db = 0
    if len(path) == 2:
        if not path[1].isdigit():
            raise InvalidArgument.at("redis_url", f"{_redact(url)}: db {path[1]!r} not a number")
        db = int(path[1])
    return StoreLayout(
        "sentinel", url, nodes, unquote(path[0]), db, username, password, tls, options
    )


def connect(
    url: str,
    *,
    socket_timeout: float,
    socket_connect_timeout: float | None = None,
    max_connections: int | None = None,
    health_check_interval: int = 30,
    decode_responses: bool = True,
) -> RedisClient:
    """A client for `url` with the library's own retries off (callers retry what is safe)."""
    layout = parse_layout(url)
    common: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_connect_timeout or socket_timeout,
        "health_check_interval": health_check_interval,
        "decode_responses": decode_responses,
        "retry": Retry(NoBackoff(), 0),
    }
    if layout.kind == "standalone":
        return redis.Redis.from_url(url, max_connections=max_connections, **common)
    auth: dict[str, Any] = {"username": layout.username, "password": layout.password}
    if layout.tls:
        auth |= {"ssl": True, **_ssl_options(layout)}
    if layout.kind == "cluster":
        # Construction asks a node for the command table: retried (over other nodes) so that a
        # client can start while a primary is down; afterwards the cluster client's own retry
        # loop (connection errors, CLUSTERDOWN) is off, MOVED/ASK/TRYAGAIN are still followed.
        common["retry"] = Retry(ExponentialBackoff(cap=1.0, base=0.05), 8)
        try:
            cluster = RedisCluster(
                startup_nodes=[ClusterNode(h, p) for h, p in layout.nodes],  # type: ignore[no-untyped-call]
                max_connections=max_connections or 2**31,
                **auth,
                **common,
            )
        except UNAVAILABLE_ERRORS as error:
            raise Unavailable(f"redis cluster {_redact(url)}: {error}") from error
        cluster.set_retry(Retry(NoBackoff(), 0))
        cluster.commands_parser.__class__ = _FcallKeysParser
        return cluster
    options = dict(layout.options)
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_connect_timeout or socket_timeout,
    }
    if "sentinel_password" in options:
        sentinel_kwargs["password"] = options["sentinel_password"]
        sentinel_kwargs["username"] = options.get("sentinel_username")
    sentinel = Sentinel(list(layout.nodes), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        layout.service, db=layout.db, max_connections=max_connections, **auth, **common
    )
    return client


def _ssl_options(layout: StoreLayout) -> dict[str, Any]:
    """The URL's `ssl_*` query options (`?ssl_ca_certs=...&ssl_certfile=...`), typed as
    redis-py's `from_url` types them for a standalone `rediss://` URL, which hands them over
    itself; the cluster and Sentinel clients are built from parts and need them passed."""
    query = urlencode([(k, v) for k, v in layout.options if k.startswith("ssl_")])
    if not query:
        return {}
    try:
        parsed = parse_url(f"rediss://localhost/?{query}")  # type: ignore[no-untyped-call]
    except ValueError as error:
        raise InvalidArgument.at("redis_url", f"{_redact(layout.url)}: {error}") from None
    return {k: v for k, v in parsed.items() if k.startswith("ssl_")}


class _FcallKeysParser(CommandsParser):
    """redis-py finds the keys of FCALL by asking the default node `COMMAND GETKEYS`: a round
    trip more per call, and while that node is down every FCALL fails before it is routed (the
    default node is only replaced after a routed call fails). FCALL names its keys itself."""

    def get_keys(self, redis_conn: Any, *args: Any) -> Any:
        if len(args) >= 3 and str(args[0]).upper() in ("FCALL", "FCALL_RO"):
            return list(args[3 : 3 + int(args[2])]) or None
        return super().get_keys(redis_conn, *args)  # type: ignore[no-untyped-call]


def wait_milliseconds(replicas: int, timeout: float, socket_timeout: float) -> int:
    """The timeout of `WAIT replicas <ms>` for a wait of `timeout` seconds (the stores'
    `wait_replicas`/`wait_timeout`); InvalidArgument when the values make no sense, or when the
    socket (`socket_timeout`) would time out before WAIT answers (WAIT blocks the connection),
    naming the variables that set them."""
    if replicas < 0 or not (math.isfinite(timeout) and timeout > 0):
        raise InvalidArgument.at(
            "GPUALLOC_REDIS_WAIT_REPLICAS",
            "must be >= 0 with GPUALLOC_REDIS_WAIT_TIMEOUT > 0",
        )
    if replicas and timeout >= socket_timeout:
        raise InvalidArgument.at(
            "GPUALLOC_REDIS_WAIT_TIMEOUT",
            f"{timeout:g}s must be shorter than GPUALLOC_REDIS_TIMEOUT, the socket timeout "
            f"({socket_timeout:g}s): WAIT holds the connection until it answers",
        )
    return max(1, math.ceil(timeout * 1000))


def is_cluster(client: RedisClient) -> bool:
    return isinstance(client, RedisCluster)


def _host_port(item: str, url: str) -> tuple[str, int]:
    host, colon, port = item.rpartition(":")
    if not colon or not port.isdigit() or not host:
        raise InvalidArgument.at("redis_url", f"{_redact(url)}: {item!r} is not host:port")
    return host.strip("[]"), int(port)


def _redact(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    credentials, at, tail = rest.rpartition("@")
    return f"{scheme}{sep}***@{tail}" if at else url
