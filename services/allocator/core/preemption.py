"""Preemption: who goes so that a grant fits, as one planner (Kueue's Preemptor).

One context value in (the quota model, the preemptor's tenant, priority and amounts, the live
holdings and the usage around it), a plan out: the victims, each with a typed reason, and the
node the grant then goes to. Whether the grant is placed once some reservations are gone the
caller answers (`Place`: the solver on a trial state); the quota part the planner decides
itself with the quota rule beside it (core/quota/rule.py). The application layer only
executes the plan (services/allocator/app/service.py).

The rules (docs/tenancy.md, Kueue's classical preemption, per tenant `PreemptionPolicy`):

- candidates of the preemptor's tenant, as `withinClusterQueue` allows (reason PRIORITY);
- candidates of the cohort's other tenants while they borrow a resource they hold, as
  `reclaimWithinCohort` allows (RECLAIM), or, when the preemptor borrows itself, as
  `borrowWithinCohort` allows (RECLAIM_WHILE_BORROWING);
- in Kueue's order: other tenants' first, then lowest priority, then newest;
- passes: when the tenant is below nominal on every resource the grant counts, its own and
  the cohort's candidates together, the preemptor ending within nominal; then its own only,
  borrowing allowed (with borrowWithinCohort: one pass, borrowing allowed, the cohort's
  candidates below the threshold when it borrows already);
- the fewest victims, never a set that takes a higher priority than the ordered search needs.

Consolidation (rule 3, beyond Kueue: move rather than revoke) is planned beside it
(core/consolidation.py: the node, who moves, and the devices they move to, core/moves.py).

Pure: values in, values out.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from services.allocator.core.fair_preemption import FairCandidate, fair_sequence
from services.allocator.core.moves import Movable
from services.allocator.core.quota.rule import admit, resource_levels
from services.common.quota.model import (
    BorrowWithinCohort,
    PreemptionPolicy,
    PriorityClass,
    QuotaModel,
    ReclaimWithinCohort,
    TenantQuota,
    Usage,
    WithinTenant,
)
from services.common.quota.tree import tenant_node

__all__ = [
    "Candidate",
    "Holding",
    "NodeVictims",
    "PreemptionContext",
    "PreemptionPlan",
    "PreemptionReason",
    "fewest_victims",
    "plan_preemption",
    "preemption_candidates",
    "victims_by_node",
]


class PreemptionReason(StrEnum):
    """Why a reservation is a victim (Kueue's preemption reasons, and consolidation)."""

    PRIORITY = "priority"  # the preemptor's own tenant (Kueue: InClusterQueue)
    RECLAIM = "reclaim"  # a cohort tenant borrowing, the preemptor within nominal
    RECLAIM_WHILE_BORROWING = "reclaim-while-borrowing"  # borrowWithinCohort
    FAIR_SHARING = "fair-sharing"  # a tenant of a higher share (Kueue: InCohortFairSharing)
    CONSOLIDATE = "consolidate"  # moved to an equivalent device elsewhere, not just revoked


@dataclass(frozen=True)
class Holding:
    """A live reservation as the preemption rules see it."""

    id: str
    tenant: str
    priority: PriorityClass
    created_at: float  # when it was reserved (Kueue's admission time: the "newest" order)
    amounts: Usage  # what it counts against its tenant's quota
    move: Movable | None = None  # where it is, when consolidation may move it (one device)
    queued_at: float | None = None  # when its work was queued (None: when it was reserved)

    @property
    def queued(self) -> float:
        """Kueue's queue order timestamp (LowerOrNewerEqualPriority compares it)."""
        return self.created_at if self.queued_at is None else self.queued_at


@dataclass(frozen=True)
class Candidate:
    """A reservation the rules let the grant take, and why. `lca`: for another tenant's, the
    cohort of the preemptor's tree it was found under (the lowest they share; "" for the
    cohort of a tree of one level): the rules take it only while its tenant and the cohorts
    below that one borrow."""

    holding: Holding
    reason: PreemptionReason
    lca: str = ""


@dataclass(frozen=True)
class PreemptionContext:
    """Everything the planner decides from: `amounts` is what the grant counts (as placed on
    an empty fleet), `usage` the live usage of the tenant's cohort, `created_at` when the
    preemptor's work was queued (LowerOrNewerEqualPriority takes equal-priority victims queued
    after it, `Holding.queued`)."""

    model: QuotaModel
    tenant: str
    priority: PriorityClass
    amounts: Usage
    holdings: Sequence[Holding]
    usage: Mapping[str, Usage]
    created_at: float = float("inf")


@dataclass(frozen=True)
class PreemptionPlan:
    """The victims to revoke, and the node the grant was found on ("" for any)."""

    victims: tuple[Candidate, ...]
    node: str = ""


# Place(chosen, node): what the grant counts when placed (on `node`, "" anywhere the query
# allows) once `chosen` are revoked; None when it is not placed
Place = Callable[[Sequence[Candidate], str], Usage | None]


def plan_preemption(
    context: PreemptionContext,
    place: Place,
    *,
    node_of: Mapping[str, str] | None = None,
    nodes: Iterable[str] | None = None,
) -> PreemptionPlan | None:
    """The victims whose revocation makes the grant fit, pass by pass (see the module's
    rules); None when no pass finds any. With `node_of` (reservation id -> node), a pass whose
    candidates in one fleet-wide order free no node is tried node by node (`victims_by_node`,
    on `nodes` when given)."""
    model, usage = context.model, context.usage
    quota = model.quota_of(context.tenant)
    if model.fair_sharing.enabled and quota is not None and context.priority.preempts:
        return _plan_fair(context, quota, place, node_of=node_of, nodes=nodes)
    for pool, within_nominal in _passes(context):
        if not pool:
            continue
        fits_on = functools.partial(_fits, context, place, within_nominal)
        victims = fewest_victims(pool, functools.partial(fits_on, ""), model=model, usage=usage)
        if victims is not None:
            return PreemptionPlan(tuple(victims))
        if node_of is not None:
            best = victims_by_node(pool, node_of, fits_on, model=model, usage=usage, nodes=nodes)
            if best is not None:
                return PreemptionPlan(best.victims, best.node)
    return None


def _plan_fair(
    context: PreemptionContext,
    quota: TenantQuota,
    place: Place,
    *,
    node_of: Mapping[str, str] | None,
    nodes: Iterable[str] | None,
) -> PreemptionPlan | None:
    """Preemption with fair sharing (core/fair_preemption.py): the victims in the order the
    strategies take them, the shortest run after which the grant fits, pruned; node by node
    as the classical passes do, each node's candidates first."""
    model, tenant = context.model, context.tenant
    own = _own(context, quota)
    others = [
        c for c, _ in _cohort_candidates(context, quota, all_levels=True)[1]
    ]  # every borrower of the tree reclaimWithinCohort allows
    pool = _ordered(tenant, [*others, *own])
    mine = context.usage.get(tenant, {})
    within = all(
        mine.get(name, 0) + amount <= quota.of(name).nominal
        for name, amount in context.amounts.items()
        if amount > 0
    )

    def sequence(chosen: Sequence[Candidate], first: Sequence[Candidate]) -> list[Candidate]:
        """The strategies' victims among `first` once `chosen` are gone, then the rest's."""
        usage = {t: dict(u) for t, u in context.usage.items()}
        for c in chosen:
            held = usage.setdefault(c.holding.tenant, {})
            for name, amount in c.holding.amounts.items():
                held[name] = held.get(name, 0) - amount
        inputs = [
            FairCandidate(i, c.holding.tenant, c.holding.amounts) for i, c in enumerate(first)
        ]
        taken = fair_sequence(
            model,
            tenant,
            context.amounts,
            usage,
            inputs,
            model.fair_sharing.strategies,
            within_nominal=within,
        )
        found = []
        for fair, by_share in taken:
            holding = first[fair.index].holding
            if holding.tenant == tenant:
                reason = PreemptionReason.PRIORITY
            elif by_share:
                reason = PreemptionReason.FAIR_SHARING
            else:
                reason = PreemptionReason.RECLAIM
            found.append(Candidate(holding, reason))
        return found

    victims = sequence((), pool)
    fits_on = functools.partial(_fits, context, place, False)
    chosen = _minimal(victims, functools.partial(fits_on, ""))
    if chosen is not None:
        return PreemptionPlan(tuple(chosen))
    if node_of is None:
        return None

    def pool_on(node: str, here: Sequence[Candidate]) -> list[Candidate]:
        ids = {c.holding.id for c in here}
        first = sequence((), [c for c in pool if c.holding.id in ids])
        rest = [c for c in pool if c.holding.id not in ids]
        return [*first, *sequence(first, rest)]

    best = victims_by_node(pool, node_of, fits_on, nodes=nodes, smaller=0, pool_on=pool_on)
    return None if best is None else PreemptionPlan(best.victims, best.node)


def preemption_candidates(context: PreemptionContext) -> list[Candidate]:
    """Every reservation the policy lets the grant preempt, in Kueue's order (the first
    pass's candidates): nothing for a priority class whose preemptionPolicy is Never."""
    passes = _passes(context)
    return passes[0][0] if passes else []


def _passes(context: PreemptionContext) -> list[tuple[list[Candidate], bool]]:
    """(candidates, within nominal) per pass, in the order they are tried: Kueue's classical
    preemption (its candidate iterator's runs with and without borrowing)."""
    if not context.priority.preempts:
        return []
    quota = context.model.quota_of(context.tenant)
    own = _own(context, quota)
    if quota is None:
        return [(own, False)]
    advantage, priority = _cohort_candidates(context, quota)
    forbidden = quota.preemption.borrow_within_cohort is BorrowWithinCohort.NEVER
    below = _below_nominal(quota, context.amounts, context.usage.get(context.tenant, {}))
    attempts: tuple[bool, ...]
    if not advantage and not priority or (forbidden and not below):
        attempts = (True,)
    elif forbidden and not advantage:
        attempts = (False, True)
    else:
        attempts = (True, False)
    passes = []
    for borrowing in attempts:
        if not borrowing and not _can_end_within_nominal(context, quota, own):
            continue  # could only fail, at the cost of solves
        if borrowing:
            allowed = [c for c, while_borrowing in priority if while_borrowing]
        else:
            allowed = [c for c, _ in priority]
        pool = [*_ordered(context.tenant, advantage), *_ordered(context.tenant, allowed), *own]
        passes.append((pool, not borrowing))
    return passes


def _own(context: PreemptionContext, quota: TenantQuota | None) -> list[Candidate]:
    policy = quota.preemption.within_tenant if quota is not None else WithinTenant.LOWER_PRIORITY
    mine = context.priority.value

    def allowed(holding: Holding) -> bool:
        value = holding.priority.value
        if policy is WithinTenant.NEVER:
            return False
        if policy is WithinTenant.LOWER_OR_NEWER_EQUAL_PRIORITY and value == mine:
            return holding.queued > context.created_at
        return value < mine

    found = [
        Candidate(h, PreemptionReason.PRIORITY)
        for h in context.holdings
        if h.tenant == context.tenant and h.priority.preemptible and allowed(h)
    ]
    return _ordered(context.tenant, found)


def _cohort_candidates(
    context: PreemptionContext, quota: TenantQuota, *, all_levels: bool = False
) -> tuple[list[Candidate], list[tuple[Candidate, bool]]]:
    """The other tenants' reservations reclaimWithinCohort allows, found level by level up
    the preemptor's tree (Kueue's hierarchical reclaim): those of tenants that borrow, in
    subtrees that borrow. A candidate found at a level where the grant already fits in the
    quota of the preemptor's side of the tree (its own nominal, or a cohort's subtree quota
    on its way up) is a *hierarchical* one, taken whatever the preemptor borrows (first list);
    the others (second list) only by a preemptor that ends within nominal, unless
    borrowWithinCohort lets it take them while borrowing (the flag)."""
    policy = quota.preemption
    model, tree = context.model, context.model.tree
    me = tenant_node(context.tenant)
    if tree.parent(me) is None or policy.reclaim_within_cohort is ReclaimWithinCohort.NEVER:
        return [], []
    need = {name: amount for name, amount in context.amounts.items() if amount > 0}
    levels = {name: resource_levels(model, me, name, context.usage) for name in need}
    holdings: dict[str, list[Holding]] = {}
    for h in context.holdings:
        # Kueue's WorkloadUsesResources: only a reservation counting a resource the grant
        # needs (on a flavor: one of that flavor) gives back anything it needs
        uses = any(h.amounts.get(name, 0) > 0 for name in need)
        if h.tenant != context.tenant and h.priority.preemptible and uses:
            holdings.setdefault(h.tenant, []).append(h)
    mine = context.priority.value
    lower_only = policy.reclaim_within_cohort is ReclaimWithinCohort.LOWER_PRIORITY
    fits = all(lv.subtree[me] >= lv.usage[me] + need[name] for name, lv in levels.items())
    remaining = {
        name: max(0, need[name] - max(0, lv.local[me] - lv.usage[me]))
        for name, lv in levels.items()
    }
    advantage: list[Candidate] = []
    priority: list[tuple[Candidate, bool]] = []
    below = me
    for level in tree.ancestors(me):
        skip = set(tree.subtree(below))
        for key in tree.subtree(level):
            if key[0] != "tenant" or key in skip:
                continue
            for h in holdings.get(key[1], ()):
                if lower_only and h.priority.value >= mine:
                    continue
                if all_levels:  # fair sharing: every borrower, as its tenant (no level)
                    priority.append((Candidate(h, PreemptionReason.RECLAIM), True))
                    continue
                if fits:
                    advantage.append(Candidate(h, PreemptionReason.RECLAIM, level[1]))
                    continue
                while_borrowing = _while_borrowing(policy, h, mine)
                reason = (
                    PreemptionReason.RECLAIM_WHILE_BORROWING
                    if while_borrowing
                    else PreemptionReason.RECLAIM
                )
                priority.append((Candidate(h, reason, level[1]), while_borrowing))
        here = all(
            lv.subtree[level] >= lv.usage[level] + remaining[name] for name, lv in levels.items()
        )
        for name, lv in levels.items():
            remaining[name] = max(0, remaining[name] - max(0, lv.local[level] - lv.usage[level]))
        fits = fits or here
        below = level
    usage = context.usage
    advantage = _still_borrowing(advantage, model, usage, each=True)
    kept = {id(c) for c in _still_borrowing([c for c, _ in priority], model, usage, each=True)}
    return advantage, [(c, flag) for c, flag in priority if id(c) in kept]


def _while_borrowing(policy: PreemptionPolicy, holding: Holding, mine: int) -> bool:
    """Whether borrowWithinCohort lets a borrowing preemptor of priority `mine` take it: of a
    lower priority, and at most maxPriorityThreshold when set."""
    if policy.borrow_within_cohort is BorrowWithinCohort.NEVER:
        return False
    value = holding.priority.value
    threshold = policy.max_priority_threshold
    return value < mine and (threshold is None or value <= threshold)


def _ordered(tenant: str, candidates: Iterable[Candidate]) -> list[Candidate]:
    """Kueue's order: other tenants' reservations first, then the lowest priority, then the
    newest."""

    def key(c: Candidate) -> tuple[bool, int, float, str]:
        h = c.holding
        return (h.tenant == tenant, h.priority.value, -h.created_at, h.id)

    return sorted(candidates, key=key)


def _fits(
    context: PreemptionContext,
    place: Place,
    within_nominal: bool,
    node: str,
    chosen: Sequence[Candidate],
) -> bool:
    placed = place(chosen, node)
    if placed is None:
        return False
    left = {t: dict(u) for t, u in context.usage.items()}
    for candidate in chosen:
        mine = left.setdefault(candidate.holding.tenant, {})
        for name, amount in candidate.holding.amounts.items():
            mine[name] = mine.get(name, 0) - amount
    refused = admit(context.model, context.tenant, placed, left, within_nominal=within_nominal)
    return not refused


# --- the fewest victims -----------------------------------------------------------------------


def fewest_victims(
    candidates: Sequence[Candidate],
    fits: Callable[[Sequence[Candidate]], bool],
    limit: int = 64,
    *,
    model: QuotaModel | None = None,
    usage: Mapping[str, Usage] | None = None,
    smaller: int = 32,
) -> list[Candidate] | None:
    """The victims among the first `limit` candidates, None when all of them together are not
    enough. `fits(chosen)`: whether the grant fits once `chosen` are revoked (revoking more
    never makes it fit less).

    1. The shortest run of candidates, in the rules' order, that makes the grant fit (found by
       bisection: a few `fits` calls, not one per candidate).
    2. Each of them dropped again, latest first, if the grant still fits without it: the
       result is minimal (no victim can be spared).
    3. Up to `smaller` more `fits` calls on sets of fewer victims, the smallest first and in
       the rules' order, for one that fits and takes no higher priority than the run of step
       2 does (one large victim rather than four small ones of the same priority, never one
       of priority 0 for two of priority -1, as Kueue never inverts priorities). Once every
       such set was tried, the result is the smallest there is.

    With `model` and `usage`, another tenant's candidate is passed over once the victims taken
    before it leave its tenant within nominal (as Kueue's reclaimWithinCohort does): reclaim
    takes back what is borrowed, never a tenant's own nominal share."""
    allowed = list(candidates[:limit])
    if model is not None and usage is not None:
        allowed = _still_borrowing(allowed, model, usage)
    chosen = _minimal(allowed, fits)
    if chosen is None:
        return None
    return _smaller(allowed, chosen, fits, smaller, model, usage)


def _minimal(
    allowed: Sequence[Candidate], fits: Callable[[Sequence[Candidate]], bool]
) -> list[Candidate] | None:
    """Steps 1 and 2 of fewest_victims: the shortest prefix that fits, pruned."""
    if not allowed or not fits(allowed):
        return None
    low, high = 1, len(allowed)  # the shortest prefix that fits: fits(allowed[:high])
    while low < high:
        middle = (low + high) // 2
        if fits(allowed[:middle]):
            high = middle
        else:
            low = middle + 1
    chosen = list(allowed[:high])
    for candidate in list(reversed(chosen)):
        trial = [c for c in chosen if c is not candidate]
        if trial and fits(trial):
            chosen = trial
    return chosen


def _smaller(
    allowed: Sequence[Candidate],
    chosen: list[Candidate],
    fits: Callable[[Sequence[Candidate]], bool],
    smaller: int,
    model: QuotaModel | None,
    usage: Mapping[str, Usage] | None,
) -> list[Candidate]:
    """Step 3 of fewest_victims: a set of fewer victims than `chosen`, none of a higher
    priority than chosen's highest, that fits, if one is found within `smaller` calls."""
    highest = max(c.holding.priority.value for c in chosen)
    bounded = [c for c in allowed if c.holding.priority.value <= highest]
    tried = 0
    for size in range(1, len(chosen)):
        for subset in itertools.combinations(bounded, size):
            if tried >= smaller:
                return chosen
            if not _all_taken(subset, model, usage):
                continue  # the rules would not take all of them together
            tried += 1
            if fits(subset):
                return list(subset)
    return chosen


def _all_taken(
    subset: Sequence[Candidate], model: QuotaModel | None, usage: Mapping[str, Usage] | None
) -> bool:
    if model is None or usage is None:
        return True
    return len(_still_borrowing(subset, model, usage)) == len(subset)


def _still_borrowing(
    candidates: Sequence[Candidate],
    model: QuotaModel,
    usage: Mapping[str, Usage],
    *,
    each: bool = False,
) -> list[Candidate]:
    """The candidates the rules take in this order: another tenant's candidate only while it
    still borrows what it holds once the ones before it are revoked (its tenant above nominal,
    and each cohort between the tenant and the level it was found at above its subtree quota,
    on a resource the reservation counts: Kueue's reclaim takes back what is borrowed, never
    a tenant's or a subtree's own quota). `each`: every candidate judged on `usage` as it is
    (none revoked)."""
    left = {t: dict(u) for t, u in usage.items()}
    taken: list[Candidate] = []
    for candidate in candidates:
        holding = candidate.holding
        if candidate.reason in _FROM_THE_COHORT:
            if not _borrows_what_it_holds(model, candidate, left):
                continue
            if not each:
                mine = left.setdefault(holding.tenant, {})
                for name, amount in holding.amounts.items():
                    mine[name] = mine.get(name, 0) - amount
        taken.append(candidate)
    return taken


_FROM_THE_COHORT = (PreemptionReason.RECLAIM, PreemptionReason.RECLAIM_WHILE_BORROWING)


# --- node by node -----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeVictims:
    """A preemption on one node: the node and the victims to revoke there."""

    node: str
    victims: tuple[Candidate, ...]


def victims_by_node(
    candidates: Sequence[Candidate],
    node_of: Mapping[str, str],
    fits_on: Callable[[str, Sequence[Candidate]], bool],
    *,
    model: QuotaModel | None = None,
    usage: Mapping[str, Usage] | None = None,
    nodes: Iterable[str] | None = None,
    max_nodes: int = 16,
    limit: int = 64,
    smaller: int = 32,
    pool_on: Callable[[str, Sequence[Candidate]], list[Candidate]] | None = None,
) -> NodeVictims | None:
    """For a grant that goes to one node, the victims node by node, as kube-scheduler's
    preemption chooses them: on each node (of `nodes`, else every node holding a candidate;
    `node_of`: reservation id -> node), the candidates held there in rule order, then those
    held elsewhere (they free quota, not devices); the fewest of them (fewest_victims: a node
    where all of them do not make room is passed over; its search for a smaller set on the
    best node only). `fits_on(node, chosen)`: whether the grant fits on `node` once `chosen`
    are revoked. The best node:
    the fewest victims of the preemptor's own tenant, then the lowest highest victim priority,
    then the fewest victims, then the node's name. `pool_on(node, its candidates)`: the
    candidates in the order to try them there, instead of the node's first, then the others
    (fair sharing's order, which depends on what went before).

    Candidates held across the fleet, taken in one global order, would rarely free one node:
    a whole-GPU grant needs every slice of a GPU gone, and the newest reservations are spread
    over all nodes. Nodes holding the most of the candidates' amounts are tried first, at most
    `max_nodes` of them."""
    on: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        node = node_of.get(candidate.holding.id, "")
        if node:
            on.setdefault(node, []).append(candidate)
    allowed = set(on) if nodes is None else set(nodes) & set(on)

    def weight(node: str) -> tuple[int, str]:
        amount = sum(a for c in on[node] for a in c.holding.amounts.values())
        return (-amount, node)

    def rank(node: str, found: Sequence[Candidate]) -> tuple[int, int, int, str]:
        return (
            sum(1 for c in found if c.reason is PreemptionReason.PRIORITY),
            max(c.holding.priority.value for c in found),
            len(found),
            node,
        )

    def allowed_on(node: str) -> list[Candidate]:
        """The node's own candidates first (they free its devices and quota), then the others
        (they free quota only), each in the rules' order, as the rules would take them."""
        if pool_on is not None:
            return pool_on(node, on[node])[:limit]
        here = set(map(id, on[node]))
        ordered = [*on[node], *(c for c in candidates if id(c) not in here)][:limit]
        if model is None or usage is None:
            return ordered
        return _still_borrowing(ordered, model, usage)

    best: tuple[tuple[int, int, int, str], str, list[Candidate], list[Candidate]] | None = None
    for node in sorted(allowed, key=weight)[:max_nodes]:
        pool = allowed_on(node)
        found = _minimal(pool, functools.partial(fits_on, node))
        if found is not None and (best is None or rank(node, found) < best[0]):
            best = (rank(node, found), node, pool, found)
    if best is None:
        return None
    _, node, pool, found = best  # the smaller-set search on the best node only
    found = _smaller(pool, found, functools.partial(fits_on, node), smaller, model, usage)
    return NodeVictims(node, tuple(found))


# --- quota standing ---------------------------------------------------------------------------


def _within_nominal(quota: TenantQuota, amounts: Usage, used: Usage) -> bool:
    return all(
        used.get(name, 0) + amount <= quota.of(name).nominal
        for name, amount in amounts.items()
        if amount > 0
    )


def _below_nominal(quota: TenantQuota, amounts: Usage, used: Usage) -> bool:
    """Whether the tenant uses less than nominal of every resource the grant counts (Kueue's
    "queue under nominal in the resources needing preemption"): then the cohort's borrowers
    may be reclaimed, the preemptor ending within nominal."""
    return all(
        used.get(name, 0) < quota.of(name).nominal for name, amount in amounts.items() if amount > 0
    )


def _can_end_within_nominal(
    context: PreemptionContext, quota: TenantQuota, own: Sequence[Candidate]
) -> bool:
    """Whether the grant can leave the tenant within nominal at all, all of `own` revoked:
    else the within-nominal pass is not tried (it could only fail, at the cost of solves)."""
    used = dict(context.usage.get(context.tenant, {}))
    for candidate in own:
        for name, amount in candidate.holding.amounts.items():
            used[name] = used.get(name, 0) - amount
    return _within_nominal(quota, context.amounts, used)


def _borrows_what_it_holds(
    model: QuotaModel, candidate: Candidate, usage: Mapping[str, Usage]
) -> bool:
    holding = candidate.holding
    quota = model.quota_of(holding.tenant)
    if quota is None:
        return False
    used = usage.get(holding.tenant, {})
    key = tenant_node(holding.tenant)
    for name, amount in holding.amounts.items():
        if amount <= 0 or used.get(name, 0) <= quota.of(name).nominal:
            continue
        if not candidate.lca:
            return True
        levels = resource_levels(model, key, name, usage)
        between = []
        for level in model.tree.ancestors(key):
            if level[1] == candidate.lca:
                break
            between.append(level)
        if all(levels.borrowing(level) for level in between):
            return True
    return False
