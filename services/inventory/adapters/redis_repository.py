"""The Redis InventoryRepository: the whole inventory state in Redis, one transaction per change.

Keys (prefix `gpualloc:inventory` by default):

- `<prefix>:generation`  STRING  the generation of the stored state
- `<prefix>:slices`      HASH    slice name -> ResourceSlice JSON (as kubectl prints it)
- `<prefix>:nodes`       HASH    node name -> Node JSON
- `<prefix>:reports`     HASH    node name -> report record JSON (agent format + bookkeeping)

`save` rewrites only the entries of the node keys the change touched (and only the slices whose
value changed) plus the generation, in one MULTI/EXEC, so Redis always holds the state of one
generation and a restarted or standby inventory resumes with the same generation and content.
There is no fencing between two active writers: run one active inventory per prefix.
Connection errors and timeouts become `Unavailable`; the change is then not published.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis

from services.common.dra.model import Node, ResourceSlice
from services.common.errors import Unavailable
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


@contextmanager
def _unavailable(what: str) -> Iterator[None]:
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as error:
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
        client: redis.Redis | None = None,
    ) -> None:
        self._client = client or redis.Redis.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout
        )
        self._generation_key = f"{prefix}:generation"
        self._slices_key = f"{prefix}:slices"
        self._nodes_key = f"{prefix}:nodes"
        self._reports_key = f"{prefix}:reports"
        # What Redis holds, per node key, as last written or loaded: lets save() send only the
        # differences without reading Redis first.
        self._slices: dict[str, dict[str, ResourceSlice]] = {}
        self._nodes: dict[str, Node] = {}
        self._records: dict[str, ReportRecord] = {}

    def load(self) -> InventoryState | None:
        with _unavailable("load"):
            pipe = self._client.pipeline(transaction=True)
            pipe.get(self._generation_key)
            pipe.hgetall(self._slices_key)
            pipe.hgetall(self._nodes_key)
            pipe.hgetall(self._reports_key)
            generation, slices, nodes, reports = pipe.execute()
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
            self._client.delete(
                self._generation_key, self._slices_key, self._nodes_key, self._reports_key
            )
        self._slices.clear()
        self._nodes.clear()
        self._records.clear()

    def close(self) -> None:
        self._client.close()
