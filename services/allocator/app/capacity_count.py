"""Capacity: how many more copies of a unit (claims placed together on one node) fit now.

The core counts (core/counting.py: a batch of identical units placed until one does not fit,
per node group); this module asks it for the query's nodes — the pinned one, or every eligible
node in name order (a node selector, `max_nodes`) — with the query's budget and deadline, and
shapes the answer: per node and per GPU model, EXACT or LOWER_BOUND (a bound stopped the count:
the step budget, the deadline, or `max_units` per node).

Gangs (a query with `gang`, the same `count_capacity`): a unit is the gang's claims on one
node, counted per node as above; then per domain (the nodes sharing one value of the gang's
label; nodes without it do not count) the gangs that fit one after another are the largest k
with sum_i min(units_i, k) >= k * N (core.gangs_that_fit): each gang takes N distinct nodes, so
a node serves at most min(units_i, k) of k gangs, and that many slots can always be dealt out
so that no gang gets one node twice. The total is as exact as the per-node counts it is
computed from. Devices that several nodes share (allNodes slices) are counted for each node on
its own, as for single-node units.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from services.allocator.app.messages import Accuracy, CapacityAnswer, NodeCount, Query
from services.allocator.app.placing import (
    Deadline,
    PlacementSearch,
    eligible_nodes,
    topology_constraints,
)
from services.allocator.core import (
    AllocatedState,
    ClusterSnapshot,
    UnitCount,
    count_units,
    gangs_that_fit,
)
from services.common.dra.model import DeviceClass

__all__ = ["count_capacity", "gangs_that_fit"]


def count_capacity(
    solver: PlacementSearch,
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: Mapping[str, DeviceClass],
    query: Query,
    deadline: Deadline,
    *,
    generation: int,
    max_units: int = 1024,
) -> CapacityAnswer:
    """How many units fit, per node (the pinned one, or every eligible node in name order);
    for a gang's query, how many gangs (see the module docstring)."""
    units = _units(solver, snapshot, state, classes, replace(query, gang=None), deadline, max_units)
    if query.gang is None:
        return CapacityAnswer(
            total=units.total,
            accuracy=Accuracy.LOWER_BOUND if units.cut else Accuracy.EXACT,
            nodes=_node_counts(units),
            models=dict(units.models),
            generation=generation,
        )
    label = query.gang.group_by_label
    domains: dict[str, list[int]] = {}
    counted: list[NodeCount] = []
    for count in _node_counts(units):
        node = snapshot.view(count.node).node
        value = (node.labels.get(label) if node is not None else None) if label else ""
        if value is None:
            continue
        domains.setdefault(value, []).append(count.count)
        counted.append(count)
    return CapacityAnswer(
        total=sum(gangs_that_fit(counts, query.gang.node_count) for counts in domains.values()),
        accuracy=Accuracy.LOWER_BOUND if units.cut else Accuracy.EXACT,
        nodes=tuple(counted),
        generation=generation,
    )


def _units(
    solver: PlacementSearch,
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: Mapping[str, DeviceClass],
    query: Query,
    deadline: Deadline,
    max_units: int,
) -> UnitCount:
    nodes = [query.node] if query.node else eligible_nodes(snapshot, query)
    return count_units(
        snapshot,
        state,
        classes,
        query.claims,
        nodes,
        pinned=bool(query.node),
        policy=query.policy or solver.policy,
        selectors=solver.selectors,
        budget=solver.budget(query, deadline),
        topology_constraints=topology_constraints(query),
        max_units=max_units,
    )


def _node_counts(units: UnitCount) -> tuple[NodeCount, ...]:
    return tuple(
        NodeCount(n.node, n.count, Accuracy.LOWER_BOUND if n.cut else Accuracy.EXACT)
        for n in units.nodes
    )
