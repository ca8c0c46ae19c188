"""The quota rule: whether a grant fits a tenant's quota, and where every tenant and cohort stands.

This is the rule's half of tenant quotas; the model's half, what the access policy declares
(quota resources and flavors, tenants' and cohorts' quotas, the cohort tree, priority classes,
preemption policies) and its lookups, is services/common/quota/model.py. The policy parser
builds the model; the allocator decides with it here, next to the preemption planner
(core/preemption.py), which asks this rule whether a plan's grant fits.

The rule (`admit`), per quota resource with a positive amount: the amount fits in what the
tenant may still take at every level of its tree (Kueue's available capacity): within
`nominal + borrowingLimit`, and within what each cohort above it can still give within its
own limits (core/quota/levels.py). It is a check over values: the store supplies the usage
(its live entries) and takes the grant atomically with the same check (see
services/allocator/app/quotas.py). `tenant_status` and `cohort_status` are the same figures as
rows for QuotaStatus; `share_of` is a tenant's or cohort's dominant resource share
(core/quota/fair_sharing.py).

Pure: values in, values out. Amounts are integer milli-units (a device counts 1000).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from services.allocator.core.quota.fair_sharing import (
    ConsumedUsage,
    Share,
    decayed_score,
    dominant_share,
)
from services.allocator.core.quota.levels import Levels, tree_levels
from services.common.quota.model import (
    UNCOUNTED,
    QuotaModel,
    TenantQuota,
    Usage,
    quantity_text,
)
from services.common.quota.tree import NodeKey, cohort_node, tenant_node

__all__ = [
    "CohortStatus",
    "QuotaRefusal",
    "TenantStatus",
    "add_usage",
    "admit",
    "cohort_status",
    "counted_only",
    "quota_levels",
    "resource_levels",
    "share_of",
    "tenant_status",
]


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
    listed: bool = True  # False: the tenant's quotas do not list the resource (never granted)

    def __str__(self) -> str:
        where = f" in cohort {self.cohort}" if self.cohort else ""
        if self.resource == UNCOUNTED:
            return (
                f"tenant {self.tenant}: requested {quantity_text(self.requested)} devices no "
                "quota resource counts (spec.quota.uncountedDevices: Refuse; never granted to a "
                "tenant with quotas)"
            )
        if not self.listed:
            return (
                f"tenant {self.tenant} quota {self.resource}{where}: requested "
                f"{quantity_text(self.requested, self.binary)}, not listed in the tenant's "
                f"quotas (never granted), 0 left"
            )

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
    path: tuple[str, ...] = ()  # the cohorts from the root down to its own
    weight: Fraction = Fraction(1)  # fairSharing.weight
    share: Share = Share()  # per tenant: its dominant resource share now
    decayed: float | None = None  # its decayed usage of the resource (admission fair sharing)
    decayed_usage: float | None = None  # per tenant: the weighted sum over resources
    decayed_at: float | None = None  # when it was sampled (seconds since the epoch)


@dataclass(frozen=True)
class CohortStatus:
    """One cohort's standing on one quota resource (milli-units), as Kueue's resource node
    has it: its own nominal quota, the subtree quota (its own plus what its children lend it),
    what its children use of it beyond their local quotas, what it borrows from its parent and
    lends to its parent's other children, and what its subtree could still be granted."""

    cohort: str
    resource: str
    parent: str
    nominal: int
    subtree: int
    used: int
    borrowed: int  # used above the subtree quota: taken from its parent
    lent: int
    left: int
    borrowing_limit: int | None
    lending_limit: int | None
    binary: bool = False
    path: tuple[str, ...] = ()  # the cohorts from the root down to its parent
    weight: Fraction = Fraction(1)
    share: Share = Share()


def admit(
    model: QuotaModel,
    tenant: str,
    amounts: Usage,
    usage: Mapping[str, Usage],
    *,
    within_nominal: bool = False,
) -> tuple[QuotaRefusal, ...]:
    """Whether `tenant` may be granted `amounts` on top of `usage` (tenant -> its usage, the
    tenants of its tree at least): () when it may, else one refusal per resource that does
    not fit. `within_nominal`: also refused where the grant would borrow (the preemption
    pass that must leave the preemptor within nominal, core/preemption.py)."""
    quota = model.quota_of(tenant)
    if quota is None:
        return ()
    refusals = []
    uncounted = amounts.get(UNCOUNTED, 0)
    if model.refuse_uncounted and uncounted > 0:
        refusals.append(
            QuotaRefusal(
                tenant, UNCOUNTED, uncounted, 0, 0, 0, 0, cohort=quota.cohort, listed=False
            )
        )
    for resource in model.resources:
        amount = amounts.get(resource.name, 0)
        if amount <= 0:
            continue
        left = _left(model, quota, resource.name, usage)
        if within_nominal:
            used_now = usage.get(tenant, {}).get(resource.name, 0)
            left = min(left, max(0, quota.of(resource.name).nominal - used_now))
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
                    listed=resource.name in quota.limits,
                )
            )
    return tuple(refusals)


def _left(model: QuotaModel, quota: TenantQuota, resource: str, usage: Mapping[str, Usage]) -> int:
    """The largest amount `admit` grants the tenant now: what it may still take at every
    level of its tree (levels.py's `Levels.available`).

    In a cohort of tenants only, with u its usage, g its guaranteed part, P the cohort's
    pool and E the other tenants' draws on it (their usage above their guaranteed parts):
    a <= min(nominal + borrowingLimit - u, g - u + max(0, P - E))."""
    if resource not in quota.limits:
        return 0  # never granted (Kueue: a resource the ClusterQueue does not cover)
    key = tenant_node(quota.tenant)
    return max(0, resource_levels(model, key, resource, usage).available(key))


# --- the tree's figures ---------------------------------------------------------------------


def quota_levels(model: QuotaModel, key: NodeKey, usage: Mapping[str, Usage]) -> dict[str, Levels]:
    """Every resource's Levels of `key`'s tree (usage: tenant -> its usage)."""
    return {r.name: resource_levels(model, key, r.name, usage) for r in model.resources}


def resource_levels(
    model: QuotaModel, key: NodeKey, resource: str, usage: Mapping[str, Usage]
) -> Levels:
    """One resource's Levels of `key`'s tree."""
    of_resource = {t: u.get(resource, 0) for t, u in usage.items()}
    return tree_levels(model.tree, resource, of_resource, key)


def share_of(
    model: QuotaModel,
    key: NodeKey,
    usage: Mapping[str, Usage],
    extra: Usage | None = None,
    levels: Mapping[str, Levels] | None = None,
) -> Share:
    """The dominant resource share of a tenant or cohort now (with `extra` more used by
    it: a grant's amounts)."""
    if key not in model.tree:
        return Share()
    found = levels if levels is not None else quota_levels(model, key, usage)
    return dominant_share(model.tree, key, found, model.base_of(), extra)


def tenant_status(
    model: QuotaModel,
    usage: Mapping[str, Usage],
    tenants: Iterable[str] = (),
    *,
    consumed: Mapping[str, ConsumedUsage] | None = None,
) -> list[TenantStatus]:
    """Per tenant (those given, else every tenant with quotas) and quota resource; with
    `consumed` (the tenants' decayed usage as last sampled) and usage decay configured,
    each row's decayed usage and the tenant's weighted sum of it."""
    rows: list[TenantStatus] = []
    decay = model.admission_fair_sharing if consumed is not None else None
    trees = _Trees(model, usage)
    for tenant in sorted(tenants) if tenants else sorted(model.tenants):
        quota = model.quota_of(tenant)
        if quota is None:
            continue
        key = tenant_node(tenant)
        root = model.tree.root(key)
        levels, lent = trees.of(root)
        share = dominant_share(model.tree, key, levels, model.base_of())
        path = model.tree.path(key)
        decayed: Mapping[str, float] | None = None
        score: float | None = None
        sampled: float | None = None
        if decay is not None and consumed is not None:
            record = consumed.get(tenant)
            decayed = record.amounts if record is not None else {}
            sampled = record.at if record is not None else None
            score = decayed_score(decayed, decay.resource_weights, model.base_of(), quota.weight)
        for resource in model.resources:
            name = resource.name
            limits = quota.of(name)
            used = usage.get(tenant, {}).get(name, 0)
            left = 0
            if name in quota.limits:
                left = max(0, levels[name].available(key))
            rows.append(
                TenantStatus(
                    tenant,
                    name,
                    quota.cohort,
                    nominal=limits.nominal,
                    used=used,
                    borrowed=max(0, used - limits.nominal),
                    lent=lent[name].get(key, 0),
                    left=left,
                    borrowing_limit=limits.borrowing_limit,
                    lending_limit=limits.lending_limit,
                    binary=bool(resource.counter),
                    path=path,
                    weight=quota.weight,
                    share=share,
                    decayed=None if decayed is None else decayed.get(name, 0.0),
                    decayed_usage=score,
                    decayed_at=sampled,
                )
            )
    return rows


def cohort_status(
    model: QuotaModel, usage: Mapping[str, Usage], cohorts: Iterable[str] = ()
) -> list[CohortStatus]:
    """Per cohort (those given, else every cohort) and quota resource."""
    rows: list[CohortStatus] = []
    trees = _Trees(model, usage)
    for name in sorted(set(cohorts)) if cohorts else model.cohort_names():
        key = cohort_node(name)
        if key not in model.tree:
            continue
        root = model.tree.root(key)
        levels, lent = trees.of(root)
        share = dominant_share(model.tree, key, levels, model.base_of())
        node = model.tree.node(key)
        for resource in model.resources:
            level = levels[resource.name]
            limits = node.limits.get(resource.name)
            rows.append(
                CohortStatus(
                    name,
                    resource.name,
                    node.parent,
                    nominal=limits.nominal if limits is not None else 0,
                    subtree=level.subtree[key],
                    used=level.usage[key],
                    borrowed=max(0, level.usage[key] - level.subtree[key]),
                    lent=lent[resource.name].get(key, 0),
                    left=max(0, level.available(key)),
                    borrowing_limit=limits.borrowing_limit if limits is not None else None,
                    lending_limit=limits.lending_limit if limits is not None else None,
                    binary=bool(resource.counter),
                    path=model.tree.path(key),
                    weight=node.weight,
                    share=share,
                )
            )
    return rows


def add_usage(total: dict[str, dict[str, int]], tenant: str, amounts: Usage) -> None:
    """Add one grant's amounts to a tenant -> usage table."""
    mine = total.setdefault(tenant, {})
    for resource, amount in amounts.items():
        mine[resource] = mine.get(resource, 0) + amount


def counted_only(amounts: Usage) -> dict[str, int]:
    """`amounts` without the devices no quota resource counts (what a ledger entry keeps)."""
    return {name: amount for name, amount in amounts.items() if name != UNCOUNTED}


class _Trees:
    """Each tree's levels (per quota resource) and what each of its nodes lends, computed
    once per root for a status call."""

    def __init__(self, model: QuotaModel, usage: Mapping[str, Usage]) -> None:
        self.model, self.usage = model, usage
        self._of: dict[NodeKey, tuple[dict[str, Levels], dict[str, dict[NodeKey, int]]]] = {}

    def of(self, root: NodeKey) -> tuple[dict[str, Levels], dict[str, dict[NodeKey, int]]]:
        if root not in self._of:
            levels = quota_levels(self.model, root, self.usage)
            self._of[root] = levels, {name: lv.lent() for name, lv in levels.items()}
        return self._of[root]
