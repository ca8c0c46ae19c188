"""The inventory state as JSON, for the snapshot file and the Redis hashes.

Slices and Nodes are stored exactly as `kubectl get -o json` prints them
(services.common.dra.serialize) and read back with the same parser that reads user input, so a
stored object is a valid object. Reports are stored in the agent's JSON format
(adapters/sources/report_json.py) with the inventory's bookkeeping around them. Views are not
stored: they are rebuilt from these parts on load.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from services.common.dra.model import Node, ResourceSlice
from services.common.dra.parse import decode_object
from services.common.dra.serialize import node_to_dict, resource_slice_to_dict
from services.common.errors import InvalidArgument
from services.inventory.adapters.sources.report_json import from_json, to_json
from services.inventory.core.state import InventoryState, restore
from services.inventory.core.view import ReportRecord

__all__ = [
    "SNAPSHOT_FORMAT",
    "decode_node",
    "decode_record",
    "decode_slice",
    "encode_node",
    "encode_record",
    "encode_slice",
    "state_from_json",
    "state_to_json",
]

SNAPSHOT_FORMAT = "gpualloc.io/inventory-snapshot/v1"


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def encode_slice(resource_slice: ResourceSlice) -> str:
    return _dumps(resource_slice_to_dict(resource_slice))


def decode_slice(text: str | bytes, source: str) -> ResourceSlice:
    return _slice(json.loads(text), source)


def _slice(data: Mapping[str, Any], source: str) -> ResourceSlice:
    obj = decode_object(data, source)
    if not isinstance(obj, ResourceSlice):
        raise InvalidArgument.at(source, f"expected a ResourceSlice, got {type(obj).__name__}")
    return obj


def encode_node(node: Node) -> str:
    return _dumps(node_to_dict(node))


def decode_node(text: str | bytes, source: str) -> Node:
    return _node(json.loads(text), source)


def _node(data: Mapping[str, Any], source: str) -> Node:
    obj = decode_object(data, source)
    if not isinstance(obj, Node):
        raise InvalidArgument.at(source, f"expected a Node, got {type(obj).__name__}")
    return obj


def _record_dict(record: ReportRecord) -> dict[str, Any]:
    return {
        "report": to_json(record.report),
        "observedAt": record.observed_at,
        "poolGeneration": record.pool_generation,
        "staleSince": record.stale_since,
    }


def _record_from_dict(data: Mapping[str, Any]) -> ReportRecord:
    return ReportRecord(
        report=from_json(data["report"]),
        observed_at=float(data["observedAt"]),
        pool_generation=int(data["poolGeneration"]),
        stale_since=data.get("staleSince"),
    )


def encode_record(record: ReportRecord) -> str:
    return _dumps(_record_dict(record))


def decode_record(text: str | bytes) -> ReportRecord:
    return _record_from_dict(json.loads(text))


def state_to_json(state: InventoryState) -> dict[str, Any]:
    """The whole state as one JSON document (the embedded repository's snapshot file)."""
    entries = [state.entries[key] for key in sorted(state.entries)]
    return {
        "format": SNAPSHOT_FORMAT,
        "generation": state.generation,
        "slices": [
            resource_slice_to_dict(e.slices[name]) for e in entries for name in sorted(e.slices)
        ],
        "nodes": [node_to_dict(e.node) for e in entries if e.node is not None],
        "reports": [_record_dict(e.record) for e in entries if e.record is not None],
    }


def state_from_json(data: Mapping[str, Any], source: str) -> InventoryState:
    if data.get("format") != SNAPSHOT_FORMAT:
        raise InvalidArgument.at(f"{source}: format", f"must be {SNAPSHOT_FORMAT!r}")
    slices = [_slice(s, f"{source}: slices[{i}]") for i, s in enumerate(data["slices"])]
    nodes = [_node(n, f"{source}: nodes[{i}]") for i, n in enumerate(data["nodes"])]
    records = [_record_from_dict(r) for r in data["reports"]]
    return restore(int(data["generation"]), slices, nodes, records)
