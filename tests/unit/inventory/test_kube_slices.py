"""The pure parts of the ResourceSlice watch: backoff delays and slices from API server JSON.
The loop runs against a real HTTP API server in tests/integration/test_inventory_kube_watch.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common.errors import InvalidArgument
from services.inventory.adapters.sources.kube_slices import (
    Backoff,
    WatchError,
    _event,
    slice_from_object,
)

T4_FILE = Path(__file__).parents[2] / "data" / "resourceslices"
T4_FILE = T4_FILE / "openshift-v1.35_2x-tesla-t4_condensed.yaml"


@pytest.mark.parametrize(
    ("failures", "draw", "expected"),
    [
        pytest.param(1, 0.0, 0.25, id="first-failure-low-draw"),
        pytest.param(1, 1.0, 0.5, id="first-failure-high-draw"),
        pytest.param(3, 1.0, 2.0, id="doubles"),
        pytest.param(20, 0.0, 15.0, id="capped-low"),
        pytest.param(20, 1.0, 30.0, id="capped-high"),
    ],
)
def test_backoff_is_exponential_jittered_and_capped(
    failures: int, draw: float, expected: float
) -> None:
    assert Backoff(0.5, 30.0).delay(failures, lambda: draw) == expected


def list_item() -> dict[str, Any]:
    """The sample slice as a List item: no apiVersion, no kind, server metadata."""
    doc: dict[str, Any] = yaml.safe_load(T4_FILE.read_text())
    del doc["apiVersion"], doc["kind"]
    doc["metadata"].update(resourceVersion="123", uid="u-1", managedFields=[{"manager": "x"}])
    return doc


@pytest.mark.parametrize("version", ["resource.k8s.io/v1", "resource.k8s.io/v1beta2"])
def test_list_items_take_the_listings_api_version(version: str) -> None:
    resource_slice = slice_from_object(list_item(), version)
    assert resource_slice.api_version == version
    assert [d.name for d in resource_slice.devices] == ["gpu-0", "gpu-1"]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"kind": "DeviceClass"}, id="not-a-slice"),
        pytest.param({"spec": {"driver": "gpu.nvidia.com"}}, id="no-pool"),
    ],
)
def test_objects_gpualloc_cannot_use_are_invalid_and_name_the_slice(change: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument) as info:
        slice_from_object({**list_item(), **change}, "resource.k8s.io/v1")
    assert "resourceslices/harpatil4220c-g9kfm-gpu-c-rd8r8-gpu.nvidia.com-wvrlc" in str(info.value)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b"{not json", id="not-json"),
        pytest.param(b"[" * 5000, id="nested-past-the-recursion-limit"),
        pytest.param(b'{"object": {}}', id="no-type"),
    ],
)
def test_a_bad_watch_line_is_a_watch_error(line: bytes) -> None:
    with pytest.raises(WatchError, match="not a watch event"):
        _event(line)
