"""A grant's stored JSON written as text from a run's shared parts is what encoding it whole
gives, byte for byte (adapters/store/redis_store.py: `_doc`, `_doc_parts`, `_allocation_json`,
`_json_text`): the Redis documents do not change with how they are written."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.allocator.adapters.store.redis_store import (
    _allocation_json,
    _doc,
    _doc_dict,
    _doc_parts,
    _grant_doc,
    _json_text,
)
from services.allocator.reservations.model import Hold, ReserveRequest
from services.common.dra.model import (
    AllocationResult,
    DeviceRequestAllocationResult,
    DeviceToleration,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
)
from services.common.dra.quantity import Quantity
from services.common.dra.serialize import allocation_result_to_dict

# names with what JSON escapes: quotes, backslashes, control characters, non-ASCII
_TEXT = st.text(
    st.characters(exclude_categories=["Cs"]), min_size=0, max_size=12
) | st.sampled_from(["nvidia.com", "gpu-0", 'a"b', "a\\b", "\n\t\x00\x1f\x7f", "ü€𝄞"])
_NAME = _TEXT.filter(bool)

_SELECTOR = NodeSelector(
    (NodeSelectorTerm(match_fields=(NodeSelectorRequirement("metadata.name", "In", ("n-1",)),)),)
)


@st.composite
def _results(draw: st.DrawFn) -> DeviceRequestAllocationResult:
    plain = draw(st.booleans())
    request, driver, pool, device = (draw(_TEXT if not plain else _NAME) for _ in range(4))
    if plain:
        return DeviceRequestAllocationResult(request, driver, pool, device)
    return DeviceRequestAllocationResult(
        request,
        driver,
        pool,
        device,
        admin_access=draw(st.sampled_from([None, True, False])),
        tolerations=draw(st.sampled_from([(), (DeviceToleration("k", value="v"),)])),
        share_id=draw(st.sampled_from([None, "share-1"])),
        consumed_capacity=draw(st.sampled_from([{}, {"memory": Quantity.parse("1Gi")}])),
        binding_conditions=draw(st.sampled_from([(), ("ready",)])),
    )


_ALLOCATIONS = st.builds(
    AllocationResult,
    st.lists(_results(), max_size=3).map(tuple),
    st.just(()),
    st.sampled_from([None, _SELECTOR]),
)


@settings(max_examples=300, deadline=None)
@given(text=_TEXT)
def test_json_text_is_orjsons(text: str) -> None:
    assert _json_text(text) == orjson.dumps(text).decode()


@settings(max_examples=300, deadline=None)
@given(allocation=_ALLOCATIONS)
def test_allocation_json_is_the_dicts(allocation: AllocationResult) -> None:
    assert (
        _allocation_json(allocation) == orjson.dumps(allocation_result_to_dict(allocation)).decode()
    )


@settings(max_examples=200, deadline=None)
@given(
    owner=_NAME,
    node=_NAME,
    names=st.lists(_NAME, min_size=1, max_size=2).map(tuple),
    allocations=st.lists(_ALLOCATIONS, min_size=1, max_size=2).map(tuple),
    key=_TEXT,
    labels=st.lists(st.tuples(_NAME, _TEXT), max_size=2).map(tuple),
    digest=_TEXT,
    priority=_TEXT,
)
def test_grant_documents_from_shared_parts_are_the_same_bytes(
    owner: str,
    node: str,
    names: tuple[str, ...],
    allocations: tuple[AllocationResult, ...],
    key: str,
    labels: tuple[tuple[str, str], ...],
    digest: str,
    priority: str,
) -> None:
    request = ReserveRequest(
        owner, node, names, allocations, Hold(), 60.0, key, labels, digest, priority
    )
    whole = orjson.dumps(_doc_dict(request)).decode()
    assert _doc(request) == whole
    assert _doc(request, _doc_parts(request)) == whole
    assert json.loads(whole)["allocations"] == [allocation_result_to_dict(a) for a in allocations]
    idem = _doc_parts(request)[2]
    assert idem == (json.dumps([owner, key]) if key else "")
    assert _grant_doc(request, {}) == (whole, idem)


@settings(max_examples=200, deadline=None)
@given(
    owner=_NAME,
    names=st.lists(_NAME, min_size=1, max_size=2).map(tuple),
    result=_results(),
    devices=st.lists(_NAME, min_size=1, max_size=4),
    key=_TEXT,
    selector=st.sampled_from([None, _SELECTOR]),
)
def test_a_runs_grant_documents_share_their_text_around_the_device(
    owner: str,
    names: tuple[str, ...],
    result: DeviceRequestAllocationResult,
    devices: list[str],
    key: str,
    selector: NodeSelector | None,
) -> None:
    """A node's grants of one run, alike but for the device: each one's document is what
    encoding it whole gives, the text around the device made once."""
    shapes: dict[tuple[object, ...], tuple[str, str, str]] = {}
    for name in devices:
        one = DeviceRequestAllocationResult(
            result.request, result.driver, result.pool, name, result.admin_access,
            result.tolerations, result.share_id, result.consumed_capacity,
            result.binding_conditions,
        )  # fmt: skip
        request = ReserveRequest(
            owner, "n-1", names, (AllocationResult((one,), (), selector),), Hold(), 60.0, key
        )
        expected = (orjson.dumps(_doc_dict(request)).decode(), _doc_parts(request)[2])
        assert _grant_doc(request, shapes) == expected


@pytest.mark.parametrize(
    "config",
    [pytest.param(True, id="opaque-config-by-the-stdlib"), pytest.param(False, id="plain")],
)
def test_documents_with_opaque_config_keep_the_stdlib(config: bool) -> None:
    from services.common.dra.model import (
        ConfigSource,
        DeviceAllocationConfiguration,
        OpaqueDeviceConfiguration,
    )

    result = DeviceRequestAllocationResult("gpu", "nvidia.com", "pool", "gpu-0")
    extra = (
        (
            DeviceAllocationConfiguration(
                ConfigSource.FROM_CLAIM,
                ("gpu",),
                OpaqueDeviceConfiguration("d", {"x": float("nan")}),
            ),
        )
        if config
        else ()
    )
    request = ReserveRequest(
        "alice", "n-1", ("ns/c",), (AllocationResult((result,), extra),), Hold(), 60.0
    )
    expected = (
        json.dumps(_doc_dict(request)) if config else orjson.dumps(_doc_dict(request)).decode()
    )
    assert _doc(request, _doc_parts(request)) == expected
