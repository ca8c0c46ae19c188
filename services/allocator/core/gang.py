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

from collections.abc import Collection, Mapping, Sequence
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
from services.allocator.core.scoring import NodeKey, Policy
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
    keys, stats = feasible_nodes(
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
    if nodes is not None:
        allowed = set(nodes)
        keys = {name: key for name, key in keys.items() if name in allowed}
    domains = _domains(snapshot, keys, group_by_label)
    fitting = [(label, members) for label, members in domains.items() if len(members) >= node_count]
    rules = policy.rules
    fitting.sort(
        key=lambda item: rules.domain_key(item[0], item[1], [keys[m] for m in item[1][:node_count]])
    )
    for label, members in fitting:
        placed = _place(
            snapshot, state, classes, claims_per_node, members[:node_count], share_id, common
        )
        if placed is not None:
            placements = tuple(m.placements[0] for m in placed)  # best node first
            return Allocated(placements, _sum(stats, *(m.stats for m in placed)), domain=label)
    return Unsatisfiable(
        _explain(domains, node_count, group_by_label, stats), stats, stats.budget_exhausted
    )


@dataclass(frozen=True)
class _Options:
    policy: Policy
    selectors: SelectorCache
    budget: SearchBudget
    topology_constraints: tuple[TopologyConstraint, ...]
    fragmentation_mix: FragmentationMix


def _domains(
    snapshot: ClusterSnapshot, keys: Mapping[str, NodeKey], label: str | None
) -> dict[str | None, list[str]]:
    """Feasible nodes per label value, each list best node key first."""
    found: dict[str | None, list[str]] = {}
    for name in keys:
        if label is None:
            value: str | None = None
        else:
            node = snapshot.view(name).node
            value = node.labels.get(label) if node is not None else None
            if value is None:
                continue
        found.setdefault(value, []).append(name)
    for members in found.values():
        members.sort(key=keys.__getitem__)
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
    domains: Mapping[str | None, Sequence[str]],
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
            nodes=tuple(best[1][:count]),
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
