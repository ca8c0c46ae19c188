"""parse_nvidia_smi_xml on the three real samples (DTD v11 with and without MIG, v13) and on
broken or hostile input."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.errors import ParseError
from services.inventory.adapters.sources.nvidia_smi_xml import brand_from_smi, parse_nvidia_smi_xml
from services.inventory.core.report import (
    EccCounts,
    MigMode,
    RemappedRows,
    ReportSource,
    RetiredPages,
)

DATA = Path(__file__).parents[2] / "data" / "nvidia-smi-xml"
A5000 = "2x-rtx-a5000_drv590.44.01_telegraf.xml"
A100 = "a100-sxm4-40gb_mig-2x3g.20gb_drv510.47.03_netdata.xml"
T4 = "tesla-t4_turing_drv515_telegraf.xml"
MIB = 2**20


def parse(name: str):
    return parse_nvidia_smi_xml((DATA / name).read_text(), "node-a", name)


def test_a5000_two_gpus_v13():
    report = parse(A5000)
    assert report.node == "node-a"
    assert report.source is ReportSource.NVIDIA_SMI_XML
    assert report.timestamp == "2025-12-30T09:46:54"
    assert (report.driver_version, report.cuda_driver_version) == ("590.44.01", "13.1")
    assert len(report.gpus) == 2
    first, second = report.gpus
    assert [g.index for g in report.gpus] == [0, 1]
    assert [g.minor for g in report.gpus] == [1, 0]  # index order is not minor order
    assert first.pci_bus_id == "0000:81:00.0"
    assert second.pci_bus_id == "0000:c1:00.0"
    assert first.uuid == "GPU-12345678-aaaa-bbbb-cccc-0123456789ab"
    assert second.uuid == "GPU-12345678-aaaa-bbbb-cccc-0123456789cd"
    assert first.product_name == "NVIDIA RTX A5000"
    assert (first.brand, first.architecture) == ("NvidiaRTX", "Ampere")
    assert first.pci_device_id == "0x223110DE"
    assert first.memory_bytes == 24564 * MIB
    assert first.addressing_mode == "HMM"
    assert first.mig_mode == MigMode(None, None)
    assert first.mig_devices == ()
    assert first.health.ecc_enabled is False
    assert first.health.ecc == EccCounts()  # all N/A with ECC off
    assert first.health.retired_pages is None
    assert first.health.remapped_rows == RemappedRows(0, 0, pending=False, failure=False)


def test_a100_mig_two_3g20gb():
    report = parse(A100)
    assert report.timestamp == "2023-01-27T11:32:31"
    assert (report.driver_version, report.cuda_driver_version) == ("510.47.03", "11.6")
    (gpu,) = report.gpus
    assert gpu.product_name == "NVIDIA A100-SXM4-40GB"
    assert gpu.pci_bus_id == "0000:00:04.0"
    assert gpu.pci_device_id == "0x20B010DE"
    assert gpu.memory_bytes == 40960 * MIB
    assert gpu.mig_mode == MigMode(True, True)
    assert gpu.mig_enabled
    assert [m.gpu_instance_id for m in gpu.mig_devices] == [1, 2]
    assert [m.compute_instance_id for m in gpu.mig_devices] == [0, 0]
    for mig in gpu.mig_devices:
        assert (mig.profile, mig.profile_id) == ("3g.20gb", 9)
        assert mig.multiprocessors == 42
        assert mig.memory_bytes == 19968 * MIB
        assert (mig.copy_engines, mig.decoders, mig.encoders) == (3, 2, 0)
        assert (mig.jpeg_engines, mig.ofa_engines) == (0, 0)
        assert mig.placement is None  # the XML has none
        assert mig.uuid is None
    assert gpu.health.ecc == EccCounts(None, None, 0, 0)
    assert gpu.health.retired_pages is None
    assert gpu.health.remapped_rows is None  # <remapped_rows>N/A</remapped_rows>


def test_t4_ecc_and_retired_pages():
    report = parse(T4)
    (gpu,) = report.gpus
    assert (gpu.product_name, gpu.brand, gpu.architecture) == ("Tesla T4", "Nvidia", "Turing")
    assert gpu.pci_bus_id == "0000:00:1e.0"
    assert gpu.memory_bytes == 15360 * MIB
    assert gpu.mig_mode == MigMode(None, None)
    assert gpu.health.ecc_enabled is True
    assert gpu.health.ecc == EccCounts(0, 0, 0, 0)
    assert gpu.health.retired_pages == RetiredPages(0, 0, pending=False)


def test_caller_timestamp_and_labels_win():
    text = (DATA / T4).read_text()
    report = parse_nvidia_smi_xml(text, "n", "t4", "2026-01-01T00:00:00Z", {"zone": "a"})
    assert report.timestamp == "2026-01-01T00:00:00Z"
    assert report.labels == {"zone": "a"}


GPU = """<gpu id="00000000:3B:00.0"><product_name>X</product_name><uuid>GPU-1</uuid>
<pci><pci_bus_id>00000000:3B:00.0</pci_bus_id></pci>{extra}</gpu>"""


def doc(extra: str = "", head: str = "") -> str:
    return (
        f'<?xml version="1.0" ?>\n{head}<nvidia_smi_log>\n'
        "<timestamp>Fri Jan 27 11:32:31 2023</timestamp>\n"
        f"{GPU.format(extra=extra)}\n</nvidia_smi_log>\n"
    )


def memory(gpu):
    return gpu.memory_bytes


def ecc(gpu):
    return gpu.health.ecc


def remapped_rows(gpu):
    return gpu.health.remapped_rows


@pytest.mark.parametrize(
    ("extra", "read", "expected"),
    [
        pytest.param("", memory, None, id="missing-memory-is-unknown"),
        pytest.param(
            "<fb_memory_usage><total>N/A</total></fb_memory_usage>",
            memory,
            None,
            id="na-memory-is-unknown",
        ),
        pytest.param(
            "<fb_memory_usage><total>2 GiB</total></fb_memory_usage>",
            memory,
            2 * 2**30,
            id="gib-unit",
        ),
        pytest.param(
            "<ecc_errors><volatile><single_bit><total>3</total></single_bit>"
            "<double_bit><total>1</total></double_bit></volatile></ecc_errors>",
            ecc,
            EccCounts(3, 1, None, None),
            id="pascal-single-double-bit-ecc",
        ),
        pytest.param(
            "<ecc_errors><volatile><sram_correctable>1</sram_correctable>"
            "<sram_uncorrectable_parity>2</sram_uncorrectable_parity>"
            "<sram_uncorrectable_secded>3</sram_uncorrectable_secded>"
            "<dram_correctable>4</dram_correctable><dram_uncorrectable>5</dram_uncorrectable>"
            "</volatile></ecc_errors>",
            ecc,
            EccCounts(5, 10, None, None),
            id="v13-split-sram-uncorrectable",
        ),
        pytest.param(
            "<remapped_rows><remapped_row_corr>2</remapped_row_corr>"
            "<remapped_row_unc>1</remapped_row_unc><remapped_row_pending>Yes</remapped_row_pending>"
            "<remapped_row_failure>No</remapped_row_failure></remapped_rows>",
            remapped_rows,
            RemappedRows(2, 1, pending=True, failure=False),
            id="remapped-rows-pending",
        ),
    ],
)
def test_optional_values(extra, read, expected):
    (gpu,) = parse_nvidia_smi_xml(doc(extra), "n", "x.xml").gpus
    assert read(gpu) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            (DATA / A100).read_text()[:500],
            "truncated.xml:12: not well-formed XML: unclosed token",
            id="truncated-mid-tag",
        ),
        pytest.param(
            (DATA / A100).read_text().split("</gpu>")[0],
            "truncated.xml:357: not well-formed XML: no element found",
            id="truncated-before-end-tags",
        ),
        pytest.param(
            "GPU 0: Tesla T4\n", "x.xml:1: not well-formed XML: syntax error", id="not-xml"
        ),
        pytest.param("", "x.xml:1: not well-formed XML: no element found", id="empty"),
        pytest.param(
            "<html><body/></html>",
            "x.xml:1: html: root element is <html>, expected <nvidia_smi_log>",
            id="wrong-root",
        ),
        pytest.param(
            doc("<fb_memory_usage><total>lots MiB</total></fb_memory_usage>"),
            "x.xml:5: gpu[0]/fb_memory_usage/total: 'lots MiB' is not a size like '40960 MiB'",
            id="bad-memory",
        ),
        pytest.param(
            doc("<fb_memory_usage><total>40 MB</total></fb_memory_usage>"),
            "x.xml:5: gpu[0]/fb_memory_usage/total: '40 MB' is not a size like '40960 MiB'",
            id="decimal-unit-refused",
        ),
        pytest.param(
            doc("<minor_number>one</minor_number>"),
            "x.xml:5: gpu[0]/minor_number: 'one' is not a whole number",
            id="bad-number",
        ),
        pytest.param(
            doc("<mig_mode><current_mig>Maybe</current_mig></mig_mode>"),
            "x.xml:5: gpu[0]/mig_mode/current_mig: 'Maybe' is not Enabled/Disabled/Yes/No",
            id="bad-boolean",
        ),
        pytest.param(
            doc().replace("<uuid>GPU-1</uuid>", ""),
            "x.xml:4: gpu[0]/uuid: missing or N/A",
            id="missing-uuid",
        ),
        pytest.param(
            doc().replace("00000000:3B:00.0</pci_bus_id>", "3B</pci_bus_id>"),
            "x.xml:5: gpu[0]/pci/pci_bus_id: '3B' is not a PCI bus id like 0000:3b:00.0",
            id="bad-bus-id",
        ),
        pytest.param(
            doc().replace("Fri Jan 27 11:32:31 2023", "yesterday"),
            "x.xml:3: timestamp: 'yesterday' is not like 'Fri Jan 27 11:32:31 2023'",
            id="bad-timestamp",
        ),
        pytest.param(
            doc("<mig_devices><mig_device><index>0</index></mig_device></mig_devices>"),
            "x.xml:5: gpu[0]/mig_devices/mig_device[0]/gpu_instance_id: missing or N/A",
            id="mig-device-without-instance-id",
        ),
    ],
)
def test_broken_input(text, message):
    source = "truncated.xml" if message.startswith("truncated") else "x.xml"
    with pytest.raises(ParseError) as caught:
        parse_nvidia_smi_xml(text, "n", source)
    assert str(caught.value) == message
    assert caught.value.source == source


BOMB = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [
 <!ENTITY a "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa">
 <!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">
 <!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">
]>
<nvidia_smi_log><timestamp>&c;</timestamp></nvidia_smi_log>
"""
EXTERNAL = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<nvidia_smi_log><timestamp>&secret;</timestamp></nvidia_smi_log>
"""
UNDECLARED = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v11.dtd">
<nvidia_smi_log><timestamp>&nvsmi;</timestamp></nvidia_smi_log>
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(BOMB, "x.xml:2: an internal DTD subset is not allowed", id="entity-bomb"),
        pytest.param(EXTERNAL, "x.xml:2: an internal DTD subset is not allowed", id="external"),
        pytest.param(
            UNDECLARED, "x.xml:3: entity reference &nvsmi; is not allowed", id="undeclared-entity"
        ),
    ],
)
def test_entities_are_refused(text, message):
    with pytest.raises(ParseError) as caught:
        parse_nvidia_smi_xml(text, "n", "x.xml")
    assert str(caught.value) == message + " in nvidia-smi XML"


@pytest.mark.parametrize(
    ("smi", "dra"),
    [
        pytest.param("NVIDIA", "Nvidia", id="nvidia"),
        pytest.param("NVIDIA RTX", "NvidiaRTX", id="nvidia-rtx"),
        pytest.param("Tesla", "Tesla", id="tesla"),
        pytest.param("GeForce", "GeForce", id="geforce"),
        pytest.param("Quadro RTX", "QuadroRTX", id="quadro-rtx"),
        pytest.param("NVIDIA Virtual Compute Server", "NvidiaVCS", id="vcs"),
    ],
)
def test_brand_spelling_matches_the_dra_driver(smi, dra):
    assert brand_from_smi(smi) == dra
