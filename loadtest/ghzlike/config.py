"""ghz configuration files, read the way ghz reads them (`runner/config.go`).

The Python runner and ghz must run the SAME file, so this module accepts exactly ghz's JSON keys
with ghz's defaults (total 200, concurrency 50, timeout 20s, connect-timeout 10s, one
connection, no rate limit). A key the runner cannot honour is refused with the key's name rather
than silently ignored, because a load test that quietly drops a setting measures something else.
A ghz key set to ghz's own default (`"load-schedule": "const"`, `"async": false`) is accepted:
it asks for nothing the runner does not do. Unknown keys (typos) are refused too, although ghz
itself ignores them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from services.client.config import TlsConfig
from services.common.errors import InvalidArgument

__all__ = [
    "FORMATS",
    "MAX_INT32",
    "SUPPORTED_KEYS",
    "UNSUPPORTED_KEYS",
    "ConfigError",
    "LoadConfig",
    "load_config",
    "parse_config",
    "metadata_option",
    "parse_go_duration",
    "tls_of",
]

MAX_INT32 = 2**31 - 1  # ghz's `total` once a `duration` is set (runner/options.go)
FORMATS = ("summary", "csv", "json", "pretty", "html")
STOP_ACTIONS = ("close", "wait", "ignore")


class ConfigError(ValueError):
    """A config file or option the runner cannot use; the message names the key."""


@dataclass(frozen=True)
class LoadConfig:
    """One run's settings, in ghz's units: durations in seconds here, ns in the report."""

    call: str
    host: str
    proto: str = ""  # a .proto file that defines `call` ("": ask the server's reflection)
    import_paths: tuple[str, ...] = ()  # protoc's -I directories for `proto`
    insecure: bool = False
    cacert: str = ""  # PEM CA the server's certificate must chain to ("": the system's roots)
    cert: str = ""  # PEM client certificate: with `key`, mutual TLS
    key: str = ""
    cname: str = ""  # the name checked against the server's certificate
    concurrency: int = 50
    connections: int = 1
    total: int = 200
    duration: float = 0.0  # seconds; > 0 ignores `total` (ghz sets it to MaxInt32)
    max_duration: float = 0.0  # seconds; stop early with `total` still respected
    duration_stop: str = "close"
    rps: int = 0  # 0: no rate limit
    timeout: float = 20.0
    connect_timeout: float = 10.0
    keepalive: float = 0.0
    data: Any = None  # a JSON object (same message every call) or an array (round-robin)
    metadata: dict[str, str] | None = None
    reflect_metadata: dict[str, str] | None = None
    name: str = ""
    tags: dict[str, str] | None = None
    skip_first: int = 0
    count_errors: bool = False
    cpus: int = 0  # Python runner: client processes (ghz: Go threads); 0 = 1 process
    format: str = "summary"
    output: str = ""
    disable_template_data: bool = False
    disable_template_functions: bool = False
    source: str = field(default="", compare=False)  # the file it came from, for messages

    @property
    def total_calls(self) -> int:
        """How many calls to make: `total`, or unbounded (MaxInt32) when `duration` alone is set."""
        if self.duration > 0 and self.max_duration <= 0:
            return MAX_INT32
        return self.total

    @property
    def stop_after(self) -> float:
        """Seconds after which the run stops (0: when `total` calls are done)."""
        return self.max_duration if self.max_duration > 0 else self.duration

    def with_overrides(self, **changes: Any) -> LoadConfig:
        """Command-line flags override the file, as in ghz; checked like the file's values."""
        updated = replace(self, **{k: v for k, v in changes.items() if v is not None})
        _check(updated)
        return updated


# --- keys ----------------------------------------------------------------------------------------

_GO_DURATION = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_go_duration(value: Any, key: str) -> float:
    """A Go `time.ParseDuration` string ("10s", "1m30s", "250ms", "0") -> seconds."""
    if not isinstance(value, str):
        raise ConfigError(f'{key}: must be a duration string like "10s", got {value!r}')
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if body == "0":
        return 0.0
    position, seconds = 0, 0.0
    for match in _GO_DURATION.finditer(body):
        if match.start() != position or match[1] in ("", "."):
            break
        seconds += float(match[1]) * _UNIT_SECONDS[match[2]]
        position = match.end()
    if position != len(body) or not body:
        raise ConfigError(f'{key}: {value!r} is not a Go duration (e.g. "500ms", "10s", "1m")')
    return sign * seconds


def _uint(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"{key}: must be a non-negative integer, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise ConfigError(f"{key}: must be a whole number, got {value!r}")
    return int(value)


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: must be true or false, got {value!r}")
    return value


def _str(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key}: must be a string, got {value!r}")
    return value


def _str_list(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key}: must be an array of strings, got {value!r}")
    return tuple(value)


def _str_map(value: Any, key: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(f"{key}: must be an object of string values, got {value!r}")
    return {str(k): v for k, v in value.items()}


def _choice(choices: tuple[str, ...]) -> Any:
    def read(value: Any, key: str) -> str:
        word = _str(value, key).lower()
        if word not in choices:
            raise ConfigError(f"{key}: must be one of {', '.join(choices)}, got {value!r}")
        return word

    return read


# ghz JSON key -> (LoadConfig field, reader). `data-file`/`metadata-file` are read into `data`
# and `metadata` by `parse_config`.
SUPPORTED_KEYS: dict[str, tuple[str, Any]] = {
    "call": ("call", _str),
    "host": ("host", _str),
    "insecure": ("insecure", _bool),
    "cacert": ("cacert", _str),
    "proto": ("proto", _str),
    "import-paths": ("import_paths", _str_list),
    "cert": ("cert", _str),
    "key": ("key", _str),
    "cname": ("cname", _str),
    "concurrency": ("concurrency", _uint),
    "connections": ("connections", _uint),
    "total": ("total", _uint),
    "duration": ("duration", parse_go_duration),
    "max-duration": ("max_duration", parse_go_duration),
    "duration-stop": ("duration_stop", _choice(STOP_ACTIONS)),
    "rps": ("rps", _uint),
    "timeout": ("timeout", parse_go_duration),
    "connect-timeout": ("connect_timeout", parse_go_duration),
    "keepalive": ("keepalive", parse_go_duration),
    "data": ("data", lambda v, k: v),
    "data-file": ("data", None),
    "metadata": ("metadata", _str_map),
    "metadata-file": ("metadata", None),
    "reflect-metadata": ("reflect_metadata", _str_map),
    "name": ("name", _str),
    "tags": ("tags", _str_map),
    "skipFirst": ("skip_first", _uint),
    "count-errors": ("count_errors", _bool),
    "cpus": ("cpus", _uint),
    "format": ("format", _choice(FORMATS)),
    "output": ("output", _str),
    "disable-template-data": ("disable_template_data", _bool),
    "disable-template-functions": ("disable_template_functions", _bool),
}

# ghz keys the runner does not implement -> ghz's default (accepted) and why not.
_SCHEMA = "the Python runner reads .proto files (proto, import-paths) or asks reflection"
_SKIP_TLS = "gRPC Python always verifies the server's certificate: give its CA with cacert"
_SCHEDULE = "the Python runner runs a constant load (rps) with constant concurrency"
UNSUPPORTED_KEYS: dict[str, tuple[Any, str]] = {
    "protoset": ("", _SCHEMA),
    "skipTLS": (False, _SKIP_TLS),
    "authority": ("", "the Python runner does not override :authority"),
    "async": (False, "the Python runner's workers wait for each reply (ghz's default)"),
    "load-schedule": ("const", _SCHEDULE),
    "load-start": (0, _SCHEDULE),
    "load-end": (0, _SCHEDULE),
    "load-step": (0, _SCHEDULE),
    "load-step-duration": ("0", _SCHEDULE),
    "load-max-duration": ("0", _SCHEDULE),
    "concurrency-schedule": ("const", _SCHEDULE),
    "concurrency-start": (1, _SCHEDULE),
    "concurrency-end": (0, _SCHEDULE),
    "concurrency-step": (0, _SCHEDULE),
    "concurrency-step-duration": ("0", _SCHEDULE),
    "concurrency-max-duration": ("0", _SCHEDULE),
    "binary-file": ("", "the Python runner sends JSON data only"),
    "stream-interval": ("0", "the Python runner calls unary methods only"),
    "stream-call-duration": ("0", "the Python runner calls unary methods only"),
    "stream-call-count": (0, "the Python runner calls unary methods only"),
    "stream-dynamic-messages": (False, "the Python runner calls unary methods only"),
    "enable-compression": (False, "the Python runner sends uncompressed messages"),
    "lb-strategy": ("", "the Python runner dials one address per connection"),
    "max-recv-message-size": ("", "the Python runner uses gRPC's default message limits"),
    "max-send-message-size": ("", "the Python runner uses gRPC's default message limits"),
    "debug": ("", "the Python runner has no debug log file"),
}


# --- reading -------------------------------------------------------------------------------------


_TOO_DEEP = "nested too deeply"  # json.loads hit the recursion limit: bad input, not a crash


def load_config(path: str | Path) -> LoadConfig:
    """Read a ghz JSON config file. Relative `data-file`/`metadata-file` paths are relative to
    the working directory, as in ghz (run from the repository root)."""
    source = str(path)
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"{source}: cannot read: {error.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{source}: not JSON: {error}") from None
    except RecursionError:
        raise ConfigError(f"{source}: not JSON: {_TOO_DEEP}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a ghz config file is a JSON object")
    return parse_config(raw, source=source)


def parse_config(raw: Mapping[str, Any], *, source: str = "<config>") -> LoadConfig:
    """Check every key and build the config; raises ConfigError naming the first bad key."""
    values: dict[str, Any] = {"source": source}
    for key, value in raw.items():
        try:
            _read_key(key, value, values)
        except ConfigError as error:
            raise ConfigError(f"{source}: {error}") from None
    for required in ("call", "host"):
        if not values.get(required):
            raise ConfigError(f"{source}: {required}: required")
    config = LoadConfig(**values)
    try:
        _check(config)
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None
    return config


def _read_key(key: str, value: Any, values: dict[str, Any]) -> None:
    if key in UNSUPPORTED_KEYS:
        default, why = UNSUPPORTED_KEYS[key]
        if not _is_default(value, default, key):
            raise ConfigError(f"{key}: the ghz option is not supported here ({why})")
        return
    if key not in SUPPORTED_KEYS:
        raise ConfigError(f"{key}: not a ghz config key (see https://ghz.sh/docs/options)")
    target, read = SUPPORTED_KEYS[key]
    if key == "data-file":
        values["data"] = _read_json_file(_str(value, key), key)
    elif key == "metadata-file":
        values["metadata"] = _str_map(_read_json_file(_str(value, key), key), key)
    elif key == "data" and "data" in values:
        return  # ghz: data-file wins over data
    else:
        values[target] = read(value, key)


def metadata_option(text: str | None, path: str | None) -> dict[str, str] | None:
    """ghz's `-m '{"k": "v"}'` (JSON text) or `-M file.json`; None when neither is given."""
    if path:
        return _str_map(_read_json_file(path, "-M"), "-M")
    if text is None:
        return None
    try:
        return _str_map(json.loads(text), "-m")
    except json.JSONDecodeError as error:
        raise ConfigError(f"-m: not JSON: {error}") from None
    except RecursionError:
        raise ConfigError(f"-m: not JSON: {_TOO_DEEP}") from None


def _is_default(value: Any, default: Any, key: str) -> bool:
    if default == "0":  # a duration: any spelling of zero
        try:
            return parse_go_duration(value, key) == 0
        except ConfigError:
            return False
    return bool(value == default)


def _read_json_file(path: str, key: str) -> Any:
    try:
        return json.loads(Path(path.strip()).read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(
            f"{key}: cannot read {path!r} ({error.strerror}); relative paths are relative to "
            "the working directory, as in ghz"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{key}: {path!r} is not JSON: {error}") from None
    except RecursionError:
        raise ConfigError(f"{key}: {path!r} is not JSON: {_TOO_DEEP}") from None


def _check(config: LoadConfig) -> None:
    """ghz's own checks (runner/options.go, config.go) plus what the runner needs."""
    if config.concurrency < 1:
        raise ConfigError("concurrency: must be at least 1")
    if config.connections < 1:
        raise ConfigError("connections: must be at least 1")
    if config.connections > config.concurrency:
        raise ConfigError("connections: number of connections cannot be greater than concurrency")
    _check_tls(config)
    if config.total < 1 and config.stop_after <= 0:
        raise ConfigError("total: must be at least 1 (or set duration)")
    for name in ("duration", "max_duration", "timeout", "connect_timeout", "keepalive"):
        seconds = getattr(config, name)
        if seconds < 0 or not math.isfinite(seconds):
            raise ConfigError(f"{name.replace('_', '-')}: must not be negative")
    _check_data(config.data)


def _check_tls(config: LoadConfig) -> None:
    """ghz ignores the certificate options of an insecure run; here that is an error, as a
    plaintext run of a TLS config measures something else. A certificate needs its key."""
    given = [k for k in ("cacert", "cert", "key", "cname") if getattr(config, k)]
    if config.insecure and given:
        raise ConfigError(f"insecure: a plaintext run cannot use {', '.join(given)}")
    if bool(config.cert) != bool(config.key):
        raise ConfigError("cert: a client certificate (cert) and its key (key) go together")


def tls_of(config: LoadConfig) -> TlsConfig | None:
    """The channel's TLS: None for `insecure`, else the config's files (system roots when no
    `cacert`); ConfigError naming the key of a file that cannot be read."""
    if config.insecure:
        return None
    try:
        return TlsConfig.from_files(
            config.cacert or None, config.cert or None, config.key or None, config.cname or None
        )
    except InvalidArgument as error:
        key = {"tls.ca": "cacert", "tls.cert": "cert", "tls.key": "key"}.get(error.field_path)
        why = error.violations[0].description if error.violations else error.message
        raise ConfigError(f"{key or 'cert'}: {why}") from None


def _check_data(data: Any) -> None:
    """ghz's checkData: an object, or a non-empty array of objects."""
    if data is None or isinstance(data, dict):
        return
    if not isinstance(data, list):
        raise ConfigError("data: unsupported type for Data (an object or an array of objects)")
    if not data:
        raise ConfigError("data: data array must not be empty")
    if not all(isinstance(item, dict) for item in data):
        raise ConfigError("data: data array contains unsupported type")
