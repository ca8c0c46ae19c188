"""The DRA object model (resource.k8s.io/v1, Kubernetes 1.34) as frozen values.

Names follow the Kubernetes API verbatim (snake_case for Go's camelCase): ResourceSlice, Device,
DeviceClass, ResourceClaim, DeviceRequest, DeviceSubRequest, DeviceConstraint, AllocationResult.
Sequences are tuples and maps are plain dicts that nobody mutates after construction, so values
can be shared between threads and snapshots. Parsing (YAML/JSON -> model) lives in `parse.py`,
validation of the API's limits in `validate.py`, and protobuf conversions in each service's
adapters — never here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from services.common.dra.quantity import Quantity

__all__ = [
    "AllocationMode",
    "AllocationResult",
    "AttributeType",
    "AttributeValue",
    "CapacityRequestPolicy",
    "CapacityRequestPolicyRange",
    "CapacityRequirements",
    "ConfigSource",
    "CounterSet",
    "Device",
    "DeviceAllocationConfiguration",
    "DeviceCapacity",
    "DeviceClaimConfiguration",
    "DeviceClass",
    "DeviceConstraint",
    "DeviceCounterConsumption",
    "DeviceID",
    "DeviceRequest",
    "DeviceRequestAllocationResult",
    "DeviceSelector",
    "DeviceSubRequest",
    "DeviceTaint",
    "DeviceToleration",
    "ExactDeviceRequest",
    "Node",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "OpaqueDeviceConfiguration",
    "ResourceClaim",
    "ResourcePool",
    "ResourceSlice",
    "TaintEffect",
    "TolerationOperator",
]


# --- identity -----------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class DeviceID:
    """A device's identity everywhere in gpualloc: (driver, pool, device), as upstream.

    Its hash is worked out once, when it is made, and kept (the dataclass's own hashes a new
    tuple of the three strings on every dict lookup, and the solver, the holdings and the
    state look devices up by id ~10 times per placed claim). The kept hash is not pickled:
    string hashes differ between processes, so an unpickled id works its own out again."""

    __slots__ = ("driver", "pool", "device", "_hash")

    driver: str
    pool: str
    device: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.driver, self.pool, self.device)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined,no-any-return]  # a slot, not a field

    def __getstate__(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device)

    def __setstate__(self, state: tuple[str, str, str]) -> None:
        for name, value in zip(("driver", "pool", "device"), state, strict=True):
            object.__setattr__(self, name, value)
        self.__post_init__()

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


# --- node selection (core/v1 NodeSelector, the subset DRA uses) ----------------------------


@dataclass(frozen=True)
class NodeSelectorRequirement:
    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeSelectorTerm:
    match_expressions: tuple[NodeSelectorRequirement, ...] = ()
    match_fields: tuple[NodeSelectorRequirement, ...] = ()


@dataclass(frozen=True)
class NodeSelector:
    """Terms are ORed; requirements inside a term are ANDed (core/v1 semantics)."""

    node_selector_terms: tuple[NodeSelectorTerm, ...]


@dataclass(frozen=True)
class Node:
    """The part of a core/v1 Node the allocator needs: its name and labels."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


# --- ResourceSlice -------------------------------------------------------------------------


class AttributeType(StrEnum):
    INT = "int"
    BOOL = "bool"
    STRING = "string"
    VERSION = "version"  # a semver 2.0.0 string


@dataclass(frozen=True)
class AttributeValue:
    """Exactly one of int, bool, string, version — `type` says which, `value` holds it."""

    type: AttributeType
    value: int | bool | str

    @classmethod
    def int_(cls, value: int) -> AttributeValue:
        return cls(AttributeType.INT, value)

    @classmethod
    def bool_(cls, value: bool) -> AttributeValue:
        return cls(AttributeType.BOOL, value)

    @classmethod
    def string(cls, value: str) -> AttributeValue:
        return cls(AttributeType.STRING, value)

    @classmethod
    def version(cls, value: str) -> AttributeValue:
        return cls(AttributeType.VERSION, value)


@dataclass(frozen=True)
class CapacityRequestPolicyRange:
    min: Quantity
    max: Quantity | None = None
    step: Quantity | None = None


@dataclass(frozen=True)
class CapacityRequestPolicy:
    """How a multi-allocatable device's capacity may be requested (consumable capacity)."""

    default: Quantity | None = None
    valid_values: tuple[Quantity, ...] = ()
    valid_range: CapacityRequestPolicyRange | None = None


@dataclass(frozen=True)
class DeviceCapacity:
    value: Quantity
    request_policy: CapacityRequestPolicy | None = None


@dataclass(frozen=True)
class CounterSet:
    """A slice's sharedCounters entry: named counters that partitionable devices consume."""

    name: str
    counters: Mapping[str, Quantity]


@dataclass(frozen=True)
class DeviceCounterConsumption:
    """A device's consumesCounters entry: how much of counter set `counter_set` it uses."""

    counter_set: str
    counters: Mapping[str, Quantity]


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True)
class DeviceTaint:
    key: str
    effect: TaintEffect
    value: str = ""
    time_added: str | None = None  # RFC 3339, kept as given


@dataclass(frozen=True)
class Device:
    """One device of a slice. Attribute/capacity keys are qualified names as written in the slice
    (a bare `memory` is in the driver's domain; `resource.kubernetes.io/pciBusID` is not)."""

    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    capacity: Mapping[str, DeviceCapacity] = field(default_factory=dict)
    consumes_counters: tuple[DeviceCounterConsumption, ...] = ()
    taints: tuple[DeviceTaint, ...] = ()
    allow_multiple_allocations: bool = False
    # Only with the slice's per_device_node_selection: exactly one of these is set.
    node_name: str | None = None
    node_selector: NodeSelector | None = None
    all_nodes: bool = False
    # DRADeviceBindingConditions (alpha in 1.34): the device is usable only once every binding
    # condition is reported True for it, and given up when a failure condition is.
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    binds_to_node: bool = False  # an allocation of it is pinned to the node it was made for


@dataclass(frozen=True)
class ResourcePool:
    name: str
    generation: int
    resource_slice_count: int


@dataclass(frozen=True)
class ResourceSlice:
    """Node access: exactly one of node_name, node_selector, all_nodes or per-device selection."""

    name: str
    driver: str
    pool: ResourcePool
    devices: tuple[Device, ...] = ()
    node_name: str | None = None
    node_selector: NodeSelector | None = None
    all_nodes: bool = False
    per_device_node_selection: bool = False
    shared_counters: tuple[CounterSet, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    api_version: str = "resource.k8s.io/v1"


# --- DeviceClass ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceSelector:
    cel: str


@dataclass(frozen=True)
class OpaqueDeviceConfiguration:
    driver: str
    parameters: Mapping[str, Any]  # arbitrary JSON object, passed through untouched


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[DeviceSelector, ...] = ()
    config: tuple[OpaqueDeviceConfiguration, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)


# --- ResourceClaim -------------------------------------------------------------------------


class AllocationMode(StrEnum):
    EXACT_COUNT = "ExactCount"
    ALL = "All"


class TolerationOperator(StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


@dataclass(frozen=True)
class DeviceToleration:
    key: str = ""
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str = ""
    effect: TaintEffect | None = None  # None tolerates every effect
    toleration_seconds: int | None = None


@dataclass(frozen=True)
class CapacityRequirements:
    requests: Mapping[str, Quantity] = field(default_factory=dict)


@dataclass(frozen=True)
class ExactDeviceRequest:
    device_class_name: str
    selectors: tuple[DeviceSelector, ...] = ()
    allocation_mode: AllocationMode = AllocationMode.EXACT_COUNT
    count: int = 1
    admin_access: bool | None = None
    tolerations: tuple[DeviceToleration, ...] = ()
    capacity: CapacityRequirements | None = None


@dataclass(frozen=True)
class DeviceSubRequest:
    name: str
    device_class_name: str
    selectors: tuple[DeviceSelector, ...] = ()
    allocation_mode: AllocationMode = AllocationMode.EXACT_COUNT
    count: int = 1
    tolerations: tuple[DeviceToleration, ...] = ()
    capacity: CapacityRequirements | None = None


@dataclass(frozen=True)
class DeviceRequest:
    """Exactly one of `exactly` and `first_available` is set."""

    name: str
    exactly: ExactDeviceRequest | None = None
    first_available: tuple[DeviceSubRequest, ...] = ()


@dataclass(frozen=True)
class DeviceConstraint:
    """Exactly one of match_attribute / distinct_attribute; empty `requests` means all requests."""

    requests: tuple[str, ...] = ()
    match_attribute: str | None = None
    distinct_attribute: str | None = None


@dataclass(frozen=True)
class DeviceClaimConfiguration:
    requests: tuple[str, ...]
    opaque: OpaqueDeviceConfiguration


class ConfigSource(StrEnum):
    FROM_CLASS = "FromClass"
    FROM_CLAIM = "FromClaim"


@dataclass(frozen=True)
class DeviceAllocationConfiguration:
    source: ConfigSource
    requests: tuple[str, ...]
    opaque: OpaqueDeviceConfiguration


@dataclass(frozen=True)
class DeviceRequestAllocationResult:
    request: str  # "req" or "req/sub" for firstAvailable
    driver: str
    pool: str
    device: str
    admin_access: bool | None = None
    tolerations: tuple[DeviceToleration, ...] = ()
    share_id: str | None = None
    consumed_capacity: Mapping[str, Quantity] = field(default_factory=dict)
    # Copied from the device (DRADeviceBindingConditions).
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()

    @property
    def device_id(self) -> DeviceID:
        return DeviceID(self.driver, self.pool, self.device)


@dataclass(frozen=True)
class AllocationResult:
    results: tuple[DeviceRequestAllocationResult, ...] = ()
    config: tuple[DeviceAllocationConfiguration, ...] = ()
    node_selector: NodeSelector | None = None


@dataclass(frozen=True)
class ResourceClaim:
    """A claim's spec.devices plus identity; `allocation` is status.allocation when present."""

    name: str
    namespace: str = "default"
    uid: str = ""
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[DeviceConstraint, ...] = ()
    config: tuple[DeviceClaimConfiguration, ...] = ()
    allocation: AllocationResult | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
