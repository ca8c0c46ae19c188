"""serialize.py: the Kubernetes JSON shape, and parse(serialize(x)) == x."""

from __future__ import annotations

import json
import string
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.dra.model import (
    AllocationMode,
    AllocationResult,
    AttributeValue,
    ConfigSource,
    CounterSet,
    Device,
    DeviceAllocationConfiguration,
    DeviceCapacity,
    DeviceClass,
    DeviceCounterConsumption,
    DeviceRequest,
    DeviceRequestAllocationResult,
    DeviceSelector,
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
from services.common.dra.parse import decode_object, load_files, load_objects
from services.common.dra.quantity import Quantity
from services.common.dra.serialize import allocation_result_to_dict, device_to_dict, to_dict
from tests.unit.common.test_parse import CLAIM_YAML, DEVICE_CLASS_YAML, NODE_YAML, TEMPLATE_YAML

T4_SLICE = (
    Path(__file__).parents[2]
    / "data"
    / "resourceslices"
    / "openshift-v1.35_2x-tesla-t4_condensed.yaml"
)


def test_allocation_result_shape() -> None:
    allocation = AllocationResult(
        results=(
            DeviceRequestAllocationResult("gpus", "gpu.nvidia.com", "node-1", "gpu-0"),
            DeviceRequestAllocationResult(
                "gpus", "gpu.nvidia.com", "node-1", "gpu-1", admin_access=False
            ),
        ),
        config=(
            DeviceAllocationConfiguration(
                ConfigSource.FROM_CLASS,
                ("gpus",),
                OpaqueDeviceConfiguration("gpu.nvidia.com", {"sharing": {"strategy": "MPS"}}),
            ),
        ),
        node_selector=NodeSelector(
            (
                NodeSelectorTerm(
                    match_fields=(NodeSelectorRequirement("metadata.name", "In", ("node-1",)),)
                ),
            )
        ),
    )
    assert allocation_result_to_dict(allocation) == {
        "devices": {
            "results": [
                {
                    "request": "gpus",
                    "driver": "gpu.nvidia.com",
                    "pool": "node-1",
                    "device": "gpu-0",
                },
                {
                    "request": "gpus",
                    "driver": "gpu.nvidia.com",
                    "pool": "node-1",
                    "device": "gpu-1",
                    "adminAccess": False,
                },
            ],
            "config": [
                {
                    "source": "FromClass",
                    "requests": ["gpus"],
                    "opaque": {
                        "driver": "gpu.nvidia.com",
                        "parameters": {"sharing": {"strategy": "MPS"}},
                    },
                }
            ],
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
            ]
        },
    }


def test_device_shape_omits_empty_fields_and_prints_quantities_like_upstream() -> None:
    device = Device(
        "gpu-0",
        attributes={"index": AttributeValue.int_(0), "ok": AttributeValue.bool_(True)},
        capacity={
            "memory": DeviceCapacity(Quantity.parse("1.5Gi")),
            "sm": DeviceCapacity(Quantity.parse("132")),
        },
        taints=(DeviceTaint("example.com/ecc", TaintEffect.NO_SCHEDULE),),
    )
    assert device_to_dict(device) == {
        "name": "gpu-0",
        "attributes": {"index": {"int": 0}, "ok": {"bool": True}},
        "capacity": {"memory": {"value": "1536Mi"}, "sm": {"value": "132"}},
        "taints": [{"key": "example.com/ecc", "effect": "NoSchedule"}],
    }


def test_request_defaults_are_written_like_kubectl() -> None:
    claim = ResourceClaim(
        "c",
        requests=(
            DeviceRequest("one", exactly=ExactDeviceRequest("gpu.nvidia.com")),
            DeviceRequest(
                "all",
                exactly=ExactDeviceRequest("gpu.nvidia.com", allocation_mode=AllocationMode.ALL),
            ),
        ),
    )
    requests = to_dict(claim)["spec"]["devices"]["requests"]
    assert requests == [
        {
            "name": "one",
            "exactly": {
                "deviceClassName": "gpu.nvidia.com",
                "allocationMode": "ExactCount",
                "count": 1,
            },
        },
        {"name": "all", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}},
    ]
    assert decode_object(to_dict(claim)) == claim


def test_binding_conditions_are_written_as_the_api_names_them_and_read_back() -> None:
    device = Device(
        "gpu-0",
        binding_conditions=("dra.example.com/attached",),
        binding_failure_conditions=("dra.example.com/attach-failed",),
        binds_to_node=True,
    )
    written = device_to_dict(device)
    assert written == {
        "name": "gpu-0",
        "bindsToNode": True,
        "bindingConditions": ["dra.example.com/attached"],
        "bindingFailureConditions": ["dra.example.com/attach-failed"],
    }
    text = yaml.safe_dump(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "fabric"},
            "spec": {
                "driver": "gpu.nvidia.com",
                "pool": {"name": "fabric", "generation": 1, "resourceSliceCount": 1},
                "allNodes": True,
                "devices": [written],
            },
        }
    )
    [slice_] = load_objects(text)
    assert isinstance(slice_, ResourceSlice)
    assert slice_.devices == (device,)
    result = DeviceRequestAllocationResult(
        "gpus", "gpu.nvidia.com", "fabric", "gpu-0", binding_conditions=device.binding_conditions
    )
    assert allocation_result_to_dict(AllocationResult(results=(result,)))["devices"]["results"] == [
        {
            "request": "gpus",
            "driver": "gpu.nvidia.com",
            "pool": "fabric",
            "device": "gpu-0",
            "bindingConditions": ["dra.example.com/attached"],
        }
    ]


def test_real_slice_round_trips_through_json_and_yaml() -> None:
    (slice_,) = load_files([T4_SLICE])
    assert decode_object(to_dict(slice_)) == slice_
    assert load_objects(json.dumps(to_dict(slice_))) == [slice_]
    assert load_objects(yaml.safe_dump(to_dict(slice_))) == [slice_]
    assert to_dict(slice_)["spec"]["devices"][0]["capacity"] == {"memory": {"value": "15Gi"}}


def test_other_kinds_round_trip() -> None:
    for text in (CLAIM_YAML, TEMPLATE_YAML, DEVICE_CLASS_YAML, NODE_YAML):
        (obj,) = load_objects(text)
        assert decode_object(to_dict(obj)) == obj, text.splitlines()[1]


# --- property: valid objects survive serialize -> JSON -> parse ---------------------------

labels = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True)
identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
qualified = st.one_of(
    identifiers, st.tuples(labels, identifiers).map(lambda p: f"{p[0]}.example.com/{p[1]}")
)
quantities = st.builds(
    lambda n, suffix: Quantity.parse(f"{n}{suffix}"),
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "e3", "n"]),
)
semvers = st.tuples(*(st.integers(min_value=0, max_value=999),) * 3).map(
    lambda v: f"{v[0]}.{v[1]}.{v[2]}"
)
attribute_values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(AttributeValue.int_),
    st.booleans().map(AttributeValue.bool_),
    st.one_of(st.text(max_size=16), st.text(string.printable, max_size=64)).map(
        AttributeValue.string
    ),
    semvers.map(AttributeValue.version),
)
taints = st.builds(
    DeviceTaint,
    key=st.tuples(labels, labels).map(lambda p: f"{p[0]}.io/{p[1]}"),
    effect=st.sampled_from(TaintEffect),
    value=st.one_of(st.just(""), labels),
)


@st.composite
def devices(draw: st.DrawFn, name: str) -> Device:
    attributes = draw(st.dictionaries(qualified, attribute_values, max_size=12))
    capacity = draw(
        st.dictionaries(
            qualified.filter(lambda k: k not in attributes),
            quantities.map(DeviceCapacity),
            max_size=6,
        )
    )
    consumes = draw(st.booleans())
    return Device(
        name=name,
        attributes=attributes,
        capacity=capacity,
        consumes_counters=(DeviceCounterConsumption("set-0", {"memory": Quantity.parse("1Gi")}),)
        if consumes
        else (),
        taints=tuple(draw(st.lists(taints, max_size=4))),
    )


@st.composite
def slices(draw: st.DrawFn) -> ResourceSlice:
    count = draw(st.integers(min_value=0, max_value=4))
    node = draw(labels)
    return ResourceSlice(
        name=f"{node}-gpu.example.com",
        driver="gpu.example.com",
        pool=ResourcePool(
            node,
            draw(st.integers(min_value=0, max_value=2**40)),
            draw(st.integers(min_value=1, max_value=8)),
        ),
        devices=tuple(draw(devices(f"gpu-{i}")) for i in range(count)),
        node_name=node,
        shared_counters=(CounterSet("set-0", {"memory": draw(quantities)}),),
        labels=draw(st.dictionaries(labels, labels, max_size=2)),
    )


@settings(max_examples=60, deadline=None)
@given(slices())
def test_any_valid_slice_round_trips(slice_: ResourceSlice) -> None:
    assert load_objects(json.dumps(to_dict(slice_)), "generated.json") == [slice_]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(labels, min_size=1, max_size=4, unique=True),
    st.sampled_from(AllocationMode),
    st.integers(min_value=1, max_value=8),
    st.lists(st.sampled_from(TolerationOperator), max_size=2),
)
def test_any_valid_claim_round_trips(
    names: list[str], mode: AllocationMode, count: int, operators: list[TolerationOperator]
) -> None:
    exactly = ExactDeviceRequest(
        "gpu.example.com",
        selectors=(DeviceSelector("device.driver == 'gpu.example.com'"),),
        allocation_mode=mode,
        count=count if mode is AllocationMode.EXACT_COUNT else 1,
        tolerations=tuple(
            DeviceToleration("example.com/t", op, "v" if op is TolerationOperator.EQUAL else "")
            for op in operators
        ),
    )
    claim = ResourceClaim(
        "claim",
        namespace="ml",
        requests=tuple(DeviceRequest(name, exactly=exactly) for name in names),
        allocation=AllocationResult(
            tuple(
                DeviceRequestAllocationResult(n, "gpu.example.com", "pool-a", "gpu-0")
                for n in names
            )
        ),
    )
    assert load_objects(json.dumps(to_dict(claim))) == [claim]


def test_node_and_device_class_shapes() -> None:
    assert to_dict(Node("n", {"a": "b"})) == {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n", "labels": {"a": "b"}},
    }
    assert to_dict(DeviceClass("c", selectors=(DeviceSelector("true"),)))["spec"] == {
        "selectors": [{"cel": {"expression": "true"}}]
    }
