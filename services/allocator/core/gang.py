"""Gangs: the same claims on N nodes at once, all in one domain (NVLink domain, rack, block).

`solve_gang` places a multi-node job: `node_count` distinct nodes that each satisfy
`claims_per_node`, all sharing one value of the node label `group_by_label` (e.g. the NVLink
clique label `nvidia.com/gpu.clique`, a rack label) — nodes without the label are not used —
or anywhere when no label is given. All or nothing: either every member gets an allocation or
the answer is Unsatisfiable with the reason; Allocated has one placement per member.

How: one exhaustive pass over the node groups finds every node where the claims fit on their
own, with its node key (solver.feasible_nodes: one search per group, not per node). Members of
one gang do not share devices (devices are node-local), so a domain fits iff it holds
`node_count` feasible nodes. The domain is chosen by the policy — FIRST_FIT: the first by label
value; BINPACK / FRAGMENTATION_AWARE: the one whose members keep the least free capacity (the
tightest domain, keeping big domains whole); SPREAD: the most — and within it the members with
the best node keys. Then each member is solved pinned, in order, on the state with the earlier
members' allocations, which also guards against devices shared between nodes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

from services.allocator.core.explain import Explanation, Summary, SummaryKind
from services.allocator.core.fragmentation import DEFAULT_MIX, FragmentationMix
from services.allocator.core.outcome import (
    Allocated,
    SearchBudget,
    SolveResult,
    Stats,
    Unsatisfiable,
)
from services.allocator.core.results import ShareIdFactory, default_share_id
from services.allocator.core.scoring import DomainKey, NodeKey, Policy
from services.allocator.core.snapshot import ClusterSnapshot
from services.allocator.core.solver import DEFAULT_BUDGET, feasible_nodes, solve
from services.allocator.core.state import AllocatedState
from services.allocator.core.topology_constraints import TopologyConstraint
from services.cel import SelectorCache
from services.common.dra.model import DeviceClass, ResourceClaim
from services.common.errors import InvalidArgument

__all__ = ["solve_gang"]


def solve_gang(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: Mapping[str, DeviceClass],
    claims_per_node: Sequence[ResourceClaim],
    *,
    node_count: int,
    group_by_label: str | None = None,
    policy: Policy = Policy.BINPACK,
    selectors: SelectorCache,
    budget: SearchBudget = DEFAULT_BUDGET,
    share_id: ShareIdFactory = default_share_id,
    topology_constraints: Sequence[TopologyConstraint] = (),
    fragmentation_mix: FragmentationMix = DEFAULT_MIX,
    nodes: Collection[str] | None = None,
) -> SolveResult:
    """`claims_per_node` on `node_count` nodes of one domain, all or nothing; members only
    among `nodes` when given (a node selector's matches)."""
    if node_count < 1:
        raise InvalidArgument.at("gang.nodeCount", "must be at least 1")
    common = _Options(policy, selectors, budget, tuple(topology_constraints), fragmentation_mix)
    groups, stats = feasible_nodes(
        snapshot,
        state,
        classes,
        claims_per_node,
        policy=policy,
        selectors=selectors,
        budget=budget,
        topology_constraints=topology_constraints,
        fragmentation_mix=fragmentation_mix,
    )
    domains = _domains(snapshot, groups, group_by_label, None if nodes is None else set(nodes))
    fitting = _ranked(policy, domains, node_count)
    for label, members in fitting:
        chosen = [name for _, name, _ in members[:node_count]]
        placed = _place(snapshot, state, classes, claims_per_node, chosen, share_id, common)
        if placed is not None:
            placements = tuple(m.placements[0] for m in placed)  # best node first
            return Allocated(placements, _sum(stats, *(m.stats for m in placed)), domain=label)
    return Unsatisfiable(
        _explain(domains, node_count, group_by_label, stats), stats, stats.budget_exhausted
    )


_Member = tuple[int, str, NodeKey]  # (rank of its group's key, name, its group's key)


@dataclass(frozen=True)
class _Options:
    policy: Policy
    selectors: SelectorCache
    budget: SearchBudget
    topology_constraints: tuple[TopologyConstraint, ...]
    fragmentation_mix: FragmentationMix


def _domains(
    snapshot: ClusterSnapshot,
    groups: Sequence[tuple[NodeKey, Sequence[str]]],
    label: str | None,
    allowed: set[str] | None,
) -> dict[str | None, list[_Member]]:
    """Feasible nodes per label value, each list best node key first. A node's key is its
    group's under its own name, so nodes sort by (their group's rank, name): groups are taken
    best first and their nodes come sorted by name, so a domain's list needs sorting only when
    two groups of one rank meet in it."""
    ranks = {k: i for i, k in enumerate(sorted({key[:-1] for key, _ in groups}))}
    values = snapshot.derived(_LabelValues).of(label) if label is not None else None
    found: dict[str | None, list[_Member]] = {}
    last: dict[str | None, tuple[int, int]] = {}  # per domain: (rank, group) of its last node
    unsorted: set[str | None] = set()
    ranked = sorted(range(len(groups)), key=lambda g: ranks[groups[g][0][:-1]])
    for number in ranked:
        key, members = groups[number]
        rank = ranks[key[:-1]]
        for name in members:
            if allowed is not None and name not in allowed:
                continue
            value = values.get(name) if values is not None else None
            if values is not None and value is None:
                continue
            listed = found.get(value)
            if listed is None:
                listed = found[value] = []
            else:
                previous = last[value]
                if previous[0] == rank and previous[1] != number:
                    unsorted.add(value)
            last[value] = (rank, number)
            listed.append((rank, name, key))
    for value in unsorted:
        found[value].sort(key=_rank_and_name)
    return found


def _rank_and_name(member: _Member) -> tuple[int, str]:
    return member[0], member[1]


def _ranked(
    policy: Policy, domains: Mapping[str | None, list[_Member]], node_count: int
) -> Iterator[tuple[str | None, list[_Member]]]:
    """The domains with `node_count` feasible nodes, best first by the policy's domain key.
    Domains whose chosen members come from the same groups and that have as many feasible
    nodes share their key but for the label (its last field): each such key is computed
    once, the keys sorted, and within one key the domains by label."""
    rules = policy.rules
    bodies: dict[tuple[tuple[int, ...], int], DomainKey] = {}
    alike: dict[DomainKey, list[tuple[str, str | None, list[_Member]]]] = {}
    for label, members in domains.items():
        if len(members) < node_count:
            continue
        chosen = members[:node_count]
        shape = (tuple(rank for rank, _, _ in chosen), len(members))
        body = bodies.get(shape)
        if body is None:
            keys = [key.named(name) for _, name, key in chosen]
            body = bodies[shape] = rules.domain_key(None, [m[1] for m in members], keys)
        alike.setdefault(body, []).append((label or "", label, members))
    for body in sorted(alike):
        for _, label, members in sorted(alike[body], key=_first):
            yield label, members


def _first(item: tuple[str, str | None, list[_Member]]) -> str:
    return item[0]


class _LabelValues:
    """Per label, every node's value (nodes without the label are not in it); kept with the
    snapshot (ClusterSnapshot.derived)."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self._snapshot = snapshot
        self._by_label: dict[str, dict[str, str]] = {}

    def of(self, label: str) -> dict[str, str]:
        found = self._by_label.get(label)
        if found is None:
            found = {}
            for view in self._snapshot.views():
                value = view.node.labels.get(label) if view.node is not None else None
                if view.name is not None and value is not None:
                    found[view.name] = value
            self._by_label[label] = found
        return found


def _place(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: Mapping[str, DeviceClass],
    claims: Sequence[ResourceClaim],
    members: Sequence[str],
    share_id: ShareIdFactory,
    options: _Options,
) -> tuple[Allocated, ...] | None:
    placed = []
    state = state.detached()  # the members' pinned solves do not read the node groups
    for name in members:
        result = solve(
            snapshot,
            state,
            classes,
            claims,
            node=name,
            policy=options.policy,
            selectors=options.selectors,
            budget=options.budget,
            share_id=share_id,
            topology_constraints=options.topology_constraints,
            fragmentation_mix=options.fragmentation_mix,
        )
        if not isinstance(result, Allocated):
            return None  # members interfere (devices shared between nodes): next domain
        placed.append(result)
        for claim, allocation in zip(claims, result.allocations, strict=True):
            state = state.with_allocation(allocation, f"{claim.namespace}/{claim.name}@{name}")
    return tuple(placed)


def _explain(
    domains: Mapping[str | None, Sequence[_Member]],
    count: int,
    label: str | None,
    stats: Stats,
) -> Explanation:
    exhausted = stats.budget_exhausted
    if not domains:
        summary = Summary(
            SummaryKind.GANG_NO_FIT, count=count, label=label, budget_exhausted=exhausted
        )
    else:
        best = max(domains.items(), key=lambda item: (len(item[1]), str(item[0])))
        summary = Summary(
            SummaryKind.GANG_SHORT,
            count=count,
            label=label,
            domain=None if best[0] is None else str(best[0]),
            nodes=tuple(name for _, name, _ in best[1][:count]),
            fitting=len(best[1]),
            budget_exhausted=exhausted,
        )
    return Explanation(summary=summary, budget_exhausted=exhausted)


def _sum(*all_stats: Stats) -> Stats:
    return Stats(
        steps=sum(s.steps for s in all_stats),
        cel_evaluations=sum(s.cel_evaluations for s in all_stats),
        nodes_total=all_stats[0].nodes_total,
        nodes_pruned=all_stats[0].nodes_pruned,
        nodes_searched=sum(s.nodes_searched for s in all_stats),
        nodes_feasible=all_stats[0].nodes_feasible,
        budget_exhausted=any(s.budget_exhausted for s in all_stats),
        cel_profile_hits=sum(s.cel_profile_hits for s in all_stats),
    )
