"""Allocator settings: read from the environment, every bad variable named, all documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.allocator.config import ALLOCATOR_SETTINGS, AllocatorSettings
from services.allocator.core import Policy
from services.common.errors import InvalidArgument

OPERATIONS = Path(__file__).resolve().parents[3] / "docs" / "operations.md"


def test_defaults_without_environment():
    settings = AllocatorSettings.from_env({})
    assert settings == AllocatorSettings()
    assert (settings.redis_url, settings.lease_seconds, settings.policy) == (
        "",
        300.0,
        Policy.BINPACK,
    )


def test_values_are_parsed():
    settings = AllocatorSettings.from_env(
        {
            "GPUALLOC_REDIS_URL": "rediss://:pw@redis:6380/1",
            "GPUALLOC_LEASE_TTL": "2m",
            "GPUALLOC_POLICY": "firstfit",
            "GPUALLOC_DEVICE_CLASSES": "a.yaml, dir/",
            "GPUALLOC_WORKERS": "4",
            "GPUALLOC_LISTEN": "0.0.0.0:6000",
        }
    )
    assert settings.redis_url == "rediss://:pw@redis:6380/1"
    assert settings.lease_seconds == 120.0
    assert settings.policy is Policy.FIRST_FIT
    assert settings.device_classes == ("a.yaml", "dir/")
    assert settings.workers == 4
    assert settings.server.listen_address == "0.0.0.0:6000"


def test_every_bad_variable_is_named():
    with pytest.raises(InvalidArgument) as caught:
        AllocatorSettings.from_env({"GPUALLOC_LEASE_TTL": "soon", "GPUALLOC_RESERVE_RETRIES": "-1"})
    assert [v.path for v in caught.value.violations] == [
        "GPUALLOC_LEASE_TTL",
        "GPUALLOC_RESERVE_RETRIES",
    ]


def test_operations_guide_documents_every_setting():
    text = OPERATIONS.read_text()
    missing = [s.name for s in ALLOCATOR_SETTINGS.values() if f"`{s.name}`" not in text]
    assert not missing
