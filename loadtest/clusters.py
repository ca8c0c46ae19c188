"""Generated clusters for benchmarks: N GPUs on 8-GPU nodes, as the NVIDIA DRA driver publishes
them.

    cluster = generate(10_000, seed=1)
    snapshot = ClusterSnapshot.build(cluster.slices, cluster.nodes, topologies=cluster.topologies)
    state = AllocatedState.build(snapshot, cluster.held)

Three node models, in fixed shares (by node index, so every size has the same mix):

- `h100`  (55%): NVIDIA H100 80GB HBM3 on an HGX board: all eight GPUs on NVSwitch (NV18
  between every pair), two GPUs and one NIC per PCIe switch, GPUs 0-3 on NUMA node 0.
- `a100`  (30%): NVIDIA A100 80GB PCIe with NVLink bridges: GPUs 2k and 2k+1 are a pair (NV12),
  nothing else is NVLink-connected, so four NVLink-connected GPUs do not exist here.
- `l40s`  (15%): NVIDIA L40S on PCIe only.

About one node in ten (every tenth A100/H100 node by index, `mig_every`) publishes the DynamicMIG
layout instead: one slice per GPU with its counter set and a device for the whole GPU and for
every MIG profile x placement, counters as `services.inventory.core.mig` models the driver's.

Some nodes are partly allocated (`held`): by node index, a third of the plain nodes hold 1-7 whole
GPUs and one in twenty is full; on MIG nodes some GPUs hold a valid packing of MIG devices and
some are taken whole. Everything is a pure function of (gpus, seed).
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from services.allocator.core import NicInfo, NodeTopology
from services.common.dra.model import (
    AllocationResult,
    AttributeValue,
    CounterSet,
    Device,
    DeviceCapacity,
    DeviceClass,
    DeviceCounterConsumption,
    DeviceID,
    DeviceRequestAllocationResult,
    DeviceSelector,
    Node,
    ResourcePool,
    ResourceSlice,
)
from services.common.dra.quantity import Quantity
from services.inventory.core.mig import (
    KNOWN_PROFILE_TABLES,
    consumed_counters,
    counter_set_counters,
    profile_capacities,
)
from services.inventory.core.report import MigProfile, Placement

__all__ = [
    "DRIVER",
    "GPUS_PER_NODE",
    "MODELS",
    "GeneratedCluster",
    "Model",
    "device_classes",
    "generate",
]

DRIVER = "gpu.nvidia.com"
GPUS_PER_NODE = 8
RACK_LABEL = "gpualloc.dev/rack"
CLIQUE_LABEL = "nvidia.com/gpu.clique"
NODES_PER_RACK = 16
_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"


@dataclass(frozen=True)
class Model:
    key: str
    product_name: str
    architecture: str
    compute_capability: str
    memory: str
    nvlinks: Mapping[tuple[int, int], int]  # GPU index pair -> NVLink count
    mig_table: str | None  # PCI device id in KNOWN_PROFILE_TABLES


def _all_pairs(links: int) -> dict[tuple[int, int], int]:
    return {(a, b): links for a in range(GPUS_PER_NODE) for b in range(a + 1, GPUS_PER_NODE)}


def _bridged_pairs(links: int) -> dict[tuple[int, int], int]:
    return {(a, a + 1): links for a in range(0, GPUS_PER_NODE, 2)}


H100 = Model(
    "h100", "NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "81559Mi", _all_pairs(18), "0x233010DE"
)
A100 = Model(
    "a100",
    "NVIDIA A100 80GB PCIe",
    "Ampere",
    "8.0.0",
    "81920Mi",
    _bridged_pairs(12),
    "0x20B210DE",  # same MIG geometry as the SXM4 80GB
)
L40S = Model("l40s", "NVIDIA L40S", "Ada Lovelace", "8.9.0", "46068Mi", {}, None)
MODELS = (H100, A100, L40S)
# Out of every 20 nodes: 11 H100, 6 A100, 3 L40S.
_MIX = (H100,) * 11 + (A100,) * 6 + (L40S,) * 3
_COMMON_VALUES: dict[tuple[str, str], AttributeValue] = {}


@dataclass
class GeneratedCluster:
    gpus: int
    slices: list[ResourceSlice] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    held: list[tuple[str, AllocationResult]] = field(default_factory=list)
    topologies: dict[str, NodeTopology] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)  # node -> model key
    mig_nodes: list[str] = field(default_factory=list)

    @property
    def device_count(self) -> int:
        return sum(len(s.devices) for s in self.slices)

    def nodes_of(self, model: str, *, mig: bool = False) -> list[str]:
        migs = set(self.mig_nodes)
        return [n for n, m in self.models.items() if m == model and (n in migs) == mig]


def device_classes() -> dict[str, DeviceClass]:
    """The NVIDIA chart's classes: whole GPUs and MIG devices."""
    return {
        "gpu.nvidia.com": DeviceClass(
            "gpu.nvidia.com",
            (
                DeviceSelector(
                    f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"
                ),
            ),
        ),
        "mig.nvidia.com": DeviceClass(
            "mig.nvidia.com",
            (
                DeviceSelector(
                    f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig'"
                ),
            ),
        ),
    }


def generate(
    gpus: int,
    *,
    seed: int = 0,
    mig_every: int = 10,
    partly_used: bool = True,
    mix: Sequence[Model] = _MIX,
) -> GeneratedCluster:
    """A cluster of `gpus` GPUs (rounded down to whole 8-GPU nodes)."""
    rng = random.Random(seed)
    cluster = GeneratedCluster(gpus=(gpus // GPUS_PER_NODE) * GPUS_PER_NODE)
    capable = 0
    for index in range(gpus // GPUS_PER_NODE):
        model = mix[index % len(mix)]
        name = f"{model.key}-{index:05d}"
        mig = model.mig_table is not None and mig_every > 0 and capable % mig_every == mig_every - 1
        capable += model.mig_table is not None
        rack = f"rack-{index // NODES_PER_RACK:04d}"
        cluster.nodes.append(_node(name, model, rack))
        cluster.models[name] = model.key
        cluster.topologies[name] = _topology(model.key).for_pool(name)
        if mig:
            cluster.mig_nodes.append(name)
            slices = list(_mig_slices(name, index, model))
        else:
            slices = [_plain_slice(name, index, model)]
        cluster.slices.extend(slices)
        if partly_used:
            cluster.held.extend(_held(rng, name, index, slices, model if mig else None))
    return cluster


# --- nodes and topology -------------------------------------------------------------------------


def _node(name: str, model: Model, rack: str) -> Node:
    labels = {
        "kubernetes.io/hostname": name,
        RACK_LABEL: rack,
        "nvidia.com/gpu.product": model.product_name.replace(" ", "-"),
        "nvidia.com/gpu.count": str(GPUS_PER_NODE),
    }
    if model is H100:
        labels[CLIQUE_LABEL] = f"{rack}.0"  # one NVLink domain per rack of H100 nodes
    return Node(name, labels)


@functools.cache
def _topology(key: str) -> NodeTopology:
    """NVLinks of the model, two NUMA nodes, one PCIe switch (with one NIC) per GPU pair."""
    model = next(m for m in MODELS if m.key == key)
    switches = {f"gpu-{g}": f"pcie-switch-{g // 2}" for g in range(GPUS_PER_NODE)}
    roots = {f"gpu-{g}": f"pci0000:{g // 2:02x}" for g in range(GPUS_PER_NODE)}
    numa = {f"gpu-{g}": g // 4 for g in range(GPUS_PER_NODE)}
    nics = tuple(
        NicInfo(f"mlx5_{k}", switch=f"pcie-switch-{k}", pcie_root=f"pci0000:{k:02x}", numa=k // 2)
        for k in range(GPUS_PER_NODE // 2)
    )
    return NodeTopology.build(
        driver=DRIVER,
        nvlinks={(f"gpu-{a}", f"gpu-{b}"): n for (a, b), n in model.nvlinks.items()},
        numa=numa,
        pcie_switches=switches,
        pcie_roots=roots,
        nics=nics,
    )


# --- devices -------------------------------------------------------------------------------------


def _value(kind: str, text: str) -> AttributeValue:
    """Interned attribute values: a 100,000-GPU cluster repeats the same few strings."""
    found = _COMMON_VALUES.get((kind, text))
    if found is None:
        found = AttributeValue.version(text) if kind == "version" else AttributeValue.string(text)
        _COMMON_VALUES[(kind, text)] = found
    return found


def _uuid(node_index: int, gpu: int) -> str:
    digest = hashlib.blake2b(f"{node_index}/{gpu}".encode(), digest_size=16).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _common(model: Model, gpu: int) -> dict[str, AttributeValue]:
    return {
        "productName": _value("string", model.product_name),
        "brand": _value("string", "Nvidia"),
        "architecture": _value("string", model.architecture),
        "cudaComputeCapability": _value("version", model.compute_capability),
        "driverVersion": _value("version", "580.95.5"),
        "cudaDriverVersion": _value("version", "13.0.0"),
        _PCI_BUS_ID: AttributeValue.string(f"0000:{0x18 + gpu * 0x11:02x}:00.0"),
        _PCIE_ROOT: _value("string", f"pci0000:{gpu // 2:02x}"),
    }


def _plain_slice(name: str, index: int, model: Model) -> ResourceSlice:
    memory = {"memory": DeviceCapacity(Quantity.parse(model.memory))}
    devices = tuple(
        Device(
            f"gpu-{g}",
            {
                "type": _value("string", "gpu"),
                "uuid": AttributeValue.string(_uuid(index, g)),
                **_common(model, g),
            },
            memory,
        )
        for g in range(GPUS_PER_NODE)
    )
    return ResourceSlice(
        f"{name}-{DRIVER}", DRIVER, ResourcePool(name, 1, 1), devices, node_name=name
    )


def _mig_slices(name: str, index: int, model: Model) -> Iterator[ResourceSlice]:
    assert model.mig_table is not None
    profiles = KNOWN_PROFILE_TABLES[model.mig_table]
    totals = counter_set_counters(profiles)
    whole_capacity = {
        capacity: DeviceCapacity(quantity)
        for capacity, quantity in _max_capacities(profiles).items()
    }
    for g in range(GPUS_PER_NODE):
        counter_set = f"gpu-{g}-counter-set"
        uuid = _uuid(index, g)
        devices = [
            Device(
                f"gpu-{g}",
                {
                    "type": _value("string", "gpu"),
                    "uuid": AttributeValue.string(uuid),
                    **_common(model, g),
                },
                whole_capacity,
                (DeviceCounterConsumption(counter_set, totals),),
            )
        ]
        mig_common = {
            "type": _value("string", "mig"),
            "parentUUID": AttributeValue.string(uuid),
            **_common(model, g),
        }
        for profile in profiles:
            capacity = {c: DeviceCapacity(v) for c, v in profile_capacities(profile).items()}
            attributes = {**mig_common, "profile": _value("string", profile.name)}
            for placement in profile.placements:
                devices.append(
                    Device(
                        _mig_name(g, profile, placement),
                        attributes,
                        capacity,
                        (
                            DeviceCounterConsumption(
                                counter_set, consumed_counters(profiles, profile, placement)
                            ),
                        ),
                    )
                )
        yield ResourceSlice(
            f"{name}-{DRIVER}-{g}",
            DRIVER,
            ResourcePool(name, 1, GPUS_PER_NODE),
            tuple(devices),
            node_name=name,
            shared_counters=(CounterSet(counter_set, totals),),
        )


def _mig_name(gpu: int, profile: MigProfile, placement: Placement) -> str:
    rfc1123 = profile.name.replace(".", "").replace("+", "-")
    return f"gpu-{gpu}-mig-{rfc1123}-{profile.id}-{placement.start}"


def _max_capacities(profiles: Sequence[MigProfile]) -> dict[str, Quantity]:
    out: dict[str, Quantity] = {}
    for profile in profiles:
        for capacity, quantity in profile_capacities(profile).items():
            if capacity not in out or quantity > out[capacity]:
                out[capacity] = quantity
    return out


# --- what is already allocated ---------------------------------------------------------------


def _held(
    rng: random.Random,
    name: str,
    index: int,
    slices: Sequence[ResourceSlice],
    mig_model: Model | None,
) -> Iterator[tuple[str, AllocationResult]]:
    if mig_model is not None:
        yield from _held_mig(rng, name, slices, mig_model)
        return
    if index % 20 == 7:
        taken = GPUS_PER_NODE
    elif index % 3 == 1:
        taken = rng.randint(1, GPUS_PER_NODE - 1)
    else:
        return
    gpus = sorted(rng.sample(range(GPUS_PER_NODE), taken))
    yield f"bench/{name}-whole", _allocation(name, (f"gpu-{g}" for g in gpus))


def _held_mig(
    rng: random.Random, name: str, slices: Sequence[ResourceSlice], model: Model
) -> Iterator[tuple[str, AllocationResult]]:
    """GPU 0 whole, GPUs 1-3 a random valid packing of MIG devices, the rest free."""
    assert model.mig_table is not None
    profiles = KNOWN_PROFILE_TABLES[model.mig_table]
    yield f"bench/{name}-gpu-0", _allocation(name, ["gpu-0"])
    for g in (1, 2, 3):
        used: set[int] = set()
        picked: list[str] = []
        limited: dict[int, int] = {}
        for _ in range(rng.randint(1, 4)):
            profile = rng.choice(profiles)
            if (
                profile.max_instances is not None
                and limited.get(profile.id, 0) >= profile.max_instances
            ):
                continue
            free = [p for p in profile.placements if used.isdisjoint(p.slices)]
            if not free:
                continue
            placement = rng.choice(free)
            used.update(placement.slices)
            limited[profile.id] = limited.get(profile.id, 0) + 1
            picked.append(_mig_name(g, profile, placement))
        for k, device in enumerate(picked):
            yield f"bench/{name}-gpu-{g}-mig-{k}", _allocation(name, [device])


def _allocation(node: str, devices: Iterator[str] | Sequence[str]) -> AllocationResult:
    return AllocationResult(
        tuple(DeviceRequestAllocationResult("gpus", DRIVER, node, d) for d in devices)
    )


def device_ids(cluster: GeneratedCluster) -> Iterator[DeviceID]:
    for slice_ in cluster.slices:
        for device in slice_.devices:
            yield DeviceID(DRIVER, slice_.pool.name, device.name)
