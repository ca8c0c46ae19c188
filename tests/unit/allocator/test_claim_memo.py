"""Allocate's claim memo (adapters/pb_mapping.py ClaimReader, owned by the servicer): the same
claim message is read once, a huge one is never kept, and it holds at most its bound."""

from __future__ import annotations

import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from protos.common.v1 import dra_pb2
from services.allocator.adapters.grpc.mapping import ClaimReader, query_from_pb
from services.common.errors import InvalidArgument


def request(selector: str, name: str = "c") -> pb.AllocateRequest:
    exact = dra_pb2.ExactDeviceRequest(
        device_class_name="gpu.nvidia.com", selectors=[dra_pb2.DeviceSelector(cel=selector)]
    )
    claim = dra_pb2.ResourceClaim(
        name=name, requests=[dra_pb2.DeviceRequest(name="gpu", exactly=exact)]
    )
    return pb.AllocateRequest(claims=[claim])


def test_the_same_claim_message_is_read_once() -> None:
    claims = ClaimReader()
    first = query_from_pb(request("device.attributes['gpu.nvidia.com'].index == 1"), claims)
    again = query_from_pb(request("device.attributes['gpu.nvidia.com'].index == 1"), claims)
    assert again.claims[0] is first.claims[0]


def test_a_claim_over_the_size_bound_is_read_but_not_kept() -> None:
    claims = ClaimReader()
    huge = "true" + " || false" * claims.max_claim_bytes
    first = query_from_pb(request(huge), claims)
    again = query_from_pb(request(huge), claims)
    assert again.claims[0] == first.claims[0]
    assert again.claims[0] is not first.claims[0]
    assert all(len(key) <= claims.max_claim_bytes for key in claims.kept())


def test_the_memo_keeps_at_most_its_bound_and_forgets_the_least_recently_used() -> None:
    claims = ClaimReader(max_claims=2)
    a = query_from_pb(request("true", "a"), claims).claims[0]
    query_from_pb(request("true", "b"), claims)
    assert query_from_pb(request("true", "a"), claims).claims[0] is a  # a: most recent now
    query_from_pb(request("true", "c"), claims)  # b goes
    assert len(claims.kept()) == 2
    assert query_from_pb(request("true", "a"), claims).claims[0] is a
    b_again = query_from_pb(request("true", "b"), claims).claims[0]
    assert query_from_pb(request("true", "b"), claims).claims[0] is b_again  # kept once more


def test_readers_do_not_share_a_memo() -> None:
    message = request("true")
    first = query_from_pb(message, ClaimReader()).claims[0]
    assert query_from_pb(message, ClaimReader()).claims[0] is not first


def test_without_a_reader_each_message_is_read_afresh() -> None:
    message = request("true")
    assert query_from_pb(message).claims[0] is not query_from_pb(message).claims[0]


def test_an_invalid_claim_is_not_kept_and_fails_with_its_path_every_time() -> None:
    claims = ClaimReader()
    bad = request("true", name="")
    for _ in range(2):
        with pytest.raises(InvalidArgument, match=r"claims\[0\]"):
            query_from_pb(bad, claims)
    assert claims.kept() == []


@pytest.mark.parametrize(
    ("max_claims", "max_claim_bytes"),
    [pytest.param(0, 8192, id="no-claims"), pytest.param(1, -1, id="negative-bytes")],
)
def test_a_reader_needs_a_positive_bound(max_claims: int, max_claim_bytes: int) -> None:
    with pytest.raises(ValueError, match="max_claims"):
        ClaimReader(max_claims, max_claim_bytes)
