"""Tenant quotas: what each tenant may hold, cohorts that lend unused quota, and the one rule.

The model is Kueue's ClusterQueue, per tenant instead of per queue, and it holds across every
batch system because every grant passes through the allocator:

- A *quota resource* counts what a reservation holds, as Kueue's `deviceClassMappings` do:
  devices of some DeviceClasses (each device counts 1), or a consumed counter of those devices
  (a MIG slice counts its `memory`, in bytes; a whole partitionable GPU counts all of it).
- A tenant has, per quota resource, a `nominal` quota, a `borrowingLimit` (how much above
  nominal it may borrow from its cohort; unset: no limit but the cohort's) and a
  `lendingLimit` (how much of its unused nominal quota others may borrow; unset: all of it).
  A tenant with quotas is limited on every quota resource: one it does not list has nominal 0.
  A tenant without `quotas` is not limited.
- A *cohort* pools what its tenants lend. Tenant t's guaranteed part is `nominal - lendingLimit`;
  the cohort's pool is the sum of the lending limits; a tenant's usage above its guaranteed part
  draws from the pool. A tenant without a cohort is a cohort of one (it can never borrow).

The rule (`admit`), per quota resource with a positive amount: the tenant's usage after the
grant stays within `nominal + borrowingLimit`, and the cohort's draws on its pool stay within
the pool. Both are checks over values: the store supplies the usage (its live entries) and takes
the grant atomically with the same check (see services/allocator/app/quotas.py).

Pure: values in, values out. Amounts are integer milli-units (a device counts 1000).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from services.common.dra.quantity import Quantity, QuantityFormat

__all__ = [
    "CONSOLIDATE",
    "PRIORITY",
    "RECLAIM",
    "Candidate",
    "Holding",
    "consolidation_order",
    "fewest_moves",
    "fewest_victims",
    "movable_candidates",
    "NodeVictims",
    "victims_by_node",
    "preemption_candidates",
    "DEFAULT_PRIORITY",
    "NO_QUOTAS",
    "PriorityClass",
    "QuotaLimits",
    "QuotaModel",
    "QuotaRefusal",
    "QuotaResource",
    "TenantQuota",
    "TenantStatus",
    "Usage",
    "add_usage",
    "cohort_key",
    "quantity_text",
]

Usage = Mapping[str, int]  # quota resource -> milli-units


@dataclass(frozen=True)
class QuotaResource:
    """What one quota resource counts: the devices of `device_classes`, each counting 1, or
    (with `counter`) the amount of that consumed counter the devices take, or (with
    `gpu_share`) the share of its GPU a device takes: a whole GPU 1, a partition its GPU's
    memory slices that it consumes over all of them (a MIG 3g.40gb of an H100: 4/8), so that
    one unit is one GPU on every model, whatever counters its MIG table knows."""

    name: str
    device_classes: tuple[str, ...]
    counter: str = ""
    gpu_share: bool = False


@dataclass(frozen=True)
class PriorityClass:
    """A reservation's priority, as Kubernetes PriorityClasses: `value` orders them; a class
    with `preempts` False never preempts (preemptionPolicy: Never); one with `preemptible`
    False is never a victim; one with `movable` True may be moved to an equivalent device on
    another node so that a grant within nominal quota fits (consolidation, docs/tenancy.md)."""

    name: str
    value: int
    preempts: bool = True
    preemptible: bool = True
    movable: bool = False


DEFAULT_PRIORITY = PriorityClass("", 0)


@dataclass(frozen=True)
class QuotaLimits:
    nominal: int
    borrowing_limit: int | None = None  # None: only the cohort's pool limits borrowing
    lending_limit: int | None = None  # None: all of nominal may be lent

    @property
    def lendable(self) -> int:
        lent = self.nominal if self.lending_limit is None else self.lending_limit
        return min(lent, self.nominal)

    @property
    def guaranteed(self) -> int:
        return self.nominal - self.lendable


_NO_QUOTA = QuotaLimits(0)


@dataclass(frozen=True)
class TenantQuota:
    tenant: str
    cohort: str  # "" when the tenant is a cohort of its own
    limits: Mapping[str, QuotaLimits]

    def of(self, resource: str) -> QuotaLimits:
        return self.limits.get(resource, _NO_QUOTA)


@dataclass(frozen=True)
class QuotaRefusal:
    """Why a grant does not fit one quota resource (all amounts in milli-units)."""

    tenant: str
    resource: str
    requested: int
    used: int
    nominal: int
    borrowed: int
    left: int
    cohort: str = ""
    binary: bool = False  # amounts of a counter (bytes): shown as 80Gi rather than 85899345920

    def __str__(self) -> str:
        where = f" in cohort {self.cohort}" if self.cohort else ""

        def units(milli: int) -> str:
            return quantity_text(milli, self.binary)

        return (
            f"tenant {self.tenant} quota {self.resource}{where}: requested "
            f"{units(self.requested)}, used {units(self.used)} of nominal "
            f"{units(self.nominal)} (borrowed {units(self.borrowed)}), "
            f"{units(self.left)} left"
        )


@dataclass(frozen=True)
class TenantStatus:
    """One tenant's standing on one quota resource (milli-units)."""

    tenant: str
    resource: str
    cohort: str
    nominal: int
    used: int
    borrowed: int  # used above nominal
    lent: int  # of its unused nominal quota, what other tenants of the cohort use now
    left: int  # what it could still be granted now
    borrowing_limit: int | None
    lending_limit: int | None
    binary: bool = False
    # per tenant, the same on each of its rows: revoked by a preemption, the holder not told yet
    pending_preemptions: int = 0
    pending_preemption_ids: tuple[str, ...] = ()  # the oldest of them


def cohort_key(quota: TenantQuota) -> str:
    """The name under which the store keeps a cohort's usage: `cohort:<name>`, or
    `tenant:<name>` for a tenant that is a cohort of its own."""
    return f"cohort:{quota.cohort}" if quota.cohort else f"tenant:{quota.tenant}"


@dataclass(frozen=True)
class QuotaModel:
    resources: tuple[QuotaResource, ...]
    tenants: Mapping[str, TenantQuota]  # only tenants with quotas
    priority_classes: Mapping[str, PriorityClass] = field(default_factory=dict)
    default_priority: PriorityClass = DEFAULT_PRIORITY
    _members: Mapping[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        members: dict[str, list[str]] = {}
        for quota in self.tenants.values():
            members.setdefault(cohort_key(quota), []).append(quota.tenant)
        object.__setattr__(self, "_members", {k: tuple(sorted(v)) for k, v in members.items()})

    @property
    def enabled(self) -> bool:
        return bool(self.resources) and bool(self.tenants)

    def quota_of(self, tenant: str) -> TenantQuota | None:
        """The tenant's quota; None: the tenant is not limited."""
        return self.tenants.get(tenant)

    def members(self, quota: TenantQuota) -> tuple[str, ...]:
        """The tenants sharing `quota`'s cohort (itself included)."""
        return self._members.get(cohort_key(quota), (quota.tenant,))

    def priority(self, name: str) -> PriorityClass:
        """The class a reservation names; "" or a class the policy no longer has: the
        default (a reload must not make old reservations unpreemptible or unranked)."""
        return (
            self.priority_classes.get(name, self.default_priority)
            if name
            else (self.default_priority)
        )

    def cohorts(self) -> tuple[str, ...]:
        return tuple(sorted(self._members))

    def admit(
        self, tenant: str, amounts: Usage, usage: Mapping[str, Usage]
    ) -> tuple[QuotaRefusal, ...]:
        """Whether `tenant` may be granted `amounts` on top of `usage` (tenant -> its usage, the
        cohort's tenants at least): () when it may, else one refusal per resource that does
        not fit."""
        quota = self.quota_of(tenant)
        if quota is None:
            return ()
        refusals = []
        for resource in self.resources:
            amount = amounts.get(resource.name, 0)
            if amount <= 0:
                continue
            left = self._left(quota, resource.name, usage)
            if amount > left:
                used = usage.get(tenant, {}).get(resource.name, 0)
                nominal = quota.of(resource.name).nominal
                refusals.append(
                    QuotaRefusal(
                        tenant,
                        resource.name,
                        requested=amount,
                        used=used,
                        nominal=nominal,
                        borrowed=max(0, used - nominal),
                        left=left,
                        cohort=quota.cohort,
                        binary=bool(resource.counter),
                    )
                )
        return tuple(refusals)

    def status(self, usage: Mapping[str, Usage], tenants: Iterable[str] = ()) -> list[TenantStatus]:
        """Per tenant (those given, else every tenant with quotas) and quota resource."""
        rows: list[TenantStatus] = []
        for tenant in sorted(tenants) if tenants else sorted(self.tenants):
            quota = self.quota_of(tenant)
            if quota is None:
                continue
            for resource in self.resources:
                name = resource.name
                limits = quota.of(name)
                used = usage.get(tenant, {}).get(name, 0)
                rows.append(
                    TenantStatus(
                        tenant,
                        name,
                        quota.cohort,
                        nominal=limits.nominal,
                        used=used,
                        borrowed=max(0, used - limits.nominal),
                        lent=self._lent(quota, name, usage),
                        left=self._left(quota, name, usage),
                        borrowing_limit=limits.borrowing_limit,
                        lending_limit=limits.lending_limit,
                        binary=bool(resource.counter),
                    )
                )
        return rows

    # --- the rule ---------------------------------------------------------------------------

    def _left(self, quota: TenantQuota, resource: str, usage: Mapping[str, Usage]) -> int:
        """The largest amount `admit` grants the tenant now.

        With u its usage, g its guaranteed part, P the cohort's pool and E the other tenants'
        draws on it (their usage above their guaranteed parts): a grant a fits when
        u + a <= nominal + borrowingLimit and max(0, u + a - g) + E <= P, so
        a <= min(nominal + borrowingLimit - u, g - u + max(0, P - E))."""
        limits = quota.of(resource)
        used = usage.get(quota.tenant, {}).get(resource, 0)
        pool, others = 0, 0
        for member in self.members(quota):
            member_limits = self.tenants[member].of(resource)
            pool += member_limits.lendable
            if member != quota.tenant:
                member_used = usage.get(member, {}).get(resource, 0)
                others += max(0, member_used - member_limits.guaranteed)
        left = limits.guaranteed - used + max(0, pool - others)
        if limits.borrowing_limit is not None:
            left = min(left, limits.nominal + limits.borrowing_limit - used)
        return max(0, left)

    def _lent(self, quota: TenantQuota, resource: str, usage: Mapping[str, Usage]) -> int:
        """How much of the tenant's unused lendable quota the cohort's borrowers use now:
        the borrowers' draws beyond the other lenders' unused lendable parts are charged to
        the lenders in name order (a deterministic, documented attribution)."""
        borrowed = 0
        unused: list[tuple[str, int]] = []
        for member in self.members(quota):
            limits = self.tenants[member].of(resource)
            used = usage.get(member, {}).get(resource, 0)
            borrowed += max(0, used - limits.nominal)
            spare = min(limits.lendable, max(0, limits.nominal - used))
            unused.append((member, spare))
        for member, spare in unused:
            charged = min(spare, borrowed)
            borrowed -= charged
            if member == quota.tenant:
                return charged
        return 0


NO_QUOTAS = QuotaModel((), {})


def add_usage(total: dict[str, dict[str, int]], tenant: str, amounts: Usage) -> None:
    """Add one grant's amounts to a tenant -> usage table."""
    mine = total.setdefault(tenant, {})
    for resource, amount in amounts.items():
        mine[resource] = mine.get(resource, 0) + amount


def quantity_text(milli: int, binary: bool = False) -> str:
    """Milli-units as a Kubernetes quantity (`8`, `1500m`, `80Gi` for binary amounts)."""
    fmt = QuantityFormat.BINARY_SI if binary else QuantityFormat.DECIMAL_SI
    return str(Quantity.of(Fraction(milli, 1000), fmt))


# --- preemption -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holding:
    """A live reservation as the preemption rules see it."""

    id: str
    tenant: str
    priority: PriorityClass
    created_at: float
    amounts: Usage  # what it counts against its tenant's quota


@dataclass(frozen=True)
class Candidate:
    holding: Holding
    reason: str  # RECLAIM or PRIORITY


RECLAIM = "reclaim"
PRIORITY = "priority"
CONSOLIDATE = "consolidate"  # moved to an equivalent device elsewhere, not just revoked


def preemption_candidates(
    model: QuotaModel,
    tenant: str,
    priority: PriorityClass,
    amounts: Usage,
    holdings: Sequence[Holding],
    usage: Mapping[str, Usage],
) -> list[Candidate]:
    """Who may be revoked so that `tenant` gets `amounts` at `priority`, in the order the
    rules take them (docs/tenancy.md):

    1. *reclaim*, when the grant keeps the tenant within its nominal quota: reservations of
       other tenants of its cohort that borrow (hold more than nominal of a resource the
       reservation counts), the most borrowing tenant first (dominant share: borrowed over the
       cohort's pool, the largest over the resources), then lowest priority, newest first;
    2. *priority*: the tenant's own reservations of a lower priority, lowest first, newest
       first.

    Never a reservation of a class that is not preemptible, and nothing for a priority class
    whose preemptionPolicy is Never."""
    if not priority.preempts:
        return []
    quota = model.quota_of(tenant)
    found: list[Candidate] = []
    if quota is not None and _within_nominal(quota, amounts, usage.get(tenant, {})):
        members = set(model.members(quota)) - {tenant}
        shares = {member: _borrowed_share(model, member, usage) for member in members}
        reclaimable = [
            h
            for h in holdings
            if h.tenant in members
            and h.priority.preemptible
            and _borrows_what_it_holds(model, h, usage.get(h.tenant, {}))
        ]
        reclaimable.sort(key=lambda h: (-shares[h.tenant], h.priority.value, -h.created_at, h.id))
        found += [Candidate(h, RECLAIM) for h in reclaimable]
    own = [
        h
        for h in holdings
        if h.tenant == tenant and h.priority.preemptible and h.priority.value < priority.value
    ]
    own.sort(key=lambda h: (h.priority.value, -h.created_at, h.id))
    found += [Candidate(h, PRIORITY) for h in own]
    return found


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
       the rules' order, for one that fits: one large victim rather than four small ones.
       Once every smaller set was tried, the result is the smallest there is.

    With `model` and `usage`, a reclaim candidate is passed over once the victims taken
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
    """Step 3 of fewest_victims: a set of fewer victims than `chosen` that fits, if one is
    found within `smaller` calls of `fits`."""
    tried = 0
    for size in range(1, len(chosen)):
        for subset in itertools.combinations(allowed, size):
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
    candidates: Sequence[Candidate], model: QuotaModel, usage: Mapping[str, Usage]
) -> list[Candidate]:
    """The candidates the rules take in this order: a reclaim candidate only while its tenant
    still borrows once the ones before it are revoked."""
    left = {t: dict(u) for t, u in usage.items()}
    taken: list[Candidate] = []
    for candidate in candidates:
        holding = candidate.holding
        if candidate.reason == RECLAIM:
            if not _borrows_what_it_holds(model, holding, left.get(holding.tenant, {})):
                continue
            mine = left.setdefault(holding.tenant, {})
            for name, amount in holding.amounts.items():
                mine[name] = mine.get(name, 0) - amount
        taken.append(candidate)
    return taken


def movable_candidates(
    model: QuotaModel,
    tenant: str,
    priority: PriorityClass,
    amounts: Usage,
    holdings: Sequence[Holding],
    usage: Mapping[str, Usage],
) -> list[Candidate]:
    """Rule 3, *consolidate*, for when revoking what rules 1 and 2 allow cannot make room
    (the free devices are spread over nodes, as KAI Scheduler's Consolidate action finds
    them): when the grant keeps `tenant` within its nominal quota, reservations of a movable
    priority class of any tenant of its cohort (its own too, of any priority) may be moved to
    an equivalent free device on another node. A move takes nothing from anyone's quota: the
    holder keeps what it counts, on other devices; it does cost the holder a restart. Newest
    first. Which of them make room on a node, and whether each finds a device elsewhere, the
    caller decides (only holdings it can re-place are candidates)."""
    if not priority.preempts:
        return []
    quota = model.quota_of(tenant)
    if quota is None or not _within_nominal(quota, amounts, usage.get(tenant, {})):
        return []
    members = set(model.members(quota))
    movable = [
        h for h in holdings if h.tenant in members and h.priority.preemptible and h.priority.movable
    ]
    movable.sort(key=lambda h: (-h.created_at, h.id))
    return [Candidate(h, CONSOLIDATE) for h in movable]


def consolidation_order(
    candidates: Sequence[Candidate], group_of: Mapping[str, str]
) -> list[Candidate]:
    """One node's movable candidates in the order consolidation frees them: group by group
    (`group_of`: holding id -> its GPU, the counter set its device consumes), the groups
    holding the least first, so that the shortest run that makes room empties the emptiest
    GPUs; within a group, in the candidates' order."""
    held: dict[str, int] = {}
    for candidate in candidates:
        group = group_of.get(candidate.holding.id, candidate.holding.id)
        held[group] = held.get(group, 0) + sum(candidate.holding.amounts.values())
    index = {id(c): i for i, c in enumerate(candidates)}

    def key(candidate: Candidate) -> tuple[int, str, int]:
        group = group_of.get(candidate.holding.id, candidate.holding.id)
        return (held[group], group, index[id(candidate)])

    return sorted(candidates, key=key)


def fewest_moves(
    candidates: Sequence[Candidate], fits: Callable[[Sequence[Candidate]], bool]
) -> list[Candidate] | None:
    """The shortest run of `candidates` (in consolidation_order) that makes the grant fit,
    pruned so that no move can be spared; None when moving all of them is not enough."""
    return _minimal(candidates, fits)


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
) -> NodeVictims | None:
    """For a grant that goes to one node, the victims node by node, as kube-scheduler's
    preemption chooses them: on each node (of `nodes`, else every node holding a candidate;
    `node_of`: reservation id -> node), the candidates held there in rule order, then those
    held elsewhere (they free quota, not devices); the fewest of them (fewest_victims: a node
    where all of them do not make room is passed over; its search for a smaller set on the
    best node only). `fits_on(node, chosen)`: whether the grant fits on `node` once `chosen`
    are revoked. The best node:
    the fewest victims taken by the priority rule, then the lowest highest victim priority,
    then the fewest victims, then the node's name.

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
            sum(1 for c in found if c.reason == PRIORITY),
            max(c.holding.priority.value for c in found),
            len(found),
            node,
        )

    def allowed_on(node: str) -> list[Candidate]:
        """The node's own candidates first (they free its devices and quota), then the others
        (they free quota only), each in the rules' order, as the rules would take them."""
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


def _within_nominal(quota: TenantQuota, amounts: Usage, used: Usage) -> bool:
    return all(
        used.get(name, 0) + amount <= quota.of(name).nominal
        for name, amount in amounts.items()
        if amount > 0
    )


def _borrows_what_it_holds(model: QuotaModel, holding: Holding, used: Usage) -> bool:
    quota = model.quota_of(holding.tenant)
    if quota is None:
        return False
    return any(
        amount > 0 and used.get(name, 0) > quota.of(name).nominal
        for name, amount in holding.amounts.items()
    )


def _borrowed_share(model: QuotaModel, tenant: str, usage: Mapping[str, Usage]) -> Fraction:
    quota = model.quota_of(tenant)
    if quota is None:
        return Fraction(0)
    used = usage.get(tenant, {})
    share = Fraction(0)
    for resource in model.resources:
        name = resource.name
        pool = sum(model.tenants[m].of(name).lendable for m in model.members(quota))
        borrowed = max(0, used.get(name, 0) - quota.of(name).nominal)
        share = max(share, Fraction(borrowed, max(1, pool)))
    return share
