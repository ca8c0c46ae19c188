"""The Redis store's way back from Kubernetes-shaped allocations: the exact inverse of the
shared serializer, for every AllocationResult."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.allocator.adapters.store.reservation_codec import allocation_from_dict
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
from services.common.dra.serialize import allocation_result_to_dict

names = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)
quantities = st.builds(
    lambda n, unit: Quantity.parse(f"{n}{unit}"),
    st.integers(0, 10**6),
    st.sampled_from(["", "m", "Mi", "Gi", "k"]),
)
tolerations = st.builds(
    DeviceToleration,
    key=st.one_of(st.just(""), names),
    operator=st.sampled_from(TolerationOperator),
    value=st.one_of(st.just(""), names),
    effect=st.one_of(st.none(), st.sampled_from(TaintEffect)),
    toleration_seconds=st.one_of(st.none(), st.integers(0, 3600)),
)
results = st.builds(
    DeviceRequestAllocationResult,
    request=st.one_of(names, st.builds("{}/{}".format, names, names)),
    driver=st.just("gpu.nvidia.com"),
    pool=names,
    device=names,
    admin_access=st.one_of(st.none(), st.booleans()),
    tolerations=st.lists(tolerations, max_size=2).map(tuple),
    share_id=st.one_of(st.none(), st.uuids().map(str)),
    consumed_capacity=st.dictionaries(names, quantities, max_size=2),
)
configs = st.builds(
    DeviceAllocationConfiguration,
    source=st.sampled_from(ConfigSource),
    requests=st.lists(names, max_size=2).map(tuple),
    opaque=st.builds(
        OpaqueDeviceConfiguration,
        driver=st.just("gpu.nvidia.com"),
        parameters=st.dictionaries(names, st.one_of(st.integers(), names), max_size=2),
    ),
)
requirements = st.builds(
    NodeSelectorRequirement,
    key=names,
    operator=st.sampled_from(["In", "NotIn", "Exists"]),
    values=st.lists(names, max_size=2).map(tuple),
)
selectors = st.builds(
    NodeSelector,
    st.lists(
        st.builds(
            NodeSelectorTerm,
            match_expressions=st.lists(requirements, max_size=2).map(tuple),
            match_fields=st.lists(requirements, max_size=1).map(tuple),
        ),
        min_size=1,
        max_size=2,
    ).map(tuple),
)
allocations = st.builds(
    AllocationResult,
    results=st.lists(results, max_size=3).map(tuple),
    config=st.lists(configs, max_size=2).map(tuple),
    node_selector=st.one_of(st.none(), selectors),
)


@given(allocations)
def test_allocation_from_dict_inverts_the_shared_serializer(allocation: AllocationResult) -> None:
    assert allocation_from_dict(allocation_result_to_dict(allocation)) == allocation
