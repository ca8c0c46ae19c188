"""The ResourceSlice watch (adapters/kube_slices.py) through the real kubernetes client against a
protocol-level API server (tests/kube_apiserver.py): list, watch, bookmarks, 410 relists,
malformed slices, dropped connections and a server that goes away.

Nothing here waits a fixed time: every check polls the inventory with a deadline.
"""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import kubernetes
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.inventory.v1 import inventory_pb2, inventory_pb2_grpc
from services.common.dra.model import ResourceSlice
from services.common.dra.parse import load_objects
from services.common.errors import InvalidArgument
from services.common.health import Health, ServingStatus
from services.inventory.adapters.sources.kube_slices import (
    Backoff,
    KubeSliceWatch,
    ResourceSliceApi,
    api_client_from_settings,
)
from services.inventory.app.service import InventoryService
from services.inventory.bootstrap import (
    KUBE_WATCH_HEALTH_NAME,
    build_inventory,
    seed_inventory,
    start_kube_watch,
)
from services.inventory.config import InventorySettings
from tests.kube_apiserver import FakeKubeApiServer
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "resourceslices"
T4_FILE = DATA / "openshift-v1.35_2x-tesla-t4_condensed.yaml"
T4_NAME = "harpatil4220c-g9kfm-gpu-c-rd8r8-gpu.nvidia.com-wvrlc"
T4_NODE = "harpatil4220c-g9kfm-gpu-c-rd8r8"
DEADLINE_SECONDS = 15.0


def t4_slice(name: str = T4_NAME, node: str = T4_NODE, version: str = "v1") -> dict[str, Any]:
    """The real sample slice (tests/data/resourceslices), renamed onto another node if asked."""
    doc: dict[str, Any] = yaml.safe_load(T4_FILE.read_text())
    doc["apiVersion"] = f"resource.k8s.io/{version}"
    doc["metadata"] = {"name": name}
    doc["spec"]["nodeName"] = node
    doc["spec"]["pool"]["name"] = node
    return doc


def malformed(doc: dict[str, Any]) -> dict[str, Any]:
    """The slice with an attribute gpualloc rejects (two value kinds at once)."""
    bad = copy.deepcopy(doc)
    bad["spec"]["devices"][0]["attributes"]["productName"] = {"string": "T4", "int": 4}
    return bad


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_SECONDS}s: {what}")
        time.sleep(0.01)


def slice_names(service: InventoryService) -> list[str]:
    return sorted(service.snapshot().slices)


@pytest.fixture
def kube_api() -> Iterator[FakeKubeApiServer]:
    api = FakeKubeApiServer().start()
    yield api
    api.stop()


@pytest.fixture
def start_watch(
    kube_api: FakeKubeApiServer,
) -> Iterator[Callable[..., tuple[InventoryService, KubeSliceWatch]]]:
    started: list[KubeSliceWatch] = []

    def start(
        service: InventoryService | None = None, **options: Any
    ) -> tuple[InventoryService, KubeSliceWatch]:
        service = service or InventoryService()
        client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube_api.url))
        api = ResourceSliceApi(client, page_size=options.pop("page_size", 500))
        options.setdefault("backoff", Backoff(0.01, 0.1))
        watch = KubeSliceWatch(service, api, **options).start()
        started.append(watch)
        return service, watch

    yield start
    for watch in started:
        watch.stop()


def test_the_first_list_applies_every_page_in_one_generation(kube_api, start_watch):
    kube_api.create(t4_slice())
    for index in range(4):
        kube_api.create(t4_slice(f"t4-{index}", f"node-{index}"))
    service, watch = start_watch(page_size=2)
    assert watch.wait_synced(DEADLINE_SECONDS)
    names = [T4_NAME, *(f"t4-{i}" for i in range(4))]
    assert slice_names(service) == sorted(names)
    assert service.generation == 1
    [expected] = load_objects(T4_FILE.read_text(), str(T4_FILE))
    assert service.snapshot().slices[T4_NAME] == expected  # the real sample, parsed alike
    view = service.snapshot().view(T4_NODE)
    assert view is not None and [d.name for d in view.slices[0].devices] == ["gpu-0", "gpu-1"]
    status = watch.status()
    assert (status.api_version, status.resource_version) == (
        "resource.k8s.io/v1",
        kube_api.resource_version,
    )
    assert (status.lists, status.slices, status.malformed) == (1, 5, 0)
    lists = [r for r in kube_api.requests if not r.watch]
    assert [r.query.get("limit") for r in lists] == ["2", "2", "2"]
    eventually(lambda: any(r.watch for r in kube_api.requests), "a watch follows the list")
    [first_watch] = [r for r in kube_api.requests if r.watch]
    assert first_watch.query["resourceVersion"] == status.resource_version
    assert first_watch.query["allowWatchBookmarks"] == "true"


def test_watch_events_add_modify_and_delete_slices(kube_api, start_watch):
    kube_api.create(t4_slice())
    service, watch = start_watch()
    assert watch.wait_synced(DEADLINE_SECONDS)
    assert service.generation == 1

    kube_api.create(t4_slice("t4-b", "node-b"))
    eventually(lambda: "t4-b" in service.snapshot().slices, "ADDED reaches the inventory")
    assert service.generation == 2
    view = service.snapshot().view("node-b")
    assert view is not None and len(view.slices) == 1

    changed = t4_slice("t4-b", "node-b")
    changed["spec"]["devices"] = changed["spec"]["devices"][:1]
    kube_api.update(changed)
    eventually(
        lambda: len(service.snapshot().slices["t4-b"].devices) == 1, "MODIFIED replaces the slice"
    )
    assert service.generation == 3

    kube_api.delete("t4-b")
    eventually(lambda: "t4-b" not in service.snapshot().slices, "DELETED removes it")
    assert service.generation == 4
    assert service.snapshot().view("node-b") is None
    assert slice_names(service) == [T4_NAME]
    eventually(
        lambda: watch.status().resource_version == kube_api.resource_version, "version followed"
    )
    assert (watch.status().events, watch.status().lists) == (3, 1)


def test_a_bookmark_advances_the_resource_version_only(kube_api, start_watch):
    kube_api.create(t4_slice())
    service, watch = start_watch()
    assert watch.wait_synced(DEADLINE_SECONDS)
    version = kube_api.bookmark()
    eventually(lambda: watch.status().resource_version == version, "the bookmark's version")
    assert service.generation == 1 and watch.status().events == 0


def test_410_gone_relists_and_applies_the_difference(kube_api, start_watch):
    kube_api.create(t4_slice())
    kube_api.create(t4_slice("t4-gone", "node-gone"))
    service, watch = start_watch()
    assert watch.wait_synced(DEADLINE_SECONDS)
    assert slice_names(service) == sorted([T4_NAME, "t4-gone"])

    kube_api.stop()  # the watch is away...
    kube_api.delete("t4-gone")
    kube_api.create(t4_slice("t4-new", "node-new"))
    kube_api.compact()  # ...longer than the server keeps history
    kube_api.start()

    eventually(lambda: watch.status().lists == 2, "a 410 makes the watch list again")
    assert slice_names(service) == sorted([T4_NAME, "t4-new"])
    assert watch.status().expired >= 1
    assert watch.status().resource_version == kube_api.resource_version
    assert service.snapshot().view("node-gone") is None


def test_a_watch_expired_at_once_every_time_backs_off_between_lists(kube_api, start_watch):
    kube_api.create(t4_slice())
    kube_api.expire_every_watch()
    _, watch = start_watch(backoff=Backoff(0.2, 0.2))  # 0.1-0.2 s between lists
    eventually(lambda: watch.status().expired >= 3, "the watch keeps expiring")
    time.sleep(1.0)
    status = watch.status()
    # Without backoff a relist followed at once (hundreds per second); with it, at most one
    # list per 0.1 s of the time the test waited in all.
    assert status.lists <= status.expired + 1
    assert status.lists < 30


def test_a_malformed_slice_is_skipped_counted_and_never_half_applied(kube_api, start_watch):
    kube_api.create(t4_slice())
    kube_api.create(malformed(t4_slice("t4-bad", "node-bad")))
    service, watch = start_watch()
    assert watch.wait_synced(DEADLINE_SECONDS)
    assert slice_names(service) == [T4_NAME]  # the good one applied, the bad one skipped
    assert watch.status().malformed == 1

    kube_api.update(malformed(t4_slice()))  # a slice turning malformed leaves the inventory
    eventually(lambda: slice_names(service) == [], "the malformed version removed the slice")
    assert watch.status().malformed == 2

    kube_api.update(t4_slice("t4-bad", "node-bad"))  # fixed: now it is applied
    eventually(lambda: slice_names(service) == ["t4-bad"], "the fixed slice arrives")
    assert watch.status().errors == 0


def test_a_dropped_watch_resumes_from_the_last_resource_version(kube_api, start_watch):
    kube_api.create(t4_slice())
    service, watch = start_watch()
    assert watch.wait_synced(DEADLINE_SECONDS)
    eventually(lambda: kube_api.open_watches() == 1, "the watch is open")
    kube_api.drop_watches()
    kube_api.create(t4_slice("t4-after", "node-after"))
    eventually(lambda: "t4-after" in service.snapshot().slices, "the resumed watch delivers")
    assert watch.status().lists == 1  # resumed, not relisted
    assert watch.status().errors >= 1


def test_the_api_server_going_away_backs_off_and_reconnects(kube_api, start_watch):
    kube_api.create(t4_slice())
    health: dict[str, bool] = {}
    service, watch = start_watch(on_serving=lambda ok: health.update(serving=ok))
    assert watch.wait_synced(DEADLINE_SECONDS)
    eventually(lambda: health.get("serving") is True, "serving once listed")

    kube_api.stop()
    eventually(lambda: watch.status().errors >= 3, "connection failures are retried")
    status = watch.status()
    assert not status.synced and status.last_error is not None
    assert health["serving"] is False
    kube_api.create(t4_slice("t4-meanwhile", "node-meanwhile"))  # history kept: no 410

    kube_api.start()
    eventually(lambda: "t4-meanwhile" in service.snapshot().slices, "back after reconnecting")
    assert watch.status().lists == 1 and watch.status().synced
    eventually(lambda: health.get("serving") is True, "serving again")


def test_the_server_ending_a_watch_starts_the_next_one(kube_api, start_watch):
    kube_api.create(t4_slice())
    service, watch = start_watch(watch_timeout=(1, 1))
    assert watch.wait_synced(DEADLINE_SECONDS)
    eventually(
        lambda: sum(r.watch for r in kube_api.requests) >= 2, "a new watch after timeoutSeconds"
    )
    kube_api.create(t4_slice("t4-later", "node-later"))
    eventually(lambda: "t4-later" in service.snapshot().slices, "the next watch delivers")
    assert watch.status().lists == 1


def test_v1beta2_is_used_when_v1_is_not_served(start_watch):
    api = FakeKubeApiServer(versions=("v1beta2",)).start()
    try:
        api.create(t4_slice(version="v1beta2"))
        service = InventoryService()
        client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=api.url))
        watch = KubeSliceWatch(service, ResourceSliceApi(client), backoff=Backoff(0.01, 0.1))
        watch.start()
        try:
            assert watch.wait_synced(DEADLINE_SECONDS)
            assert watch.status().api_version == "resource.k8s.io/v1beta2"
            assert service.snapshot().slices[T4_NAME].api_version == "resource.k8s.io/v1beta2"
            api.create(t4_slice("t4-beta", "node-beta", version="v1beta2"))
            eventually(lambda: "t4-beta" in service.snapshot().slices, "v1beta2 watch")
        finally:
            watch.stop()
        assert [r.version for r in api.requests[:2]] == ["v1", "v1beta2"]
    finally:
        api.stop()


def own_slice(name: str, node: str) -> ResourceSlice:
    [loaded] = load_objects(yaml.safe_dump(t4_slice(name, node)), name)
    assert isinstance(loaded, ResourceSlice)
    return loaded


def test_the_watch_owns_cluster_and_restored_slices_only(kube_api, start_watch):
    service = InventoryService()
    service.apply([own_slice("restored-stale", "node-stale"), own_slice("from-grpc", "node-g")])
    kube_api.create(t4_slice())
    kube_api.create(t4_slice("t4-b", "node-b"))
    _, watch = start_watch(service, adopt=["restored-stale"])
    assert watch.wait_synced(DEADLINE_SECONDS)
    # The restored slice the cluster no longer has is gone; the gRPC-applied one stays.
    assert slice_names(service) == sorted([T4_NAME, "t4-b", "from-grpc"])
    assert service.generation == 2

    service.apply([replace(own_slice("t4-b", "node-b"), labels={"from": "grpc"})])
    kube_api.delete("t4-b")  # a cluster name stays the cluster's, whoever wrote it last
    eventually(lambda: "t4-b" not in service.snapshot().slices, "the cluster's delete wins")
    service.delete_slices([T4_NAME])  # deleted behind the watch's back: its DELETED is a no-op
    kube_api.delete(T4_NAME)
    eventually(lambda: watch.status().events == 2, "both deletes seen")
    assert slice_names(service) == ["from-grpc"]
    assert watch.status().errors == 0


def test_stop_ends_an_open_watch(kube_api, start_watch):
    kube_api.create(t4_slice())
    _, watch = start_watch()
    assert watch.wait_synced(DEADLINE_SECONDS)
    eventually(lambda: kube_api.open_watches() == 1, "the watch is open")
    watch.stop(timeout=DEADLINE_SECONDS)
    assert watch._thread is not None and not watch._thread.is_alive()


# --- wiring: settings -> kubeconfig -> watch -> health -------------------------------------


def write_kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "reader", "user": {"token": "not-checked"}}],
        "contexts": [
            {"name": "other", "context": {"cluster": "nowhere", "user": "reader"}},
            {"name": "fake", "context": {"cluster": "fake", "user": "reader"}},
        ],
        "current-context": "other",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_inventory_app_mirrors_the_cluster_from_a_kubeconfig(kube_api, tmp_path):
    kube_api.create(t4_slice())
    kubeconfig = write_kubeconfig(tmp_path / "config", kube_api.url)
    settings = InventorySettings.from_env(
        {
            "GPUALLOC_KUBE_WATCH": "kubeconfig",
            "GPUALLOC_KUBECONFIG": str(kubeconfig),
            "GPUALLOC_KUBE_CONTEXT": "fake",
        }
    )
    app = build_inventory(settings=settings, sweep=False)
    health = Health()
    try:
        watch = start_kube_watch(app, settings, health)
        assert watch is not None and watch.wait_synced(DEADLINE_SECONDS)
        assert slice_names(app.service) == [T4_NAME]
        eventually(
            lambda: health.status(KUBE_WATCH_HEALTH_NAME) is ServingStatus.SERVING, "healthy"
        )
    finally:
        app.close()
    assert health.status(KUBE_WATCH_HEALTH_NAME) is ServingStatus.NOT_SERVING


def test_the_client_keeps_its_connections_alive_with_tcp_keepalive(kube_api, tmp_path):
    """A watch whose connection died silently (a load balancer dropped it, the API server
    vanished) must fail within minutes: the sockets carry client-go's keepalive timings."""
    kube_api.create(t4_slice())
    kubeconfig = write_kubeconfig(tmp_path / "config", kube_api.url)
    client = api_client_from_settings("kubeconfig", str(kubeconfig), "fake")
    try:
        assert ResourceSliceApi(client).list().items  # one request: a pooled connection
        pool = client.rest_client.pool_manager.connection_from_url(kube_api.url)
        sockets = [c.sock for c in list(pool.pool.queue) if c is not None and c.sock]
        assert sockets
        for sock in sockets:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        client.close()


def test_the_watch_is_off_by_default(tmp_path):
    settings = InventorySettings.from_env({})
    app = build_inventory(settings=settings, sweep=False)
    try:
        assert settings.kube_watch == "off"
        assert start_kube_watch(app, settings) is None
    finally:
        app.close()


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        pytest.param({"GPUALLOC_KUBE_WATCH": "yes"}, "GPUALLOC_KUBE_WATCH", id="unknown-mode"),
        pytest.param(
            {"GPUALLOC_KUBE_WATCH": "kubeconfig", "GPUALLOC_KUBECONFIG": "/nonexistent/config"},
            "GPUALLOC_KUBECONFIG",
            id="missing-kubeconfig",
        ),
        pytest.param(
            {"GPUALLOC_KUBE_WATCH": "in-cluster"},
            "GPUALLOC_KUBE_WATCH",
            id="in-cluster-outside-a-pod",
        ),
    ],
)
def test_a_watch_that_cannot_be_configured_names_the_setting(env, variable, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # in-cluster: not in a pod
    with pytest.raises(InvalidArgument) as info:
        settings = InventorySettings.from_env(env)
        app = build_inventory(settings=settings, sweep=False)
        try:
            start_kube_watch(app, settings)
        finally:
            app.close()
    assert info.value.field_path == variable


# --- the commands: a real process mirrors the fake cluster, serves it, stops cleanly ----------

COMMANDS = {
    "gpualloc-inventory": [sys.executable, "-m", "services.inventory", "--listen"],
    "gpualloc-serve": [sys.executable, "-m", "services.cli", "serve", "--listen"],
}


def node_names(stub: inventory_pb2_grpc.InventoryStub) -> list[str]:
    got = stub.GetInventory(inventory_pb2.GetInventoryRequest(), timeout=5)
    return [n.node.name for n in got.inventory.nodes]


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_the_servers_mirror_the_cluster_and_stop_on_sigterm(kube_api, tmp_path, command):
    kube_api.create(t4_slice())
    address = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "GPUALLOC_KUBE_WATCH": "kubeconfig",
        "GPUALLOC_KUBECONFIG": str(write_kubeconfig(tmp_path / "config", kube_api.url)),
        "GPUALLOC_KUBE_CONTEXT": "fake",
        "GPUALLOC_REDIS_URL": "",
        "GPUALLOC_LOG_FORMAT": "text",
    }
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [*command, address], cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
    channel = grpc.insecure_channel(address)
    try:
        health = health_pb2_grpc.HealthStub(channel)
        stub = inventory_pb2_grpc.InventoryStub(channel)

        def watch_serving() -> bool:
            assert process.poll() is None, log_path.read_text()
            request = health_pb2.HealthCheckRequest(service=KUBE_WATCH_HEALTH_NAME)
            try:
                response = health.Check(request, timeout=1)
            except grpc.RpcError:
                return False
            serving: bool = response.status == health_pb2.HealthCheckResponse.SERVING
            return serving

        eventually(watch_serving, "the watch is in sync")
        assert node_names(stub) == [T4_NODE]
        kube_api.create(t4_slice("t4-b", "node-b"))
        eventually(lambda: node_names(stub) == sorted([T4_NODE, "node-b"]), "the event arrives")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=DEADLINE_SECONDS) == 0, log_path.read_text()
    finally:
        channel.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "kube watch stopped" in log_path.read_text()


def test_seeded_slices_survive_a_restart_with_the_watch_on(kube_api, tmp_path):
    """The snapshot restores the seed's slices, and the seed applies them again: they are not
    the cluster's, so the watch's first list must not delete them."""
    kube_api.create(t4_slice())
    seed = [str(Path(__file__).resolve().parents[2] / "examples" / "cluster" / "l40s-node.yaml")]
    settings = InventorySettings.from_env(
        {
            "GPUALLOC_KUBE_WATCH": "kubeconfig",
            "GPUALLOC_KUBECONFIG": str(write_kubeconfig(tmp_path / "config", kube_api.url)),
            "GPUALLOC_KUBE_CONTEXT": "fake",
            "GPUALLOC_INVENTORY_SNAPSHOT": str(tmp_path / "inventory.snapshot"),
        }
    )
    for _ in range(2):  # the first start writes the snapshot, the second restores it
        app = build_inventory(settings=settings, sweep=False)
        try:
            seeded = seed_inventory(app.service, seed)
            watch = start_kube_watch(app, settings, seeded=seeded)
            assert watch is not None and watch.wait_synced(DEADLINE_SECONDS)
            assert slice_names(app.service) == sorted([T4_NAME, *seeded])
        finally:
            app.close()
