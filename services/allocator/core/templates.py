"""Node templates: nodes that are the same machine, up to names, found once per snapshot.

A cluster of 100,000 GPUs is a few hardware models repeated thousands of times. Two nodes whose
devices have the same names, shapes, counters and CEL-visible content — except for attributes
that identify a device on one node only (`uuid`, `parentUUID`: never shared between nodes) —
and the same topology answer every search alike once their free state is the same: device i of
one can stand for device i of the other. The solver searches one node per (template, free
state) group instead of every node (nodechoice.py).

A node is left out of every template ("ungrouped", searched on its own as before) when it sees
a device that is not its own (network-attached pools, per-device node selection shared with
other nodes) or a multi-allocatable device (its capacity shares make every state different).

A plan may only use templates when none of its selectors or constraints reads an abstracted
attribute (`reads_abstracted`); otherwise the solver searches every node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from services.allocator.core.snapshot import DeviceEntry, NodeView
from services.common.dra.model import DeviceID

if TYPE_CHECKING:
    from services.allocator.core.snapshot import ClusterSnapshot
    from services.allocator.core.topology import NodeTopology

__all__ = ["NodeTemplate", "NodeTemplates", "node_templates", "split_name"]


def node_templates(snapshot: ClusterSnapshot) -> NodeTemplates:
    """The snapshot's nodes grouped by machine shape, built on first use and kept with it."""
    return snapshot.derived(NodeTemplates)


@dataclass(eq=False)
class NodeTemplate:
    """One machine shape; `devices` are its first node's, in view order."""

    id: int
    devices: tuple[DeviceEntry, ...]
    nodes: list[str]  # every node of the template, sorted by name
    # counter sets: per set (the devices' local counter keys), its totals
    counter_totals: tuple[tuple[tuple[str, str, str], Fraction], ...]
    # per device: indices into counter_totals it consumes, with amounts
    consumption: tuple[tuple[tuple[int, Fraction], ...], ...]
    # per counter set (slice index, set name): the counters' indices into counter_totals
    sets: tuple[tuple[int, ...], ...]
    pool_of: tuple[int, ...]  # per device: the ordinal of its pool in the node's view
    caches: dict[Any, Any] = field(default_factory=dict)  # per-plan results (nodechoice.py)
    _capacity: dict[frozenset[int], Fraction] = field(default_factory=dict)

    def free_capacity(self, in_use: frozenset[int]) -> Fraction:
        """Free device-equivalents with `in_use` held (scoring.free_capacity, memoised)."""
        found = self._capacity.get(in_use)
        if found is None:
            used = [Fraction(0)] * len(self.counter_totals)
            plain = 0
            for index, entry in enumerate(self.devices):
                consumption = self.consumption[index]
                if index in in_use:
                    for counter, amount in consumption:
                        used[counter] += amount
                elif not entry.counters:
                    plain += 1
            found = Fraction(plain) + sum(
                (_set_share(self.counter_totals, members, used) for members in self.sets),
                Fraction(0),
            )
            if len(self._capacity) < 65536:
                self._capacity[in_use] = found
        return found


def _set_share(
    totals: tuple[tuple[tuple[str, str, str], Fraction], ...],
    members: tuple[int, ...],
    used: list[Fraction],
) -> Fraction:
    shares = [max(Fraction(0), totals[i][1] - used[i]) / totals[i][1] for i in members]
    return sum(shares, Fraction(0)) / len(shares) if shares else Fraction(0)


class NodeTemplates:
    """Every node's template (or none), and where each node-local device sits in it."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.templates: list[NodeTemplate] = []
        self.of_node: dict[str, NodeTemplate] = {}
        self.slot: dict[DeviceID, tuple[str, int]] = {}  # node-local device -> (node, index)
        self.ungrouped: list[str] = []
        views = [v for v in snapshot.views() if v.device_count > 0]
        self.abstracted = _node_local_attributes(views)
        by_signature: dict[Any, NodeTemplate] = {}
        profiles: dict[int, int] = {}
        interned: dict[Any, int] = {}
        for view in views:
            assert view.name is not None
            signature = _signature(
                view, snapshot.topology(view.name), self._abstract(profiles, interned)
            )
            if signature is None:
                self.ungrouped.append(view.name)
                continue
            template = by_signature.get(signature)
            if template is None:
                template = by_signature[signature] = _template(len(self.templates), view)
                self.templates.append(template)
            else:
                template.nodes.append(view.name)
            self.of_node[view.name] = template
            for index, entry in enumerate(view.devices()):
                self.slot[entry.id] = (view.name, index)

    def _abstract(
        self, profiles: dict[int, int], interned: dict[Any, int]
    ) -> Callable[[DeviceEntry], int]:
        """A device's CEL profile with the abstracted attributes left out, as a number."""
        abstracted = self.abstracted

        def number(entry: DeviceEntry) -> int:
            found = profiles.get(entry.profile)
            if found is None:
                driver = entry.id.driver
                attributes = tuple(
                    sorted(
                        (name, value)
                        for name, value in entry.device.attributes.items()
                        if split_name(name, driver) not in abstracted
                    )
                )
                capacity = tuple(sorted((n, c.value) for n, c in entry.cel.capacity.items()))
                key = (driver, attributes, capacity, entry.multi)
                found = profiles[entry.profile] = interned.setdefault(key, len(interned))
            return found

        return number

    def reads_abstracted(self, reads: Iterable[tuple[str, str] | None]) -> bool:
        """Whether any of the (domain, id) names read is abstracted; None stands for "a whole
        domain or the whole device": abstracted as soon as anything is."""
        for name in reads:
            if name is None:
                if self.abstracted:
                    return True
            elif name in self.abstracted:
                return True
        return False


def split_name(name: str, driver: str) -> tuple[str, str]:
    """(domain, id) of an attribute name as written in a slice or a constraint."""
    domain, slash, ident = name.partition("/")
    return (domain, ident) if slash else (driver, name)


def _node_local_attributes(views: Iterable[NodeView]) -> frozenset[tuple[str, str]]:
    """Attribute names (domain, id) on devices of more than one node whose values never
    repeat across nodes: device identities such as `uuid`."""
    first_node: dict[tuple[str, str, Any], str] = {}
    nodes_seen: dict[tuple[str, str], str] = {}
    shared: set[tuple[str, str]] = set()
    multi_node: set[tuple[str, str]] = set()
    for view in views:
        name = view.name or ""
        seen_profiles: set[int] = set()
        for entry in view.devices():
            if entry.profile in seen_profiles:
                continue
            seen_profiles.add(entry.profile)
            driver = entry.id.driver
            for attribute, value in entry.device.attributes.items():
                key = split_name(attribute, driver)
                if key in shared:
                    continue
                seen = nodes_seen.setdefault(key, name)
                if seen != name:
                    multi_node.add(key)
                owner = first_node.setdefault((*key, value), name)
                if owner != name:
                    shared.add(key)
    return frozenset(multi_node - shared)


def _signature(
    view: NodeView, topology: NodeTopology | None, abstract: Callable[[DeviceEntry], int]
) -> Any:
    parts = []
    for node_pool in view.pools:
        pool = node_pool.pool
        if len(node_pool.devices) != len(pool.devices):
            return None
        slices = {s.index: i for i, s in enumerate(pool.slices)}
        devices = []
        for entry in node_pool.devices:
            if entry.multi or entry.access.node_name != view.name:
                return None
            devices.append(
                (
                    entry.id.device,
                    abstract(entry),
                    entry.shape,
                    slices[entry.slice.index],
                    tuple(((c.counter_set, c.counter), a) for c, a in entry.counters),
                )
            )
        totals = tuple(
            tuple(sorted(((c.counter_set, c.counter), t) for c, t in s.counter_totals.items()))
            for s in pool.slices
        )
        parts.append(
            (
                pool.driver,
                pool.resource_slice_count,
                pool.invalid_reason,
                totals,
                tuple(devices),
            )
        )
    return (tuple(parts), topology.signature() if topology is not None else None)


def _template(number: int, view: NodeView) -> NodeTemplate:
    assert view.name is not None
    devices = tuple(view.devices())
    totals: dict[tuple[str, str, str], Fraction] = {}
    seen: set[int] = set()
    for entry in devices:
        if entry.slice.index in seen:
            continue
        seen.add(entry.slice.index)
        for counter, total in entry.slice.counter_totals.items():
            if total > 0:
                totals[_local(entry, counter.counter_set, counter.counter)] = total
    keys = list(totals)
    position = {key: i for i, key in enumerate(keys)}
    sets: dict[tuple[str, str, str], list[int]] = {}
    for key, i in position.items():
        sets.setdefault(key[:2] + ("",), []).append(i)
    consumption = tuple(
        tuple(
            (position[k], amount)
            for c, amount in entry.counters
            if (k := _local(entry, c.counter_set, c.counter)) in position
        )
        for entry in devices
    )
    pool_of = tuple(p for p, node_pool in enumerate(view.pools) for _ in node_pool.devices)
    return NodeTemplate(
        id=number,
        devices=devices,
        pool_of=pool_of,
        nodes=[view.name],
        counter_totals=tuple(totals.items()),
        consumption=consumption,
        sets=tuple(tuple(members) for members in sets.values()),
    )


def _local(entry: DeviceEntry, counter_set: str, counter: str) -> tuple[str, str, str]:
    return (f"{entry.id.driver}/{entry.slice.index}", counter_set, counter)
