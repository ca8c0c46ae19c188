"""What makes one feasible placement better than another beyond capacity: topology and
fragmentation.

- Preferred topology constraints (explicit, then the default policy's NVLink taste) are searched
  for in phases: all of them as if required, then dropping them from the end, then none
  (`preference_phases`); a phase whose constraints cannot hold for lack of candidates is skipped.
- `topology_fit` says which preferred constraints a placement meets and how it is wired (NVLinks
  among the GPUs of each claim, NUMA nodes spanned), for the node key and the Score.
- `added_fragmentation` is FRAGMENTATION_AWARE's node term (fragmentation.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

from services.allocator.core.candidates import Candidate, NodeCandidates, SolveContext
from services.allocator.core.fragmentation import node_usable_change, placement_loss
from services.allocator.core.search import NodeSearch
from services.allocator.core.snapshot import DeviceEntry
from services.allocator.core.topology import NodeTopology
from services.allocator.core.topology_constraints import (
    Scoped,
    TopologyState,
    numa_nodes,
    nvlink_links,
)
from services.allocator.core.topology_constraints import bound as topology_bound
from services.common.dra.model import DeviceID

__all__ = ["TopologyFit", "added_fragmentation", "preference_phases", "topology_fit"]


@dataclass(frozen=True)
class TopologyFit:
    """Which preferred topology constraints a placement misses, and how it is wired."""

    preferred_missed: int = 0
    implicit_missed: int = 0
    nvlink_links: int = 0
    numa_nodes: int = 0


def preference_phases(ctx: SolveContext, cands: NodeCandidates) -> Iterator[list[Scoped] | None]:
    """The topology constraints to search with, in turn: the required ones plus every
    preferred one, then dropping preferred ones from the end; None (required only) last.
    A phase whose constraints cannot hold for lack of candidates is skipped unsearched."""
    plan = ctx.topology
    preferred = plan.preferred if plan is not None else []
    if plan is not None:
        topology = ctx.node_topology(cands.view)
        free: dict[int, list[DeviceID]] = {}
        for keep in range(len(preferred), 0, -1):
            active = preferred[:keep]
            if all(_could_hold(ctx, cands, topology, s, free) for s in active):
                yield plan.required + active
    yield None


def _could_hold(
    ctx: SolveContext,
    cands: NodeCandidates,
    topology: NodeTopology | None,
    scoped: Scoped,
    free: dict[int, list[DeviceID]],
) -> bool:
    """Per request in scope, some alternative has enough free candidates that can satisfy
    the constraint together."""
    state = ctx.state
    for claim_index, request_index in scoped.requests:
        request = ctx.plan.claims[claim_index].requests[request_index]
        possible = False
        for alternative in request.alternatives:
            devices = free.get(alternative.key)
            if devices is None:
                devices = free[alternative.key] = [
                    c.entry.id
                    for c in cands.exact(alternative)
                    if isinstance(c, Candidate) and not state.in_use(c.entry.id)
                ]
            if alternative.count <= 1:
                possible = True
                break
            clique = cands.clique(alternative, devices, scoped.constraint.min_nvlinks)
            if topology_bound(scoped.constraint, topology, devices, clique)[0] >= alternative.count:
                possible = True
                break
        if not possible:
            return False
    return True


def added_fragmentation(ctx: SolveContext, search: NodeSearch, taken: Fraction) -> Fraction:
    """FRAGMENTATION_AWARE: the fragmentation the placement adds (FGD's delta): usable
    capacity the request mix loses, less the capacity the placement takes itself."""
    if not ctx.rules.weighs_fragmentation:
        return Fraction(0)
    state = ctx.state
    picked = {
        p.entry.id
        for claim in search.picks
        for p in claim
        if not p.alternative.admin and p.consumed is None
    }

    def held(entry: DeviceEntry) -> bool:
        return state.in_use(entry.id) if not entry.multi else state.is_exclusive(entry.id)

    mix = ctx.mix
    before, after = node_usable_change(
        search.view.devices(), held, state.counter_amount, picked, search.counter_use, mix
    )
    return placement_loss(before, after, mix) - mix.capacity * taken


def topology_fit(ctx: SolveContext, search: NodeSearch) -> TopologyFit:
    """Which preferred constraints the placement meets, and its NVLinks and NUMA spread."""
    topology = ctx.node_topology(search.view)
    if topology is None and ctx.topology is None:
        return TopologyFit()
    picks = [p for claim in search.picks for p in claim]
    explicit = implicit = 0
    for scoped in ctx.topology.preferred if ctx.topology is not None else []:
        state = TopologyState(scoped.constraint, topology)
        for pick in picks:
            alternative = pick.alternative
            if (alternative.claim_index, alternative.request_index) not in scoped.requests:
                continue
            if state.problem(pick.entry.id) is not None:
                explicit += not scoped.implicit
                implicit += scoped.implicit
                break
            state.add(pick.entry.id)
    links = sum(nvlink_links(topology, (p.entry.id for p in claim)) for claim in search.picks)
    return TopologyFit(explicit, implicit, links, numa_nodes(topology, (p.entry.id for p in picks)))
