"""Batches of identical items: `count` copies of the same claims placed one after another.

An AllocateBatch of many alike items (a scheduler's queue of "one H100" jobs), a Capacity count
and a gang's members all ask the same thing again and again, each seeing the ones before it
placed. `solve_many` answers such a batch: result i is what `solve` answers on `state` with the
allocations of results 0..i-1 added, so a batch equals its items solved one by one in order
(tests/unit/allocator/test_batch.py checks it over generated fleets). It stops after the first
item that does not fit (every later one would not fit either: placing nothing changes nothing).

The items share one solve context (the plan, the static checks, the CEL outcomes) and the
outcomes kept per node group (outcomes.py): an item after the first reads the ranked outcomes of
the groups its predecessors did not touch and searches only the node whose free state the last
placement changed (KEP-5598's opportunistic batching); while the node the last item's walk chose
is still the best with that placement held, the next item takes it without a walk (LastChoice in
solver.py says why that is the walk's answer). The placements it holds between items are
the core's own, on a private copy of the state changed in place (owner ""): the caller decides
what to keep (a store may refuse an item; the caller then solves the rest again on what it
holds).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from services.allocator.core.candidates import SolveFacts
from services.allocator.core.explain import Recorder
from services.allocator.core.fragmentation import DEFAULT_MIX, FragmentationMix
from services.allocator.core.outcome import Allocated, SearchBudget, SolveResult
from services.allocator.core.plan import Plan
from services.allocator.core.results import ShareIdFactory, default_share_id
from services.allocator.core.scoring import Policy
from services.allocator.core.snapshot import ClusterSnapshot
from services.allocator.core.solver import DEFAULT_BUDGET, LastChoice, solve_context, solve_in
from services.allocator.core.state import AllocatedState
from services.allocator.core.topology_constraints import TopologyConstraint
from services.cel import SelectorCache
from services.common.dra.model import DeviceClass, ResourceClaim
from services.common.errors import InvalidArgument

__all__ = ["solve_many"]


def solve_many(
    snapshot: ClusterSnapshot,
    state: AllocatedState,
    classes: Mapping[str, DeviceClass],
    claims: Sequence[ResourceClaim],
    count: int,
    *,
    node: str | None = None,
    nodes: Collection[str] | None = None,
    policy: Policy = Policy.BINPACK,
    selectors: SelectorCache,
    budget: SearchBudget = DEFAULT_BUDGET,
    explain: bool = False,
    share_id: ShareIdFactory = default_share_id,
    topology_constraints: Sequence[TopologyConstraint] = (),
    fragmentation_mix: FragmentationMix = DEFAULT_MIX,
    holding: AllocatedState | None = None,
    plan: Plan | None = None,
    facts: SolveFacts | None = None,
) -> list[SolveResult]:
    """Up to `count` placements of `claims`, each on the state holding the ones before it;
    the list ends with the first Unsatisfiable (or after `count` Allocated). `budget` bounds
    each item's search on its own, as for one `solve`; the options are `solve`'s. `holding`:
    a state the caller detached from `state` (`state.detached(groups=True)`) to hold the
    placements in, instead of a private copy: once this returns, it is `state` with the
    allocations of every Allocated result added (owner ""), for the caller to keep. `plan`
    and `facts`: as for `solve` (the caller's plan of `claims` and the SolveFacts it keeps
    for it, so a batch of a shape asked before works out neither again)."""
    if count < 0:
        raise InvalidArgument.at("count", f"must not be negative, not {count}")
    if node is not None and nodes is not None:
        raise ValueError("solve_many takes a pinned node or candidate nodes, not both")
    # the batch's own: changed in place, item by item
    held = holding if holding is not None else state.detached(groups=True)
    ctx = solve_context(
        snapshot,
        held,
        classes,
        claims,
        policy,
        selectors,
        None,
        topology_constraints,
        budget,
        plan=plan,
        mix=fragmentation_mix,
        facts=facts,
    )
    results: list[SolveResult] = []
    # The last walk's choice, for the next item (LastChoice): only while every placement held
    # is the one that walk chose, on a node chosen by groups.
    last = LastChoice() if node is None and nodes is None and not explain else None
    try:
        for _ in range(count):
            placed = last.again(ctx, budget, share_id) if last is not None else None
            if placed is None:  # else the last node again, from its kept outcome: solve_in's
                if last is not None:
                    last.hold(held, snapshot)  # the walk reads the state: hold what is pending
                item = replace(ctx, recorder=Recorder()) if explain else ctx
                result = solve_in(
                    item,
                    budget,
                    node=node,
                    nodes=nodes,
                    share_id=share_id,
                    cel_before=(ctx.selection.cel_evaluations, ctx.selection.cel_profile_hits),
                    last=last,
                )
                if not isinstance(result, Allocated):
                    results.append(result)
                    break
                placed = result
            results.append(placed)
            if last is not None:
                if last.deferred:  # held with the rest of the node's run (LastChoice.hold)
                    continue
                last.hold(held, snapshot)
            for placement in placed.placements:
                for allocation in placement.allocations:
                    held.hold_in_place(allocation)
    finally:
        if last is not None:
            last.hold(held, snapshot)
    return results
