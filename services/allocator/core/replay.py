"""Explaining by node groups: one node's search stands for every node of its group.

An explanation names, per request, every device the search looked at and why each was out,
and per node how close it came: the solver visits every node. Nodes of one template in one free
state (groups.py) go through the very same search, device index for device index, so one of them
is searched and the others replay what it recorded:

- the static checks (selectors, taints, requested capacity) of each alternative are the
  template's: recorded once on its first node (`StaticTape`), counted for every node whose
  search built that alternative's candidate list (`Recorder.listed`);
- what depends on the free state (devices in use, counters, constraints) is recorded once per
  group (`GroupTape`, by device index) while the group's first node is searched with its
  template's candidate lists;
- in the end every group adds its devices in bulk: counts times members, the smallest device
  ids as examples (`Recorder.add_rejected`); devices in use one by one, since who holds them
  differs from node to node.

Each node still gets its own closest miss, its own key and its steps; a node whose group cannot
be replayed (its search was cut short, or noted an incomplete pool) is searched on its own with
every device recorded, as before. The explanation is the one searching every node gives
(tests/unit/allocator/test_explain_groups.py checks it on generated fleets).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.allocator.core.candidates import NodeCandidates, SolveContext
from services.allocator.core.explain import (
    ConstraintMiss,
    Fact,
    IncompletePool,
    NodeMiss,
    ReasonCode,
    Recorder,
    holders,
)
from services.allocator.core.plan import Alternative, ConstraintSpec
from services.allocator.core.snapshot import ClusterSnapshot, DeviceEntry
from services.allocator.core.templates import NodeTemplate, node_templates
from services.common.dra.model import DeviceID
from services.common.errors import GpuallocError

__all__ = ["GroupTape", "NodeTape", "Replays", "StaticTape", "replayed_miss", "taping"]

_Reject = tuple[int, ReasonCode, Fact | None]  # (alternative key, code, fact)
_Problem = tuple[str, ConstraintSpec, ConstraintMiss]  # (claim, constraint, problem)


class NodeTape:
    """One node's events while it is searched, by device id (a Listener)."""

    def __init__(self) -> None:
        self.alternatives: dict[int, Alternative] = {}
        self.lists: set[int] = set()  # alternatives whose candidate lists were built
        self.rejects: dict[_Reject, list[DeviceID]] = {}
        self.in_use: dict[int, list[DeviceID]] = {}
        self.problems: dict[_Problem, list[DeviceID]] = {}
        self.values: dict[_Problem, set[str]] = {}
        self.considered: dict[int, list[DeviceID]] = {}
        self.labels: dict[int, str] = {}
        self.noted = False

    def consider(self, alternative: Alternative, claim: str, device: DeviceID) -> None:
        self.alternatives[alternative.key] = alternative
        self.labels[alternative.key] = claim
        self.considered.setdefault(alternative.key, []).append(device)

    def reject(
        self,
        alternative: Alternative,
        device: DeviceID,
        code: ReasonCode,
        fact: Fact | None = None,
        holders: tuple[str, ...] = (),
    ) -> None:
        self.alternatives[alternative.key] = alternative
        if code is ReasonCode.IN_USE:  # its holders are the node's own: found again per node
            self.in_use.setdefault(alternative.key, []).append(device)
        else:
            self.rejects.setdefault((alternative.key, code, fact), []).append(device)

    def constraint(
        self,
        claim: str,
        spec: ConstraintSpec,
        device: DeviceID,
        problem: ConstraintMiss,
        values: Iterable[str],
    ) -> None:
        key = (claim, spec, problem)
        self.problems.setdefault(key, []).append(device)
        self.values.setdefault(key, set()).update(values)

    def note(self, note: IncompletePool) -> None:
        self.noted = True  # names the node's own pool: this node explains itself

    def listed(self, alternative: Alternative) -> None:
        self.alternatives[alternative.key] = alternative
        self.lists.add(alternative.key)


def _indices(
    devices: Iterable[DeviceID], slot: Mapping[DeviceID, tuple[str, int]]
) -> tuple[int, ...]:
    """The devices' indices on their node (templates.NodeTemplates.slot)."""
    return tuple(sorted({slot[device][1] for device in devices}))


@dataclass(frozen=True)
class StaticTape:
    """The static checks of one alternative on a template's nodes, by device index."""

    considered: int
    rejects: Mapping[tuple[ReasonCode, Fact | None], tuple[int, ...]]


@dataclass
class GroupTape:
    """What the search of one node of a group recorded, by device index, and the nodes that
    replay it (the searched one first)."""

    template: NodeTemplate
    alternatives: Mapping[int, Alternative]
    listed: frozenset[int]
    rejects: Mapping[_Reject, tuple[int, ...]]
    in_use: Mapping[int, tuple[int, ...]]
    problems: Mapping[_Problem, tuple[int, ...]]
    values: Mapping[_Problem, frozenset[str]]
    members: list[str] = field(default_factory=list)
    # what the search found, for the other nodes (set by the solver once it is known)
    reusable: bool = False
    steps: int = 0
    pruned: int = 0
    searched: int = 0
    misses: tuple[NodeMiss, ...] = ()
    errors: tuple[GpuallocError, ...] = ()
    fit: Any = None  # the solver's kept fit (solver._Fit), when the node fits

    @classmethod
    def of(
        cls, template: NodeTemplate, tape: NodeTape, slot: Mapping[DeviceID, tuple[str, int]]
    ) -> GroupTape:
        position = slot
        return cls(
            template,
            dict(tape.alternatives),
            frozenset(tape.lists),
            {key: _indices(found, position) for key, found in tape.rejects.items()},
            {key: _indices(found, position) for key, found in tape.in_use.items()},
            {key: _indices(found, position) for key, found in tape.problems.items()},
            {key: frozenset(values) for key, values in tape.values.items()},
        )


class Replays:
    """One explaining solve's groups: their tapes, their members, and the bulk they add."""

    def __init__(self, ctx: SolveContext, snapshot: ClusterSnapshot) -> None:
        self.ctx = ctx
        self.snapshot = snapshot
        self.groups: dict[tuple[int, frozenset[int]], GroupTape] = {}
        self.once: list[GroupTape] = []  # tapes of searches that cannot stand for a group
        self._static: dict[tuple[int, int], StaticTape] = {}
        self._devices: dict[str, tuple[DeviceEntry, ...]] = {}

    def static(self, template: NodeTemplate, alternative: Alternative) -> StaticTape:
        """The static checks of `alternative` on the template's first node, recorded once."""
        key = (template.id, alternative.key)
        found = self._static.get(key)
        if found is None:
            view = self.snapshot.view(template.nodes[0])
            tape = NodeTape()
            with taping(self.ctx, tape):
                NodeCandidates(self.ctx, view).exact(alternative)
            position = node_templates(self.snapshot).slot
            found = self._static[key] = StaticTape(
                len(set(tape.considered.get(alternative.key, ()))),
                {
                    (code, fact): _indices(devices, position)
                    for (_, code, fact), devices in tape.rejects.items()
                },
            )
        return found

    def devices(self, node: str) -> tuple[DeviceEntry, ...]:
        found = self._devices.get(node)
        if found is None:
            found = self._devices[node] = tuple(self.snapshot.view(node).devices())
        return found

    def finish(self, recorder: Recorder) -> None:
        """Every group's devices into the recorder, in bulk."""
        static_members: dict[tuple[int, int], list[str]] = {}
        for group in (*self.groups.values(), *self.once):
            for key in group.listed:
                static_members.setdefault((group.template.id, key), []).extend(group.members)
            self._dynamic(group, recorder)
        templates = {g.template.id: g.template for g in (*self.groups.values(), *self.once)}
        alternatives = {a.key: a for a in self.ctx.plan.alternatives()}
        labels = {c.index: c.label for c in self.ctx.plan.claims}
        for (template_id, key), members in static_members.items():
            template, alternative = templates[template_id], alternatives[key]
            tape = self.static(template, alternative)
            label = labels[alternative.claim_index]
            recorder.add_considered(alternative, label, tape.considered * len(members))
            examples = _Examples(self, template, members)
            for (code, fact), indices in tape.rejects.items():
                count = len(indices) * len(members)
                recorder.add_rejected(alternative, code, fact, count, examples.of(indices))

    def _dynamic(self, group: GroupTape, recorder: Recorder) -> None:
        members = group.members
        examples = _Examples(self, group.template, members)
        for (key, code, fact), indices in group.rejects.items():
            alternative = group.alternatives[key]
            count = len(indices) * len(members)
            recorder.add_rejected(alternative, code, fact, count, examples.of(indices))
        for (claim, spec, problem), indices in group.problems.items():
            values = group.values[(claim, spec, problem)]
            count = len(indices) * len(members)
            recorder.add_problem(claim, spec, problem, values, count, examples.of(indices))
        if group.in_use:
            owners = self.ctx.state.owners
            for node in members:
                devices = self.devices(node)
                for key, indices in group.in_use.items():
                    alternative = group.alternatives[key]
                    for index in indices:
                        device = devices[index].id
                        held = holders(owners(device))
                        recorder.reject(alternative, device, ReasonCode.IN_USE, None, held)


class _Examples:
    """The smallest device ids of some device indices over some nodes of a template: per pool
    (its devices sort by name alike on every node), the nodes whose pool sorts first."""

    def __init__(self, replays: Replays, template: NodeTemplate, members: Sequence[str]) -> None:
        self.replays = replays
        self.template = template
        self.members = members
        self._first: dict[int, list[str]] = {}

    def of(self, indices: Sequence[int]) -> list[DeviceID]:
        by_pool: dict[int, list[int]] = {}
        for index in indices:
            by_pool.setdefault(self.template.pool_of[index], []).append(index)
        names = self.template.devices
        found: list[DeviceID] = []
        for pool, listed in by_pool.items():
            first = heapq.nsmallest(3, listed, key=lambda i: names[i].id.device)
            for node in self._first_nodes(pool):
                devices = self.replays.devices(node)
                found.extend(devices[i].id for i in first)
        return found

    def _first_nodes(self, pool: int) -> list[str]:
        found = self._first.get(pool)
        if found is None:
            snapshot = self.replays.snapshot

            def pool_id(node: str) -> tuple[str, str]:
                node_pool = snapshot.view(node).pools[pool].pool
                return node_pool.driver, node_pool.name

            found = self._first[pool] = heapq.nsmallest(3, self.members, key=pool_id)
        return found


class taping:  # noqa: N801 - used as a statement: `with taping(ctx, tape):`
    """Sends the solve's recorder events to `tape` (None: nowhere) while in the block."""

    def __init__(self, ctx: SolveContext, tape: NodeTape | None) -> None:
        self.recorder = ctx.recorder
        self.tape = tape if tape is not None else NodeTape()

    def __enter__(self) -> None:
        if self.recorder is not None:
            self.recorder.tape = self.tape

    def __exit__(self, *exc: object) -> None:
        if self.recorder is not None:
            self.recorder.tape = None


def replayed_miss(miss: NodeMiss | None, node: str) -> NodeMiss | None:
    """A group's closest miss for another node of it."""
    if miss is None:
        return None
    return NodeMiss(
        node,
        miss.placed,
        miss.needed,
        miss.claim,
        miss.request,
        miss.request_placed,
        miss.request_needed,
        miss.reasons,
        miss.error,
        miss.budget_exhausted,
    )
