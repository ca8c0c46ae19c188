"""ResourceClaim and AllocationResult <-> protobuf: requests, constraints, config, results."""

from __future__ import annotations

import functools

from protos.common.v1 import dra_pb2
from services.common.dra.model import (
    AllocationMode,
    AllocationResult,
    CapacityRequirements,
    ConfigSource,
    DeviceAllocationConfiguration,
    DeviceClaimConfiguration,
    DeviceConstraint,
    DeviceRequest,
    DeviceRequestAllocationResult,
    DeviceSubRequest,
    DeviceToleration,
    ExactDeviceRequest,
    NodeSelector,
    NodeSelectorRequirement,
    ResourceClaim,
    TolerationOperator,
)
from services.common.errors import InvalidArgument
from services.common.pb._base import (
    TAINT_EFFECTS,
    field_path,
    from_pb_node_selector,
    from_pb_opaque_configuration,
    items,
    not_empty,
    quantities_from_pb,
    quantities_to_pb,
    required,
    reverse,
    selector_from_pb,
    selector_to_pb,
    sorted_labels,
    to_pb_node_selector,
    to_pb_opaque_configuration,
)
from services.common.pb.wire import (
    LEN,
    cached_string_field,
    key,
    length_prefixed,
    message_field,
    varint,
)

DEFAULT_NAMESPACE = "default"

_ALLOCATION_MODES: dict[AllocationMode, dra_pb2.AllocationMode.ValueType] = {
    AllocationMode.EXACT_COUNT: dra_pb2.ALLOCATION_MODE_EXACT_COUNT,
    AllocationMode.ALL: dra_pb2.ALLOCATION_MODE_ALL,
}
_TOLERATION_OPERATORS: dict[TolerationOperator, dra_pb2.TolerationOperator.ValueType] = {
    TolerationOperator.EXISTS: dra_pb2.TOLERATION_OPERATOR_EXISTS,
    TolerationOperator.EQUAL: dra_pb2.TOLERATION_OPERATOR_EQUAL,
}
_CONFIG_SOURCES: dict[ConfigSource, dra_pb2.ConfigSource.ValueType] = {
    ConfigSource.FROM_CLASS: dra_pb2.CONFIG_SOURCE_FROM_CLASS,
    ConfigSource.FROM_CLAIM: dra_pb2.CONFIG_SOURCE_FROM_CLAIM,
}

# --- tolerations and request parts -----------------------------------------------------------


def to_pb_device_toleration(toleration: DeviceToleration) -> dra_pb2.DeviceToleration:
    msg = dra_pb2.DeviceToleration(
        key=toleration.key,
        operator=_TOLERATION_OPERATORS[toleration.operator],
        value=toleration.value,
    )
    if toleration.effect is not None:
        msg.effect = TAINT_EFFECTS[toleration.effect]
    if toleration.toleration_seconds is not None:
        msg.toleration_seconds = toleration.toleration_seconds
    return msg


def from_pb_device_toleration(msg: dra_pb2.DeviceToleration, path: str = "") -> DeviceToleration:
    operator = TolerationOperator.EQUAL
    if msg.operator != dra_pb2.TOLERATION_OPERATOR_UNSPECIFIED:
        operator_path = field_path(path, "operator")
        operator = reverse(_TOLERATION_OPERATORS, msg.operator, operator_path, "operator")
    effect = None
    if msg.effect != dra_pb2.TAINT_EFFECT_UNSPECIFIED:
        effect = reverse(TAINT_EFFECTS, msg.effect, field_path(path, "effect"), "taint effect")
    return DeviceToleration(
        key=msg.key,
        operator=operator,
        value=msg.value,
        effect=effect,
        toleration_seconds=msg.toleration_seconds if msg.HasField("toleration_seconds") else None,
    )


def _capacity_to_pb(capacity: CapacityRequirements | None) -> dra_pb2.CapacityRequirements | None:
    if capacity is None:
        return None
    return dra_pb2.CapacityRequirements(requests=quantities_to_pb(capacity.requests))


def _capacity_from_pb(msg: dra_pb2.CapacityRequirements, path: str) -> CapacityRequirements:
    return CapacityRequirements(quantities_from_pb(msg.requests, field_path(path, "requests")))


def _mode_from_pb(value: dra_pb2.AllocationMode.ValueType, path: str) -> AllocationMode:
    if value == dra_pb2.ALLOCATION_MODE_UNSPECIFIED:
        return AllocationMode.EXACT_COUNT
    return reverse(_ALLOCATION_MODES, value, path, "allocation mode")


def _count_from_pb(count: int, path: str) -> int:
    if count < 0:
        raise InvalidArgument.at(path, f"must not be negative, got {count}")
    return count or 1


# --- requests --------------------------------------------------------------------------------


def _exact_to_pb(exact: ExactDeviceRequest) -> dra_pb2.ExactDeviceRequest:
    msg = dra_pb2.ExactDeviceRequest(
        device_class_name=exact.device_class_name,
        selectors=[selector_to_pb(s) for s in exact.selectors],
        allocation_mode=_ALLOCATION_MODES[exact.allocation_mode],
        count=exact.count,
        tolerations=[to_pb_device_toleration(t) for t in exact.tolerations],
        capacity=_capacity_to_pb(exact.capacity),
    )
    if exact.admin_access is not None:
        msg.admin_access = exact.admin_access
    return msg


def _exact_from_pb(msg: dra_pb2.ExactDeviceRequest, path: str) -> ExactDeviceRequest:
    return ExactDeviceRequest(
        device_class_name=not_empty(msg.device_class_name, field_path(path, "device_class_name")),
        selectors=items(msg.selectors, field_path(path, "selectors"), selector_from_pb),
        allocation_mode=_mode_from_pb(msg.allocation_mode, field_path(path, "allocation_mode")),
        count=_count_from_pb(msg.count, field_path(path, "count")),
        admin_access=msg.admin_access if msg.HasField("admin_access") else None,
        tolerations=items(
            msg.tolerations, field_path(path, "tolerations"), from_pb_device_toleration
        ),
        capacity=(
            _capacity_from_pb(msg.capacity, field_path(path, "capacity"))
            if msg.HasField("capacity")
            else None
        ),
    )


def _sub_request_to_pb(sub: DeviceSubRequest) -> dra_pb2.DeviceSubRequest:
    return dra_pb2.DeviceSubRequest(
        name=sub.name,
        device_class_name=sub.device_class_name,
        selectors=[selector_to_pb(s) for s in sub.selectors],
        allocation_mode=_ALLOCATION_MODES[sub.allocation_mode],
        count=sub.count,
        tolerations=[to_pb_device_toleration(t) for t in sub.tolerations],
        capacity=_capacity_to_pb(sub.capacity),
    )


def _sub_request_from_pb(msg: dra_pb2.DeviceSubRequest, path: str) -> DeviceSubRequest:
    return DeviceSubRequest(
        name=not_empty(msg.name, field_path(path, "name")),
        device_class_name=not_empty(msg.device_class_name, field_path(path, "device_class_name")),
        selectors=items(msg.selectors, field_path(path, "selectors"), selector_from_pb),
        allocation_mode=_mode_from_pb(msg.allocation_mode, field_path(path, "allocation_mode")),
        count=_count_from_pb(msg.count, field_path(path, "count")),
        tolerations=items(
            msg.tolerations, field_path(path, "tolerations"), from_pb_device_toleration
        ),
        capacity=(
            _capacity_from_pb(msg.capacity, field_path(path, "capacity"))
            if msg.HasField("capacity")
            else None
        ),
    )


def to_pb_device_request(request: DeviceRequest) -> dra_pb2.DeviceRequest:
    return dra_pb2.DeviceRequest(
        name=request.name,
        exactly=_exact_to_pb(request.exactly) if request.exactly is not None else None,
        first_available=[_sub_request_to_pb(s) for s in request.first_available],
    )


def from_pb_device_request(msg: dra_pb2.DeviceRequest, path: str = "") -> DeviceRequest:
    has_exactly, has_first_available = msg.HasField("exactly"), len(msg.first_available) > 0
    if has_exactly == has_first_available:
        raise InvalidArgument.at(path, "exactly one of exactly, first_available must be set")
    return DeviceRequest(
        name=not_empty(msg.name, field_path(path, "name")),
        exactly=_exact_from_pb(msg.exactly, field_path(path, "exactly")) if has_exactly else None,
        first_available=items(
            msg.first_available, field_path(path, "first_available"), _sub_request_from_pb
        ),
    )


# --- constraints and configuration -----------------------------------------------------------


def _constraint_to_pb(constraint: DeviceConstraint) -> dra_pb2.DeviceConstraint:
    msg = dra_pb2.DeviceConstraint(requests=constraint.requests)
    if constraint.match_attribute is not None:
        msg.match_attribute = constraint.match_attribute
    elif constraint.distinct_attribute is not None:
        msg.distinct_attribute = constraint.distinct_attribute
    return msg


def _constraint_from_pb(msg: dra_pb2.DeviceConstraint, path: str) -> DeviceConstraint:
    kind = msg.WhichOneof("constraint")
    if kind is None:
        raise InvalidArgument.at(
            field_path(path, "constraint"),
            "exactly one of match_attribute, distinct_attribute must be set",
        )
    return DeviceConstraint(
        requests=tuple(msg.requests),
        match_attribute=msg.match_attribute if kind == "match_attribute" else None,
        distinct_attribute=msg.distinct_attribute if kind == "distinct_attribute" else None,
    )


def _claim_config_from_pb(
    msg: dra_pb2.DeviceClaimConfiguration, path: str
) -> DeviceClaimConfiguration:
    if not msg.HasField("opaque"):
        raise required(field_path(path, "opaque"))
    opaque = from_pb_opaque_configuration(msg.opaque, field_path(path, "opaque"))
    return DeviceClaimConfiguration(tuple(msg.requests), opaque)


def _allocation_config_from_pb(
    msg: dra_pb2.DeviceAllocationConfiguration, path: str
) -> DeviceAllocationConfiguration:
    source_path = field_path(path, "source")
    if msg.source == dra_pb2.CONFIG_SOURCE_UNSPECIFIED:
        raise required(source_path)
    if not msg.HasField("opaque"):
        raise required(field_path(path, "opaque"))
    return DeviceAllocationConfiguration(
        source=reverse(_CONFIG_SOURCES, msg.source, source_path, "config source"),
        requests=tuple(msg.requests),
        opaque=from_pb_opaque_configuration(msg.opaque, field_path(path, "opaque")),
    )


# --- AllocationResult ------------------------------------------------------------------------


def has_extras(result: DeviceRequestAllocationResult) -> bool:
    """Whether `result` sets a field `_result_extras` writes (most results set none)."""
    return bool(
        result.tolerations
        or result.consumed_capacity
        or result.binding_conditions
        or result.binding_failure_conditions
        or result.admin_access is not None
        or result.share_id is not None
    )


def _result_extras(
    msg: dra_pb2.DeviceRequestAllocationResult, result: DeviceRequestAllocationResult
) -> None:
    """The fields a result mostly leaves empty, set on `msg` when they are not (an empty list
    given to a constructor costs as much as a short one, and an allocation's answer holds one
    result per device)."""
    if result.tolerations:
        msg.tolerations.extend(to_pb_device_toleration(t) for t in result.tolerations)
    for name, quantity in quantities_to_pb(result.consumed_capacity).items():
        msg.consumed_capacity[name].CopyFrom(quantity)
    if result.binding_conditions:
        msg.binding_conditions.extend(result.binding_conditions)
    if result.binding_failure_conditions:
        msg.binding_failure_conditions.extend(result.binding_failure_conditions)
    if result.admin_access is not None:
        msg.admin_access = result.admin_access
    if result.share_id is not None:
        msg.share_id = result.share_id


def _result_from_pb(
    msg: dra_pb2.DeviceRequestAllocationResult, path: str
) -> DeviceRequestAllocationResult:
    return DeviceRequestAllocationResult(
        request=not_empty(msg.request, field_path(path, "request")),
        driver=not_empty(msg.driver, field_path(path, "driver")),
        pool=not_empty(msg.pool, field_path(path, "pool")),
        device=not_empty(msg.device, field_path(path, "device")),
        admin_access=msg.admin_access if msg.HasField("admin_access") else None,
        tolerations=items(
            msg.tolerations, field_path(path, "tolerations"), from_pb_device_toleration
        ),
        share_id=msg.share_id if msg.HasField("share_id") else None,
        consumed_capacity=quantities_from_pb(
            msg.consumed_capacity, field_path(path, "consumed_capacity")
        ),
        binding_conditions=tuple(msg.binding_conditions),
        binding_failure_conditions=tuple(msg.binding_failure_conditions),
    )


def to_pb_allocation_result(allocation: AllocationResult) -> dra_pb2.AllocationResult:
    msg = dra_pb2.AllocationResult()
    fill_pb_allocation_result(msg, allocation)
    return msg


def fill_pb_allocation_result(msg: dra_pb2.AllocationResult, allocation: AllocationResult) -> None:
    """Write `allocation` into `msg`, an empty message (one inside the response it belongs
    to: filled in place, it is not copied into its parent), and mark `msg` set."""
    msg.SetInParent()
    add = msg.results.add
    for result in allocation.results:
        added = add(
            request=result.request, driver=result.driver, pool=result.pool, device=result.device
        )
        if has_extras(result):
            _result_extras(added, result)
    if allocation.config:
        msg.config.extend(
            dra_pb2.DeviceAllocationConfiguration(
                source=_CONFIG_SOURCES[c.source],
                requests=c.requests,
                opaque=to_pb_opaque_configuration(c.opaque),
            )
            for c in allocation.config
        )
    if allocation.node_selector is not None:  # the same for every device of a node: made once
        msg.node_selector.CopyFrom(_pb_node_selector(allocation.node_selector))


@functools.lru_cache(maxsize=4096)
def _pb_node_selector(selector: NodeSelector) -> dra_pb2.NodeSelector:
    """A node selector's message, to copy from (never to change)."""
    return to_pb_node_selector(selector)


_RESULTS = key(1, LEN)  # AllocationResult.results
_NODE_SELECTOR = key(3, LEN)  # AllocationResult.node_selector
_REQUEST, _DRIVER, _POOL, _DEVICE = (key(n, LEN) for n in (1, 2, 3, 4))  # of a result


def allocation_result_bytes(allocation: AllocationResult) -> bytes | None:
    """`allocation` as the body of the AllocationResult `fill_pb_allocation_result` writes,
    serialized (services.common.pb.wire). None when it holds a map field (a config's opaque
    parameters, a result's consumed capacity): build that one as a message."""
    if allocation.config:
        return None
    results = allocation.results
    if len(results) == 1 and not has_extras(results[0]):  # one device: most allocations
        return one_device_allocation_bytes(results[0], allocation.node_selector)
    parts = []
    for result in results:
        if has_extras(result):
            if result.consumed_capacity:
                return None
            message = dra_pb2.DeviceRequestAllocationResult(
                request=result.request, driver=result.driver, pool=result.pool, device=result.device
            )
            _result_extras(message, result)
            parts.append(message_field(_RESULTS, message.SerializeToString()))
        else:
            parts.append(_result_field(result))
    if allocation.node_selector is not None:
        parts.append(node_selector_field(allocation.node_selector))
    return b"".join(parts)


def one_device_allocation_bytes(
    result: DeviceRequestAllocationResult, selector: NodeSelector | None
) -> bytes:
    """allocation_result_bytes of an allocation of `result` alone (it sets none of the fields
    `has_extras` names) on `selector`'s node, without a config."""
    body = _result_head(result.request, result.driver, result.pool) + cached_string_field(
        _DEVICE, result.device
    )
    field = _RESULTS + length_prefixed(body)
    if selector is None:
        return field
    seen = _SELECTOR_FIELDS.get(id(selector))  # node_selector_field's, without its call
    return field + (
        seen[1] if seen is not None and seen[0] is selector else node_selector_field(selector)
    )


def one_device_allocation_pieces(
    request: str, driver: str, pool: str, selector: NodeSelector | None, size: int
) -> tuple[bytes, bytes]:
    """one_device_allocation_bytes around its device's name, `size` bytes long: for a writer
    that puts the name in between. The bytes before it (the result's field head, its request,
    driver and pool fields, the name's key and length: none for an empty name, whose string
    field is not written) and after it (the node selector's field)."""
    named = _DEVICE + varint(size) if size else b""  # the name's key and length
    body = _result_head(request, driver, pool) + named
    before = _RESULTS + varint(len(body) + size) + body
    return before, b"" if selector is None else node_selector_field(selector)


def _result_field(result: DeviceRequestAllocationResult) -> bytes:
    """AllocationResult.results' element for a result without extras: the fields a node's
    results share (request, driver, pool) written once per node, then the device's name."""
    body = _result_head(result.request, result.driver, result.pool) + cached_string_field(
        _DEVICE, result.device
    )
    return _RESULTS + length_prefixed(body)


@functools.lru_cache(maxsize=16384)
def _result_head(request: str, driver: str, pool: str) -> bytes:
    """A result's fields before its device: its request, driver and pool."""
    return (
        cached_string_field(_REQUEST, request)
        + cached_string_field(_DRIVER, driver)
        + cached_string_field(_POOL, pool)
    )


def node_selector_field(selector: NodeSelector) -> bytes:
    """AllocationResult.node_selector set to `selector`, as bytes (_node_selector_field), found
    by the selector object (the results on one node share one NodeSelector, whose hash, nested
    frozen dataclasses, costs more than its bytes)."""
    seen = _SELECTOR_FIELDS.get(id(selector))
    if seen is None or seen[0] is not selector:
        if len(_SELECTOR_FIELDS) >= _SELECTORS_KEPT:
            _SELECTOR_FIELDS.clear()
        seen = _SELECTOR_FIELDS[id(selector)] = (selector, _node_selector_field(selector))
    return seen[1]


def _node_selector_field(selector: NodeSelector) -> bytes:
    """AllocationResult.node_selector set to `selector`, as bytes (a node's: one per node):
    the message to_pb_node_selector makes, written without it. Not kept by value: a new
    selector object is mostly a node not seen yet (its hash and a miss cost more than this)."""
    terms = []
    for term in selector.node_selector_terms:
        parts = [message_field(_EXPRESSION, _requirement(r)) for r in term.match_expressions]
        for requirement in term.match_fields:
            parts.append(message_field(_MATCH_FIELD, _requirement(requirement)))
        terms.append(message_field(_TERM, b"".join(parts)))
    return message_field(_NODE_SELECTOR, b"".join(terms))


_TERM = key(1, LEN)  # NodeSelector.node_selector_terms
_EXPRESSION, _MATCH_FIELD = key(1, LEN), key(2, LEN)  # a term's match_expressions, match_fields
_KEY, _OPERATOR, _VALUES = key(1, LEN), key(2, LEN), key(3, LEN)  # a requirement's


def _requirement(requirement: NodeSelectorRequirement) -> bytes:
    """A NodeSelectorRequirement's body (its values each written, an empty one too)."""
    body = cached_string_field(_KEY, requirement.key) + cached_string_field(
        _OPERATOR, requirement.operator
    )
    for value in requirement.values:
        body += _VALUES + length_prefixed(value.encode())
    return body


_SELECTOR_FIELDS: dict[int, tuple[NodeSelector, bytes]] = {}
"""_node_selector_field by the selector object's id, with the object (so the id is not reused
while it is here): the results on one node share one NodeSelector, whose hash (nested frozen
dataclasses) costs more than its bytes. Immutable keys: never stale."""
_SELECTORS_KEPT = 4096


def from_pb_allocation_result(msg: dra_pb2.AllocationResult, path: str = "") -> AllocationResult:
    selector_path = field_path(path, "node_selector")
    return AllocationResult(
        results=items(msg.results, field_path(path, "results"), _result_from_pb),
        config=items(msg.config, field_path(path, "config"), _allocation_config_from_pb),
        node_selector=(
            from_pb_node_selector(msg.node_selector, selector_path)
            if msg.HasField("node_selector")
            else None
        ),
    )


# --- ResourceClaim ---------------------------------------------------------------------------


def to_pb_resource_claim(claim: ResourceClaim) -> dra_pb2.ResourceClaim:
    return dra_pb2.ResourceClaim(
        name=claim.name,
        namespace=claim.namespace,
        uid=claim.uid,
        requests=[to_pb_device_request(r) for r in claim.requests],
        constraints=[_constraint_to_pb(c) for c in claim.constraints],
        config=[
            dra_pb2.DeviceClaimConfiguration(
                requests=c.requests, opaque=to_pb_opaque_configuration(c.opaque)
            )
            for c in claim.config
        ],
        allocation=(
            to_pb_allocation_result(claim.allocation) if claim.allocation is not None else None
        ),
        labels=claim.labels,
        annotations=claim.annotations,
    )


def from_pb_resource_claim(msg: dra_pb2.ResourceClaim, path: str = "") -> ResourceClaim:
    allocation_path = field_path(path, "allocation")
    return ResourceClaim(
        name=not_empty(msg.name, field_path(path, "name")),
        namespace=msg.namespace or DEFAULT_NAMESPACE,
        uid=msg.uid,
        requests=items(msg.requests, field_path(path, "requests"), from_pb_device_request),
        constraints=items(msg.constraints, field_path(path, "constraints"), _constraint_from_pb),
        config=items(msg.config, field_path(path, "config"), _claim_config_from_pb),
        allocation=(
            from_pb_allocation_result(msg.allocation, allocation_path)
            if msg.HasField("allocation")
            else None
        ),
        labels=sorted_labels(msg.labels),
        annotations=sorted_labels(msg.annotations),
    )
