"""Values made field by field (core/made.py) are the values their constructors make.

`made(cls, fields)` stands for `cls(**fields)` where a batch makes one value per item (the
results of an item that takes the last node again, core/results.py and core/solver.py): the
same value — equal, hashed, shown, copied, pickled and replaced alike — for every class it is
used for, and `check_made` refuses classes whose `__init__` does more than set its fields.
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.allocator.core.explain import Explanation, Summary, SummaryKind
from services.allocator.core.made import check_made, made
from services.allocator.core.outcome import Allocated, NodePlacement, Stats
from services.allocator.core.scoring import Score
from services.common.dra.model import (
    AllocationResult,
    DeviceRequestAllocationResult,
    DeviceToleration,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    TolerationOperator,
)
from services.common.dra.quantity import Quantity

_names = st.text("abc-/", min_size=0, max_size=6)
_optional_bool = st.sampled_from([None, True, False])
_tolerations = st.lists(
    st.builds(DeviceToleration, key=_names, operator=st.sampled_from(list(TolerationOperator))),
    max_size=2,
).map(tuple)
_conditions = st.lists(_names, max_size=2).map(tuple)

device_results: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {
        "request": _names,
        "driver": _names,
        "pool": _names,
        "device": _names,
        "admin_access": _optional_bool,
        "tolerations": _tolerations,
        "share_id": st.none() | _names,
        "consumed_capacity": st.dictionaries(
            _names, st.integers(0, 9).map(lambda n: Quantity.parse(str(n))), max_size=2
        ),
        "binding_conditions": _conditions,
        "binding_failure_conditions": _conditions,
    }
)


def _selector(node: str) -> NodeSelector:
    return NodeSelector(
        (NodeSelectorTerm(match_fields=(NodeSelectorRequirement("metadata.name", "In", (node,)),)),)
    )


def assert_same(cls: Any, fields: dict[str, Any]) -> None:
    want: Any = cls(**fields)
    got: Any = made(cls, {f.name: fields[f.name] for f in dataclasses.fields(cls)})  # in order
    assert type(got) is cls
    assert got == want and want == got
    try:
        hashed: int | None = hash(want)
    except TypeError:  # a field holds a dict
        hashed = None
    if hashed is None:
        with pytest.raises(TypeError):
            hash(got)
    else:
        assert hash(got) == hashed
    assert repr(got) == repr(want)
    assert vars(got) == vars(want) and list(vars(got)) == list(vars(want))
    assert dataclasses.astuple(got) == dataclasses.astuple(want)
    assert pickle.loads(pickle.dumps(got)) == want
    assert dataclasses.replace(got) == want
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.__setattr__(dataclasses.fields(cls)[0].name, None)


@given(fields=device_results)
def test_a_device_result_made_field_by_field_is_the_constructed_one(
    fields: dict[str, Any],
) -> None:
    assert_same(DeviceRequestAllocationResult, fields)


@given(
    results=st.lists(device_results.map(lambda f: DeviceRequestAllocationResult(**f)), max_size=3),
    node=st.none() | _names,
)
def test_an_allocation_result_made_field_by_field_is_the_constructed_one(
    results: list[DeviceRequestAllocationResult], node: str | None
) -> None:
    selector = None if node is None else _selector(node)
    assert_same(
        AllocationResult, {"results": tuple(results), "config": (), "node_selector": selector}
    )


@given(node=st.none() | _names, scored=st.booleans(), steps=st.integers(0, 9))
def test_a_placement_made_field_by_field_is_the_constructed_one(
    node: str | None, scored: bool, steps: int
) -> None:
    score = Score(steps, 8, Fraction(1), Fraction(steps), ranks=(0,)) if scored else None
    allocation = AllocationResult((DeviceRequestAllocationResult("r", "d", "p", "x"),))
    fields: dict[str, Any] = {"node": node, "allocations": (allocation,), "score": score}
    assert_same(NodePlacement, fields)
    placement = NodePlacement(**fields)
    stats = Stats(steps, 0, 3, 2, 1, 3, False)
    explanation = Explanation(summary=Summary(SummaryKind.ALLOCATED, node=node))
    for domain in (None, "rack-1"):
        for explained in (None, explanation):
            assert_same(
                Allocated,
                {
                    "placements": (placement,),
                    "stats": stats,
                    "explanation": explained,
                    "domain": domain,
                },
            )


@dataclass(frozen=True)
class _PostInit:
    a: int

    def __post_init__(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class _Slots:
    a: int


@dataclass(frozen=True)
class _Defaulted:
    a: int
    b: dict[str, int] = field(default_factory=dict)


@pytest.mark.parametrize(
    ("cls", "names"),
    [
        pytest.param(_PostInit, ("a",), id="post-init"),
        pytest.param(_Slots, ("a",), id="slots"),
        pytest.param(_Defaulted, ("a",), id="a-field-left-out"),
        pytest.param(_Defaulted, ("b", "a"), id="fields-out-of-order"),
        pytest.param(int, (), id="not-a-dataclass"),
    ],
)
def test_a_class_whose_init_does_more_is_refused(cls: type, names: tuple[str, ...]) -> None:
    with pytest.raises(TypeError):
        check_made(cls, names)
