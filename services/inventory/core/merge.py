"""NVML facts -> DRA-shaped devices, for GPUs that no ResourceSlice covers.

The devices look like the NVIDIA DRA driver's (gpu.nvidia.com, v25.12+/HEAD attribute names in
shared/reference/nvidia-dra-attributes.md sections 2-4), so the same CEL selectors match them:

- a GPU without MIG -> `gpu-<minor>`: type=gpu, uuid, productName, brand, architecture,
  cudaComputeCapability, driverVersion, cudaDriverVersion (versions as semver),
  resource.kubernetes.io/pciBusID, resource.kubernetes.io/pcieRoot, addressingMode (each only
  when known); capacity `memory` = NVML total bytes.
- a GPU with MIG enabled -> a counter set `gpu-<minor>-counter-set` and one device per profile x
  possible placement, `gpu-<minor>-mig-<profile>-<profileId>-<start>`, type=mig, consuming its
  capacities and memory slices (core/mig.py). As the driver does on Ampere, the whole GPU is not
  announced while MIG is on. MIG devices that exist now are marked on the matching device with
  `gpualloc.io/migCreated` (and `uuid`, `gpualloc.io/gpuInstanceId` when one instance sits
  there). Without profile data the existing MIG devices are published as they are.

Health findings become taints on every device of the GPU (core/health.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from services.common.dra.model import (
    AttributeValue,
    CounterSet,
    Device,
    DeviceCapacity,
    DeviceCounterConsumption,
    DeviceTaint,
    ResourcePool,
    ResourceSlice,
)
from services.common.dra.quantity import Quantity, QuantityFormat
from services.inventory.core.health import taints_from_health
from services.inventory.core.mig import (
    KNOWN_PROFILE_TABLES,
    consumed_counters,
    counter_set_counters,
    forced_placements,
    profile_capacities,
)
from services.inventory.core.report import Gpu, MigDevice, MigProfile, NodeReport, Placement
from services.inventory.core.topology import topology_graph

__all__ = [
    "CREATED_ATTRIBUTE",
    "DEFAULT_DRIVER",
    "GPU_INSTANCE_ATTRIBUTE",
    "devices_from_report",
    "mig_profiles_for",
    "semver",
    "slices_from_report",
    "taints_from_health",
    "topology_graph",
]

DEFAULT_DRIVER = "gpu.nvidia.com"
CREATED_ATTRIBUTE = "gpualloc.io/migCreated"
GPU_INSTANCE_ATTRIBUTE = "gpualloc.io/gpuInstanceId"
_PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
_PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"

Attributes = dict[str, AttributeValue]


def semver(text: str | None) -> str | None:
    """`510.47.03` -> `510.47.3`, `13.1` -> `13.1.0` (the driver's version attributes); None if
    the text is not dotted numbers."""
    if text is None:
        return None
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    return ".".join(str(n) for n in numbers)


def mig_profiles_for(gpu: Gpu) -> tuple[MigProfile, ...]:
    """The GPU's MIG profiles: as NVML reported them, else the known table for its PCI id."""
    if gpu.mig_profiles:
        return gpu.mig_profiles
    if gpu.pci_device_id is None:
        return ()
    return KNOWN_PROFILE_TABLES.get(gpu.pci_device_id.upper().replace("0X", "0x"), ())


def devices_from_report(report: NodeReport) -> tuple[list[Device], list[CounterSet]]:
    """Every GPU of the report as DRA devices, plus the counter sets the MIG devices consume."""
    devices: list[Device] = []
    counter_sets: list[CounterSet] = []
    for gpu in report.gpus:
        gpu_devices, counter_set = _gpu_devices(report, gpu)
        devices.extend(gpu_devices)
        if counter_set is not None:
            counter_sets.append(counter_set)
    return devices, counter_sets


def slices_from_report(
    report: NodeReport, generation: int, driver: str = DEFAULT_DRIVER, pool: str | None = None
) -> tuple[ResourceSlice, ...]:
    """One ResourceSlice per GPU (the 1.34 layout: devices and their counter set together, which
    keeps a 19-device MIG GPU inside the 128-devices-per-slice limit). `pool` defaults to the
    node's name."""
    pool_name = pool or report.node
    slices = []
    for gpu in report.gpus:
        gpu_devices, counter_set = _gpu_devices(report, gpu)
        slices.append(
            ResourceSlice(
                name=f"{report.node}-{driver}-gpu-{_minor(gpu)}",
                driver=driver,
                pool=ResourcePool(pool_name, generation, len(report.gpus)),
                devices=tuple(gpu_devices),
                node_name=report.node,
                shared_counters=(counter_set,) if counter_set is not None else (),
            )
        )
    return tuple(slices)


# --- one GPU ---------------------------------------------------------------------------------


def _minor(gpu: Gpu) -> int:
    return gpu.minor if gpu.minor is not None else gpu.index


def _gpu_devices(report: NodeReport, gpu: Gpu) -> tuple[list[Device], CounterSet | None]:
    taints = taints_from_health(gpu, report.timestamp)
    common = _common_attributes(report, gpu)
    if not gpu.mig_enabled:
        attributes = {"type": AttributeValue.string("gpu"), "uuid": AttributeValue.string(gpu.uuid)}
        capacity = {}
        if gpu.memory_bytes is not None:
            memory = Quantity.of(gpu.memory_bytes, QuantityFormat.BINARY_SI)
            capacity["memory"] = DeviceCapacity(memory)
        device = Device(f"gpu-{_minor(gpu)}", attributes | common, capacity, taints=taints)
        return [device], None
    profiles = mig_profiles_for(gpu)
    if not profiles:
        return [_static_mig_device(gpu, mig, common, taints) for mig in gpu.mig_devices], None
    counter_set = CounterSet(f"gpu-{_minor(gpu)}-counter-set", counter_set_counters(profiles))
    existing = _existing_by_placement(gpu.mig_devices, profiles)
    devices = []
    for profile in profiles:
        for placement in profile.placements:
            consumption = DeviceCounterConsumption(
                counter_set.name, consumed_counters(profiles, profile, placement)
            )
            attributes = _mig_attributes(gpu, profile.name) | common
            attributes |= _created_attributes(existing.get((profile.id, placement)))
            capacity = {k: DeviceCapacity(q) for k, q in profile_capacities(profile).items()}
            name = (
                f"gpu-{_minor(gpu)}-mig-{_dns_label(profile.name)}-{profile.id}-{placement.start}"
            )
            devices.append(Device(name, attributes, capacity, (consumption,), taints))
    return devices, counter_set


def _common_attributes(report: NodeReport, gpu: Gpu) -> Attributes:
    """Attributes a GPU and its MIG devices share (DRA CommonAttributesMig), where known."""
    strings = {
        "productName": gpu.product_name,
        "brand": gpu.brand,
        "architecture": gpu.architecture,
        _PCI_BUS_ID_ATTRIBUTE: gpu.pci_bus_id,
        _PCIE_ROOT_ATTRIBUTE: gpu.pcie_root,
        "addressingMode": gpu.addressing_mode,
    }
    versions = {
        "cudaComputeCapability": semver(gpu.cuda_compute_capability),
        "driverVersion": semver(report.driver_version),
        "cudaDriverVersion": semver(report.cuda_driver_version),
    }
    attributes = {k: AttributeValue.string(v) for k, v in strings.items() if v is not None}
    attributes |= {k: AttributeValue.version(v) for k, v in versions.items() if v is not None}
    return attributes


def _mig_attributes(gpu: Gpu, profile: str | None) -> Attributes:
    attributes = {
        "type": AttributeValue.string("mig"),
        "parentUUID": AttributeValue.string(gpu.uuid),
    }
    if profile is not None:
        attributes["profile"] = AttributeValue.string(profile)
    return attributes


def _dns_label(profile: str) -> str:
    return re.sub(r"[^a-z0-9-]", "", profile.lower())


def _existing_by_placement(
    migs: Sequence[MigDevice], profiles: Sequence[MigProfile]
) -> dict[tuple[int, Placement], list[MigDevice]]:
    """Existing MIG devices keyed by (profile id, placement); placements the XML lacks are
    filled in only where every packing of the existing instances agrees (mig.forced_placements)."""
    by_id = {p.id: p for p in profiles}
    placed: dict[tuple[int, Placement], list[MigDevice]] = {}
    unplaced: dict[int, list[MigDevice]] = {}
    for mig in migs:
        profile_id = mig.profile_id
        if profile_id is None or profile_id not in by_id:
            continue
        if mig.placement is not None:
            placed.setdefault((profile_id, mig.placement), []).append(mig)
        else:
            unplaced.setdefault(profile_id, []).append(mig)
    existing = [by_id[profile_id] for profile_id, ms in unplaced.items() for _ in ms]
    for profile_id, placements in forced_placements(existing).items():
        instances = unplaced[profile_id]
        for placement in placements:
            # Which instance sits where is known only when there is one of them.
            placed[(profile_id, placement)] = instances if len(instances) == 1 else []
    return placed


def _created_attributes(instances: list[MigDevice] | None) -> Attributes:
    if instances is None:
        return {}
    attributes = {CREATED_ATTRIBUTE: AttributeValue.bool_(True)}
    gpu_instances = {m.gpu_instance_id for m in instances}
    if len(gpu_instances) == 1:
        attributes[GPU_INSTANCE_ATTRIBUTE] = AttributeValue.int_(gpu_instances.pop())
    if len(instances) == 1 and instances[0].uuid is not None:
        attributes["uuid"] = AttributeValue.string(instances[0].uuid)
    return attributes


def _static_mig_device(
    gpu: Gpu, mig: MigDevice, common: Attributes, taints: tuple[DeviceTaint, ...]
) -> Device:
    attributes = _mig_attributes(gpu, mig.profile) | common
    if mig.uuid is not None:
        attributes["uuid"] = AttributeValue.string(mig.uuid)
    capacity = {}
    if mig.memory_bytes is not None:
        memory = Quantity.of(mig.memory_bytes, QuantityFormat.BINARY_SI)
        capacity["memory"] = DeviceCapacity(memory)
    if mig.multiprocessors is not None:
        capacity["multiprocessors"] = DeviceCapacity(Quantity.of(mig.multiprocessors))
    name = f"gpu-{_minor(gpu)}-mig-gi{mig.gpu_instance_id}-ci{mig.compute_instance_id}"
    return Device(name, attributes, capacity, taints=taints)
