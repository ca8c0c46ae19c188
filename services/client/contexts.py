"""The client's context file, like a kubeconfig: named servers with their TLS and identity.

    # ~/.config/gpualloc/config.yaml   ($GPUALLOC_CONFIG, else $XDG_CONFIG_HOME/gpualloc/...)
    apiVersion: gpualloc.io/v1alpha1
    kind: Config
    current-context: prod
    contexts:
    - name: prod
      context:
        server: gpualloc.example.com:443
        tls-ca: /etc/gpualloc/ca.crt
        tls-cert: ~/.gpualloc/me.crt
        tls-key: ~/.gpualloc/me.key
        owner: team-a/alice
    - name: local
      context:
        server: 127.0.0.1:50051

A context is a set of defaults for the client's variables (CONTEXT_KEYS: `server` is
GPUALLOC_ALLOCATOR_ADDR, `tls-ca` is GPUALLOC_CLIENT_TLS_CA, ...), so what wins is simple and
the same for every command: a flag, then the variable, then the context (`--context NAME`, else
`current-context`), then the built-in default. One parser (ClientSettings.from_env) checks them
all. A missing file is an empty config; a malformed one is an InvalidArgument naming the file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from services.common.errors import InvalidArgument, NotFound

__all__ = [
    "CONFIG_VARIABLE",
    "CONTEXT_KEYS",
    "Config",
    "config_path",
    "context_environ",
    "load_config",
    "save_config",
]

CONFIG_VARIABLE = "GPUALLOC_CONFIG"
API_VERSION = "gpualloc.io/v1alpha1"

CONTEXT_KEYS: dict[str, str] = {
    # key of a context -> the variable it is a default for
    "server": "GPUALLOC_ALLOCATOR_ADDR",
    "inventory": "GPUALLOC_INVENTORY_ADDR",
    "tls-ca": "GPUALLOC_CLIENT_TLS_CA",
    "tls-cert": "GPUALLOC_CLIENT_TLS_CERT",
    "tls-key": "GPUALLOC_CLIENT_TLS_KEY",
    "tls-server-name": "GPUALLOC_CLIENT_TLS_SERVER_NAME",
    "token-file": "GPUALLOC_CLIENT_TOKEN_FILE",
    "owner": "GPUALLOC_CLIENT_OWNER",
    "deadline": "GPUALLOC_CLIENT_DEADLINE",
}
_PATH_KEYS = frozenset({"tls-ca", "tls-cert", "tls-key", "token-file"})


@dataclass(frozen=True)
class Config:
    current_context: str = ""
    contexts: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def context(self, name: str) -> Mapping[str, str]:
        """The named context's keys; NotFound (with the names there are) when it is not there."""
        if name not in self.contexts:
            known = ", ".join(sorted(self.contexts)) or "none"
            raise NotFound(f'context "{name}" not found (contexts: {known})')
        return self.contexts[name]

    def with_context(self, name: str, values: Mapping[str, str]) -> Config:
        """The config with context `name` set to its old keys updated by `values` (an empty
        value removes that key)."""
        merged = {**self.contexts.get(name, {}), **values}
        kept = {k: v for k, v in merged.items() if v}
        return replace(self, contexts={**self.contexts, name: kept})

    def to_dict(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": "Config",
            "current-context": self.current_context,
            "contexts": [
                {"name": name, "context": dict(values)}
                for name, values in sorted(self.contexts.items())
            ],
        }


def config_path(environ: Mapping[str, str]) -> Path:
    """$GPUALLOC_CONFIG, else $XDG_CONFIG_HOME/gpualloc/config.yaml, else ~/.config/..."""
    explicit = environ.get(CONFIG_VARIABLE, "")
    if explicit:
        return Path(explicit).expanduser()
    home = environ.get("HOME") or str(Path.home())
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    return Path(base) / "gpualloc" / "config.yaml"


def load_config(path: Path) -> Config:
    """The config in `path` (an empty one when there is no file)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Config()
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidArgument(f"{path}: cannot read: {error}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as error:  # one line: where, and what is wrong there
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise InvalidArgument(
            f"{path}: not YAML: {where}{error.problem or error.context or 'malformed'}"
        ) from None
    except yaml.YAMLError as error:
        raise InvalidArgument(f"{path}: not YAML: {' '.join(str(error).split())}") from None
    return _decode(data or {}, path)


def _decode(data: Any, path: Path) -> Config:
    if not isinstance(data, dict):
        raise InvalidArgument(f"{path}: a config is a mapping (kind: Config)")
    unknown = set(data) - {"apiVersion", "kind", "current-context", "contexts"}
    if unknown:
        raise InvalidArgument(f"{path}: unknown field {sorted(unknown)[0]!r}")
    contexts: dict[str, dict[str, str]] = {}
    entries = data.get("contexts") or []
    if not isinstance(entries, list):
        raise InvalidArgument(f"{path}: contexts: a list; each entry needs a name and a context")
    for index, entry in enumerate(entries):
        where = f"{path}: contexts[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise InvalidArgument(f"{where}: needs a name and a context")
        values = entry.get("context") or {}
        if not isinstance(values, dict):
            raise InvalidArgument(f"{where}.context: a mapping of {', '.join(CONTEXT_KEYS)}")
        for key, value in values.items():
            if key not in CONTEXT_KEYS:
                raise InvalidArgument(
                    f"{where}.context: unknown key {key!r} (keys: {', '.join(CONTEXT_KEYS)})"
                )
            if not isinstance(value, str | int | float):
                raise InvalidArgument(f"{where}.context.{key}: a string")
        contexts[entry["name"]] = {str(k): str(v) for k, v in values.items()}
    current = data.get("current-context") or ""
    if not isinstance(current, str):
        raise InvalidArgument(f"{path}: current-context: a string")
    return Config(current, contexts)


def save_config(path: Path, config: Config) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(config.to_dict(), sort_keys=False)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise InvalidArgument(f"{path}: cannot write: {error.strerror}") from None


def context_environ(
    environ: Mapping[str, str], context_name: str | None, config: Config
) -> dict[str, str]:
    """`environ` over the chosen context's defaults (`context_name`, else current-context; no
    context when neither is set). Paths in a context may start with `~`."""
    name = context_name or config.current_context
    if not name:
        return dict(environ)
    defaults = {
        CONTEXT_KEYS[key]: os.path.expanduser(value) if key in _PATH_KEYS else value
        for key, value in config.context(name).items()
    }
    return {**defaults, **{k: v for k, v in environ.items() if v.strip()}}  # blank: unset
