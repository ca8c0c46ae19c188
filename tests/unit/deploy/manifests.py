"""Shared helpers for the deploy tests: where things are, how YAML is read, what the project ships.

Nothing here knows about one file in particular; each test module states its own expectations.
"""

from __future__ import annotations

import functools
import importlib
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
KUBERNETES_VERSION = "1.34"

# The two server ports, as the services' defaults and every deploy file use them.
ALLOCATOR_PORT = 50051
INVENTORY_PORT = 50052

# Environment variables a container may be given: the project's own settings and the OpenTelemetry
# SDK's standard ones. NVIDIA_* are read by the NVIDIA container runtime, not by gpualloc: the
# node agent needs them so NVML sees the node's GPUs (GPU Feature Discovery does the same).
ENV_PREFIXES = ("GPUALLOC_", "OTEL_")
RUNTIME_ENV = frozenset({"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"})


# libyaml's safe loader when PyYAML was built with it: the same rules as yaml.safe_load_all,
# ten times faster on the 3,700-line MIG slice file.
_SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def yaml_documents(path: Path) -> tuple[Any, ...]:
    """Every non-empty document of a (multi-document) YAML file, parsed once per test session.

    Callers must not mutate what they get back: it is shared between tests.
    """
    text = path.read_text(encoding="utf-8")
    return tuple(doc for doc in yaml.load_all(text, Loader=_SAFE_LOADER) if doc is not None)


def yaml_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*.yaml") if p.is_file())


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@functools.cache
def project_scripts() -> frozenset[str]:
    """The console scripts pyproject.toml installs: the only commands a container may run."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        pyproject = tomllib.load(f)
    return frozenset(pyproject["project"]["scripts"])


def validate_kubernetes(obj: dict[str, Any]) -> None:
    """Validate against the Kubernetes OpenAPI schemas (strict: unknown fields are errors).

    Uses kubernetes-validate's bundled schemas, so it works offline; skips when the package is
    not installed (it is not a declared dependency yet).
    """
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(part) for part in error.path)
        name = obj.get("metadata", {}).get("name")
        pytest.fail(f"{obj['kind']}/{name}: {where}: {error.message}")


def optional_module(name: str) -> Any | None:
    """The module if it exists yet (other parts of the project land in parallel), else None."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is not None and name.startswith(error.name):
            return None
        raise
