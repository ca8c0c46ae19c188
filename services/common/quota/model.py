"""Tenant quotas: what each tenant may hold, cohorts that lend unused quota, and the one rule.

The model is Kueue's ClusterQueue, per tenant instead of per queue, and it holds across every
batch system because every grant passes through the allocator:

- A *quota resource* counts what a reservation holds, as Kueue's `deviceClassMappings` do:
  devices of some DeviceClasses (each device counts 1), or a consumed counter of those devices
  (a MIG slice counts its `memory`, in bytes; a whole partitionable GPU counts all of it).
- A tenant has, per quota resource, a `nominal` quota, a `borrowingLimit` (how much above
  nominal it may borrow from its cohort; unset: no limit but the cohort's) and a
  `lendingLimit` (how much of its unused nominal quota others may borrow; unset: all of it).
  A tenant with quotas is limited on every quota resource: one it does not list it is never
  granted (Kueue admits no workload asking for a resource its ClusterQueue does not cover).
  A tenant without `quotas` is not limited. A device *no* quota resource counts is not
  limited either, unless `refuse_uncounted` (spec.quota.uncountedDevices: Refuse, which the
  translation of Kueue's objects writes): then a tenant with quotas is never granted one.
- A *cohort* pools what its tenants lend. Tenant t's guaranteed part is `nominal - lendingLimit`;
  the cohort's pool is the sum of the lending limits; a tenant's usage above its guaranteed part
  draws from the pool. A tenant without a cohort is a cohort of one (it can never borrow).
- Cohorts form a tree (Kueue's hierarchical Cohorts): a cohort may name a parent and have
  quotas of its own, with lending and borrowing limits towards its parent. Borrowing goes up
  the tree and lending down (services/common/security/cohorts.py). One tree shares one quota
  ledger, named after its root (`ledger_key`).

The rule (`admit`), per quota resource with a positive amount: the amount fits in what the
tenant may still take at every level of its tree (Kueue's available capacity): within
`nominal + borrowingLimit`, and within what each cohort above it can still give within its
own limits. It is a check over values: the store supplies the usage (its live entries) and
takes the grant atomically with the same check (see services/allocator/app/quotas.py).

Pure: values in, values out. Amounts are integer milli-units (a device counts 1000).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

from services.common.dra.model import DeviceTaint, DeviceToleration
from services.common.dra.quantity import Quantity, QuantityFormat
from services.common.quota.fair_sharing import (
    AdmissionFairSharing,
    ConsumedUsage,
    FairSharing,
    Share,
    decayed_score,
    dominant_share,
)
from services.common.quota.tree import (
    CohortTree,
    Levels,
    NodeKey,
    TreeNode,
    cohort_node,
    tenant_node,
)

__all__ = [
    "DEFAULT_FUNGIBILITY",
    "DEFAULT_PREEMPTION",
    "NO_FLAVOR",
    "DEFAULT_PRIORITY",
    "NO_QUOTAS",
    "BorrowWithinCohort",
    "CohortQuota",
    "CohortStatus",
    "FlavorFungibility",
    "FlavorPreference",
    "PreemptionPolicy",
    "ResourceFlavor",
    "WhenCanBorrow",
    "WhenCanPreempt",
    "PriorityClass",
    "QuotaLimits",
    "QuotaModel",
    "QuotaRefusal",
    "QuotaResource",
    "ReclaimWithinCohort",
    "TenantQuota",
    "TenantStatus",
    "UNCOUNTED",
    "Usage",
    "WithinTenant",
    "add_usage",
    "counted_only",
    "quantity_text",
]

Usage = Mapping[str, int]  # quota resource -> milli-units


@dataclass(frozen=True)
class ResourceFlavor:
    """Kueue's ResourceFlavor, for devices: which devices a flavor's quota covers and who may
    use them.

    A device is of the flavor when its node carries every one of `node_labels`, one of
    `device_classes` selects it (any, when empty) and it matches every CEL expression of
    `selectors` (gpualloc's: a flavor of devices rather than of nodes, e.g. whole GPUs and MIG
    slices on one node). A grant may use the flavor only when its requests (or its tenant)
    tolerate every one of `node_taints` (Kueue's nodeTaints: NoSchedule and NoExecute; its own
    `tolerations` count too, as Kueue's check does); `tolerations` are added to the requests
    placed on the flavor, so that devices tainted as the flavor's nodes are can be allocated
    (Kueue injects them into the pods it admits)."""

    name: str
    node_labels: tuple[tuple[str, str], ...] = ()
    node_taints: tuple[DeviceTaint, ...] = ()
    tolerations: tuple[DeviceToleration, ...] = ()
    device_classes: tuple[str, ...] = ()
    selectors: tuple[str, ...] = ()  # CEL expressions over `device`, as a DeviceClass's

    @property
    def by_device(self) -> bool:
        """Whether the flavor selects devices, not only nodes."""
        return bool(self.device_classes or self.selectors)


@dataclass(frozen=True)
class QuotaResource:
    """What one quota resource counts: the devices of `device_classes`, each counting 1, or
    (with `counter`) the amount of that consumed counter the devices take, or (with
    `gpu_share`) the share of its GPU a device takes: a whole GPU 1, a partition its GPU's
    memory slices that it consumes over all of them (a MIG 3g.40gb of an H100: 4/8), so that
    one unit is one GPU on every model, whatever counters its MIG table knows.

    A resource given per flavor (Kueue's ResourceFlavor) is one QuotaResource per flavor,
    named `<resource>/<flavor>` (`base` and `flavor` its parts, `spec` the flavor): a device a
    tenant holds is charged to the first flavor *in the tenant's own quota order* that selects
    it (Kueue's flavors are per ClusterQueue; `QuotaModel.charge_order`), so overlapping
    flavors never count a device twice. One more, `<resource>/(none)` (`spec` None), counts
    the devices of none of its flavors; no tenant can list it, so a limited tenant is never
    granted them (Kueue admits a workload only to a flavor of its ClusterQueue)."""

    name: str
    device_classes: tuple[str, ...]
    counter: str = ""
    gpu_share: bool = False
    base: str = ""  # the resource a flavor's quota belongs to ("" for an unflavored one)
    flavor: str = ""
    spec: ResourceFlavor | None = None  # the flavor (None for an unflavored one and (none))
    # CEL expressions over `device` a counted device must match too (beside its class): a
    # resource of one MIG profile, as Kueue's `nvidia.com/mig-<profile>` counts
    selectors: tuple[str, ...] = ()


NO_FLAVOR = "(none)"  # the flavor name of the devices in none of a resource's flavors
# The amount a grant holds of devices no quota resource counts (a device each, in
# milli-units): not a quota resource, never in the ledger; with `refuse_uncounted`, what a
# limited tenant is refused (Kueue admits no workload asking for a resource its ClusterQueue
# does not cover).
UNCOUNTED = "(uncounted)"


class WhenCanBorrow(StrEnum):
    """Kueue's flavorFungibility.whenCanBorrow: a flavor the grant fits only by borrowing
    ends the search (MayStopSearch; Kueue v1beta1's older name `Borrow`) or a later flavor is
    tried (TryNextFlavor)."""

    MAY_STOP_SEARCH = "MayStopSearch"
    TRY_NEXT_FLAVOR = "TryNextFlavor"


class WhenCanPreempt(StrEnum):
    """Kueue's flavorFungibility.whenCanPreempt: a flavor the grant fits only if victims go
    makes the search try the next flavor (TryNextFlavor, the default) or ends it
    (MayStopSearch; Kueue v1beta1's older name `Preempt`)."""

    MAY_STOP_SEARCH = "MayStopSearch"
    TRY_NEXT_FLAVOR = "TryNextFlavor"


class FlavorPreference(StrEnum):
    """Kueue's flavorFungibility.preference: when every flavor tried needs borrowing,
    preemption or both, which weighs first."""

    BORROWING_OVER_PREEMPTION = "BorrowingOverPreemption"
    PREEMPTION_OVER_BORROWING = "PreemptionOverBorrowing"


@dataclass(frozen=True)
class FlavorFungibility:
    """Kueue's ClusterQueue flavorFungibility, with its defaults. `preference` None is
    Kueue's default (BorrowingOverPreemption); it may be set only when both policies are
    TryNextFlavor (Kueue's validation rule)."""

    when_can_borrow: WhenCanBorrow = WhenCanBorrow.MAY_STOP_SEARCH
    when_can_preempt: WhenCanPreempt = WhenCanPreempt.TRY_NEXT_FLAVOR
    preference: FlavorPreference | None = None


DEFAULT_FUNGIBILITY = FlavorFungibility()


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


class WithinTenant(StrEnum):
    """Which of its own reservations a tenant's grant may preempt (Kueue's
    withinClusterQueue): none, those of a lower priority, or also those of its own priority
    created after the preemptor."""

    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    LOWER_OR_NEWER_EQUAL_PRIORITY = "LowerOrNewerEqualPriority"


class ReclaimWithinCohort(StrEnum):
    """Which reservations of the cohort's borrowing tenants a grant within nominal quota may
    preempt (Kueue's reclaimWithinCohort): none, those of a lower priority, or any."""

    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    ANY = "Any"


class BorrowWithinCohort(StrEnum):
    """Whether a grant that borrows may preempt the cohort's borrowing tenants' reservations
    of a lower priority (Kueue's borrowWithinCohort.policy)."""

    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"


@dataclass(frozen=True)
class PreemptionPolicy:
    """A tenant's preemption policy, Kueue's ClusterQueue `preemption` per tenant. The
    defaults are gpualloc's rules before the policy was configurable (own lower priority,
    reclaim of any priority, no preemption while borrowing); Kueue's own defaults are Never
    for all three (docs/tenancy.md). `max_priority_threshold`: while borrowing, only victims
    of at most this priority (None: any lower than the preemptor's)."""

    within_tenant: WithinTenant = WithinTenant.LOWER_PRIORITY
    reclaim_within_cohort: ReclaimWithinCohort = ReclaimWithinCohort.ANY
    borrow_within_cohort: BorrowWithinCohort = BorrowWithinCohort.NEVER
    max_priority_threshold: int | None = None


DEFAULT_PREEMPTION = PreemptionPolicy()


@dataclass(frozen=True)
class TenantQuota:
    tenant: str
    cohort: str  # "" when the tenant is a cohort of its own
    limits: Mapping[str, QuotaLimits]
    preemption: PreemptionPolicy = DEFAULT_PREEMPTION
    fungibility: FlavorFungibility = DEFAULT_FUNGIBILITY
    # gpualloc's: taints of resource flavors every grant of the tenant tolerates
    tolerations: tuple[DeviceToleration, ...] = ()
    weight: Fraction = Fraction(1)  # fairSharing.weight

    def of(self, resource: str) -> QuotaLimits:
        return self.limits.get(resource, _NO_QUOTA)


@dataclass(frozen=True)
class CohortQuota:
    """A cohort of the tree (Kueue's Cohort): its parent ("" for a root), quotas of its own
    per resource (lent to every tenant below it; borrowing and lending limits towards its
    parent) and its fair-sharing weight. A cohort that tenants name but the policy does not
    declare is a root with no quotas of its own."""

    name: str
    parent: str = ""
    limits: Mapping[str, QuotaLimits] = field(default_factory=dict)
    weight: Fraction = Fraction(1)


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


@dataclass(frozen=True)
class QuotaModel:
    resources: tuple[QuotaResource, ...]
    tenants: Mapping[str, TenantQuota]  # only tenants with quotas
    priority_classes: Mapping[str, PriorityClass] = field(default_factory=dict)
    default_priority: PriorityClass = DEFAULT_PRIORITY
    cohorts: Mapping[str, CohortQuota] = field(default_factory=dict)  # the declared ones
    fair_sharing: FairSharing = FairSharing()
    admission_fair_sharing: AdmissionFairSharing | None = None
    # spec.quota.uncountedDevices: Refuse: a tenant with quotas is never granted a device no
    # quota resource counts (False, Allow: such devices are not limited)
    refuse_uncounted: bool = False
    _tree: CohortTree = field(init=False, repr=False, compare=False)
    _members: Mapping[NodeKey, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    _base_of: Mapping[str, str] = field(init=False, repr=False, compare=False)
    _charge_orders: Mapping[tuple[str, str], tuple[QuotaResource, ...]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        nodes = [
            TreeNode(tenant_node(q.tenant), q.cohort, q.limits, q.weight)
            for q in self.tenants.values()
        ]
        nodes += [
            TreeNode(cohort_node(c.name), c.parent, c.limits, c.weight)
            for c in self.cohorts.values()
        ]
        tree = CohortTree(nodes)  # CohortCycle for a cycle (the parser refuses one first)
        members: dict[NodeKey, list[str]] = {}
        for quota in self.tenants.values():
            members.setdefault(tree.root(tenant_node(quota.tenant)), []).append(quota.tenant)
        object.__setattr__(self, "_tree", tree)
        object.__setattr__(self, "_members", {k: tuple(sorted(v)) for k, v in members.items()})
        object.__setattr__(self, "_base_of", {r.name: r.base or r.name for r in self.resources})
        orders: dict[tuple[str, str], tuple[QuotaResource, ...]] = {}
        for base in {r.base for r in self.resources if r.base}:
            every = self.flavors_of(base)
            for tenant in self.tenants:
                own = self.flavor_order(tenant, base)
                orders[tenant, base] = (*own, *(r for r in every if r not in own))
        object.__setattr__(self, "_charge_orders", orders)

    @property
    def enabled(self) -> bool:
        return bool(self.resources) and bool(self.tenants)

    @property
    def tree(self) -> CohortTree:
        return self._tree

    def quota_of(self, tenant: str) -> TenantQuota | None:
        """The tenant's quota; None: the tenant is not limited."""
        return self.tenants.get(tenant)

    def members(self, quota: TenantQuota) -> tuple[str, ...]:
        """The tenants sharing `quota`'s tree (itself included): those its usage is ruled
        with, kept in one ledger."""
        root = self._tree.root(tenant_node(quota.tenant))
        return self._members.get(root, (quota.tenant,))

    def ledger_key(self, quota: TenantQuota) -> str:
        """The name under which the store keeps the usage of `quota`'s tree: `cohort:<root>`,
        or `tenant:<name>` for a tenant in no cohort."""
        return self.ledger_of(tenant_node(quota.tenant))

    def ledger_of(self, key: NodeKey) -> str:
        """The ledger of the tree a tenant or cohort is in."""
        kind, name = self._tree.root(key)
        return f"cohort:{name}" if kind == "cohort" else f"tenant:{name}"

    def ledgers(self) -> tuple[str, ...]:
        """Every ledger the policy's tenants use, by name."""
        return tuple(sorted({self.ledger_key(q) for q in self.tenants.values()}))

    def path(self, tenant: str) -> tuple[str, ...]:
        """The cohorts from the root of the tenant's tree down to its own (() when it has
        none or is not limited)."""
        if tenant not in self.tenants:
            return ()
        return self._tree.path(tenant_node(tenant))

    def priority(self, name: str) -> PriorityClass:
        """The class a reservation names; "" or a class the policy no longer has: the
        default (a reload must not make old reservations unpreemptible or unranked)."""
        return (
            self.priority_classes.get(name, self.default_priority)
            if name
            else (self.default_priority)
        )

    def flavors_of(self, base: str) -> tuple[QuotaResource, ...]:
        """The flavors of resource `base` in the order the resource lists them ((none) left
        out)."""
        return tuple(r for r in self.resources if r.base == base and r.spec is not None)

    def charge_order(self, tenant: str, base: str) -> tuple[QuotaResource, ...]:
        """The flavors of resource `base` in the order a device `tenant` holds is charged: to
        the first of them that selects it, else to (none). The tenant's own flavors first, in
        the order its quotas list them (Kueue's flavors are per ClusterQueue: a label-less
        flavor of another tenant must not take the devices of this tenant's flavors), then the
        resource's others in its order (a device only they select is then charged to one the
        tenant does not list: refused, naming it). A tenant without quotas: the resource's
        order."""
        found = self._charge_orders.get((tenant, base))
        return found if found is not None else self.flavors_of(base)

    def flavor_order(self, tenant: str, base: str) -> tuple[QuotaResource, ...]:
        """The flavors of resource `base` the tenant lists, in the order it lists them (the
        order a grant tries them in); () for a tenant without quotas or listing none."""
        quota = self.quota_of(tenant)
        if quota is None:
            return ()
        flavored = {r.name: r for r in self.resources if r.base == base and r.flavor}
        return tuple(flavored[name] for name in quota.limits if name in flavored)

    def admit(
        self,
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
        quota = self.quota_of(tenant)
        if quota is None:
            return ()
        refusals = []
        uncounted = amounts.get(UNCOUNTED, 0)
        if self.refuse_uncounted and uncounted > 0:
            refusals.append(
                QuotaRefusal(
                    tenant, UNCOUNTED, uncounted, 0, 0, 0, 0, cohort=quota.cohort, listed=False
                )
            )
        for resource in self.resources:
            amount = amounts.get(resource.name, 0)
            if amount <= 0:
                continue
            left = self._left(quota, resource.name, usage)
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

    # --- the tree's figures -----------------------------------------------------------------

    def levels(self, key: NodeKey, usage: Mapping[str, Usage]) -> dict[str, Levels]:
        """Every resource's Levels of `key`'s tree (usage: tenant -> its usage)."""
        return {r.name: self.levels_of(key, r.name, usage) for r in self.resources}

    def levels_of(self, key: NodeKey, resource: str, usage: Mapping[str, Usage]) -> Levels:
        """One resource's Levels of `key`'s tree."""
        of_resource = {t: u.get(resource, 0) for t, u in usage.items()}
        return self._tree.levels(resource, of_resource, key)

    def base_of(self) -> Mapping[str, str]:
        """quota resource -> the resource it is a flavor of (itself when unflavored)."""
        return self._base_of

    def share(
        self,
        key: NodeKey,
        usage: Mapping[str, Usage],
        extra: Usage | None = None,
        levels: Mapping[str, Levels] | None = None,
    ) -> Share:
        """The dominant resource share of a tenant or cohort now (with `extra` more used by
        it: a grant's amounts)."""
        if key not in self._tree:
            return Share()
        found = levels if levels is not None else self.levels(key, usage)
        return dominant_share(self._tree, key, found, self.base_of(), extra)

    def status(
        self,
        usage: Mapping[str, Usage],
        tenants: Iterable[str] = (),
        *,
        consumed: Mapping[str, ConsumedUsage] | None = None,
    ) -> list[TenantStatus]:
        """Per tenant (those given, else every tenant with quotas) and quota resource; with
        `consumed` (the tenants' decayed usage as last sampled) and usage decay configured,
        each row's decayed usage and the tenant's weighted sum of it."""
        rows: list[TenantStatus] = []
        decay = self.admission_fair_sharing if consumed is not None else None
        by_tree: dict[NodeKey, dict[str, Levels]] = {}
        lent_by_tree: dict[NodeKey, dict[str, dict[NodeKey, int]]] = {}
        for tenant in sorted(tenants) if tenants else sorted(self.tenants):
            quota = self.quota_of(tenant)
            if quota is None:
                continue
            key = tenant_node(tenant)
            root = self._tree.root(key)
            if root not in by_tree:
                by_tree[root] = self.levels(root, usage)
                lent_by_tree[root] = {name: lv.lent() for name, lv in by_tree[root].items()}
            levels = by_tree[root]
            share = dominant_share(self._tree, key, levels, self.base_of())
            path = self._tree.path(key)
            decayed: Mapping[str, float] | None = None
            score: float | None = None
            sampled: float | None = None
            if decay is not None and consumed is not None:
                record = consumed.get(tenant)
                decayed = record.amounts if record is not None else {}
                sampled = record.at if record is not None else None
                score = decayed_score(decayed, decay.resource_weights, self._base_of, quota.weight)
            for resource in self.resources:
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
                        lent=lent_by_tree[root][name].get(key, 0),
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

    def cohort_names(self) -> tuple[str, ...]:
        """Every cohort of the tree (declared, or named by a tenant or a child), by name."""
        return tuple(sorted(name for kind, name in self._tree.nodes() if kind == "cohort"))

    def cohort_status(
        self, usage: Mapping[str, Usage], cohorts: Iterable[str] = ()
    ) -> list[CohortStatus]:
        """Per cohort (those given, else every cohort) and quota resource."""
        rows: list[CohortStatus] = []
        by_tree: dict[NodeKey, dict[str, Levels]] = {}
        lent_by_tree: dict[NodeKey, dict[str, dict[NodeKey, int]]] = {}
        for name in sorted(set(cohorts)) if cohorts else self.cohort_names():
            key = cohort_node(name)
            if key not in self._tree:
                continue
            root = self._tree.root(key)
            if root not in by_tree:
                by_tree[root] = self.levels(root, usage)
                lent_by_tree[root] = {r: lv.lent() for r, lv in by_tree[root].items()}
            levels = by_tree[root]
            share = dominant_share(self._tree, key, levels, self.base_of())
            node = self._tree.node(key)
            for resource in self.resources:
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
                        lent=lent_by_tree[root][resource.name].get(key, 0),
                        left=max(0, level.available(key)),
                        borrowing_limit=limits.borrowing_limit if limits is not None else None,
                        lending_limit=limits.lending_limit if limits is not None else None,
                        binary=bool(resource.counter),
                        path=self._tree.path(key),
                        weight=node.weight,
                        share=share,
                    )
                )
        return rows

    # --- the rule ---------------------------------------------------------------------------

    def _left(self, quota: TenantQuota, resource: str, usage: Mapping[str, Usage]) -> int:
        """The largest amount `admit` grants the tenant now: what it may still take at every
        level of its tree (cohorts.py's `available`).

        In a cohort of tenants only, with u its usage, g its guaranteed part, P the cohort's
        pool and E the other tenants' draws on it (their usage above their guaranteed parts):
        a <= min(nominal + borrowingLimit - u, g - u + max(0, P - E))."""
        if resource not in quota.limits:
            return 0  # never granted (Kueue: a resource the ClusterQueue does not cover)
        key = tenant_node(quota.tenant)
        return max(0, self.levels_of(key, resource, usage).available(key))


NO_QUOTAS = QuotaModel((), {})


def add_usage(total: dict[str, dict[str, int]], tenant: str, amounts: Usage) -> None:
    """Add one grant's amounts to a tenant -> usage table."""
    mine = total.setdefault(tenant, {})
    for resource, amount in amounts.items():
        mine[resource] = mine.get(resource, 0) + amount


def counted_only(amounts: Usage) -> dict[str, int]:
    """`amounts` without the devices no quota resource counts (what a ledger entry keeps)."""
    return {name: amount for name, amount in amounts.items() if name != UNCOUNTED}


def quantity_text(milli: int, binary: bool = False) -> str:
    """Milli-units as a Kubernetes quantity (`8`, `1500m`, `80Gi` for binary amounts)."""
    fmt = QuantityFormat.BINARY_SI if binary else QuantityFormat.DECIMAL_SI
    return str(Quantity.of(Fraction(milli, 1000), fmt))
