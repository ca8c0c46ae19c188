"""One contract for every InventoryRepository: embedded (memory, and with a snapshot file) and
Redis (a real redis-server). A reopened repository hands back the same generation and content,
so a restarted or standby inventory resumes where the last one stopped."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import redis

from services.common.dra.model import Node, ResourceSlice
from services.common.dra.parse import load_objects
from services.common.errors import InvalidArgument, Unavailable
from services.inventory.adapters.sources.nvidia_smi_xml import parse_nvidia_smi_xml
from services.inventory.adapters.store.embedded import EmbeddedInventoryRepository
from services.inventory.adapters.store.redis_repository import RedisInventoryRepository
from services.inventory.app.service import InventoryService
from services.inventory.core.report import XidEvent
from services.inventory.core.repository import InventoryRepository
from services.inventory.core.state import InventoryState
from tests.conftest import RedisServerFactory, RedisTopologyFactory
from tests.contract.conftest import REDIS_URL_FIXTURES

DATA = Path(__file__).parents[1] / "data"
T4_SLICE_FILE = DATA / "resourceslices" / "openshift-v1.35_2x-tesla-t4_condensed.yaml"
T4_XML = DATA / "nvidia-smi-xml" / "tesla-t4_turing_drv515_telegraf.xml"
A100_MIG_XML = DATA / "nvidia-smi-xml" / "a100-sxm4-40gb_mig-2x3g.20gb_drv510.47.03_netdata.xml"


@dataclass
class RepositoryUnderTest:
    kind: str
    repository: InventoryRepository
    reopen: Callable[[], InventoryRepository]  # a new handle on the same storage


@pytest.fixture(
    params=[
        pytest.param("embedded", id="embedded"),
        pytest.param("snapshot-file", id="snapshot-file"),
        pytest.param("redis", id="redis", marks=pytest.mark.redis),
        pytest.param("redis-sentinel", id="redis-sentinel", marks=pytest.mark.redis),
        pytest.param("redis-cluster", id="redis-cluster", marks=pytest.mark.redis),
        pytest.param("redis-sentinel-wait", id="redis-sentinel-wait", marks=pytest.mark.redis),
        pytest.param("redis-cluster-wait", id="redis-cluster-wait", marks=pytest.mark.redis),
    ]
)
def under_test(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RepositoryUnderTest]:
    opened: list[InventoryRepository] = []

    def track(repository: InventoryRepository) -> InventoryRepository:
        opened.append(repository)
        return repository

    if request.param == "embedded":
        shared = EmbeddedInventoryRepository()
        yield RepositoryUnderTest("embedded", shared, lambda: shared)
    elif request.param == "snapshot-file":
        path = tmp_path / "inventory.json"
        first = track(EmbeddedInventoryRepository(path, min_interval=0.01))
        yield RepositoryUnderTest(
            "snapshot-file", first, lambda: track(EmbeddedInventoryRepository(path))
        )
    else:  # `-wait`: every save acknowledged after WAIT 1 (GPUALLOC_REDIS_WAIT_REPLICAS=1)
        layout = request.param.removesuffix("-wait")
        url: str = request.getfixturevalue(REDIS_URL_FIXTURES[layout])
        wait = 1 if layout != request.param else 0

        def redis_repository() -> InventoryRepository:
            return track(RedisInventoryRepository(url, wait_replicas=wait, wait_timeout=2.0))

        yield RepositoryUnderTest(request.param, redis_repository(), redis_repository)
    for repository in opened:
        repository.close()


def t4_slice() -> ResourceSlice:
    (loaded,) = load_objects(T4_SLICE_FILE.read_text(), str(T4_SLICE_FILE))
    assert isinstance(loaded, ResourceSlice)
    return loaded


def busy_service(repository: InventoryRepository) -> InventoryService:
    """A service that went through every kind of change: apply, report, stale, delete."""
    clock = iter(float(t) for t in range(1000, 2000, 100))
    service = InventoryService(repository=repository, clock=lambda: next(clock), report_ttl=50)
    t4 = t4_slice()
    node = t4.node_name or ""
    service.apply([t4], [Node(node, {"zone": "a"})])
    xml = parse_nvidia_smi_xml(T4_XML.read_text(), node, str(T4_XML))
    gpu = replace(
        xml.gpus[0],
        health=replace(xml.gpus[0].health, xid_events=(XidEvent(79, "2026-01-01T00:00:00Z"),)),
    )
    service.report(replace(xml, gpus=(gpu,)))
    service.report(parse_nvidia_smi_xml(A100_MIG_XML.read_text(), "a100-node", str(A100_MIG_XML)))
    service.sweep()  # at 1200: both reports (1000, 1100) are older than 50 s
    extra = replace(t4, name="short-lived", node_name="other-node", pool=replace(t4.pool, name="p"))
    service.apply([extra])
    service.delete_slices(["short-lived"])
    return service


def assert_same_content(loaded: InventoryState, saved: InventoryState) -> None:
    assert loaded.generation == saved.generation
    assert loaded.slices == saved.slices
    assert loaded.nodes == saved.nodes
    assert loaded.reports == saved.reports
    assert loaded.node_keys() == saved.node_keys()
    for key in saved.node_keys():
        assert loaded.view(key) == saved.view(key)


def test_nothing_saved_loads_as_none(under_test: RepositoryUnderTest) -> None:
    assert under_test.repository.load() is None


def test_a_reopened_repository_resumes_the_same_generation_and_content(
    under_test: RepositoryUnderTest,
) -> None:
    service = busy_service(under_test.repository)
    saved = service.snapshot()
    service.close()  # flushes what is pending
    assert saved.generation == 6
    stale = saved.reports["a100-node"]
    assert stale.stale and stale.stale_since is not None
    loaded = under_test.reopen().load()
    assert loaded is not None
    assert_same_content(loaded, saved)
    assert "other-node" not in loaded.node_keys()


def test_a_resumed_service_continues_the_generation(under_test: RepositoryUnderTest) -> None:
    first = busy_service(under_test.repository)
    first.close()
    repository = under_test.reopen()
    resumed = InventoryService(repository.load(), repository=repository)
    result = resumed.apply([replace(t4_slice(), name="second")])
    assert result.generation == 7
    resumed.close()
    loaded = under_test.reopen().load()
    assert loaded is not None and loaded.generation == 7
    assert set(loaded.slices) == {t4_slice().name, "second"}


def test_the_snapshot_file_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "inventory.json"
    service = busy_service(EmbeddedInventoryRepository(path, min_interval=0.0))
    service.close()
    assert [p.name for p in tmp_path.iterdir()] == ["inventory.json"]  # no temp file left
    data = json.loads(path.read_text())
    assert (data["format"], data["generation"]) == ("gpualloc.io/inventory-snapshot/v1", 6)


@pytest.mark.redis
def test_redis_writes_one_transaction_per_change(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)

    def execs() -> int:
        stats = client.info("commandstats").get("cmdstat_exec", {})
        return int(stats.get("calls", 0)) if isinstance(stats, dict) else 0

    repository = RedisInventoryRepository(redis_url)
    before = execs()
    service = busy_service(repository)
    assert execs() - before == service.generation
    assert int(client.get("{gpualloc:inventory}:generation") or 0) == service.generation
    assert client.hlen("{gpualloc:inventory}:reports") == 2
    service.close()
    client.close()


@pytest.mark.redis
def test_redis_state_of_an_older_version_is_moved_to_the_tagged_keys(redis_url: str) -> None:
    """Older versions wrote `gpualloc:inventory:<name>`: the first load moves it, whole."""
    saved = busy_service(RedisInventoryRepository(redis_url))
    state = saved.snapshot()
    saved.close()
    with redis.Redis.from_url(redis_url) as client:
        for name in ("generation", "slices", "nodes", "reports"):
            client.rename("{gpualloc:inventory}:" + name, "gpualloc:inventory:" + name)

        repository = RedisInventoryRepository(redis_url)
        loaded = repository.load()
        assert loaded is not None
        assert_same_content(loaded, state)
        assert sorted(k.decode() for k in client.keys("*inventory*")) == [
            "{gpualloc:inventory}:generation",
            "{gpualloc:inventory}:nodes",
            "{gpualloc:inventory}:reports",
            "{gpualloc:inventory}:slices",
        ]
        repository.close()


# --- WAIT (GPUALLOC_REDIS_WAIT_REPLICAS): the inventory's saves, as the reservations ----------


def _slice_on(node: str, name: str) -> ResourceSlice:
    t4 = t4_slice()
    return replace(t4, name=name, node_name=node, pool=replace(t4.pool, name=node))


@pytest.mark.redis
def test_a_save_no_replica_confirms_is_unavailable_and_the_next_one_rewrites_it(
    redis_server_factory: RedisServerFactory,
) -> None:
    """No replica: the change is on the primary, the caller gets UNAVAILABLE and the service
    does not publish it; once a replica follows, the next save also undoes the unpublished
    change, so Redis holds what the service published."""
    primary = redis_server_factory()
    repository = RedisInventoryRepository(primary.url, wait_replicas=1, wait_timeout=0.05)
    service = InventoryService(repository=repository)
    with pytest.raises(Unavailable, match="confirmed by 0 of 1 replica"):
        service.apply([_slice_on("node-a", "unpublished")])
    assert service.generation == 0 and not service.snapshot().slices
    with primary.client() as client:  # the primary has it, unpublished
        assert client.hexists("{gpualloc:inventory}:slices", "unpublished")

    replica = redis_server_factory(extra_args=("--replicaof", primary.host, str(primary.port)))
    with replica.client() as client:
        deadline = time.monotonic() + 10
        while client.info("replication")["master_link_status"] != "up":
            assert time.monotonic() < deadline, "the replica did not sync"
            time.sleep(0.05)
    with primary.client() as client:  # and the primary counts it (WAIT asks the primary)
        while "online" not in str(client.info("replication").get("slave0", "")):
            assert time.monotonic() < deadline, "the primary does not see the replica online"
            time.sleep(0.05)
    result = service.apply([_slice_on("node-b", "published")])
    assert result.generation == 1
    with replica.client() as client:  # acknowledged: the replica has it already
        assert client.get("{gpualloc:inventory}:generation") == "1"
    loaded = RedisInventoryRepository(primary.url).load()
    assert loaded is not None
    assert_same_content(loaded, service.snapshot())
    assert set(loaded.slices) == {"published"}
    service.close()


@pytest.mark.redis
def test_waited_saves_survive_the_primary_s_death(
    redis_topology_factory: RedisTopologyFactory,
) -> None:
    """Sentinel, WAIT 1: every change acknowledged before the primary is killed is on the
    promoted replica, and the generation continues from there."""
    group = redis_topology_factory.sentinel()
    service = busy_service(RedisInventoryRepository(group.url, wait_replicas=1, wait_timeout=2.0))
    saved = service.snapshot()
    service.close()
    old = group.primary()
    old.stop(kill=True)
    deadline = time.monotonic() + 30
    while group.primary_address() in (None, (old.host, old.port)):
        assert time.monotonic() < deadline, "no failover within 30 s"
        time.sleep(0.1)
    while True:
        try:
            loaded = RedisInventoryRepository(group.url, socket_timeout=1.0).load()
            break
        except Unavailable:
            assert time.monotonic() < deadline, "the promoted replica does not answer"
            time.sleep(0.1)
    assert loaded is not None
    assert_same_content(loaded, saved)


@pytest.mark.parametrize(
    ("replicas", "timeout", "field"),
    [
        pytest.param(-1, 0.5, "GPUALLOC_REDIS_WAIT_REPLICAS", id="negative-replicas"),
        pytest.param(1, 0.0, "GPUALLOC_REDIS_WAIT_REPLICAS", id="zero-timeout"),
        pytest.param(1, 5.0, "GPUALLOC_REDIS_WAIT_TIMEOUT", id="timeout-not-below-the-socket-s"),
    ],
)
def test_wait_settings_the_socket_cannot_honour_are_refused(
    replicas: int, timeout: float, field: str
) -> None:
    with pytest.raises(InvalidArgument) as raised:
        RedisInventoryRepository(
            "redis://127.0.0.1:1/0", wait_replicas=replicas, wait_timeout=timeout
        )
    assert field in str(raised.value)
