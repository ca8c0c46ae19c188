"""Allocate's claim memo (adapters/pb_mapping.py): the same claim message is read once, a huge
one is never kept."""

from __future__ import annotations

from protos.allocator.v1 import allocator_pb2 as pb
from protos.common.v1 import dra_pb2
from services.allocator.adapters import pb_mapping
from services.allocator.adapters.pb_mapping import query_from_pb


def request(selector: str) -> pb.AllocateRequest:
    exact = dra_pb2.ExactDeviceRequest(
        device_class_name="gpu.nvidia.com", selectors=[dra_pb2.DeviceSelector(cel=selector)]
    )
    claim = dra_pb2.ResourceClaim(
        name="c", requests=[dra_pb2.DeviceRequest(name="gpu", exactly=exact)]
    )
    return pb.AllocateRequest(claims=[claim])


def test_the_same_claim_message_is_read_once() -> None:
    first = query_from_pb(request("device.attributes['gpu.nvidia.com'].index == 1"))
    again = query_from_pb(request("device.attributes['gpu.nvidia.com'].index == 1"))
    assert again.claims[0] is first.claims[0]


def test_a_claim_over_the_size_bound_is_read_but_not_kept() -> None:
    huge = "true" + " || false" * pb_mapping._CLAIM_BYTES_KEPT
    first = query_from_pb(request(huge))
    again = query_from_pb(request(huge))
    assert again.claims[0] == first.claims[0]
    assert again.claims[0] is not first.claims[0]
    assert all(len(key) <= pb_mapping._CLAIM_BYTES_KEPT for key in pb_mapping._claims_read)
