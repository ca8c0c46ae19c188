"""Fluent builders for DRA objects in tests (kueue's `MakeClusterQueue(...).Obj()` style).

    slice_("slice-1", device("gpu-0").attr("productName", "H100").capacity("memory", "80Gi"))
    claim("train").request("gpus", "gpu", count=2).match("productName")
    cls("gpu", 'device.driver == "gpu.example.com"')

Every builder has `.build()`; the helpers that take objects (`snapshot`, `classes`) also take
builders. Defaults follow upstream's test suite: one driver, one node, pool named after the node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from services.allocator.core.snapshot import ClusterSnapshot
from services.common.dra.model import (
    AllocationMode,
    AllocationResult,
    AttributeValue,
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    CapacityRequirements,
    CounterSet,
    Device,
    DeviceCapacity,
    DeviceClaimConfiguration,
    DeviceClass,
    DeviceConstraint,
    DeviceCounterConsumption,
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
    NodeSelectorTerm,
    OpaqueDeviceConfiguration,
    ResourceClaim,
    ResourcePool,
    ResourceSlice,
    TaintEffect,
    TolerationOperator,
)
from services.common.dra.quantity import Quantity

DRIVER = "gpu.example.com"
NODE = "node-1"


def q(text: str) -> Quantity:
    return Quantity.parse(text)


# --- devices and slices ---------------------------------------------------------------


@dataclass
class DeviceBuilder:
    name: str
    _attributes: dict[str, AttributeValue] = field(default_factory=dict)
    _capacity: dict[str, DeviceCapacity] = field(default_factory=dict)
    _consumes: list[DeviceCounterConsumption] = field(default_factory=list)
    _taints: list[DeviceTaint] = field(default_factory=list)
    _multi: bool = False
    _node_name: str | None = None
    _node_selector: NodeSelector | None = None
    _all_nodes: bool = False
    _binding: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    _binds_to_node: bool = False

    def attr(self, name: str, value: int | bool | str) -> DeviceBuilder:
        if isinstance(value, bool):
            self._attributes[name] = AttributeValue.bool_(value)
        elif isinstance(value, int):
            self._attributes[name] = AttributeValue.int_(value)
        else:
            self._attributes[name] = AttributeValue.string(value)
        return self

    def version(self, name: str, value: str) -> DeviceBuilder:
        self._attributes[name] = AttributeValue.version(value)
        return self

    def capacity(
        self,
        name: str,
        value: str,
        *,
        default: str | None = None,
        valid_values: Sequence[str] = (),
        valid_range: tuple[str, str | None, str | None] | None = None,
    ) -> DeviceBuilder:
        """`valid_range` is (min, max, step)."""
        policy = None
        if default is not None or valid_values or valid_range is not None:
            policy = CapacityRequestPolicy(
                default=q(default) if default is not None else None,
                valid_values=tuple(q(v) for v in valid_values),
                valid_range=_range(valid_range),
            )
        self._capacity[name] = DeviceCapacity(q(value), policy)
        return self

    def consumes(self, counter_set: str, **counters: str) -> DeviceBuilder:
        amounts = {name: q(value) for name, value in counters.items()}
        self._consumes.append(DeviceCounterConsumption(counter_set, amounts))
        return self

    def taint(self, key: str, value: str = "", effect: str = "NoSchedule") -> DeviceBuilder:
        self._taints.append(DeviceTaint(key, TaintEffect(effect), value))
        return self

    def multi(self) -> DeviceBuilder:
        """allowMultipleAllocations: several allocations share the device's capacity."""
        self._multi = True
        return self

    def on_node(self, name: str) -> DeviceBuilder:
        """Per-device node access (the slice must use `.per_device()`)."""
        self._node_name = name
        return self

    def on_all_nodes(self) -> DeviceBuilder:
        self._all_nodes = True
        return self

    def on_nodes(self, selector: NodeSelector) -> DeviceBuilder:
        self._node_selector = selector
        return self

    def binding(self, conditions: Sequence[str], failures: Sequence[str] = ()) -> DeviceBuilder:
        """bindingConditions and bindingFailureConditions (DRADeviceBindingConditions)."""
        self._binding = (tuple(conditions), tuple(failures))
        return self

    def binds_to_node(self) -> DeviceBuilder:
        self._binds_to_node = True
        return self

    def build(self) -> Device:
        return Device(
            name=self.name,
            attributes=dict(self._attributes),
            capacity=dict(self._capacity),
            consumes_counters=tuple(self._consumes),
            taints=tuple(self._taints),
            allow_multiple_allocations=self._multi,
            node_name=self._node_name,
            node_selector=self._node_selector,
            all_nodes=self._all_nodes,
            binding_conditions=self._binding[0],
            binding_failure_conditions=self._binding[1],
            binds_to_node=self._binds_to_node,
        )


def device(name: str) -> DeviceBuilder:
    return DeviceBuilder(name)


def _range(spec: tuple[str, str | None, str | None] | None) -> CapacityRequestPolicyRange | None:
    if spec is None:
        return None
    low, high, step = spec
    return CapacityRequestPolicyRange(
        q(low), q(high) if high is not None else None, q(step) if step is not None else None
    )


@dataclass
class SliceBuilder:
    name: str
    _devices: list[Device] = field(default_factory=list)
    _driver: str = DRIVER
    _pool: str | None = None
    _generation: int = 1
    _count: int = 1
    _node: str | None = NODE
    _all_nodes: bool = False
    _selector: NodeSelector | None = None
    _per_device: bool = False
    _counters: list[CounterSet] = field(default_factory=list)

    def devices(self, *devices: DeviceBuilder | Device) -> SliceBuilder:
        self._devices.extend(d.build() if isinstance(d, DeviceBuilder) else d for d in devices)
        return self

    def driver(self, name: str) -> SliceBuilder:
        self._driver = name
        return self

    def pool(self, name: str, generation: int = 1, count: int = 1) -> SliceBuilder:
        self._pool, self._generation, self._count = name, generation, count
        return self

    def node(self, name: str) -> SliceBuilder:
        self._node = name
        return self

    def all_nodes(self) -> SliceBuilder:
        self._node, self._all_nodes = None, True
        return self

    def nodes(self, selector: NodeSelector) -> SliceBuilder:
        self._node, self._selector = None, selector
        return self

    def per_device(self) -> SliceBuilder:
        self._node, self._per_device = None, True
        return self

    def unreachable(self) -> SliceBuilder:
        """No node access at all (an unknown future extension upstream ignores)."""
        self._node = None
        return self

    def counter_set(self, name: str, **counters: str) -> SliceBuilder:
        self._counters.append(CounterSet(name, {n: q(v) for n, v in counters.items()}))
        return self

    def build(self) -> ResourceSlice:
        pool = self._pool or self._node or self.name
        return ResourceSlice(
            name=self.name,
            driver=self._driver,
            pool=ResourcePool(pool, self._generation, self._count),
            devices=tuple(self._devices),
            node_name=self._node,
            node_selector=self._selector,
            all_nodes=self._all_nodes,
            per_device_node_selection=self._per_device,
            shared_counters=tuple(self._counters),
        )


def slice_(name: str, *devices: DeviceBuilder | Device) -> SliceBuilder:
    return SliceBuilder(name).devices(*devices)


def node(name: str, **labels: str) -> Node:
    return Node(name, dict(labels))


def node_selector(
    *requirements: NodeSelectorRequirement, fields: Sequence[NodeSelectorRequirement] = ()
) -> NodeSelector:
    """One term: label requirements plus optional field requirements."""
    return NodeSelector((NodeSelectorTerm(tuple(requirements), tuple(fields)),))


def req(key: str, operator: str, *values: str) -> NodeSelectorRequirement:
    return NodeSelectorRequirement(key, operator, tuple(values))


XID_TAINT = DeviceTaint("gpu.nvidia.com/xid", TaintEffect.NO_EXECUTE, "79")  # fell off the bus


def with_taint(
    resource_slice: ResourceSlice, tainted: Iterable[str], taint: DeviceTaint = XID_TAINT
) -> ResourceSlice:
    """The slice with `taint` on its devices named `node/device` in `tainted`."""
    names = set(tainted)
    devices = tuple(
        replace(d, taints=(*d.taints, taint))
        if f"{resource_slice.node_name}/{d.name}" in names
        else d
        for d in resource_slice.devices
    )
    return replace(resource_slice, devices=devices)


def snapshot(
    *slices: SliceBuilder | ResourceSlice,
    nodes: Iterable[Node] = (),
    binding_conditions: bool = True,
) -> ClusterSnapshot:
    built = [s.build() if isinstance(s, SliceBuilder) else s for s in slices]
    return ClusterSnapshot.build(built, nodes, binding_conditions=binding_conditions)


# --- classes ----------------------------------------------------------------------------


@dataclass
class ClassBuilder:
    name: str
    _selectors: list[str] = field(default_factory=list)
    _config: list[OpaqueDeviceConfiguration] = field(default_factory=list)

    def selector(self, expression: str) -> ClassBuilder:
        self._selectors.append(expression)
        return self

    def config(self, driver: str = DRIVER, **parameters: Any) -> ClassBuilder:
        self._config.append(OpaqueDeviceConfiguration(driver, dict(parameters)))
        return self

    def build(self) -> DeviceClass:
        return DeviceClass(
            self.name, tuple(DeviceSelector(s) for s in self._selectors), tuple(self._config)
        )


def cls(name: str, *selectors: str) -> ClassBuilder:
    builder = ClassBuilder(name)
    for expression in selectors:
        builder.selector(expression)
    return builder


def classes(*built: ClassBuilder | DeviceClass) -> dict[str, DeviceClass]:
    result = {}
    for item in built:
        device_class = item.build() if isinstance(item, ClassBuilder) else item
        result[device_class.name] = device_class
    return result


# --- claims -----------------------------------------------------------------------------


def toleration(
    key: str = "", value: str = "", *, exists: bool = False, effect: str | None = None
) -> DeviceToleration:
    return DeviceToleration(
        key,
        TolerationOperator.EXISTS if exists else TolerationOperator.EQUAL,
        value,
        TaintEffect(effect) if effect is not None else None,
    )


def sub(
    name: str,
    class_name: str = "gpu",
    count: int = 1,
    *selectors: str,
    all_devices: bool = False,
    tolerations: Sequence[DeviceToleration] = (),
    capacity: Mapping[str, str] | None = None,
) -> DeviceSubRequest:
    return DeviceSubRequest(
        name=name,
        device_class_name=class_name,
        selectors=tuple(DeviceSelector(s) for s in selectors),
        allocation_mode=AllocationMode.ALL if all_devices else AllocationMode.EXACT_COUNT,
        count=count,
        tolerations=tuple(tolerations),
        capacity=_capacity(capacity),
    )


def _capacity(capacity: Mapping[str, str] | None) -> CapacityRequirements | None:
    if capacity is None:
        return None
    return CapacityRequirements({name: q(value) for name, value in capacity.items()})


@dataclass
class ClaimBuilder:
    name: str
    namespace: str = "default"
    uid: str = ""
    _requests: list[DeviceRequest] = field(default_factory=list)
    _constraints: list[DeviceConstraint] = field(default_factory=list)
    _config: list[DeviceClaimConfiguration] = field(default_factory=list)

    def request(
        self,
        name: str,
        class_name: str = "gpu",
        count: int = 1,
        *selectors: str,
        all_devices: bool = False,
        admin: bool | None = None,
        tolerations: Sequence[DeviceToleration] = (),
        capacity: Mapping[str, str] | None = None,
    ) -> ClaimBuilder:
        exact = ExactDeviceRequest(
            device_class_name=class_name,
            selectors=tuple(DeviceSelector(s) for s in selectors),
            allocation_mode=AllocationMode.ALL if all_devices else AllocationMode.EXACT_COUNT,
            count=count,
            admin_access=admin,
            tolerations=tuple(tolerations),
            capacity=_capacity(capacity),
        )
        self._requests.append(DeviceRequest(name, exactly=exact))
        return self

    def first_available(self, name: str, *subs: DeviceSubRequest) -> ClaimBuilder:
        self._requests.append(DeviceRequest(name, first_available=tuple(subs)))
        return self

    def raw_request(self, request: DeviceRequest) -> ClaimBuilder:
        self._requests.append(request)
        return self

    def match(self, attribute: str, *requests: str) -> ClaimBuilder:
        self._constraints.append(DeviceConstraint(tuple(requests), match_attribute=attribute))
        return self

    def distinct(self, attribute: str, *requests: str) -> ClaimBuilder:
        self._constraints.append(DeviceConstraint(tuple(requests), distinct_attribute=attribute))
        return self

    def empty_constraint(self) -> ClaimBuilder:
        self._constraints.append(DeviceConstraint())
        return self

    def config(self, *requests: str, driver: str = DRIVER, **parameters: Any) -> ClaimBuilder:
        opaque = OpaqueDeviceConfiguration(driver, dict(parameters))
        self._config.append(DeviceClaimConfiguration(tuple(requests), opaque))
        return self

    def allocated(self, allocation: AllocationResult) -> ResourceClaim:
        return replace(self.build(), allocation=allocation)

    def build(self) -> ResourceClaim:
        return ResourceClaim(
            name=self.name,
            namespace=self.namespace,
            uid=self.uid,
            requests=tuple(self._requests),
            constraints=tuple(self._constraints),
            config=tuple(self._config),
        )


def claim(name: str, namespace: str = "default", uid: str = "") -> ClaimBuilder:
    return ClaimBuilder(name, namespace, uid)


# --- results ----------------------------------------------------------------------------


def result(
    request: str,
    device_name: str,
    pool: str = NODE,
    driver: str = DRIVER,
    *,
    admin: bool | None = None,
    share_id: str | None = None,
    consumed: Mapping[str, str] | None = None,
) -> DeviceRequestAllocationResult:
    return DeviceRequestAllocationResult(
        request=request,
        driver=driver,
        pool=pool,
        device=device_name,
        admin_access=admin,
        share_id=share_id,
        consumed_capacity={n: q(v) for n, v in (consumed or {}).items()},
    )


def allocation(*results: DeviceRequestAllocationResult) -> AllocationResult:
    return AllocationResult(results=tuple(results))
