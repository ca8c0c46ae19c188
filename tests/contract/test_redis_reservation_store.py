"""What only the Redis store has: its key layout, its functions library, and its failure modes."""

from __future__ import annotations

import json
import os
import signal
import time
import zlib
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.crc import key_slot

from services.allocator.adapters.store.redis_store import (
    LIBRARY_VERSION,
    NODE_BUCKETS,
    RedisReservationStore,
)
from services.allocator.reservations.model import (
    ReservationEvent,
    ReservationEventOp,
    ReservationState,
    reserve_placement,
    reserved,
)
from services.common.errors import Conflict, InvalidArgument, NotFound, Unavailable
from tests.conftest import RedisServer, RedisServerFactory
from tests.contract.conftest import capacity, counter, device, mem, reserve_request

pytestmark = pytest.mark.redis

GPU0 = device("gpu-0")


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        yield client


@pytest.fixture
def store(redis_url: str) -> Iterator[RedisReservationStore]:
    with_store = RedisReservationStore(redis_url, socket_timeout=1.0)
    try:
        yield with_store
    finally:
        with_store.close()


def test_one_node_keys_share_a_slot(store: RedisReservationStore, raw: redis.Redis) -> None:
    reservation = reserve_placement(
        store, [reserve_request(GPU0, uses=[mem(1000), mem(10, 80, capacity())], key="k1")]
    )[0]

    base = "gpualloc:{node-1}:"
    bucket = f"gpualloc:nodes:{{{zlib.crc32(b'node-1') % NODE_BUCKETS}}}"
    assert reservation.id.endswith("@node-1")  # the id names its node: no index to keep
    assert set(raw.keys("gpualloc:*")) == {
        bucket,
        base + "res:" + reservation.id,
        base + "dev:" + GPU0,
        base + "use:" + counter(),
        base + "use:" + capacity(),
        base + "leases",
        base + "ids",
        base + "fence",
        base + "idem",
    }
    assert len({key_slot(str(key).encode()) for key in raw.keys(base + "*")}) == 1
    assert raw.smembers(bucket) == {"node-1"}
    assert raw.get(base + "dev:" + GPU0) == reservation.id
    assert raw.hgetall(base + "use:" + counter()) == {reservation.id: "1000"}


def test_allocations_are_stored_as_kubernetes_json(
    store: RedisReservationStore, raw: redis.Redis
) -> None:
    reservation = reserve_placement(store, [reserve_request(GPU0)])[0]

    doc = json.loads(raw.hget("gpualloc:{node-1}:res:" + reservation.id, "doc") or "{}")

    assert doc["allocations"] == [
        {
            "devices": {
                "results": [
                    {"request": "gpu-0", "driver": "gpu.nvidia.com", "pool": "node-1",
                     "device": "gpu-0"}
                ]
            }
        }
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("owner", "key"),
    [
        pytest.param("alice", "k1", id="ascii"),
        pytest.param("team-ü/alice", 'k-"é"\\/\n', id="escapes-and-non-ascii"),
    ],
)
def test_documents_read_as_older_versions_wrote_them(
    store: RedisReservationStore, raw: redis.Redis, owner: str, key: str
) -> None:
    """Two versions share a store during an upgrade: the idempotency field keeps the exact
    bytes `json.dumps([owner, key])` gave (a retry looks it up as a hash field), and every
    JSON field reads back with the stdlib's json.loads as older versions read them."""
    request = reserve_request(GPU0, uses=[mem(1000)], owner=owner, key=key)
    reservation = reserve_placement(store, [request])[0]

    fields = raw.hgetall("gpualloc:{node-1}:res:" + reservation.id)
    assert fields["idem"] == json.dumps([owner, key])
    assert raw.hget("gpualloc:{node-1}:idem", json.dumps([owner, key])) == reservation.id
    assert json.loads(fields["devices"]) == [GPU0]
    assert json.loads(fields["uses"]) == [[counter(), "1000", "7000"]]
    doc = json.loads(fields["doc"])
    assert (doc["node"], doc["claimNames"], doc["idempotencyKey"]) == ("node-1", ["claim-a"], key)
    assert store.get(reservation.id) == reservation


def test_the_previous_versions_grant_step_still_works(
    store: RedisReservationStore, raw: redis.Redis
) -> None:
    """The previous version grants through `gpualloc_grant_many` (one argument per field):
    kept in the library, its reservations read back here and block the same devices."""
    reserve_placement(store, [reserve_request(device("gpu-9"))])  # loads the library
    base = "gpualloc:{node-1}:"
    doc = {"node": "node-1", "claimNames": ["claim-a"], "allocations": [],
           "idempotencyKey": "k", "labels": []}  # fmt: skip
    keys = [base + "leases", base + "ids", base + "fence", base + "idem",
            base + "res:res-old@node-1", base + "dev:" + GPU0]  # fmt: skip
    args = [base, "node-1", "gpualloc:events", "1", "res-old@node-1", "alice",
            json.dumps(["alice", "k"]), "60000", json.dumps([GPU0]), "[]",
            json.dumps(doc)]  # fmt: skip
    [[status, _]], _ = raw.fcall("gpualloc_grant_many", len(keys), *keys, *args)

    assert status == "ok"
    assert store.get("res-old@node-1").hold.devices == (GPU0,)
    with pytest.raises(Conflict):
        reserve_placement(store, [reserve_request(GPU0)])
    again = reserve_placement(store, [reserve_request(GPU0, key="k")])  # its idempotency key
    assert [r.id for r in again] == ["res-old@node-1"]


def test_library_is_reloaded_after_function_flush(
    store: RedisReservationStore, raw: redis.Redis
) -> None:
    first = reserve_placement(store, [reserve_request(GPU0)])[0]

    raw.function_flush()

    assert store.get(first.id) == first
    with pytest.raises(Conflict):
        reserve_placement(store, [reserve_request(GPU0)])[0]
    raw.function_flush()
    assert store.expire() == 0
    assert raw.fcall_ro("gpualloc_version", 0) == LIBRARY_VERSION


def test_an_older_library_is_replaced(redis_url: str, raw: redis.Redis) -> None:
    raw.function_load(
        "#!lua name=gpualloc\n"
        "redis.register_function{function_name='gpualloc_version', "
        "callback=function() return 'old' end, flags={'no-writes'}}",
        replace=True,
    )

    store = RedisReservationStore(redis_url)
    try:
        reservation = reserve_placement(store, [reserve_request(GPU0)])[0]
        assert store.get(reservation.id) == reservation
    finally:
        store.close()
    assert raw.fcall_ro("gpualloc_version", 0) == LIBRARY_VERSION


def test_stale_index_entries_read_as_not_found(
    store: RedisReservationStore, raw: redis.Redis
) -> None:
    raw.hset("gpualloc:reservations", "res-crashed", "node-1")  # a reserve that never ran

    with pytest.raises(NotFound):
        store.get("res-crashed")
    winner = reserve_placement(store, [reserve_request(GPU0)])[0]
    with pytest.raises(Conflict):
        reserve_placement(store, [reserve_request(GPU0)])[0]
    store.release(winner.id, "alice")
    assert raw.hkeys("gpualloc:reservations") == ["res-crashed"]


def test_nodes_an_older_version_indexed_are_walked(
    store: RedisReservationStore, raw: redis.Redis
) -> None:
    """Older versions kept every node in one set `<prefix>:nodes`: List and expiry read it too."""
    mine = reserve_placement(store, [reserve_request(device("gpu-9"))])[0]  # loads the library
    raw.delete(f"gpualloc:nodes:{{{zlib.crc32(b'node-1') % NODE_BUCKETS}}}")
    _legacy_reserve(raw, "res-legacy-2", device("gpu-1"))
    _legacy_reserve(raw, "res-legacy", GPU0, lease_ms=1)
    time.sleep(0.01)

    assert store.expire() == 1  # res-legacy, found through the older set only
    assert {r.id for r in store.list()} == {mine.id, "res-legacy-2"}


def _legacy_reserve(
    raw: redis.Redis, reservation_id: str, device_key: str, lease_ms: int = 60000
) -> None:
    """What an older version does: an id without `@node`, indexed in `<prefix>:reservations`,
    reserved with the function it calls (still in the library for replicas of both versions)."""
    base = "gpualloc:{node-1}:"
    raw.sadd("gpualloc:nodes", "node-1")
    raw.hset("gpualloc:reservations", reservation_id, "node-1")
    doc = {"node": "node-1", "claimNames": ["default/c"], "allocations": [],
           "idempotencyKey": "", "labels": []}  # fmt: skip
    keys = [base + "res:" + reservation_id, base + "leases", base + "ids", base + "fence",
            base + "idem", base + "dev:" + device_key]  # fmt: skip
    args = [base, "node-1", "gpualloc:events", reservation_id, "alice", "", str(lease_ms),
            json.dumps([device_key]), "[]", json.dumps(doc)]  # fmt: skip
    status, fields, _ = raw.fcall("gpualloc_reserve", len(keys), *keys, *args)
    assert status == "ok" and "doc" in fields  # the older reply shape: every field


@pytest.mark.parametrize(
    "finish",
    [
        pytest.param(lambda s, i: s.release(i, "alice"), id="release"),
        pytest.param(lambda s, i: s.release(s.commit(i, "alice").id, "alice"), id="commit"),
    ],
)
def test_ids_an_older_version_indexed_still_work(
    store: RedisReservationStore,
    raw: redis.Redis,
    finish: Callable[[RedisReservationStore, str], None],
) -> None:
    reserve_placement(store, [reserve_request(device("gpu-9"))])[0]  # loads the library
    _legacy_reserve(raw, "res-legacy", GPU0)

    assert store.get("res-legacy").node == "node-1"
    with pytest.raises(Conflict):
        reserve_placement(store, [reserve_request(GPU0)])[0]
    finish(store, "res-legacy")

    assert raw.hkeys("gpualloc:reservations") == []
    assert reserve_placement(store, [reserve_request(GPU0)])[0].node == "node-1"


@pytest.mark.parametrize(
    "reservation_id",
    [
        pytest.param("res-x@node-2", id="names-another-node"),
        pytest.param("res-x@", id="names-no-node"),
        pytest.param("@node-1", id="no-id-before-the-node"),
        pytest.param("res-x@node-{1}", id="breaks-the-hash-tag"),
    ],
)
def test_ids_that_name_a_wrong_node_are_not_found(
    store: RedisReservationStore, reservation_id: str
) -> None:
    reserve_placement(store, [reserve_request(GPU0)])[0]

    with pytest.raises(NotFound):
        store.get(reservation_id)
    with pytest.raises(NotFound):
        store.release(reservation_id, "alice")


def test_node_names_cannot_break_the_hash_tag(store: RedisReservationStore) -> None:
    with pytest.raises(InvalidArgument) as raised:
        reserve_placement(store, [reserve_request(GPU0, node="node-{1}")])[0]

    assert raised.value.field_path == "node"


def test_events_are_json_on_the_channel(store: RedisReservationStore, raw: redis.Redis) -> None:
    pubsub = raw.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    pubsub.subscribe(store.channel)
    time.sleep(0.05)

    reservation = reserve_placement(store, [reserve_request(GPU0)])[0]
    deadline, message = time.monotonic() + 2.0, None
    while message is None and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)  # the first read swallows the confirmation
    pubsub.close()

    assert message is not None
    assert json.loads(message["data"]) == {
        "op": "reserve",
        "id": reservation.id,
        "node": "node-1",
        "fencing_token": reservation.fencing_token,
        "owner": "alice",
    }


def _events_until(
    events: list[ReservationEvent], op: ReservationEventOp, reservation_id: str
) -> list[tuple[str, str]]:
    """(op, id) of every event received until `op` of `reservation_id` (channel order)."""
    deadline = time.monotonic() + 5.0
    while not any(e.op is op and e.id == reservation_id for e in list(events)):
        assert time.monotonic() < deadline, f"no {op} event of {reservation_id}"
        time.sleep(0.01)
    return [(str(e.op), e.id) for e in list(events)]


@pytest.mark.parametrize("watched", [False, True], ids=["quiet", "watched"])
def test_quiet_own_reserves_holds_back_the_store_objects_own_grants(
    redis_url: str, watched: bool
) -> None:
    """A store told `quiet_own_reserves` does not deliver the reserve events of its own grants
    (one placement, and a batch of three on one node: one message) while `unless()` is false,
    and delivers them while it is true; another store object's reserves (another replica's)
    and every other op reach its subscribers as before."""
    own = RedisReservationStore(redis_url)
    other = RedisReservationStore(redis_url)
    events: list[ReservationEvent] = []
    own.quiet_own_reserves(unless=lambda: watched)
    subscription = own.subscribe(events.append)
    try:
        time.sleep(0.1)  # subscribed
        [mine] = reserve_placement(own, [reserve_request(device("gpu-0"))])
        batch = own.reserve([[reserve_request(device(f"gpu-{i}"))] for i in (1, 2, 3)])
        [theirs] = reserve_placement(other, [reserve_request(device("gpu-4"), owner="bob")])
        own.release(mine.id, "alice")
        seen = _events_until(events, ReservationEventOp.RELEASE, mine.id)

        batch_ids = [r.id for outcome in batch for r in reserved(outcome)]
        own_reserves = [("reserve", mine.id), *(("reserve", i) for i in batch_ids)]
        expected = [*own_reserves, ("reserve", theirs.id)] if watched else [("reserve", theirs.id)]
        assert seen == [*expected, ("release", mine.id)]
    finally:
        subscription.close()
        own.close()
        other.close()


def test_quiet_own_reserves_delivers_a_failed_steps_events(
    redis_server_factory: RedisServerFactory,
) -> None:
    """A grant step that happened on the primary but failed for its caller (WAIT found no
    replica: UNAVAILABLE) is not in the caller's answer: its event reaches the subscribers."""
    server = redis_server_factory()
    store = RedisReservationStore(server.url, wait_replicas=1, wait_timeout=0.05)
    events: list[ReservationEvent] = []
    store.quiet_own_reserves(unless=lambda: False)
    subscription = store.subscribe(events.append)
    try:
        time.sleep(0.1)  # subscribed
        with pytest.raises(Unavailable, match="confirmed by 0 of 1"):
            reserve_placement(store, [reserve_request(GPU0, key="k1")])
        [held] = store.list()
        assert _events_until(events, ReservationEventOp.RESERVE, held.id) == [("reserve", held.id)]
    finally:
        subscription.close()
        store.close()


# --- failure modes ----------------------------------------------------------------------------


def test_stopped_redis_is_unavailable_quickly(redis_server_factory: RedisServerFactory) -> None:
    server = redis_server_factory()
    store = RedisReservationStore(server.url, socket_timeout=0.5, backoff_seconds=0.01)
    reserve_placement(store, [reserve_request(GPU0)])[0]

    server.stop(kill=True)
    for call in (
        lambda: reserve_placement(store, [reserve_request(device("gpu-1"))])[0],
        lambda: reserve_placement(store, [reserve_request(device("gpu-1"), key="k")])[0],  # retried
        store.live,
    ):
        started = time.monotonic()
        with pytest.raises(Unavailable):
            call()
        assert time.monotonic() - started < 1.5

    server.start()
    assert reserve_placement(store, [reserve_request(device("gpu-1"))])[0].node == "node-1"
    store.close()


def test_connections_the_server_closed_are_replaced(
    store: RedisReservationStore, raw: redis.Redis
) -> None:
    """The store's steps run straight on its pool's connections (`_command`, `_commands`): one
    the server closed is replaced before the next step, whichever way the step goes."""
    first = reserve_placement(store, [reserve_request(GPU0)])[0]

    def close_the_stores_connections() -> None:
        assert raw.client_kill_filter(_type="normal", skipme=True) >= 1

    close_the_stores_connections()
    # a registered node: one FCALL alone
    assert reserve_placement(store, [reserve_request(device("gpu-1"))])[0].node == "node-1"
    close_the_stores_connections()
    # a node not yet in the nodes index: its registration and the step in one pipeline
    other = reserve_placement(store, [reserve_request(device("gpu-2"), node="node-2")])[0]
    assert raw.sismember(f"gpualloc:nodes:{{{zlib.crc32(b'node-2') % NODE_BUCKETS}}}", "node-2")
    close_the_stores_connections()
    assert store.get(first.id) == first  # a read (FCALL_RO)
    store.release(other.id, "alice")
    with pytest.raises(NotFound):
        store.get(other.id)


def test_hung_redis_is_unavailable_after_the_socket_timeout(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory()
    store = RedisReservationStore(server.url, socket_timeout=0.3, retries=0)
    reserve_placement(store, [reserve_request(GPU0)])[0]
    pid = int(server.client().info("server")["process_id"])

    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(Unavailable):
            reserve_placement(store, [reserve_request(device("gpu-1"))])[0]
        elapsed = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)

    assert 0.25 < elapsed < 1.5
    store.close()


def test_aof_restart_keeps_reservations_and_fencing(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory(appendonly=True, extra_args=("--appendfsync", "always"))
    store = RedisReservationStore(server.url, socket_timeout=1.0)
    committed = reserve_placement(store, [reserve_request(GPU0)])[0]
    committed = store.commit(committed.id, "alice")
    leased = reserve_placement(store, [reserve_request(device("gpu-1"))])[0]

    server.stop(kill=True)
    server.start()

    assert store.get(committed.id) == committed
    assert store.get(leased.id) == leased  # the lease's absolute expiry survived too
    with pytest.raises(Conflict):
        reserve_placement(store, [reserve_request(GPU0, owner="bob")])[0]
    after = reserve_placement(store, [reserve_request(device("gpu-2"))])[0]
    assert after.fencing_token == leased.fencing_token + 1
    assert store.get(committed.id).state is ReservationState.COMMITTED
    store.close()


def test_acl_user_in_the_url(redis_server_factory: RedisServerFactory) -> None:
    server: RedisServer = redis_server_factory(
        extra_args=("--user", "gpualloc", "on", ">s3cret", "~gpualloc:*", "&*", "+@all")
    )
    good = f"redis://gpualloc:s3cret@{server.host}:{server.port}/0"
    bad = f"redis://gpualloc:wrong@{server.host}:{server.port}/0"

    with_good = RedisReservationStore(good)
    assert reserve_placement(with_good, [reserve_request(GPU0)])[0].owner == "alice"
    with_good.close()
    with_bad = RedisReservationStore(bad, retries=0)
    with pytest.raises(Unavailable):
        reserve_placement(with_bad, [reserve_request(GPU0)])[0]
    with_bad.close()


def test_fencing_tokens_keep_increasing_after_data_loss(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory()  # no persistence: a restart loses everything
    store = RedisReservationStore(server.url, socket_timeout=1.0)
    before = reserve_placement(store, [reserve_request(GPU0)])[0]

    server.stop(kill=True)
    server.start()
    after = reserve_placement(store, [reserve_request(GPU0)])[0]

    assert after.fencing_token > before.fencing_token
    assert before.fencing_token > before.created_at * 1000  # seeded from the server's clock
    store.close()
