"""Environment settings: typed readers that name the bad variable, and the gRPC server's settings.

Every service is configured by `GPUALLOC_*` environment variables (12-factor, the same in
docker-compose and Kubernetes). The readers here turn a bad value into an `InvalidArgument` whose
field path is the variable name, so an operator reads `GPUALLOC_MAX_WORKERS: must be an integer,
got 'x'` and not a Python traceback. An unset or empty variable means "use the default": Kubernetes
manifests often render optional values as empty strings.

Each setting is declared once, as a `Setting` in a module-level table; the dataclass defaults,
`from_env` and the README table (`settings_table_markdown`) all come from that one declaration.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from services.common.dra.limits import DocumentLimits
from services.common.dra.quantity import Quantity
from services.common.errors import FieldViolation, InvalidArgument

__all__ = [
    "DOCUMENT_SETTINGS",
    "REDIS_CLIENT_SETTINGS",
    "REDIS_WAIT_SETTINGS",
    "SERVER_SETTINGS",
    "ServerSettings",
    "Setting",
    "env_bool",
    "env_bytes",
    "env_choice",
    "env_duration",
    "env_float",
    "env_int",
    "env_str",
    "format_duration",
    "read_document_limits",
    "read_settings",
    "settings_table_markdown",
]

T = TypeVar("T")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def _raw(environ: Mapping[str, str], name: str) -> str | None:
    """The variable's value, or None when unset or blank (blank means "use the default")."""
    value = environ.get(name)
    if value is None or not value.strip():
        return None
    return value


def _check_range(
    name: str, value: float, minimum: float | None, maximum: float | None, shown: str
) -> None:
    if minimum is not None and value < minimum:
        raise InvalidArgument.at(name, f"must be >= {minimum:g}, got {shown}")
    if maximum is not None and value > maximum:
        raise InvalidArgument.at(name, f"must be <= {maximum:g}, got {shown}")


def env_str(environ: Mapping[str, str], name: str, default: str) -> str:
    """The variable as a string, surrounding whitespace removed."""
    value = _raw(environ, name)
    return default if value is None else value.strip()


def env_int(
    environ: Mapping[str, str],
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """A base-10 integer, optionally bounded (inclusive)."""
    value = _raw(environ, name)
    if value is None:
        return default
    try:
        number = int(value.strip(), 10)
    except ValueError:
        raise InvalidArgument.at(name, f"must be an integer, got {value!r}") from None
    _check_range(name, number, minimum, maximum, repr(value))
    return number


def env_float(
    environ: Mapping[str, str],
    name: str,
    default: float,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    """A finite decimal number, optionally bounded (inclusive)."""
    value = _raw(environ, name)
    if value is None:
        return default
    try:
        number = float(value.strip())
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise InvalidArgument.at(name, f"must be a number, got {value!r}")
    _check_range(name, number, minimum, maximum, repr(value))
    return number


def env_bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """true/false, 1/0, yes/no, on/off (any case)."""
    value = _raw(environ, name)
    if value is None:
        return default
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise InvalidArgument.at(name, f"must be true or false, got {value!r}")


def env_choice(environ: Mapping[str, str], name: str, default: str, choices: Sequence[str]) -> str:
    """One of `choices`, matched case-insensitively and returned as spelled in `choices`."""
    value = _raw(environ, name)
    if value is None:
        return default
    by_folded = {choice.casefold(): choice for choice in choices}
    chosen = by_folded.get(value.strip().casefold())
    if chosen is None:
        raise InvalidArgument.at(name, f"must be one of {', '.join(choices)}, got {value!r}")
    return chosen


def env_duration(
    environ: Mapping[str, str],
    name: str,
    default: float,
    *,
    minimum: float | None = 0.0,
    maximum: float | None = None,
) -> float:
    """Seconds, written as a Go duration (`500ms`, `30s`, `1m30s`, `2h`) or a plain number."""
    value = _raw(environ, name)
    if value is None:
        return default
    text = value.strip()
    seconds = _parse_duration(text)
    if seconds is None:
        raise InvalidArgument.at(
            name, f"must be a duration like 500ms, 30s, 1m30s or a number of seconds, got {value!r}"
        )
    _check_range(name, seconds, minimum, maximum, repr(value))
    return seconds


def _parse_duration(text: str) -> float | None:
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) else None
    return parse_go_duration(text)


def parse_go_duration(text: str) -> float | None:
    """Seconds from a Go duration (`168h`, `5m`, `1h30m`, `500ms`; Kubernetes' metav1.Duration
    without a sign); None when `text` is not one."""
    position, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            return None
        total += float(match[1]) * _DURATION_UNIT_SECONDS[match[2]]
        position = match.end()
    return total if position == len(text) and position > 0 else None


def env_bytes(
    environ: Mapping[str, str],
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """A byte count as a Kubernetes quantity: `16Mi`, `4M`, `1048576`."""
    value = _raw(environ, name)
    if value is None:
        return default
    try:
        quantity = Quantity.parse(value)
        count = quantity.as_int()
    except ValueError:
        raise InvalidArgument.at(
            name, f"must be a whole number of bytes like 16Mi or 1048576, got {value!r}"
        ) from None
    _check_range(name, count, minimum, maximum, repr(value))
    return count


def format_duration(seconds: float) -> str:
    """Seconds as the shortest duration string `env_duration` reads back (`30s`, `500ms`)."""
    if seconds >= 1 or seconds == 0:
        return f"{seconds:g}s"
    return f"{seconds * 1000:g}ms"


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable: its name, default, what it is for, and how to read it."""

    name: str
    default: T
    description: str
    read_value: Callable[[Mapping[str, str], str, T], T]
    show_default: Callable[[T], str] = str

    def read(self, environ: Mapping[str, str]) -> T:
        return self.read_value(environ, self.name, self.default)


def read_settings(
    environ: Mapping[str, str], settings: Mapping[str, Setting[Any]]
) -> dict[str, Any]:
    """Read every setting; report every bad variable at once (one violation each)."""
    values: dict[str, Any] = {}
    violations: list[FieldViolation] = []
    for field_name, setting in settings.items():
        try:
            values[field_name] = setting.read(environ)
        except InvalidArgument as error:
            violations.extend(error.violations or [FieldViolation(setting.name, error.message)])
    if violations:
        raise InvalidArgument("; ".join(str(v) for v in violations), violations)
    return values


def settings_table_markdown(settings: Iterable[Setting[Any]] | None = None) -> str:
    """The README's settings table: one row per variable, in declaration order."""
    rows = ["| Variable | Default | Description |", "|---|---|---|"]
    for setting in SERVER_SETTINGS.values() if settings is None else settings:
        shown = setting.show_default(setting.default)
        rows.append(f"| `{setting.name}` | `{shown}` | {setting.description} |")
    return "\n".join(rows) + "\n"


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_LOG_FORMATS = ("json", "text")

# Field name of ServerSettings -> the variable that sets it. Order is the README's order.
SERVER_SETTINGS: dict[str, Setting[Any]] = {
    "listen_address": Setting(
        "GPUALLOC_LISTEN",
        "127.0.0.1:50051",
        "host:port the gRPC server listens on (`0.0.0.0:50051` in a container; port 0: any)",
        env_str,
    ),
    "max_workers": Setting(
        "GPUALLOC_MAX_WORKERS",
        16,
        "threads serving RPCs; calls beyond this queue until a thread is free",
        lambda env, name, default: env_int(env, name, default, minimum=1, maximum=1024),
    ),
    "max_receive_message_bytes": Setting(
        "GPUALLOC_MAX_RECEIVE_MESSAGE_BYTES",
        16 * 2**20,
        "largest request accepted (a quantity: `16Mi`); larger ones fail with RESOURCE_EXHAUSTED",
        lambda env, name, default: env_bytes(env, name, default, minimum=1024, maximum=2**31 - 1),
        lambda n: f"{n // 2**20}Mi" if n % 2**20 == 0 else str(n),
    ),
    "max_send_message_bytes": Setting(
        "GPUALLOC_MAX_SEND_MESSAGE_BYTES",
        16 * 2**20,
        "largest response sent (a quantity: `16Mi`)",
        lambda env, name, default: env_bytes(env, name, default, minimum=1024, maximum=2**31 - 1),
        lambda n: f"{n // 2**20}Mi" if n % 2**20 == 0 else str(n),
    ),
    "max_concurrent_streams": Setting(
        "GPUALLOC_MAX_CONCURRENT_STREAMS",
        100,
        "concurrent calls one client connection may have open (HTTP/2 streams)",
        lambda env, name, default: env_int(env, name, default, minimum=1),
    ),
    "max_streams": Setting(
        "GPUALLOC_MAX_STREAMS",
        32,
        "streams (WatchInventory, WatchReservations) open at once; they get threads of their "
        "own, so unary calls keep GPUALLOC_MAX_WORKERS; more: RESOURCE_EXHAUSTED. Under an "
        "access policy one tenant's identities may hold half of them",
        lambda env, name, default: env_int(env, name, default, minimum=1, maximum=4096),
    ),
    "max_calls_per_caller": Setting(
        "GPUALLOC_MAX_CALLS_PER_CALLER",
        0,
        "unary calls one identity may have in flight (more: RESOURCE_EXHAUSTED with RetryInfo); "
        "0: half of GPUALLOC_MAX_WORKERS under an access policy, no limit in development mode",
        lambda env, name, default: env_int(env, name, default, minimum=0, maximum=65536),
    ),
    "max_calls_per_tenant": Setting(
        "GPUALLOC_MAX_CALLS_PER_TENANT",
        0,
        "unary calls one tenant's identities may have in flight together; 0: three quarters of "
        "GPUALLOC_MAX_WORKERS under an access policy, no limit in development mode",
        lambda env, name, default: env_int(env, name, default, minimum=0, maximum=65536),
    ),
    "max_call_seconds": Setting(
        "GPUALLOC_MAX_CALL_DURATION",
        30.0,
        "time budget of a unary call when the client sets no shorter deadline (e.g. `30s`)",
        lambda env, name, default: env_duration(env, name, default, minimum=0.001),
        format_duration,
    ),
    "grace_seconds": Setting(
        "GPUALLOC_SHUTDOWN_GRACE",
        10.0,
        "on SIGTERM, how long in-flight calls may finish before they are cancelled (e.g. `10s`)",
        env_duration,
        format_duration,
    ),
    "tls_cert_file": Setting(
        "GPUALLOC_TLS_CERT",
        "",
        "PEM certificate chain of the server (cert-manager's `tls.crt`); with the key it turns "
        "TLS on; reloaded when the file changes",
        env_str,
    ),
    "tls_key_file": Setting(
        "GPUALLOC_TLS_KEY",
        "",
        "PEM private key of that certificate (`tls.key`)",
        env_str,
    ),
    "tls_client_ca_file": Setting(
        "GPUALLOC_TLS_CLIENT_CA",
        "",
        "PEM CA bundle (`ca.crt`) client certificates must chain to: set, mutual TLS is required",
        env_str,
    ),
    "auth_policy_file": Setting(
        "GPUALLOC_AUTH_POLICY",
        "",
        "AccessPolicy YAML (identities -> tenants and roles; hot reloaded); empty: development "
        "mode (the `x-gpualloc-owner` header is believed), loopback only unless insecure",
        env_str,
    ),
    "insecure": Setting(
        "GPUALLOC_INSECURE",
        False,
        "allow a non-loopback listen address without TLS or without a policy (logs a warning)",
        env_bool,
        lambda value: "true" if value else "false",
    ),
    "health_listen_address": Setting(
        "GPUALLOC_HEALTH_LISTEN",
        "",
        "host:port of an extra plaintext server with only grpc.health.v1 (kubelet gRPC probes "
        "cannot do TLS); empty: none",
        env_str,
    ),
    "metrics_listen_address": Setting(
        "GPUALLOC_METRICS_LISTEN",
        "",
        "host:port of a plaintext HTTP server with Prometheus `GET /metrics` (the gRPC health "
        "port cannot share it: another protocol); empty: none, unless OTEL_METRICS_EXPORTER "
        "names `prometheus` (then 127.0.0.1:9464); `gpualloc serve --demo` (`make run`) "
        "unset: 127.0.0.1:9464, a warning if busy",
        env_str,
    ),
    "log_level": Setting(
        "GPUALLOC_LOG_LEVEL",
        "INFO",
        "one of " + ", ".join(_LOG_LEVELS),
        lambda env, name, default: env_choice(env, name, default, _LOG_LEVELS),
    ),
    "log_format": Setting(
        "GPUALLOC_LOG_FORMAT",
        "json",
        "`json` (one object per line, with trace ids) or `text`",
        lambda env, name, default: env_choice(env, name, default, _LOG_FORMATS),
    ),
}


def _show_bytes(count: int) -> str:
    return f"{count // 2**20}Mi" if count % 2**20 == 0 else str(count)


# Field name of DocumentLimits -> the variable that sets it: read by the servers (the manifest
# of ApplyResourceSlices) and by the CLIs that read `-f` files (solve, inventory, apply).
DOCUMENT_SETTINGS: dict[str, Setting[Any]] = {
    "max_bytes": Setting(
        "GPUALLOC_MAX_DOCUMENT_BYTES",
        DocumentLimits.max_bytes,
        "largest YAML/JSON text read (a `-f` file, stdin, an ApplyResourceSlices manifest; a "
        "quantity: `8Mi`); larger ones are refused (INVALID_ARGUMENT, exit 2) unread",
        lambda env, name, default: env_bytes(env, name, default, minimum=1024, maximum=2**31 - 1),
        _show_bytes,
    ),
    "max_nodes": Setting(
        "GPUALLOC_MAX_DOCUMENT_NODES",
        DocumentLimits.max_nodes,
        "most values (mappings, lists, scalars; a YAML alias each time it is used) one such text "
        "may hold",
        lambda env, name, default: env_int(env, name, default, minimum=100),
        lambda n: f"{n:_}".replace("_", ","),
    ),
}


def read_document_limits(environ: Mapping[str, str]) -> DocumentLimits:
    """`GPUALLOC_MAX_DOCUMENT_*`; InvalidArgument naming every bad variable."""
    return DocumentLimits(**read_settings(environ, DOCUMENT_SETTINGS))


# How long a Redis call may take, read by both services (the allocator's store, the
# inventory's repository): one definition, so `gpualloc serve` gives both the same.
REDIS_CLIENT_SETTINGS: dict[str, Setting[Any]] = {
    "redis_timeout": Setting(
        "GPUALLOC_REDIS_TIMEOUT",
        2.0,
        "socket timeout of every Redis call (connect included): a hung Redis fails calls "
        "with UNAVAILABLE after this",
        lambda env, name, default: env_duration(env, name, default, minimum=0.01),
        format_duration,
    ),
}

# Durability of the Redis writes, read by both services (the allocator's Reserve/Commit, the
# inventory's saves): one definition, so the two cannot drift apart.
REDIS_WAIT_SETTINGS: dict[str, Setting[Any]] = {
    "redis_wait_replicas": Setting(
        "GPUALLOC_REDIS_WAIT_REPLICAS",
        0,
        "acknowledge Reserve/Commit, and the inventory's changes, only after `WAIT` confirms this "
        "many replicas have the write (else UNAVAILABLE, retry it); 0: as soon as the primary "
        "has it (a failover may lose it)",
        lambda env, name, default: env_int(env, name, default, minimum=0, maximum=16),
    ),
    "redis_wait_timeout": Setting(
        "GPUALLOC_REDIS_WAIT_TIMEOUT",
        0.5,
        "how long a write waits for GPUALLOC_REDIS_WAIT_REPLICAS replicas",
        lambda env, name, default: env_duration(env, name, default, minimum=0.001),
        format_duration,
    ),
}


@dataclass(frozen=True)
class ServerSettings:
    """How a gpualloc gRPC server listens, sizes itself, shuts down and logs."""

    listen_address: str = SERVER_SETTINGS["listen_address"].default
    max_workers: int = SERVER_SETTINGS["max_workers"].default
    max_receive_message_bytes: int = SERVER_SETTINGS["max_receive_message_bytes"].default
    max_send_message_bytes: int = SERVER_SETTINGS["max_send_message_bytes"].default
    max_concurrent_streams: int = SERVER_SETTINGS["max_concurrent_streams"].default
    max_streams: int = SERVER_SETTINGS["max_streams"].default
    max_calls_per_caller: int = SERVER_SETTINGS["max_calls_per_caller"].default
    max_calls_per_tenant: int = SERVER_SETTINGS["max_calls_per_tenant"].default
    max_call_seconds: float = SERVER_SETTINGS["max_call_seconds"].default
    grace_seconds: float = SERVER_SETTINGS["grace_seconds"].default
    tls_cert_file: str = SERVER_SETTINGS["tls_cert_file"].default
    tls_key_file: str = SERVER_SETTINGS["tls_key_file"].default
    tls_client_ca_file: str = SERVER_SETTINGS["tls_client_ca_file"].default
    auth_policy_file: str = SERVER_SETTINGS["auth_policy_file"].default
    insecure: bool = SERVER_SETTINGS["insecure"].default
    health_listen_address: str = SERVER_SETTINGS["health_listen_address"].default
    metrics_listen_address: str = SERVER_SETTINGS["metrics_listen_address"].default
    log_level: str = SERVER_SETTINGS["log_level"].default
    log_format: str = SERVER_SETTINGS["log_format"].default

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ServerSettings:
        """Read `GPUALLOC_*`; raises InvalidArgument naming every bad variable."""
        return cls.checked(cls(**read_settings(environ, SERVER_SETTINGS)))

    @staticmethod
    def checked(settings: ServerSettings) -> ServerSettings:
        """`settings`, or InvalidArgument for TLS files that do not go together."""
        if bool(settings.tls_cert_file) != bool(settings.tls_key_file):
            raise InvalidArgument.at(
                "GPUALLOC_TLS_CERT", "a certificate and its key go together (GPUALLOC_TLS_KEY)"
            )
        if settings.tls_client_ca_file and not settings.tls_cert_file:
            raise InvalidArgument.at(
                "GPUALLOC_TLS_CLIENT_CA", "mutual TLS needs the server's own certificate too"
            )
        return settings

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert_file)

    @property
    def tenant_stream_limit(self) -> int:
        """Streams one tenant's identities may hold open: half of max_streams under an access
        policy (so that no tenant takes every stream), no limit in development mode."""
        return max(1, self.max_streams // 2) if self.auth_policy_file else 0

    @property
    def caller_limits(self) -> tuple[int, int]:
        """(per caller, per tenant) in-flight unary calls; 0: no limit (see the settings)."""
        per_caller, per_tenant = self.max_calls_per_caller, self.max_calls_per_tenant
        if self.auth_policy_file:
            per_caller = per_caller or max(1, self.max_workers // 2)
            per_tenant = per_tenant or max(1, (3 * self.max_workers) // 4)
        return per_caller, per_tenant
