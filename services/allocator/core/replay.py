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
from services.allocator.core.nodechoice import TemplatePlan
from services.allocator.core.outcomes import NodeOutcome
from services.allocator.core.plan import Alternative, ConstraintSpec
from services.allocator.core.snapshot import ClusterSnapshot, DeviceEntry
from services.allocator.core.templates import NodeTemplate, node_templates
from services.common.dra.model import DeviceID
from services.common.errors import GpuallocError

__all__ = ["Group", "GroupTape", "NodeTape", "Replays", "StaticTape", "taping"]

_Reject = tuple[int, ReasonCode, Fact | None]  # (alternative key, code, fact)
_ClaimProblem = tuple[int, ConstraintSpec, ConstraintMiss]  # (claim index, constraint, problem)
_Problem = tuple[str, ConstraintSpec, ConstraintMiss]  # (claim, constraint, problem)
_PoolFirst = tuple[int, tuple[int, ...]]  # (pool ordinal, the first device indices there)


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
    """What the explaining search of one node of a group recorded, by device index, with what
    it found: kept per (question, template, devices in use) for later explanations too, so it
    names claims by index and holds nothing of one solve."""

    listed: frozenset[int]
    rejects: Mapping[_Reject, tuple[int, ...]]
    in_use: Mapping[int, tuple[int, ...]]
    problems: Mapping[_ClaimProblem, tuple[int, ...]]
    values: Mapping[_ClaimProblem, frozenset[str]]
    steps: int = 0
    pruned: int = 0
    searched: int = 0
    misses: tuple[tuple[NodeMiss, int], ...] = ()  # each closest miss with its claim's index
    outcome: NodeOutcome | None = None  # when the node fits
    error: GpuallocError | None = None  # a node's own error (not kept: it names claims)
    complete: bool = True  # False: the budget cut the search short; the node stands alone

    @classmethod
    def of(
        cls, tape: NodeTape, slot: Mapping[DeviceID, tuple[str, int]], labels: Sequence[str]
    ) -> GroupTape:
        def indexed(key: _Problem) -> _ClaimProblem:
            claim, spec, problem = key
            return (labels.index(claim), spec, problem)

        return cls(
            frozenset(tape.lists),
            {key: _indices(found, slot) for key, found in tape.rejects.items()},
            {key: _indices(found, slot) for key, found in tape.in_use.items()},
            {indexed(key): _indices(found, slot) for key, found in tape.problems.items()},
            {indexed(key): frozenset(values) for key, values in tape.values.items()},
        )

    def misses_on(self, node: str | None, labels: Sequence[str]) -> list[NodeMiss]:
        """The closest misses for `node`, labelled with the asking plan's claims."""
        return [_miss_on(miss, node, labels, claim) for miss, claim in self.misses]


@dataclass
class Group:
    """One explanation's use of a group's tape: the nodes that replay it."""

    template: NodeTemplate
    tape: GroupTape
    members: list[str] = field(default_factory=list)


class Replays:
    """One explaining solve's groups: their tapes, their members, and the bulk they add."""

    def __init__(self, ctx: SolveContext, snapshot: ClusterSnapshot) -> None:
        self.ctx = ctx
        self.snapshot = snapshot
        self.groups: dict[tuple[int, frozenset[int]], Group] = {}
        self.once: list[Group] = []  # tapes of searches that cannot stand for a group
        self.alternatives = {a.key: a for a in ctx.plan.alternatives()}
        self.labels = [claim.label for claim in ctx.plan.claims]
        self._static: dict[tuple[int, int], StaticTape] = {}
        self._devices: dict[str, tuple[DeviceEntry, ...]] = {}
        self._pool_ids: dict[tuple[str, int], tuple[str, str]] = {}
        templates = node_templates(snapshot)
        self.of_node = templates.of_node
        self.slot = templates.slot
        self.facts: dict[int, TemplatePlan] = {}  # per template: its static checks, once
        self._first_indices: dict[
            tuple[int, tuple[int, ...]], list[tuple[int, tuple[int, ...]]]
        ] = {}

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

    def first_indices(self, template: NodeTemplate, indices: tuple[int, ...]) -> list[_PoolFirst]:
        """Per pool of the template, the first few of `indices` by device name (a device's
        id sorts by its pool, then its name: the same few on every node)."""
        key = (template.id, indices)
        found = self._first_indices.get(key)
        if found is None:
            by_pool: dict[int, list[int]] = {}
            for index in indices:
                by_pool.setdefault(template.pool_of[index], []).append(index)
            names = template.devices
            found = self._first_indices[key] = [
                (pool, tuple(heapq.nsmallest(3, listed, key=lambda i: names[i].id.device)))
                for pool, listed in by_pool.items()
            ]
        return found

    def pool_id(self, node: str, pool: int) -> tuple[str, str]:
        """(driver, name) of the node's pool `pool` (its ordinal on the node), kept: a node's
        groups and its template's static checks all ask for their examples."""
        key = (node, pool)
        found = self._pool_ids.get(key)
        if found is None:
            node_pool = self.snapshot.view(node).pools[pool].pool
            found = self._pool_ids[key] = (node_pool.driver, node_pool.name)
        return found

    def devices(self, node: str) -> tuple[DeviceEntry, ...]:
        found = self._devices.get(node)
        if found is None:
            found = self._devices[node] = tuple(self.snapshot.view(node).devices())
        return found

    def start(self, template: NodeTemplate, used: frozenset[int], tape: GroupTape) -> Group:
        """A group's first node in this explanation, with its tape (kept or just recorded)."""
        group = Group(template, tape)
        if tape.complete:
            self.groups.setdefault((template.id, used), group)
        else:
            self.once.append(group)
        return group

    def finish(self, recorder: Recorder) -> None:
        """Every group's devices into the recorder, in bulk."""
        static_members: dict[tuple[int, int], list[str]] = {}
        for group in (*self.groups.values(), *self.once):
            for key in group.tape.listed:
                static_members.setdefault((group.template.id, key), []).extend(group.members)
            self._dynamic(group, recorder)
        templates = {g.template.id: g.template for g in (*self.groups.values(), *self.once)}
        shared: dict[int, _Examples] = {}  # per template: its alternatives mostly list alike
        for (template_id, key), members in static_members.items():
            template, alternative = templates[template_id], self.alternatives[key]
            tape = self.static(template, alternative)
            label = self.labels[alternative.claim_index]
            recorder.add_considered(alternative, label, tape.considered * len(members))
            examples = shared.get(template_id)
            if examples is None or examples.members != members:
                examples = shared[template_id] = _Examples(self, template, members)
            for (code, fact), indices in tape.rejects.items():
                count = len(indices) * len(members)
                recorder.add_rejected(alternative, code, fact, count, examples.of(indices))

    def _dynamic(self, group: Group, recorder: Recorder) -> None:
        members, tape = group.members, group.tape
        examples = _Examples(self, group.template, members)
        for (key, code, fact), indices in tape.rejects.items():
            alternative = self.alternatives[key]
            count = len(indices) * len(members)
            recorder.add_rejected(alternative, code, fact, count, examples.of(indices))
        for (claim, spec, problem), indices in tape.problems.items():
            values = tape.values[(claim, spec, problem)]
            count = len(indices) * len(members)
            label = self.labels[claim]
            recorder.add_problem(label, spec, problem, values, count, examples.of(indices))
        if tape.in_use:
            owners = self.ctx.state.owners
            named: dict[tuple[str, ...], tuple[str, ...]] = {}  # owners -> holders
            for node in members:
                devices = self.devices(node)
                for key, indices in tape.in_use.items():
                    by_holders: dict[tuple[str, ...], list[DeviceID]] = {}
                    for index in indices:
                        device = devices[index].id
                        held_by = owners(device)
                        held = named.get(held_by)
                        if held is None:
                            held = named[held_by] = holders(held_by)
                        by_holders.setdefault(held, []).append(device)
                    alternative = self.alternatives[key]
                    for held, in_use in by_holders.items():
                        recorder.reject_all(alternative, in_use, ReasonCode.IN_USE, held)


class _Examples:
    """The smallest device ids of some device indices over some nodes of a template: per pool
    (its devices sort by name alike on every node), the nodes whose pool sorts first."""

    def __init__(self, replays: Replays, template: NodeTemplate, members: Sequence[str]) -> None:
        self.replays = replays
        self.template = template
        self.members = members
        self._first: dict[int, list[str]] = {}

    def of(self, indices: tuple[int, ...]) -> list[DeviceID]:
        found: list[DeviceID] = []
        for pool, first in self.replays.first_indices(self.template, indices):
            for node in self._first_nodes(pool):
                devices = self.replays.devices(node)
                found.extend(devices[i].id for i in first)
        return found

    def _first_nodes(self, pool: int) -> list[str]:
        found = self._first.get(pool)
        if found is None:
            if len(self.members) == 1:
                found = list(self.members)  # no order to find among one node
            else:
                pool_id = self.replays.pool_id
                found = heapq.nsmallest(3, self.members, key=lambda node: pool_id(node, pool))
            self._first[pool] = found
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


def _miss_on(miss: NodeMiss, node: str | None, labels: Sequence[str], claim: int) -> NodeMiss:
    """A group's closest miss for another node of it, and the asking plan's claim label."""
    return NodeMiss(
        node,
        miss.placed,
        miss.needed,
        labels[claim] if claim >= 0 else miss.claim,
        miss.request,
        miss.request_placed,
        miss.request_needed,
        miss.reasons,
        miss.error,
        miss.budget_exhausted,
    )
