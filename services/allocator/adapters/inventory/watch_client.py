"""InventoryFeed over the inventory's WatchInventory stream (the services running apart).

One background thread keeps a watch open:

- the first event (SNAPSHOT, or RESET when the inventory no longer has the deltas we asked
  for, or restarted) replaces everything: an update with `reset=True`;
- DELTA events replace the slices of the nodes and cluster pools they name; HEARTBEATs only
  prove the stream is alive;
- when the stream breaks (UNAVAILABLE, the inventory restarting, a network cut) the thread
  reconnects with exponential backoff and jitter, asking for the deltas after the last
  generation it applied, so a short outage costs no full snapshot. Meanwhile the allocator
  keeps serving its last view; `status()` reports the outage (health and metrics read it).
  (Resuming trusts generations to identify states: an inventory that restarts without its
  state must not reuse generation numbers, or a watcher that resumes at the same number
  misses the new incarnation's content until its next change.)

Cluster-scoped slices (ClusterPool messages) are kept per pool and delivered as the one
CLUSTER_KEY entry of an update. Slices are read with the shared DRA protobuf mapping; a node
whose slices do not convert is logged and left out (a bug on the inventory's side must not
stop the feed).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from protos.inventory.v1 import inventory_pb2, inventory_pb2_grpc
from services.allocator.adapters.inventory.topology_pb import topology_from_pb
from services.allocator.app.inventory_feed import CLUSTER_KEY, InventoryUpdate
from services.allocator.core import NodeTopology
from services.client.calls import open_channel
from services.client.config import TlsConfig
from services.common.dra.model import Node, ResourceSlice
from services.common.errors import InvalidArgument
from services.common.pb.dra_mapping import from_pb_node, from_pb_resource_slice

__all__ = ["FeedStatus", "InventoryClient"]

log = logging.getLogger(__name__)

_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),  # find a dead inventory within ~15 s
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 256 * 2**20),  # a full snapshot of a big cluster
]


def _reconnect_options(initial: float, maximum: float) -> list[tuple[str, int]]:
    """The channel's own reconnect backoff, as short as ours (grpc's default grows to 120 s)."""
    return [
        ("grpc.initial_reconnect_backoff_ms", max(1, int(initial * 1000))),
        ("grpc.min_reconnect_backoff_ms", max(1, int(initial * 1000))),
        ("grpc.max_reconnect_backoff_ms", max(1, int(maximum * 1000))),
    ]


PoolKey = tuple[str, str]


@dataclass(frozen=True)
class FeedStatus:
    connected: bool
    generation: int  # the last generation applied (-1: none yet)
    last_error: str  # why the stream broke last ("" if it never did)
    reconnects: int


class InventoryClient:
    """`follow(on_update)` starts watching `target` (host:port); `close()` stops."""

    def __init__(
        self,
        target: str,
        *,
        initial_backoff: float = 0.1,
        max_backoff: float = 5.0,
        channel_options: list[tuple[str, int]] | None = None,
        tls: TlsConfig | None = None,
        token_file: Path | None = None,
    ) -> None:
        """`tls` and `token_file` as in services/client (GPUALLOC_CLIENT_TLS_*,
        GPUALLOC_CLIENT_TOKEN_FILE): the allocator is one more client of the inventory."""
        self._target = target
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        options = [
            *(channel_options or _CHANNEL_OPTIONS),
            *_reconnect_options(initial_backoff, max_backoff),
        ]
        self._channel = open_channel(target, tls, token_file=token_file, options=options)
        self._stub = inventory_pb2_grpc.InventoryStub(self._channel)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._call: grpc.Call | None = None
        self._thread: threading.Thread | None = None
        self._pools: dict[PoolKey, tuple[ResourceSlice, ...]] = {}
        self._parts = inventory_pb2.InventorySnapshot()  # snapshot parts received so far
        self._generation = -1
        self._incarnation = ""  # which run of the inventory numbered _generation
        self._watching = False  # a watch call is open
        self._ready = False  # the channel is connected
        self._last_error = ""
        self._reconnects = 0
        self._channel.subscribe(self._on_connectivity)

    def status(self) -> FeedStatus:
        """Connected means: a watch is open on a connected channel (a resumed watch may
        stay silent until the inventory changes)."""
        connected = self._watching and self._ready
        return FeedStatus(connected, self._generation, self._last_error, self._reconnects)

    def _on_connectivity(self, state: grpc.ChannelConnectivity) -> None:
        self._ready = state is grpc.ChannelConnectivity.READY

    def follow(self, on_update: Callable[[InventoryUpdate], None]) -> InventoryClient:
        if self._thread is not None:
            raise RuntimeError("InventoryClient.follow may be called once")
        self._thread = threading.Thread(
            target=self._run, args=(on_update,), name="inventory-watch", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._channel.unsubscribe(self._on_connectivity)
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self._channel.close()

    # --- the watch loop --------------------------------------------------------------------

    def _run(self, on_update: Callable[[InventoryUpdate], None]) -> None:
        backoff = self._initial_backoff
        while not self._closed.is_set():
            try:
                if self._watch(on_update):
                    backoff = self._initial_backoff  # the stream worked: start over small
            except grpc.RpcError as error:
                self._broken(error)
            except Exception:  # a bug in a consumer or in the mapping: keep following
                log.exception("inventory watch failed; reconnecting")
            self._watching = False
            if self._closed.is_set():
                return
            self._closed.wait(backoff * random.uniform(0.5, 1.5))
            backoff = min(self._max_backoff, backoff * 2)
            self._reconnects += 1

    def _watch(self, on_update: Callable[[InventoryUpdate], None]) -> bool:
        """Follow one stream until it ends; returns whether it delivered anything."""
        since = max(self._generation, 0)
        self._parts = inventory_pb2.InventorySnapshot()  # a snapshot cut by a broken stream
        request = inventory_pb2.WatchInventoryRequest(
            since_generation=since, incarnation=self._incarnation
        )
        call = self._stub.WatchInventory(request, wait_for_ready=True)
        with self._lock:
            self._call = call
        if self._closed.is_set():
            call.cancel()
        self._watching = True
        delivered = False
        for event in call:
            if not delivered:
                log.info(
                    "inventory watch delivering",
                    extra={"target": self._target, "since": since, "generation": event.generation},
                )
            update = self._translate(event)
            if update is not None:
                on_update(update)
                self._generation = event.generation
                self._incarnation = event.incarnation
                delivered = True
        self._last_error = "the inventory ended the watch"
        log.warning("inventory watch ended; reconnecting", extra={"target": self._target})
        return delivered

    def _broken(self, error: grpc.RpcError) -> None:
        code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
        if self._closed.is_set() and code is grpc.StatusCode.CANCELLED:
            return
        details = (error.details() if isinstance(error, grpc.Call) else "") or ""
        text = f"{code.name}: {details}".strip()
        if text != self._last_error:
            log.warning(
                "inventory watch broken; serving the last view and reconnecting",
                extra={"target": self._target, "error": text, "generation": self._generation},
            )
        self._last_error = text

    # --- events -> updates -----------------------------------------------------------------

    def _translate(self, event: inventory_pb2.WatchInventoryResponse) -> InventoryUpdate | None:
        kinds = inventory_pb2
        if event.type in (kinds.WATCH_EVENT_TYPE_SNAPSHOT, kinds.WATCH_EVENT_TYPE_RESET):
            # A large snapshot arrives in parts (`more` on all but the last): the view is
            # replaced only once the whole of it is here.
            self._parts.nodes.extend(event.snapshot.nodes)
            self._parts.cluster_pools.extend(event.snapshot.cluster_pools)
            if event.more:
                return None
            snapshot, self._parts = self._parts, inventory_pb2.InventorySnapshot()
            return self._reset(event.generation, snapshot)
        if event.type == kinds.WATCH_EVENT_TYPE_DELTA:
            return self._delta(event.generation, event.delta)
        return None  # HEARTBEAT (or a type this client does not know)

    def _reset(self, generation: int, snapshot: inventory_pb2.InventorySnapshot) -> InventoryUpdate:
        slices: dict[str, tuple[ResourceSlice, ...]] = {}
        nodes: dict[str, Node | None] = {}
        topologies: dict[str, NodeTopology | None] = {}
        for message in snapshot.nodes:
            self._add_node(message, slices, nodes, topologies)
        self._pools = {}
        for pool in snapshot.cluster_pools:
            self._add_pool(pool)
        slices[CLUSTER_KEY] = self._cluster_slices()
        return InventoryUpdate(generation, True, slices, nodes, topologies)

    def _delta(self, generation: int, delta: inventory_pb2.InventoryDelta) -> InventoryUpdate:
        slices: dict[str, tuple[ResourceSlice, ...]] = {}
        nodes: dict[str, Node | None] = {}
        topologies: dict[str, NodeTopology | None] = {}
        for message in delta.upserted_nodes:
            self._add_node(message, slices, nodes, topologies)
        for name in delta.deleted_nodes:
            slices[name] = ()
            nodes[name] = None
            topologies[name] = None
        for pool in delta.upserted_cluster_pools:
            self._add_pool(pool)
        for ref in delta.deleted_cluster_pools:
            self._pools.pop((ref.driver, ref.pool), None)
        if delta.upserted_cluster_pools or delta.deleted_cluster_pools:
            slices[CLUSTER_KEY] = self._cluster_slices()
        return InventoryUpdate(generation, False, slices, nodes, topologies)

    def _add_node(
        self,
        message: inventory_pb2.InventoryNode,
        slices: dict[str, tuple[ResourceSlice, ...]],
        nodes: dict[str, Node | None],
        topologies: dict[str, NodeTopology | None],
    ) -> None:
        name = message.node.name
        topologies[name] = (
            topology_from_pb(message.topology) if message.HasField("topology") else None
        )
        try:
            nodes[name] = from_pb_node(message.node, "node")
            slices[name] = tuple(
                from_pb_resource_slice(s, f"slices[{i}]") for i, s in enumerate(message.slices)
            )
        except InvalidArgument as error:
            log.error("inventory sent node %s with bad slices, left out: %s", name, error)
            slices[name] = ()

    def _add_pool(self, pool: inventory_pb2.ClusterPool) -> None:
        try:
            self._pools[(pool.driver, pool.pool)] = tuple(
                from_pb_resource_slice(s, f"slices[{i}]") for i, s in enumerate(pool.slices)
            )
        except InvalidArgument as error:
            log.error(
                "inventory sent pool %s/%s with bad slices: %s", pool.driver, pool.pool, error
            )
            self._pools.pop((pool.driver, pool.pool), None)

    def _cluster_slices(self) -> tuple[ResourceSlice, ...]:
        return tuple(s for key in sorted(self._pools) for s in self._pools[key])
