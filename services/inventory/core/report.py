"""What a node agent reports about its GPUs: frozen values, no I/O.

A `NodeReport` is built by an adapter (NVML through `gpualloc-agent`, or saved `nvidia-smi -q -x`
and `nvidia-smi topo -m` output) and consumed by the merge into DRA-shaped devices, taints and a
topology graph. Every field an adapter may not know is optional (`None` or empty): the XML has no
NUMA, NVLink or compute capability, NVML has no NIC names. Strings that identify hardware are
normalised here once (PCI bus ids, CPU lists, topology cells) so later joins compare like with like.

The report's timestamp is given by the caller (RFC 3339 text); nothing here reads a clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "CpuRange",
    "EccCounts",
    "Gpu",
    "GpuHealth",
    "GpuLink",
    "GpuPair",
    "MigDevice",
    "MigMode",
    "MigProfile",
    "Nic",
    "NodeReport",
    "NvLinkPeer",
    "Placement",
    "RemappedRows",
    "ReportSource",
    "RetiredPages",
    "TopologyLevel",
    "XidEvent",
    "format_cpu_list",
    "normalize_pci_bus_id",
    "parse_cpu_list",
]

# --- identifiers -----------------------------------------------------------------------------

_PCI_BUS_ID = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):"
    r"(?P<device>[0-9a-fA-F]{1,2})\.(?P<function>[0-7])$"
)


def normalize_pci_bus_id(text: str) -> str:
    """One spelling for a PCI address: `0000:3b:00.0` (lower case, 4-digit domain).

    NVML and nvidia-smi print `00000000:3B:00.0` (8-digit domain, upper case); the DRA driver
    publishes `0000:3b:00.0` (go-nvlib `GetPCIBusID` trims the leading `0000`); `topo -m` and
    sysfs use the short form. A domain above 0xffff keeps all eight digits. Raises ValueError.
    """
    match = _PCI_BUS_ID.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a PCI bus id like 0000:3b:00.0")
    domain = int(match["domain"] or "0", 16)
    domain_text = f"{domain:04x}" if domain <= 0xFFFF else f"{domain:08x}"
    bus, device = int(match["bus"], 16), int(match["device"], 16)
    return f"{domain_text}:{bus:02x}:{device:02x}.{match['function']}"


@dataclass(frozen=True)
class CpuRange:
    """An inclusive range of CPU (or NUMA node) ids, as in a Linux cpulist `0-51`."""

    first: int
    last: int

    def __post_init__(self) -> None:
        if self.first < 0 or self.last < self.first:
            raise ValueError(f"bad CPU range {self.first}-{self.last}")

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


def parse_cpu_list(text: str) -> tuple[CpuRange, ...]:
    """Parse a Linux cpulist (`0-51,104-155`, `3`); `N/A` or empty gives (). Raises ValueError."""
    stripped = text.strip()
    if stripped in ("", "N/A"):
        return ()
    ranges = []
    for part in stripped.split(","):
        first, sep, last = part.strip().partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise ValueError(f"{text!r} is not a CPU list like 0-51,104-155")
        ranges.append(CpuRange(int(first), int(last) if sep else int(first)))
    return tuple(ranges)


def format_cpu_list(ranges: tuple[CpuRange, ...]) -> str:
    return ",".join(str(r) for r in ranges)


# --- topology relations ----------------------------------------------------------------------


class TopologyLevel(StrEnum):
    """How two devices are connected, nearest first (the `nvidia-smi topo -m` legend)."""

    SELF = "X"
    NVLINK = "NV"  # a bonded set of NVLinks; the count lives in GpuLink.nvlinks
    PIX = "PIX"  # at most one PCIe bridge
    PXB = "PXB"  # several PCIe bridges, no host bridge
    PHB = "PHB"  # through a PCIe host bridge (the CPU)
    NODE = "NODE"  # between host bridges inside one NUMA node
    SYS = "SYS"  # across the SMP interconnect between NUMA nodes (QPI/UPI)


_LEVEL_RANK = {level: rank for rank, level in enumerate(TopologyLevel)}
_LINK_TEXT = re.compile(r"^(?:NV(?P<links>\d+)|(?P<level>X|PIX|PXB|PHB|NODE|SYS|SOC))$")


@dataclass(frozen=True)
class GpuLink:
    """One cell of the topology matrix: a level, plus the NVLink count for `NV#`."""

    level: TopologyLevel
    nvlinks: int = 0

    def __post_init__(self) -> None:
        if (self.level is TopologyLevel.NVLINK) != (self.nvlinks > 0):
            raise ValueError(f"nvlinks={self.nvlinks} does not fit level {self.level.value}")

    @classmethod
    def parse(cls, text: str) -> GpuLink:
        """`NV18`, `PIX`, `X`, ... (`SOC`, the pre-2017 name of SYS, is accepted too)."""
        match = _LINK_TEXT.match(text.strip())
        if match is None:
            raise ValueError(f"{text!r} is not a topology cell (X, NV#, PIX, PXB, PHB, NODE, SYS)")
        if match["links"] is not None:
            links = int(match["links"])
            if links == 0:
                raise ValueError(f"{text!r}: an NVLink bond has at least one link")
            return cls(TopologyLevel.NVLINK, links)
        level = "SYS" if match["level"] == "SOC" else match["level"]
        return cls(TopologyLevel(level))

    @property
    def rank(self) -> int:
        """0 for self, 1 for NVLink, ... 6 for SYS: lower is closer."""
        return _LEVEL_RANK[self.level]

    def __str__(self) -> str:
        return f"NV{self.nvlinks}" if self.level is TopologyLevel.NVLINK else self.level.value


@dataclass(frozen=True)
class GpuPair:
    """The relation between two GPUs of the node, by index (a < b)."""

    a: int
    b: int
    link: GpuLink


@dataclass(frozen=True)
class NvLinkPeer:
    """NVLinks from one GPU to one peer. On NVSwitch systems the peer is known only by index."""

    links: int
    peer_index: int | None = None
    peer_pci_bus_id: str | None = None
    peer_uuid: str | None = None


@dataclass(frozen=True)
class Nic:
    """A network device from `topo -m`: `label` is the column (`NIC0`), `name` the legend's
    (`mlx5_0`); `relations` maps GPU index to the PCIe relation."""

    label: str
    name: str
    pci_bus_id: str | None = None
    relations: Mapping[int, GpuLink] = field(default_factory=dict)


# --- MIG -------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Placement:
    """A GPU instance placement: `size` memory slices from `start` (nvidia-smi `{start}:size`)."""

    start: int
    size: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.size < 1:
            raise ValueError(f"bad placement {self.start}:{self.size}")

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)


@dataclass(frozen=True)
class MigMode:
    """Current and pending MIG mode; None where the GPU cannot do MIG (NVML NotSupported, `N/A`)."""

    current: bool | None = None
    pending: bool | None = None


@dataclass(frozen=True)
class MigProfile:
    """A GPU instance profile as nvmlGpuInstanceProfileInfo describes it.

    `id` is the number nvidia-smi shows (19 for 1g.5gb), `slice_count` the compute slices (the G
    of `<G>g`), `memory_mib` nvml's memorySizeMB. Engine counts are None where unknown.
    """

    name: str
    id: int
    slice_count: int
    placements: tuple[Placement, ...]
    memory_mib: int | None = None
    multiprocessors: int | None = None
    copy_engines: int | None = None
    decoders: int | None = None
    encoders: int | None = None
    jpeg_engines: int | None = None
    ofa_engines: int | None = None
    max_instances: int | None = None


@dataclass(frozen=True)
class MigDevice:
    """A MIG device that exists now. Profile and placement are None where the source lacks them
    (the XML has no placement; the profile is inferred only from a known table)."""

    gpu_instance_id: int
    compute_instance_id: int
    uuid: str | None = None
    index: int | None = None
    profile: str | None = None
    profile_id: int | None = None
    placement: Placement | None = None
    memory_bytes: int | None = None
    multiprocessors: int | None = None
    copy_engines: int | None = None
    decoders: int | None = None
    encoders: int | None = None
    jpeg_engines: int | None = None
    ofa_engines: int | None = None


# --- health ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class XidEvent:
    """`count` XID events with one `code`, the last at `timestamp` (RFC 3339, from the caller)."""

    code: int
    timestamp: str
    count: int = 1


@dataclass(frozen=True)
class EccCounts:
    """Total ECC error counts (NVML nvmlDeviceGetTotalEccErrors); None where not reported."""

    volatile_correctable: int | None = None
    volatile_uncorrectable: int | None = None
    aggregate_correctable: int | None = None
    aggregate_uncorrectable: int | None = None


@dataclass(frozen=True)
class RetiredPages:
    """Pre-Ampere page retirement: pages retired for repeated single-bit and for double-bit ECC."""

    single_bit: int | None = None
    double_bit: int | None = None
    pending: bool | None = None


@dataclass(frozen=True)
class RemappedRows:
    """Ampere+ row remapping (nvmlDeviceGetRemappedRows)."""

    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True)
class GpuHealth:
    ecc_enabled: bool | None = None
    ecc: EccCounts = EccCounts()
    retired_pages: RetiredPages | None = None
    remapped_rows: RemappedRows | None = None
    xid_events: tuple[XidEvent, ...] = ()


# --- GPUs and the node -----------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    """One physical GPU. `index` is NVML's (the XML's order); `minor` names DRA devices."""

    index: int
    uuid: str
    product_name: str
    pci_bus_id: str  # normalised, see normalize_pci_bus_id
    minor: int | None = None
    brand: str | None = None  # go-nvlib spelling: Nvidia, NvidiaRTX, Tesla, GeForce, ...
    architecture: str | None = None  # Ampere, Hopper, Turing, Ada Lovelace, ...
    pci_device_id: str | None = None  # 0x20B010DE
    pcie_root: str | None = None  # pci0000:00, from sysfs when the agent can see it
    memory_bytes: int | None = None
    cuda_compute_capability: str | None = None  # 8.0
    addressing_mode: str | None = None  # None, HMM, ATS
    mig_mode: MigMode = MigMode()
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_devices: tuple[MigDevice, ...] = ()
    nvlink_peers: tuple[NvLinkPeer, ...] = ()
    numa_node: int | None = None
    cpu_affinity: tuple[CpuRange, ...] = ()
    health: GpuHealth = GpuHealth()

    @property
    def mig_enabled(self) -> bool:
        return self.mig_mode.current is True


class ReportSource(StrEnum):
    NVML = "nvml"
    NVIDIA_SMI_XML = "nvidia-smi-xml"


@dataclass(frozen=True)
class NodeReport:
    """Everything one node's agent knows about its GPUs at `timestamp`.

    Driver and CUDA versions are system-wide in NVML (nvmlSystemGetDriverVersion), so they live
    here rather than on each GPU. `gpu_links` holds GPU-GPU relations (from NVML or `topo -m`).
    """

    node: str
    timestamp: str
    source: ReportSource
    gpus: tuple[Gpu, ...]
    driver_version: str | None = None  # 590.44.01
    cuda_driver_version: str | None = None  # 13.1
    labels: Mapping[str, str] = field(default_factory=dict)
    nics: tuple[Nic, ...] = ()
    gpu_links: tuple[GpuPair, ...] = ()

    def gpu_by_index(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)
