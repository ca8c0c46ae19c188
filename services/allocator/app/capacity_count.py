"""Capacity: how many more copies of a unit (claims placed together on one node) fit now.

Per node, the solver places one unit, the unit is added to a private copy of the allocated
state, and the next unit is placed, until one does not fit. Nodes of one template in one free
state (core/groups.py) answer alike: each such group is counted once, on its first node met.
The count is exact for the solver's packing (units are placed as Allocate would place them, one
after another); it is a lower bound when a bound stopped it: the step budget, the deadline, or
`max_units` per node.

Each unit is attributed to the product name of its first device (`productName` of the device's
driver domain, as the NVIDIA driver publishes it), `unknown` without one.

Gangs (a query with `gang`, the same `count_capacity`): a unit is the gang's claims on one
node, counted per node as above; then per domain (the nodes sharing one value of the gang's
label; nodes without it do not count) the gangs that fit one after another are the largest k
with sum_i min(units_i, k) >= k * N: each gang takes N distinct nodes, so a node serves at most
min(units_i, k) of k gangs, and that many slots can always be dealt out so that no gang gets one
node twice. The total is as exact as the per-node counts it is computed from (a lower bound when
one was cut short). Devices that several nodes share (allNodes slices) are counted for each node
on its own, as for single-node units.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from services.allocator.app.messages import Accuracy, CapacityAnswer, NodeCount, Query
from services.allocator.app.placing import (
    Deadline,
    PlacementSearch,
    eligible_nodes,
    unique_share_id,
)
from services.allocator.core import Allocated, AllocatedState, ClusterSnapshot, GroupKey
from services.common.dra.model import AllocationResult, DeviceClass
from services.common.errors import DeadlineExceeded, GpuallocError

__all__ = ["count_capacity", "gangs_that_fit"]

UNKNOWN_MODEL = "unknown"


_Count = tuple[int, bool, dict[str, int]]  # units, cut short, units per model


@dataclass
class _Tally:
    nodes: list[NodeCount] = field(default_factory=list)
    models: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    cut: bool = False


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
    count = _count_gangs if query.gang is not None else _count_units
    return count(
        solver,
        snapshot,
        state,
        classes,
        query,
        deadline,
        generation=generation,
        max_units=max_units,
    )


def _count_units(
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
    """Count units per node (the pinned one, or every eligible node in name order)."""
    nodes = [query.node] if query.node else eligible_nodes(snapshot, query)
    budget = solver.budget(query, deadline)
    groups = {} if query.node else solver.node_groups(snapshot, state, classes, query)
    counted: dict[GroupKey, _Count] = {}  # per group of alike nodes: its members' count
    tally = _Tally()
    errors: list[GpuallocError] = []
    for node in nodes:
        if deadline.passed() or tally.steps >= budget.max_steps:
            tally.cut = True
            break
        group = groups.get(node)
        found = counted.get(group) if group is not None else None
        if found is None:
            try:
                found = _count_node(
                    solver, snapshot, state, classes, query, node, deadline, tally, max_units
                )
            except DeadlineExceeded:
                tally.cut = True
                break
            except GpuallocError as error:
                if query.node:
                    raise  # a pinned node's problem is the caller's to see
                errors.append(error)  # as Allocate: a node-only error (e.g. incomplete pool)
                continue  # skips the node
            if group is not None:
                counted[group] = found
        count, cut, models = found
        for model, units in models.items():
            tally.models[model] = tally.models.get(model, 0) + units
        tally.cut = tally.cut or cut
        if count:
            accuracy = Accuracy.LOWER_BOUND if cut else Accuracy.EXACT
            tally.nodes.append(NodeCount(node, count, accuracy))
    if errors and not tally.nodes:
        # As Allocate: an error of every node (an unknown device class, a CEL error) is the
        # request's, not "nothing fits".
        raise errors[0]
    return CapacityAnswer(
        total=sum(n.count for n in tally.nodes),
        accuracy=Accuracy.LOWER_BOUND if tally.cut else Accuracy.EXACT,
        nodes=tuple(tally.nodes),
        models=dict(sorted(tally.models.items())),
        generation=generation,
    )


def _count_node(
    solver: PlacementSearch,
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: Mapping[str, DeviceClass],
    query: Query,
    node: str,
    deadline: Deadline,
    tally: _Tally,
    max_units: int,
) -> _Count:
    """(units placed on `node`, whether a bound stopped the count, units per model); the
    steps taken go to `tally`."""
    pinned = Query(
        claims=query.claims,
        node=node,
        policy=query.policy,
        max_steps=query.max_steps,
        topology_constraints=query.topology_constraints,
    )
    count = 0
    models: dict[str, int] = {}
    while count < max_units:
        result = solver.place(snapshot, state, classes, pinned, deadline, share_id=unique_share_id)
        tally.steps += result.stats.steps
        if not isinstance(result, Allocated):
            return count, result.budget_exhausted, models
        count += 1
        model = _model(snapshot, result.allocations)
        models[model] = models.get(model, 0) + 1
        for allocation in result.allocations:
            state = state.with_allocation(allocation, "capacity")
    return count, True, models


def _count_gangs(
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
    """How many gangs of `query.gang` fit (see the module docstring); `nodes` are the units
    per node the total was computed from, `models` is empty."""
    gang = query.gang
    if gang is None:
        raise ValueError("_count_gangs needs a query with a gang")
    units = _count_units(
        solver,
        snapshot,
        state,
        classes,
        replace(query, gang=None),
        deadline,
        generation=generation,
        max_units=max_units,
    )
    label = gang.group_by_label
    domains: dict[str, list[int]] = {}
    counted: list[NodeCount] = []
    for count in units.nodes:
        node = snapshot.view(count.node).node
        value = (node.labels.get(label) if node is not None else None) if label else ""
        if value is None:
            continue
        domains.setdefault(value, []).append(count.count)
        counted.append(count)
    return CapacityAnswer(
        total=sum(gangs_that_fit(counts, gang.node_count) for counts in domains.values()),
        accuracy=units.accuracy,
        nodes=tuple(counted),
        generation=generation,
    )


def gangs_that_fit(units: Sequence[int], node_count: int) -> int:
    """The most gangs of `node_count` distinct nodes that nodes holding `units` units each can
    take: the largest k with sum(min(u, k)) >= k * node_count (that sum minus k * node_count is
    concave in k and 0 at k = 0, so the k that satisfy it are 0..answer)."""
    low, high = 0, sum(units) // node_count
    while low < high:
        k = (low + high + 1) // 2
        if sum(min(u, k) for u in units) >= k * node_count:
            low = k
        else:
            high = k - 1
    return low


def _model(snapshot: ClusterSnapshot, allocations: tuple[AllocationResult, ...]) -> str:
    for allocation in allocations:
        for result in allocation.results:
            entry = snapshot.device(result.device_id)
            if entry is None:
                continue
            attributes = entry.device.attributes
            value = attributes.get("productName") or attributes.get(
                f"{entry.id.driver}/productName"
            )
            return str(value.value) if value is not None else UNKNOWN_MODEL
    return UNKNOWN_MODEL
