"""validate.py on objects built in code: each 1.34 API rule, with the exact field path."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from services.common.dra.model import (
    AllocationMode,
    AllocationResult,
    AttributeValue,
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
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
from services.common.dra.validate import (
    resource_slice_violations,
    validate_allocation_result,
    validate_device_class,
    validate_resource_claim,
    validate_resource_slice,
)
from services.common.errors import InvalidArgument

GI = Quantity.parse("1Gi")


def gpu(name: str = "gpu-0", **changes: object) -> Device:
    device = Device(
        name=name,
        attributes={
            "productName": AttributeValue.string("NVIDIA H100 80GB HBM3"),
            "driverVersion": AttributeValue.version("580.126.9"),
            "index": AttributeValue.int_(0),
            "resource.kubernetes.io/pciBusID": AttributeValue.string("0000:3b:00.0"),
        },
        capacity={"memory": DeviceCapacity(Quantity.parse("80Gi"))},
    )
    return replace(device, **changes)  # type: ignore[arg-type]


def slice_(*devices: Device, **changes: object) -> ResourceSlice:
    base = ResourceSlice(
        name="node-1-gpu.nvidia.com",
        driver="gpu.nvidia.com",
        pool=ResourcePool("node-1", 1, 1),
        devices=devices or (gpu(),),
        node_name="node-1",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def partitionable(*consumptions: DeviceCounterConsumption, counters: int = 1) -> ResourceSlice:
    counter_set = CounterSet(
        "gpu-0-counter-set", {f"memory-slice-{i}": Quantity.parse("1") for i in range(counters)}
    )
    return slice_(gpu(consumes_counters=consumptions), shared_counters=(counter_set,))


def node_selector(*requirements: NodeSelectorRequirement, terms: int = 1) -> NodeSelector:
    return NodeSelector(
        tuple(NodeSelectorTerm(match_expressions=requirements) for _ in range(terms))
    )


def exact(**changes: object) -> ExactDeviceRequest:
    return replace(ExactDeviceRequest("gpu.nvidia.com"), **changes)  # type: ignore[arg-type]


def claim(*requests: DeviceRequest, **changes: object) -> ResourceClaim:
    base = ResourceClaim(name="c", requests=requests or (DeviceRequest("gpu", exactly=exact()),))
    return replace(base, **changes)  # type: ignore[arg-type]


def result(request: str = "gpu", **changes: object) -> DeviceRequestAllocationResult:
    base = DeviceRequestAllocationResult(request, "gpu.nvidia.com", "node-1", "gpu-0")
    return replace(base, **changes)  # type: ignore[arg-type]


def violation(check: Callable[[], None]) -> tuple[str, str]:
    with pytest.raises(InvalidArgument) as info:
        check()
    first = info.value.violations[0]
    assert info.value.message.startswith(f"{first.path}: {first.description}")
    return first.path, first.description


# --- ResourceSlice ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "valid",
    [
        pytest.param(slice_(), id="plain"),
        pytest.param(slice_(driver="GPU.nvidia.com"), id="upper-case-driver-like-csi"),
        pytest.param(slice_(node_name=None, all_nodes=True), id="all-nodes"),
        pytest.param(
            slice_(
                node_name=None,
                node_selector=node_selector(NodeSelectorRequirement("zone", "In", ("a",))),
            ),
            id="node-selector",
        ),
        pytest.param(
            slice_(pool=ResourcePool("a.b/c-d", 0, 3)), id="pool-with-slash-generation-zero"
        ),
        pytest.param(slice_(*(gpu(f"gpu-{i}") for i in range(128))), id="128-devices"),
        pytest.param(
            partitionable(
                DeviceCounterConsumption(
                    "gpu-0-counter-set", {"memory-slice-0": Quantity.parse("1")}
                )
            ),
            id="counters",
        ),
        pytest.param(
            slice_(
                gpu(node_name="node-2"),
                gpu("gpu-1", all_nodes=True),
                node_name=None,
                per_device_node_selection=True,
            ),
            id="per-device-node-selection",
        ),
        pytest.param(
            slice_(gpu(taints=(DeviceTaint("example.com/broken", TaintEffect.NO_EXECUTE, "yes"),))),
            id="taint",
        ),
        pytest.param(
            slice_(
                gpu(
                    attributes={
                        "a" * 32: AttributeValue.bool_(True),
                        "x" * 63 + "/" + "y" * 32: AttributeValue.int_(-(2**63)),
                    }
                )
            ),
            id="longest-names",
        ),
        pytest.param(
            slice_(gpu(attributes={"v": AttributeValue.version("1.2.3-rc.1+build.5")})),
            id="semver-prerelease",
        ),
        pytest.param(
            slice_(
                gpu(
                    binding_conditions=tuple(f"example.com/ready-{i}" for i in range(4)),
                    binding_failure_conditions=("Failed",),
                    binds_to_node=True,
                )
            ),
            id="4-binding-conditions",
        ),
    ],
)
def test_valid_slices(valid: ResourceSlice) -> None:
    validate_resource_slice(valid)


LONG = "x" * 65


@pytest.mark.parametrize(
    ("invalid", "path", "description"),
    [
        pytest.param(
            slice_(driver="gpu_nvidia"),
            "spec.driver",
            'Invalid value: "gpu_nvidia": a lowercase RFC 1123 subdomain',
            id="driver-underscore",
        ),
        pytest.param(
            slice_(driver="g" * 64 + ".com"),
            "spec.driver",
            "must be no more than 63 characters",
            id="driver-too-long",
        ),
        pytest.param(slice_(driver=""), "spec.driver", "Required value", id="driver-missing"),
        pytest.param(
            slice_(pool=ResourcePool("", 1, 1)),
            "spec.pool.name",
            "Required value",
            id="pool-name-missing",
        ),
        pytest.param(
            slice_(pool=ResourcePool("a//b", 1, 1)),
            "spec.pool.name",
            'Invalid value: "a//b"',
            id="pool-empty-part",
        ),
        pytest.param(
            slice_(pool=ResourcePool("p", -1, 1)),
            "spec.pool.generation",
            "Invalid value: -1: must be greater than or equal to zero",
            id="negative-generation",
        ),
        pytest.param(
            slice_(pool=ResourcePool("p", 1, 0)),
            "spec.pool.resourceSliceCount",
            "Invalid value: 0: must be greater than zero",
            id="zero-slice-count",
        ),
        pytest.param(
            slice_(node_name=None),
            "spec",
            "Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
            "`perDeviceNodeSelection` is required",
            id="no-node-access",
        ),
        pytest.param(
            slice_(all_nodes=True),
            "spec",
            'Invalid value: "{`nodeName`, `allNodes`}": exactly one of',
            id="two-node-accesses",
        ),
        pytest.param(
            slice_(node_name=""),
            "spec.nodeName",
            "must be either unset or set to a non-empty string",
            id="empty-node-name",
        ),
        pytest.param(
            slice_(node_name="Node_1"),
            "spec.nodeName",
            'Invalid value: "Node_1"',
            id="bad-node-name",
        ),
        pytest.param(
            slice_(
                node_name=None,
                node_selector=node_selector(NodeSelectorRequirement("zone", "In", ("a",)), terms=2),
            ),
            "spec.nodeSelector.nodeSelectorTerms",
            "must have exactly one node selector term",
            id="two-selector-terms",
        ),
        pytest.param(
            slice_(
                node_name=None,
                node_selector=node_selector(NodeSelectorRequirement("zone", "Near", ("a",))),
            ),
            "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].operator",
            'Invalid value: "Near": not a valid selector operator',
            id="bad-selector-operator",
        ),
        pytest.param(
            slice_(
                node_name=None, node_selector=node_selector(NodeSelectorRequirement("zone", "In"))
            ),
            "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].values",
            "Required value: must be specified when `operator` is 'In' or 'NotIn'",
            id="in-without-values",
        ),
        pytest.param(
            slice_(*(gpu(f"gpu-{i}") for i in range(129))),
            "spec.devices",
            "Too many: 129: must have at most 128 items",
            id="129-devices",
        ),
        pytest.param(
            slice_(gpu(), gpu()),
            "spec.devices[1].name",
            'Duplicate value: "gpu-0"',
            id="duplicate-device",
        ),
        pytest.param(
            slice_(gpu("GPU-0")),
            "spec.devices[0].name",
            'Invalid value: "GPU-0": a lowercase RFC 1123 label',
            id="device-name-upper-case",
        ),
        pytest.param(
            slice_(gpu("")), "spec.devices[0].name", "Required value", id="device-name-missing"
        ),
        pytest.param(
            slice_(gpu(attributes={"1st": AttributeValue.int_(1)})),
            'spec.devices[0].attributes["1st"]',
            'Invalid value: "1st": a valid C identifier',
            id="attribute-not-c-identifier",
        ),
        pytest.param(
            slice_(gpu(attributes={"a" * 33: AttributeValue.int_(1)})),
            f'spec.devices[0].attributes["{"a" * 33}"]',
            "must be no more than 32 characters",
            id="attribute-id-too-long",
        ),
        pytest.param(
            slice_(gpu(attributes={"/x": AttributeValue.int_(1)})),
            'spec.devices[0].attributes["/x"]',
            "the domain must not be empty",
            id="attribute-empty-domain",
        ),
        pytest.param(
            slice_(gpu(attributes={"a.com/b/c": AttributeValue.int_(1)})),
            'spec.devices[0].attributes["a.com/b/c"]',
            "single '/'",
            id="attribute-two-slashes",
        ),
        pytest.param(
            slice_(gpu(attributes={"x" * 64 + "/y": AttributeValue.int_(1)})),
            'spec.devices[0].attributes["' + "x" * 64 + '/y"]',
            "must be no more than 63 characters",
            id="attribute-domain-too-long",
        ),
        pytest.param(
            slice_(gpu(attributes={"s": AttributeValue.string(LONG)})),
            'spec.devices[0].attributes["s"].string',
            "Too long: may not be more than 64 bytes",
            id="string-too-long",
        ),
        pytest.param(
            slice_(gpu(attributes={"s": AttributeValue.string("é" * 33)})),
            'spec.devices[0].attributes["s"].string',
            "Too long: may not be more than 64 bytes",
            id="string-too-long-in-bytes",
        ),
        pytest.param(
            slice_(gpu(attributes={"v": AttributeValue.version("v1.2.3")})),
            'spec.devices[0].attributes["v"].version',
            "must be a string compatible with semver.org spec 2.0.0",
            id="version-with-v",
        ),
        pytest.param(
            slice_(gpu(attributes={"v": AttributeValue.version("1.2")})),
            'spec.devices[0].attributes["v"].version',
            "semver",
            id="version-two-parts",
        ),
        pytest.param(
            slice_(gpu(attributes={"i": AttributeValue.int_(2**63)})),
            'spec.devices[0].attributes["i"].int',
            "must be a 64-bit integer",
            id="int-overflow",
        ),
        pytest.param(
            slice_(gpu(attributes={f"a{i}": AttributeValue.int_(i) for i in range(32)})),
            "spec.devices[0]",
            "Invalid value: 33: the total number of attributes and capacities must not exceed 32",
            id="33-attributes-and-capacities",
        ),
        pytest.param(
            slice_(
                gpu(taints=tuple(DeviceTaint(f"k{i}", TaintEffect.NO_SCHEDULE) for i in range(5)))
            ),
            "spec.devices[0].taints",
            "Too many: 5: must have at most 4 items",
            id="5-taints",
        ),
        pytest.param(
            slice_(gpu(taints=(DeviceTaint("", TaintEffect.NO_SCHEDULE),))),
            "spec.devices[0].taints[0].key",
            "name part must be non-empty",
            id="taint-without-key",
        ),
        pytest.param(
            slice_(gpu(taints=(DeviceTaint("k", TaintEffect.NO_SCHEDULE, "bad value"),))),
            "spec.devices[0].taints[0].value",
            'Invalid value: "bad value"',
            id="taint-bad-value",
        ),
        pytest.param(
            slice_(gpu(binding_conditions=tuple(f"Ready{i}" for i in range(5)))),
            "spec.devices[0].bindingConditions",
            "Too many: 5: must have at most 4 items",
            id="5-binding-conditions",
        ),
        pytest.param(
            slice_(gpu(binding_failure_conditions=("not a type",))),
            "spec.devices[0].bindingFailureConditions[0]",
            'Invalid value: "not a type"',
            id="binding-failure-condition-not-a-qualified-name",
        ),
        pytest.param(
            partitionable(DeviceCounterConsumption("other-set", {"memory-slice-0": GI})),
            "spec.devices[0].consumesCounters[0].counterSet",
            'Invalid value: "other-set": '
            "must reference a counterSet defined in the ResourceSlice sharedCounters",
            id="unknown-counter-set",
        ),
        pytest.param(
            partitionable(DeviceCounterConsumption("gpu-0-counter-set", {"memory-slice-7": GI})),
            'spec.devices[0].consumesCounters[0].counters["memory-slice-7"]',
            "must reference a counter defined in the ResourceSlice sharedCounters",
            id="unknown-counter",
        ),
        pytest.param(
            partitionable(DeviceCounterConsumption("gpu-0-counter-set", {})),
            "spec.devices[0].consumesCounters[0].counters",
            "Required value",
            id="consumption-without-counters",
        ),
        pytest.param(
            partitionable(
                DeviceCounterConsumption("gpu-0-counter-set", {"memory-slice-0": GI}),
                DeviceCounterConsumption("gpu-0-counter-set", {"memory-slice-0": GI}),
            ),
            "spec.devices[0].consumesCounters[1].counterSet",
            'Duplicate value: "gpu-0-counter-set"',
            id="same-counter-set-twice",
        ),
        pytest.param(
            partitionable(counters=33),
            "spec.sharedCounters",
            "Invalid value: 33: the total number of shared counters must not exceed 32",
            id="33-shared-counters",
        ),
        pytest.param(
            slice_(shared_counters=(CounterSet("s", {"c": GI}), CounterSet("s", {"c": GI}))),
            "spec.sharedCounters[1].name",
            'Duplicate value: "s"',
            id="duplicate-counter-set",
        ),
        pytest.param(
            slice_(shared_counters=(CounterSet("Set_A", {"c": GI}),)),
            "spec.sharedCounters[0].name",
            'Invalid value: "Set_A"',
            id="counter-set-name",
        ),
        pytest.param(
            slice_(gpu(), node_name=None, per_device_node_selection=True),
            "spec.devices[0]",
            "Required value: exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required "
            "when `perDeviceNodeSelection` is set to true in the ResourceSlice spec",
            id="per-device-without-node",
        ),
        pytest.param(
            slice_(
                gpu(node_name="node-2", all_nodes=True),
                node_name=None,
                per_device_node_selection=True,
            ),
            "spec.devices[0]",
            'Invalid value: "{`nodeName`, `allNodes`}": exactly one of',
            id="per-device-two-nodes",
        ),
        pytest.param(
            slice_(gpu(node_name="node-2")),
            "spec.devices[0]",
            "can only be set if `perDeviceNodeSelection` is set to true",
            id="device-node-without-per-device",
        ),
        pytest.param(
            slice_(gpu(capacity={"memory": DeviceCapacity(GI, CapacityRequestPolicy(default=GI))})),
            'spec.devices[0].capacity["memory"].requestPolicy',
            "Forbidden: allowMultipleAllocations must be true",
            id="request-policy-needs-multiple-allocations",
        ),
        pytest.param(
            slice_(
                gpu(
                    allow_multiple_allocations=True,
                    capacity={
                        "memory": DeviceCapacity(
                            GI,
                            CapacityRequestPolicy(
                                valid_range=CapacityRequestPolicyRange(Quantity.parse("1Mi"))
                            ),
                        )
                    },
                )
            ),
            'spec.devices[0].capacity["memory"].requestPolicy.default',
            "Required value: required when validRange is defined",
            id="range-without-default",
        ),
        pytest.param(
            slice_(
                gpu(
                    allow_multiple_allocations=True,
                    capacity={
                        "memory": DeviceCapacity(
                            GI,
                            CapacityRequestPolicy(
                                default=Quantity.parse("300Mi"),
                                valid_range=CapacityRequestPolicyRange(
                                    Quantity.parse("128Mi"), step=Quantity.parse("128Mi")
                                ),
                            ),
                        )
                    },
                )
            ),
            'spec.devices[0].capacity["memory"].requestPolicy.validRange.step',
            'Invalid value: "300Mi": value is not a multiple of a given step (128Mi) from (128Mi)',
            id="default-off-step",
        ),
        pytest.param(
            slice_(
                gpu(
                    allow_multiple_allocations=True,
                    capacity={
                        "memory": DeviceCapacity(
                            GI,
                            CapacityRequestPolicy(
                                default=GI, valid_values=(Quantity.parse("2Gi"), GI)
                            ),
                        )
                    },
                )
            ),
            'spec.devices[0].capacity["memory"].requestPolicy.validValues[1]',
            'Invalid value: "1Gi": values must be sorted in ascending order',
            id="valid-values-unsorted",
        ),
    ],
)
def test_invalid_slices(invalid: ResourceSlice, path: str, description: str) -> None:
    found_path, found = violation(lambda: validate_resource_slice(invalid))
    assert found_path == path
    assert description in found


def test_all_violations_are_collected_first_in_the_message() -> None:
    invalid = slice_(gpu("GPU-0"), gpu("GPU-0"), driver="", pool=ResourcePool("p", 1, 0))
    with pytest.raises(InvalidArgument) as info:
        validate_resource_slice(invalid)
    assert [v.path for v in info.value.violations] == [
        "spec.driver",
        "spec.pool.resourceSliceCount",
        "spec.devices[0].name",
        "spec.devices[1].name",
        "spec.devices[1].name",
    ]
    assert info.value.message == "spec.driver: Required value (and 4 more)"
    assert info.value.field_path == "spec.driver"


def test_path_prefix_is_the_callers() -> None:
    assert (
        resource_slice_violations(slice_(driver=""), path="slices[3].spec")[0].path
        == "slices[3].spec.driver"
    )


# --- DeviceClass --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("invalid", "path", "description"),
    [
        pytest.param(
            DeviceClass("c", selectors=(DeviceSelector(""),)),
            "spec.selectors[0].cel.expression",
            "Required value",
            id="empty-cel",
        ),
        pytest.param(
            DeviceClass("c", selectors=(DeviceSelector("x" * 10241),)),
            "spec.selectors[0].cel.expression",
            "Too long: may not be more than 10240 bytes",
            id="cel-too-long",
        ),
        pytest.param(
            DeviceClass("c", selectors=tuple(DeviceSelector("true") for _ in range(33))),
            "spec.selectors",
            "Too many: 33: must have at most 32 items",
            id="33-selectors",
        ),
        pytest.param(
            DeviceClass("c", config=(OpaqueDeviceConfiguration("gpu.nvidia.com", {}),)),
            "spec.config[0].opaque.parameters",
            "Required value",
            id="empty-parameters",
        ),
        pytest.param(
            DeviceClass(
                "c", config=(OpaqueDeviceConfiguration("gpu.nvidia.com", {"a": "x" * 10240}),)
            ),
            "spec.config[0].opaque.parameters",
            "Too long",
            id="parameters-too-long",
        ),
        pytest.param(
            DeviceClass("c", config=(OpaqueDeviceConfiguration("Bad_Driver", {"a": 1}),)),
            "spec.config[0].opaque.driver",
            'Invalid value: "Bad_Driver"',
            id="bad-config-driver",
        ),
    ],
)
def test_invalid_device_classes(invalid: DeviceClass, path: str, description: str) -> None:
    found_path, found = violation(lambda: validate_device_class(invalid))
    assert (found_path, description in found) == (path, True)


def test_valid_device_class() -> None:
    validate_device_class(
        DeviceClass(
            "gpu.nvidia.com", selectors=(DeviceSelector("device.driver == 'gpu.nvidia.com'"),)
        )
    )


# --- ResourceClaim ------------------------------------------------------------------------

SUBS = (DeviceSubRequest("big", "gpu.nvidia.com"), DeviceSubRequest("small", "mig.nvidia.com"))


@pytest.mark.parametrize(
    "valid",
    [
        pytest.param(claim(), id="one-exact"),
        pytest.param(
            claim(DeviceRequest("all", exactly=exact(allocation_mode=AllocationMode.ALL))),
            id="all-with-model-default-count",
        ),
        pytest.param(
            claim(DeviceRequest("all", exactly=exact(allocation_mode=AllocationMode.ALL, count=0))),
            id="all-with-zero-count",
        ),
        pytest.param(
            claim(
                DeviceRequest("gpu", first_available=SUBS),
                constraints=(
                    DeviceConstraint(
                        ("gpu/big", "gpu"), match_attribute="resource.kubernetes.io/pcieRoot"
                    ),
                ),
                config=(
                    DeviceClaimConfiguration(
                        ("gpu/small",), OpaqueDeviceConfiguration("gpu.nvidia.com", {"k": "v"})
                    ),
                ),
            ),
            id="subrequest-references",
        ),
        pytest.param(
            claim(*(DeviceRequest(f"r{i}", exactly=exact()) for i in range(32))), id="32-requests"
        ),
        pytest.param(
            claim(
                DeviceRequest(
                    "gpu",
                    exactly=exact(
                        tolerations=(DeviceToleration(operator=TolerationOperator.EXISTS),)
                    ),
                )
            ),
            id="tolerate-everything",
        ),
    ],
)
def test_valid_claims(valid: ResourceClaim) -> None:
    validate_resource_claim(valid)


@pytest.mark.parametrize(
    ("invalid", "path", "description"),
    [
        pytest.param(
            claim(DeviceRequest("GPU", exactly=exact())),
            "spec.devices.requests[0].name",
            'Invalid value: "GPU"',
            id="request-name",
        ),
        pytest.param(
            claim(DeviceRequest("gpu", exactly=exact()), DeviceRequest("gpu", exactly=exact())),
            "spec.devices.requests[1].name",
            'Duplicate value: "gpu"',
            id="duplicate-request",
        ),
        pytest.param(
            claim(DeviceRequest("gpu")),
            "spec.devices.requests[0]",
            "Required value: exactly one of `exactly` or `firstAvailable` is required",
            id="neither-exactly-nor-first-available",
        ),
        pytest.param(
            claim(DeviceRequest("gpu", exactly=exact(), first_available=SUBS)),
            "spec.devices.requests[0]",
            "but multiple fields are set",
            id="both-exactly-and-first-available",
        ),
        pytest.param(
            claim(*(DeviceRequest(f"r{i}", exactly=exact()) for i in range(33))),
            "spec.devices.requests",
            "Too many: 33: must have at most 32 items",
            id="33-requests",
        ),
        pytest.param(
            claim(
                DeviceRequest(
                    "gpu",
                    first_available=tuple(
                        DeviceSubRequest(f"s{i}", "gpu.nvidia.com") for i in range(9)
                    ),
                )
            ),
            "spec.devices.requests[0].firstAvailable",
            "Too many: 9: must have at most 8 items",
            id="9-subrequests",
        ),
        pytest.param(
            claim(DeviceRequest("gpu", first_available=(SUBS[0], SUBS[0]))),
            "spec.devices.requests[0].firstAvailable[1].name",
            'Duplicate value: "big"',
            id="duplicate-subrequest",
        ),
        pytest.param(
            claim(DeviceRequest("gpu", exactly=exact(count=0))),
            "spec.devices.requests[0].exactly.count",
            "Invalid value: 0: must be greater than zero",
            id="zero-count",
        ),
        pytest.param(
            claim(DeviceRequest("gpu", exactly=exact(allocation_mode=AllocationMode.ALL, count=2))),
            "spec.devices.requests[0].exactly.count",
            "Invalid value: 2: must not be specified when allocationMode is 'All'",
            id="count-with-all",
        ),
        pytest.param(
            claim(DeviceRequest("gpu", exactly=exact(device_class_name=""))),
            "spec.devices.requests[0].exactly.deviceClassName",
            "Required value",
            id="missing-class",
        ),
        pytest.param(
            claim(DeviceRequest("gpu", exactly=exact(selectors=(DeviceSelector(" "),)))),
            "spec.devices.requests[0].exactly.selectors[0].cel.expression",
            "Required value",
            id="blank-selector",
        ),
        pytest.param(
            claim(
                DeviceRequest(
                    "gpu",
                    exactly=exact(
                        tolerations=(DeviceToleration("k", TolerationOperator.EXISTS, "v"),)
                    ),
                )
            ),
            "spec.devices.requests[0].exactly.tolerations[0].value",
            'Invalid value: "v": must be empty for operator `Exists`',
            id="exists-with-value",
        ),
        pytest.param(
            claim(
                DeviceRequest(
                    "gpu",
                    exactly=exact(
                        tolerations=tuple(
                            DeviceToleration(operator=TolerationOperator.EXISTS) for _ in range(17)
                        )
                    ),
                )
            ),
            "spec.devices.requests[0].exactly.tolerations",
            "Too many: 17: must have at most 16 items",
            id="17-tolerations",
        ),
        pytest.param(
            claim(constraints=(DeviceConstraint(("gpus",), match_attribute="a.com/x"),)),
            "spec.devices.constraints[0].requests[0]",
            "must be the name of a request in the claim",
            id="constraint-unknown-request",
        ),
        pytest.param(
            claim(
                DeviceRequest("gpu", first_available=SUBS),
                constraints=(DeviceConstraint(("gpu/huge",), match_attribute="a.com/x"),),
            ),
            "spec.devices.constraints[0].requests[0]",
            'Invalid value: "gpu/huge"',
            id="constraint-unknown-subrequest",
        ),
        pytest.param(
            claim(constraints=(DeviceConstraint(("gpu/x/y",), match_attribute="a.com/x"),)),
            "spec.devices.constraints[0].requests[0]",
            'Invalid value: "gpu/x/y"',
            id="constraint-three-segments",
        ),
        pytest.param(
            claim(constraints=(DeviceConstraint(),)),
            "spec.devices.constraints[0].matchAttribute",
            "Required value",
            id="constraint-without-attribute",
        ),
        pytest.param(
            claim(constraints=(DeviceConstraint(match_attribute="model"),)),
            "spec.devices.constraints[0].matchAttribute",
            "a fully qualified name must be a domain and a name separated by a slash",
            id="constraint-without-domain",
        ),
        pytest.param(
            claim(
                constraints=(
                    DeviceConstraint(match_attribute="a.com/x", distinct_attribute="a.com/y"),
                )
            ),
            "spec.devices.constraints[0]",
            "but multiple fields are set",
            id="constraint-match-and-distinct",
        ),
        pytest.param(
            claim(
                config=(
                    DeviceClaimConfiguration(
                        ("nope",), OpaqueDeviceConfiguration("gpu.nvidia.com", {"k": 1})
                    ),
                )
            ),
            "spec.devices.config[0].requests[0]",
            'Invalid value: "nope"',
            id="config-unknown-request",
        ),
        pytest.param(
            claim(allocation=AllocationResult(tuple(result() for _ in range(33)))),
            "status.allocation.devices.results",
            "Too many: 33: must have at most 32 items",
            id="33-results",
        ),
        pytest.param(
            claim(allocation=AllocationResult((result("other"),))),
            "status.allocation.devices.results[0].request",
            'Invalid value: "other"',
            id="result-unknown-request",
        ),
        pytest.param(
            claim(allocation=AllocationResult((result(share_id="ABC"),))),
            "status.allocation.devices.results[0].shareID",
            "RFC 4122",
            id="bad-share-id",
        ),
        pytest.param(
            claim(allocation=AllocationResult((result(device="gpu_0"),))),
            "status.allocation.devices.results[0].device",
            'Invalid value: "gpu_0"',
            id="bad-result-device",
        ),
        pytest.param(
            claim(
                allocation=AllocationResult(
                    node_selector=NodeSelector(
                        (
                            NodeSelectorTerm(
                                match_fields=(
                                    NodeSelectorRequirement("metadata.uid", "In", ("n",)),
                                )
                            ),
                        )
                    )
                )
            ),
            "status.allocation.nodeSelector.nodeSelectorTerms[0].matchFields[0].key",
            'Invalid value: "metadata.uid": not a valid field selector key',
            id="allocation-node-selector-field",
        ),
    ],
)
def test_invalid_claims(invalid: ResourceClaim, path: str, description: str) -> None:
    found_path, found = violation(lambda: validate_resource_claim(invalid))
    assert found_path == path
    assert description in found


def test_claim_template_paths() -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_resource_claim(
            claim(DeviceRequest("gpu", exactly=exact(count=0))), path="spec.spec"
        )
    assert info.value.field_path == "spec.spec.devices.requests[0].exactly.count"


def test_allocation_result_on_its_own_and_against_a_claim() -> None:
    allocation = AllocationResult((result("gpu/small"),))
    validate_allocation_result(allocation)  # without a claim only the format is checked
    validate_allocation_result(allocation, claim=claim(DeviceRequest("gpu", first_available=SUBS)))
    with pytest.raises(InvalidArgument) as info:
        validate_allocation_result(allocation, path="allocation", claim=claim())
    assert info.value.field_path == "allocation.devices.results[0].request"
