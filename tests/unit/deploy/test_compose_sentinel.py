"""deploy/compose/sentinel.yml, the Sentinel layout of docker-compose.yml (`docker compose -f
docker-compose.yml -f deploy/compose/sentinel.yml up`): merged onto the base file as compose
merges an override, it adds a replica and three Sentinels and points every server at them, with
WAIT; the URL, the Sentinels' `monitor` line, the password and the replica agree; and the data
nodes' and the Sentinels' commands, run here for real on loopback (addresses, ports and
directories localized, RDB snapshots off), make a Sentinel group on which the Sentinels' own
health check passes and the allocator's store and the inventory's repository work through the
servers' URL.

No Docker engine runs in CI: the files are read as YAML (test_compose.py's interpolation).
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from services.allocator.adapters.store.redis_store import RedisReservationStore
from services.allocator.reservations.model import ReservationState, reserve_placement
from services.common.config import read_settings
from services.common.redis_layout import parse_layout
from services.inventory.adapters.store.redis_repository import RedisInventoryRepository
from services.inventory.config import INVENTORY_SETTINGS
from tests.conftest import RedisServer, redis_binary
from tests.contract.conftest import device, reserve_request
from tests.contract.test_inventory_repository import assert_same_content, busy_service
from tests.ports import free_port
from tests.unit.deploy.manifests import ROOT, yaml_documents
from tests.unit.deploy.test_compose import (
    ALLOCATORS,
    compose,
    environment,
    interpolate,
    redis_password,
)

OVERRIDE = ROOT / "deploy" / "compose" / "sentinel.yml"
SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")
SERVERS = ("inventory", *ALLOCATORS)
ADDED = ("redis-replica", *SENTINELS)
SENTINEL_PORT = 26379
REDIS_PORT = 6379
STORE = ("GPUALLOC_REDIS_URL", "GPUALLOC_REDIS_WAIT_REPLICAS")  # what the override changes


def override() -> dict[str, Any]:
    (doc,) = yaml_documents(OVERRIDE)
    assert isinstance(doc, dict)
    return doc


def merged(base: Any, over: Any) -> Any:
    """Compose's merge of an override for what this override sets: mappings (services,
    `environment`, `depends_on`, volumes) merge key by key, anything else (`command`) is
    replaced. (Compose merges `ports` and `volumes` lists by target: the override sets neither
    on a base service, test_it_changes_only_the_store_of_the_base_services checks.)"""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: merged(base[k], v) if k in base else v for k, v in over.items()}}
    return over


def services() -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = merged(compose(), override())["services"]
    return result


def sentinel_words(name: str, shell: dict[str, str] | None = None) -> list[str]:
    """The Sentinel's `sh -c` script as sh splits it (compose's `$$` is a `$` for sh)."""
    command = services()[name]["command"]
    assert command[:2] == ["sh", "-c"]
    script = interpolate(command[2], shell).replace("$$", "$")
    prelude, _, started = script.partition("&& exec ")
    assert prelude.strip() == ": > /tmp/sentinel.conf"  # an empty, writable config file
    return shlex.split(started)


def sentinel_config(words: list[str]) -> list[list[str]]:
    """`--sentinel a b c` arguments as the config lines redis-server makes of them."""
    lines: list[list[str]] = []
    for word in words[2:]:
        if word.startswith("--"):
            lines.append([word[2:]])
        else:
            lines[-1].append(word)
    return lines


def monitor(name: str) -> list[str]:
    (line,) = [c for c in sentinel_config(sentinel_words(name)) if c[:2] == ["sentinel", "monitor"]]
    return line[2:]  # service, host, port, quorum


def test_it_adds_a_replica_and_three_sentinels_of_one_definition() -> None:
    base = set(compose()["services"])
    assert set(services()) == base | set(ADDED)
    first, *others = (services()[name] for name in SENTINELS)
    assert all(other == first for other in others)
    assert first["image"] == services()["redis"]["image"] == services()["redis-replica"]["image"]
    assert "redis-replica-data" in merged(compose(), override())["volumes"]


def test_it_changes_only_the_store_of_the_base_services() -> None:
    base = compose()["services"]
    for name, changes in override()["services"].items():
        if name in ADDED:
            continue
        assert name in base, name
        allowed = {"command"} if name == "redis" else {"environment", "depends_on"}
        assert set(changes) <= allowed, name
        if "environment" in changes:
            assert set(changes["environment"]) == set(STORE)


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in SERVERS])
def test_servers_find_the_primary_through_the_three_sentinels(name: str) -> None:
    env = environment(services()[name])
    layout = parse_layout(env["GPUALLOC_REDIS_URL"])
    assert layout.kind == "sentinel"
    assert layout.nodes == tuple((s, SENTINEL_PORT) for s in SENTINELS)
    service, host, port, quorum = monitor(SENTINELS[0])
    assert (layout.service, layout.db) == (service, 0)
    assert (host, int(port)) == ("redis", REDIS_PORT)
    assert int(quorum) == len(SENTINELS) // 2 + 1
    assert layout.password == redis_password()
    # every server on the same store, with WAIT for the one replica there is
    assert read_settings(env, INVENTORY_SETTINGS)["redis_wait_replicas"] == 1
    inventory = environment(services()["inventory"])
    assert {k: env[k] for k in STORE} == {k: inventory[k] for k in STORE}
    for sentinel in SENTINELS:
        assert services()[name]["depends_on"][sentinel]["condition"] == "service_healthy"


@pytest.mark.parametrize(
    "shell",
    [
        pytest.param({}, id="throwaway-default"),
        pytest.param({"REDIS_PASSWORD": "from-the-shell"}, id="password-from-the-shell"),
    ],
)
def test_data_nodes_and_sentinels_share_the_servers_password(shell: dict[str, str]) -> None:
    password = redis_password(shell)
    for name in ("redis", "redis-replica"):
        command = [interpolate(arg, shell) for arg in services()[name]["command"]]
        assert command[command.index("--requirepass") + 1] == password, name
        assert command[command.index("--masterauth") + 1] == password, name  # rejoining too
        assert command[command.index("--appendonly") + 1] == "yes", name
    replica = services()["redis-replica"]["command"]
    assert replica[replica.index("--replicaof") + 1 :][:2] == ["redis", str(REDIS_PORT)]
    for name in SENTINELS:
        env = environment(services()[name], shell)
        (auth,) = [
            c
            for c in sentinel_config(sentinel_words(name, shell))
            if c[:2] == ["sentinel", "auth-pass"]
        ]
        assert auth == ["sentinel", "auth-pass", "gpualloc", "$SENTINEL_AUTH_PASS"]
        assert env["SENTINEL_AUTH_PASS"] == password
    for name in SERVERS:
        url = environment(services()[name], shell)["GPUALLOC_REDIS_URL"]
        assert parse_layout(url).password == password


def test_dependencies_of_the_merged_file_exist_and_have_health_checks() -> None:
    for name, service in services().items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services(), f"{name} depends on unknown {dependency}"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services()[dependency], dependency


# --- the commands, run for real -----------------------------------------------------------------


@dataclass
class ComposeProcess(RedisServer):
    """One compose service's command on loopback: `argv` as the container would run it."""

    argv: tuple[str, ...] = ()

    def command(self) -> list[str]:
        return list(self.argv)


def localized_data_node(name: str, ports: dict[str, int], directory: Path) -> tuple[str, ...]:
    command = [interpolate(arg, {}) for arg in services()[name]["command"]]
    assert command[0] == "redis-server"
    if "--replicaof" in command:
        at = command.index("--replicaof") + 1
        command[at : at + 2] = ["127.0.0.1", str(ports[command[at]])]
    return (redis_binary(), *command[1:], "--port", str(ports[name]), "--bind", "127.0.0.1",
            "--dir", str(directory), "--save", "")  # fmt: skip


def localized_sentinel(name: str, ports: dict[str, int], directory: Path) -> tuple[str, ...]:
    words = sentinel_words(name)
    assert words[:2] == ["redis-server", "/tmp/sentinel.conf"]
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "sentinel.conf"
    conf.write_text("")
    words[0:2] = [redis_binary(), str(conf)]
    # sh's expansion of "$SENTINEL_AUTH_PASS", from the service's environment as compose sets it
    secret = environment(services()[name])["SENTINEL_AUTH_PASS"]
    words = [w.replace("$SENTINEL_AUTH_PASS", secret) for w in words]
    words[words.index("--port") + 1] = str(ports[name])
    at = words.index("monitor") + 2
    words[at : at + 2] = ["127.0.0.1", str(ports[words[at]])]
    return tuple(words)


def healthy(name: str, ports: dict[str, int]) -> bool:
    """The service's own health check, run against its localized port."""
    test = services()[name]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL"
    check = test[1].replace(f"-p {SENTINEL_PORT}", f"-p {ports[name]}")
    return subprocess.run(["sh", "-c", check], capture_output=True, timeout=10).returncode == 0


@pytest.fixture
def compose_sentinel_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, list[ComposeProcess]]]:
    """The five Redis services started from their commands; the servers' URL, localized."""
    monkeypatch.delenv("REDIS_PASSWORD", raising=False)  # the file's default password
    ports = {name: free_port() for name in ("redis", *ADDED)}
    started: list[ComposeProcess] = []
    try:
        for name in ("redis", *ADDED):
            directory = tmp_path / name
            localize = localized_sentinel if name in SENTINELS else localized_data_node
            process = ComposeProcess(
                redis_binary(), ports[name], directory, argv=localize(name, ports, directory)
            )
            started.append(process)
            _start(process, name in SENTINELS)
        deadline = time.monotonic() + 30
        while not all(healthy(name, ports) for name in SENTINELS):
            assert time.monotonic() < deadline, started[-1].log_tail()  # never healthy
            time.sleep(0.2)
        with redis.Redis(port=ports["redis"], password=redis_password()) as primary:
            while primary.info("replication").get("slave0", {}).get("state") != "online":
                assert time.monotonic() < deadline, "the replica never synced"
                time.sleep(0.05)
        url = environment(services()["allocator-1"])["GPUALLOC_REDIS_URL"]
        for name in SENTINELS:
            url = url.replace(f"{name}:{SENTINEL_PORT}", f"127.0.0.1:{ports[name]}")
        yield url, started
    finally:
        for process in started:
            process.stop(kill=True)


def _start(process: ComposeProcess, sentinel: bool) -> None:
    process.directory.mkdir(parents=True, exist_ok=True)
    if sentinel:
        process.start()  # a Sentinel answers PING without a password
        return
    with process.log_path.open("ab") as log:
        process._process = subprocess.Popen(process.command(), stdout=log, stderr=subprocess.STDOUT)
    client = redis.Redis(port=process.port, password=redis_password(), socket_timeout=0.5)
    deadline = time.monotonic() + 10
    while True:
        try:
            if client.ping():
                break
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            assert process.running, process.log_tail()
            assert time.monotonic() < deadline, process.log_tail()
            time.sleep(0.05)
    client.close()


@pytest.mark.redis
def test_the_commands_make_a_sentinel_group_both_services_work_on(
    compose_sentinel_group: tuple[str, list[ComposeProcess]],
) -> None:
    url, _ = compose_sentinel_group
    wait = int(environment(services()["allocator-1"])["GPUALLOC_REDIS_WAIT_REPLICAS"])
    store = RedisReservationStore(url, socket_timeout=3.0, wait_replicas=wait, wait_timeout=2.0)
    try:
        reservation = reserve_placement(store, [reserve_request(device("gpu-0"), key="compose")])[0]
        assert store.commit(reservation.id, "alice").state is ReservationState.COMMITTED
    finally:
        store.close()
    service = busy_service(RedisInventoryRepository(url, wait_replicas=wait, wait_timeout=2.0))
    saved = service.snapshot()
    service.close()
    loaded = RedisInventoryRepository(url).load()
    assert loaded is not None
    assert_same_content(loaded, saved)
