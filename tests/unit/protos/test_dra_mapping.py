"""DRA model <-> protobuf: round trips are lossless, bad input names its proto field path."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st

from protos.common.v1 import dra_pb2
from services.common.dra.model import (
    AllocationMode,
    AllocationResult,
    AttributeType,
    AttributeValue,
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    CapacityRequirements,
    ConfigSource,
    CounterSet,
    Device,
    DeviceAllocationConfiguration,
    DeviceCapacity,
    DeviceClaimConfiguration,
    DeviceClass,
    DeviceConstraint,
    DeviceCounterConsumption,
    DeviceID,
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
from services.common.errors import InvalidArgument
from services.common.pb import dra_mapping as m

DATA = Path(__file__).resolve().parents[2] / "data" / "protos"
Q = Quantity.parse


# --- representative model values --------------------------------------------------------------


def t4_slice_from_sample() -> ResourceSlice:
    """The real OpenShift 2x Tesla T4 slice (see tests/data/protos/PROVENANCE.md)."""
    doc = yaml.safe_load((DATA / "openshift-v1.35_2x-tesla-t4_condensed.yaml").read_text())
    spec = doc["spec"]
    devices = tuple(
        Device(
            name=d["name"],
            attributes={
                name: AttributeValue(AttributeType(kind), value)
                for name, attr in d["attributes"].items()
                for kind, value in attr.items()
            },
            capacity={name: DeviceCapacity(Q(c["value"])) for name, c in d["capacity"].items()},
        )
        for d in spec["devices"]
    )
    pool = spec["pool"]
    return ResourceSlice(
        name=doc["metadata"]["name"],
        driver=spec["driver"],
        pool=ResourcePool(pool["name"], pool["generation"], pool["resourceSliceCount"]),
        devices=devices,
        node_name=spec["nodeName"],
    )


def h100_dynamic_mig_slice() -> ResourceSlice:
    """Partitionable devices (KEP-4815): a full GPU and a MIG device sharing one counter set."""
    counters = {"memory": Q("80Gi"), "multiprocessors": Q("132")}
    counters |= {f"memory-slice-{i}": Q("1") for i in range(8)}
    full = Device(
        name="gpu-0",
        attributes={
            "type": AttributeValue.string("gpu"),
            "cudaComputeCapability": AttributeValue.version("9.0.0"),
            "index": AttributeValue.int_(0),
            "resource.kubernetes.io/pciBusID": AttributeValue.string("0000:1b:00.0"),
        },
        capacity={"memory": DeviceCapacity(Q("80Gi"))},
        consumes_counters=(DeviceCounterConsumption("gpu-0-counter-set", counters),),
        taints=(
            DeviceTaint(
                "gpu.nvidia.com/xid", TaintEffect.NO_SCHEDULE, "79", "2026-01-15T10:00:00Z"
            ),
        ),
        node_name="node-a",
    )
    mig = Device(
        name="gpu-0-mig-1g10gb-19-0",
        attributes={"type": AttributeValue.string("mig"), "migCapable": AttributeValue.bool_(True)},
        capacity={"memory": DeviceCapacity(Q("10Gi")), "multiprocessors": DeviceCapacity(Q("16"))},
        consumes_counters=(
            DeviceCounterConsumption(
                "gpu-0-counter-set", {"memory": Q("10Gi"), "memory-slice-0": Q("1")}
            ),
        ),
        node_selector=NodeSelector(
            (
                NodeSelectorTerm(
                    match_fields=(NodeSelectorRequirement("metadata.name", "In", ("node-a",)),)
                ),
            )
        ),
    )
    shared = Device(
        name="gpu-1",
        capacity={
            "memory": DeviceCapacity(
                Q("80Gi"),
                CapacityRequestPolicy(
                    default=Q("1Gi"),
                    valid_range=CapacityRequestPolicyRange(Q("1Gi"), Q("80Gi"), Q("1Gi")),
                ),
            ),
            "cores": DeviceCapacity(
                Q("100"), CapacityRequestPolicy(valid_values=(Q("10"), Q("50")))
            ),
        },
        allow_multiple_allocations=True,
        all_nodes=True,
    )
    return ResourceSlice(
        name="node-a-gpu.nvidia.com-x7k2p",
        driver="gpu.nvidia.com",
        pool=ResourcePool("node-a", 3, 2),
        devices=(full, mig, shared),
        per_device_node_selection=True,
        shared_counters=(CounterSet("gpu-0-counter-set", counters),),
        labels={"app": "nvidia-dra-driver"},
    )


def network_slice() -> ResourceSlice:
    selector = NodeSelector(
        (
            NodeSelectorTerm(
                match_expressions=(
                    NodeSelectorRequirement("nvidia.com/gpu.clique", "Exists"),
                    NodeSelectorRequirement("rack", "NotIn", ("r1", "r2")),
                )
            ),
        )
    )
    return ResourceSlice(
        name="fabric",
        driver="compute-domain.nvidia.com",
        pool=ResourcePool("fabric", 1, 1),
        devices=(
            Device(
                "channel-0",
                {"id": AttributeValue.int_(0)},
                binding_conditions=("dra.example.com/attached",),
                binding_failure_conditions=("dra.example.com/attach-failed",),
                binds_to_node=True,
            ),
        ),
        node_selector=selector,
        api_version="resource.k8s.io/v1beta2",
    )


def mig_device_class() -> DeviceClass:
    return DeviceClass(
        name="mig.nvidia.com",
        selectors=(DeviceSelector('device.attributes["gpu.nvidia.com"].type == "mig"'),),
        config=(
            OpaqueDeviceConfiguration(
                "gpu.nvidia.com",
                {"kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing", "replicas": 4}},
            ),
        ),
        labels={"tier": "inference"},
    )


def training_claim() -> ResourceClaim:
    toleration = DeviceToleration(
        "gpu.nvidia.com/xid",
        TolerationOperator.EXISTS,
        effect=TaintEffect.NO_EXECUTE,
        toleration_seconds=300,
    )
    allocation = AllocationResult(
        results=(
            DeviceRequestAllocationResult(
                "gpus", "gpu.nvidia.com", "node-a", "gpu-0", tolerations=(toleration,)
            ),
            DeviceRequestAllocationResult(
                "slice/small",
                "gpu.nvidia.com",
                "node-a",
                "gpu-1",
                admin_access=False,
                share_id="3f2a",
                consumed_capacity={"memory": Q("10Gi")},
                binding_conditions=("dra.example.com/attached",),
                binding_failure_conditions=("dra.example.com/attach-failed",),
            ),
        ),
        config=(
            DeviceAllocationConfiguration(
                ConfigSource.FROM_CLASS,
                (),
                OpaqueDeviceConfiguration("gpu.nvidia.com", {"a": [1, 2.5, None, True]}),
            ),
            DeviceAllocationConfiguration(
                ConfigSource.FROM_CLAIM, ("gpus",), OpaqueDeviceConfiguration("gpu.nvidia.com", {})
            ),
        ),
        node_selector=NodeSelector(
            (
                NodeSelectorTerm(
                    match_fields=(NodeSelectorRequirement("metadata.name", "In", ("node-a",)),)
                ),
            )
        ),
    )
    return ResourceClaim(
        name="train-job-17",
        namespace="team-a",
        uid="0b6a4f5e-1c2d-4e5f-8a9b-0c1d2e3f4a5b",
        requests=(
            DeviceRequest(
                "gpus",
                exactly=ExactDeviceRequest(
                    "gpu.nvidia.com",
                    selectors=(
                        DeviceSelector(
                            'device.capacity["gpu.nvidia.com"].memory'
                            '.compareTo(quantity("40Gi")) >= 0'
                        ),
                    ),
                    count=4,
                    admin_access=True,
                    tolerations=(toleration, DeviceToleration()),
                ),
            ),
            DeviceRequest(
                "everything",
                exactly=ExactDeviceRequest("gpu.nvidia.com", allocation_mode=AllocationMode.ALL),
            ),
            DeviceRequest(
                "slice",
                first_available=(
                    DeviceSubRequest(
                        "small",
                        "mig.nvidia.com",
                        capacity=CapacityRequirements({"memory": Q("10Gi")}),
                        tolerations=(DeviceToleration("k", TolerationOperator.EQUAL, "v"),),
                    ),
                    DeviceSubRequest("full", "gpu.nvidia.com", count=2),
                ),
            ),
        ),
        constraints=(
            DeviceConstraint(("gpus",), match_attribute="gpu.nvidia.com/productName"),
            DeviceConstraint(distinct_attribute="gpu.nvidia.com/uuid"),
        ),
        config=(
            DeviceClaimConfiguration(
                ("gpus",),
                OpaqueDeviceConfiguration("gpu.nvidia.com", {"mps": {"pinnedMemory": "10Gi"}}),
            ),
        ),
        allocation=allocation,
        labels={"queue": "a"},
        annotations={"slurm/job": "17"},
    )


@dataclass(frozen=True)
class RoundTrip:
    value: Any
    to_pb: Callable[[Any], Message]
    from_pb: Callable[[Any, str], Any]


ROUND_TRIPS: dict[str, RoundTrip] = {
    "real-openshift-t4-slice": RoundTrip(
        t4_slice_from_sample(), m.to_pb_resource_slice, m.from_pb_resource_slice
    ),
    "dynamic-mig-slice-with-counters-taints-per-device-access": RoundTrip(
        h100_dynamic_mig_slice(), m.to_pb_resource_slice, m.from_pb_resource_slice
    ),
    "network-slice-with-node-selector": RoundTrip(
        network_slice(), m.to_pb_resource_slice, m.from_pb_resource_slice
    ),
    "device-class-with-opaque-config": RoundTrip(
        mig_device_class(), m.to_pb_device_class, m.from_pb_device_class
    ),
    "claim-with-every-request-kind-and-allocation": RoundTrip(
        training_claim(), m.to_pb_resource_claim, m.from_pb_resource_claim
    ),
    "bare-claim-defaults": RoundTrip(
        ResourceClaim("c"), m.to_pb_resource_claim, m.from_pb_resource_claim
    ),
    "allocation-result": RoundTrip(
        training_claim().allocation, m.to_pb_allocation_result, m.from_pb_allocation_result
    ),
    "node": RoundTrip(Node("node-a", {"rack": "r7"}), m.to_pb_node, m.from_pb_node),
    "device-id": RoundTrip(
        DeviceID("gpu.nvidia.com", "node-a", "gpu-0"), m.to_pb_device_id, m.from_pb_device_id
    ),
}


@pytest.mark.parametrize("case", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_model_to_pb_to_model_is_lossless(case: RoundTrip) -> None:
    assert case.from_pb(case.to_pb(case.value), "") == case.value


@pytest.mark.parametrize("case", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_wire_and_json_forms_round_trip(case: RoundTrip) -> None:
    msg = case.to_pb(case.value)
    wire = type(msg).FromString(msg.SerializeToString())
    from_json = json_format.Parse(json_format.MessageToJson(msg), type(msg)())
    assert case.from_pb(wire, "") == case.value
    assert case.from_pb(from_json, "") == case.value


def test_json_names_are_kubernetes_names() -> None:
    as_json = json_format.MessageToDict(m.to_pb_resource_slice(h100_dynamic_mig_slice()))
    device = as_json["devices"][0]
    assert as_json["pool"] == {"name": "node-a", "generation": "3", "resourceSliceCount": "2"}
    assert as_json["perDeviceNodeSelection"] is True
    assert device["consumesCounters"][0]["counterSet"] == "gpu-0-counter-set"
    assert device["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert device["capacity"]["memory"] == {"value": {"value": "80Gi"}}
    assert device["taints"][0]["effect"] == "TAINT_EFFECT_NO_SCHEDULE"


def test_quantities_travel_in_canonical_form() -> None:
    assert m.to_pb_quantity(Q("1.5Gi")).value == "1536Mi"
    assert m.from_pb_quantity(dra_pb2.Quantity(value="40960Mi"), "q") == Q("40Gi")


def test_defaults_are_kubernetes_defaults() -> None:
    msg = dra_pb2.ResourceClaim(
        name="c",
        requests=[
            dra_pb2.DeviceRequest(
                name="r",
                exactly=dra_pb2.ExactDeviceRequest(
                    device_class_name="gpu.nvidia.com",
                    tolerations=[dra_pb2.DeviceToleration(key="k")],
                ),
            )
        ],
    )
    claim = m.from_pb_resource_claim(msg)
    exact = claim.requests[0].exactly
    assert claim.namespace == "default"
    assert exact is not None
    assert (exact.count, exact.allocation_mode) == (1, AllocationMode.EXACT_COUNT)
    assert exact.tolerations[0] == DeviceToleration("k", TolerationOperator.EQUAL, effect=None)


@given(
    st.integers(min_value=-(2**62), max_value=2**62),
    st.sampled_from(["", "m", "k", "Mi", "Gi", "e3"]),
)
def test_any_quantity_round_trips(number: int, suffix: str) -> None:
    quantity = Q(f"{number}{suffix}")
    assert m.from_pb_quantity(m.to_pb_quantity(quantity), "q") == quantity


_ATTRIBUTES = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(AttributeValue.int_),
    st.booleans().map(AttributeValue.bool_),
    st.text(max_size=64).map(AttributeValue.string),
    st.from_regex(r"\A[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\Z").map(AttributeValue.version),
)


@given(_ATTRIBUTES)
def test_any_attribute_round_trips(value: AttributeValue) -> None:
    assert m.from_pb_device_attribute(m.to_pb_device_attribute(value), "a") == value


# --- bad input: InvalidArgument with the exact proto field path -------------------------------


def _slice_pb() -> dra_pb2.ResourceSlice:
    return m.to_pb_resource_slice(h100_dynamic_mig_slice())


def _claim_pb() -> dra_pb2.ResourceClaim:
    return m.to_pb_resource_claim(training_claim())


def _class_pb() -> dra_pb2.DeviceClass:
    return m.to_pb_device_class(mig_device_class())


@dataclass(frozen=True)
class BadInput:
    make: Callable[[], Message]
    break_it: Callable[[Any], None]
    path: str
    says: str


def _convert(msg: Message) -> None:
    if isinstance(msg, dra_pb2.ResourceSlice):
        m.from_pb_resource_slice(msg, "slices[0]")
    elif isinstance(msg, dra_pb2.ResourceClaim):
        m.from_pb_resource_claim(msg, "claims[0]")
    elif isinstance(msg, dra_pb2.DeviceClass):
        m.from_pb_device_class(msg, "device_classes[0]")
    else:  # pragma: no cover - a table mistake
        raise AssertionError(type(msg))


def _set_exactly_and_first_available(c: dra_pb2.ResourceClaim) -> None:
    c.requests[0].first_available.add(name="x", device_class_name="y")


BAD_INPUTS: dict[str, BadInput] = {
    "unparsable-capacity-quantity": BadInput(
        _slice_pb,
        lambda s: s.devices[1].capacity["memory"].value.CopyFrom(dra_pb2.Quantity(value="10 GiB")),
        'slices[0].devices[1].capacity["memory"].value',
        "does not match",
    ),
    "empty-capacity-quantity": BadInput(
        _slice_pb,
        lambda s: s.devices[0].capacity["memory"].value.CopyFrom(dra_pb2.Quantity()),
        'slices[0].devices[0].capacity["memory"].value',
        "must not be empty",
    ),
    "capacity-without-value": BadInput(
        _slice_pb,
        lambda s: s.devices[0].capacity["memory"].ClearField("value"),
        'slices[0].devices[0].capacity["memory"].value',
        "must be set",
    ),
    "valid-range-without-min": BadInput(
        _slice_pb,
        lambda s: s.devices[2].capacity["memory"].request_policy.valid_range.ClearField("min"),
        'slices[0].devices[2].capacity["memory"].request_policy.valid_range.min',
        "must be set",
    ),
    "unparsable-valid-value": BadInput(
        _slice_pb,
        lambda s: (
            s.devices[2]
            .capacity["cores"]
            .request_policy.valid_values[1]
            .CopyFrom(dra_pb2.Quantity(value="x"))
        ),
        'slices[0].devices[2].capacity["cores"].request_policy.valid_values[1]',
        "does not match",
    ),
    "unparsable-shared-counter": BadInput(
        _slice_pb,
        lambda s: s.shared_counters[0].counters["memory"].CopyFrom(dra_pb2.Quantity(value="Gi")),
        'slices[0].shared_counters[0].counters["memory"]',
        "does not match",
    ),
    "unparsable-consumed-counter": BadInput(
        _slice_pb,
        lambda s: (
            s.devices[1]
            .consumes_counters[0]
            .counters["memory-slice-0"]
            .CopyFrom(dra_pb2.Quantity(value="1..0"))
        ),
        'slices[0].devices[1].consumes_counters[0].counters["memory-slice-0"]',
        "does not match",
    ),
    "attribute-with-empty-oneof": BadInput(
        _slice_pb,
        lambda s: s.devices[0].attributes["index"].ClearField("int"),
        'slices[0].devices[0].attributes["index"]',
        "exactly one of int, bool, string, version",
    ),
    "slice-without-node-access": BadInput(
        _slice_pb,
        lambda s: s.ClearField("per_device_node_selection"),
        "slices[0].node_access",
        "exactly one of",
    ),
    "slice-with-all-nodes-false": BadInput(
        _slice_pb, lambda s: setattr(s, "all_nodes", False), "slices[0].all_nodes", "must be true"
    ),
    "device-with-all-nodes-false": BadInput(
        _slice_pb,
        lambda s: setattr(s.devices[2], "all_nodes", False),
        "slices[0].devices[2].all_nodes",
        "must be true",
    ),
    "slice-without-pool": BadInput(
        _slice_pb, lambda s: s.ClearField("pool"), "slices[0].pool", "must be set"
    ),
    "pool-without-name": BadInput(
        _slice_pb, lambda s: setattr(s.pool, "name", ""), "slices[0].pool.name", "must not be empty"
    ),
    "taint-without-effect": BadInput(
        _slice_pb,
        lambda s: setattr(s.devices[0].taints[0], "effect", 0),
        "slices[0].devices[0].taints[0].effect",
        "must be set",
    ),
    "taint-with-unknown-effect": BadInput(
        _slice_pb,
        lambda s: setattr(s.devices[0].taints[0], "effect", 9),
        "slices[0].devices[0].taints[0].effect",
        "unknown taint effect 9",
    ),
    "negative-count": BadInput(
        _claim_pb,
        lambda c: setattr(c.requests[0].exactly, "count", -2),
        "claims[0].requests[0].exactly.count",
        "must not be negative",
    ),
    "negative-sub-request-count": BadInput(
        _claim_pb,
        lambda c: setattr(c.requests[2].first_available[1], "count", -1),
        "claims[0].requests[2].first_available[1].count",
        "must not be negative",
    ),
    "request-with-neither-exactly-nor-first-available": BadInput(
        _claim_pb,
        lambda c: c.requests[1].ClearField("exactly"),
        "claims[0].requests[1]",
        "exactly one of exactly, first_available",
    ),
    "request-with-both-exactly-and-first-available": BadInput(
        _claim_pb,
        _set_exactly_and_first_available,
        "claims[0].requests[0]",
        "exactly one of exactly, first_available",
    ),
    "unknown-allocation-mode": BadInput(
        _claim_pb,
        lambda c: setattr(c.requests[1].exactly, "allocation_mode", 7),
        "claims[0].requests[1].exactly.allocation_mode",
        "unknown allocation mode 7",
    ),
    "sub-request-without-class": BadInput(
        _claim_pb,
        lambda c: setattr(c.requests[2].first_available[1], "device_class_name", ""),
        "claims[0].requests[2].first_available[1].device_class_name",
        "must not be empty",
    ),
    "empty-cel-selector": BadInput(
        _claim_pb,
        lambda c: setattr(c.requests[0].exactly.selectors[0], "cel", " "),
        "claims[0].requests[0].exactly.selectors[0].cel",
        "must not be empty",
    ),
    "unparsable-capacity-request": BadInput(
        _claim_pb,
        lambda c: (
            c.requests[2]
            .first_available[0]
            .capacity.requests["memory"]
            .CopyFrom(dra_pb2.Quantity(value="ten"))
        ),
        'claims[0].requests[2].first_available[0].capacity.requests["memory"]',
        "does not match",
    ),
    "unknown-toleration-operator": BadInput(
        _claim_pb,
        lambda c: setattr(c.requests[0].exactly.tolerations[0], "operator", 5),
        "claims[0].requests[0].exactly.tolerations[0].operator",
        "unknown operator 5",
    ),
    "constraint-with-empty-oneof": BadInput(
        _claim_pb,
        lambda c: c.constraints[1].ClearField("distinct_attribute"),
        "claims[0].constraints[1].constraint",
        "exactly one of",
    ),
    "claim-config-without-opaque": BadInput(
        _claim_pb,
        lambda c: c.config[0].ClearField("opaque"),
        "claims[0].config[0].opaque",
        "must be set",
    ),
    "claim-config-without-driver": BadInput(
        _claim_pb,
        lambda c: setattr(c.config[0].opaque, "driver", ""),
        "claims[0].config[0].opaque.driver",
        "must not be empty",
    ),
    "opaque-parameter-infinity": BadInput(
        _claim_pb,
        lambda c: c.config[0].opaque.parameters.update({"limit": float("inf")}),
        'claims[0].config[0].opaque.parameters["limit"]',
        "JSON has no NaN or Infinity",
    ),
    "opaque-parameter-nan-in-a-list": BadInput(
        _claim_pb,
        lambda c: c.config[0].opaque.parameters.update({"a": {"b": [1, float("nan")]}}),
        'claims[0].config[0].opaque.parameters["a"]["b"][1]',
        "nan is not a JSON number",
    ),
    "allocation-opaque-parameter-negative-infinity": BadInput(
        _claim_pb,
        lambda c: c.allocation.config[0].opaque.parameters.update({"x": float("-inf")}),
        'claims[0].allocation.config[0].opaque.parameters["x"]',
        "-inf is not a JSON number",
    ),
    "allocation-config-without-source": BadInput(
        _claim_pb,
        lambda c: setattr(c.allocation.config[1], "source", 0),
        "claims[0].allocation.config[1].source",
        "must be set",
    ),
    "unparsable-consumed-capacity": BadInput(
        _claim_pb,
        lambda c: (
            c.allocation.results[1]
            .consumed_capacity["memory"]
            .CopyFrom(dra_pb2.Quantity(value="-"))
        ),
        'claims[0].allocation.results[1].consumed_capacity["memory"]',
        "does not match",
    ),
    "result-without-device": BadInput(
        _claim_pb,
        lambda c: setattr(c.allocation.results[0], "device", ""),
        "claims[0].allocation.results[0].device",
        "must not be empty",
    ),
    "claim-without-name": BadInput(
        _claim_pb, lambda c: setattr(c, "name", ""), "claims[0].name", "must not be empty"
    ),
    "device-class-with-empty-selector": BadInput(
        _class_pb,
        lambda d: setattr(d.selectors[0], "cel", ""),
        "device_classes[0].selectors[0].cel",
        "must not be empty",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_names_its_field_path(case: BadInput) -> None:
    msg = case.make()
    case.break_it(msg)
    with pytest.raises(InvalidArgument) as raised:
        _convert(msg)
    error = raised.value
    assert error.field_path == case.path
    assert [v.path for v in error.violations] == [case.path]
    assert case.says in error.violations[0].description
    assert str(error).startswith(f"{case.path}: ")


def test_top_level_paths_start_at_the_message() -> None:
    with pytest.raises(InvalidArgument) as raised:
        m.from_pb_device_id(dra_pb2.DeviceID(driver="d", pool="p"))
    assert raised.value.field_path == "device"


@pytest.mark.parametrize(
    ("path", "field", "key", "expected"),
    [
        pytest.param("", "claims", None, "claims", id="top-level-field"),
        pytest.param("claims", 0, None, "claims[0]", id="index"),
        pytest.param("claims[0]", "requests", None, "claims[0].requests", id="nested-field"),
        pytest.param("d", "attributes", 'a"b', 'd.attributes["a\\"b"]', id="map-key-escaped"),
    ],
)
def test_field_path(path: str, field: str | int, key: str | None, expected: str) -> None:
    assert m.field_path(path, field, key) == expected
