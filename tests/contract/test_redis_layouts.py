"""The Redis store on Sentinel and Cluster: what only those layouts have.

Functions on every primary, redirections and failovers mapped to UNAVAILABLE (never a raw
redis error), WAIT before acknowledging, a failover followed without a restart, and a shard
that is down making only its own nodes unavailable.
"""

from __future__ import annotations

import subprocess
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
import redis
from redis.cluster import RedisCluster

from services.allocator.adapters.store.redis_store import NODE_BUCKETS, RedisReservationStore
from services.allocator.reservations.model import (
    PendingPreemptions,
    Reservation,
    ReservationState,
    reserve_placement,
)
from services.common.errors import Preempted, Unavailable
from services.common.redis_layout import connect
from tests.conftest import RedisServer, RedisServerFactory, RedisTopologyFactory
from tests.contract.conftest import device, reserve_request
from tests.ports import free_port
from tests.redis_topologies import RedisClusterGroup, RedisTls, SentinelGroup, start_cluster

pytestmark = pytest.mark.redis

GPU0 = device("gpu-0")
FAILOVER_S = 30.0  # a failover takes a few seconds here (1 s timeouts); this is the bound


def _until(what: str, action: Callable[[], Reservation], timeout: float = FAILOVER_S) -> float:
    """Retry `action` while it is UNAVAILABLE; returns the seconds it took to succeed."""
    start = time.monotonic()
    while True:
        try:
            action()
            return time.monotonic() - start
        except Unavailable as error:
            if time.monotonic() - start > timeout:
                raise AssertionError(f"{what}: unavailable after {timeout:g}s: {error}") from None
            time.sleep(0.1)


@pytest.fixture
def cluster_store(redis_cluster_url: str) -> Iterator[RedisReservationStore]:
    store = RedisReservationStore(redis_cluster_url, socket_timeout=1.0)
    try:
        yield store
    finally:
        store.close()


def _nodes_on_distinct_shards(url: str, count: int = 3) -> list[str]:
    """Node names whose `{node}` slots live on `count` different primaries."""
    client = connect(url, socket_timeout=1.0)
    assert isinstance(client, RedisCluster)
    found: dict[str, str] = {}
    index = 0
    while len(found) < count:
        name = f"node-{index}"
        primary = client.get_node_from_key(f"gpualloc:{{{name}}}:ids").name  # type: ignore[no-untyped-call]
        found.setdefault(primary, name)
        index += 1
    client.close()
    return list(found.values())


def test_cluster_library_is_on_every_primary_and_reloaded(
    cluster_store: RedisReservationStore, redis_cluster: RedisClusterGroup
) -> None:
    nodes = _nodes_on_distinct_shards(redis_cluster.url)
    for node in nodes:
        reserve_placement(cluster_store, [reserve_request(device("gpu-0", node), node=node)])[0]
    for primary in redis_cluster.primaries():
        with primary.client() as client:
            libraries = [
                dict(zip(lib[::2], lib[1::2], strict=True)) for lib in client.function_list()
            ]
            assert [lib["library_name"] for lib in libraries] == ["gpualloc"]
    with redis_cluster.primaries()[0].client() as client:
        client.function_flush()  # a primary without the library (a resharding onto a new one)
    for node in nodes:
        reserve_placement(cluster_store, [reserve_request(device("gpu-1", node), node=node)])[0]
    assert len(cluster_store.list()) == 6
    assert {r.node for r in cluster_store.list()} == set(nodes)


def test_cluster_nodes_index_is_one_set_per_bucket(
    cluster_store: RedisReservationStore, redis_cluster: RedisClusterGroup
) -> None:
    """No cross-slot key: the index is NODE_BUCKETS sets, each a single-key command."""
    nodes = [f"node-{i}" for i in range(40)]
    for node in nodes:
        reserve_placement(cluster_store, [reserve_request(device("gpu-0", node), node=node)])[0]
    client = connect(redis_cluster.url, socket_timeout=1.0)
    try:
        members: set[str] = set()
        for bucket in range(NODE_BUCKETS):
            members |= set(client.smembers(f"gpualloc:nodes:{{{bucket}}}"))  # type: ignore[arg-type]
        expected_bucket = zlib.crc32(b"node-7") % NODE_BUCKETS
        assert "node-7" in client.smembers(f"gpualloc:nodes:{{{expected_bucket}}}")
    finally:
        client.close()
    assert members == set(nodes)
    assert {r.node for r in cluster_store.list()} == set(nodes)


def test_a_plain_url_to_one_cluster_node_is_unavailable_not_internal(
    redis_cluster: RedisClusterGroup, redis_cluster_url: str
) -> None:
    """`redis://` at one primary: nodes whose slot is elsewhere answer MOVED -> Unavailable."""
    primary = redis_cluster.primaries()[0]
    nodes = _nodes_on_distinct_shards(redis_cluster_url)
    store = RedisReservationStore(primary.url.removesuffix("/0"), socket_timeout=1.0)
    try:
        outcomes = []
        for node in nodes:
            try:
                reserve_placement(store, [reserve_request(device("gpu-0", node), node=node)])[0]
                outcomes.append("reserved")
            except Unavailable as error:
                assert "MovedError" in str(error)
                outcomes.append("unavailable")
        assert sorted(outcomes) == ["reserved", "unavailable", "unavailable"]
    finally:
        store.close()


@pytest.mark.parametrize(
    "layout",
    [pytest.param("sentinel", id="sentinel"), pytest.param("cluster", id="cluster")],
)
def test_wait_acknowledges_once_a_replica_has_the_step(
    layout: str, request: pytest.FixtureRequest
) -> None:
    url: str = request.getfixturevalue(f"redis_{layout}_url")
    store = RedisReservationStore(url, socket_timeout=3.0, wait_replicas=1, wait_timeout=2.0)
    try:
        reservation = reserve_placement(store, [reserve_request(GPU0, key="k1")])[0]
        committed = store.commit(reservation.id, "alice")
        assert committed.state is ReservationState.COMMITTED
    finally:
        store.close()


def test_wait_without_enough_replicas_is_unavailable_and_retryable(
    redis_server_factory: RedisServerFactory,
) -> None:
    """No replica: the step happens on the primary, the caller is told UNAVAILABLE; a retry
    with the same idempotency key finds the grant (no second lease)."""
    server = redis_server_factory()
    store = RedisReservationStore(server.url, wait_replicas=1, wait_timeout=0.05)
    plain = RedisReservationStore(server.url)
    try:
        with pytest.raises(Unavailable, match="confirmed by 0 of 1"):
            reserve_placement(store, [reserve_request(GPU0, key="k1")])[0]
        [held] = plain.list()
        assert reserve_placement(plain, [reserve_request(GPU0, key="k1")])[0].id == held.id
        with pytest.raises(Unavailable, match="confirmed by 0 of 1"):
            store.commit(held.id, "alice")
        assert plain.get(held.id).state is ReservationState.COMMITTED
    finally:
        store.close()
        plain.close()


def test_sentinel_failover_is_followed_and_waited_commits_survive(
    redis_topology_factory: RedisTopologyFactory,
) -> None:
    group: SentinelGroup = redis_topology_factory.sentinel()
    store = RedisReservationStore(group.url, socket_timeout=3, wait_replicas=1, wait_timeout=1)
    try:
        committed = []
        for index in range(10):
            reservation = reserve_placement(store, [reserve_request(device(f"gpu-{index}"))])[0]
            committed.append(store.commit(reservation.id, "alice").id)
        old = group.primary()
        old.stop(kill=True)

        store_wait_off = RedisReservationStore(group.url, socket_timeout=0.5)
        took = _until(
            "reserve after failover",
            lambda: reserve_placement(store_wait_off, [reserve_request()])[0],
        )
        store_wait_off.close()
        assert group.primary() is not old
        assert took < FAILOVER_S
        assert {r.id for r in store.list() if r.state is ReservationState.COMMITTED} >= set(
            committed
        )
    finally:
        store.close()


def test_cluster_failover_is_followed_and_waited_commits_survive(
    redis_topology_factory: RedisTopologyFactory,
) -> None:
    group = redis_topology_factory.cluster()
    nodes = _nodes_on_distinct_shards(group.url)
    store = RedisReservationStore(group.url, socket_timeout=3, wait_replicas=1, wait_timeout=1)
    try:
        committed = []
        for node in nodes:
            for index in range(4):
                reservation = reserve_placement(
                    store, [reserve_request(device(f"gpu-{index}", node), node=node)]
                )[0]
                committed.append(store.commit(reservation.id, "alice").id)
        victim_node = nodes[0]
        client = connect(group.url, socket_timeout=1.0)
        assert isinstance(client, RedisCluster)
        victim = client.get_node_from_key(f"gpualloc:{{{victim_node}}}:ids")  # type: ignore[no-untyped-call]
        client.close()
        killed = next(s for s in group.servers if s.port == victim.port)
        killed.stop(kill=True)

        wait_off = RedisReservationStore(group.url, socket_timeout=0.5)
        took = _until(
            "reserve on the failed shard",
            lambda: reserve_placement(
                wait_off, [reserve_request(device("gpu-9", victim_node), node=victim_node)]
            )[0],
        )
        wait_off.close()
        assert took < FAILOVER_S
        group.wait_ok()
        live = {r.id for r in store.list() if r.state is ReservationState.COMMITTED}
        assert live >= set(committed)
        # The promoted replica has no replica of its own: WAIT 1 cannot be confirmed there
        # until the old primary is back (as its replica).
        with pytest.raises(Unavailable, match="confirmed by 0 of 1"):
            reserve_placement(
                store, [reserve_request(device("gpu-8", victim_node), node=victim_node)]
            )[0]
        killed.start()
        _until(
            "WAIT after the old primary rejoined",
            lambda: reserve_placement(
                store,
                [  # the key: a grant whose WAIT failed is found, not doubled
                    reserve_request(device("gpu-7", victim_node), node=victim_node, key="rejoin")
                ],
            )[0],
        )
    finally:
        store.close()


def test_a_shard_that_is_down_makes_only_its_nodes_unavailable(
    redis_topology_factory: RedisTopologyFactory,
) -> None:
    """A primary and its replica both gone (no failover possible), full coverage not required:
    nodes on the other shards keep reserving, committing and releasing; expiry skips the dead
    shard (and the index sets it holds) and frees the rest."""
    group = redis_topology_factory.cluster(extra_args=("--cluster-require-full-coverage", "no"))
    nodes = [f"node-{i}" for i in range(30)]
    store = RedisReservationStore(group.url, socket_timeout=0.3)
    client = connect(group.url, socket_timeout=1.0)
    assert isinstance(client, RedisCluster)
    try:
        for node in nodes:  # known to this process: the index is not needed again
            reserve_placement(
                store, [reserve_request(device("gpu-0", node), node=node, lease=0.5)]
            )[0]
        dead = client.get_node_from_key(f"gpualloc:{{{nodes[0]}}}:ids")  # type: ignore[no-untyped-call]
        on_dead = {n for n in nodes if client.get_node_from_key(f"gpualloc:{{{n}}}:ids") == dead}  # type: ignore[no-untyped-call]
        with redis.Redis(host=dead.host, port=dead.port, decode_responses=True) as primary:
            replica_ports = [int(r[1]) for r in primary.execute_command("ROLE")[2]]
        for server in group.servers:
            if server.port in (dead.port, *replica_ports):
                server.stop(kill=True)

        for node in nodes:
            if node in on_dead:
                with pytest.raises(Unavailable):
                    reserve_placement(store, [reserve_request(device("gpu-1", node), node=node)])[0]
                continue
            held = reserve_placement(store, [reserve_request(device("gpu-1", node), node=node)])[0]
            store.release(store.commit(held.id, "alice").id, "alice")
        time.sleep(0.6)
        assert store.expire() > 0  # the leases of live shards' nodes the live index sets name
        with pytest.raises(Unavailable):
            store.list()  # a List must be whole: it cannot skip a shard
        for node in set(nodes) - on_dead:
            assert store.list(node=node) == []
    finally:
        client.close()
        store.close()


def test_resharding_onto_a_new_primary_keeps_every_reservation(
    redis_topology_factory: RedisTopologyFactory, tmp_path: Path
) -> None:
    """`redis-cli --cluster add-node` + `reshard`: a shard's slots move, with their keys, to a
    new primary (here without the function library); every reservation is still there and
    usable, and the library is loaded where a call found it missing."""
    group = redis_topology_factory.cluster()
    store = RedisReservationStore(group.url, socket_timeout=2.0)
    try:
        nodes = [f"node-{i}" for i in range(20)]
        held = {
            n: reserve_placement(store, [reserve_request(device("gpu-0", n), node=n)])[0]
            for n in nodes
        }
        committed = store.commit(held[nodes[0]].id, "alice")
        before = {r.id for r in store.list()}

        new = RedisServer(
            group.servers[0].binary,
            free_port(),
            tmp_path / "new-primary",
            extra_args=group.servers[0].extra_args[:6] + ("--cluster-port", str(free_port())),
        )
        new.start()
        group.servers.append(new)
        source = group.primaries()[0]
        seed = f"{source.host}:{source.port}"
        _cli("--cluster", "add-node", f"{new.host}:{new.port}", seed)
        with source.client() as client:
            source_id = client.cluster("MYID")
            owned = sum(
                int(entry[1]) - int(entry[0]) + 1
                for entry in client.execute_command("CLUSTER", "SLOTS")
                if entry[2][2] == source_id
            )
        with new.client() as client:
            new_id = client.cluster("MYID")
        for server in group.servers:  # every node must know the new one before resharding
            with server.client() as client:
                _wait(lambda c=client: len(c.cluster("NODES")) == 7)  # type: ignore[misc]
                _wait(lambda c=client: c.cluster("INFO")["cluster_state"] == "ok")  # type: ignore[misc]
        _cli(
            "--cluster", "reshard", seed, "--cluster-from", source_id, "--cluster-to", new_id,
            "--cluster-slots", str(owned), "--cluster-yes",
        )  # fmt: skip
        with new.client() as client:
            assert client.dbsize() > 0  # the keys moved with their slots
            assert len(client.function_list()) == 1  # redis-cli's add-node copied the library
            client.function_flush()  # other tooling may not

        assert {r.id for r in store.list()} == before
        assert store.get(committed.id).state is ReservationState.COMMITTED
        assert store.commit(held[nodes[1]].id, "alice").state is ReservationState.COMMITTED
        for node in nodes[1:]:
            store.release(held[node].id, "alice")
            reserve_placement(store, [reserve_request(device("gpu-1", node), node=node)])[0]
        assert len(store.list()) == len(nodes)
        with new.client() as client:
            assert len(client.function_list()) == 1  # loaded where a call found it missing
    finally:
        store.close()


def _cli(*args: str) -> None:
    done = subprocess.run(
        ["redis-cli", *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _wait(ready: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, "not ready"
        time.sleep(0.1)


def test_the_documented_acl_user_runs_the_store_and_the_inventory(
    redis_server_factory: RedisServerFactory,
) -> None:
    """docs/operations.md's `ACL SETUSER` line, as written, is enough for both services."""

    server = redis_server_factory()
    with server.client() as admin:
        admin.execute_command(*_documented_acl("s3cret"))
    url = f"redis://gpualloc:s3cret@{server.host}:{server.port}/0"
    store = RedisReservationStore(url, wait_replicas=1, wait_timeout=0.05)
    try:
        with pytest.raises(Unavailable, match="confirmed by 0 of 1"):  # WAIT ran, no replica
            reserve_placement(store, [reserve_request(GPU0, key="k")])[0]
        [held] = store.list()
        store.release(held.id, "alice")
        assert store.expire() == 0
        with pytest.raises(Unavailable, match="confirmed by 0 of 1"):
            reserve_placement(store, [reserve_request(GPU0, owner="team-a/job/1", key="p")])[0]
        [victim] = store.list()
        with pytest.raises(Unavailable, match="confirmed by 0 of 1"):  # revoked on the primary
            store.revoke(victim.id, victim.fencing_token, by="team-b/job/2")
        assert store.pending_preemptions(["team-a"]) == {
            "team-a": PendingPreemptions(1, (victim.id,))
        }
        with pytest.raises(Preempted):
            store.renew(victim.id, victim.owner, 30)
        assert store.pending_preemptions(["team-a"]) == {"team-a": PendingPreemptions()}
    finally:
        store.close()
    _inventory_reloads(url)


def _documented_acl(password: str) -> list[str]:
    """docs/operations.md's `ACL SETUSER gpualloc ...` line, as written, with `password`."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    (line,) = [s.strip() for s in text.splitlines() if s.strip().startswith("ACL SETUSER gpualloc")]
    return line.replace(">PASSWORD", f">{password}").split()


def _inventory_reloads(url: str) -> None:
    """The inventory's repository at `url` stores a busy service and loads it back."""
    from services.inventory.adapters.store.redis_repository import RedisInventoryRepository
    from tests.contract.test_inventory_repository import busy_service

    service = busy_service(RedisInventoryRepository(url))
    generation = service.generation
    service.close()
    repository = RedisInventoryRepository(url)
    loaded = repository.load()
    repository.close()
    assert loaded is not None and loaded.generation == generation


def _store_round_trip(url: str) -> None:
    """Reserve (confirmed by a replica: WAIT), list, renew, preempt, release, expire at `url`."""
    store = RedisReservationStore(url, socket_timeout=3.0, wait_replicas=1, wait_timeout=2.0)
    try:
        held = reserve_placement(store, [reserve_request(GPU0, key="k")])[0]
        assert [r.id for r in store.list()] == [held.id]
        store.renew(held.id, held.owner, 30)
        store.release(held.id, held.owner)
        victim = reserve_placement(store, [reserve_request(GPU0, owner="team-a/job/1", key="p")])[0]
        store.revoke(victim.id, victim.fencing_token, by="team-b/job/2")
        assert store.pending_preemptions(["team-a"]) == {
            "team-a": PendingPreemptions(1, (victim.id,))
        }
        with pytest.raises(Preempted):
            store.renew(victim.id, victim.owner, 30)
        assert store.expire() == 0 and not store.list()
    finally:
        store.close()


def test_the_documented_acl_user_runs_the_store_and_the_inventory_on_a_cluster(
    redis_cluster: RedisClusterGroup, redis_cluster_url: str
) -> None:
    """The same line applied to every node of a real 3+3 cluster: redis-py's cluster client
    also asks CLUSTER SLOTS and COMMAND (issue 28: without them "Cluster mode is not enabled")."""
    nodes = [s for s in redis_cluster.servers if s.running]
    for server in nodes:  # ACL users are per node: a cluster does not share them
        with server.client() as admin:
            admin.execute_command(*_documented_acl("s3cret"))
    url = redis_cluster_url.replace("redis+cluster://", "redis+cluster://gpualloc:s3cret@")
    try:
        _store_round_trip(url)
        _inventory_reloads(url)
    finally:
        for server in nodes:
            with server.client() as admin:
                admin.execute_command("ACL", "DELUSER", "gpualloc")


def test_a_tls_cluster_with_a_private_ca_and_client_certificates(tmp_path: Path) -> None:
    """`rediss+cluster://...?ssl_ca_certs=...&ssl_certfile=...&ssl_keyfile=...` against a real
    3+3 cluster speaking TLS only (clients, bus, replication) under a private CA that requires
    client certificates: the query's options reach every connection (issue 28: they were
    dropped, and the CA unknown failed CERTIFICATE_VERIFY_FAILED)."""
    tls = RedisTls.create(tmp_path / "pki")
    group = start_cluster(tmp_path / "cluster", tls=tls)
    try:
        assert group.url.startswith("rediss+cluster://") and "ssl_ca_certs=" in group.url
        _store_round_trip(group.url)
        _inventory_reloads(group.url)
        nodes, _, _ = group.url.partition("?")
        other_ca = RedisTls.create(tmp_path / "other").ca
        for options in (
            {"ssl_ca_certs": tls.ca},  # the nodes require a client certificate
            {"ssl_ca_certs": other_ca, "ssl_certfile": tls.cert, "ssl_keyfile": tls.key},
        ):
            with pytest.raises(Unavailable):
                RedisReservationStore(f"{nodes}?{urlencode(options)}", socket_timeout=1.0).list()
    finally:
        group.stop()
