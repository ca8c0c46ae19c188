"""What `gpualloc inventory -f` and `gpualloc apply -f` read: files recognised by their content.

- `nvidia-smi -q -x` XML (contains `<nvidia_smi_log`): a report of the node named by `--node`;
- `nvidia-smi topo -m` text (first line starts with `GPU0`, terminal escapes allowed): folded
  into the report of the `--node` node (from XML or JSON in the same invocation), else into a
  topology-only report of the GPUs that node's ResourceSlices publish;
- agent JSON (`{"kind": "NodeReport", "apiVersion": "gpualloc.io/v1", ...}`, `gpualloc-agent
  --stdout`): a report of the node it names;
- anything else is YAML or JSON Kubernetes objects: ResourceSlices and Nodes.

A directory contributes its `.yaml .yml .json .xml .txt` files (recursively, sorted); `-` is
stdin. Errors are InvalidArgument/ParseError naming the file (and line or field).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from services.common.dra.limits import DocumentLimits, checked_json_loads
from services.common.dra.model import Device, DeviceClass, Node, ResourceSlice
from services.common.dra.parse import load_located_objects, read_stdin, read_text
from services.common.errors import FieldViolation, InvalidArgument
from services.common.manifests import refuse_second_stdin
from services.inventory.adapters.sources.nvidia_smi_xml import parse_nvidia_smi_xml
from services.inventory.adapters.sources.report_json import KIND, from_json
from services.inventory.adapters.sources.topo_matrix import parse_topo_matrix
from services.inventory.core.checks import check_report
from services.inventory.core.report import Gpu, NodeReport, ReportSource, normalize_pci_bus_id
from services.inventory.core.topology import TopologyMatrix, apply_topology
from services.inventory.core.view import PCI_BUS_ID_ATTRIBUTES

__all__ = [
    "INPUT_SUFFIXES",
    "Inputs",
    "SliceLookup",
    "expand_inputs",
    "read_inputs",
    "report_from_slices",
]

INPUT_SUFFIXES = (".yaml", ".yml", ".json", ".xml", ".txt")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU_NAME = re.compile(r"^gpu-(\d+)$")
_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"


@dataclass
class Inputs:
    slices: list[ResourceSlice] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    reports: list[NodeReport] = field(default_factory=list)  # topology matrices folded in


def expand_inputs(paths: Iterable[str]) -> Iterator[str]:
    """Each argument as files: `-` stays `-` (once), a directory becomes its input files."""
    stdin_seen = False
    for raw in paths:
        path = Path(raw)
        if raw == "-":
            stdin_seen = refuse_second_stdin(stdin_seen)
            yield raw
        elif path.is_file():
            yield raw
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix in INPUT_SUFFIXES and p.is_file())
            if not found:
                raise InvalidArgument(f"{raw}: directory holds no {', '.join(INPUT_SUFFIXES)}")
            yield from (str(p) for p in found)
        else:
            raise InvalidArgument(f"{raw}: no such file or directory")


SliceLookup = Callable[[str], Sequence[ResourceSlice]]


def read_inputs(
    paths: Iterable[str],
    node: str | None = None,
    stdin: TextIO | None = None,
    lookup: SliceLookup | None = None,
    limits: DocumentLimits | None = None,
    *,
    strict: bool = True,
) -> Inputs:
    """Read and recognise every input; one report per node. XML and `topo -m` inputs belong to
    `node`; without it, to the node their file is named after (`h100-node-1.topo.txt`) when
    the other inputs (or `lookup`, a running inventory's slices of a node) know that node.
    Every file is bounded by `limits` (dra/limits.py); `strict=False` ignores fields the 1.34
    API lacks (`--validate ignore`)."""
    limits = limits or DocumentLimits()
    inputs = Inputs()
    nvml: list[tuple[str, str, str]] = []  # (kind, source, text) of node-less inputs
    sources: dict[str, str] = {}  # node -> the file its report came from
    for path in expand_inputs(paths):
        source = "<stdin>" if path == "-" else path
        text = read_stdin(stdin or sys.stdin, limits) if path == "-" else read_text(path, limits)
        kind, report = _kind(text, source, limits)
        if kind in ("xml", "topo"):
            nvml.append((kind, source, text))
        elif report is not None:
            _add_report(inputs, sources, _json_report(report, source, node), source)
        else:
            _add_objects(inputs, text, source, limits, strict)
    known = {s.node_name for s in inputs.slices} | {n.name for n in inputs.nodes} | set(sources)
    matrices: list[tuple[str, str, TopologyMatrix]] = []
    for kind, source, text in nvml:
        owner = node or _named_after(source, known, lookup)
        if kind == "xml":
            owner = _need_node(owner, source, "nvidia-smi XML")
            _add_report(inputs, sources, parse_nvidia_smi_xml(text, owner, source), source)
        else:
            owner = _need_node(owner, source, "nvidia-smi topo -m output")
            matrices.append((owner, source, parse_topo_matrix(text, source)))
    for owner, source, matrix in matrices:
        _fold(inputs, matrix, owner, source, lookup)
    return inputs


def _named_after(source: str, known: set[str | None], lookup: SliceLookup | None) -> str | None:
    stem = Path(source).name.split(".")[0]
    if stem in known or (lookup is not None and lookup(stem)):
        return stem
    return None


def _kind(text: str, source: str, limits: DocumentLimits) -> tuple[str, object]:
    """The input's kind, and for an agent report its decoded JSON (decoded once, bounded)."""
    if "<nvidia_smi_log" in text:
        return "xml", None
    first = next((line for line in text.splitlines() if line.strip()), "")
    if _ANSI.sub("", first).strip().startswith("GPU0"):
        return "topo", None
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            data = checked_json_loads(stripped, source, limits)
        except json.JSONDecodeError:
            return "objects", None  # the manifest parser reports where the JSON breaks
        if isinstance(data, dict) and data.get("kind") == KIND:
            return "report", data
    return "objects", None


def _need_node(node: str | None, source: str, what: str) -> str:
    if not node:
        raise InvalidArgument.at(
            "--node",
            f"{source}: {what} does not name its node; pass --node (or name the file after "
            "a node of the other inputs)",
        )
    return node


def _json_report(data: object, source: str, node: str | None) -> NodeReport:
    if isinstance(data, dict) and not data.get("node") and node:
        data["node"] = node
    try:
        return from_json(data)
    except InvalidArgument as error:
        raise InvalidArgument(f"{source}: {error.message}", error.violations) from None


def _add_report(inputs: Inputs, sources: dict[str, str], report: NodeReport, source: str) -> None:
    if report.node in sources:
        raise InvalidArgument.at(
            source, f"a second report for node {report.node!r} (first in {sources[report.node]})"
        )
    check_report(report, path=f"{source}: report")
    sources[report.node] = source
    inputs.reports.append(report)


def _add_objects(
    inputs: Inputs, text: str, source: str, limits: DocumentLimits, strict: bool
) -> None:
    for obj, where in load_located_objects(text, source, limits, strict=strict):
        if isinstance(obj, ResourceSlice):
            inputs.slices.append(obj)
        elif isinstance(obj, Node):
            inputs.nodes.append(obj)
        else:
            detail = f"the inventory holds ResourceSlices and Nodes, not a {type(obj).__name__}"
            if isinstance(obj, DeviceClass):
                detail += " (DeviceClasses are the allocator's: GPUALLOC_DEVICE_CLASSES)"
            raise where.fail([FieldViolation("kind", detail)])


def _fold(
    inputs: Inputs, matrix: TopologyMatrix, node: str, source: str, lookup: SliceLookup | None
) -> None:
    """Fold the matrix into the node's report; without one, into a report of the GPUs the
    node's slices publish (device `gpu-<n>` is `GPU<n>` of the matrix: the NVIDIA DRA driver
    names GPUs by minor number, which equals the NVML index on the systems we know)."""
    index = next((i for i, r in enumerate(inputs.reports) if r.node == node), None)
    if index is None:
        report = report_from_slices(node, inputs.slices, _now())
        if not report.gpus and lookup is not None:
            report = report_from_slices(node, lookup(node), _now())
        if not report.gpus:
            raise InvalidArgument.at(
                source,
                f"topology of node {node!r} needs that node's ResourceSlices, nvidia-smi XML "
                "or agent report",
            )
        inputs.reports.append(report)
        index = len(inputs.reports) - 1
    try:
        inputs.reports[index] = apply_topology(inputs.reports[index], matrix)
    except InvalidArgument as error:
        raise InvalidArgument(f"{source}: {error.message}", error.violations) from None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def report_from_slices(node: str, slices: Iterable[ResourceSlice], timestamp: str) -> NodeReport:
    """A topology-only report of the whole GPUs (`type: gpu`, named `gpu-<n>`, with a uuid and
    a PCI bus id) that the node's slices publish, to hang a `topo -m` matrix on."""
    gpus = []
    for resource_slice in slices:
        if resource_slice.node_name != node:
            continue
        for device in resource_slice.devices:
            gpu = _gpu_of_device(device)
            if gpu is not None:
                gpus.append(gpu)
    gpus.sort(key=lambda g: g.index)
    # ReportSource has no "topology only" value yet; NVML is where `topo -m` reads it from.
    return NodeReport(node, timestamp, ReportSource.NVML, tuple(gpus))


def _gpu_of_device(device: Device) -> Gpu | None:
    def text(name: str) -> str | None:
        value = device.attributes.get(name)
        return value.value if value is not None and isinstance(value.value, str) else None

    match = _GPU_NAME.match(device.name)
    uuid = text("uuid")
    pci = next((p for a in PCI_BUS_ID_ATTRIBUTES if (p := text(a)) is not None), None)
    if text("type") != "gpu" or match is None or uuid is None or pci is None:
        return None
    try:
        pci_bus_id = normalize_pci_bus_id(pci)
    except ValueError:
        return None
    minor = int(match[1])
    product = text("productName") or ""
    return Gpu(minor, uuid, product, pci_bus_id, minor=minor, pcie_root=text(_PCIE_ROOT))
