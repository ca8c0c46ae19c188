"""Inventory settings: the shared server settings plus what only the inventory reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from services.common.config import ServerSettings, Setting, env_str, read_settings

__all__ = ["DEFAULT_LISTEN", "INVENTORY_SETTINGS", "InventorySettings"]

DEFAULT_LISTEN = "127.0.0.1:50052"  # when run apart; `gpualloc serve` shares the allocator's port

INVENTORY_SETTINGS: dict[str, Setting[Any]] = {
    "seed_paths": Setting(
        "GPUALLOC_SEED",
        "",
        "comma-separated files/directories of ResourceSlices and Nodes applied at start",
        env_str,
    ),
}


@dataclass(frozen=True)
class InventorySettings:
    server: ServerSettings
    seed_paths: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> InventorySettings:
        server = ServerSettings.from_env(environ)
        if "GPUALLOC_LISTEN" not in environ:
            server = replace(server, listen_address=DEFAULT_LISTEN)
        values = read_settings(environ, INVENTORY_SETTINGS)
        seeds = tuple(p.strip() for p in values["seed_paths"].split(",") if p.strip())
        return cls(server=server, seed_paths=seeds)
