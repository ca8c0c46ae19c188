"""The Redis reservation store: the port as Redis Functions, one atomic step per operation.

Each reserve/commit/renew/release/expire is ONE `FCALL` into the `gpualloc` library
(adapters/store/redis_functions.lua) over the keys of one node, all hash-tagged `{node}` so that
they share a slot (Redis Cluster). The Lua side reads the server's TIME for every lease decision,
frees the node's due leases first, and publishes each change on `<prefix>:events`.

A reservation id names its node: `res-<32 hex>@<node>`, so commit, renew, release and get go
straight to the node's keys (one round trip each; an id naming a node that does not hold it is
simply NotFound). Outside the node slots one key lets a client find things:

- `<prefix>:nodes` SET of every node that ever had a reservation (`live()` and `expire()` walk
  it), added to in the same pipeline as the reserve step and before it, so a reserve is ONE
  round trip.
- `<prefix>:reservations` HASH id -> node: only read, for ids without `@<node>` that an older
  version wrote (it indexed every id); entries are deleted after their release or expiry.

Own reserves, quietly (`quiet_own_reserves`): an allocator whose every reserve goes through
this store object settles what it reserved into its own copy (app/live_reservations.py) from
`reserve`'s answer, so the event of each of its grants would only be parsed and dropped there.
The ids a `reserve` mints are registered before its grant steps run; the events channel's
handler reads the first id of a reserve message from its raw bytes (every id in one message is
one node step's: one call's) and holds a registered one back: dropped once that step's grants
all ended with their reservation, delivered after all when the step failed (the caller does
not learn what it may have taken). Ids stay registered after their call for `_QUIET_IDS` more
ids, for messages that come after the answer; other replicas' messages, and every other op,
are delivered as before (nothing about the messages themselves changes).

Failure policy: connection errors and timeouts become `Unavailable`. Only reads and reserves
that carry an idempotency key are retried (with exponential backoff): a retried reserve without
a key could take a second lease, and a retried release could report NotFound for its own
success. The client's own retries are switched off for that reason when the store builds it.
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import hashlib
import json
import logging
import math
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
import redis
from redis.client import PubSubWorkerThread
from redis.exceptions import AskError, MovedError
from redis.utils import HIREDIS_AVAILABLE

from services.allocator.adapters.store.reservation_codec import allocation_from_dict
from services.allocator.reservations.model import (
    NODE_SEPARATOR,
    PENDING_IDS_SHOWN,
    PREEMPTED_MEMORY_SECONDS,
    DeviceCondition,
    DeviceTaken,
    Hold,
    LimitedUse,
    PendingPreemptions,
    Reservation,
    ReservationEvent,
    ReservationEventOp,
    ReservationState,
    ReserveOutcome,
    ReserveRequest,
    UseExceeded,
    conflict_error,
    new_reservation_id,
    new_reservation_ids,
    node_reservation_id,
    preempted_error,
    validate_placement,
)
from services.common.dra.model import (
    AllocationResult,
    NodeSelector,
    NodeSelectorRequirement,
)
from services.common.dra.serialize import (
    allocation_result_to_dict,
    plain_result,
)
from services.common.errors import (
    FailedPrecondition,
    GpuallocError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
    clip,
)
from services.common.redis_layout import (
    UNAVAILABLE_ERRORS,
    RedisClient,
    connect,
    is_cluster,
    wait_milliseconds,
)

__all__ = [
    "LIBRARY_NAME",
    "LIBRARY_VERSION",
    "NODE_SEPARATOR",
    "RedisReservationStore",
    "RedisSubscription",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

LIBRARY_NAME = "gpualloc"
_TEMPLATE = Path(__file__).with_name("redis_functions.lua").read_text(encoding="utf-8")
LIBRARY_VERSION = hashlib.sha256(_TEMPLATE.encode()).hexdigest()[:16]
_LIBRARY_CODE = _TEMPLATE.replace("@VERSION@", LIBRARY_VERSION)

_UNAVAILABLE = UNAVAILABLE_ERRORS
_HIREDIS_PACKS = HIREDIS_AVAILABLE  # redis-py packs commands with hiredis (its version >= 3.2)
if _HIREDIS_PACKS:
    import hiredis
NODE_BUCKETS = 16  # the nodes index: this many sets, spread over the slots (cluster shards)
FANOUT_BATCH = 256  # nodes per pipeline when a List or the janitor walks every node
FANOUT_SHARDS = 8  # shards walked at once
EventCallback = Callable[[ReservationEvent], None]
_RESUBSCRIBE_S = 0.5  # pause between reconnect attempts of an event subscription
_QUIET_IDS = 8192  # own reserved ids whose messages are still held back after their call
# how `announce` / `publish` (redis_functions.lua) start a reserve message, up to its first id
_RESERVE_MESSAGE = b'{"op":"reserve","id":"'
Strings = list[str]  # aliases: inside the class `list` is the port's method
Replies = list[Any]
# json.dumps's escaping of one string (ensure_ascii): the `idem` field keeps its exact bytes
_json_string: Callable[[str], str] = json.encoder.encode_basestring_ascii


class RedisReservationStore:
    """Reservations in Redis >= 7.0. `client_or_url` is a URL (services/common/redis_layout.py:
    `redis://`, `rediss://` for TLS, `user:password@` for AUTH/ACL, `/db`; `redis+sentinel://`
    and `redis+cluster://` for the HA layouts) or a ready client (`redis.Redis` or
    `redis.RedisCluster`), which the store then neither configures nor closes (disable its
    retries: see the module docstring).
    `id_factory` mints the part of an id before `@<node>` (it must not contain `@`).
    `wait_replicas` > 0: a reserve or commit is acknowledged only once `WAIT wait_replicas
    wait_timeout` confirms that many replicas have it, else the call fails UNAVAILABLE (the
    step itself happened on the primary: retry it, with the idempotency key for a reserve).
    `preempted_memory_seconds`: how long a revocation is remembered (who preempted, pending)."""

    def __init__(
        self,
        client_or_url: RedisClient | str,
        *,
        key_prefix: str = "gpualloc",
        socket_timeout: float = 2.0,
        socket_connect_timeout: float | None = None,
        max_connections: int | None = None,
        retries: int = 2,
        backoff_seconds: float = 0.05,
        health_check_interval: int = 30,
        id_factory: Callable[[], str] = new_reservation_id,
        wait_replicas: int = 0,
        wait_timeout: float = 0.5,
        preempted_memory_seconds: float = PREEMPTED_MEMORY_SECONDS,
    ) -> None:
        if isinstance(client_or_url, str):
            self._client: RedisClient = connect(
                client_or_url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_connect_timeout,
                max_connections=max_connections,
                health_check_interval=health_check_interval,
            )
            self._owns_client = True
        else:
            self._client = client_or_url
            self._owns_client = False
        wait_ms = wait_milliseconds(wait_replicas, wait_timeout, socket_timeout)
        self._cluster = is_cluster(self._client)
        # a client built here (standalone or Sentinel) runs its steps straight on a pooled
        # connection (`_command`); a client given, or a cluster, through its own API
        self._direct = self._owns_client and not self._cluster
        self._prefix = key_prefix
        self._retries = retries
        self._backoff_seconds = backoff_seconds
        self._id_factory = id_factory
        self._wait_replicas = wait_replicas
        self._wait_ms = wait_ms
        self._memory_ms = max(1, math.ceil(preempted_memory_seconds * 1000))
        self._index_key = f"{key_prefix}:reservations"
        self._legacy_nodes_key = f"{key_prefix}:nodes"
        self.channel = f"{key_prefix}:events"
        self._library_ready = False
        self._library_lock = threading.Lock()
        self._subscriptions: list[RedisSubscription] = []
        # quiet_own_reserves: while `_quiet()` is false, messages of own grants are held back
        self._quiet: Callable[[], bool] | None = None
        self._own_lock = threading.Lock()
        self._own: dict[str, _GrantCall] = {}  # own grant id -> its step
        self._own_done: collections.deque[dict[str, _GrantCall]] = collections.deque()
        self._own_done_count = 0
        # nodes known to be in the nodes index (read from it, or added by this process): a grant
        # on one of them skips the SADD. Replaced by every walk, so a lost index heals.
        self._registered: set[str] = set()
        self._pending: set[str] = set()  # granted on, not yet in the index (cluster)
        self._fanout_pool: ThreadPoolExecutor | None = None
        self._fanout_lock = threading.Lock()

    # --- the port ------------------------------------------------------------------------

    def reserve(
        self, placements: Sequence[Sequence[ReserveRequest]]
    ) -> builtins.list[ReserveOutcome]:
        """Every placement's grants grouped by node: one `gpualloc_grant_batch` step per node
        (its grants in call order, each seeing the ones before it), one pipeline per shard,
        the shards at once. A placement whose grants did not all succeed gets its error, and
        the grants it took are released (not those only WAIT did not confirm: the step
        happened on the primary, and a retry with the idempotency key finds them)."""
        outcomes: builtins.list[ReserveOutcome | None] = [None] * len(placements)
        single: builtins.list[tuple[int, _Grant]] = []  # placements of one grant, taken whole
        taking: builtins.list[tuple[int, builtins.list[_Grant]]] = []  # per other placement
        by_node: dict[str, builtins.list[_Grant]] = {}  # grants in call order, per node
        lease_ms: dict[float, int] = {}  # per lease length, not per grant
        minted = self._mint(sum(map(len, placements)))
        for index, requests in enumerate(placements):
            if len(requests) == 1:  # one scope: a batch's every item
                request = requests[0]
                hold = request.hold
                devices = hold.devices
                node = request.node
                group = by_node.get(node)
                if (  # what validate_placement and _check_nodes accept as it is, inline
                    request.owner
                    and 0 < request.lease_seconds < math.inf  # False for NaN too
                    and len(request.claim_names) == len(request.allocations)
                    and len(devices) == 1
                    and devices[0]
                    and not hold.uses
                    and (group is not None or (node and "{" not in node and "}" not in node))
                ):
                    seconds = request.lease_seconds
                    ms = lease_ms.get(seconds) or lease_ms.setdefault(
                        seconds, max(1, math.ceil(seconds * 1000))
                    )
                    grant = _Grant(request, hold, next(minted) + NODE_SEPARATOR + node, ms)
                    single.append((index, grant))
                    if group is None:
                        by_node[node] = [grant]
                    else:
                        group.append(grant)
                    continue
            holds = validate_placement(requests)
            if not isinstance(holds, GpuallocError):
                holds = _check_nodes(requests, holds, by_node)
            if isinstance(holds, GpuallocError):
                outcomes[index] = holds
                continue
            mine: builtins.list[_Grant] = []
            for request, hold in zip(requests, holds, strict=True):
                seconds = request.lease_seconds
                ms = lease_ms.get(seconds) or lease_ms.setdefault(
                    seconds, max(1, math.ceil(seconds * 1000))
                )
                node = request.node
                grant = _Grant(request, hold, next(minted) + NODE_SEPARATOR + node, ms)
                mine.append(grant)
                group = by_node.get(node)
                if group is None:
                    by_node[node] = [grant]
                else:
                    group.append(grant)
            taking.append((index, mine))
        self._grant_all(by_node)
        for index, grant in single:
            if grant.reservation is not None and grant.error is None:  # it took it
                outcomes[index] = [grant.reservation]
            else:
                outcomes[index] = self._outcome((grant,))
        for index, mine in taking:
            outcomes[index] = self._outcome(mine)
        return [outcome for outcome in outcomes if outcome is not None]

    def _mint(self, count: int) -> Iterator[str]:
        """`count` ids from `id_factory` (the default's in one go), each the part of an id
        before `@<node>` (`node_reservation_id`: checked here, once per id)."""
        if self._id_factory is new_reservation_id:
            return iter(new_reservation_ids(count))  # hex digits: no separator
        return (node_reservation_id(self._id_factory(), "")[:-1] for _ in range(count))

    def _outcome(self, grants: Sequence[_Grant]) -> ReserveOutcome:
        """One placement's outcome from its grants' replies; what it took is released when
        one of them failed (not for an unconfirmed WAIT alone)."""
        if len(grants) == 1 and grants[0].reservation is not None and grants[0].error is None:
            return [grants[0].reservation]  # the common case: a single grant that took it
        conflicts = [item for g in grants for item in g.conflicts]
        errors = [g.error for g in grants if g.error is not None]
        if not conflicts and not errors:
            return [g.reservation for g in grants if g.reservation is not None]
        hard = [e for e in errors if not isinstance(e, _Unconfirmed)]
        if conflicts or hard:
            for grant in reversed(grants):
                if grant.created and grant.reservation is not None:
                    # NotFound (expired meanwhile) or Unavailable: the lease runs out instead.
                    with contextlib.suppress(GpuallocError):
                        self.release(grant.reservation.id, grant.request.owner)
        if hard:
            return hard[0]
        return conflict_error(conflicts) if conflicts else errors[0]

    def _grant_all(self, by_node: Mapping[str, Sequence[_Grant]]) -> None:
        """Run the grants, by node in call order (one step per node, a pipeline per shard,
        shards at once), and record each one's reply on it: its reservation, or its error."""
        calls = [self._grant_call(node, group) for node, group in by_node.items()]
        if self._cluster:
            self._register([c.node for c in calls if c.node not in self._registered])
        if self._quiet is None:
            self._run_grants(calls)
        else:
            self._quietly(calls)

    def _run_grants(self, calls: Sequence[_GrantCall]) -> None:
        """`_grant_all`'s steps: retried on a redirect or a missing library (and, when every
        grant carries an idempotency key, on a connection error)."""
        pending = calls
        for attempt in range(3):
            batches = self._by_shard(pending, lambda call: call.keys[0])
            results = self._per_shard(self._grant_batch, batches)
            again: builtins.list[_GrantCall] = []
            for batch, result in zip(batches, results, strict=True):
                if isinstance(result, BaseException):
                    retry = all(g.request.idempotency_key for c in batch for g in c.grants)
                    if retry and attempt < 2:
                        time.sleep(self._backoff_seconds * 2**attempt)
                        again.extend(batch)
                        continue
                    error = Unavailable(f"redis unavailable ({type(result).__name__}): {result}")
                    for call in batch:
                        call.fail(error)
                    continue
                for call, reply in zip(batch, result, strict=True):
                    if attempt < 2 and _is_redirect(reply):
                        call.reply = reply
                        again.append(call)
                    else:
                        self._record(call, reply)
            if not again:
                return
            if any(_is_missing_function(c.reply) for c in again if c.reply is not None):
                self._load_library()
            if self._cluster and any(isinstance(c.reply, MovedError | AskError) for c in again):
                self._refresh_topology()
            for call in again:
                call.reply = None
            pending = again
        for call in pending:  # pragma: no cover - the loop above records every call by then
            call.fail(Unavailable("redis: grants keep failing over"))

    def _grant_call(self, node: str, grants: Sequence[_Grant]) -> _GrantCall:
        """One node's step: the node's own keys, and its grants as ONE JSON array of [id,
        owner, idem, lease_ms, devices_json, uses_json, doc]. The grants' keys (`res:`, `dev:`,
        `use:`) are not named one by one: they share the node's slot (its hash tag), which its
        own keys name, as the leases that every step frees are not named either (the library
        reads no KEYS). `runs` numbers each grant's run for `_record`: a grant that continues
        the one before it (`_continues`: its document is the run's but for the device) shares
        its request's fields but the allocations."""
        base = self._base(node)
        keys = [base + "leases", base + "ids", base + "fence", base + "idem"]
        fields = []
        runs: builtins.list[int] = []
        dumps = orjson.dumps
        shapes: dict[tuple[Any, ...], tuple[str, str, str]] = {}  # see _grant_doc
        last: ReserveRequest | None = None  # the last one-device grant's request (_around)
        around = ("", "", "")  # the text around its device
        run = 0
        for grant in grants:
            request, hold = grant.request, grant.hold
            devices = hold.devices
            if last is not None and _continues(last, request):  # its document but the device
                doc = around[0] + _json_text(request.allocations[0].results[0].device) + around[1]
                idem = around[2]
            else:
                run += 1
                found = _around(request, shapes)
                if found is None:
                    last = None
                    doc, idem = _grant_doc(request, shapes)
                else:
                    last, around = request, found
                    doc = around[0] + _json_text(request.allocations[0].results[0].device)
                    doc += around[1]
                    idem = around[2]
            runs.append(run)
            if len(devices) == 1:  # one device taken whole: the common case
                devices_json = "[" + _json_text(devices[0]) + "]"
            else:
                devices_json = dumps(devices).decode()
            uses = "[]"  # no counters or shares: the common case (a whole device)
            if hold.uses:
                uses = dumps([[u.key, str(u.amount), str(u.limit)] for u in hold.uses]).decode()
            fields.append((grant.id, request.owner, idem, grant.lease_ms, devices_json, uses, doc))
        return _GrantCall(node, keys, [*self._context(node), orjson.dumps(fields)], grants, runs)

    def _grant_batch(self, calls: Sequence[_GrantCall]) -> Replies:
        """One shard's grant steps in one pipeline (after its nodes' registration in the
        nodes index, on one server; with WAIT last when configured). The replies, one per
        call (a WAIT that fell short marks them unconfirmed)."""
        self._ensure_library()
        registered = self._registered
        register = [] if self._cluster else [c.node for c in calls if c.node not in registered]
        wait = self._wait_replicas > 0
        if len(calls) == 1 and not register and not wait:  # one step alone: no pipeline
            call = calls[0]
            try:
                return [
                    self._command(
                        "FCALL", "gpualloc_grant_batch", len(call.keys), *call.keys, *call.args
                    )
                ]
            except redis.ResponseError as error:  # the library is missing, the slot moved
                return [error]
        commands: builtins.list[tuple[Any, ...]] = [
            ("SADD", self._nodes_key(node), node) for node in register
        ]
        commands += [
            ("FCALL", "gpualloc_grant_batch", len(call.keys), *call.keys, *call.args)
            for call in calls
        ]
        if wait:
            commands.append(("WAIT", self._wait_replicas, self._wait_ms))
        try:
            if self._direct:
                replies = self._commands(commands)
            else:
                client: Any = self._client
                if self._cluster:  # WAIT must follow the steps on their primary's connection
                    cluster: Any = self._client  # redis-py's cluster API is untyped
                    client = cluster.get_redis_connection(
                        cluster.get_node_from_key(calls[0].keys[0])
                    )
                with client.pipeline(transaction=False) as pipe:
                    for command in commands:
                        pipe.execute_command(*command)
                    replies = pipe.execute(raise_on_error=False)
        except _UNAVAILABLE:
            if self._cluster:  # we went around the cluster client: refresh its layout
                self._refresh_topology()
            raise
        for node, added in zip(register, replies, strict=False):
            if isinstance(added, Exception):
                # The grant happens anyway (the janitor finds nodes by this set); the next
                # grant on the node tries again.
                log.warning("nodes index: %s not added: %s", node, added)
            else:
                self._registered.add(node)
        steps: Replies = replies[len(register) : len(register) + len(calls)]
        if wait:
            acked = replies[-1]
            if isinstance(acked, Exception) or int(acked) < self._wait_replicas:
                for call in calls:
                    call.unconfirmed = _Unconfirmed(
                        f"redis: gpualloc_grant_batch done on the primary but confirmed by "
                        f"{acked} of {self._wait_replicas} replica(s) within {self._wait_ms} "
                        "ms; retry it"
                    )
        return steps

    def _record(self, call: _GrantCall, reply: Any) -> None:
        """A grant step's reply on its grants: each one's reservation or its error."""
        if isinstance(reply, Exception):
            if isinstance(reply, _UNAVAILABLE):
                call.fail(Unavailable(f"redis unavailable ({type(reply).__name__}): {reply}"))
                return
            raise reply
        now, answers, expired = reply
        if expired:
            self._unindex(expired)
        made: dict[str, Any] = {}  # the fields of the last reservation taken, of run `made_in`
        made_in = 0
        for grant, answer, run in zip(call.grants, answers, call.runs, strict=True):
            if isinstance(answer, int):  # its fencing token: taken now, for its lease
                if run == made_in and made["expires_at"] == (now + grant.lease_ms) / 1000:
                    fields = made.copy()  # the run's shared fields; then its own
                    fields["id"] = grant.id
                    fields["allocations"] = tuple(grant.request.allocations)
                    fields["hold"] = grant.hold
                    fields["fencing_token"] = answer
                    reservation: Reservation = object.__new__(Reservation)
                    object.__setattr__(reservation, "__dict__", fields)
                    grant.reservation = reservation
                else:
                    grant.reservation = _granted(grant, answer, now, now + grant.lease_ms)
                    made, made_in = grant.reservation.__dict__, run
                grant.created = True
            elif _text(answer[0]) == "conflict":
                grant.conflicts = [_conflict_item(item) for item in answer[1]]
                continue
            else:  # "existing"
                grant.reservation = self._decode(answer[1])
            if call.unconfirmed is not None:
                grant.error = call.unconfirmed
                call.failed = True

    def _register(self, nodes: Sequence[str]) -> None:
        """Nodes to have in the nodes index before their first grant (a cluster: the index
        sets live in other slots, so a round trip before, only the first time this process
        sees the node); a shard that is down leaves them to the janitor."""
        for node in nodes:
            try:
                self._client.sadd(self._nodes_key(node), node)
                self._registered.add(node)
            except _UNAVAILABLE as error:
                log.warning("nodes index: %s not added yet: %s", node, error)
                self._pending.add(node)

    def commit(self, reservation_id: str, owner: str, fencing_token: int = 0) -> Reservation:
        node = self._node_of(reservation_id)
        args = [*self._context(node), reservation_id, owner, str(fencing_token)]
        reply = self._mutate("gpualloc_commit", node, reservation_id, args, wait=True)
        return self._decode(reply[1])

    def renew(self, reservation_id: str, owner: str, lease_seconds: float) -> Reservation:
        if not (math.isfinite(lease_seconds) and lease_seconds > 0):
            raise InvalidArgument.at("lease_seconds", f"must be > 0, got {lease_seconds}")
        node = self._node_of(reservation_id)
        lease_ms = str(max(1, math.ceil(lease_seconds * 1000)))
        args = [*self._context(node), reservation_id, owner, lease_ms]
        reply = self._mutate("gpualloc_renew", node, reservation_id, args)
        return self._decode(reply[1])

    def release(self, reservation_id: str, owner: str, fencing_token: int = 0) -> None:
        node = self._node_of(reservation_id)
        args = [*self._context(node), reservation_id, owner, str(fencing_token)]
        self._mutate("gpualloc_release", node, reservation_id, args)
        self._unindex([reservation_id])

    def revoke(self, reservation_id: str, fencing_token: int, by: str) -> None:
        node = self._node_of(reservation_id)
        ttl = str(self._memory_ms)
        args = [*self._context(node), reservation_id, str(fencing_token), by, ttl]
        self._mutate("gpualloc_revoke", node, reservation_id, args, wait=True)
        self._unindex([reservation_id])

    def report_conditions(
        self, reservation_id: str, fencing_token: int, conditions: Sequence[DeviceCondition]
    ) -> Reservation:
        node = self._node_of(reservation_id)
        reported = json.dumps([[c.device, c.type, c.status] for c in conditions])
        args = [*self._context(node), reservation_id, reported, str(fencing_token)]
        reply = self._mutate("gpualloc_conditions", node, reservation_id, args, wait=True)
        return self._decode(reply[1])

    def pending_preemptions(
        self, tenants: Sequence[str], max_ids: int = PENDING_IDS_SHOWN
    ) -> dict[str, PendingPreemptions]:
        """Every node's `pending:<tenant>` sets (the nodes index, then a pipeline per shard, as
        `list` walks): one read-only step per node, O(log n) per tenant plus the ids shown; the
        counts are summed and the oldest `max_ids` ids kept. Any shard that cannot answer
        fails the call."""
        wanted = list(dict.fromkeys(tenants))
        if not wanted:
            return {}
        nodes = self._attempt(lambda: self._read_nodes(), retry=True)
        shown = max(0, max_ids)
        calls = [
            ([self._base(n) + "pending:" + t for t in wanted], [*self._context(n), str(shown)])
            for n in nodes
        ]
        replies, _ = self._attempt(
            lambda: self._fanout("gpualloc_pending", calls, False), retry=True
        )
        counts = dict.fromkeys(wanted, 0)
        oldest: dict[str, builtins.list[tuple[int, str]]] = {t: [] for t in wanted}
        for reply in replies:
            for tenant, (count, flat) in zip(wanted, reply, strict=True):
                counts[tenant] += int(count)
                oldest[tenant] += [
                    (int(float(_text(flat[i + 1]))), _text(flat[i])) for i in range(0, len(flat), 2)
                ]
        return {
            tenant: PendingPreemptions(
                counts[tenant], tuple(i for _, i in sorted(oldest[tenant])[:shown])
            )
            for tenant in wanted
        }

    def get(self, reservation_id: str) -> Reservation:
        node = self._node_of(reservation_id)
        keys = [self._base(node) + "res:" + reservation_id]
        found = self._attempt(
            lambda: self._fcall("gpualloc_get", keys, [*self._context(node), reservation_id]),
            retry=True,
        )
        if not found:
            raise NotFound(f"reservation {clip(reservation_id)} not found (released or expired)")
        return self._decode(found[0])

    def list(self, owner: str = "", node: str = "") -> Sequence[Reservation]:
        """One node: that node's keys only. Every node: the nodes index, then each shard's
        nodes in pipelines, shards in parallel; any shard that cannot answer fails the call."""
        if node:
            nodes = [_check_node(node)]
        else:
            nodes = self._attempt(lambda: self._read_nodes(), retry=True)
        calls = [([self._base(n) + "ids"], self._context(n)) for n in nodes]
        replies, _ = self._attempt(lambda: self._fanout("gpualloc_list", calls, False), retry=True)
        found = [self._decode(fields) for reply in replies for fields in reply]
        return sorted(
            (r for r in found if not owner or r.owner == owner), key=lambda r: (r.node, r.id)
        )

    def live(self) -> Sequence[Reservation]:
        return self.list()

    def expire(self) -> int:
        """Run every node's expiry step (a pipeline per shard and batch, shards in parallel);
        returns how many leases were freed. A shard that cannot answer is skipped (logged):
        its nodes wait for the next run; only when none answers is the call UNAVAILABLE."""
        self._register_pending()
        nodes = self._attempt(lambda: self._read_nodes(tolerant=True), retry=True)
        calls = [([self._base(n) + "leases"], self._context(n)) for n in nodes]
        replies, failed = self._attempt(
            lambda: self._fanout("gpualloc_expire", calls, True), retry=False
        )
        if failed:
            log.warning("expire: %d node(s) on unavailable shards skipped", failed)
        expired = [reservation_id for reply in replies for reservation_id in reply]
        self._unindex(expired)
        return len(expired)

    def close(self) -> None:
        for subscription in tuple(self._subscriptions):
            subscription.close()
        if self._fanout_pool is not None:
            self._fanout_pool.shutdown(wait=False)
        if self._owns_client:
            self._client.close()

    # --- events --------------------------------------------------------------------------

    def subscribe(self, callback: EventCallback) -> RedisSubscription:
        """Call `callback` (from a background thread) for every change any replica makes
        (but see `quiet_own_reserves`).

        Pub/sub is at-most-once: a subscriber that was disconnected misses events, so treat
        them as hints to refresh and rebuild the full view with `live()` now and then."""

        def on_message(message: dict[str, Any]) -> None:
            data = message["data"]
            if self._own and self._held_back(data, callback):
                return
            _deliver(data, callback)

        def on_error(error: BaseException, pubsub: Any, thread: PubSubWorkerThread) -> None:
            log.warning("reservation events: %s; resubscribing in %gs", error, _RESUBSCRIBE_S)
            time.sleep(_RESUBSCRIBE_S)

        pubsub = self._client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        pubsub.subscribe(**{self.channel: on_message})
        thread = pubsub.run_in_thread(sleep_time=0.05, daemon=True, exception_handler=on_error)
        subscription = RedisSubscription(thread, self._subscriptions)
        self._subscriptions.append(subscription)
        return subscription

    def quiet_own_reserves(self, unless: Callable[[], bool]) -> None:
        """From now on, the subscribers do not get the reserve events of the grants this store
        object makes, while `unless()` is false (asked per message; see the module docstring).
        Only for a store whose every reserve is its subscriber's own: an allocator's, which
        learns them from `reserve`'s answer (bootstrap, for the store it builds)."""
        self._quiet = unless

    def _held_back(self, data: bytes | str, callback: EventCallback) -> bool:
        """Whether a message is one of this store's own grant steps', held back (on its step,
        while it runs) or dropped (its step is done)."""
        raw = data.encode() if isinstance(data, str) else data
        if not raw.startswith(_RESERVE_MESSAGE):
            return False
        end = raw.find(b'"', len(_RESERVE_MESSAGE))
        first = raw[len(_RESERVE_MESSAGE) : end].decode(errors="replace") if end > 0 else ""
        quiet = self._quiet
        if quiet is None or quiet():
            return False
        with self._own_lock:
            call = self._own.get(first)
            if call is None:
                return False
            if call.held_back is not None:  # running: decided when it is done
                call.held_back.append((data, callback))
        return True

    def _quietly(self, calls: Sequence[_GrantCall]) -> None:
        """Run grant steps (`_run_grants`) with their ids registered as this store's own."""
        own = {grant.id: call for call in calls for grant in call.grants}
        with self._own_lock:
            self._own.update(own)
        done = False
        try:
            self._run_grants(calls)
            done = True
        finally:
            late: builtins.list[tuple[bytes | str, EventCallback]] = []
            with self._own_lock:
                for call in calls:
                    if not done or call.failed:  # one of its grants has an error
                        # its caller does not learn what it took: the events tell
                        late += call.held_back or ()
                        for grant in call.grants:
                            own.pop(grant.id, None)
                            self._own.pop(grant.id, None)
                    call.held_back = None  # done: later messages are dropped
                self._own_done.append(own)
                self._own_done_count += len(own)
                while self._own_done_count > _QUIET_IDS:
                    old = self._own_done.popleft()
                    self._own_done_count -= len(old)
                    for reservation_id in old:
                        del self._own[reservation_id]
            for data, callback in late:
                _deliver(data, callback)

    # --- Redis plumbing ------------------------------------------------------------------

    def _base(self, node: str) -> str:
        return f"{self._prefix}:{{{node}}}:"

    def _context(self, node: str) -> Strings:
        return [self._base(node), node, self.channel]

    def _register_pending(self) -> None:
        for node in sorted(self._pending):
            try:
                self._client.sadd(self._nodes_key(node), node)
            except _UNAVAILABLE:
                continue
            self._pending.discard(node)

    def _nodes_key(self, node: str) -> str:
        """The nodes index set of `node`: one of NODE_BUCKETS sets, each its own slot."""
        return self._bucket_key(zlib.crc32(node.encode()) % NODE_BUCKETS)

    def _bucket_key(self, bucket: int) -> str:
        return f"{self._prefix}:nodes:{{{bucket}}}"

    def _read_nodes(self, tolerant: bool = False) -> Strings:
        """Every node in the index: the buckets, and the single set older versions wrote; one
        pipeline per shard. `tolerant`: the sets of shards that cannot answer are skipped
        (unless none answers)."""
        keys = [self._legacy_nodes_key, *(self._bucket_key(b) for b in range(NODE_BUCKETS))]

        def read(group: Strings) -> Replies:
            with self._client.pipeline(transaction=False) as pipe:
                for key in group:
                    pipe.smembers(key)
                replies = pipe.execute(raise_on_error=False)
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return replies

        results = self._per_shard(read, self._by_shard(keys, lambda key: key))
        found: set[str] = set()
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures and (not tolerant or len(failures) == len(results)):
            raise failures[0]
        for result in results:
            if not isinstance(result, BaseException):
                for reply in result:
                    found.update(_text(node) for node in reply)
        if failures:
            log.warning("nodes index: %d shard(s) unavailable, their nodes skipped", len(failures))
            self._registered |= found
        else:
            self._registered = set(found)
        return sorted(found)

    def _by_shard(self, items: Sequence[T], key_of: Callable[[T], str]) -> Sequence[Sequence[T]]:
        """`items` grouped by the primary serving their key (one group off a cluster), in
        groups of at most FANOUT_BATCH."""
        groups: dict[str, builtins.list[T]] = {}
        if self._cluster:
            cluster: Any = self._client
            for item in items:
                groups.setdefault(cluster.get_node_from_key(key_of(item)).name, []).append(item)
        else:
            groups[""] = list(items)
        return [
            group[i : i + FANOUT_BATCH]
            for group in groups.values()
            for i in range(0, len(group), FANOUT_BATCH)
        ]

    def _per_shard(
        self, action: Callable[[Any], Replies], groups: Sequence[Any]
    ) -> Sequence[Replies | BaseException]:
        """`action` on each group, at most FANOUT_SHARDS at once; an unavailable group's
        result is its exception."""

        def run(group: Any) -> Replies | BaseException:
            try:
                return action(group)
            except _UNAVAILABLE as error:
                return error

        if len(groups) <= 1:
            return [run(group) for group in groups]
        return tuple(self._pool().map(run, groups))

    def _node_of(self, reservation_id: str) -> str:
        """The node an id names; ids without one (older versions) are looked up in the index."""
        head, separator, node = reservation_id.partition(NODE_SEPARATOR)
        if separator:
            if not head or not node or "{" in node or "}" in node:
                raise NotFound(f"reservation {clip(reservation_id)} not found (no such id)")
            return node
        found = self._attempt(lambda: self._client.hget(self._index_key, reservation_id), True)
        if found is None:
            raise NotFound(f"reservation {clip(reservation_id)} not found (released or expired)")
        return _text(found)

    def _mutate(
        self, function: str, node: str, reservation_id: str, args: Strings, wait: bool = False
    ) -> Any:
        """One commit/renew/release step; translates the Lua side's refusals into errors.
        `wait`: acknowledged after WAIT (when configured)."""
        base = self._base(node)
        keys = [base + "res:" + reservation_id, base + "leases", base + "ids", base + "idem"]
        keys += [base + "preempted:" + reservation_id, base + "pending-owner:" + reservation_id]
        reply = self._attempt(lambda: self._write(function, keys, args, wait=wait), retry=False)
        status = _text(reply[0])
        self._unindex(reply[-1])
        if status == "ok":
            return reply
        if status == "notfound":
            raise NotFound(f"reservation {clip(reservation_id)} not found (released or expired)")
        if status == "denied":
            raise PermissionDenied(f"reservation {reservation_id} belongs to another owner")
        if status == "fence":
            raise FailedPrecondition(
                f"reservation {reservation_id}: fencing token {args[-1]} is stale "
                f"(current {_text(reply[1])})"
            )
        if status == "committed":
            raise FailedPrecondition(f"reservation {reservation_id} is committed: no lease")
        if status == "preempted":
            raise preempted_error(reservation_id, _text(reply[1]))
        raise AssertionError(f"{function}: unexpected reply {status!r}")

    def _unindex(self, reservation_ids: Sequence[Any]) -> None:
        """Drop the index entries of gone ids that an older version indexed (ids without
        `@<node>`; others never were). Best effort: a stale entry only costs a NotFound later."""
        legacy = [t for t in (_text(i) for i in reservation_ids) if NODE_SEPARATOR not in t]
        if legacy:
            with contextlib.suppress(*_UNAVAILABLE):
                self._client.hdel(self._index_key, *legacy)

    def _attempt(self, action: Callable[[], T], retry: bool) -> T:
        attempts = 1 + (self._retries if retry else 0)
        for attempt in range(attempts):
            try:
                return action()
            except _UNAVAILABLE as error:
                if attempt + 1 >= attempts:
                    raise Unavailable(
                        f"redis unavailable ({type(error).__name__}): {error}"
                    ) from error
                time.sleep(self._backoff_seconds * 2**attempt)
        raise AssertionError("unreachable")

    def _fcall(self, function: str, keys: Sequence[str], args: Sequence[str]) -> Any:
        """FCALL (FCALL_RO for the read-only functions), loading the library when missing."""
        self._ensure_library()
        command = "FCALL_RO" if function in _READ_ONLY else "FCALL"
        try:
            return self._command(command, function, len(keys), *keys, *args)
        except redis.ResponseError as error:
            if not _is_missing_function(error):
                raise
        self._load_library()
        return self._command(command, function, len(keys), *keys, *args)

    def _commands(self, commands: Sequence[tuple[Any, ...]]) -> Replies:
        """Commands in one round trip on a connection of the pool of a client this store
        built (`_direct`), as its non-transactional pipeline runs them with
        `raise_on_error=False`: one reply per command, a reply error in its place; a
        connection error or timeout disconnects the connection and is raised (see
        `_command`)."""
        client: Any = self._client
        pool = client.connection_pool
        connection = pool.get_connection()
        try:
            connection.send_packed_command(_packed(connection, commands))
            replies: Replies = []
            for _ in commands:
                try:
                    replies.append(connection.read_response())
                except redis.ResponseError as error:
                    replies.append(error)
            return replies
        except _DISCONNECTING:
            connection.disconnect()
            raise
        finally:
            try:
                if connection.should_reconnect():
                    connection.disconnect()
                    connection.connect()
            finally:
                pool.release(connection)

    def _command(self, *args: Any) -> Any:
        """One command's reply. A client this store built (standalone or Sentinel, its own
        retries off: services/common/redis_layout.connect) runs it straight on a connection
        of its pool, as its `execute_command` does with no retries — a connection error or
        timeout disconnects that connection (the next command reconnects; a Sentinel
        client asks for the primary again) and is raised; a reply error is raised — without
        that call path's per-call work (its retry closure, metrics hooks and option parsing:
        ~17 µs of CPU per command, a third of a local round trip's). Any other client
        (given to the store, or a cluster, which routes by key) through `execute_command`."""
        client: Any = self._client  # redis-py's execute_command is untyped
        if not self._direct:
            return client.execute_command(*args)
        pool = client.connection_pool
        connection = pool.get_connection()
        try:
            connection.send_packed_command(_packed(connection, (args,)))
            return connection.read_response()
        except _DISCONNECTING:
            connection.disconnect()
            raise
        finally:
            try:
                if connection.should_reconnect():  # as execute_command: a server's notice
                    connection.disconnect()
                    connection.connect()
            finally:
                pool.release(connection)

    def _write(
        self,
        function: str,
        keys: Sequence[str],
        args: Sequence[str],
        *,
        wait: bool = False,
    ) -> Any:
        """FCALL a writing step. `wait`: with `wait_replicas`, `WAIT` on the connection that
        ran the step; fewer replicas than asked within the timeout -> Unavailable (the step
        happened)."""
        self._ensure_library()
        if not (wait and self._wait_replicas > 0):
            return self._fcall(function, keys, args)
        for attempt in range(3):
            client: Any = self._client
            if self._cluster:  # WAIT must follow the step on the same connection: its primary
                cluster: Any = self._client  # redis-py's cluster API is untyped
                client = cluster.get_redis_connection(cluster.get_node_from_key(keys[0]))
            try:
                with client.pipeline(transaction=False) as pipe:
                    pipe.fcall(function, len(keys), *keys, *args)
                    pipe.wait(self._wait_replicas, self._wait_ms)
                    reply, acked = pipe.execute(raise_on_error=False)
            except _UNAVAILABLE:
                if self._cluster:  # we went around the cluster client: refresh its layout
                    self._refresh_topology()
                raise
            if attempt < 2 and _is_missing_function(reply):
                self._load_library()
                continue
            if attempt < 2 and self._cluster and isinstance(reply, MovedError | AskError):
                # not executed: the slot moved (failover, resharding); learn the new layout
                self._refresh_topology()
                continue
            if isinstance(reply, Exception):
                raise reply
            if isinstance(acked, Exception) or int(acked) < self._wait_replicas:
                raise Unavailable(
                    f"redis: {function} done on the primary but confirmed by {acked} of "
                    f"{self._wait_replicas} replica(s) within {self._wait_ms} ms; retry it"
                )
            return reply
        raise Unavailable(f"redis: {function} keeps failing over")

    def call_function(
        self, function: str, keys: Sequence[str], args: Sequence[str], *, write: bool
    ) -> Any:
        """One step of this library on `keys` (one hash slot) for another store sharing the
        connection (the quota ledger): reads are retried, writes are not (Unavailable), and
        writes are acknowledged after WAIT when the store is configured to wait."""
        if write:
            return self._attempt(lambda: self._write(function, keys, args, wait=True), retry=False)
        return self._attempt(lambda: self._fcall(function, keys, args), retry=True)

    @property
    def key_prefix(self) -> str:
        return self._prefix

    def _refresh_topology(self) -> None:
        """Ask the cluster for its slots again (after a failover or resharding)."""
        cluster: Any = self._client
        with contextlib.suppress(*_UNAVAILABLE):
            cluster.nodes_manager.initialize()

    def _fanout(
        self, function: str, calls: Sequence[tuple[Strings, Strings]], tolerant: bool
    ) -> tuple[Replies, int]:
        """The same function on many nodes: a pipeline per shard (and per FANOUT_BATCH nodes),
        at most FANOUT_SHARDS at once. Returns the replies (in no particular order) and how
        many calls failed; `tolerant`: a batch that cannot answer is counted, not raised,
        unless every batch failed."""
        batches = self._by_shard(calls, lambda call: call[0][0])
        results = self._per_shard(lambda batch: self._fcall_many(function, batch), batches)
        replies: Replies = []
        failures: list[BaseException] = []
        failed = 0
        for batch, result in zip(batches, results, strict=True):
            if isinstance(result, BaseException):
                failures.append(result)
                failed += len(batch)
            else:
                replies.extend(result)
        if failures and (not tolerant or len(failures) == len(batches)):
            raise failures[0]
        return replies, failed

    def _pool(self) -> ThreadPoolExecutor:
        with self._fanout_lock:
            if self._fanout_pool is None:
                self._fanout_pool = ThreadPoolExecutor(FANOUT_SHARDS, "gpualloc-redis-fanout")
            return self._fanout_pool

    def _fcall_many(self, function: str, calls: Sequence[tuple[Strings, Strings]]) -> Replies:
        """The same function on many nodes in one round trip (per shard)."""
        self._ensure_library()
        for _ in range(2):
            with self._client.pipeline(transaction=False) as pipe:
                for keys, args in calls:
                    command = pipe.fcall_ro if function in _READ_ONLY else pipe.fcall
                    command(function, len(keys), *keys, *args)
                replies = pipe.execute(raise_on_error=False)
            errors = [reply for reply in replies if isinstance(reply, Exception)]
            if not errors:
                return replies
            if not all(_is_missing_function(error) for error in errors):
                raise errors[0]
            self._load_library()
        raise Unavailable(f"redis: function {function} keeps disappearing")

    def _ensure_library(self) -> None:
        if self._library_ready:
            return
        with self._library_lock:
            if self._library_ready:
                return
            if self._cluster:
                self._load_library(quiet=True)  # every primary (REPLACE: same code, no change)
                self._library_ready = True
                return
            try:
                loaded = self._client.fcall_ro("gpualloc_version", 0)
            except redis.ResponseError as error:
                if not _is_missing_function(error):
                    raise
                loaded = None
            if loaded is None or _text(loaded) != LIBRARY_VERSION:
                self._client.function_load(_LIBRARY_CODE, replace=True)
            self._library_ready = True

    def _load_library(self, quiet: bool = False) -> None:
        """After FUNCTION FLUSH, a restart without persistence, a failover to a bare node, or a
        resharding onto a new primary. On a cluster: on every primary that answers (an
        unreachable one gets it when a call there finds it missing); none answering raises."""
        if not quiet:
            log.warning("redis functions missing: loading library %s", LIBRARY_NAME)
        if not self._cluster:
            self._client.function_load(_LIBRARY_CODE, replace=True)
            return
        cluster: Any = self._client  # redis-py's cluster API is untyped
        failure: BaseException | None = None
        loaded = 0
        for primary in cluster.get_primaries():
            try:
                cluster.execute_command(
                    "FUNCTION", "LOAD", "REPLACE", _LIBRARY_CODE, target_nodes=primary
                )
                loaded += 1
            except _UNAVAILABLE as error:
                failure = error
        if not loaded and failure is not None:
            raise failure

    def _decode(self, flat: Sequence[Any]) -> Reservation:
        fields = {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}
        doc = orjson.loads(fields["doc"])
        uses = orjson.loads(fields["uses"])
        return Reservation(
            id=fields["id"],
            owner=fields["owner"],
            node=doc["node"],
            claim_names=tuple(doc["claimNames"]),
            allocations=tuple(allocation_from_dict(item) for item in doc["allocations"]),
            hold=Hold(
                tuple(orjson.loads(fields["devices"])),
                tuple(LimitedUse(key, int(amount), int(limit)) for key, amount, limit in uses),
            ),
            state=ReservationState(fields["state"]),
            fencing_token=int(fields["fence"]),
            created_at=int(fields["created"]) / 1000,
            expires_at=int(fields["expires"]) / 1000 if fields["expires"] else None,
            idempotency_key=doc["idempotencyKey"],
            labels=tuple((key, value) for key, value in doc["labels"]),
            request_digest=doc.get("requestDigest", ""),  # absent: written by an older version
            priority_class=doc.get("priorityClass", ""),
            conditions=_conditions(fields.get("conditions", "")),
        )


def _packed(connection: Any, commands: Sequence[tuple[Any, ...]]) -> builtins.list[bytes]:
    """The commands as the connection would send them. With hiredis (a dependency, which
    redis-py then packs with), its packer straight: the same bytes without redis-py's pass
    over every argument for bytearray/memoryview and a command name to split, which these
    (str, int and bytes; "FCALL", "SADD", "WAIT") never need — a batch's pipeline 115 -> 34 µs
    of CPU in a loop (16 commands, 8 of them grant steps of 8 grants)."""
    if _HIREDIS_PACKS:
        return [b"".join([hiredis.pack_command(command) for command in commands])]
    packed: builtins.list[bytes] = connection.pack_commands(commands)
    return packed


_DISCONNECTING = (redis.ConnectionError, redis.TimeoutError, socket.timeout)
"""The errors after which redis-py's call path drops the connection (its Retry's default
`supported_errors`, which `connect` keeps)."""

_READ_ONLY = frozenset(
    {
        "gpualloc_get",
        "gpualloc_list",
        "gpualloc_pending",
        "gpualloc_version",
        "gpualloc_quota_read",
        "gpualloc_quota_consumed_read",
    }
)


@dataclass
class RedisSubscription:
    """A running subscription to the events channel; `close()` stops its thread."""

    _thread: PubSubWorkerThread
    _registry: list[RedisSubscription]

    def close(self) -> None:
        self._thread.stop()
        self._thread.join(timeout=1.0)
        if self in self._registry:
            self._registry.remove(self)


class _Unconfirmed(Unavailable):
    """A grant step done on the primary that WAIT did not see reach enough replicas."""


@dataclass(slots=True)
class _Grant:
    """One request of a placement on its way through `reserve`, and what became of it."""

    request: ReserveRequest
    hold: Hold
    id: str
    lease_ms: int
    reservation: Reservation | None = None  # taken (created) or found (its idempotency key)
    created: bool = False
    conflicts: Sequence[DeviceTaken | UseExceeded] = ()
    error: GpuallocError | None = None


@dataclass
class _GrantCall:
    """One node's `gpualloc_grant_batch` step: its keys, arguments and grants."""

    node: str
    keys: Strings
    args: builtins.list[str | bytes]  # base, node, channel, and the grants as one JSON array
    grants: Sequence[_Grant]
    runs: Sequence[int]  # each grant's run (`_grant_call`): alike requests but the allocations
    reply: Any = None  # a reply that sends the step around again (moved, function missing)
    unconfirmed: _Unconfirmed | None = None
    # its event messages held back while it runs (quiet_own_reserves), with their callbacks
    # (None once it is done: messages still to come are dropped)
    held_back: builtins.list[tuple[bytes | str, EventCallback]] | None = field(default_factory=list)
    failed: bool = False  # one of its grants has an error (`fail`, or an unconfirmed WAIT)

    def fail(self, error: GpuallocError) -> None:
        for grant in self.grants:
            grant.error = error
        self.failed = bool(self.grants)


def _granted(grant: _Grant, fence: int, created: int, expires: int) -> Reservation:
    """The reservation a grant made, from what it sent and the step's reply (times in ms).

    Made as `Reservation(...)` with every field given would make it, without the frozen
    dataclass's `__init__`, which sets each of its 16 fields through `object.__setattr__`
    (~3.4 µs; this ~0.4: its fields' dict made at once, and a batch makes one per item)."""
    request = grant.request
    reservation: Reservation = object.__new__(Reservation)
    object.__setattr__(  # one dict for its fields, made at once
        reservation,
        "__dict__",
        {
            "id": grant.id,
            "owner": request.owner,
            "node": request.node,
            "claim_names": tuple(request.claim_names),
            "allocations": tuple(request.allocations),
            "hold": grant.hold,
            "state": ReservationState.RESERVED,
            "fencing_token": fence,
            "created_at": created / 1000,
            "expires_at": expires / 1000,
            "idempotency_key": request.idempotency_key,
            "labels": tuple((key, value) for key, value in request.labels)
            if request.labels
            else (),
            "request_digest": request.request_digest,
            "priority_class": request.priority_class,
            "redacted": False,
            "conditions": (),
        },
    )
    return reservation


def _check_nodes(
    requests: Sequence[ReserveRequest],
    holds: builtins.list[Hold],
    checked: Mapping[str, object],
) -> builtins.list[Hold] | InvalidArgument:
    """`holds`, unless a node name would break its keys' hash tag (`checked`: nodes known
    good, a call's grants so far by node)."""
    for request in requests:
        if request.node in checked:
            continue
        if "{" in request.node or "}" in request.node:
            return InvalidArgument.at(
                "node", f"{request.node!r}: braces would break the {{node}} hash tag"
            )
    return holds


def _is_redirect(reply: Any) -> bool:
    """A step not executed that can go again: the slot moved, or the library is missing."""
    return isinstance(reply, MovedError | AskError) or _is_missing_function(reply)


def _idempotency_field(owner: str, key: str) -> str:
    """The `idem` field and key of the node's `idem` hash: `json.dumps([owner, key])`, byte
    for byte as every version wrote it (a retry must find what an older version stored), or ""
    without a key. Built from the stdlib encoder's own string escaping: 10x cheaper."""
    if not key:
        return ""
    return "[" + _json_string(owner) + ", " + _json_string(key) + "]"


def _doc(request: ReserveRequest, parts: tuple[str, str, str] | None = None) -> str:
    """The static part of a reservation, stored as JSON next to the fields Lua works on.

    Encoded by orjson (compact, UTF-8: the same JSON values as the stdlib's `json.dumps` that
    older versions wrote, which they read back alike), except allocations carrying opaque
    configuration: its parameters are arbitrary JSON, which orjson would not keep exactly
    (NaN and Infinity become null, integers beyond 64 bits fail), so the stdlib writes those.

    `parts` (`_doc_parts` of a request alike: same node, owner, claim names, key, labels,
    digest and priority class): the document is then its head, the allocations and its tail,
    the same bytes as encoding the whole document (a run's grants share all but the
    allocations: `test_grant_documents_from_shared_parts_are_the_same_bytes`)."""
    if any(item.config for item in request.allocations):
        return json.dumps(_doc_dict(request))
    if parts is None:
        return orjson.dumps(_doc_dict(request)).decode()
    return parts[0] + ",".join([_allocation_json(item) for item in request.allocations]) + parts[1]


def _doc_dict(request: ReserveRequest) -> dict[str, Any]:
    return {
        "node": request.node,
        "claimNames": request.claim_names,
        "allocations": [allocation_result_to_dict(item) for item in request.allocations],
        "idempotencyKey": request.idempotency_key,
        "labels": request.labels,
        "requestDigest": request.request_digest,
        "priorityClass": request.priority_class,
    }


def _doc_parts(request: ReserveRequest) -> tuple[str, str, str]:
    """What `_doc` writes around a request's allocations (its head and tail), and its `idem`
    field: what the grants of a run of alike requests on one node share."""
    head = orjson.dumps({"node": request.node, "claimNames": request.claim_names}).decode()
    tail = orjson.dumps(
        {
            "idempotencyKey": request.idempotency_key,
            "labels": request.labels,
            "requestDigest": request.request_digest,
            "priorityClass": request.priority_class,
        }
    ).decode()
    return (
        head[:-1] + ',"allocations":[',
        "]," + tail[1:],
        _idempotency_field(request.owner, request.idempotency_key),
    )


def _grant_doc(
    request: ReserveRequest, shapes: dict[tuple[Any, ...], tuple[str, str, str]]
) -> tuple[str, str]:
    """A grant's `doc` and `idem` fields, as `_doc` and `_idempotency_field` write them, from
    what one node's grants of a run share (`shapes`, one per `_grant_call`, whose requests keep
    the selectors named by identity alive). The common grant — one allocation of one device
    taken whole (a batch's every item) — is the text around its device's name (`_around`),
    made once per (request alike, result's request, driver, pool, node selector): the device's
    name is then all that is written per grant
    (`test_grant_documents_from_shared_parts_are_the_same_bytes`)."""
    around = _around(request, shapes)
    if around is not None:
        device = request.allocations[0].results[0].device
        return around[0] + _json_text(device) + around[1], around[2]
    request_shape = _request_shape(request)
    parts = shapes.get(request_shape)
    if parts is None:
        parts = shapes[request_shape] = _doc_parts(request)
    return _doc(request, parts), parts[2]


def _request_shape(request: ReserveRequest) -> tuple[Any, ...]:
    """What the documents of requests alike share (`_grant_doc`, `_around`)."""
    return (
        request.owner,
        request.claim_names,
        request.idempotency_key,
        request.labels,
        request.request_digest,
        request.priority_class,
    )


def _around(
    request: ReserveRequest, shapes: dict[tuple[Any, ...], tuple[str, str, str]]
) -> tuple[str, str, str] | None:
    """For a request of one allocation of one device taken whole with nothing else set: the
    text of its `doc` before its device's name, the text after, and its `idem` field (kept in
    `shapes`, see `_grant_doc`); None for any other request."""
    allocations = request.allocations
    if len(allocations) != 1 or len(allocations[0].results) != 1 or allocations[0].config:
        return None
    allocation = allocations[0]
    result = allocation.results[0]
    if not plain_result(result):
        return None
    shape: tuple[Any, ...] = (
        *_request_shape(request),
        result.request,
        result.driver,
        result.pool,
        id(allocation.node_selector),
    )
    around = shapes.get(shape)
    if around is None:
        head, tail, idem = _doc_parts(request)
        text = _allocation_json(allocation)
        device = '"device":' + _json_text(result.device) + "}"
        at = text.index(device)  # the result's last field: its name occurs once before
        around = shapes[shape] = (head + text[: at + 9], text[at + len(device) - 1 :] + tail, idem)
    return around


def _continues(last: ReserveRequest, request: ReserveRequest) -> bool:
    """Whether `request`'s document is the one of `last` (a request `_around` writes, of the
    same node) but for its device: what `_around`'s shape names is the same (the node
    selector by identity), and `request` is one `_around` writes too. One grant after another
    of a run's node is this check, not the shape made and hashed
    (`test_a_runs_grant_documents_share_their_text_around_the_device`)."""
    allocations = request.allocations
    if len(allocations) != 1:
        return False
    allocation = allocations[0]
    results = allocation.results
    if len(results) != 1 or allocation.config:
        return False
    result = results[0]
    before = last.allocations[0]
    was = before.results[0]
    return (
        allocation.node_selector is before.node_selector
        and result.pool == was.pool
        and result.driver == was.driver
        and result.request == was.request
        and request.owner == last.owner
        and request.claim_names == last.claim_names
        and request.idempotency_key == last.idempotency_key
        and request.labels == last.labels
        and request.request_digest == last.request_digest
        and request.priority_class == last.priority_class
        and plain_result(result)
    )


# JSON of one string as orjson writes it (quotes, escapes; non-ASCII kept): the stdlib's C
# encoder, ~2x cheaper for short strings (byte for byte the same: `test_json_text_is_orjsons`)
_json_text: Callable[[str], str] = json.encoder.encode_basestring


def _allocation_json(allocation: AllocationResult) -> str:
    """`orjson.dumps(allocation_result_to_dict(allocation))`, byte for byte; an allocation of
    devices taken whole (a result's four names, the node's selector) written as text, without
    the dicts (`test_allocation_json_is_the_dicts`)."""
    parts = []
    for result in allocation.results:
        if plain_result(result):
            parts.append(
                '{"request":'
                + _json_text(result.request)
                + ',"driver":'
                + _json_text(result.driver)
                + ',"pool":'
                + _json_text(result.pool)
                + ',"device":'
                + _json_text(result.device)
                + "}"
            )
        else:
            return orjson.dumps(allocation_result_to_dict(allocation)).decode()
    if not parts or allocation.config:
        return orjson.dumps(allocation_result_to_dict(allocation)).decode()
    found = '{"devices":{"results":[' + ",".join(parts) + "]}"
    if allocation.node_selector is not None:
        found += ',"nodeSelector":' + _node_selector_text(allocation.node_selector)
    return found + "}"


_SELECTOR_TEXT: dict[int, tuple[NodeSelector, str]] = {}
"""A node selector's JSON by the selector object's identity (the entry keeps it alive, so the
id cannot name another object meanwhile): a node's results share one selector object."""


def _node_selector_text(selector: NodeSelector) -> str:
    found = _SELECTOR_TEXT.get(id(selector))
    if found is not None and found[0] is selector:
        return found[1]
    made = _selector_json(selector)
    if len(_SELECTOR_TEXT) >= 4096:  # bounded
        _SELECTOR_TEXT.clear()
    _SELECTOR_TEXT[id(selector)] = (selector, made)
    return made


def _selector_json(selector: NodeSelector) -> str:
    """`orjson.dumps(node_selector_to_dict(selector))`, byte for byte, written as text (a
    node's first grant of a run writes its selector: `test_selector_json_is_the_dicts`)."""
    terms = []
    for term in selector.node_selector_terms:
        fields = []
        if term.match_expressions:
            fields.append(
                '"matchExpressions":['
                + ",".join([_requirement_json(r) for r in term.match_expressions])
                + "]"
            )
        if term.match_fields:
            fields.append(
                '"matchFields":['
                + ",".join([_requirement_json(r) for r in term.match_fields])
                + "]"
            )
        terms.append("{" + ",".join(fields) + "}")
    return '{"nodeSelectorTerms":[' + ",".join(terms) + "]}"


def _requirement_json(requirement: NodeSelectorRequirement) -> str:
    """A requirement's JSON as serialize's `_requirement` dict (empty fields left out)."""
    fields = []
    if requirement.key:
        fields.append('"key":' + _json_text(requirement.key))
    if requirement.operator:
        fields.append('"operator":' + _json_text(requirement.operator))
    if requirement.values:
        fields.append('"values":[' + ",".join([_json_text(v) for v in requirement.values]) + "]")
    return "{" + ",".join(fields) + "}"


def _conditions(text: str) -> tuple[DeviceCondition, ...]:
    """The `conditions` field: [[device, type, status], ...] (Lua's cjson writes none as {})."""
    found = orjson.loads(text) if text else []
    if not isinstance(found, list):
        return ()
    return tuple(DeviceCondition(str(d), str(t), status is True) for d, t, status in found)


def _deliver(message: bytes | str, callback: EventCallback) -> None:
    """One message of the events channel to `callback`, as one event per change it names."""
    try:
        data = orjson.loads(message)
        op, node = ReservationEventOp(data["op"]), data["node"]
        callback(
            ReservationEvent(
                op,
                data["id"],
                node,
                int(data["fencing_token"]),
                str(data.get("owner") or ""),
                str(data.get("preempted_by") or ""),
            )
        )
        # a step that made several changes on the node (gpualloc_grant_batch) sends one
        # message: the others as [id, fencing token, owner] (one per item of a batch: made
        # as ReservationEvent(...) makes them, without its frozen __init__'s per-field sets)
        for reservation_id, fence, owner in data.get("more", ()):
            event: ReservationEvent = object.__new__(ReservationEvent)
            event.__dict__.update(
                op=op,
                id=reservation_id,
                node=node,
                fencing_token=int(fence),
                owner=str(owner),
                preempted_by="",
            )
            callback(event)
    except Exception:
        log.exception("reservation event callback failed")


def _conflict_item(item: Sequence[Any]) -> DeviceTaken | UseExceeded:
    kind, key = _text(item[0]), _text(item[1])
    if kind == "device":
        return DeviceTaken(key, _text(item[2]))
    return UseExceeded(key, int(_text(item[2])), int(_text(item[3])))


def _check_node(node: str) -> str:
    if "{" in node or "}" in node:
        raise InvalidArgument.at("node", f"{node!r}: braces would break the {{node}} hash tag")
    return node


def _is_missing_function(error: Exception) -> bool:
    return isinstance(error, redis.ResponseError) and "function not found" in str(error).lower()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
