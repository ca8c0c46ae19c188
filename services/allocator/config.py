"""Allocator settings: the shared server settings plus what only the allocator reads.

Declared once as `Setting`s (services/common/config.py): the defaults, `from_env` and the table
in docs/operations.md (`settings_table_markdown(ALLOCATOR_SETTINGS.values())`) come from here.
OpenTelemetry is configured by the standard `OTEL_*` variables instead, and the Prometheus endpoint
by the shared GPUALLOC_METRICS_LISTEN (services/common/telemetry.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.allocator.core import Policy
from services.common.config import (
    REDIS_CLIENT_SETTINGS,
    REDIS_WAIT_SETTINGS,
    ServerSettings,
    Setting,
    env_bool,
    env_choice,
    env_duration,
    env_int,
    env_str,
    format_duration,
    read_settings,
)

__all__ = ["ALLOCATOR_SETTINGS", "AllocatorSettings"]

_POLICIES = tuple(p.value for p in Policy)

ALLOCATOR_SETTINGS: dict[str, Setting[Any]] = {
    "redis_url": Setting(
        "GPUALLOC_REDIS_URL",
        "",
        "reservation store: `redis://[user:password@]host:6379/0` or `rediss://…` (TLS), "
        "`redis+sentinel://h:26379[,h:p…]/<service>[/db]` (Sentinel), "
        "`redis+cluster://h:6379[,h:p…]` (Redis Cluster); "
        "empty: the embedded store (one process, lost on restart)",
        env_str,
        lambda v: v or "(embedded)",
    ),
    **REDIS_CLIENT_SETTINGS,
    **REDIS_WAIT_SETTINGS,
    "redis_key_prefix": Setting(
        "GPUALLOC_REDIS_PREFIX",
        "gpualloc",
        "prefix of every Redis key and of the events channel (several installations, one Redis)",
        env_str,
    ),
    "inventory_address": Setting(
        "GPUALLOC_INVENTORY_ADDR",
        "",
        "host:port of the inventory to follow (WatchInventory); empty with --seed: fixed slices",
        env_str,
        lambda v: v or "(none)",
    ),
    "device_classes": Setting(
        "GPUALLOC_DEVICE_CLASSES",
        "",
        "comma-separated DeviceClass files/directories loaded after the built-in NVIDIA classes",
        env_str,
        lambda v: v or "(built-in only)",
    ),
    "lease_seconds": Setting(
        "GPUALLOC_LEASE_TTL",
        300.0,
        "lease of a reservation when the request sets none (e.g. `5m`)",
        lambda env, name, default: env_duration(env, name, default, minimum=0.001),
        format_duration,
    ),
    "max_lease_seconds": Setting(
        "GPUALLOC_MAX_LEASE_TTL",
        86_400.0,
        "longest lease a request may ask for (e.g. `24h`); longer ones are INVALID_ARGUMENT",
        lambda env, name, default: env_duration(env, name, default, minimum=0.001),
        format_duration,
    ),
    "quota_grace_seconds": Setting(
        "GPUALLOC_QUOTA_GRACE",
        10.0,
        "how much longer a quota ledger entry lives than the lease it covers (clock skew "
        "between Redis primaries, the time between a grant's two steps; docs/tenancy.md)",
        lambda env, name, default: env_duration(env, name, default, minimum=0.001),
        format_duration,
    ),
    "reserve_retries": Setting(
        "GPUALLOC_RESERVE_RETRIES",
        3,
        "Allocate(reserve): how many times to solve again after a reservation conflict",
        lambda env, name, default: env_int(env, name, default, minimum=0, maximum=100),
    ),
    "max_search_steps": Setting(
        "GPUALLOC_MAX_SEARCH_STEPS",
        1_000_000,
        "search steps one solve may take (requests can only lower it); past it: BUDGET_EXHAUSTED",
        lambda env, name, default: env_int(env, name, default, minimum=1),
    ),
    "max_cel_cost": Setting(
        "GPUALLOC_MAX_CEL_COST",
        2_000_000,
        "CEL cost units all of one request's selector evaluations may spend together (each "
        "expression stays bounded at upstream's 1,000,000); past it: RESOURCE_EXHAUSTED",
        lambda env, name, default: env_int(env, name, default, minimum=1000),
    ),
    "policy": Setting(
        "GPUALLOC_POLICY",
        Policy.BINPACK.value,
        "placement policy when a request sets none: " + ", ".join(_POLICIES),
        lambda env, name, default: env_choice(env, name, default, _POLICIES),
    ),
    "device_binding_conditions": Setting(
        "GPUALLOC_DEVICE_BINDING_CONDITIONS",
        True,
        "allocate devices with bindingConditions (upstream's DRADeviceBindingConditions and "
        "DRAResourceClaimDeviceStatus gates); false: such devices are not allocatable "
        '(docs/dra-compatibility.md, "Binding conditions")',
        env_bool,
        lambda v: "true" if v else "false",
    ),
    "binding_timeout": Setting(
        "GPUALLOC_BINDING_TIMEOUT",
        600.0,
        "how long a reservation's devices may wait for their binding conditions (from its "
        "reserve) before it is released, as kube-scheduler's bindingTimeout "
        '(docs/reservations.md, "Binding")',
        lambda env, name, default: env_duration(env, name, default, minimum=1.0),
        format_duration,
    ),
    "workers": Setting(
        "GPUALLOC_WORKERS",
        1,
        "server processes sharing the listen port (SO_REUSEPORT), each with its own view; "
        "more than 1 needs GPUALLOC_REDIS_URL",
        lambda env, name, default: env_int(env, name, default, minimum=1, maximum=256),
    ),
    "expire_interval": Setting(
        "GPUALLOC_EXPIRE_INTERVAL",
        1.0,
        "how often each process frees due leases in the store and publishes their expiry",
        lambda env, name, default: env_duration(env, name, default, minimum=0.01),
        format_duration,
    ),
    "resync_interval": Setting(
        "GPUALLOC_RESYNC_INTERVAL",
        30.0,
        "how often each process reloads every live reservation (events are at-most-once)",
        lambda env, name, default: env_duration(env, name, default, minimum=0.1),
        format_duration,
    ),
    "web_listen_address": Setting(
        "GPUALLOC_WEB_LISTEN",
        "",
        "host:port of the read-only web view of the fleet (HTTP; `gpualloc serve --demo`: "
        "`127.0.0.1:8080`); empty: none. Not loopback: needs GPUALLOC_INSECURE; under "
        'GPUALLOC_AUTH_POLICY it shows tenants only (docs/operations.md, "Web view")',
        env_str,
        lambda v: v or "(off)",
    ),
    "reindex_interval": Setting(
        "GPUALLOC_REINDEX_INTERVAL",
        0.05,
        "least time between two rebuilds of the inventory index (updates coalesce meanwhile)",
        lambda env, name, default: env_duration(env, name, default, minimum=0.0),
        format_duration,
    ),
    "combine_allocates": Setting(
        "GPUALLOC_COMBINE_ALLOCATES",
        True,
        "place concurrent unary Allocate calls together, in one pass of up to 64 (a call that "
        'finds no pass running runs at once; docs/api.md, "Concurrent Allocates"); false: '
        "each alone",
        env_bool,
        lambda v: "true" if v else "false",
    ),
    "watch_heartbeat": Setting(
        "GPUALLOC_RESERVATION_WATCH_HEARTBEAT",
        15.0,
        "a WatchReservations stream that has been silent this long gets a HEARTBEAT change",
        lambda env, name, default: env_duration(env, name, default, minimum=0.1),
        format_duration,
    ),
}


@dataclass(frozen=True)
class AllocatorSettings:
    server: ServerSettings = ServerSettings()
    redis_url: str = ALLOCATOR_SETTINGS["redis_url"].default
    redis_timeout: float = ALLOCATOR_SETTINGS["redis_timeout"].default
    redis_wait_replicas: int = ALLOCATOR_SETTINGS["redis_wait_replicas"].default
    redis_wait_timeout: float = ALLOCATOR_SETTINGS["redis_wait_timeout"].default
    redis_key_prefix: str = ALLOCATOR_SETTINGS["redis_key_prefix"].default
    inventory_address: str = ALLOCATOR_SETTINGS["inventory_address"].default
    device_classes: tuple[str, ...] = ()
    lease_seconds: float = ALLOCATOR_SETTINGS["lease_seconds"].default
    max_lease_seconds: float = ALLOCATOR_SETTINGS["max_lease_seconds"].default
    reserve_retries: int = ALLOCATOR_SETTINGS["reserve_retries"].default
    quota_grace_seconds: float = ALLOCATOR_SETTINGS["quota_grace_seconds"].default
    max_search_steps: int = ALLOCATOR_SETTINGS["max_search_steps"].default
    max_cel_cost: int = ALLOCATOR_SETTINGS["max_cel_cost"].default
    policy: Policy = Policy.BINPACK
    device_binding_conditions: bool = ALLOCATOR_SETTINGS["device_binding_conditions"].default
    binding_timeout: float = ALLOCATOR_SETTINGS["binding_timeout"].default
    workers: int = ALLOCATOR_SETTINGS["workers"].default
    expire_interval: float = ALLOCATOR_SETTINGS["expire_interval"].default
    resync_interval: float = ALLOCATOR_SETTINGS["resync_interval"].default
    reindex_interval: float = ALLOCATOR_SETTINGS["reindex_interval"].default
    combine_allocates: bool = ALLOCATOR_SETTINGS["combine_allocates"].default
    watch_heartbeat: float = ALLOCATOR_SETTINGS["watch_heartbeat"].default
    web_listen_address: str = ALLOCATOR_SETTINGS["web_listen_address"].default

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AllocatorSettings:
        """Read `GPUALLOC_*`; raises InvalidArgument naming every bad variable."""
        server = ServerSettings.from_env(environ)
        values = read_settings(environ, ALLOCATOR_SETTINGS)
        values["device_classes"] = tuple(
            p.strip() for p in values["device_classes"].split(",") if p.strip()
        )
        values["policy"] = Policy(values["policy"])
        return cls(server=server, **values)
