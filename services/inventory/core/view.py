"""One node's effective view: applied ResourceSlices joined with the node's latest NVML report.

Merge rules (docs/inventory.md):

- A reported GPU is joined to DRA devices by UUID (`uuid`, or `parentUUID` for MIG devices), else
  by normalised PCI bus id (`resource.kubernetes.io/pciBusID`, or `pcieBusID` / `pciBusID` of
  older NVIDIA drivers). Only slices of a pool's newest generation take part.
- The GPU's health taints (core/health.py) are merged into every joined device: a taint with the
  same key replaces the published one; at most MAX_TAINTS_PER_DEVICE stay (published first, then
  NoExecute before NoSchedule) and a warning says what was dropped.
- GPUs no device covers become slices of the pool `<node>-nvml` (core/merge.py); while the
  node's report is stale those devices carry `gpualloc.io/unreachable` (NoSchedule).

`NodeView` is immutable and built once per change of the node; readers (GetInventory, watches)
share it. Its `memo` dict lets adapters keep an encoding of the view next to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from services.common.dra.model import (
    CounterSet,
    Device,
    DeviceID,
    DeviceTaint,
    Node,
    ResourceSlice,
    TaintEffect,
)
from services.common.dra.validate import MAX_TAINTS_PER_DEVICE
from services.inventory.core.health import taints_from_health
from services.inventory.core.merge import slices_from_report
from services.inventory.core.pools import PoolStatus, pool_status
from services.inventory.core.report import Gpu, NodeReport, normalize_pci_bus_id
from services.inventory.core.topology_view import NodeTopology, node_topology

__all__ = [
    "NVML_POOL_SUFFIX",
    "PCI_BUS_ID_ATTRIBUTES",
    "UNREACHABLE_TAINT_KEY",
    "DeviceSource",
    "NodeView",
    "ReportRecord",
    "ViewCounterSet",
    "ViewDevice",
    "build_view",
    "merge_taints",
]

UNREACHABLE_TAINT_KEY = "gpualloc.io/unreachable"
UNREACHABLE_EFFECT = TaintEffect.NO_SCHEDULE
NVML_POOL_SUFFIX = "-nvml"
PCI_BUS_ID_ATTRIBUTES = ("resource.kubernetes.io/pciBusID", "pcieBusID", "pciBusID")


class DeviceSource(StrEnum):
    RESOURCE_SLICE = "resource-slice"
    NODE_REPORT = "node-report"


@dataclass(frozen=True)
class ReportRecord:
    """A node's latest report (with any `topo -m` matrix already folded in), when the inventory
    last heard from the node (`observed_at`, seconds since the epoch on the service's clock),
    the generation of its synthesized pool, and since when (RFC 3339) the report is stale."""

    report: NodeReport
    observed_at: float
    pool_generation: int = 1
    stale_since: str | None = None

    @property
    def stale(self) -> bool:
        return self.stale_since is not None


@dataclass(frozen=True)
class ViewDevice:
    id: DeviceID
    device: Device
    pool_generation: int
    source: DeviceSource
    gpu_uuid: str | None


@dataclass(frozen=True)
class ViewCounterSet:
    driver: str
    pool: str
    counter_set: CounterSet


@dataclass(frozen=True)
class NodeView:
    """What the inventory publishes for one node key (CLUSTER_SCOPE "" included)."""

    name: str
    node: Node
    slices: tuple[ResourceSlice, ...]  # effective: applied (health merged) + synthesized
    pools: tuple[PoolStatus, ...]
    devices: tuple[ViewDevice, ...]  # of each pool's newest generation
    counter_sets: tuple[ViewCounterSet, ...]
    topology: NodeTopology | None = None
    reported_at: str | None = None
    matched: tuple[DeviceID, ...] = ()
    synthesized: tuple[DeviceID, ...] = ()
    taints: tuple[tuple[DeviceID, tuple[DeviceTaint, ...]], ...] = ()  # added by the inventory
    warnings: tuple[str, ...] = ()
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    topology_inputs: tuple[object, ...] | None = field(default=None, compare=False, repr=False)


# --- taints ----------------------------------------------------------------------------------


def merge_taints(
    published: tuple[DeviceTaint, ...], added: Iterable[DeviceTaint]
) -> tuple[tuple[DeviceTaint, ...], tuple[DeviceTaint, ...]]:
    """(kept, dropped): `added` replaces published taints of the same key; the API allows
    MAX_TAINTS_PER_DEVICE, so the rest is dropped (published first, then NoExecute first)."""
    extra = sorted(added, key=lambda t: t.effect is not TaintEffect.NO_EXECUTE)
    keys = {t.key for t in extra}
    merged = [t for t in published if t.key not in keys] + extra
    return tuple(merged[:MAX_TAINTS_PER_DEVICE]), tuple(merged[MAX_TAINTS_PER_DEVICE:])


# --- join ------------------------------------------------------------------------------------


def _attribute(device: Device, driver: str, name: str) -> str | None:
    value = device.attributes.get(name) or device.attributes.get(f"{driver}/{name}")
    return value.value if value is not None and isinstance(value.value, str) else None


def _pci_bus_id(device: Device, driver: str) -> str | None:
    for name in PCI_BUS_ID_ATTRIBUTES:
        text = _attribute(device, driver, name)
        if text is not None:
            try:
                return normalize_pci_bus_id(text)
            except ValueError:
                return None
    return None


@dataclass
class _Join:
    """Index of a report's GPUs, and what the join found."""

    report: NodeReport
    by_uuid: dict[str, Gpu] = field(init=False)
    by_pci: dict[str, Gpu] = field(init=False)
    health: dict[str, tuple[DeviceTaint, ...]] = field(init=False)
    covered: set[str] = field(default_factory=set)
    matched: list[DeviceID] = field(default_factory=list)
    full: dict[str, DeviceID] = field(default_factory=dict)
    parts: dict[str, list[DeviceID]] = field(default_factory=dict)
    taints: dict[DeviceID, tuple[DeviceTaint, ...]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.by_uuid = {g.uuid: g for g in self.report.gpus}
        self.by_pci = {g.pci_bus_id: g for g in self.report.gpus}
        self.health = {
            g.uuid: taints_from_health(g, self.report.timestamp) for g in self.report.gpus
        }

    def gpu_of(self, driver: str, device: Device, device_id: DeviceID) -> Gpu | None:
        uuid = _attribute(device, driver, "uuid")
        if uuid is not None and uuid in self.by_uuid:
            return self.by_uuid[uuid]
        parent = _attribute(device, driver, "parentUUID")
        if parent is not None and parent in self.by_uuid:
            return self.by_uuid[parent]
        pci = _pci_bus_id(device, driver)
        gpu = self.by_pci.get(pci) if pci is not None else None
        if gpu is not None and uuid is not None and uuid.startswith("GPU-"):
            self.warnings.append(
                f"device {device_id}: joined to {gpu.uuid} by PCI bus id {pci}, "
                f"but the slice says uuid {uuid}"
            )
        return gpu

    def device(self, driver: str, pool: str, device: Device) -> Device:
        """The device with the joined GPU's health merged in (the same object when no GPU)."""
        device_id = DeviceID(driver, pool, device.name)
        gpu = self.gpu_of(driver, device, device_id)
        if gpu is None:
            return device
        self.covered.add(gpu.uuid)
        self.matched.append(device_id)
        mig = _attribute(device, driver, "type") == "mig" or _attribute(
            device, driver, "parentUUID"
        )
        if mig:
            self.parts.setdefault(gpu.uuid, []).append(device_id)
        else:
            self.full.setdefault(gpu.uuid, device_id)
        health = self.health[gpu.uuid]
        if not health:
            return device
        return self.with_taints(device_id, device, health)

    def with_taints(
        self, device_id: DeviceID, device: Device, added: tuple[DeviceTaint, ...]
    ) -> Device:
        kept, dropped = merge_taints(device.taints, added)
        self.taints[device_id] = tuple(t for t in kept if t in added)
        if dropped:
            shown = ", ".join(f"{t.key}={t.value}:{t.effect.value}" for t in dropped)
            self.warnings.append(f"device {device_id}: at most 4 taints, dropped {shown}")
        return replace(device, taints=kept)


# --- the view --------------------------------------------------------------------------------


def build_view(
    name: str,
    slices: Mapping[str, ResourceSlice],
    node: Node | None,
    record: ReportRecord | None,
    before: NodeView | None = None,
) -> NodeView:
    """The effective view of node `name` from its applied slices, Node object and report.
    `before` (the node's previous view) only saves work: unchanged parts are reused."""
    applied = [slices[key] for key in sorted(slices)]
    labels = dict(record.report.labels) if record is not None else {}
    labels |= node.labels if node is not None else {}
    effective_node = Node(name, labels)
    if record is None:
        devices, counter_sets, pools = _assemble(applied, set(), before)
        return NodeView(name, effective_node, tuple(applied), pools, devices, counter_sets)
    join = _Join(record.report)
    newest = {(p.driver, p.pool): p.generation for p in pool_status(applied)}
    joined = [_join_slice(join, s, newest) for s in applied]
    synthesized = _synthesize(join, record, name, {s.name for s in applied})
    ordered = tuple(sorted(joined + synthesized, key=lambda s: s.name))
    devices, counter_sets, pools = _assemble(ordered, {s.name for s in synthesized}, before)
    synthesized_ids = tuple(d.id for d in devices if d.source is DeviceSource.NODE_REPORT)
    full, parts = _topology_ids(devices, join)
    inputs = _topology_inputs(record.report, full, parts)
    if before is not None and before.topology_inputs == inputs:
        topology = before.topology
    else:
        topology = node_topology(record.report, full, parts)
    return NodeView(
        name,
        effective_node,
        ordered,
        pools,
        devices,
        counter_sets,
        topology=topology,
        reported_at=record.report.timestamp,
        matched=tuple(sorted(join.matched)),
        synthesized=synthesized_ids,
        taints=tuple(sorted(join.taints.items())),
        warnings=tuple(sorted(join.warnings)),
        topology_inputs=inputs,
    )


def _topology_inputs(
    report: NodeReport, full: Mapping[str, DeviceID], parts: Mapping[str, list[DeviceID]]
) -> tuple[object, ...]:
    """Everything node_topology reads: equal inputs, equal topology."""
    gpus = tuple(
        (g.index, g.uuid, g.pci_bus_id, g.pcie_root, g.numa_node, g.cpu_affinity, g.nvlink_peers)
        for g in report.gpus
    )
    devices = (tuple(sorted(full.items())), tuple(sorted((k, tuple(v)) for k, v in parts.items())))
    return (gpus, report.gpu_links, report.nics, devices)


def _join_slice(
    join: _Join, resource_slice: ResourceSlice, newest: Mapping[tuple[str, str], int]
) -> ResourceSlice:
    driver, pool = resource_slice.driver, resource_slice.pool.name
    if newest.get((driver, pool)) != resource_slice.pool.generation:
        return resource_slice
    devices = tuple(join.device(driver, pool, d) for d in resource_slice.devices)
    if all(a is b for a, b in zip(devices, resource_slice.devices, strict=True)):
        return resource_slice
    return replace(resource_slice, devices=devices)


def _synthesize(
    join: _Join, record: ReportRecord, name: str, applied_names: set[str]
) -> list[ResourceSlice]:
    uncovered = tuple(g for g in record.report.gpus if g.uuid not in join.covered)
    if not uncovered:
        return []
    report = replace(record.report, node=name, gpus=uncovered)
    pool = name + NVML_POOL_SUFFIX
    made = []
    for resource_slice in slices_from_report(report, record.pool_generation, pool=pool):
        if resource_slice.name in applied_names:
            join.warnings.append(
                f"slice {resource_slice.name}: an applied slice has this name; "
                "the GPUs it would describe are left out"
            )
            continue
        if record.stale_since is not None:
            resource_slice = _unreachable(join, resource_slice, record.stale_since)
        for device in resource_slice.devices:
            if device.taints:
                device_id = DeviceID(resource_slice.driver, pool, device.name)
                join.taints[device_id] = device.taints
        made.append(resource_slice)
    return made


def _unreachable(join: _Join, resource_slice: ResourceSlice, since: str) -> ResourceSlice:
    taint = DeviceTaint(UNREACHABLE_TAINT_KEY, UNREACHABLE_EFFECT, "report-stale", since)
    pool = resource_slice.pool.name
    devices = tuple(
        join.with_taints(DeviceID(resource_slice.driver, pool, d.name), d, (taint,))
        for d in resource_slice.devices
    )
    return replace(resource_slice, devices=devices)


def _topology_ids(
    devices: tuple[ViewDevice, ...], join: _Join
) -> tuple[dict[str, DeviceID], dict[str, list[DeviceID]]]:
    """GPU UUID -> its full-GPU device and its partitions (joined and synthesized)."""
    full = dict(join.full)
    parts = {k: list(v) for k, v in join.parts.items()}
    for device in devices:
        if device.source is not DeviceSource.NODE_REPORT or device.gpu_uuid is None:
            continue
        if _attribute(device.device, device.id.driver, "type") == "gpu":
            full.setdefault(device.gpu_uuid, device.id)
        else:
            parts.setdefault(device.gpu_uuid, []).append(device.id)
    return full, parts


def _assemble(
    ordered: Sequence[ResourceSlice], synthesized_names: set[str], before: NodeView | None
) -> tuple[tuple[ViewDevice, ...], tuple[ViewCounterSet, ...], tuple[PoolStatus, ...]]:
    """The devices and counter sets of each pool's newest generation, and the pools. A device
    that did not change keeps its ViewDevice from `before`."""
    pools = pool_status(ordered)
    newest = {(p.driver, p.pool): p.generation for p in pools}
    reuse = {id(d.device): d for d in before.devices} if before is not None else {}
    devices: list[ViewDevice] = []
    counter_sets: list[ViewCounterSet] = []
    for resource_slice in ordered:
        driver, pool = resource_slice.driver, resource_slice.pool.name
        generation = resource_slice.pool.generation
        if newest[(driver, pool)] != generation:
            continue  # an older generation: the allocator ignores it, so does the view
        source = (
            DeviceSource.NODE_REPORT
            if resource_slice.name in synthesized_names
            else DeviceSource.RESOURCE_SLICE
        )
        for device in resource_slice.devices:
            old = reuse.get(id(device))
            if (
                old is not None
                and old.device is device
                and (old.id.driver, old.id.pool, old.pool_generation, old.source)
                == (driver, pool, generation, source)
            ):
                devices.append(old)
                continue
            uuid = _attribute(device, driver, "parentUUID") or _attribute(device, driver, "uuid")
            devices.append(
                ViewDevice(DeviceID(driver, pool, device.name), device, generation, source, uuid)
            )
        counter_sets.extend(ViewCounterSet(driver, pool, c) for c in resource_slice.shared_counters)
    devices.sort(key=lambda d: d.id)
    counter_sets.sort(key=lambda c: (c.driver, c.pool, c.counter_set.name))
    return tuple(devices), tuple(counter_sets), pools
