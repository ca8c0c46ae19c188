"""DeviceID keeps its hash: equal ids hash alike, and a pickled id works its own out again."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from services.common.dra.model import DeviceID

ID = DeviceID("gpu.nvidia.com", "node-1", "gpu-0")


@pytest.mark.parametrize(
    ("other", "equal"),
    [
        pytest.param(DeviceID("gpu.nvidia.com", "node-1", "gpu-0"), True, id="same-fields"),
        pytest.param(DeviceID("gpu.nvidia.com", "node-1", "gpu-1"), False, id="another-device"),
        pytest.param(DeviceID("gpu.nvidia.com", "node-2", "gpu-0"), False, id="another-pool"),
        pytest.param(DeviceID("other.example.com", "node-1", "gpu-0"), False, id="another-driver"),
    ],
)
def test_ids_equal_by_fields_and_find_each_other_in_maps(other: DeviceID, equal: bool) -> None:
    assert (other == ID) is equal
    assert ({ID: 1}.get(other) == 1) is equal
    if equal:
        assert hash(ID) == hash(other)


def test_the_kept_hash_is_not_pickled_and_copies_stay_equal() -> None:
    elsewhere = DeviceID("gpu.nvidia.com", "node-1", "gpu-0")
    object.__setattr__(elsewhere, "_hash", hash(ID) + 1)  # as kept by another process
    back = pickle.loads(pickle.dumps(elsewhere))
    assert back == ID and hash(back) == hash(ID) and {back: 1}[ID] == 1
    assert copy.deepcopy(ID) == ID and copy.copy(ID) == ID


def test_the_kept_hash_is_not_a_field() -> None:
    assert [f.name for f in dataclasses.fields(ID)] == ["driver", "pool", "device"]
    fields = {"driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0"}
    assert dataclasses.asdict(ID) == fields
    assert dataclasses.replace(ID, device="gpu-1") == DeviceID("gpu.nvidia.com", "node-1", "gpu-1")
    assert sorted([DeviceID("d", "p", "b"), DeviceID("d", "p", "a")])[0].device == "a"
    with pytest.raises(dataclasses.FrozenInstanceError):
        ID.device = "gpu-9"  # type: ignore[misc]
