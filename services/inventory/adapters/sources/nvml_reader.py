"""Read a NodeReport from NVML through nvidia-ml-py (`import pynvml`).

Every function takes the pynvml module as a parameter, so nothing here imports it: the agent
imports it (or reports that it cannot), and a GPU machine runs the same code for real. Calls
follow shared/reference/nvml-fields.md. NVML errors that mean "this GPU does not have that"
(NotSupported, NotFound, InvalidArgument, FunctionNotFound, NoPermission) make a field None;
any other NVML error (GPU lost, driver gone) propagates.

NVLink peers: a link whose remote is a GPU names it by PCI bus id; on NVSwitch systems every
remote is a switch, so the GPU's active link count is given to each GPU it has NVLink P2P with
(what `topo -m` prints as NV18 on HGX H100).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from services.inventory.core.mig import mig_profile_name
from services.inventory.core.report import (
    CpuRange,
    EccCounts,
    Gpu,
    GpuHealth,
    GpuLink,
    GpuPair,
    MigDevice,
    MigMode,
    MigProfile,
    NodeReport,
    NvLinkPeer,
    Placement,
    RemappedRows,
    ReportSource,
    RetiredPages,
    TopologyLevel,
    XidEvent,
    normalize_pci_bus_id,
)

__all__ = ["XidWatcher", "read_node_report"]

# go-nvlib GetArchitectureAsString / GetBrandAsString, keyed by NVML enum value.
_ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere"}
_ARCHITECTURES |= {8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell"}
_BRANDS = {0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan"}
_BRANDS |= {7: "NvidiaVApps", 8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS"}
_BRANDS |= {11: "NvidiaCloudGaming", 12: "QuadroRTX", 13: "NvidiaRTX", 14: "Nvidia"}
_BRANDS |= {15: "GeForceRTX", 16: "TitanRTX"}
_ADDRESSING_MODES = {0: "None", 1: "HMM", 2: "ATS"}
# nvmlDeviceGetTopologyCommonAncestor level -> topo -m cell. INTERNAL (two GPUs on one board)
# sits behind the board's own PCIe switch, which topo -m prints as PIX.
_COMMON_ANCESTOR = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_ABSENT = {"NOT_SUPPORTED", "NOT_FOUND", "INVALID_ARGUMENT", "FUNCTION_NOT_FOUND", "NO_PERMISSION"}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(nvml: ModuleType, call: Callable[..., Any], *args: object) -> Any:
    """call(*args), or None when NVML says the GPU has no such thing."""
    try:
        return call(*args)
    except nvml.NVMLError as error:
        if error.value in {getattr(nvml, f"NVML_ERROR_{name}", None) for name in _ABSENT}:
            return None
        raise


# --- XID events ------------------------------------------------------------------------------


@dataclass
class XidWatcher:
    """XID events of every GPU, gathered from one NVML event set; counts accumulate for the
    agent's lifetime (a fatal XID needs a GPU reset, which restarts the agent)."""

    nvml: ModuleType
    event_set: Any = None
    events: dict[str, dict[int, XidEvent]] = field(default_factory=dict)  # uuid -> code -> event

    @classmethod
    def start(cls, nvml: ModuleType) -> XidWatcher:
        watcher = cls(nvml, nvml.nvmlEventSetCreate())
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            _optional(
                nvml,
                nvml.nvmlDeviceRegisterEvents,
                handle,
                nvml.nvmlEventTypeXidCriticalError,
                watcher.event_set,
            )
        return watcher

    def poll(self, timeout_ms: int, now: Callable[[], str]) -> None:
        """Wait up to `timeout_ms` for one event, then take whatever else is queued."""
        wait = timeout_ms
        while True:
            try:
                data = self.nvml.nvmlEventSetWait_v2(self.event_set, wait)
            except self.nvml.NVMLError as error:
                if error.value == self.nvml.NVML_ERROR_TIMEOUT:
                    return
                raise
            wait = 0
            if data.eventType & self.nvml.nvmlEventTypeXidCriticalError:
                uuid = _text(self.nvml.nvmlDeviceGetUUID(data.device))
                self._record(uuid, int(data.eventData), now())

    def _record(self, uuid: str, code: int, timestamp: str) -> None:
        by_code = self.events.setdefault(uuid, {})
        previous = by_code.get(code)
        count = previous.count + 1 if previous else 1
        by_code[code] = XidEvent(code, timestamp, count)

    def for_gpu(self, uuid: str) -> tuple[XidEvent, ...]:
        return tuple(sorted(self.events.get(uuid, {}).values(), key=lambda e: e.code))

    def close(self) -> None:
        if self.event_set is not None:
            self.nvml.nvmlEventSetFree(self.event_set)
            self.event_set = None


# --- the report ------------------------------------------------------------------------------


def read_node_report(
    nvml: ModuleType,
    node: str,
    timestamp: str,
    labels: Mapping[str, str] | None = None,
    xids: XidWatcher | None = None,
    sysfs_pci: Path = Path("/sys/bus/pci/devices"),
) -> NodeReport:
    """One report from an initialised NVML (the caller owns nvmlInit/nvmlShutdown)."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    gpus = [_gpu(nvml, i, h, sysfs_pci) for i, h in enumerate(handles)]
    if xids is not None:
        gpus = [replace(g, health=replace(g.health, xid_events=xids.for_gpu(g.uuid))) for g in gpus]
    gpus = _resolve_nvlink_peers(nvml, gpus, handles)
    cuda = _optional(nvml, nvml.nvmlSystemGetCudaDriverVersion)
    return NodeReport(
        node=node,
        timestamp=timestamp,
        source=ReportSource.NVML,
        gpus=tuple(gpus),
        driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
        cuda_driver_version=None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}",
        labels=dict(labels or {}),
        gpu_links=_gpu_pairs(nvml, gpus, handles),
    )


def _gpu(nvml: ModuleType, index: int, handle: Any, sysfs_pci: Path) -> Gpu:
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    bus_id = normalize_pci_bus_id(_text(pci.busId))
    memory = nvml.nvmlDeviceGetMemoryInfo(handle).total
    brand = _optional(nvml, nvml.nvmlDeviceGetBrand, handle)
    architecture = _optional(nvml, nvml.nvmlDeviceGetArchitecture, handle)
    capability = _optional(nvml, nvml.nvmlDeviceGetCudaComputeCapability, handle)
    addressing = _optional(nvml, nvml.nvmlDeviceGetAddressingMode, handle)
    mig = _optional(nvml, nvml.nvmlDeviceGetMigMode, handle)
    mig_mode = MigMode()
    if mig is not None:
        mig_mode = MigMode(
            mig[0] == nvml.NVML_DEVICE_MIG_ENABLE, mig[1] == nvml.NVML_DEVICE_MIG_ENABLE
        )
    profiles: tuple[MigProfile, ...] = ()
    instances: dict[int, tuple[MigProfile, Placement]] = {}
    if mig is not None:
        profiles, instances = _mig_profiles(nvml, handle, memory, bool(mig_mode.current))
    return Gpu(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        product_name=_text(nvml.nvmlDeviceGetName(handle)),
        pci_bus_id=bus_id,
        minor=_optional(nvml, nvml.nvmlDeviceGetMinorNumber, handle),
        brand=None if brand is None else _BRANDS.get(brand, "Unknown"),
        architecture=None if architecture is None else _ARCHITECTURES.get(architecture, "Unknown"),
        pci_device_id=f"0x{pci.pciDeviceId:08X}",
        pcie_root=_pcie_root(sysfs_pci, bus_id),
        memory_bytes=int(memory),
        cuda_compute_capability=None if capability is None else "{}.{}".format(*capability),
        addressing_mode=None if addressing is None else _ADDRESSING_MODES.get(addressing),
        mig_mode=mig_mode,
        mig_profiles=profiles,
        mig_devices=_mig_devices(nvml, handle, instances) if mig_mode.current else (),
        nvlink_peers=_nvlink_links(nvml, handle),
        numa_node=_numa_node(nvml, handle, sysfs_pci, bus_id),
        cpu_affinity=_cpu_affinity(nvml, handle),
        health=_health(nvml, handle),
    )


def _pcie_root(sysfs_pci: Path, bus_id: str) -> str | None:
    """`pci0000:00`: the first component under /sys/devices of the GPU's sysfs path."""
    try:
        parts = (sysfs_pci / bus_id).resolve(strict=True).parts
    except OSError:
        return None
    return next((p for p in parts if p.startswith("pci")), None)


def _numa_node(nvml: ModuleType, handle: Any, sysfs_pci: Path, bus_id: str) -> int | None:
    nodes = _mask_members(_optional(nvml, nvml.nvmlDeviceGetMemoryAffinity, handle, 1, 0))
    if len(nodes) == 1:
        return nodes[0]
    try:
        node = int((sysfs_pci / bus_id / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _cpu_affinity(nvml: ModuleType, handle: Any) -> tuple[CpuRange, ...]:
    words = max(1, -(-(os.cpu_count() or 1) // 64))
    cpus = _mask_members(_optional(nvml, nvml.nvmlDeviceGetCpuAffinity, handle, words))
    ranges: list[CpuRange] = []
    for cpu in cpus:
        if ranges and ranges[-1].last == cpu - 1:
            ranges[-1] = CpuRange(ranges[-1].first, cpu)
        else:
            ranges.append(CpuRange(cpu, cpu))
    return tuple(ranges)


def _mask_members(words: Sequence[int] | None) -> list[int]:
    if words is None:
        return []
    return [i * 64 + bit for i, word in enumerate(words) for bit in range(64) if word >> bit & 1]


def _health(nvml: ModuleType, handle: Any) -> GpuHealth:
    mode = _optional(nvml, nvml.nvmlDeviceGetEccMode, handle)

    def total(kind: int, counter: int) -> int | None:
        count = _optional(nvml, nvml.nvmlDeviceGetTotalEccErrors, handle, kind, counter)
        return None if count is None else int(count)

    corrected = nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    uncorrected = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    volatile, aggregate = nvml.NVML_VOLATILE_ECC, nvml.NVML_AGGREGATE_ECC
    retire = nvml.nvmlDeviceGetRetiredPages
    single = _optional(
        nvml, retire, handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    )
    double = _optional(nvml, retire, handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    pending = _optional(nvml, nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    rows = _optional(nvml, nvml.nvmlDeviceGetRemappedRows, handle)
    retired = RetiredPages(
        None if single is None else len(single),
        None if double is None else len(double),
        None if pending is None else bool(pending),
    )
    return GpuHealth(
        ecc_enabled=None if mode is None else bool(mode[0]),
        ecc=EccCounts(
            total(corrected, volatile),
            total(uncorrected, volatile),
            total(corrected, aggregate),
            total(uncorrected, aggregate),
        ),
        retired_pages=None if retired == RetiredPages() else retired,
        remapped_rows=None if rows is None else _remapped(rows),
    )


def _remapped(rows: Sequence[int]) -> RemappedRows:
    correctable, uncorrectable, pending, failure = rows
    return RemappedRows(correctable, uncorrectable, bool(pending), bool(failure))


# --- MIG -------------------------------------------------------------------------------------


def _mig_profiles(
    nvml: ModuleType, handle: Any, memory_total: int, enabled: bool
) -> tuple[tuple[MigProfile, ...], dict[int, tuple[MigProfile, Placement]]]:
    """Supported GPU instance profiles with placements, and (MIG on) existing GPU instances."""
    profiles: list[MigProfile] = []
    instances: dict[int, tuple[MigProfile, Placement]] = {}
    for enum in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = _optional(nvml, nvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, enum)
        if info is None or info.instanceCount == 0:
            continue
        placements = _ctypes_list(
            nvml.c_nvmlGpuInstancePlacement_t,
            info.instanceCount,
            nvml.nvmlDeviceGetGpuInstancePossiblePlacements,
            handle,
            info.id,
        )
        name = _text(getattr(info, "name", b"")).removeprefix("MIG ").strip()
        profile = MigProfile(
            name=name or mig_profile_name(info.sliceCount, info.memorySizeMB, memory_total, enum),
            id=info.id,
            slice_count=info.sliceCount,
            placements=tuple(sorted(Placement(p.start, p.size) for p in placements)),
            memory_mib=info.memorySizeMB,
            multiprocessors=info.multiprocessorCount,
            copy_engines=info.copyEngineCount,
            decoders=info.decoderCount,
            encoders=info.encoderCount,
            jpeg_engines=info.jpegCount,
            ofa_engines=info.ofaCount,
            max_instances=info.instanceCount,
        )
        profiles.append(profile)
        if not enabled:
            continue
        gpu_instances = _optional(
            nvml,
            _ctypes_list,
            nvml.c_nvmlGpuInstance_t,
            info.instanceCount,
            nvml.nvmlDeviceGetGpuInstances,
            handle,
            info.id,
        )
        for gpu_instance in gpu_instances or ():
            gi = nvml.nvmlGpuInstanceGetInfo(gpu_instance)
            instances[gi.id] = (profile, Placement(gi.placement.start, gi.placement.size))
    return tuple(profiles), instances


def _ctypes_list(item: Any, capacity: int, call: Callable[..., object], *args: object) -> list[Any]:
    """NVML's fill-an-array calls: call(*args, array, &count) with room for `capacity` items."""
    array = (item * capacity)()
    count = ctypes.c_uint(capacity)
    call(*args, array, ctypes.byref(count))
    return list(array[: count.value])


def _mig_devices(
    nvml: ModuleType, handle: Any, instances: Mapping[int, tuple[MigProfile, Placement]]
) -> tuple[MigDevice, ...]:
    devices = []
    for slot in range(_optional(nvml, nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
        mig = _optional(nvml, nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if mig is None:
            continue
        gi = nvml.nvmlDeviceGetGpuInstanceId(mig)
        attrs = nvml.nvmlDeviceGetAttributes(mig)
        profile, placement = instances.get(gi, (None, None))
        name = profile.name if profile else None
        if name and attrs.computeInstanceSliceCount != attrs.gpuInstanceSliceCount:
            name = f"{attrs.computeInstanceSliceCount}c.{name}"
        devices.append(
            MigDevice(
                gpu_instance_id=gi,
                compute_instance_id=nvml.nvmlDeviceGetComputeInstanceId(mig),
                uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                index=slot,
                profile=name,
                profile_id=profile.id if profile else None,
                placement=placement,
                memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(mig).total),
                multiprocessors=attrs.multiprocessorCount,
                copy_engines=attrs.sharedCopyEngineCount,
                decoders=attrs.sharedDecoderCount,
                encoders=attrs.sharedEncoderCount,
                jpeg_engines=attrs.sharedJpegCount,
                ofa_engines=attrs.sharedOfaCount,
            )
        )
    return tuple(devices)


# --- NVLink and PCIe relations -----------------------------------------------------------------


def _active_links(nvml: ModuleType, handle: Any) -> Iterator[int]:
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        if (
            _optional(nvml, nvml.nvmlDeviceGetNvLinkState, handle, link)
            == nvml.NVML_FEATURE_ENABLED
        ):
            yield link


def _nvlink_links(nvml: ModuleType, handle: Any) -> tuple[NvLinkPeer, ...]:
    """Links to GPUs by remote bus id (peer index/uuid filled in later); links to NVSwitches
    are kept as one peer without identity, resolved by `_resolve_nvlink_peers`."""
    by_peer: dict[str | None, int] = {}
    for link in _active_links(nvml, handle):
        kind = _optional(nvml, nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
        if kind == nvml.NVML_NVLINK_DEVICE_TYPE_GPU:
            remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            key: str | None = normalize_pci_bus_id(_text(remote.busId))
        elif kind == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            key = None
        else:
            continue
        by_peer[key] = by_peer.get(key, 0) + 1
    return tuple(NvLinkPeer(links=n, peer_pci_bus_id=bus) for bus, n in by_peer.items())


def _resolve_nvlink_peers(nvml: ModuleType, gpus: list[Gpu], handles: list[Any]) -> list[Gpu]:
    by_bus = {g.pci_bus_id: g for g in gpus}
    resolved = []
    for gpu, handle in zip(gpus, handles, strict=True):
        peers: list[NvLinkPeer] = []
        for peer in gpu.nvlink_peers:
            if peer.peer_pci_bus_id is None:  # through NVSwitches: every P2P-capable GPU
                peers += [
                    NvLinkPeer(peer.links, other.index, other.pci_bus_id, other.uuid)
                    for other, other_handle in zip(gpus, handles, strict=True)
                    if other.index != gpu.index and _nvlink_p2p(nvml, handle, other_handle)
                ]
            elif (other := by_bus.get(peer.peer_pci_bus_id)) is not None:
                peers.append(NvLinkPeer(peer.links, other.index, other.pci_bus_id, other.uuid))
            else:
                peers.append(peer)
        resolved.append(replace(gpu, nvlink_peers=tuple(peers)))
    return resolved


def _nvlink_p2p(nvml: ModuleType, a: Any, b: Any) -> bool:
    status = _optional(nvml, nvml.nvmlDeviceGetP2PStatus, a, b, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
    return bool(status == nvml.NVML_P2P_STATUS_OK)


def _gpu_pairs(nvml: ModuleType, gpus: list[Gpu], handles: list[Any]) -> tuple[GpuPair, ...]:
    pairs = []
    for i, gpu in enumerate(gpus):
        for j in range(i + 1, len(gpus)):
            nvlinks = sum(p.links for p in gpu.nvlink_peers if p.peer_index == gpus[j].index)
            if nvlinks:
                pairs.append(
                    GpuPair(gpu.index, gpus[j].index, GpuLink(TopologyLevel.NVLINK, nvlinks))
                )
                continue
            level = _optional(
                nvml, nvml.nvmlDeviceGetTopologyCommonAncestor, handles[i], handles[j]
            )
            if level in _COMMON_ANCESTOR:
                pairs.append(
                    GpuPair(gpu.index, gpus[j].index, GpuLink.parse(_COMMON_ANCESTOR[level]))
                )
    return tuple(pairs)
