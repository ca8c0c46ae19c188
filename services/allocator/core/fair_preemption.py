"""Preemption with fair sharing (Kueue's fairPreemptions, KEP 1714): whose reservations go so
that a grant fits, chosen by dominant resource share over the cohort tree.

Used instead of the classical passes (core/preemption.py) when the policy enables fair sharing
(`spec.quota.fairSharing.enabled`, Kueue's Configuration `fairSharing`). Given the candidates
(the preemptor's own tenant's reservations its withinClusterQueue allows, and the reservations
reclaimWithinCohort allows of every tenant of its tree that borrows what they hold), in Kueue's
order (other tenants' first, then the lowest priority, then the newest), with the grant's
amounts added to the preemptor's usage:

1. **Which tenant loses one next.** From the root of the tree down, at each cohort the child
   with the highest share: among the child tenants that borrow and still have candidates (the
   preemptor's own tenant too, borrowing or not), and the child cohorts that borrow or are on
   the preemptor's path; a cohort at least as high as the best tenant is entered, a tenant is
   the target. Ties between tenants go to the one whose first candidate comes first.
2. **Whether it may.** A candidate of the preemptor's own tenant is taken. With the preemptor
   within its nominal quota on every resource the grant counts (Kueue's
   FairSharingPreemptWithinNominal, on by default since v0.17), another tenant's is taken too
   (reason reclaim). Otherwise the shares of the two sides below their lowest common cohort
   (their *almost least common ancestors*) are compared by the first strategy: the target's
   candidates are tried in order, each taken when the strategy allows it (reason
   fair-sharing), and a refused one is kept for the second strategy.
3. **The second strategy** (when the first ends and the grant does not fit yet): the kept
   candidates, the tenant with the highest share first, at most one per tenant, when the
   preemptor's share with its grant is below the target side's share now.

The sequence of victims does not depend on whether the grant fits: it is computed whole, and
the shortest prefix after which the grant fits is found by bisection (a few placements rather
than one per candidate), then pruned (Kueue's fill-back: a victim the grant fits without is
restored). Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from services.allocator.core.quota.fair_sharing import NO_SHARE, Share, strategy_allows
from services.allocator.core.quota.rule import share_of
from services.common.quota.model import PreemptionStrategy, QuotaModel, Usage
from services.common.quota.tree import NodeKey, tenant_node

__all__ = ["FairCandidate", "fair_sequence"]


@dataclass(frozen=True)
class FairCandidate:
    """A candidate as fair sharing sees it: its place in Kueue's order (`index`), its tenant
    and what it counts."""

    index: int
    tenant: str
    amounts: Usage


@dataclass
class _State:
    model: QuotaModel
    preemptor: str
    usage: dict[str, dict[str, int]]
    path: set[NodeKey]  # the preemptor's ancestors
    queues: dict[str, list[FairCandidate]] = field(default_factory=dict)
    pruned: set[NodeKey] = field(default_factory=set)

    def remove(self, candidate: FairCandidate) -> None:
        mine = self.usage.setdefault(candidate.tenant, {})
        for name, amount in candidate.amounts.items():
            mine[name] = mine.get(name, 0) - amount

    def add(self, candidate: FairCandidate) -> None:
        mine = self.usage.setdefault(candidate.tenant, {})
        for name, amount in candidate.amounts.items():
            mine[name] = mine.get(name, 0) + amount

    def share(self, key: NodeKey) -> Share:
        return share_of(self.model, key, self.usage)

    def borrowing(self, key: NodeKey) -> bool:
        return self.share(key).borrowing


def fair_sequence(
    model: QuotaModel,
    preemptor: str,
    amounts: Usage,
    usage: Mapping[str, Usage],
    candidates: Sequence[FairCandidate],
    strategies: Sequence[PreemptionStrategy],
    *,
    within_nominal: bool,
) -> list[tuple[FairCandidate, bool]]:
    """Every candidate the strategies take, in the order they take them, as if the grant
    never fit: (candidate, by fair sharing) — False for the preemptor's own and, with
    `within_nominal`, for reclaim. `candidates` in Kueue's order; `usage` before the grant."""
    state = _State(
        model,
        preemptor,
        {t: dict(u) for t, u in usage.items()},
        set(model.tree.ancestors(tenant_node(preemptor))),
    )
    mine = state.usage.setdefault(preemptor, {})
    for name, amount in amounts.items():  # the shares count the grant
        mine[name] = mine.get(name, 0) + amount
    for candidate in candidates:
        state.queues.setdefault(candidate.tenant, []).append(candidate)
    taken: list[tuple[FairCandidate, bool]] = []
    kept: list[FairCandidate] = []
    first = strategies[0] if strategies else PreemptionStrategy.LESS_THAN_OR_EQUAL_TO_FINAL_SHARE
    for target in _targets(state):
        queue = state.queues[target]
        if target == preemptor or within_nominal:
            candidate = queue.pop(0)
            state.remove(candidate)
            taken.append((candidate, False))
            continue
        preemptor_new, target_old, target_key = _shares(state, target)
        while queue:
            candidate = queue.pop(0)
            state.remove(candidate)
            target_new = state.share(target_key)
            if strategy_allows(first, preemptor_new, target_old, target_new):
                taken.append((candidate, True))
                break  # the shares moved: pick the target again
            state.add(candidate)
            kept.append(candidate)
    if len(strategies) > 1:
        taken += _second_strategy(state, kept)
    return taken


def _second_strategy(
    state: _State, kept: Sequence[FairCandidate]
) -> list[tuple[FairCandidate, bool]]:
    """Kueue's runSecondFsStrategy: over the kept candidates, at most one per tenant, taken
    when the preemptor's share with its grant is below the target side's share now."""
    state.queues = {}
    state.pruned = set()
    for candidate in kept:
        state.queues.setdefault(candidate.tenant, []).append(candidate)
    taken: list[tuple[FairCandidate, bool]] = []
    for target in _targets(state):
        preemptor_new, target_old, _ = _shares(state, target)
        candidate = state.queues[target].pop(0)
        if strategy_allows(
            PreemptionStrategy.LESS_THAN_INITIAL_SHARE, preemptor_new, target_old, target_old
        ):
            state.remove(candidate)
            taken.append((candidate, True))
        state.pruned.add(tenant_node(target))  # once per tenant
    return taken


def _targets(state: _State) -> Iterable[str]:
    """The tenants to take a candidate from, one at a time (Kueue's
    TargetClusterQueueOrdering): the caller pops a candidate (or prunes the tenant) between
    two."""
    me = tenant_node(state.preemptor)
    tree = state.model.tree
    if tree.parent(me) is None:
        while state.queues.get(state.preemptor):
            yield state.preemptor
        return
    root = tree.root(me)
    while root not in state.pruned:
        target = _next_target(state, root)
        if target is not None:
            yield target


def _next_target(state: _State, cohort: NodeKey) -> str | None:
    tree = state.model.tree
    me = tenant_node(state.preemptor)
    best_tenant: NodeKey | None = None
    best_tenant_share = NO_SHARE
    best_cohort: NodeKey | None = None
    best_cohort_share = NO_SHARE
    for child in tree.children(cohort):
        if child in state.pruned:
            continue
        share = state.share(child)
        if child[0] == "tenant":
            if (not share.borrowing and child != me) or not state.queues.get(child[1]):
                state.pruned.add(child)
            elif best_tenant is None or share.key() > best_tenant_share.key():
                best_tenant, best_tenant_share = child, share
            elif share.key() == best_tenant_share.key() and _first(state, child, best_tenant):
                best_tenant = child
        elif not share.borrowing and child not in state.path:
            state.pruned.add(child)
        elif best_cohort is None or share.key() >= best_cohort_share.key():
            best_cohort, best_cohort_share = child, share
    if best_cohort is None and best_tenant is None:
        state.pruned.add(cohort)
        return None
    if best_cohort is not None and (
        best_tenant is None or best_cohort_share.key() >= best_tenant_share.key()
    ):
        return _next_target(state, best_cohort)
    assert best_tenant is not None
    return best_tenant[1]


def _first(state: _State, challenger: NodeKey, holder: NodeKey) -> bool:
    """Whether `challenger`'s first candidate comes before `holder`'s in Kueue's order (the
    candidates' input order)."""
    return state.queues[challenger[1]][0].index < state.queues[holder[1]][0].index


def _shares(state: _State, target: str) -> tuple[Share, Share, NodeKey]:
    """The preemptor's side's share (with its grant) and the target's side's share, each of
    the node just below their lowest common cohort; and the target side's node."""
    tree = state.model.tree
    me, them = tenant_node(state.preemptor), tenant_node(target)
    lca = next(a for a in tree.ancestors(them) if a in state.path)
    return (
        state.share(_below(state, me, lca)),
        state.share(_below(state, them, lca)),
        _below(state, them, lca),
    )


def _below(state: _State, key: NodeKey, lca: NodeKey) -> NodeKey:
    """The node on `key`'s way up whose parent is `lca` (`key` itself when its parent is)."""
    tree = state.model.tree
    node = key
    while tree.parent(node) != lca:
        parent = tree.parent(node)
        assert parent is not None, "lca is not an ancestor"
        node = parent
    return node
