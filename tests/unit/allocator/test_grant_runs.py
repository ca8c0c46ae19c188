"""A run's grants on one node written as what they share plus what differs is what writing each
grant alone gives (adapters/store/redis_store.py: `_grant_call` with `_continues`, `reserve`'s
inline check of a one-grant placement, `_selector_json`), byte for byte and error for error."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.allocator.adapters.store import redis_store
from services.allocator.adapters.store.redis_store import (
    RedisReservationStore,
    _doc,
    _Grant,
    _granted,
    _idempotency_field,
    _selector_json,
)
from services.allocator.reservations.model import (
    Hold,
    LimitedUse,
    ReserveRequest,
    validate_placement,
)
from services.common.dra.model import (
    AllocationResult,
    DeviceRequestAllocationResult,
    DeviceToleration,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
)
from services.common.dra.serialize import node_selector_to_dict
from services.common.errors import GpuallocError, InvalidArgument

_TEXT = st.text(st.characters(exclude_categories=["Cs"]), min_size=0, max_size=8) | st.sampled_from(
    ["", "metadata.name", "In", 'a"b', "a\\b", "\n\x00", "ü€𝄞"]
)

_REQUIREMENTS = st.builds(
    NodeSelectorRequirement, _TEXT, _TEXT, st.lists(_TEXT, max_size=3).map(tuple)
)
_SELECTORS = st.builds(
    NodeSelector,
    st.lists(
        st.builds(
            NodeSelectorTerm,
            st.lists(_REQUIREMENTS, max_size=2).map(tuple),
            st.lists(_REQUIREMENTS, max_size=2).map(tuple),
        ),
        max_size=3,
    ).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(selector=_SELECTORS)
def test_selector_json_is_the_dicts(selector: NodeSelector) -> None:
    assert _selector_json(selector) == orjson.dumps(node_selector_to_dict(selector)).decode()


def _selector(node: str) -> NodeSelector:
    return NodeSelector(
        (NodeSelectorTerm(match_fields=(NodeSelectorRequirement("metadata.name", "In", (node,)),)),)
    )


_NODE_SELECTORS = (None, _selector("n-1"), _selector("n-1"))  # two alike, not the same object


@st.composite
def _requests(draw: st.DrawFn) -> ReserveRequest:
    """Requests on node n-1 as a run makes them: mostly alike, now and then not."""
    device = draw(st.sampled_from(["gpu-0", "gpu-1", 'gpu-"2"', "gpu-ü"]))
    result = DeviceRequestAllocationResult(
        draw(st.sampled_from(["gpu", "other"])),
        draw(st.sampled_from(["nvidia.com", "amd.com"])),
        draw(st.sampled_from(["n-1", "pool-b"])),
        device,
        tolerations=draw(st.sampled_from([(), (), (), (DeviceToleration("k", value="v"),)])),
    )
    results: tuple[DeviceRequestAllocationResult, ...] = (result,)
    if draw(st.integers(0, 5)) == 0:  # two results in one allocation
        results += (DeviceRequestAllocationResult("gpu", "nvidia.com", "n-1", "gpu-9"),)
    allocation = AllocationResult(results, (), draw(st.sampled_from(_NODE_SELECTORS)))
    allocations: tuple[AllocationResult, ...] = (allocation,)
    names: tuple[str, ...] = (draw(st.sampled_from(["default/a", "default/b"])),)
    if draw(st.integers(0, 5)) == 0:  # two claims
        allocations += (AllocationResult(results, (), None),)
        names += ("default/c",)
    return ReserveRequest(
        draw(st.sampled_from(["bench", "team-a"])),
        "n-1",
        names,
        allocations,
        Hold((f"nvidia.com/n-1/{device}",)),
        60.0,
        draw(st.sampled_from(["", "", "key-1"])),
        draw(st.sampled_from([(), (("a", "b"),)])),
        draw(st.sampled_from(["", "digest"])),
        draw(st.sampled_from(["", "high"])),
    )


@settings(max_examples=300, deadline=None)
@given(requests=st.lists(_requests(), min_size=1, max_size=8))
def test_a_nodes_grants_are_written_as_each_alone(requests: list[ReserveRequest]) -> None:
    """One node's step: each grant's `doc` and `idem` are what `_doc` and `_idempotency_field`
    write for it alone, whatever the grants before it were."""
    store = RedisReservationStore("redis://127.0.0.1:1")
    try:
        grants = [
            _Grant(request, request.hold, f"res-{i}@n-1", 60000)
            for i, request in enumerate(requests)
        ]
        call = store._grant_call("n-1", grants)
        fields = orjson.loads(call.args[-1])
        for request, sent in zip(requests, fields, strict=True):
            assert sent[6] == _doc(request)
            assert sent[2] == _idempotency_field(request.owner, request.idempotency_key)
    finally:
        store.close()


def _on_device(request: ReserveRequest, device: str) -> ReserveRequest:
    """`request` for another device: what a run's next grant is (alike but for the device)."""
    allocation = request.allocations[0]
    result = allocation.results[0]
    moved = DeviceRequestAllocationResult(
        result.request, result.driver, result.pool, device, result.admin_access,
        result.tolerations, result.share_id, result.consumed_capacity,
        result.binding_conditions,
    )  # fmt: skip
    return ReserveRequest(
        request.owner,
        request.node,
        tuple(request.claim_names),
        (AllocationResult((moved, *allocation.results[1:]), (), allocation.node_selector),),
        Hold((f"nvidia.com/n-1/{device}",)),
        request.lease_seconds,
        request.idempotency_key,
        request.labels,
        request.request_digest,
        request.priority_class,
    )


@settings(max_examples=300, deadline=None)
@given(
    drawn=st.lists(
        st.tuples(_requests(), st.sampled_from(["", "", "gpu-3", "gpu-4", 'gpu-"5"'])),
        min_size=1,
        max_size=8,
    ),
    taken=st.lists(st.booleans(), min_size=8, max_size=8),
    leases=st.lists(st.sampled_from([60000, 60000, 1000]), min_size=8, max_size=8),
)
def test_a_runs_reservations_are_made_as_each_alone(
    drawn: list[tuple[ReserveRequest, str]], taken: list[bool], leases: list[int]
) -> None:
    """`_record`'s reservations of a run's grants (the fields the run shares copied) are what
    `_granted` makes for each grant alone, whichever grants before it took their hold, and
    whatever their leases."""
    requests: list[ReserveRequest] = []
    for request, device in drawn:  # a device: the one before it again on that device
        requests.append(_on_device(requests[-1], device) if requests and device else request)
    store = RedisReservationStore("redis://127.0.0.1:1")
    try:
        grants = [
            _Grant(request, request.hold, f"res-{i}@n-1", leases[i])
            for i, request in enumerate(requests)
        ]
        call = store._grant_call("n-1", grants)
        now = 1_700_000_000_000
        answers: list[Any] = [
            10 + i if taken[i] else [b"conflict", [[b"device", b"gpu-0", b"res-x@n-1"]]]
            for i in range(len(grants))
        ]
        store._record(call, [now, answers, []])
        for grant, answer in zip(grants, answers, strict=True):
            if isinstance(answer, int):
                expected = _granted(grant, answer, now, now + grant.lease_ms)
                assert grant.reservation == expected
                assert grant.reservation.__dict__ == expected.__dict__
                assert grant.created
            else:
                assert grant.reservation is None
                assert grant.conflicts
    finally:
        store.close()


_GOOD = ReserveRequest(
    "bench",
    "n-1",
    ("default/a",),
    (AllocationResult((DeviceRequestAllocationResult("gpu", "nvidia.com", "n-1", "gpu-0"),)),),
    Hold(("nvidia.com/n-1/gpu-0",)),
    60.0,
)


def _with(**changes: Any) -> ReserveRequest:
    fields = {**_GOOD.__dict__, **changes}
    return ReserveRequest(**fields)


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(_GOOD, id="common"),
        pytest.param(_with(owner=""), id="no-owner"),
        pytest.param(_with(node=""), id="no-node"),
        pytest.param(_with(node="n{1}"), id="braces-in-node"),
        pytest.param(_with(lease_seconds=0.0), id="zero-lease"),
        pytest.param(_with(lease_seconds=math.nan), id="nan-lease"),
        pytest.param(_with(lease_seconds=math.inf), id="infinite-lease"),
        pytest.param(_with(claim_names=()), id="no-claim-name"),
        pytest.param(_with(hold=Hold(())), id="no-device"),
        pytest.param(_with(hold=Hold(("",))), id="empty-device"),
        pytest.param(_with(hold=Hold(("a", "a"))), id="device-twice"),
        pytest.param(_with(hold=Hold(("a", "b"))), id="two-devices"),
        pytest.param(_with(hold=Hold(("a",), (LimitedUse("k", 1, 2),))), id="with-a-use"),
        pytest.param(_with(hold=Hold(("a",), (LimitedUse("k", -1, 2),))), id="bad-use"),
    ],
)
def test_a_one_grant_placement_is_checked_as_every_placement(
    request_: ReserveRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`reserve`'s inline check of a one-grant placement refuses what `validate_placement`
    and the node's hash tag check refuse, with the same error, and sends the rest."""
    sent: list[Any] = []

    def step(self: RedisReservationStore, calls: list[Any]) -> list[Any]:
        sent.extend(calls)
        return [[1_700_000_000_000, list(range(1, len(c.grants) + 1)), []] for c in calls]

    monkeypatch.setattr(RedisReservationStore, "_grant_batch", step)
    store = RedisReservationStore("redis://127.0.0.1:1")
    try:
        (outcome,) = store.reserve([[request_]])
    finally:
        store.close()
    expected = validate_placement([request_])
    if not isinstance(expected, GpuallocError) and ("{" in request_.node or "}" in request_.node):
        expected = redis_store._check_nodes([request_], expected, {})
    if isinstance(expected, GpuallocError):
        assert isinstance(outcome, InvalidArgument)
        assert str(outcome) == str(expected)
        assert not sent
    else:
        assert not isinstance(outcome, GpuallocError)
        (reservation,) = outcome
        assert reservation.hold == expected[0]
        assert reservation.node == request_.node
        assert [g.request for c in sent for g in c.grants] == [request_]
