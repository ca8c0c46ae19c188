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
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import redis

from services.common.dra.model import Node, ResourceSlice
from services.common.errors import Unavailable
from services.common.redis_layout import UNAVAILABLE_ERRORS, RedisClient, connect, is_cluster
from services.inventory.adapters.state_codec import (
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
    ) -> None:
        """`url`: any store URL (services/common/redis_layout.py: standalone, Sentinel, Cluster)."""
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
        # differences without reading Redis first.
        self._slices: dict[str, dict[str, ResourceSlice]] = {}
        self._nodes: dict[str, Node] = {}
        self._records: dict[str, ReportRecord] = {}

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
        pipe = self._client.pipeline(transaction=True)
        for key in change.nodes:
            entry = state.entries.get(key)
            slices = entry.slices if entry else {}
            written = self._slices.get(key, {})
            gone = [name for name in written if name not in slices]
            if gone:
                pipe.hdel(self._slices_key, *gone)
            fresh = {n: encode_slice(s) for n, s in slices.items() if written.get(n) is not s}
            if fresh:
                pipe.hset(self._slices_key, mapping=fresh)  # type: ignore[arg-type]  # invariant key
            node = entry.node if entry else None
            if node is None and key in self._nodes:
                pipe.hdel(self._nodes_key, key)
            elif node is not None and self._nodes.get(key) is not node:
                pipe.hset(self._nodes_key, key, encode_node(node))
            record = entry.record if entry else None
            if record is None and key in self._records:
                pipe.hdel(self._reports_key, key)
            elif record is not None and self._records.get(key) is not record:
                pipe.hset(self._reports_key, key, encode_record(record))
        pipe.set(self._generation_key, state.generation)
        with _unavailable("save"):
            pipe.execute()
        self._remember(state, change.nodes)

    def _remember(self, state: InventoryState, keys: frozenset[str]) -> None:
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

    def close(self) -> None:
        self._client.close()
