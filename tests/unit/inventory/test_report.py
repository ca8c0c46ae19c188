"""The report's normalised values: PCI bus ids, CPU lists, topology cells."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.inventory.core.report import (
    CpuRange,
    GpuLink,
    Placement,
    TopologyLevel,
    format_cpu_list,
    normalize_pci_bus_id,
    parse_cpu_list,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("00000000:3B:00.0", "0000:3b:00.0", id="nvml-8-digit-upper"),
        pytest.param("0000:3b:00.0", "0000:3b:00.0", id="dra-form"),
        pytest.param("3b:00.0", "0000:3b:00.0", id="no-domain"),
        pytest.param(" 00000001:C1:1F.7 ", "0001:c1:1f.7", id="domain-1-padded"),
        pytest.param("00010000:81:00.0", "00010000:81:00.0", id="wide-domain-kept"),
    ],
)
def test_normalize_pci_bus_id(text, expected):
    assert normalize_pci_bus_id(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("0000:3b:00", id="no-function"),
        pytest.param("0000:3b:00.8", id="function-out-of-range"),
        pytest.param("PCI:0000:9b:00", id="xid-log-form"),
        pytest.param("", id="empty"),
    ],
)
def test_normalize_pci_bus_id_refuses(text):
    with pytest.raises(ValueError, match="is not a PCI bus id like 0000:3b:00.0"):
        normalize_pci_bus_id(text)


@given(
    domain=st.integers(0, 0xFFFF),
    bus=st.integers(0, 0xFF),
    device=st.integers(0, 0x1F),
    function=st.integers(0, 7),
)
def test_every_spelling_of_one_address_normalises_alike(domain, bus, device, function):
    nvml = f"{domain:08X}:{bus:02X}:{device:02X}.{function}"
    dra = f"{domain:04x}:{bus:02x}:{device:02x}.{function}"
    assert normalize_pci_bus_id(nvml) == normalize_pci_bus_id(dra) == dra
    assert normalize_pci_bus_id(dra) == normalize_pci_bus_id(normalize_pci_bus_id(nvml))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("0-51", (CpuRange(0, 51),), id="range"),
        pytest.param("0-63,128-191", (CpuRange(0, 63), CpuRange(128, 191)), id="two-ranges"),
        pytest.param("3", (CpuRange(3, 3),), id="single"),
        pytest.param("N/A", (), id="na"),
        pytest.param("", (), id="empty"),
    ],
)
def test_parse_cpu_list(text, expected):
    assert parse_cpu_list(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("0-", id="open-range"),
        pytest.param("a-b", id="letters"),
        pytest.param("5-3", id="backwards"),
        pytest.param("0,,1", id="empty-item"),
    ],
)
def test_parse_cpu_list_refuses(text):
    with pytest.raises(ValueError):
        parse_cpu_list(text)


@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 50)), max_size=6))
def test_cpu_list_round_trips(pairs):
    ranges = tuple(CpuRange(first, first + length) for first, length in pairs)
    assert parse_cpu_list(format_cpu_list(ranges)) == ranges


@pytest.mark.parametrize(
    ("text", "link", "rank"),
    [
        pytest.param("X", GpuLink(TopologyLevel.SELF), 0, id="self"),
        pytest.param("NV18", GpuLink(TopologyLevel.NVLINK, 18), 1, id="nv18"),
        pytest.param("PIX", GpuLink(TopologyLevel.PIX), 2, id="pix"),
        pytest.param("PXB", GpuLink(TopologyLevel.PXB), 3, id="pxb"),
        pytest.param("PHB", GpuLink(TopologyLevel.PHB), 4, id="phb"),
        pytest.param("NODE", GpuLink(TopologyLevel.NODE), 5, id="node"),
        pytest.param("SYS", GpuLink(TopologyLevel.SYS), 6, id="sys"),
        pytest.param("SOC", GpuLink(TopologyLevel.SYS), 6, id="soc-is-old-sys"),
    ],
)
def test_gpu_link(text, link, rank):
    parsed = GpuLink.parse(text)
    assert parsed == link
    assert parsed.rank == rank
    assert str(parsed) == ("SYS" if text == "SOC" else text)


def test_gpu_link_invariants():
    with pytest.raises(ValueError, match="nvlinks=0 does not fit level NV"):
        GpuLink(TopologyLevel.NVLINK)
    with pytest.raises(ValueError, match="nvlinks=2 does not fit level PIX"):
        GpuLink(TopologyLevel.PIX, 2)


def test_placement():
    assert list(Placement(4, 4).slices) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="bad placement 0:0"):
        Placement(0, 0)
