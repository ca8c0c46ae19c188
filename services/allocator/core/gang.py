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
        chosen = [name for _, name, _ in members]
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


class _Domain:
    """One domain's feasible nodes: runs of one node group each (names sorted), in the order
    of their groups' ranks; nodes are ranked by (their group's rank, name)."""

    __slots__ = ("runs", "size")

    def __init__(self) -> None:
        self.runs: list[tuple[int, NodeKey, Sequence[str]]] = []
        self.size = 0

    def ranks(self, count: int) -> tuple[int, ...]:
        """The ranks of the `count` best nodes (as `first` would choose them)."""
        found: tuple[int, ...] = ()
        for rank, _, names in self.runs:
            found += (rank,) * min(len(names), count - len(found))
            if len(found) == count:
                break
        return found

    def first(self, count: int) -> list[_Member]:
        """The `count` best nodes: runs of one rank are merged by name (only their first
        `count` names can be among the best)."""
        chosen: list[_Member] = []
        runs, start = self.runs, 0
        while start < len(runs) and len(chosen) < count:
            rank, end = runs[start][0], start + 1
            while end < len(runs) and runs[end][0] == rank:
                end += 1
            wanted = count - len(chosen)
            tied = [(rank, n, key) for _, key, names in runs[start:end] for n in names[:wanted]]
            if end - start > 1:
                tied.sort(key=_rank_and_name)
            chosen.extend(tied[:wanted])
            start = end
        return chosen

    def names(self) -> list[str]:
        return [name for _, _, names in self.runs for name in names]


def _domains(
    snapshot: ClusterSnapshot,
    groups: Sequence[tuple[NodeKey, Sequence[str]]],
    label: str | None,
    allowed: set[str] | None,
) -> dict[str | None, _Domain]:
    """Feasible nodes per label value. A node's key is its group's under its own name, so
    nodes rank by (their group's rank, name): groups are taken best first, each split by
    label value once per member list (the node groups replace a list when it changes, never
    edit it), so the work is per group and domain, not per node."""
    ranks = {k: i for i, k in enumerate(sorted({key[:-1] for key, _ in groups}))}
    values = snapshot.derived(_LabelValues)
    found: dict[str | None, _Domain] = {}
    ranked = sorted(range(len(groups)), key=lambda g: ranks[groups[g][0][:-1]])
    for number in ranked:
        key, members = groups[number]
        rank = ranks[key[:-1]]
        for value, names in values.split(label, members).items():
            if allowed is not None:
                names = [name for name in names if name in allowed]
                if not names:
                    continue
            domain = found.get(value)
            if domain is None:
                domain = found[value] = _Domain()
            domain.runs.append((rank, key, names))
            domain.size += len(names)
    return found


def _rank_and_name(member: _Member) -> tuple[int, str]:
    return member[0], member[1]


def _ranked(
    policy: Policy, domains: Mapping[str | None, _Domain], node_count: int
) -> Iterator[tuple[str | None, list[_Member]]]:
    """The domains with `node_count` feasible nodes, best first by the policy's domain key,
    each with its chosen members. Domains whose chosen members come from the same groups and
    that have as many feasible nodes share their key but for the label (its last field):
    each such key is computed once, the keys sorted, and within one key the domains by label;
    members are chosen only for the domains tried."""
    rules = policy.rules
    bodies: dict[tuple[tuple[int, ...], int], DomainKey] = {}
    alike: dict[DomainKey, list[tuple[str, str | None, _Domain]]] = {}
    for label, domain in domains.items():
        if domain.size < node_count:
            continue
        shape = (domain.ranks(node_count), domain.size)
        body = bodies.get(shape)
        if body is None:
            keys = [key.named(name) for _, name, key in domain.first(node_count)]
            body = bodies[shape] = rules.domain_key(None, domain.names(), keys)
        alike.setdefault(body, []).append((label or "", label, domain))
    for body in sorted(alike):
        for _, label, domain in sorted(alike[body], key=_first):
            yield label, domain.first(node_count)


def _first(item: tuple[str, str | None, _Domain]) -> str:
    return item[0]


_Split = Mapping[str | None, Sequence[str]]
_SPLITS_KEPT = 4096  # member lists split and kept per snapshot (a list's split is reused
# until the node groups replace it)


class _LabelValues:
    """Per label, every node's value (nodes without the label are not in it), and member
    lists of node groups split by it; kept with the snapshot (ClusterSnapshot.derived)."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self._snapshot = snapshot
        self._by_label: dict[str, dict[str, str]] = {}
        # (label, id of a member list) -> (the list, kept so its id is not reused; its split)
        self._splits: dict[tuple[str | None, int], tuple[Sequence[str], _Split]] = {}

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

    def split(self, label: str | None, members: Sequence[str]) -> _Split:
        """`members` (sorted names) by their value of `label`, each part sorted; nodes
        without the label left out; all under None when no label is given."""
        if label is None:
            return {None: members}
        kept = self._splits.get((label, id(members)))
        if kept is not None and kept[0] is members:
            return kept[1]
        values = self.of(label)
        split: dict[str | None, list[str]] = {}
        for name in members:
            value = values.get(name)
            if value is not None:
                part = split.get(value)
                if part is None:
                    split[value] = [name]
                else:
                    part.append(name)
        if len(self._splits) >= _SPLITS_KEPT:
            self._splits.clear()
        self._splits[label, id(members)] = (members, split)
        return split


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
    domains: Mapping[str | None, _Domain],
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
        best = max(domains.items(), key=lambda item: (item[1].size, str(item[0])))
        summary = Summary(
            SummaryKind.GANG_SHORT,
            count=count,
            label=label,
            domain=None if best[0] is None else str(best[0]),
            nodes=tuple(name for _, name, _ in best[1].first(count)),
            fitting=best[1].size,
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
