"""AllocationResult from the dict Kubernetes writes in a ResourceClaim's `status.allocation`.

The Redis store writes each reservation's allocations with the shared serializer
(`services.common.dra.serialize.allocation_result_to_dict`), so what sits in Redis reads like
`kubectl get resourceclaim -o json`. This is the way back. parse.py decodes the same shape but
only inside a whole ResourceClaim, whose validation cross-checks the results against the claim's
requests, which a reservation does not store; hence this small decoder of trusted data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common.dra.model import (
    AllocationResult,
    ConfigSource,
    DeviceAllocationConfiguration,
    DeviceRequestAllocationResult,
    DeviceToleration,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    OpaqueDeviceConfiguration,
    TaintEffect,
    TolerationOperator,
)
from services.common.dra.quantity import Quantity

__all__ = ["allocation_from_dict"]


def allocation_from_dict(data: Mapping[str, Any]) -> AllocationResult:
    devices = data.get("devices") or {}
    selector = data.get("nodeSelector")
    return AllocationResult(
        results=tuple(_result_from_dict(item) for item in devices.get("results") or ()),
        config=tuple(_config_from_dict(item) for item in devices.get("config") or ()),
        node_selector=_node_selector_from_dict(selector) if selector is not None else None,
    )


# --- results ----------------------------------------------------------------------------


def _result_from_dict(data: Mapping[str, Any]) -> DeviceRequestAllocationResult:
    return DeviceRequestAllocationResult(
        request=data["request"],
        driver=data["driver"],
        pool=data["pool"],
        device=data["device"],
        admin_access=data.get("adminAccess"),
        tolerations=tuple(_toleration_from_dict(item) for item in data.get("tolerations") or ()),
        share_id=data.get("shareID"),
        consumed_capacity={
            name: Quantity.parse(text)
            for name, text in (data.get("consumedCapacity") or {}).items()
        },
    )


def _toleration_from_dict(data: Mapping[str, Any]) -> DeviceToleration:
    effect = data.get("effect")
    return DeviceToleration(
        key=data.get("key", ""),
        operator=TolerationOperator(data.get("operator", TolerationOperator.EQUAL)),
        value=data.get("value", ""),
        effect=TaintEffect(effect) if effect else None,
        toleration_seconds=data.get("tolerationSeconds"),
    )


# --- config -----------------------------------------------------------------------------


def _config_from_dict(data: Mapping[str, Any]) -> DeviceAllocationConfiguration:
    opaque = data["opaque"]
    return DeviceAllocationConfiguration(
        source=ConfigSource(data["source"]),
        requests=tuple(data.get("requests") or ()),
        opaque=OpaqueDeviceConfiguration(opaque["driver"], opaque.get("parameters") or {}),
    )


# --- node selector ----------------------------------------------------------------------


def _node_selector_from_dict(data: Mapping[str, Any]) -> NodeSelector:
    def requirements(items: Any) -> tuple[NodeSelectorRequirement, ...]:
        return tuple(
            NodeSelectorRequirement(item["key"], item["operator"], tuple(item.get("values") or ()))
            for item in items or ()
        )

    return NodeSelector(
        tuple(
            NodeSelectorTerm(
                requirements(term.get("matchExpressions")), requirements(term.get("matchFields"))
            )
            for term in data.get("nodeSelectorTerms") or ()
        )
    )
