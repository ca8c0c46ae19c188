"""Model -> plain dicts in the Kubernetes JSON shape (camelCase, empty and unset fields omitted).

The output is what `kubectl get -o json` would print for the modelled fields, so `json.dumps`
or `yaml.safe_dump` of it can be applied with kubectl, and parse.py reads it back:
`decode_object(to_dict(x)) == x` for every valid object. Quantities print as upstream's
`String()`. Defaults the API server fills in (allocationMode, count of ExactCount requests,
toleration operator) are written out, as kubectl shows them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from services.common.dra.model import (
    AllocationMode,
    AllocationResult,
    AttributeValue,
    CapacityRequestPolicy,
    CapacityRequirements,
    Device,
    DeviceCapacity,
    DeviceClass,
    DeviceRequest,
    DeviceRequestAllocationResult,
    DeviceSelector,
    DeviceSubRequest,
    DeviceTaint,
    DeviceToleration,
    ExactDeviceRequest,
    Node,
    NodeSelector,
    NodeSelectorRequirement,
    OpaqueDeviceConfiguration,
    ResourceClaim,
    ResourceSlice,
)
from services.common.dra.quantity import Quantity

__all__ = [
    "allocation_result_to_dict",
    "device_class_to_dict",
    "device_to_dict",
    "node_selector_to_dict",
    "node_to_dict",
    "plain_result",
    "resource_claim_to_dict",
    "resource_slice_to_dict",
    "to_dict",
]

_RESOURCE_V1 = "resource.k8s.io/v1"
JSON = dict[str, Any]


def to_dict(obj: ResourceSlice | DeviceClass | ResourceClaim | Node) -> JSON:
    """Any top-level object; see the specific functions."""
    if isinstance(obj, ResourceSlice):
        return resource_slice_to_dict(obj)
    if isinstance(obj, DeviceClass):
        return device_class_to_dict(obj)
    if isinstance(obj, ResourceClaim):
        return resource_claim_to_dict(obj)
    return node_to_dict(obj)


def _compact(**fields: Any) -> JSON:
    """Drop unset (None), false and empty fields, as the API's `omitempty` does."""
    return {key: value for key, value in fields.items() if not _omitted(value)}


def _omitted(value: object) -> bool:
    if value is None or value is False:
        return True
    return isinstance(value, str | list | tuple | dict) and not value


def _each(items: Sequence[Any], convert: Callable[[Any], JSON]) -> list[JSON]:
    return [convert(item) for item in items]


def _quantities(values: Mapping[str, Quantity]) -> JSON:
    return {name: str(value) for name, value in values.items()}


def _counters(values: Mapping[str, Quantity]) -> JSON:
    return {name: {"value": str(value)} for name, value in values.items()}


def _metadata(name: str, **extra: Any) -> JSON:
    return _compact(name=name, **extra)


# --- ResourceSlice ------------------------------------------------------------------------


def resource_slice_to_dict(slice_: ResourceSlice) -> JSON:
    spec = _compact(
        driver=slice_.driver,
        pool={
            "name": slice_.pool.name,
            "generation": slice_.pool.generation,
            "resourceSliceCount": slice_.pool.resource_slice_count,
        },
        nodeName=slice_.node_name,
        nodeSelector=None
        if slice_.node_selector is None
        else node_selector_to_dict(slice_.node_selector),
        allNodes=slice_.all_nodes,
        perDeviceNodeSelection=slice_.per_device_node_selection,
        devices=_each(slice_.devices, device_to_dict),
        sharedCounters=[
            {"name": s.name, "counters": _counters(s.counters)} for s in slice_.shared_counters
        ],
    )
    if slice_.node_name == "":  # invalid, but keep it visible rather than dropping it
        spec["nodeName"] = ""
    return {
        "apiVersion": slice_.api_version,
        "kind": "ResourceSlice",
        "metadata": _metadata(slice_.name, labels=dict(slice_.labels)),
        "spec": spec,
    }


def device_to_dict(device: Device) -> JSON:
    return _compact(
        name=device.name,
        attributes={key: _attribute(value) for key, value in device.attributes.items()},
        capacity={key: _capacity(value) for key, value in device.capacity.items()},
        consumesCounters=[
            {"counterSet": c.counter_set, "counters": _counters(c.counters)}
            for c in device.consumes_counters
        ],
        taints=_each(device.taints, _taint),
        allowMultipleAllocations=device.allow_multiple_allocations,
        nodeName=device.node_name,
        nodeSelector=None
        if device.node_selector is None
        else node_selector_to_dict(device.node_selector),
        allNodes=device.all_nodes,
        bindsToNode=device.binds_to_node,
        bindingConditions=list(device.binding_conditions),
        bindingFailureConditions=list(device.binding_failure_conditions),
    )


def _attribute(value: AttributeValue) -> JSON:
    return {value.type.value: value.value}


def _capacity(capacity: DeviceCapacity) -> JSON:
    policy = capacity.request_policy
    return _compact(
        value=str(capacity.value), requestPolicy=None if policy is None else _request_policy(policy)
    )


def _request_policy(policy: CapacityRequestPolicy) -> JSON:
    valid_range = policy.valid_range
    return _compact(
        default=None if policy.default is None else str(policy.default),
        validValues=[str(v) for v in policy.valid_values],
        validRange=None
        if valid_range is None
        else _compact(
            min=str(valid_range.min),
            max=None if valid_range.max is None else str(valid_range.max),
            step=None if valid_range.step is None else str(valid_range.step),
        ),
    )


def _taint(taint: DeviceTaint) -> JSON:
    return _compact(
        key=taint.key, value=taint.value, effect=taint.effect.value, timeAdded=taint.time_added
    )


def node_selector_to_dict(selector: NodeSelector) -> JSON:
    return {
        "nodeSelectorTerms": [
            _compact(
                matchExpressions=_each(term.match_expressions, _requirement),
                matchFields=_each(term.match_fields, _requirement),
            )
            for term in selector.node_selector_terms
        ]
    }


def _requirement(requirement: NodeSelectorRequirement) -> JSON:
    return _compact(
        key=requirement.key, operator=requirement.operator, values=list(requirement.values)
    )


# --- DeviceClass --------------------------------------------------------------------------


def device_class_to_dict(device_class: DeviceClass) -> JSON:
    return {
        "apiVersion": _RESOURCE_V1,
        "kind": "DeviceClass",
        "metadata": _metadata(device_class.name, labels=dict(device_class.labels)),
        "spec": _compact(
            selectors=_each(device_class.selectors, _selector),
            config=[{"opaque": _opaque(c)} for c in device_class.config],
        ),
    }


def _selector(selector: DeviceSelector) -> JSON:
    return {"cel": {"expression": selector.cel}}


def _opaque(opaque: OpaqueDeviceConfiguration) -> JSON:
    return {"driver": opaque.driver, "parameters": dict(opaque.parameters)}


# --- ResourceClaim ------------------------------------------------------------------------


def resource_claim_to_dict(claim: ResourceClaim) -> JSON:
    metadata = _metadata(
        claim.name,
        namespace=claim.namespace,
        uid=claim.uid,
        labels=dict(claim.labels),
        annotations=dict(claim.annotations),
    )
    devices = _compact(
        requests=_each(claim.requests, _request),
        constraints=[
            _compact(
                requests=list(c.requests),
                matchAttribute=c.match_attribute,
                distinctAttribute=c.distinct_attribute,
            )
            for c in claim.constraints
        ],
        config=[
            _compact(requests=list(c.requests), opaque=_opaque(c.opaque)) for c in claim.config
        ],
    )
    result: JSON = {
        "apiVersion": _RESOURCE_V1,
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {"devices": devices} if devices else {},
    }
    if claim.allocation is not None:
        result["status"] = {"allocation": allocation_result_to_dict(claim.allocation)}
    return result


def _request(request: DeviceRequest) -> JSON:
    return _compact(
        name=request.name,
        exactly=None if request.exactly is None else _exact_request(request.exactly),
        firstAvailable=_each(request.first_available, _subrequest),
    )


def _mode_and_count(mode: AllocationMode, count: int) -> JSON:
    if mode is AllocationMode.ALL:
        return {"allocationMode": mode.value}
    return {"allocationMode": mode.value, "count": count}


def _exact_request(request: ExactDeviceRequest) -> JSON:
    return _compact(
        deviceClassName=request.device_class_name,
        selectors=_each(request.selectors, _selector),
        **_mode_and_count(request.allocation_mode, request.count),
        tolerations=_each(request.tolerations, _toleration),
        capacity=_capacity_requirements(request.capacity),
    ) | ({} if request.admin_access is None else {"adminAccess": request.admin_access})


def _subrequest(sub: DeviceSubRequest) -> JSON:
    return _compact(
        name=sub.name,
        deviceClassName=sub.device_class_name,
        selectors=_each(sub.selectors, _selector),
        **_mode_and_count(sub.allocation_mode, sub.count),
        tolerations=_each(sub.tolerations, _toleration),
        capacity=_capacity_requirements(sub.capacity),
    )


def _capacity_requirements(capacity: CapacityRequirements | None) -> JSON | None:
    return None if capacity is None else {"requests": _quantities(capacity.requests)}


def _toleration(toleration: DeviceToleration) -> JSON:
    return _compact(
        key=toleration.key,
        operator=toleration.operator.value,
        value=toleration.value,
        effect=None if toleration.effect is None else toleration.effect.value,
        tolerationSeconds=toleration.toleration_seconds,
    ) | ({"tolerationSeconds": 0} if toleration.toleration_seconds == 0 else {})


# --- AllocationResult ---------------------------------------------------------------------


def allocation_result_to_dict(allocation: AllocationResult) -> JSON:
    """As in ResourceClaim.status.allocation. (Every reservation a store writes carries its
    allocations so: written field by field rather than through `_compact`, which costs more
    than the rest of a grant's encoding; the node selector's, the same for every device of a
    node, is made once per selector: do not change the dict returned.)"""
    devices: JSON = {}
    if allocation.results:
        devices["results"] = [_allocated_device(result) for result in allocation.results]
    if allocation.config:
        devices["config"] = [
            _compact(source=c.source.value, requests=list(c.requests), opaque=_opaque(c.opaque))
            for c in allocation.config
        ]
    found: JSON = {}
    if devices:
        found["devices"] = devices
    if allocation.node_selector is not None:
        found["nodeSelector"] = _node_selector_json(allocation.node_selector)
    return found


_SELECTORS: dict[int, tuple[NodeSelector, JSON]] = {}
"""Node selectors' dicts by the selector object's identity (which the entry keeps alive, so
the id cannot name another object meanwhile): the results of one node share one selector
object (core/results.py's ResultParts), and hashing its nested tuples for `_node_selector_dict`
costs more than the rest of a result's dict."""


def _node_selector_json(selector: NodeSelector) -> JSON:
    found = _SELECTORS.get(id(selector))
    if found is not None and found[0] is selector:
        return found[1]
    made = _node_selector_dict(selector)
    if len(_SELECTORS) >= 4096:  # bounded as the lru_cache behind it
        _SELECTORS.clear()
    _SELECTORS[id(selector)] = (selector, made)
    return made


@functools.lru_cache(maxsize=4096)
def _node_selector_dict(selector: NodeSelector) -> JSON:
    return node_selector_to_dict(selector)


def plain_result(result: DeviceRequestAllocationResult) -> bool:
    """A result of a device taken whole with nothing else set (what a batch's items are): its
    JSON is its four names."""
    return bool(
        result.admin_access is None
        and not result.tolerations
        and result.share_id is None
        and not result.consumed_capacity
        and not result.binding_conditions
        and not result.binding_failure_conditions
        and result.request
        and result.driver
        and result.pool
        and result.device
    )


def _allocated_device(result: DeviceRequestAllocationResult) -> JSON:
    if plain_result(result):
        return {
            "request": result.request,
            "driver": result.driver,
            "pool": result.pool,
            "device": result.device,
        }
    names = (
        ("request", result.request),
        ("driver", result.driver),
        ("pool", result.pool),
        ("device", result.device),
    )
    found: JSON = {key: value for key, value in names if value}
    if result.tolerations:
        found["tolerations"] = [_toleration(t) for t in result.tolerations]
    if result.share_id:
        found["shareID"] = result.share_id
    if result.consumed_capacity:
        found["consumedCapacity"] = _quantities(result.consumed_capacity)
    if result.binding_conditions:
        found["bindingConditions"] = list(result.binding_conditions)
    if result.binding_failure_conditions:
        found["bindingFailureConditions"] = list(result.binding_failure_conditions)
    if result.admin_access is not None:
        found["adminAccess"] = result.admin_access
    return found


# --- Node ---------------------------------------------------------------------------------


def node_to_dict(node: Node) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": _metadata(node.name, labels=dict(node.labels)),
    }
