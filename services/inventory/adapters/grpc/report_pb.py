"""NodeReport <-> `gpualloc.inventory.v1.NodeReport` (what ReportNode carries).

The message is narrower than the core value, so a round trip keeps what placement needs and
drops the rest, on purpose and in one place:

- unknown numbers travel as proto3 defaults: minor -1 means unknown; memory 0, ECC counts 0;
- MIG profiles keep name, id, instance count, memory, SMs and placements; the slice count comes
  back from the name (`3g.40gb` -> 3) and engine counts are lost (so the inventory models those
  counters only from its known tables);
- an XID seen `count` times travels as `count` events and comes back folded by code, with the
  latest time; timestamps without a zone (nvidia-smi's local time) are sent as UTC;
- GPU pairs travel as NVLink peers and PCIe peers; NIC labels (`NIC0`) become the NIC's name;
- the PCI device id (`0x20B010DE`) travels, so a report from saved XML (no NVML profiles) keeps
  the known-table MIG model on the way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from google.protobuf import timestamp_pb2

from protos.common.v1 import topology_pb2
from protos.inventory.v1 import inventory_pb2
from services.inventory.core.report import (
    EccCounts,
    Gpu,
    GpuHealth,
    GpuLink,
    GpuPair,
    MigDevice,
    MigMode,
    MigProfile,
    Nic,
    NodeReport,
    NvLinkPeer,
    Placement,
    RemappedRows,
    ReportSource,
    RetiredPages,
    TopologyLevel,
    XidEvent,
    format_cpu_list,
    normalize_pci_bus_id,
    parse_cpu_list,
)

__all__ = ["GpuCache", "from_pb_node_report", "to_pb_node_report"]

pb = inventory_pb2
_MIB = 2**20
_RELATIONS = {
    TopologyLevel.PIX: topology_pb2.PCIE_RELATION_PIX,
    TopologyLevel.PXB: topology_pb2.PCIE_RELATION_PXB,
    TopologyLevel.PHB: topology_pb2.PCIE_RELATION_PHB,
    TopologyLevel.NODE: topology_pb2.PCIE_RELATION_NODE,
    TopologyLevel.SYS: topology_pb2.PCIE_RELATION_SYS,
}
_LEVELS = {v: k for k, v in _RELATIONS.items()} | {
    topology_pb2.PCIE_RELATION_INTERNAL: TopologyLevel.PIX
}


# --- to protobuf -----------------------------------------------------------------------------


def to_pb_node_report(report: NodeReport) -> inventory_pb2.NodeReport:
    uuid_by_index = {g.index: g.uuid for g in report.gpus}
    return pb.NodeReport(
        node_name=report.node,
        labels=dict(report.labels),
        observed_at=_timestamp(report.timestamp),
        driver_version=report.driver_version or "",
        cuda_driver_version=report.cuda_driver_version or "",
        gpus=[_gpu_to_pb(report, g, uuid_by_index) for g in report.gpus],
        nics=[pb.NicReport(name=n.name, pci_bus_id=n.pci_bus_id or "") for n in report.nics],
        source=report.source.value,
    )


def _timestamp(text: str) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    zoned = re.search(r"(Z|[+-]\d\d:\d\d)$", text) is not None
    stamp.FromJsonString(text if zoned else text + "Z")
    return stamp


def _mig_mode(value: bool | None) -> inventory_pb2.MigMode.ValueType:
    if value is None:
        return pb.MIG_MODE_NOT_SUPPORTED
    return pb.MIG_MODE_ENABLED if value else pb.MIG_MODE_DISABLED


def _gpu_to_pb(
    report: NodeReport, gpu: Gpu, uuid_by_index: dict[int, str]
) -> inventory_pb2.GpuReport:
    message = pb.GpuReport(
        uuid=gpu.uuid,
        name=gpu.product_name,
        pci_bus_id=gpu.pci_bus_id,
        minor_number=-1 if gpu.minor is None else gpu.minor,
        index=gpu.index,
        brand=gpu.brand or "",
        architecture=gpu.architecture or "",
        cuda_compute_capability=gpu.cuda_compute_capability or "",
        memory_bytes=gpu.memory_bytes or 0,
        mig_mode=_mig_mode(gpu.mig_mode.current),
        mig_mode_pending=_mig_mode(gpu.mig_mode.pending),
        mig_devices=[_mig_device_to_pb(m) for m in gpu.mig_devices],
        mig_profiles=[_mig_profile_to_pb(p) for p in gpu.mig_profiles],
        nvlink_peers=[
            pb.NvlinkPeer(
                peer_uuid=p.peer_uuid or uuid_by_index.get(p.peer_index or -1, ""),
                peer_pci_bus_id=p.peer_pci_bus_id or "",
                link_count=p.links,
            )
            for p in gpu.nvlink_peers
        ],
        pcie_peers=list(_pcie_peers(report, gpu, uuid_by_index)),
        pcie_root=gpu.pcie_root or "",
        cpu_affinity=format_cpu_list(gpu.cpu_affinity),
        addressing_mode=gpu.addressing_mode or "",
        health=_health_to_pb(gpu.health),
        pci_device_id=gpu.pci_device_id or "",
    )
    if gpu.numa_node is not None:
        message.numa_node = gpu.numa_node
    return message


def _pcie_peers(
    report: NodeReport, gpu: Gpu, uuid_by_index: dict[int, str]
) -> Iterable[inventory_pb2.PciePeer]:
    for pair in report.gpu_links:
        other = pair.b if pair.a == gpu.index else pair.a if pair.b == gpu.index else None
        if other is not None and pair.link.level in _RELATIONS:
            yield pb.PciePeer(gpu_uuid=uuid_by_index[other], relation=_RELATIONS[pair.link.level])
    for nic in report.nics:
        link = nic.relations.get(gpu.index)
        if link is not None and link.level in _RELATIONS:
            yield pb.PciePeer(nic_name=nic.name, relation=_RELATIONS[link.level])


def _placement_to_pb(placement: Placement) -> inventory_pb2.MigPlacement:
    return pb.MigPlacement(start=placement.start, size=placement.size)


def _mig_device_to_pb(m: MigDevice) -> inventory_pb2.MigDevice:
    message = pb.MigDevice(
        uuid=m.uuid or "",
        profile=m.profile or "",
        gpu_instance_profile_id=m.profile_id or 0,
        gpu_instance_id=m.gpu_instance_id,
        compute_instance_id=m.compute_instance_id,
        memory_bytes=m.memory_bytes or 0,
        multiprocessors=m.multiprocessors or 0,
        copy_engines=m.copy_engines or 0,
        decoders=m.decoders or 0,
        encoders=m.encoders or 0,
        jpeg_engines=m.jpeg_engines or 0,
        ofa_engines=m.ofa_engines or 0,
    )
    if m.placement is not None:
        message.placement.CopyFrom(_placement_to_pb(m.placement))
    return message


def _mig_profile_to_pb(p: MigProfile) -> inventory_pb2.MigProfileInfo:
    return pb.MigProfileInfo(
        profile=p.name,
        gpu_instance_profile_id=p.id,
        instance_count=p.max_instances or 0,
        memory_bytes=(p.memory_mib or 0) * _MIB,
        multiprocessors=p.multiprocessors or 0,
        placements=[_placement_to_pb(pl) for pl in p.placements],
    )


def _health_to_pb(h: GpuHealth) -> inventory_pb2.GpuHealth:
    message = pb.GpuHealth(
        xid_events=[
            pb.XidEvent(xid=e.code, observed_at=_timestamp(e.timestamp))
            for e in h.xid_events
            for _ in range(e.count)
        ],
        ecc=pb.EccCounts(
            enabled=bool(h.ecc_enabled),
            volatile_corrected=h.ecc.volatile_correctable or 0,
            volatile_uncorrected=h.ecc.volatile_uncorrectable or 0,
            aggregate_corrected=h.ecc.aggregate_correctable or 0,
            aggregate_uncorrected=h.ecc.aggregate_uncorrectable or 0,
        ),
    )
    if h.retired_pages is not None:
        r = h.retired_pages
        message.retired_pages.CopyFrom(
            pb.RetiredPages(
                single_bit=r.single_bit or 0, double_bit=r.double_bit or 0, pending=bool(r.pending)
            )
        )
    if h.remapped_rows is not None:
        rows = h.remapped_rows
        message.remapped_rows.CopyFrom(
            pb.RemappedRows(
                correctable=rows.correctable,
                uncorrectable=rows.uncorrectable,
                pending=rows.pending,
                failure=rows.failure,
            )
        )
    return message


# --- from protobuf ---------------------------------------------------------------------------


@dataclass
class GpuCache:
    """The decoded GPUs of one node's previous report, by their wire bytes. Periodic reports
    repeat most GPUs unchanged; with a cache those decode to the very same Gpu objects (cheap
    to compare and to merge). Valid while the node's set of GPUs (UUID -> index) stays; both
    are replaced together, in one assignment, so concurrent reports of a node stay correct."""

    entry: tuple[dict[str, int], dict[bytes, Gpu]] = field(default_factory=lambda: ({}, {}))


def from_pb_node_report(
    message: inventory_pb2.NodeReport, cache: GpuCache | None = None
) -> NodeReport:
    """The core value; raises ValueError for a bad PCI bus id or CPU list (callers map it to
    InvalidArgument with their field path). `cache`: the node's GpuCache, updated."""
    index_by_uuid = {g.uuid: g.index for g in message.gpus}
    if cache is None:
        gpus = tuple(_resolve_peers(_gpu_from_pb(g), index_by_uuid) for g in message.gpus)
    else:
        gpus = _cached_gpus(message, index_by_uuid, cache)
    sources = {s.value for s in ReportSource}
    return NodeReport(
        node=message.node_name,
        timestamp=message.observed_at.ToJsonString(),
        source=ReportSource(message.source) if message.source in sources else ReportSource.NVML,
        gpus=gpus,
        driver_version=message.driver_version or None,
        cuda_driver_version=message.cuda_driver_version or None,
        labels=dict(sorted(message.labels.items())),
        nics=_nics_from_pb(message),
        gpu_links=_pairs_from_pb(message, gpus, index_by_uuid),
    )


def _cached_gpus(
    message: inventory_pb2.NodeReport, index_by_uuid: dict[str, int], cache: GpuCache
) -> tuple[Gpu, ...]:
    cached_index, cached_gpus = cache.entry
    previous = cached_gpus if cached_index == index_by_uuid else {}
    current: dict[bytes, Gpu] = {}
    raws = [g.SerializeToString(deterministic=True) for g in message.gpus]
    for g, raw in zip(message.gpus, raws, strict=True):
        gpu = previous.get(raw) or current.get(raw)
        current[raw] = gpu or _resolve_peers(_gpu_from_pb(g), index_by_uuid)
    cache.entry = (index_by_uuid, current)
    return tuple(current[raw] for raw in raws)


def _mode(value: inventory_pb2.MigMode.ValueType) -> bool | None:
    if value == pb.MIG_MODE_ENABLED:
        return True
    return False if value == pb.MIG_MODE_DISABLED else None


def _gpu_from_pb(g: inventory_pb2.GpuReport) -> Gpu:
    return Gpu(
        index=g.index,
        uuid=g.uuid,
        product_name=g.name,
        pci_bus_id=normalize_pci_bus_id(g.pci_bus_id),
        minor=g.minor_number if g.minor_number >= 0 else None,
        brand=g.brand or None,
        architecture=g.architecture or None,
        pcie_root=g.pcie_root or None,
        memory_bytes=g.memory_bytes or None,
        cuda_compute_capability=g.cuda_compute_capability or None,
        addressing_mode=g.addressing_mode or None,
        mig_mode=MigMode(_mode(g.mig_mode), _mode(g.mig_mode_pending)),
        mig_profiles=tuple(_mig_profile_from_pb(p) for p in g.mig_profiles),
        mig_devices=tuple(_mig_device_from_pb(m) for m in g.mig_devices),
        nvlink_peers=tuple(
            NvLinkPeer(
                links=p.link_count,
                peer_pci_bus_id=normalize_pci_bus_id(p.peer_pci_bus_id)
                if p.peer_pci_bus_id
                else None,
                peer_uuid=p.peer_uuid or None,
            )
            for p in g.nvlink_peers
        ),
        numa_node=g.numa_node if g.HasField("numa_node") else None,
        cpu_affinity=parse_cpu_list(g.cpu_affinity),
        health=_health_from_pb(g.health),
        pci_device_id=g.pci_device_id or None,
    )


def _resolve_peers(gpu: Gpu, index_by_uuid: dict[str, int]) -> Gpu:
    peers = tuple(
        NvLinkPeer(p.links, index_by_uuid.get(p.peer_uuid or ""), p.peer_pci_bus_id, p.peer_uuid)
        for p in gpu.nvlink_peers
    )
    return replace(gpu, nvlink_peers=peers)


def _placement(p: inventory_pb2.MigPlacement) -> Placement:
    return Placement(p.start, p.size)


def _mig_profile_from_pb(p: inventory_pb2.MigProfileInfo) -> MigProfile:
    slices = re.search(r"(?:^|\.)(\d+)g\.", p.profile)
    return MigProfile(
        name=p.profile,
        id=p.gpu_instance_profile_id,
        slice_count=int(slices[1]) if slices else 0,
        placements=tuple(_placement(pl) for pl in p.placements),
        memory_mib=p.memory_bytes // _MIB or None,
        multiprocessors=p.multiprocessors or None,
        max_instances=p.instance_count or None,
    )


def _mig_device_from_pb(m: inventory_pb2.MigDevice) -> MigDevice:
    return MigDevice(
        gpu_instance_id=m.gpu_instance_id,
        compute_instance_id=m.compute_instance_id,
        uuid=m.uuid or None,
        profile=m.profile or None,
        profile_id=m.gpu_instance_profile_id if m.profile else None,
        placement=_placement(m.placement) if m.HasField("placement") else None,
        memory_bytes=m.memory_bytes or None,
        multiprocessors=m.multiprocessors or None,
        copy_engines=m.copy_engines,
        decoders=m.decoders,
        encoders=m.encoders,
        jpeg_engines=m.jpeg_engines,
        ofa_engines=m.ofa_engines,
    )


def _health_from_pb(h: inventory_pb2.GpuHealth) -> GpuHealth:
    events: dict[int, XidEvent] = {}
    for event in h.xid_events:
        seen = events.get(event.xid)
        stamp = event.observed_at.ToJsonString()
        count = seen.count + 1 if seen else 1
        latest = max(stamp, seen.timestamp) if seen else stamp
        events[event.xid] = XidEvent(event.xid, latest, count)
    pages, rows = h.retired_pages, h.remapped_rows
    return GpuHealth(
        ecc_enabled=h.ecc.enabled,
        ecc=EccCounts(
            h.ecc.volatile_corrected,
            h.ecc.volatile_uncorrected,
            h.ecc.aggregate_corrected,
            h.ecc.aggregate_uncorrected,
        ),
        retired_pages=RetiredPages(pages.single_bit, pages.double_bit, pages.pending)
        if h.HasField("retired_pages")
        else None,
        remapped_rows=RemappedRows(rows.correctable, rows.uncorrectable, rows.pending, rows.failure)
        if h.HasField("remapped_rows")
        else None,
        xid_events=tuple(events[code] for code in sorted(events)),
    )


def _nics_from_pb(message: inventory_pb2.NodeReport) -> tuple[Nic, ...]:
    relations: dict[str, dict[int, GpuLink]] = {n.name: {} for n in message.nics}
    for gpu in message.gpus:
        for peer in gpu.pcie_peers:
            if peer.WhichOneof("peer") == "nic_name" and peer.relation in _LEVELS:
                relations.setdefault(peer.nic_name, {})[gpu.index] = GpuLink(_LEVELS[peer.relation])
    return tuple(
        Nic(
            n.name,
            n.name,
            normalize_pci_bus_id(n.pci_bus_id) if n.pci_bus_id else None,
            relations[n.name],
        )
        for n in message.nics
    )


def _pairs_from_pb(
    message: inventory_pb2.NodeReport, gpus: tuple[Gpu, ...], index_by_uuid: dict[str, int]
) -> tuple[GpuPair, ...]:
    pairs: dict[tuple[int, int], GpuLink] = {}
    for gpu in gpus:
        for peer in gpu.nvlink_peers:
            if peer.peer_index is not None and peer.peer_index != gpu.index:
                key = (min(gpu.index, peer.peer_index), max(gpu.index, peer.peer_index))
                pairs[key] = GpuLink(TopologyLevel.NVLINK, peer.links)
    for g in message.gpus:
        for pcie in g.pcie_peers:
            other = (
                index_by_uuid.get(pcie.gpu_uuid) if pcie.WhichOneof("peer") == "gpu_uuid" else None
            )
            if other is not None and pcie.relation in _LEVELS:
                key = (min(g.index, other), max(g.index, other))
                pairs.setdefault(key, GpuLink(_LEVELS[pcie.relation]))
    return tuple(GpuPair(a, b, link) for (a, b), link in sorted(pairs.items()))
