"""The Redis InventoryRepository: the whole inventory state in Redis, one transaction per change.

Keys (prefix `gpualloc:inventory` by default), all hash-tagged `{<prefix>}` so that they share
one slot and the transaction below runs unchanged on Redis Cluster:

- `{<prefix>}:generation`  STRING  the generation of the stored state
- `{<prefix>}:slices`      HASH    slice name -> ResourceSlice JSON (as kubectl prints it)
- `{<prefix>}:nodes`       HASH    node name -> Node JSON
- `{<prefix>}:reports`     HASH    node name -> report record JSON (agent format + bookkeeping)

`save` rewrites only the entries of the node keys the change touched (and only the slices whose
value changed) plus the generation, in one MULTI/EXEC, so Redis always holds the state of one
generation and a restarted or standby inventory resumes with the same generation and content;
`load` reads the four keys in one MULTI/EXEC. The whole state lives on one shard (it is one
writer's, and small next to the reservations).
Versions before the hash tag wrote `<prefix>:generation` etc.: a `load` that finds only those
(standalone or Sentinel) moves them to the new names in one transaction.
There is no fencing between two active writers: run one active inventory per prefix.
Connection errors, timeouts and cluster redirections become `Unavailable`; the change is then
not published.
With `wait_replicas` > 0 (GPUALLOC_REDIS_WAIT_REPLICAS) a save is acknowledged only once
`WAIT wait_replicas wait_timeout`, sent after the EXEC on the same connection, confirms that many
replicas have it; fewer -> `Unavailable` (the change is not published, though the primary has
it). After any failed save Redis may hold the unpublished change: the nodes it touched are
rewritten whole by the next save that succeeds, so Redis converges on the published state.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import redis

from services.common.dra.model import Node, ResourceSlice
from services.common.errors import Unavailable
from services.common.redis_layout import (
    UNAVAILABLE_ERRORS,
    RedisClient,
    connect,
    is_cluster,
    wait_milliseconds,
)
from services.inventory.adapters.store.state_codec import (
    decode_node,
    decode_record,
    decode_slice,
    encode_node,
    encode_record,
    encode_slice,
)
from services.inventory.core.state import Change, InventoryState, restore
from services.inventory.core.view import ReportRecord

__all__ = ["DEFAULT_PREFIX", "RedisInventoryRepository"]

DEFAULT_PREFIX = "gpualloc:inventory"
Command = tuple[str | int, ...]
log = logging.getLogger(__name__)


@contextmanager
def _unavailable(what: str) -> Iterator[None]:
    try:
        yield
    except UNAVAILABLE_ERRORS as error:
        raise Unavailable(f"redis: {what} failed: {error}") from None
    except redis.ResponseError as error:  # READONLY replica, OOM, ...
        raise Unavailable(f"redis: {what} refused: {error}") from None


class RedisInventoryRepository:
    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        socket_timeout: float = 5.0,
        client: RedisClient | None = None,
        wait_replicas: int = 0,
        wait_timeout: float = 0.5,
    ) -> None:
        """`url`: any store URL (services/common/redis_layout.py: standalone, Sentinel, Cluster).
        `wait_replicas`/`wait_timeout`: acknowledge a save after WAIT (module docstring)."""
        self._wait_ms = wait_milliseconds(wait_replicas, wait_timeout, socket_timeout)
        self._wait_replicas = wait_replicas
        self._client: RedisClient = client or connect(
            url, socket_timeout=socket_timeout, decode_responses=False
        )
        tag = "{" + prefix + "}"
        self._generation_key = f"{tag}:generation"
        self._slices_key = f"{tag}:slices"
        self._nodes_key = f"{tag}:nodes"
        self._reports_key = f"{tag}:reports"
        self._legacy_keys = [f"{prefix}:{name}" for name in ("generation", "slices", "nodes")]
        self._legacy_keys.append(f"{prefix}:reports")
        # What Redis holds, per node key, as last written or loaded: lets save() send only the
        # differences without reading Redis first. None: unknown (a failed save may have
        # written it), rewritten by the next save.
        self._slices: dict[str, dict[str, ResourceSlice | None]] = {}
        self._nodes: dict[str, Node | None] = {}
        self._records: dict[str, ReportRecord | None] = {}
        self._unknown: set[str] = set()  # node keys a failed save touched

    def _keys(self) -> list[str]:
        return [self._generation_key, self._slices_key, self._nodes_key, self._reports_key]

    def _read(self, keys: list[str]) -> list[Any]:
        generation_key, slices_key, nodes_key, reports_key = keys
        pipe = self._client.pipeline(transaction=True)
        pipe.get(generation_key)
        pipe.hgetall(slices_key)
        pipe.hgetall(nodes_key)
        pipe.hgetall(reports_key)
        return cast(list[Any], pipe.execute())

    def load(self) -> InventoryState | None:
        with _unavailable("load"):
            generation, slices, nodes, reports = self._read(self._keys())
            if generation is None and not is_cluster(self._client):
                generation, slices, nodes, reports = self._migrate_legacy()
        if generation is None:
            return None
        state = restore(
            int(generation),
            [decode_slice(v, f"redis {self._slices_key}[{k.decode()}]") for k, v in slices.items()],
            [decode_node(v, f"redis {self._nodes_key}[{k.decode()}]") for k, v in nodes.items()],
            [decode_record(v) for v in reports.values()],
        )
        self._remember(state, state.node_keys())
        return state

    def _migrate_legacy(self) -> list[Any]:
        """The state under the names older versions used, moved to the hash-tagged names
        (one MULTI/EXEC: a server without cluster mode takes keys of any slot)."""
        client = cast(redis.Redis, self._client)
        found = self._read(self._legacy_keys)
        if found[0] is None:
            return found
        generation, slices, nodes, reports = found
        pipe = client.pipeline(transaction=True)
        pipe.set(self._generation_key, generation)
        for key, values in ((self._slices_key, slices), (self._nodes_key, nodes)):
            if values:
                pipe.hset(key, mapping=values)
        if reports:
            pipe.hset(self._reports_key, mapping=reports)
        pipe.delete(*self._legacy_keys)
        pipe.execute()
        log.warning("inventory state moved to hash-tagged keys %s", self._generation_key)
        return found

    def save(self, state: InventoryState, change: Change) -> None:
        keys = change.nodes | self._unknown
        commands = self._commands(state, keys)
        try:
            with _unavailable("save"):
                acked = self._execute(commands)
        except Unavailable:
            self._forget(state, keys)
            raise
        if acked < self._wait_replicas:
            self._forget(state, keys)
            raise Unavailable(
                f"redis: inventory save of generation {state.generation} done on the primary but "
                f"confirmed by {acked} of {self._wait_replicas} replica(s) within "
                f"{self._wait_ms} ms; retry it"
            )
        self._unknown.clear()
        self._remember(state, keys)

    def _commands(self, state: InventoryState, keys: frozenset[str] | set[str]) -> list[Command]:
        """The writes that make Redis hold `state` for `keys`, given what it holds (as
        remembered), and the generation."""
        commands: list[Command] = []
        for key in sorted(keys):
            entry = state.entries.get(key)
            slices = entry.slices if entry else {}
            written = self._slices.get(key, {})
            gone = [name for name in written if name not in slices]
            if gone:
                commands.append(("HDEL", self._slices_key, *gone))
            fresh = [(n, encode_slice(s)) for n, s in slices.items() if written.get(n) is not s]
            if fresh:
                commands.append(("HSET", self._slices_key, *(x for pair in fresh for x in pair)))
            node = entry.node if entry else None
            if node is None and key in self._nodes:
                commands.append(("HDEL", self._nodes_key, key))
            elif node is not None and self._nodes.get(key) is not node:
                commands.append(("HSET", self._nodes_key, key, encode_node(node)))
            record = entry.record if entry else None
            if record is None and key in self._records:
                commands.append(("HDEL", self._reports_key, key))
            elif record is not None and self._records.get(key) is not record:
                commands.append(("HSET", self._reports_key, key, encode_record(record)))
        commands.append(("SET", self._generation_key, str(state.generation)))
        return commands

    def _execute(self, commands: Sequence[Command]) -> int:
        """The commands in one MULTI/EXEC; with `wait_replicas`, then WAIT on the same
        connection (WAIT counts the replicas that have this connection's writes, and would not
        block inside the MULTI). Returns how many replicas WAIT confirmed (0 without WAIT)."""
        if not self._wait_replicas:
            pipe = self._client.pipeline(transaction=True)
            for command in commands:
                pipe.execute_command(*command)
            pipe.execute()
            return 0
        node: Any = self._client
        if is_cluster(self._client):  # the primary of the state's slot, as a plain client
            cluster: Any = self._client  # redis-py's cluster API is untyped
            node = cluster.get_redis_connection(cluster.get_node_from_key(self._generation_key))
        pool = node.connection_pool
        connection = pool.get_connection()
        try:
            sent = [("MULTI",), *commands, ("EXEC",), ("WAIT", self._wait_replicas, self._wait_ms)]
            connection.send_packed_command(connection.pack_commands(sent))
            replies: list[Any] = []
            for _ in sent:  # read every reply before raising: the connection stays in step
                try:
                    replies.append(connection.read_response())
                except redis.ResponseError as error:  # EXECABORT, MOVED, READONLY, ...
                    replies.append(error)
        except BaseException:
            connection.disconnect()
            if node is not self._client:  # the slot may have moved: learn the layout again
                with contextlib.suppress(*UNAVAILABLE_ERRORS):
                    cluster.nodes_manager.initialize()
            raise
        finally:
            pool.release(connection)
        executed = replies[-2]
        for reply in [*replies[:-2], *(executed if isinstance(executed, list) else [])]:
            if isinstance(reply, Exception):
                raise reply
        acked = replies[-1]
        if isinstance(acked, Exception):
            raise acked
        return int(acked)

    def _forget(self, state: InventoryState, keys: frozenset[str] | set[str]) -> None:
        """After a failed save of `keys`: Redis holds either what it held or what the save
        wrote; the next save rewrites both whole."""
        for key in keys:
            entry = state.entries.get(key)
            names = set(self._slices.get(key, {})) | set(entry.slices if entry else {})
            self._slices[key] = dict.fromkeys(names)
            self._nodes[key] = None
            self._records[key] = None
        self._unknown |= set(keys)

    def _remember(self, state: InventoryState, keys: frozenset[str] | set[str]) -> None:
        for key in keys:
            entry = state.entries.get(key)
            self._slices[key] = dict(entry.slices) if entry else {}
            node = entry.node if entry else None
            record = entry.record if entry else None
            if node is None:
                self._nodes.pop(key, None)
            else:
                self._nodes[key] = node
            if record is None:
                self._records.pop(key, None)
            else:
                self._records[key] = record

    def clear(self) -> None:
        """Remove every key of this prefix (tests, and `--reset` style tooling)."""
        with _unavailable("clear"):
            if is_cluster(self._client):
                self._client.delete(*self._keys())
                for key in self._legacy_keys:  # one slot each
                    self._client.delete(key)
            else:
                self._client.delete(*self._keys(), *self._legacy_keys)
        self._slices.clear()
        self._nodes.clear()
        self._records.clear()
        self._unknown.clear()

    def close(self) -> None:
        self._client.close()
