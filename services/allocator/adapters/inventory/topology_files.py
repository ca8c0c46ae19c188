"""The `gpualloc.io/v1alpha1 NodeTopology` object: how one node's GPUs are wired, in YAML/JSON.

    apiVersion: gpualloc.io/v1alpha1
    kind: NodeTopology
    metadata:
      name: h100-node-1            # the node
    spec:
      driver: gpu.nvidia.com       # default; the GPUs' DRA driver
      pool: h100-node-1            # default: the node's name
      gpus:                        # the node's whole-GPU devices
      - {device: gpu-0, numaNode: 0, pcieRoot: "pci0000:15", pcieSwitch: sw-0}
      nvswitch: {links: 18}        # every pair of the GPUs above: NV18 (an NVSwitch system)
      nvlinks:                     # or pairs one by one (both may be given)
      - {between: [gpu-0, gpu-1], links: 12}
      nics:                        # relations follow: same switch PIX, same root PHB,
      - {name: mlx5_0, pcieSwitch: sw-0, pcieRoot: "pci0000:15", numaNode: 0}  # NUMA NODE
      nicRelations:                # or stated (they win), e.g. from `nvidia-smi topo -m`
      - {gpu: gpu-0, nic: mlx5_0, relation: PIX}

MIG devices need no entry: `gpu-0-mig-...` stands where `gpu-0` stands (topology.py). Files
hold NodeTopology documents only (kept apart from Kubernetes objects by `split_topologies`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from services.allocator.core import NicInfo, NodeTopology, PcieRelation
from services.common.dra.parse import Where, read_documents, read_text
from services.common.errors import InvalidArgument
from services.common.manifests import expand_paths

__all__ = ["API_VERSION", "KIND", "parse_node_topology", "split_topologies"]

API_VERSION = "gpualloc.io/v1alpha1"
KIND = "NodeTopology"
_DRIVER = "gpu.nvidia.com"


def split_topologies(paths: Iterable[str]) -> tuple[list[str], dict[str, NodeTopology]]:
    """The paths holding Kubernetes objects, and the topologies (by node) of the files that
    hold NodeTopology documents. A file must not mix the two."""
    others: list[str] = []
    topologies: dict[str, NodeTopology] = {}
    for path in expand_paths(paths):
        if path == "-":
            others.append(path)
            continue
        text = read_text(path)
        if KIND not in text:
            others.append(path)
            continue
        documents = [(n, d) for n, d in read_documents(text, path) if d is not None]
        kinds = [isinstance(d, dict) and d.get("kind") == KIND for _, d in documents]
        if not any(kinds):
            others.append(path)
            continue
        if not all(kinds):
            raise InvalidArgument(f"{path}: keep NodeTopology objects in files of their own")
        for number, document in documents:
            name, topology = _located_topology(document, Where(path, text, number))
            topologies[name] = topology
    return others, topologies


def _located_topology(document: Any, where: Where) -> tuple[str, NodeTopology]:
    """`parse_node_topology`, its error worded as decoding errors are: `file:line: document N
    (NodeTopology "name"): path: detail`."""
    try:
        return parse_node_topology(document)
    except InvalidArgument as error:
        metadata = document.get("metadata")
        name = metadata.get("name") if isinstance(metadata, dict) else None
        where.kind, where.name = KIND, name if isinstance(name, str) else ""
        raise where.fail(list(error.violations)) from None


def parse_node_topology(document: Mapping[str, Any], where: str = "") -> tuple[str, NodeTopology]:
    """(node name, topology) of one decoded NodeTopology object."""
    prefix = f"{where}: " if where else ""

    def invalid(path: str, detail: str) -> InvalidArgument:
        return InvalidArgument.at(path, f"{prefix}{detail}")

    if document.get("apiVersion") != API_VERSION:
        raise invalid("apiVersion", f"must be {API_VERSION}")
    name = _mapping(document.get("metadata"), "metadata", invalid).get("name")
    if not isinstance(name, str) or not name:
        raise invalid("metadata.name", "the node's name is required")
    spec = _mapping(document.get("spec"), "spec", invalid)
    gpus = _list(spec.get("gpus", []), "spec.gpus", invalid)
    names: list[str] = []
    numa: dict[str, int] = {}
    roots: dict[str, str] = {}
    switches: dict[str, str] = {}
    for i, raw in enumerate(gpus):
        gpu = _mapping(raw, f"spec.gpus[{i}]", invalid)
        device = gpu.get("device")
        if not isinstance(device, str) or not device:
            raise invalid(f"spec.gpus[{i}].device", "the GPU's DRA device name is required")
        names.append(device)
        if "numaNode" in gpu:
            numa[device] = _int(gpu["numaNode"], f"spec.gpus[{i}].numaNode", invalid)
        if "pcieRoot" in gpu:
            roots[device] = str(gpu["pcieRoot"])
        if "pcieSwitch" in gpu:
            switches[device] = str(gpu["pcieSwitch"])
    links = _nvlinks(spec, names, invalid)
    nics = [
        _nic(_mapping(raw, f"spec.nics[{i}]", invalid), f"spec.nics[{i}]", invalid)
        for i, raw in enumerate(_list(spec.get("nics", []), "spec.nics", invalid))
    ]
    relations = _relations(spec, invalid)
    topology = NodeTopology.build(
        driver=str(spec.get("driver", _DRIVER)),
        pool=str(spec.get("pool", name)),
        nvlinks=links,
        numa=numa,
        pcie_roots=roots,
        pcie_switches=switches,
        nics=nics,
        relations=relations,
        gpus=names,
    )
    return name, topology


def _nvlinks(spec: Mapping[str, Any], names: list[str], invalid: Any) -> dict[tuple[str, str], int]:
    links: dict[tuple[str, str], int] = {}
    if "nvswitch" in spec:
        count = _int(
            _mapping(spec["nvswitch"], "spec.nvswitch", invalid).get("links"),
            "spec.nvswitch.links",
            invalid,
        )
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                links[(a, b)] = count
    for i, raw in enumerate(_list(spec.get("nvlinks", []), "spec.nvlinks", invalid)):
        link = _mapping(raw, f"spec.nvlinks[{i}]", invalid)
        between = link.get("between")
        if (
            not isinstance(between, list)
            or len(between) != 2
            or not all(isinstance(d, str) for d in between)
        ):
            raise invalid(f"spec.nvlinks[{i}].between", "must name two GPU devices")
        links[(between[0], between[1])] = _int(
            link.get("links"), f"spec.nvlinks[{i}].links", invalid
        )
    return links


def _nic(nic: Mapping[str, Any], path: str, invalid: Any) -> NicInfo:
    name = nic.get("name")
    if not isinstance(name, str) or not name:
        raise invalid(f"{path}.name", "the NIC's name is required")
    numa = _int(nic["numaNode"], f"{path}.numaNode", invalid) if "numaNode" in nic else None
    switch = str(nic["pcieSwitch"]) if "pcieSwitch" in nic else None
    root = str(nic["pcieRoot"]) if "pcieRoot" in nic else None
    return NicInfo(name, switch=switch, pcie_root=root, numa=numa)


def _relations(spec: Mapping[str, Any], invalid: Any) -> dict[tuple[str, str], PcieRelation]:
    relations: dict[tuple[str, str], PcieRelation] = {}
    for i, raw in enumerate(_list(spec.get("nicRelations", []), "spec.nicRelations", invalid)):
        item = _mapping(raw, f"spec.nicRelations[{i}]", invalid)
        gpu, nic = item.get("gpu"), item.get("nic")
        if not isinstance(gpu, str) or not isinstance(nic, str):
            raise invalid(f"spec.nicRelations[{i}]", "gpu and nic are required")
        try:
            relations[(gpu, nic)] = PcieRelation.parse(str(item.get("relation", "")))
        except ValueError as err:
            raise invalid(f"spec.nicRelations[{i}].relation", str(err)) from None
    return relations


def _mapping(value: Any, path: str, invalid: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise invalid(path, "must be a mapping")
    return value


def _list(value: Any, path: str, invalid: Any) -> list[Any]:
    if not isinstance(value, list):
        raise invalid(path, "must be a list")
    return value


def _int(value: Any, path: str, invalid: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise invalid(path, "must be a non-negative integer")
    return value
