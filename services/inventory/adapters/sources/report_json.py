"""The node agent's JSON for a NodeReport: `to_json(report)` -> dict, `from_json(data)` -> report.

Format `gpualloc.io/v1` `NodeReport` (camelCase; optional fields are omitted when unknown, and
unknown fields are ignored so a newer agent can add some)::

    {"apiVersion": "gpualloc.io/v1", "kind": "NodeReport",
     "node": "n1", "timestamp": "2025-01-01T00:00:00Z", "source": "nvml" | "nvidia-smi-xml",
     "driverVersion": "590.44.01", "cudaDriverVersion": "13.1", "labels": {"k": "v"},
     "gpus": [{
        "index": 0, "uuid": "GPU-...", "productName": "NVIDIA H100 80GB HBM3",
        "pciBusID": "0000:53:00.0", "minor": 0, "brand": "Nvidia", "architecture": "Hopper",
        "pciDeviceID": "0x233010DE", "pcieRoot": "pci0000:50", "memoryBytes": 85520809984,
        "cudaComputeCapability": "9.0", "addressingMode": "None",
        "migMode": {"current": false, "pending": false},
        "migProfiles": [{"name": "1g.10gb", "id": 19, "sliceCount": 1,
                         "placements": [{"start": 0, "size": 1}], "memoryMiB": 9856,
                         "multiprocessors": 16, "copyEngines": 1, "decoders": 1, "encoders": 0,
                         "jpegEngines": 1, "ofaEngines": 0, "maxInstances": 7}],
        "migDevices": [{"gpuInstanceId": 1, "computeInstanceId": 0, "uuid": "MIG-...",
                        "index": 0, "profile": "1g.10gb", "profileId": 19,
                        "placement": {"start": 0, "size": 1}, "memoryBytes": 10468982784,
                        "multiprocessors": 16, "copyEngines": 1, ...}],
        "nvlinkPeers": [{"links": 18, "peerIndex": 1, "peerPciBusID": "...", "peerUUID": "..."}],
        "numaNode": 0, "cpuAffinity": "0-51,104-155",
        "health": {"eccEnabled": true,
                   "ecc": {"volatileCorrectable": 0, "volatileUncorrectable": 0,
                           "aggregateCorrectable": 0, "aggregateUncorrectable": 0},
                   "retiredPages": {"singleBit": 0, "doubleBit": 0, "pending": false},
                   "remappedRows": {"correctable": 0, "uncorrectable": 0,
                                    "pending": false, "failure": false},
                   "xidEvents": [{"code": 79, "timestamp": "...", "count": 1}]}}],
     "nics": [{"label": "NIC0", "name": "mlx5_0", "pciBusID": "...", "relations": {"0": "PIX"}}],
     "gpuLinks": [{"a": 0, "b": 1, "link": "NV18"}]}

`from_json` raises InvalidArgument whose field path is the JSON path, e.g.
`gpus[1].migDevices[0].placement.start`. PCI bus ids are normalised on the way in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from services.common.errors import InvalidArgument
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
    XidEvent,
    format_cpu_list,
    normalize_pci_bus_id,
    parse_cpu_list,
)

__all__ = ["API_VERSION", "KIND", "from_json", "to_json"]

API_VERSION = "gpualloc.io/v1"
KIND = "NodeReport"

Json = dict[str, Any]
T = TypeVar("T")

# (json key, attribute, type) of optional scalar fields, shared by both directions.
Spec = tuple[tuple[str, str, type], ...]
_ENGINES: Spec = (
    ("multiprocessors", "multiprocessors", int),
    ("copyEngines", "copy_engines", int),
    ("decoders", "decoders", int),
    ("encoders", "encoders", int),
    ("jpegEngines", "jpeg_engines", int),
    ("ofaEngines", "ofa_engines", int),
)
_GPU: Spec = (
    ("minor", "minor", int),
    ("brand", "brand", str),
    ("architecture", "architecture", str),
    ("pciDeviceID", "pci_device_id", str),
    ("pcieRoot", "pcie_root", str),
    ("memoryBytes", "memory_bytes", int),
    ("cudaComputeCapability", "cuda_compute_capability", str),
    ("addressingMode", "addressing_mode", str),
    ("numaNode", "numa_node", int),
)
_MIG_PROFILE: Spec = (("memoryMiB", "memory_mib", int), *_ENGINES)
_MIG_PROFILE += (("maxInstances", "max_instances", int),)
_MIG_DEVICE: Spec = (
    ("uuid", "uuid", str),
    ("index", "index", int),
    ("profile", "profile", str),
    ("profileId", "profile_id", int),
    ("memoryBytes", "memory_bytes", int),
    *_ENGINES,
)
_ECC: Spec = (
    ("volatileCorrectable", "volatile_correctable", int),
    ("volatileUncorrectable", "volatile_uncorrectable", int),
    ("aggregateCorrectable", "aggregate_correctable", int),
    ("aggregateUncorrectable", "aggregate_uncorrectable", int),
)
_RETIRED: Spec = (
    ("singleBit", "single_bit", int),
    ("doubleBit", "double_bit", int),
    ("pending", "pending", bool),
)
_MIG_MODE: Spec = (("current", "current", bool), ("pending", "pending", bool))
_PEER: Spec = (
    ("peerIndex", "peer_index", int),
    ("peerUUID", "peer_uuid", str),
)


# --- to JSON ---------------------------------------------------------------------------------


def _dump(value: object, spec: Spec) -> Json:
    out: Json = {}
    for key, attribute, _ in spec:
        item = getattr(value, attribute)
        if item is not None:
            out[key] = item
    return out


def _placement(p: Placement) -> Json:
    return {"start": p.start, "size": p.size}


def to_json(report: NodeReport) -> Json:
    """The report as a JSON-ready dict (stable key order)."""
    out: Json = {"apiVersion": API_VERSION, "kind": KIND, "node": report.node}
    out |= {"timestamp": report.timestamp, "source": report.source.value}
    if report.driver_version is not None:
        out["driverVersion"] = report.driver_version
    if report.cuda_driver_version is not None:
        out["cudaDriverVersion"] = report.cuda_driver_version
    out["labels"] = dict(sorted(report.labels.items()))
    out["gpus"] = [_gpu_json(g) for g in report.gpus]
    out["nics"] = [_nic_json(n) for n in report.nics]
    out["gpuLinks"] = [{"a": p.a, "b": p.b, "link": str(p.link)} for p in report.gpu_links]
    return out


def _gpu_json(gpu: Gpu) -> Json:
    out: Json = {"index": gpu.index, "uuid": gpu.uuid, "productName": gpu.product_name}
    out["pciBusID"] = gpu.pci_bus_id
    out |= _dump(gpu, _GPU)
    out["migMode"] = _dump(gpu.mig_mode, _MIG_MODE)
    out["migProfiles"] = [
        {"name": p.name, "id": p.id, "sliceCount": p.slice_count}
        | {"placements": [_placement(pl) for pl in p.placements]}
        | _dump(p, _MIG_PROFILE)
        for p in gpu.mig_profiles
    ]
    out["migDevices"] = [_mig_device_json(m) for m in gpu.mig_devices]
    out["nvlinkPeers"] = [_peer_json(p) for p in gpu.nvlink_peers]
    if gpu.cpu_affinity:
        out["cpuAffinity"] = format_cpu_list(gpu.cpu_affinity)
    out["health"] = _health_json(gpu.health)
    return out


def _mig_device_json(m: MigDevice) -> Json:
    out: Json = {"gpuInstanceId": m.gpu_instance_id, "computeInstanceId": m.compute_instance_id}
    out |= _dump(m, _MIG_DEVICE)
    if m.placement is not None:
        out["placement"] = _placement(m.placement)
    return out


def _peer_json(p: NvLinkPeer) -> Json:
    out: Json = {"links": p.links} | _dump(p, _PEER)
    if p.peer_pci_bus_id is not None:
        out["peerPciBusID"] = p.peer_pci_bus_id
    return out


def _health_json(h: GpuHealth) -> Json:
    out: Json = {} if h.ecc_enabled is None else {"eccEnabled": h.ecc_enabled}
    out["ecc"] = _dump(h.ecc, _ECC)
    if h.retired_pages is not None:
        out["retiredPages"] = _dump(h.retired_pages, _RETIRED)
    if h.remapped_rows is not None:
        r = h.remapped_rows
        out["remappedRows"] = {"correctable": r.correctable, "uncorrectable": r.uncorrectable}
        out["remappedRows"] |= {"pending": r.pending, "failure": r.failure}
    out["xidEvents"] = [
        {"code": e.code, "timestamp": e.timestamp, "count": e.count} for e in h.xid_events
    ]
    return out


def _nic_json(n: Nic) -> Json:
    out: Json = {"label": n.label, "name": n.name}
    if n.pci_bus_id is not None:
        out["pciBusID"] = n.pci_bus_id
    out["relations"] = {str(i): str(link) for i, link in sorted(n.relations.items())}
    return out


# --- from JSON -------------------------------------------------------------------------------


class _Obj:
    """A JSON object at `path`, read with type checks that name the offending path."""

    def __init__(self, data: object, path: str) -> None:
        if not isinstance(data, dict):
            raise InvalidArgument.at(path or "<root>", f"must be an object, got {_kind(data)}")
        self.data: Mapping[str, object] = data
        self.path = path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, expected: type[T], required: bool = False) -> T | None:
        value = self.data.get(key)
        if value is None:
            if required:
                raise InvalidArgument.at(self.at(key), "required")
            return None
        # bool is an int in Python; JSON true must not pass as a number, nor 1 as a boolean.
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise InvalidArgument.at(
                self.at(key), f"must be {expected.__name__}, got {_kind(value)}"
            )
        if expected is int and isinstance(value, int) and value < 0:
            raise InvalidArgument.at(self.at(key), f"must not be negative, got {value}")
        return value

    def need(self, key: str, expected: type[T]) -> T:
        value = self.get(key, expected, required=True)
        assert value is not None
        return value

    def obj(self, key: str) -> _Obj | None:
        value = self.data.get(key)
        return None if value is None else _Obj(value, self.at(key))

    def items(self, key: str, read: Callable[[_Obj], T]) -> tuple[T, ...]:
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise InvalidArgument.at(self.at(key), f"must be a list, got {_kind(value)}")
        return tuple(read(_Obj(item, f"{self.at(key)}[{i}]")) for i, item in enumerate(value))

    def scalars(self, spec: Spec) -> dict[str, Any]:
        return {attribute: self.get(key, kind) for key, attribute, kind in spec}

    def convert(self, key: str, parse: Callable[[str], T]) -> T | None:
        """An optional string field turned into a value by `parse` (ValueError -> this path)."""
        text = self.get(key, str)
        return None if text is None else self._parse(key, text, parse)

    def need_convert(self, key: str, parse: Callable[[str], T]) -> T:
        return self._parse(key, self.need(key, str), parse)

    def _parse(self, key: str, text: str, parse: Callable[[str], T]) -> T:
        try:
            return parse(text)
        except ValueError as error:
            raise InvalidArgument.at(self.at(key), str(error)) from None


def _kind(value: object) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number" if isinstance(value, int | float) else "value")


def from_json(data: object) -> NodeReport:
    """Validate and convert; raises InvalidArgument naming the JSON path of the first problem."""
    root = _Obj(data, "")
    for key, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
        if (value := root.need(key, str)) != expected:
            raise InvalidArgument.at(key, f"must be {expected!r}, got {value!r}")
    source = root.need("source", str)
    if source not in {s.value for s in ReportSource}:
        allowed = ", ".join(s.value for s in ReportSource)
        raise InvalidArgument.at("source", f"must be one of {allowed}, got {source!r}")
    labels = root.obj("labels")
    label_map = {k: _need_str(v, labels.at(k)) for k, v in labels.data.items()} if labels else {}
    return NodeReport(
        node=root.need("node", str),
        timestamp=root.need("timestamp", str),
        source=ReportSource(source),
        gpus=root.items("gpus", _gpu),
        driver_version=root.get("driverVersion", str),
        cuda_driver_version=root.get("cudaDriverVersion", str),
        labels=label_map,
        nics=root.items("nics", _nic),
        gpu_links=root.items("gpuLinks", _gpu_pair),
    )


def _need_str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument.at(path, f"must be string, got {_kind(value)}")
    return value


def _gpu(o: _Obj) -> Gpu:
    mig_mode = o.obj("migMode")
    health = o.obj("health")
    return Gpu(
        index=o.need("index", int),
        uuid=o.need("uuid", str),
        product_name=o.need("productName", str),
        pci_bus_id=o.need_convert("pciBusID", normalize_pci_bus_id),
        mig_mode=MigMode(**mig_mode.scalars(_MIG_MODE)) if mig_mode else MigMode(),
        mig_profiles=o.items("migProfiles", _mig_profile),
        mig_devices=o.items("migDevices", _mig_device),
        nvlink_peers=o.items("nvlinkPeers", _peer),
        cpu_affinity=o.convert("cpuAffinity", parse_cpu_list) or (),
        health=_health(health) if health else GpuHealth(),
        **o.scalars(_GPU),
    )


def _placement_from(o: _Obj) -> Placement:
    start, size = o.need("start", int), o.need("size", int)
    if size < 1:
        raise InvalidArgument.at(o.at("size"), f"must be at least 1, got {size}")
    return Placement(start, size)


def _mig_profile(o: _Obj) -> MigProfile:
    return MigProfile(
        name=o.need("name", str),
        id=o.need("id", int),
        slice_count=o.need("sliceCount", int),
        placements=o.items("placements", _placement_from),
        **o.scalars(_MIG_PROFILE),
    )


def _mig_device(o: _Obj) -> MigDevice:
    placement = o.obj("placement")
    return MigDevice(
        gpu_instance_id=o.need("gpuInstanceId", int),
        compute_instance_id=o.need("computeInstanceId", int),
        placement=_placement_from(placement) if placement else None,
        **o.scalars(_MIG_DEVICE),
    )


def _peer(o: _Obj) -> NvLinkPeer:
    links = o.need("links", int)
    return NvLinkPeer(
        links=links,
        peer_pci_bus_id=o.convert("peerPciBusID", normalize_pci_bus_id),
        **o.scalars(_PEER),
    )


def _health(o: _Obj) -> GpuHealth:
    ecc, retired, rows = o.obj("ecc"), o.obj("retiredPages"), o.obj("remappedRows")
    return GpuHealth(
        ecc_enabled=o.get("eccEnabled", bool),
        ecc=EccCounts(**ecc.scalars(_ECC)) if ecc else EccCounts(),
        retired_pages=RetiredPages(**retired.scalars(_RETIRED)) if retired else None,
        remapped_rows=_remapped_rows(rows) if rows else None,
        xid_events=o.items("xidEvents", _xid),
    )


def _remapped_rows(o: _Obj) -> RemappedRows:
    return RemappedRows(
        correctable=o.need("correctable", int),
        uncorrectable=o.need("uncorrectable", int),
        pending=o.need("pending", bool),
        failure=o.need("failure", bool),
    )


def _xid(o: _Obj) -> XidEvent:
    count = o.get("count", int)
    if count == 0:
        raise InvalidArgument.at(o.at("count"), "must be at least 1")
    return XidEvent(o.need("code", int), o.need("timestamp", str), 1 if count is None else count)


def _nic(o: _Obj) -> Nic:
    relations = o.obj("relations")
    return Nic(
        label=o.need("label", str),
        name=o.need("name", str),
        pci_bus_id=o.convert("pciBusID", normalize_pci_bus_id),
        relations=_relations(relations) if relations else {},
    )


def _relations(o: _Obj) -> dict[int, GpuLink]:
    """`{"0": "PIX"}`: GPU index (a JSON key, so a string) -> topology cell."""
    parsed = {}
    for key in o.data:
        if not isinstance(key, str) or not key.isdigit():
            raise InvalidArgument.at(o.at(str(key)), 'keys must be GPU indexes like "0"')
        parsed[int(key)] = o.need_convert(key, GpuLink.parse)
    return parsed


def _gpu_pair(o: _Obj) -> GpuPair:
    return GpuPair(o.need("a", int), o.need("b", int), o.need_convert("link", GpuLink.parse))
