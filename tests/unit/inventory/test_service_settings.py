"""Inventory settings from the environment: defaults, durations, and errors naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.config import settings_table_markdown
from services.common.errors import InvalidArgument
from services.inventory.adapters.store.embedded import EmbeddedInventoryRepository
from services.inventory.adapters.store.redis_repository import RedisInventoryRepository
from services.inventory.bootstrap import build_repository
from services.inventory.config import INVENTORY_SETTINGS, InventorySettings


def test_defaults() -> None:
    settings = InventorySettings.from_env({})
    assert settings.server.listen_address == "127.0.0.1:50052"
    assert (settings.redis_url, settings.snapshot_path, settings.report_ttl) == ("", "", 120.0)
    assert (settings.watch_heartbeat, settings.watch_min_interval) == (15.0, 0.005)


@pytest.mark.parametrize(
    ("environ", "field", "expected"),
    [
        pytest.param({"GPUALLOC_REPORT_TTL": "2m"}, "report_ttl", 120.0, id="ttl-as-duration"),
        pytest.param({"GPUALLOC_REPORT_TTL": "90"}, "report_ttl", 90.0, id="ttl-as-seconds"),
        pytest.param({"GPUALLOC_SEED": "a.yaml, b/"}, "seed_paths", ("a.yaml", "b/"), id="seeds"),
        pytest.param(
            {"GPUALLOC_WATCH_MIN_INTERVAL": "0"}, "watch_min_interval", 0.0, id="no-coalescing"
        ),
        pytest.param({}, "kube_watch", "off", id="kube-watch-off-by-default"),
        pytest.param(
            {"GPUALLOC_KUBE_WATCH": "In-Cluster"}, "kube_watch", "in-cluster", id="kube-in-cluster"
        ),
        pytest.param(
            {"GPUALLOC_KUBECONFIG": " /etc/kube/config "},
            "kubeconfig",
            "/etc/kube/config",
            id="kubeconfig-path",
        ),
        pytest.param({"GPUALLOC_KUBE_CONTEXT": "prod"}, "kube_context", "prod", id="kube-context"),
    ],
)
def test_values(environ: dict[str, str], field: str, expected: object) -> None:
    assert getattr(InventorySettings.from_env(environ), field) == expected


def test_bad_values_name_every_variable() -> None:
    with pytest.raises(InvalidArgument) as info:
        InventorySettings.from_env(
            {
                "GPUALLOC_REPORT_TTL": "soon",
                "GPUALLOC_WATCH_HEARTBEAT": "0",
                "GPUALLOC_KUBE_WATCH": "on",
            }
        )
    assert [v.path for v in info.value.violations] == [
        "GPUALLOC_REPORT_TTL",
        "GPUALLOC_WATCH_HEARTBEAT",
        "GPUALLOC_KUBE_WATCH",
    ]


def test_the_repository_follows_the_settings(tmp_path: Path) -> None:
    snapshot = str(tmp_path / "inventory.json")
    embedded = build_repository(
        InventorySettings.from_env({"GPUALLOC_INVENTORY_SNAPSHOT": snapshot})
    )
    assert isinstance(embedded, EmbeddedInventoryRepository)
    assert str(embedded.snapshot_path) == snapshot
    redis_backed = build_repository(
        InventorySettings.from_env({"GPUALLOC_REDIS_URL": "redis://127.0.0.1:1/0"})
    )
    assert isinstance(redis_backed, RedisInventoryRepository)  # connects lazily
    redis_backed.close()


def test_the_readme_table_lists_every_inventory_variable() -> None:
    table = settings_table_markdown(INVENTORY_SETTINGS.values())
    for setting in INVENTORY_SETTINGS.values():
        assert f"| `{setting.name}` |" in table
    assert "| `GPUALLOC_REPORT_TTL` | `120s` |" in table


@pytest.mark.parametrize(
    ("socket", "wait", "refused"),
    [
        pytest.param(
            "",
            "5s",
            "GPUALLOC_REDIS_WAIT_TIMEOUT: 5s must be shorter than GPUALLOC_REDIS_TIMEOUT, "
            "the socket timeout (2s)",
            id="the-default-socket-timeout",
        ),
        pytest.param(
            "2s",
            "6s",
            "GPUALLOC_REDIS_WAIT_TIMEOUT: 6s must be shorter than GPUALLOC_REDIS_TIMEOUT, "
            "the socket timeout (2s)",
            id="the-review-s-2s-and-6s",
        ),
        pytest.param("10s", "6s", None, id="a-socket-timeout-that-outlasts-the-wait"),
    ],
)
def test_the_redis_repository_gets_the_shared_redis_settings(
    socket: str, wait: str, refused: str | None
) -> None:
    """GPUALLOC_REDIS_TIMEOUT and GPUALLOC_REDIS_WAIT_* reach the inventory's repository, as
    the allocator's store (so `gpualloc serve` gives both the same): a WAIT timeout its socket
    timeout cannot honour is refused when it is built, naming the variables."""
    env = {
        "GPUALLOC_REDIS_URL": "redis://127.0.0.1:1/0",
        "GPUALLOC_REDIS_WAIT_REPLICAS": "1",
        "GPUALLOC_REDIS_WAIT_TIMEOUT": wait,
    }
    if socket:
        env["GPUALLOC_REDIS_TIMEOUT"] = socket
    settings = InventorySettings.from_env(env)
    assert settings.redis_wait_replicas == 1
    if refused is None:
        build_repository(settings).close()
        return
    with pytest.raises(InvalidArgument) as raised:
        build_repository(settings)
    assert str(raised.value).startswith(refused), str(raised.value)
