"""ResourceSlice and DeviceClass <-> protobuf: devices, attributes, capacity, counters, taints."""

from __future__ import annotations

from protos.common.v1 import dra_pb2
from services.common.dra.model import (
    AttributeType,
    AttributeValue,
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    CounterSet,
    Device,
    DeviceCapacity,
    DeviceClass,
    DeviceCounterConsumption,
    DeviceTaint,
    ResourcePool,
    ResourceSlice,
)
from services.common.errors import InvalidArgument
from services.common.pb._base import (
    TAINT_EFFECTS,
    by_key,
    field_path,
    from_pb_node_selector,
    from_pb_opaque_configuration,
    from_pb_quantity,
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
    to_pb_quantity,
)

DEFAULT_API_VERSION = "resource.k8s.io/v1"

# --- attributes, capacity, counters, taints --------------------------------------------------


def to_pb_device_attribute(value: AttributeValue) -> dra_pb2.DeviceAttribute:
    if value.type is AttributeType.INT:
        return dra_pb2.DeviceAttribute(int=int(value.value))
    if value.type is AttributeType.BOOL:
        return dra_pb2.DeviceAttribute(bool=bool(value.value))
    if value.type is AttributeType.VERSION:
        return dra_pb2.DeviceAttribute(version=str(value.value))
    return dra_pb2.DeviceAttribute(string=str(value.value))


def from_pb_device_attribute(msg: dra_pb2.DeviceAttribute, path: str = "") -> AttributeValue:
    kind = msg.WhichOneof("value")
    if kind == "int":
        return AttributeValue.int_(msg.int)
    if kind == "bool":
        return AttributeValue.bool_(msg.bool)
    if kind == "string":
        return AttributeValue.string(msg.string)
    if kind == "version":
        return AttributeValue.version(msg.version)
    raise InvalidArgument.at(path, "exactly one of int, bool, string, version must be set")


def _policy_to_pb(policy: CapacityRequestPolicy) -> dra_pb2.CapacityRequestPolicy:
    msg = dra_pb2.CapacityRequestPolicy(
        valid_values=[to_pb_quantity(q) for q in policy.valid_values]
    )
    if policy.default is not None:
        msg.default.CopyFrom(to_pb_quantity(policy.default))
    if policy.valid_range is not None:
        valid_range = policy.valid_range
        msg.valid_range.min.CopyFrom(to_pb_quantity(valid_range.min))
        if valid_range.max is not None:
            msg.valid_range.max.CopyFrom(to_pb_quantity(valid_range.max))
        if valid_range.step is not None:
            msg.valid_range.step.CopyFrom(to_pb_quantity(valid_range.step))
    return msg


def _range_from_pb(
    msg: dra_pb2.CapacityRequestPolicyRange, path: str
) -> CapacityRequestPolicyRange:
    if not msg.HasField("min"):
        raise required(field_path(path, "min"))
    return CapacityRequestPolicyRange(
        min=from_pb_quantity(msg.min, field_path(path, "min")),
        max=from_pb_quantity(msg.max, field_path(path, "max")) if msg.HasField("max") else None,
        step=from_pb_quantity(msg.step, field_path(path, "step")) if msg.HasField("step") else None,
    )


def _policy_from_pb(msg: dra_pb2.CapacityRequestPolicy, path: str) -> CapacityRequestPolicy:
    default_path, range_path = field_path(path, "default"), field_path(path, "valid_range")
    return CapacityRequestPolicy(
        default=from_pb_quantity(msg.default, default_path) if msg.HasField("default") else None,
        valid_values=items(msg.valid_values, field_path(path, "valid_values"), from_pb_quantity),
        valid_range=(
            _range_from_pb(msg.valid_range, range_path) if msg.HasField("valid_range") else None
        ),
    )


def _capacity_to_pb(capacity: DeviceCapacity) -> dra_pb2.DeviceCapacity:
    msg = dra_pb2.DeviceCapacity(value=to_pb_quantity(capacity.value))
    if capacity.request_policy is not None:
        msg.request_policy.CopyFrom(_policy_to_pb(capacity.request_policy))
    return msg


def _capacity_from_pb(msg: dra_pb2.DeviceCapacity, path: str) -> DeviceCapacity:
    if not msg.HasField("value"):
        raise required(field_path(path, "value"))
    policy_path = field_path(path, "request_policy")
    return DeviceCapacity(
        value=from_pb_quantity(msg.value, field_path(path, "value")),
        request_policy=(
            _policy_from_pb(msg.request_policy, policy_path)
            if msg.HasField("request_policy")
            else None
        ),
    )


def _counter_set_from_pb(msg: dra_pb2.CounterSet, path: str) -> CounterSet:
    counters = quantities_from_pb(msg.counters, field_path(path, "counters"))
    return CounterSet(not_empty(msg.name, field_path(path, "name")), counters)


def _consumption_from_pb(
    msg: dra_pb2.DeviceCounterConsumption, path: str
) -> DeviceCounterConsumption:
    counters = quantities_from_pb(msg.counters, field_path(path, "counters"))
    return DeviceCounterConsumption(
        not_empty(msg.counter_set, field_path(path, "counter_set")), counters
    )


def to_pb_device_taint(taint: DeviceTaint) -> dra_pb2.DeviceTaint:
    msg = dra_pb2.DeviceTaint(key=taint.key, value=taint.value, effect=TAINT_EFFECTS[taint.effect])
    if taint.time_added is not None:
        msg.time_added = taint.time_added
    return msg


def from_pb_device_taint(msg: dra_pb2.DeviceTaint, path: str = "") -> DeviceTaint:
    effect_path = field_path(path, "effect")
    if msg.effect == dra_pb2.TAINT_EFFECT_UNSPECIFIED:
        raise required(effect_path)
    return DeviceTaint(
        key=msg.key,
        effect=reverse(TAINT_EFFECTS, msg.effect, effect_path, "taint effect"),
        value=msg.value,
        time_added=msg.time_added if msg.HasField("time_added") else None,
    )


# --- Device and ResourceSlice ----------------------------------------------------------------


def to_pb_device(device: Device) -> dra_pb2.Device:
    msg = dra_pb2.Device(
        name=device.name,
        attributes={k: to_pb_device_attribute(v) for k, v in device.attributes.items()},
        capacity={k: _capacity_to_pb(v) for k, v in device.capacity.items()},
        consumes_counters=[
            dra_pb2.DeviceCounterConsumption(
                counter_set=c.counter_set, counters=quantities_to_pb(c.counters)
            )
            for c in device.consumes_counters
        ],
        taints=[to_pb_device_taint(t) for t in device.taints],
        allow_multiple_allocations=device.allow_multiple_allocations,
        binding_conditions=device.binding_conditions,
        binding_failure_conditions=device.binding_failure_conditions,
        binds_to_node=device.binds_to_node,
    )
    if device.node_name is not None:
        msg.node_name = device.node_name
    elif device.node_selector is not None:
        msg.node_selector.CopyFrom(to_pb_node_selector(device.node_selector))
    elif device.all_nodes:
        msg.all_nodes = True
    return msg


def from_pb_device(msg: dra_pb2.Device, path: str = "") -> Device:
    access = msg.WhichOneof("node_access")
    if access == "all_nodes" and not msg.all_nodes:
        raise InvalidArgument.at(field_path(path, "all_nodes"), "must be true when set")
    selector_path = field_path(path, "node_selector")
    return Device(
        name=not_empty(msg.name, field_path(path, "name")),
        attributes=by_key(msg.attributes, field_path(path, "attributes"), from_pb_device_attribute),
        capacity=by_key(msg.capacity, field_path(path, "capacity"), _capacity_from_pb),
        consumes_counters=items(
            msg.consumes_counters, field_path(path, "consumes_counters"), _consumption_from_pb
        ),
        taints=items(msg.taints, field_path(path, "taints"), from_pb_device_taint),
        allow_multiple_allocations=msg.allow_multiple_allocations,
        node_name=msg.node_name if access == "node_name" else None,
        node_selector=(
            from_pb_node_selector(msg.node_selector, selector_path)
            if access == "node_selector"
            else None
        ),
        all_nodes=access == "all_nodes",
        binding_conditions=tuple(msg.binding_conditions),
        binding_failure_conditions=tuple(msg.binding_failure_conditions),
        binds_to_node=msg.binds_to_node,
    )


def to_pb_resource_slice(resource_slice: ResourceSlice) -> dra_pb2.ResourceSlice:
    pool = resource_slice.pool
    msg = dra_pb2.ResourceSlice(
        name=resource_slice.name,
        driver=resource_slice.driver,
        pool=dra_pb2.ResourcePool(
            name=pool.name,
            generation=pool.generation,
            resource_slice_count=pool.resource_slice_count,
        ),
        devices=[to_pb_device(d) for d in resource_slice.devices],
        shared_counters=[
            dra_pb2.CounterSet(name=c.name, counters=quantities_to_pb(c.counters))
            for c in resource_slice.shared_counters
        ],
        labels=resource_slice.labels,
        api_version=resource_slice.api_version,
    )
    if resource_slice.node_name is not None:
        msg.node_name = resource_slice.node_name
    elif resource_slice.node_selector is not None:
        msg.node_selector.CopyFrom(to_pb_node_selector(resource_slice.node_selector))
    elif resource_slice.all_nodes:
        msg.all_nodes = True
    elif resource_slice.per_device_node_selection:
        msg.per_device_node_selection = True
    return msg


def from_pb_resource_slice(msg: dra_pb2.ResourceSlice, path: str = "") -> ResourceSlice:
    if not msg.HasField("pool"):
        raise required(field_path(path, "pool"))
    access = msg.WhichOneof("node_access")
    if access is None:
        raise InvalidArgument.at(
            field_path(path, "node_access"),
            "exactly one of node_name, node_selector, all_nodes, per_device_node_selection "
            "must be set",
        )
    if (access == "all_nodes" and not msg.all_nodes) or (
        access == "per_device_node_selection" and not msg.per_device_node_selection
    ):
        raise InvalidArgument.at(field_path(path, access), "must be true when set")
    pool_path = field_path(path, "pool")
    return ResourceSlice(
        name=not_empty(msg.name, field_path(path, "name")),
        driver=not_empty(msg.driver, field_path(path, "driver")),
        pool=ResourcePool(
            not_empty(msg.pool.name, field_path(pool_path, "name")),
            msg.pool.generation,
            msg.pool.resource_slice_count,
        ),
        devices=items(msg.devices, field_path(path, "devices"), from_pb_device),
        node_name=msg.node_name if access == "node_name" else None,
        node_selector=(
            from_pb_node_selector(msg.node_selector, field_path(path, "node_selector"))
            if access == "node_selector"
            else None
        ),
        all_nodes=access == "all_nodes",
        per_device_node_selection=access == "per_device_node_selection",
        shared_counters=items(
            msg.shared_counters, field_path(path, "shared_counters"), _counter_set_from_pb
        ),
        labels=sorted_labels(msg.labels),
        api_version=msg.api_version or DEFAULT_API_VERSION,
    )


# --- DeviceClass -----------------------------------------------------------------------------


def to_pb_device_class(device_class: DeviceClass) -> dra_pb2.DeviceClass:
    return dra_pb2.DeviceClass(
        name=device_class.name,
        selectors=[selector_to_pb(s) for s in device_class.selectors],
        config=[to_pb_opaque_configuration(c) for c in device_class.config],
        labels=device_class.labels,
    )


def from_pb_device_class(msg: dra_pb2.DeviceClass, path: str = "") -> DeviceClass:
    return DeviceClass(
        name=not_empty(msg.name, field_path(path, "name")),
        selectors=items(msg.selectors, field_path(path, "selectors"), selector_from_pb),
        config=items(msg.config, field_path(path, "config"), from_pb_opaque_configuration),
        labels=sorted_labels(msg.labels),
    )
