"""`nvidia-smi topo -m` text -> TopologyMatrix.

The header names the device columns (`GPU0..`, `NIC0..`, or `mlx5_0..` on older drivers) and then
`CPU Affinity`, `NUMA Affinity` and, on newer drivers, `GPU NUMA ID`. nvidia-smi separates cells
with tabs, copies in docs often with spaces; both work, because the two-word headers are joined
before splitting on whitespace. ANSI escapes (a TTY underlines the header) are stripped. NIC rows
leave their affinity cells empty. The matrix ends at the first blank line or `Legend:`; after it
only the `NIC Legend` (`NIC0: mlx5_0`) is read. Errors are ParseError with the source and line.
"""

from __future__ import annotations

import re

from services.common.errors import ParseError
from services.inventory.core.report import CpuRange, GpuLink, parse_cpu_list
from services.inventory.core.topology import TopologyMatrix, TopologyRow

__all__ = ["parse_topo_matrix"]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_AFFINITY = {"CPU Affinity": "CPU_Affinity", "NUMA Affinity": "NUMA_Affinity"}
_AFFINITY["GPU NUMA ID"] = "GPU_NUMA_ID"
_DEVICE_LABEL = re.compile(r"^(?:GPU\d+|NIC\d+|[A-Za-z][\w.-]*)$")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


def parse_topo_matrix(text: str, source: str) -> TopologyMatrix:
    """Parse the matrix; raises ParseError (with line) on anything it cannot read."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    start = next((i for i, line in enumerate(lines) if line.strip()), None)
    if start is None:
        raise ParseError("empty topology: expected the `nvidia-smi topo -m` matrix", source)
    header = _header(lines[start], source, start + 1)
    devices = tuple(c for c in header if c not in _AFFINITY.values())
    rows = []
    end = len(lines)
    for number in range(start + 1, len(lines)):
        line = lines[number]
        if not line.strip() or line.strip().startswith("Legend"):
            end = number
            break
        rows.append(_row(line, header, devices, source, number + 1))
    if not rows:
        raise ParseError("the matrix has a header but no rows", source, start + 1)
    nic_names = {}
    for line in lines[end:]:
        match = _NIC_LEGEND.match(line)
        if match is not None:
            nic_names[match[1]] = match[2]
    return TopologyMatrix(devices, tuple(rows), nic_names)


def _header(line: str, source: str, number: int) -> tuple[str, ...]:
    joined = line
    for words, token in _AFFINITY.items():
        joined = joined.replace(words, token)
    columns = tuple(joined.split())
    devices = [c for c in columns if c not in _AFFINITY.values()]
    if not devices or not columns[0].startswith("GPU"):
        raise ParseError(
            f"header {line.strip()!r} does not start with GPU0: not `nvidia-smi topo -m` output",
            source,
            number,
        )
    for column in devices:
        if not _DEVICE_LABEL.match(column):
            raise ParseError(f"header column {column!r} is not a device name", source, number)
    if columns[: len(devices)] != tuple(devices):
        raise ParseError("affinity columns must follow the device columns", source, number)
    if len(set(columns)) != len(columns):
        raise ParseError("header repeats a column", source, number)
    return columns


def _row(
    line: str, header: tuple[str, ...], devices: tuple[str, ...], source: str, number: int
) -> TopologyRow:
    label, *cells = line.split()
    if label not in devices:
        raise ParseError(f"row {label} has no column in the header", source, number)
    if len(cells) < len(devices) or len(cells) > len(header):
        raise ParseError(
            f"row {label} has {len(cells)} cells; expected {len(devices)} device cells"
            f" and at most {len(header) - len(devices)} affinity cells",
            source,
            number,
        )
    links = tuple(
        _cell(label, column, cell, source, number)
        for column, cell in zip(devices, cells, strict=False)
    )
    extra = dict(zip(header[len(devices) :], cells[len(devices) :], strict=False))
    try:
        return TopologyRow(
            label=label,
            cells=links,
            cpu_affinity=parse_cpu_list(extra.get("CPU_Affinity", "")),
            numa_affinity=parse_cpu_list(extra.get("NUMA_Affinity", "")),
            gpu_numa_id=_numa_id(extra.get("GPU_NUMA_ID", "N/A")),
        )
    except ValueError as error:
        raise ParseError(f"row {label}: {error}", source, number) from None


def _cell(row: str, column: str, cell: str, source: str, number: int) -> GpuLink | None:
    if cell == "N/A":
        return None
    try:
        return GpuLink.parse(cell)
    except ValueError as error:
        raise ParseError(f"row {row}, column {column}: {error}", source, number) from None


def _numa_id(text: str) -> int | None:
    if text == "N/A":
        return None
    ranges: tuple[CpuRange, ...] = parse_cpu_list(text)
    if len(ranges) != 1 or ranges[0].first != ranges[0].last:
        raise ValueError(f"GPU NUMA ID {text!r} is not one number")
    return ranges[0].first
