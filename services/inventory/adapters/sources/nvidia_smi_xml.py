"""`nvidia-smi -q -x` (DTD nvsmi_device v11, v12, v13) -> NodeReport.

Values are text with units (`40960 MiB`) or `N/A`; `N/A`, an empty element and a missing element
all mean "unknown" (None). ECC counters changed shape between versions and are summed into
correctable/uncorrectable totals: Pascal's `single_bit/total` and `double_bit/total`, v11/v12's
`sram_*`/`dram_*`, v13's split `sram_uncorrectable_parity` + `_secded`. The XML has no NUMA,
NVLink, CPU affinity, compute capability or MIG placement; MIG profiles are recognised from the
known tables in core/mig.py by the GPU's PCI device id.

The XML is parsed with expat directly and any entity declaration, internal DTD subset or
undeclared entity reference is refused, so entity-expansion bombs and external entities cannot
get in (nvidia-smi's own output only names an external DTD, which is never fetched). Errors are
ParseError naming the source, the line and the element path, with GPUs counted from 0:
`gpu[1]/fb_memory_usage/total`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import NoReturn
from xml.etree.ElementTree import Element, TreeBuilder
from xml.parsers import expat

from services.common.errors import ParseError
from services.inventory.core.mig import KNOWN_PROFILE_TABLES, identify_profile
from services.inventory.core.report import (
    EccCounts,
    Gpu,
    GpuHealth,
    MigDevice,
    MigMode,
    NodeReport,
    RemappedRows,
    ReportSource,
    RetiredPages,
    normalize_pci_bus_id,
)

__all__ = ["brand_from_smi", "parse_nvidia_smi_xml", "parse_xml_safely"]

_ROOT = "nvidia_smi_log"
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_MEMORY = re.compile(r"^(\d+)\s*([KMGT]?i?B)$")
_BOOLEAN = {"Enabled": True, "Disabled": False, "Yes": True, "No": False}
# nvidia-smi's product_brand -> go-nvlib GetBrandAsString, the DRA `brand` attribute.
_BRANDS = {
    "NVIDIA": "Nvidia",
    "NVIDIA RTX": "NvidiaRTX",
    "Quadro RTX": "QuadroRTX",
    "GeForce RTX": "GeForceRTX",
    "Titan RTX": "TitanRTX",
    "TITAN": "Titan",
    "GRID": "Grid",
    "NVIDIA Virtual Applications": "NvidiaVApps",
    "NVIDIA Virtual PC": "NvidiaVPC",
    "NVIDIA Virtual Compute Server": "NvidiaVCS",
    "NVIDIA RTX Virtual Workstation": "NvidiaVWS",
    "NVIDIA Cloud Gaming": "NvidiaCloudGaming",
}


def brand_from_smi(text: str) -> str:
    """`NVIDIA RTX` -> `NvidiaRTX`; names that already match (Tesla, Quadro, GeForce) pass."""
    return _BRANDS.get(text, text.replace(" ", ""))


# --- safe XML --------------------------------------------------------------------------------


def parse_xml_safely(text: str, source: str) -> tuple[Element, dict[Element, int]]:
    """Parse XML without entities; returns the root and each element's line number."""
    builder = TreeBuilder()
    parser = expat.ParserCreate()
    lines: dict[Element, int] = {}

    def refuse(what: str) -> NoReturn:
        raise ParseError(
            f"{what} is not allowed in nvidia-smi XML", source, parser.CurrentLineNumber
        )

    def start(tag: str, attrs: dict[str, str]) -> None:
        lines[builder.start(tag, attrs)] = parser.CurrentLineNumber

    def doctype(name: str, system_id: str | None, public_id: str | None, internal: int) -> None:
        if internal:
            refuse("an internal DTD subset")

    parser.StartElementHandler = start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = lambda name, *_: refuse(f"entity declaration {name!r}")
    parser.SkippedEntityHandler = lambda name, _: refuse(f"entity reference &{name};")
    parser.ExternalEntityRefHandler = lambda *_: refuse("an external entity")
    parser.buffer_text = True
    try:
        parser.Parse(text, True)
    except expat.ExpatError as error:
        message = expat.errors.messages[error.code]
        raise ParseError(f"not well-formed XML: {message}", source, error.lineno) from None
    root: Element = builder.close()
    return root, lines


# --- reading values --------------------------------------------------------------------------


class _Reader:
    """Typed access to child elements, with errors that name the element path."""

    def __init__(self, source: str, lines: Mapping[Element, int]) -> None:
        self.source = source
        self.lines = lines

    def error(self, element: Element, path: str, message: str) -> ParseError:
        return ParseError(f"{path}: {message}", self.source, self.lines.get(element))

    def text(self, parent: Element, child: str) -> tuple[str | None, Element]:
        element = parent.find(child)
        if element is None:
            return None, parent
        value = (element.text or "").strip()
        return (None if value in ("", "N/A") else value), element

    def required(self, parent: Element, path: str, child: str) -> str:
        value, element = self.text(parent, child)
        if value is None:
            raise self.error(element, f"{path}/{child}", "missing or N/A")
        return value

    def integer(self, parent: Element, path: str, child: str) -> int | None:
        value, element = self.text(parent, child)
        if value is None:
            return None
        if not value.isdigit():
            raise self.error(element, f"{path}/{child}", f"{value!r} is not a whole number")
        return int(value)

    def boolean(self, parent: Element, path: str, child: str) -> bool | None:
        value, element = self.text(parent, child)
        if value is None:
            return None
        if value not in _BOOLEAN:
            raise self.error(
                element, f"{path}/{child}", f"{value!r} is not Enabled/Disabled/Yes/No"
            )
        return _BOOLEAN[value]

    def memory(self, parent: Element, path: str, child: str) -> int | None:
        value, element = self.text(parent, child)
        if value is None:
            return None
        match = _MEMORY.match(value)
        if match is None or match[2] not in _UNITS:
            raise self.error(
                element, f"{path}/{child}", f"{value!r} is not a size like '40960 MiB'"
            )
        return int(match[1]) * _UNITS[match[2]]


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


# --- the document ----------------------------------------------------------------------------


def parse_nvidia_smi_xml(
    text: str,
    node: str,
    source: str,
    timestamp: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> NodeReport:
    """Build a NodeReport from `nvidia-smi -q -x` output.

    `timestamp` (RFC 3339) defaults to the XML's own, which nvidia-smi prints in local time
    without a zone (`2023-01-27T11:32:31`). Raises ParseError.
    """
    root, lines = parse_xml_safely(text, source)
    reader = _Reader(source, lines)
    if root.tag != _ROOT:
        raise reader.error(root, root.tag, f"root element is <{root.tag}>, expected <{_ROOT}>")
    gpus = tuple(
        _gpu(reader, element, index, f"gpu[{index}]")
        for index, element in enumerate(root.findall("gpu"))
    )
    return NodeReport(
        node=node,
        timestamp=timestamp or _timestamp(reader, root),
        source=ReportSource.NVIDIA_SMI_XML,
        gpus=gpus,
        driver_version=reader.text(root, "driver_version")[0],
        cuda_driver_version=reader.text(root, "cuda_version")[0],
        labels=dict(labels or {}),
    )


def _timestamp(reader: _Reader, root: Element) -> str:
    value, element = reader.text(root, "timestamp")
    if value is None:
        raise reader.error(element, "timestamp", "missing; pass the report's time")
    try:
        return datetime.strptime(value, "%a %b %d %H:%M:%S %Y").isoformat()
    except ValueError:
        message = f"{value!r} is not like 'Fri Jan 27 11:32:31 2023'"
    raise reader.error(element, "timestamp", message)


def _gpu(reader: _Reader, element: Element, index: int, path: str) -> Gpu:
    bus_id_text, bus_id_element = reader.text(element, "pci/pci_bus_id")
    bus_id_text = bus_id_text or element.get("id")
    if bus_id_text is None:
        raise reader.error(element, f"{path}/pci/pci_bus_id", "missing or N/A")
    try:
        pci_bus_id = normalize_pci_bus_id(bus_id_text)
    except ValueError as error:
        raise reader.error(bus_id_element, f"{path}/pci/pci_bus_id", str(error)) from None
    device_id = reader.text(element, "pci/pci_device_id")[0]
    pci_device_id = None if device_id is None else "0x" + device_id.upper().removeprefix("0X")
    brand = reader.text(element, "product_brand")[0]
    return Gpu(
        index=index,
        uuid=reader.required(element, path, "uuid"),
        product_name=reader.required(element, path, "product_name"),
        pci_bus_id=pci_bus_id,
        minor=reader.integer(element, path, "minor_number"),
        brand=brand_from_smi(brand) if brand is not None else None,
        architecture=reader.text(element, "product_architecture")[0],
        pci_device_id=pci_device_id,
        memory_bytes=reader.memory(element, path, "fb_memory_usage/total"),
        addressing_mode=reader.text(element, "addressing_mode")[0],
        mig_mode=MigMode(
            reader.boolean(element, path, "mig_mode/current_mig"),
            reader.boolean(element, path, "mig_mode/pending_mig"),
        ),
        mig_devices=_mig_devices(reader, element, path, pci_device_id),
        health=_health(reader, element, path),
    )


def _mig_devices(
    reader: _Reader, gpu: Element, path: str, pci_device_id: str | None
) -> tuple[MigDevice, ...]:
    table = KNOWN_PROFILE_TABLES.get(pci_device_id or "", ())
    devices = []
    for i, element in enumerate(gpu.findall("mig_devices/mig_device")):
        mig_path = f"{path}/mig_devices/mig_device[{i}]"
        shared = f"{mig_path}/device_attributes/shared"
        attrs = element.find("device_attributes/shared")
        attrs = attrs if attrs is not None else Element("shared")
        gi = reader.integer(element, mig_path, "gpu_instance_id")
        ci = reader.integer(element, mig_path, "compute_instance_id")
        if gi is None or ci is None:
            missing = "gpu_instance_id" if gi is None else "compute_instance_id"
            raise reader.error(element, f"{mig_path}/{missing}", "missing or N/A")
        device = MigDevice(
            gpu_instance_id=gi,
            compute_instance_id=ci,
            index=reader.integer(element, mig_path, "index"),
            memory_bytes=reader.memory(element, mig_path, "fb_memory_usage/total"),
            multiprocessors=reader.integer(attrs, shared, "multiprocessor_count"),
            copy_engines=reader.integer(attrs, shared, "copy_engine_count"),
            decoders=reader.integer(attrs, shared, "decoder_count"),
            encoders=reader.integer(attrs, shared, "encoder_count"),
            jpeg_engines=reader.integer(attrs, shared, "jpg_count"),
            ofa_engines=reader.integer(attrs, shared, "ofa_count"),
        )
        profile = identify_profile(table, device)
        if profile is not None:
            device = replace(device, profile=profile.name, profile_id=profile.id)
        devices.append(device)
    return tuple(devices)


def _health(reader: _Reader, gpu: Element, path: str) -> GpuHealth:
    return GpuHealth(
        ecc_enabled=reader.boolean(gpu, path, "ecc_mode/current_ecc"),
        ecc=EccCounts(
            volatile_correctable=_ecc(reader, gpu, path, "volatile", correctable=True),
            volatile_uncorrectable=_ecc(reader, gpu, path, "volatile", correctable=False),
            aggregate_correctable=_ecc(reader, gpu, path, "aggregate", correctable=True),
            aggregate_uncorrectable=_ecc(reader, gpu, path, "aggregate", correctable=False),
        ),
        retired_pages=_retired_pages(reader, gpu, path),
        remapped_rows=_remapped_rows(reader, gpu, path),
    )


_CORRECTABLE = ("sram_correctable", "dram_correctable", "single_bit/total")
_UNCORRECTABLE = (
    "sram_uncorrectable",
    "sram_uncorrectable_parity",
    "sram_uncorrectable_secded",
    "dram_uncorrectable",
    "double_bit/total",
)


def _ecc(reader: _Reader, gpu: Element, path: str, kind: str, correctable: bool) -> int | None:
    base = f"{path}/ecc_errors/{kind}"
    element = gpu.find(f"ecc_errors/{kind}")
    if element is None:
        return None
    names = _CORRECTABLE if correctable else _UNCORRECTABLE
    return _sum([reader.integer(element, base, name) for name in names])


def _retired_pages(reader: _Reader, gpu: Element, path: str) -> RetiredPages | None:
    element = gpu.find("retired_pages")
    if element is None:
        return None
    base = f"{path}/retired_pages"
    pages = RetiredPages(
        single_bit=reader.integer(element, base, "multiple_single_bit_retirement/retired_count"),
        double_bit=reader.integer(element, base, "double_bit_retirement/retired_count"),
        pending=reader.boolean(element, base, "pending_retirement"),
    )
    return None if pages == RetiredPages() else pages


def _remapped_rows(reader: _Reader, gpu: Element, path: str) -> RemappedRows | None:
    element = gpu.find("remapped_rows")
    if element is None or len(element) == 0:
        return None  # `<remapped_rows>N/A</remapped_rows>` before Ampere
    base = f"{path}/remapped_rows"
    values = (
        reader.integer(element, base, "remapped_row_corr"),
        reader.integer(element, base, "remapped_row_unc"),
        reader.boolean(element, base, "remapped_row_pending"),
        reader.boolean(element, base, "remapped_row_failure"),
    )
    if any(v is None for v in values):
        return None
    corr, unc, pending, failure = values
    return RemappedRows(int(corr or 0), int(unc or 0), bool(pending), bool(failure))
