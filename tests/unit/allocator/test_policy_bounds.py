"""Every placement policy's node group bound (nodechoice.py's A*) is admissible.

A group's bound must never exceed the node key of any placement on a node of the group, and a
template's groups must come in bound order with none that may fit left out; else the best-first
walk stops before the best node. Generated from what the bound may assume (scoring.GroupFacts):
a placement's subrequest ranks are no better than the template's best; with the best ranks it
takes at most `most` capacity (and misses at least the template's NVLink preferences); any
placement takes at least `least`; the fragmentation it adds is its loss (>= 0) less
`loss_weight` x what it takes; and a group's nodes are named no earlier than its first node.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.allocator.core import Policy
from services.allocator.core.groups import OrderEntry
from services.allocator.core.scoring import GroupFacts, NodeKey, PlacementPolicy

POLICIES = [pytest.param(p, id=p.name.lower().replace("_", "-")) for p in Policy]

capacities = st.fractions(min_value=0, max_value=16, max_denominator=12)
names = st.text(alphabet="abc-0123", min_size=1, max_size=4)


@st.composite
def group_facts(draw: st.DrawFn) -> GroupFacts:
    ranks = tuple(draw(st.lists(st.integers(0, 2), max_size=3)))
    least, most = sorted((draw(capacities), draw(capacities)))
    weight = draw(st.fractions(min_value=0, max_value=4, max_denominator=8))
    return GroupFacts(ranks, draw(st.integers(0, 2)), most, least, weight)


@st.composite
def placement_keys(
    draw: st.DrawFn, rules: PlacementPolicy, facts: GroupFacts, entry: OrderEntry
) -> NodeKey:
    """The real node key of one placement on a node of the group `entry`; often one as good
    as the bound allows in all but one term, so a bound that is too tight shows."""
    best = draw(st.booleans())
    ranks = facts.ranks if best else tuple(r + draw(st.integers(0, 2)) for r in facts.ranks)
    preferred = 0 if best else draw(st.integers(0, 2))
    if ranks == facts.ranks:
        edges = st.sampled_from((facts.least, facts.most))
        within = st.fractions(min_value=facts.least, max_value=facts.most, max_denominator=12)
        taken = draw(edges | within)
        implicit = facts.implicit_missed + (0 if best else draw(st.integers(0, 2)))
    else:  # worse ranks: no bound on what it takes or misses of the policy's own
        taken = facts.least + draw(capacities)
        implicit = draw(st.integers(0, 4))
    loss = draw(st.just(Fraction(0)) | capacities)
    node = entry.node + draw(st.text(alphabet="abc-0123", max_size=2))
    return rules.node_key(
        node, ranks, entry.capacity - taken, (preferred, implicit), loss - facts.loss_weight * taken
    )


@pytest.mark.parametrize("policy", POLICIES)
@given(data=st.data(), facts=group_facts(), capacity=capacities, node=names)
def test_group_bound_is_never_above_a_placements_key(
    policy: Policy, data: st.DataObject, facts: GroupFacts, capacity: Fraction, node: str
) -> None:
    rules = policy.rules
    entry = OrderEntry(capacity, node, frozenset())
    keys = data.draw(st.lists(placement_keys(rules, facts, entry), min_size=1, max_size=6))
    assert rules.bound(facts, entry) <= min(keys)


@pytest.mark.parametrize("policy", POLICIES)
@given(facts=group_facts(), groups=st.dictionaries(names, capacities, max_size=8))
def test_groups_come_in_bound_order_and_none_that_may_fit_is_left_out(
    policy: Policy, facts: GroupFacts, groups: dict[str, Fraction]
) -> None:
    rules = policy.rules
    order = sorted(OrderEntry(c, n, frozenset({i})) for i, (n, c) in enumerate(groups.items()))
    walked = list(rules.groups(facts, order, lambda: iter(sorted(order, key=lambda e: e.node))))
    bounds = [bound for bound, _ in walked]
    assert bounds == sorted(bounds)
    assert all(bound == rules.bound(facts, entry) for bound, entry in walked)
    may_fit = {e for e in order if e.capacity >= facts.least}
    assert may_fit <= {entry for _, entry in walked} <= set(order)
    assert len(walked) == len({entry for _, entry in walked})


@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_name_has_its_own_rules(policy: Policy) -> None:
    assert policy.rules.policy is policy
    assert Policy(str(policy)).rules is policy.rules
