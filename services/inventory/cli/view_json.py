"""The inventory as JSON, as Kubernetes objects and as a readable table (what `gpualloc
inventory` prints).

Objects (`inventory_objects`): a `v1 List` of the Nodes, then every ResourceSlice the
inventory publishes (node by node, then those of no single node), as kubectl prints them.

JSON::

    {"generation": N,
     "nodes": [{"name", "labels", "reportedAt",
                "devices": [{"name", "driver", "pool", "source", "attributes": {name: {string|int|
                             bool|version: v}}, "capacity": {name: {"value"}}, "consumesCounters",
                             "taints"}],
                "counterSets": [{"driver", "pool", "name", "counters": {name: {"value"}}}],
                "pools": [{"driver", "pool", "generation", "resourceSliceCount", "slices",
                           "complete"}],
                "topology": {"gpus": [...], "nvlink": [{"a", "b", "links"}],
                             "pcie": [{"a", "b", "relation"}], "numa": [...], "nics": [...]}}],
     "clusterSlices": [ResourceSlice, ...]}       # only when some slices are not node-local

In `topology`, a GPU is named by its full-GPU DRA device (`driver/pool/device`) when it has one,
else by its UUID (a MIG-enabled GPU exposes only partitions).
"""

from __future__ import annotations

from typing import Any

from services.common.dra.serialize import device_to_dict, node_to_dict, resource_slice_to_dict
from services.inventory.core.state import CLUSTER_SCOPE, InventoryState
from services.inventory.core.topology_view import NodeTopology
from services.inventory.core.view import NodeView

__all__ = [
    "inventory_objects",
    "inventory_text",
    "inventory_to_json",
    "node_to_json",
    "topology_to_json",
]

JSON = dict[str, Any]


def inventory_to_json(state: InventoryState) -> JSON:
    nodes = []
    for key in sorted(state.node_keys() - {CLUSTER_SCOPE}):
        view = state.view(key)
        if view is not None:
            nodes.append(node_to_json(view))
    data: JSON = {"generation": state.generation, "nodes": nodes}
    cluster = state.slices_of(CLUSTER_SCOPE)
    if cluster:
        data["clusterSlices"] = [resource_slice_to_dict(s) for s in cluster]
    return data


def inventory_objects(state: InventoryState) -> JSON:
    """The Nodes and effective ResourceSlices as one `List`: what `solve -f` / `apply -f` read."""
    views = [state.view(key) for key in sorted(state.node_keys() - {CLUSTER_SCOPE})]
    nodes = [v for v in views if v is not None]
    items = [node_to_dict(v.node) for v in nodes]
    items += [resource_slice_to_dict(s) for v in nodes for s in v.slices]
    items += [resource_slice_to_dict(s) for s in state.slices_of(CLUSTER_SCOPE)]
    return {"apiVersion": "v1", "kind": "List", "items": items}


def node_to_json(view: NodeView) -> JSON:
    data: JSON = {"name": view.name, "labels": dict(sorted(view.node.labels.items()))}
    if view.reported_at is not None:
        data["reportedAt"] = view.reported_at
    data["devices"] = [
        {"driver": d.id.driver, "pool": d.id.pool, "source": d.source.value}
        | device_to_dict(d.device)
        for d in view.devices
    ]
    data["counterSets"] = [
        {
            "driver": c.driver,
            "pool": c.pool,
            "name": c.counter_set.name,
            "counters": {k: {"value": str(v)} for k, v in c.counter_set.counters.items()},
        }
        for c in view.counter_sets
    ]
    data["pools"] = [
        {
            "driver": p.driver,
            "pool": p.pool,
            "generation": p.generation,
            "resourceSliceCount": p.resource_slice_count,
            "slices": p.slices,
            "complete": p.complete,
        }
        for p in view.pools
    ]
    if view.topology is not None:
        data["topology"] = topology_to_json(view.topology)
    if view.warnings:
        data["warnings"] = list(view.warnings)
    return data


def _gpu_names(topology: NodeTopology) -> dict[str, str]:
    return {g.uuid: str(g.device) if g.device is not None else g.uuid for g in topology.gpus}


def _pair(a: str, b: str) -> JSON:
    return {"a": min(a, b), "b": max(a, b)}


def topology_to_json(topology: NodeTopology) -> JSON:
    name = _gpu_names(topology)
    return {
        "gpus": [
            {
                "uuid": g.uuid,
                "index": g.index,
                "device": str(g.device) if g.device is not None else None,
                "partitions": [str(p) for p in g.partitions],
                "pciBusID": g.pci_bus_id,
                "pcieRoot": g.pcie_root,
                "numaNode": g.numa_node,
                "cpuAffinity": g.cpu_affinity,
            }
            for g in topology.gpus
        ],
        "nvlink": sorted(
            (_pair(name[e.a], name[e.b]) | {"links": e.links} for e in topology.nvlink),
            key=lambda e: (e["a"], e["b"]),
        ),
        "pcie": sorted(
            (
                (_pair(name[e.a], name[e.b]) if e.b in name else {"a": name[e.a], "b": e.b})
                | {"relation": e.relation.value}
                for e in topology.pcie
            ),
            key=lambda e: (e["a"], e["b"]),
        ),
        "numa": [
            {"id": n.id, "cpus": n.cpus, "gpus": [name[g] for g in n.gpus], "nics": list(n.nics)}
            for n in topology.numa
        ],
        "nics": [{"name": n.name, "pciBusID": n.pci_bus_id} for n in topology.nics],
    }


# --- text ------------------------------------------------------------------------------------


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def _value(device: JSON, name: str) -> str:
    attribute = device.get("attributes", {}).get(name)
    return str(next(iter(attribute.values()))) if attribute else "-"


def _node_text(view: NodeView) -> list[str]:
    lines = [f"NODE {view.name}"]
    labels = ", ".join(f"{k}={v}" for k, v in sorted(view.node.labels.items()))
    if labels:
        lines.append("  labels: " + (labels if len(labels) <= 96 else labels[:95] + "…"))
    if not view.devices:
        lines.append("  (no devices)")
    rows = [["DEVICE", "POOL", "TYPE", "PRODUCT", "MEMORY", "SOURCE", "TAINTS"]]
    for d in view.devices:
        memory = d.device.capacity.get("memory")
        taints = ",".join(f"{t.key}={t.value}:{t.effect.value}" for t in d.device.taints)
        shown = device_to_dict(d.device)
        rows.append(
            [
                d.id.device,
                f"{d.id.driver}/{d.id.pool}",
                _value(shown, "type"),
                _value(shown, "productName"),
                str(memory.value) if memory is not None else "-",
                d.source.value,
                taints or "-",
            ]
        )
    if view.devices:
        lines.extend("  " + line for line in _table(rows))
    if view.topology is not None and view.topology.gpus:
        lines.append("  topology:")
        lines.extend("    " + line for line in _table(_matrix(view.topology)))
    lines.extend(f"  warning: {w}" for w in view.warnings)
    return lines


def _matrix(topology: NodeTopology) -> list[list[str]]:
    """GPU x GPU (and GPU x NIC) cells as `nvidia-smi topo -m` prints them."""
    gpus = sorted(topology.gpus, key=lambda g: g.index)
    nvlink = {(e.a, e.b): f"NV{e.links}" for e in topology.nvlink}
    pcie = {(e.a, e.b): e.relation.value for e in topology.pcie}
    nics = [n.name for n in topology.nics]
    numa = {g: str(n.id) for n in topology.numa for g in n.gpus}
    header = ["", *(f"GPU{g.index}" for g in gpus), *nics, "CPU Affinity", "NUMA"]
    rows = [header]
    for a in gpus:
        cells = []
        for b in gpus:
            key = (min(a.uuid, b.uuid), max(a.uuid, b.uuid))
            cells.append("X" if a is b else nvlink.get(key) or pcie.get(key) or "-")
        cells.extend(pcie.get((a.uuid, nic), "-") for nic in nics)
        rows.append([f"GPU{a.index}", *cells, a.cpu_affinity or "-", numa.get(a.uuid, "-")])
    return rows


def inventory_text(state: InventoryState) -> str:
    lines = [f"generation {state.generation}"]
    for key in sorted(state.node_keys() - {CLUSTER_SCOPE}):
        view = state.view(key)
        if view is not None:
            lines.append("")
            lines.extend(_node_text(view))
    cluster = state.slices_of(CLUSTER_SCOPE)
    if cluster:
        lines.append("")
        lines.append(f"cluster-wide slices: {', '.join(s.name for s in cluster)}")
    return "\n".join(lines) + "\n"
