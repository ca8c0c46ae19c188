"""Tenant quotas as the access policy declares them: what each tenant may hold, cohorts that
lend unused quota, priorities, preemption and fair-sharing settings. The model, plain values.

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
  the tree and lending down (the tree's shape: tree.py). One tree shares one quota ledger,
  named after its root (`ledger_key`).

This module is the model's half: the values the policy file declares (the access policy's
parser, services/common/security/policy.py, builds them; the inventory, the client and the
bench read them) and `QuotaModel`'s lookups (a tenant's quota, its tree, its ledger, its
flavors in charge order, a priority class). The rule's half, what decides over these values
(`admit`, each tenant's and cohort's standing, dominant shares, usage decay), lives in the
allocator's core, next to the preemption planner: services/allocator/core/quota/rule.py,
levels.py and fair_sharing.py.

Pure: values in, values out. Amounts are integer milli-units (a device counts 1000).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

from services.common.dra.model import DeviceTaint, DeviceToleration
from services.common.dra.quantity import Quantity, QuantityFormat
from services.common.quota.tree import (
    CohortTree,
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
    "DEFAULT_STRATEGIES",
    "VALID_STRATEGIES",
    "NO_QUOTAS",
    "AdmissionFairSharing",
    "BorrowWithinCohort",
    "CohortQuota",
    "FairSharing",
    "FlavorFungibility",
    "FlavorPreference",
    "PreemptionPolicy",
    "PreemptionStrategy",
    "ResourceFlavor",
    "WhenCanBorrow",
    "WhenCanPreempt",
    "PriorityClass",
    "QuotaLimits",
    "QuotaModel",
    "QuotaResource",
    "ReclaimWithinCohort",
    "TenantQuota",
    "UNCOUNTED",
    "Usage",
    "WithinTenant",
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


class PreemptionStrategy(StrEnum):
    """Kueue's fair-sharing preemption strategies (rules S2-a and S2-b of its KEP 1714)."""

    LESS_THAN_OR_EQUAL_TO_FINAL_SHARE = "LessThanOrEqualToFinalShare"
    LESS_THAN_INITIAL_SHARE = "LessThanInitialShare"


DEFAULT_STRATEGIES = (
    PreemptionStrategy.LESS_THAN_OR_EQUAL_TO_FINAL_SHARE,
    PreemptionStrategy.LESS_THAN_INITIAL_SHARE,
)
# the lists Kueue's configuration accepts
VALID_STRATEGIES = (
    (PreemptionStrategy.LESS_THAN_OR_EQUAL_TO_FINAL_SHARE,),
    (PreemptionStrategy.LESS_THAN_INITIAL_SHARE,),
    DEFAULT_STRATEGIES,
)


@dataclass(frozen=True)
class FairSharing:
    """`spec.quota.fairSharing`: whether preemption goes by fair sharing (Kueue's
    Configuration `fairSharing`), and with which strategies, tried in order."""

    enabled: bool = False
    strategies: tuple[PreemptionStrategy, ...] = DEFAULT_STRATEGIES


@dataclass(frozen=True)
class AdmissionFairSharing:
    """`spec.quota.admissionFairSharing` (Kueue's Configuration field of that name): the
    half-life of usage, how often it is sampled, and each resource's weight in a tenant's
    decayed usage (a resource not listed weighs 1; flavored resources by their base name)."""

    half_life_seconds: float
    sampling_seconds: float = 300.0
    resource_weights: Mapping[str, Fraction] = field(default_factory=dict)


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
class QuotaModel:
    """The access policy's quota section as plain data, and the lookups every reader needs:
    a tenant's quota, the members and ledger of its tree, its cohorts, its flavors in the
    order they are tried and charged, a priority class. What decides over it (`admit`,
    `tenant_status`, `share_of`, ...) takes it as a value: services/allocator/core/quota/."""

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

    def base_of(self) -> Mapping[str, str]:
        """quota resource -> the resource it is a flavor of (itself when unflavored)."""
        return self._base_of

    def cohort_names(self) -> tuple[str, ...]:
        """Every cohort of the tree (declared, or named by a tenant or a child), by name."""
        return tuple(sorted(name for kind, name in self._tree.nodes() if kind == "cohort"))


NO_QUOTAS = QuotaModel((), {})


def quantity_text(milli: int, binary: bool = False) -> str:
    """Milli-units as a Kubernetes quantity (`8`, `1500m`, `80Gi` for binary amounts)."""
    fmt = QuantityFormat.BINARY_SI if binary else QuantityFormat.DECIMAL_SI
    return str(Quantity.of(Fraction(milli, 1000), fmt))
