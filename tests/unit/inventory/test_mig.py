"""The MIG counter model against the real tables: `nvidia-smi mig -lgipp` on an H100 and NVIDIA's
mig-parted default configs (max instances per profile and the `all-balanced` mixes)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common.dra.quantity import Quantity
from services.inventory.core.mig import (
    KNOWN_PROFILE_TABLES,
    consumed_counters,
    counter_set_counters,
    fits,
    forced_placements,
    identify_profile,
    mig_profile_name,
    modelled_dimensions,
)
from services.inventory.core.report import MigDevice, MigProfile, Placement

DATA = Path(__file__).parents[2] / "data" / "mig"
A100_40GB, A100_80GB, H100 = "0x20B010DE", "0x20B210DE", "0x233010DE"


def profile(table: str, name: str) -> MigProfile:
    return next(p for p in KNOWN_PROFILE_TABLES[table] if p.name == name)


def place(table: str, *chosen: tuple[str, int]) -> bool:
    """Whether these (profile, placement start) devices fit the GPU's counter set together."""
    profiles = KNOWN_PROFILE_TABLES[table]
    consumers = []
    for name, start in chosen:
        p = profile(table, name)
        (placement,) = [pl for pl in p.placements if pl.start == start]
        consumers.append(consumed_counters(profiles, p, placement))
    return fits(counter_set_counters(profiles), consumers)


def packable(table: str, names: list[str]) -> bool:
    """Whether some choice of placements lets all these profiles fit at once."""
    profiles = KNOWN_PROFILE_TABLES[table]
    counters = counter_set_counters(profiles)

    names = sorted(names)

    def search(i: int, consumers: list[dict[str, Quantity]], lowest: int) -> bool:
        if i == len(names):
            return True
        p = profile(table, names[i])
        for placement in p.placements:
            if placement.start < lowest:
                continue  # equal profiles take placements in order: each set is tried once
            consumer = consumed_counters(profiles, p, placement)
            same_next = i + 1 < len(names) and names[i + 1] == names[i]
            next_lowest = placement.start + 1 if same_next else 0
            if fits(counters, [*consumers, consumer]) and search(
                i + 1, [*consumers, consumer], next_lowest
            ):
                return True
        return False

    return search(0, [], 0)


@pytest.mark.parametrize(
    ("table", "chosen", "expected"),
    [
        pytest.param(A100_40GB, [("1g.5gb", s) for s in range(7)], True, id="a100-seven-1g5gb"),
        pytest.param(A100_40GB, [("1g.5gb", 0), ("1g.5gb", 0)], False, id="a100-same-slice-twice"),
        pytest.param(
            A100_40GB, [("1g.5gb", 0), ("3g.20gb", 4)], True, id="a100-1g5gb-and-3g20gb-apart"
        ),
        pytest.param(
            A100_40GB, [("1g.5gb", 4), ("3g.20gb", 4)], False, id="a100-1g5gb-inside-3g20gb"
        ),
        pytest.param(A100_40GB, [("3g.20gb", 0), ("3g.20gb", 4)], True, id="a100-two-3g20gb"),
        pytest.param(
            A100_40GB, [("3g.20gb", 0), ("3g.20gb", 4), ("1g.5gb", 6)], False, id="a100-full"
        ),
        pytest.param(A100_40GB, [("4g.20gb", 0), ("3g.20gb", 4)], True, id="a100-4g-and-3g"),
        pytest.param(A100_40GB, [("4g.20gb", 0), ("3g.20gb", 0)], False, id="a100-4g-over-3g"),
        pytest.param(
            A100_40GB,
            [("2g.10gb", 0), ("2g.10gb", 2), ("2g.10gb", 4), ("1g.5gb", 6)],
            True,
            id="a100-three-2g-one-1g",
        ),
        pytest.param(
            A100_40GB, [("1g.10gb", s) for s in (0, 2, 4, 6)], True, id="a100-four-1g10gb"
        ),
        pytest.param(
            A100_40GB,
            [("1g.5gb+me", 0), ("1g.5gb+me", 1)],
            False,
            id="a100-one-media-extension-only",
        ),
        pytest.param(A100_40GB, [("1g.5gb+me", 0), ("1g.5gb", 1)], True, id="a100-me-plus-1g"),
        pytest.param(A100_40GB, [("7g.40gb", 0), ("1g.5gb", 6)], False, id="a100-7g-is-whole"),
        pytest.param(H100, [("1g.10gb", s) for s in range(7)], True, id="h100-seven-1g10gb"),
        pytest.param(H100, [("3g.40gb", 0), ("3g.40gb", 4)], True, id="h100-two-3g40gb"),
        pytest.param(H100, [("4g.40gb", 0), ("3g.40gb", 4)], True, id="h100-4g-and-3g"),
        pytest.param(H100, [("1g.20gb", 6), ("3g.40gb", 4)], False, id="h100-1g20gb-in-3g"),
        pytest.param(
            H100, [("1g.10gb+me", 0), ("1g.10gb+me", 3)], False, id="h100-one-media-extension"
        ),
    ],
)
def test_placements_against_counters(table, chosen, expected):
    assert place(table, *chosen) is expected


def test_a100_40gb_counter_set():
    counters = counter_set_counters(KNOWN_PROFILE_TABLES[A100_40GB])
    assert {k: str(v) for k, v in counters.items()} == {
        "multiprocessors": "98",
        "copy-engines": "7",
        "decoders": "5",
        "encoders": "0",
        "jpeg-engines": "1",
        "ofa-engines": "1",
        "memory": "40192Mi",
        **{f"memory-slice-{i}": "1" for i in range(8)},
        "profile-20-instances": "1",
    }


def test_h100_models_only_fully_known_dimensions():
    profiles = KNOWN_PROFILE_TABLES[H100]
    assert [d.counter for d in modelled_dimensions(profiles)] == ["encoders"]
    counters = counter_set_counters(profiles)
    assert sorted(counters) == sorted(
        ["encoders", *(f"memory-slice-{i}" for i in range(8)), "profile-20-instances"]
    )


def lgipp(text: str) -> dict[int, tuple[Placement, ...]]:
    """`GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1` -> {19: placements}."""
    table = {}
    for line in text.splitlines():
        match = re.match(r"GPU\s+\d+ Profile ID\s+(\d+) Placements?\s*: \{([\d,]+)\}:(\d+)", line)
        assert match, line
        starts = [int(s) for s in match[2].split(",")]
        table[int(match[1])] = tuple(Placement(s, int(match[3])) for s in starts)
    return table


def test_h100_table_matches_real_lgipp():
    real = lgipp((DATA / "h100_nvidia-smi-mig-lgipp_dataproc-20241220.txt").read_text())
    assert {p.id: p.placements for p in KNOWN_PROFILE_TABLES[H100]} == real
    # A100 shares ids and placements (MIG user guide); its table says the same.
    assert {p.id: p.placements for p in KNOWN_PROFILE_TABLES[A100_40GB]} == real


def mig_parted_configs() -> dict[str, list[dict[str, Any]]]:
    path = DATA / "gpu-operator_default-mig-parted-config_0400_configmap.yaml"
    configmap = yaml.safe_load(path.read_text())
    configs: dict[str, list[dict[str, Any]]] = yaml.safe_load(configmap["data"]["config.yaml"])[
        "mig-configs"
    ]
    return configs


def applicable(table: str) -> list[tuple[str, dict[str, int]]]:
    """(config, mig-devices) of each mig-parted entry for this GPU that names only its profiles."""
    names = {p.name for p in KNOWN_PROFILE_TABLES[table]}
    found = []
    for config, entries in mig_parted_configs().items():
        for entry in entries:
            device_filter = entry.get("device-filter", [table])
            if isinstance(device_filter, str):
                device_filter = [device_filter]
            devices = entry.get("mig-devices") or {}
            if table in device_filter and devices and set(devices) <= names:
                found.append((config, devices))
    return found


@pytest.mark.parametrize(
    "table",
    [
        pytest.param(A100_40GB, id="a100-40gb"),
        pytest.param(A100_80GB, id="a100-80gb"),
        pytest.param(H100, id="h100"),
    ],
)
def test_mig_parted_configs_fit_and_maxima_are_tight(table):
    configs = applicable(table)
    assert len(configs) >= 7  # every profile has an all-<profile> config
    for config, devices in configs:
        names = [name for name, count in devices.items() for _ in range(count)]
        assert packable(table, names), config
        if len(devices) == 1:  # all-<profile>: the count is the profile's maximum
            ((name, count),) = devices.items()
            assert profile(table, name).max_instances == count, config
            assert not packable(table, [name] * (count + 1)), config


@pytest.mark.parametrize(
    ("slices", "memory_mib", "total_mib", "enum", "compute", "name"),
    [
        pytest.param(1, 4864, 40960, 0, None, "1g.5gb", id="a100-40gb-1g"),
        pytest.param(1, 4864, 40960, 7, None, "1g.5gb+me", id="a100-40gb-1g-me"),
        pytest.param(3, 19968, 40960, 2, None, "3g.20gb", id="a100-40gb-3g"),
        pytest.param(7, 40192, 40960, 4, None, "7g.40gb", id="a100-40gb-7g"),
        pytest.param(1, 9856, 81920, 0, None, "1g.10gb", id="a100-80gb-1g"),
        pytest.param(1, 9984, 81559, 0, None, "1g.10gb", id="h100-1g"),
        pytest.param(3, 71424, 143771, 2, 1, "1c.3g.71gb", id="h200-compute-instance"),
        pytest.param(1, 4864, 40960, 0xD, None, "1g.5gb-me", id="no-media-suffix"),
    ],
)
def test_profile_name_rule(slices, memory_mib, total_mib, enum, compute, name):
    assert mig_profile_name(slices, memory_mib, total_mib * 2**20, enum, compute) == name


def test_identify_profile_from_xml_values():
    table = KNOWN_PROFILE_TABLES[A100_40GB]
    mib = 2**20
    three = MigDevice(1, 0, memory_bytes=19968 * mib, multiprocessors=42, copy_engines=3)
    four = MigDevice(1, 0, memory_bytes=19968 * mib, multiprocessors=56)
    me = MigDevice(1, 0, memory_bytes=4864 * mib, multiprocessors=14, ofa_engines=1)
    plain = MigDevice(1, 0, memory_bytes=4864 * mib, multiprocessors=14, ofa_engines=0)
    ambiguous = MigDevice(1, 0, memory_bytes=4864 * mib, multiprocessors=14)
    compute_slice = MigDevice(1, 1, memory_bytes=19968 * mib, multiprocessors=14)
    assert identify_profile(table, three) == profile(A100_40GB, "3g.20gb")
    assert identify_profile(table, four) == profile(A100_40GB, "4g.20gb")
    assert identify_profile(table, me) == profile(A100_40GB, "1g.5gb+me")
    assert identify_profile(table, plain) == profile(A100_40GB, "1g.5gb")
    assert identify_profile(table, ambiguous) is None
    assert identify_profile(table, compute_slice) is None
    assert identify_profile(table, MigDevice(1, 0)) is None


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        pytest.param(
            ["3g.20gb", "3g.20gb"],
            {9: frozenset({Placement(0, 4), Placement(4, 4)})},
            id="two-3g-fill-both-halves",
        ),
        pytest.param(["4g.20gb"], {5: frozenset({Placement(0, 4)})}, id="one-placement-only"),
        pytest.param(["3g.20gb"], {}, id="one-3g-could-be-either-half"),
        pytest.param(
            ["4g.20gb", "3g.20gb"],
            {5: frozenset({Placement(0, 4)}), 9: frozenset({Placement(4, 4)})},
            id="4g-pins-the-3g",
        ),
        pytest.param(["7g.40gb", "1g.5gb"], {}, id="impossible-mix-names-nothing"),
    ],
)
def test_forced_placements(names, expected):
    assert forced_placements([profile(A100_40GB, n) for n in names]) == expected
