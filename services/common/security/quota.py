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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

from services.common.dra.model import DeviceTaint, DeviceToleration
from services.common.dra.quantity import Quantity, QuantityFormat

__all__ = [
    "DEFAULT_FUNGIBILITY",
    "DEFAULT_PREEMPTION",
    "NO_FLAVOR",
    "DEFAULT_PRIORITY",
    "NO_QUOTAS",
    "BorrowWithinCohort",
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
    "Usage",
    "WithinTenant",
    "add_usage",
    "cohort_key",
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
    named `<resource>/<flavor>` (`base` and `flavor` its parts, `spec` the flavor): it counts
    the devices the flavor selects and none listed before it on the resource does (a device is
    charged to the first flavor of its resource that selects it). One more,
    `<resource>/(none)` (`spec` None), counts the devices of none of its flavors; no tenant can
    list it, so a limited tenant is never granted them (Kueue admits a workload only to a
    flavor of its ClusterQueue)."""

    name: str
    device_classes: tuple[str, ...]
    counter: str = ""
    gpu_share: bool = False
    base: str = ""  # the resource a flavor's quota belongs to ("" for an unflavored one)
    flavor: str = ""
    spec: ResourceFlavor | None = None  # the flavor (None for an unflavored one and (none))


NO_FLAVOR = "(none)"  # the flavor name of the devices in none of a resource's flavors


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
    listed: bool = True  # False: the tenant's quotas do not list the resource (never granted)

    def __str__(self) -> str:
        where = f" in cohort {self.cohort}" if self.cohort else ""
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

    def flavors_of(self, base: str) -> tuple[QuotaResource, ...]:
        """The flavors of resource `base` in the order the resource lists them: a device is
        charged to the first of them that selects it ((none) left out)."""
        return tuple(r for r in self.resources if r.base == base and r.spec is not None)

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
        cohort's tenants at least): () when it may, else one refusal per resource that does
        not fit. `within_nominal`: also refused where the grant would borrow (the preemption
        pass that must leave the preemptor within nominal, core/preemption.py)."""
        quota = self.quota_of(tenant)
        if quota is None:
            return ()
        refusals = []
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
        if resource not in quota.limits:
            return 0  # never granted (Kueue: a resource the ClusterQueue does not cover)
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
