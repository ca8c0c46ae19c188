"""Inventory settings: the shared server settings plus what only the inventory reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from services.common.config import (
    REDIS_CLIENT_SETTINGS,
    REDIS_WAIT_SETTINGS,
    ServerSettings,
    Setting,
    env_choice,
    env_duration,
    env_int,
    env_str,
    format_duration,
    read_document_limits,
    read_settings,
)
from services.common.dra.limits import DocumentLimits

__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_MAX_NODES",
    "INVENTORY_SETTINGS",
    "KUBE_WATCH_MODES",
    "InventorySettings",
]

DEFAULT_LISTEN = "127.0.0.1:50052"  # when run apart; `gpualloc serve` shares the allocator's port
KUBE_WATCH_MODES = ("off", "in-cluster", "kubeconfig")
DEFAULT_MAX_NODES = 10_000  # the scale `make bench` proves (bench_inventory: 10,000 nodes),
# twice the largest cluster Kubernetes documents (5,000): no real inventory is refused, and
# made-up node names cannot grow the state without bound


def _positive_duration(environ: Mapping[str, str], name: str, default: float) -> float:
    return env_duration(environ, name, default, minimum=0.001)


# Field name of InventorySettings -> the variable that sets it. Order is the README's order.
INVENTORY_SETTINGS: dict[str, Setting[Any]] = {
    "seed_paths": Setting(
        "GPUALLOC_SEED",
        "",
        "comma-separated files/directories of ResourceSlices and Nodes applied at start",
        env_str,
    ),
    "redis_url": Setting(
        "GPUALLOC_REDIS_URL",
        "",
        "Redis holding the inventory state (`redis://host:6379/0`, `redis+sentinel://…`, "
        "`redis+cluster://…`); empty: embedded (in memory)",
        env_str,
    ),
    **REDIS_CLIENT_SETTINGS,
    **REDIS_WAIT_SETTINGS,
    "snapshot_path": Setting(
        "GPUALLOC_INVENTORY_SNAPSHOT",
        "",
        "embedded mode: a JSON file the state is written to (atomically) and resumed from",
        env_str,
    ),
    "report_ttl": Setting(
        "GPUALLOC_REPORT_TTL",
        120.0,
        "a node whose reports stop for longer gets its NVML-derived devices tainted unreachable",
        _positive_duration,
        format_duration,
    ),
    "sweep_interval": Setting(
        "GPUALLOC_REPORT_SWEEP_INTERVAL",
        5.0,
        "how often report staleness is checked",
        _positive_duration,
        format_duration,
    ),
    "watch_heartbeat": Setting(
        "GPUALLOC_WATCH_HEARTBEAT",
        15.0,
        "a WatchInventory stream that has been silent this long gets a HEARTBEAT event",
        _positive_duration,
        format_duration,
    ),
    "watch_min_interval": Setting(
        "GPUALLOC_WATCH_MIN_INTERVAL",
        0.005,
        "a WatchInventory stream gets at most one delta per interval (changes in between merge)",
        lambda env, name, default: env_duration(env, name, default, minimum=0.0, maximum=1.0),
        format_duration,
    ),
    "max_nodes": Setting(
        "GPUALLOC_INVENTORY_MAX_NODES",
        DEFAULT_MAX_NODES,
        "most nodes the inventory holds: an apply or report that would add one more fails with "
        "RESOURCE_EXHAUSTED (the Kubernetes mirror is not limited)",
        lambda env, name, default: env_int(env, name, default, minimum=1),
    ),
    "kube_watch": Setting(
        "GPUALLOC_KUBE_WATCH",
        "off",
        "mirror the cluster's ResourceSlices (list+watch): `off`, `in-cluster` (the pod's service "
        "account) or `kubeconfig`; needs the `kube` extra and RBAC list/watch on resourceslices",
        lambda env, name, default: env_choice(env, name, default, KUBE_WATCH_MODES),
    ),
    "kubeconfig": Setting(
        "GPUALLOC_KUBECONFIG",
        "",
        "`kubeconfig` mode: the file to read; empty: `$KUBECONFIG`, else `~/.kube/config`",
        env_str,
    ),
    "kube_context": Setting(
        "GPUALLOC_KUBE_CONTEXT",
        "",
        "`kubeconfig` mode: the context to use; empty: the file's current context",
        env_str,
    ),
}


@dataclass(frozen=True)
class InventorySettings:
    server: ServerSettings
    seed_paths: tuple[str, ...] = ()
    redis_url: str = INVENTORY_SETTINGS["redis_url"].default
    redis_timeout: float = INVENTORY_SETTINGS["redis_timeout"].default
    redis_wait_replicas: int = INVENTORY_SETTINGS["redis_wait_replicas"].default
    redis_wait_timeout: float = INVENTORY_SETTINGS["redis_wait_timeout"].default
    snapshot_path: str = INVENTORY_SETTINGS["snapshot_path"].default
    report_ttl: float = INVENTORY_SETTINGS["report_ttl"].default
    sweep_interval: float = INVENTORY_SETTINGS["sweep_interval"].default
    watch_heartbeat: float = INVENTORY_SETTINGS["watch_heartbeat"].default
    watch_min_interval: float = INVENTORY_SETTINGS["watch_min_interval"].default
    kube_watch: str = INVENTORY_SETTINGS["kube_watch"].default
    kubeconfig: str = INVENTORY_SETTINGS["kubeconfig"].default
    kube_context: str = INVENTORY_SETTINGS["kube_context"].default
    max_nodes: int = INVENTORY_SETTINGS["max_nodes"].default
    documents: DocumentLimits = DocumentLimits()

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> InventorySettings:
        """Read `GPUALLOC_*`; raises InvalidArgument naming every bad variable."""
        server = ServerSettings.from_env(environ)
        if "GPUALLOC_LISTEN" not in environ:
            server = replace(server, listen_address=DEFAULT_LISTEN)
        values = read_settings(environ, INVENTORY_SETTINGS)
        seeds = tuple(p.strip() for p in values.pop("seed_paths").split(",") if p.strip())
        documents = read_document_limits(environ)
        return cls(server=server, seed_paths=seeds, documents=documents, **values)
