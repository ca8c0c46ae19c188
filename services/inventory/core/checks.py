"""Input checks the inventory adds on top of the DRA validation: request sizes, duplicates that
contradict each other, and the shape of a node report. Each raises InvalidArgument naming the
field, before anything is applied."""

from __future__ import annotations

from collections.abc import Sequence

from services.common.dra.model import Node, ResourceSlice
from services.common.dra.names import (
    dns1123_subdomain_errors,
    label_name_errors,
    label_value_errors,
)
from services.common.errors import FieldViolation, InvalidArgument
from services.inventory.core.report import NodeReport

__all__ = [
    "MAX_GPUS_PER_REPORT",
    "MAX_MIG_DEVICES_PER_GPU",
    "MAX_NICS_PER_REPORT",
    "MAX_OBJECTS_PER_APPLY",
    "check_apply",
    "check_report",
]

MAX_OBJECTS_PER_APPLY = 5000  # slices + nodes in one atomic apply
MAX_GPUS_PER_REPORT = 64
MAX_MIG_DEVICES_PER_GPU = 64
MAX_NICS_PER_REPORT = 64


def _too_many(path: str, count: int, limit: int, what: str) -> InvalidArgument:
    return InvalidArgument.at(path, f"at most {limit} {what} per request, got {count}")


def check_apply(
    slices: Sequence[ResourceSlice],
    nodes: Sequence[Node],
    max_objects: int | None = MAX_OBJECTS_PER_APPLY,
) -> None:
    """Size limit (None: no limit), and no name twice in one request (even with equal content:
    a request that names an object twice is a mistake somewhere upstream)."""
    if max_objects is not None and len(slices) + len(nodes) > max_objects:
        raise _too_many("slices", len(slices) + len(nodes), max_objects, "slices and nodes")
    _unique([s.name for s in slices], "slices", "metadata.name", "slice name")
    _unique([n.name for n in nodes], "nodes", "metadata.name", "node name")


def _unique(names: Sequence[str], path: str, field: str, what: str) -> None:
    seen: dict[str, int] = {}
    for index, name in enumerate(names):
        if name in seen:
            raise InvalidArgument.at(
                f"{path}[{index}].{field}", f"duplicate {what} {name!r} (also {path}[{seen[name]}])"
            )
        seen[name] = index


def check_report(report: NodeReport, path: str = "report") -> None:
    """A report must name a valid node, carry valid labels (they become the node's), stay within
    the size limits, and not list one GPU twice (UUID, PCI bus id or index)."""
    if not report.node:
        raise InvalidArgument.at(f"{path}.node_name", "required")
    if errors := dns1123_subdomain_errors(report.node):
        raise InvalidArgument.at(f"{path}.node_name", errors[0])
    if len(report.gpus) > MAX_GPUS_PER_REPORT:
        raise _too_many(f"{path}.gpus", len(report.gpus), MAX_GPUS_PER_REPORT, "GPUs")
    if len(report.nics) > MAX_NICS_PER_REPORT:
        raise _too_many(f"{path}.nics", len(report.nics), MAX_NICS_PER_REPORT, "NICs")
    violations: list[FieldViolation] = []
    for key, value in report.labels.items():
        problems = label_name_errors(key) + label_value_errors(value)
        violations.extend(FieldViolation(f'{path}.labels["{key}"]', p) for p in problems)
    seen: dict[tuple[str, object], int] = {}
    for i, gpu in enumerate(report.gpus):
        gpu_path = f"{path}.gpus[{i}]"
        if not gpu.uuid:
            violations.append(FieldViolation(f"{gpu_path}.uuid", "required"))
        if len(gpu.mig_devices) > MAX_MIG_DEVICES_PER_GPU:
            count = len(gpu.mig_devices)
            violations.append(
                FieldViolation(
                    f"{gpu_path}.mig_devices", f"at most {MAX_MIG_DEVICES_PER_GPU}, got {count}"
                )
            )
        for field, value in (("uuid", gpu.uuid), ("pci_bus_id", gpu.pci_bus_id)):
            first = seen.setdefault((field, value), i)
            if first != i and value:
                violations.append(
                    FieldViolation(
                        f"{gpu_path}.{field}", f"duplicate {value!r} (also {path}.gpus[{first}])"
                    )
                )
        first = seen.setdefault(("index", gpu.index), i)
        if first != i:
            violations.append(
                FieldViolation(f"{gpu_path}.index", f"duplicate index {gpu.index} (gpus[{first}])")
            )
    if violations:
        raise InvalidArgument("; ".join(str(v) for v in violations), violations)
