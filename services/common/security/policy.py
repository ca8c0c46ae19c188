"""The AccessPolicy file: tenants, bindings of subjects to roles, JWT issuers; and `authorize`.

    apiVersion: gpualloc.dev/v1alpha1
    kind: AccessPolicy
    metadata: {name: fleet}
    spec:
      authentication:
        jwt: [{issuer: https://kubernetes.default.svc, audiences: [gpualloc], jwksFile: ...}]
      tenants:
      - {name: hpc, cohort: research, quotas: [{resource: gpus, nominal: 8, borrowingLimit: 4}]}
      - {name: ml, allowAdminAccess: true, maxReservations: 500, cohort: research,
         quotas: [{resource: gpus, nominal: 8}]}
      quota:
        resources: [{name: gpus, deviceClassNames: [gpu.nvidia.com]}]
      bindings:
      - name: slurm-bridge
        subjects: [{kind: SPIFFE, name: "spiffe://fleet/ns/slurm/sa/bridge"}]
        tenant: hpc
        roles: [scheduler]
        actFor: ["slurm/job/*"]
      - name: kueue-sidecar                  # acts for each Workload's ClusterQueue
        subjects: [{kind: SPIFFE, name: "spiffe://fleet/ns/kueue/sa/gpualloc-kueue"}]
        roles: [scheduler]
        actFor: ["kueue/*"]
        actForTenants: [hpc, "team-*"]       # the tenants a call may name (x-gpualloc-tenant)

Kubernetes RBAC is the model: subjects bound to roles, deny by default, every matching binding
adds its roles (an identity matched by bindings of two different tenants is refused: a call
acts in one tenant). Subject kinds: SPIFFE (a client certificate's URI SAN), DNS (its DNS SANs),
CommonName (its subject CN), JWT (a verified token's `sub`, for one `issuer`). A subject name may
hold one `*`; for an `agent` binding the `*` part is the node the identity may report, else the
node a Kubernetes service-account token is bound to (its `kubernetes.io.node.name` claim), or
the binding lists `nodes`. An agent binding's `reportedGpus` bounds what its reports may
describe: `published` (only the GPUs the node's ResourceSlices publish: it can report their
health, not add GPUs) or a count (at most that many GPUs per report).

A binding's `actForTenants` lets its identities act for other tenants, as Kubernetes
impersonation does (deny by default): a call names the tenant (the `x-gpualloc-tenant`
metadata, read at the edge) and is then that tenant's in every respect — quota, owners,
reads, watches, bounds — its audit events naming the identity and the tenant acted for
(`act_for_tenant`). The names are tenants, or patterns with one `*`.

Quotas (`spec.quota.resources`, a tenant's `cohort` and `quotas`) are modelled and ruled in
quota.py; docs/tenancy.md explains them. A tenant's `maxReservations` bounds how many live
reservations it may hold, whatever they hold (adminAccess ones too, which no quota counts).

Parsing is strict, as `kubectl apply --validate=strict`: unknown fields, unknown roles or
tenants, duplicate names are errors with the field path. Pure: values in, values out; the file
is read (and re-read when it changes) at the edge.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from fractions import Fraction
from typing import Any, TypeVar

from services.common.config import parse_go_duration
from services.common.dra.model import (
    DeviceTaint,
    DeviceToleration,
    TaintEffect,
    TolerationOperator,
)
from services.common.dra.names import qualified_name_errors
from services.common.dra.quantity import Quantity
from services.common.errors import FieldViolation, InvalidArgument, PermissionDenied
from services.common.quota.model import (
    DEFAULT_PRIORITY,
    NO_FLAVOR,
    UNCOUNTED,
    VALID_STRATEGIES,
    AdmissionFairSharing,
    BorrowWithinCohort,
    CohortQuota,
    FairSharing,
    FlavorFungibility,
    FlavorPreference,
    PreemptionPolicy,
    PreemptionStrategy,
    PriorityClass,
    QuotaLimits,
    QuotaModel,
    QuotaResource,
    ReclaimWithinCohort,
    ResourceFlavor,
    TenantQuota,
    WhenCanBorrow,
    WhenCanPreempt,
    WithinTenant,
)
from services.common.security.kueue_quota import KueueTranslation, apply_kueue
from services.common.security.principal import (
    ROLE_PERMISSIONS,
    Identity,
    Permission,
    Principal,
    Role,
    glob_capture,
)

__all__ = [
    "API_VERSION",
    "KIND",
    "Access",
    "AccessPolicy",
    "Binding",
    "JwtIssuer",
    "Subject",
    "SubjectKind",
    "Tenant",
    "authorize",
    "parse_policy",
]

API_VERSION = "gpualloc.dev/v1alpha1"
KIND = "AccessPolicy"
_NAME_LIMIT = 253  # a Kubernetes object name's limit; tenants are prefixes of owners


class SubjectKind(StrEnum):
    SPIFFE = "SPIFFE"
    DNS = "DNS"
    COMMON_NAME = "CommonName"
    JWT = "JWT"


_NAMESPACES = {
    SubjectKind.SPIFFE: "spiffe:",
    SubjectKind.DNS: "dns:",
    SubjectKind.COMMON_NAME: "cn:",
}


@dataclass(frozen=True)
class Subject:
    kind: SubjectKind
    name: str  # may hold one `*`
    issuer: str = ""  # JWT only

    @property
    def pattern(self) -> str:
        """The pattern over Identity.names (`spiffe:…`, `dns:…`, `cn:…`, `jwt:<iss>#<sub>`)."""
        if self.kind is SubjectKind.JWT:
            return f"jwt:{self.issuer}#{self.name}"
        return _NAMESPACES[self.kind] + self.name

    def capture(self, identity: Identity) -> str | None:
        """What this subject's `*` matched in one of the identity's names, or None."""
        for name in identity.names:
            found = glob_capture(self.pattern, name)
            if found is not None:
                return found
        return None


@dataclass(frozen=True)
class Tenant:
    name: str
    allow_admin_access: bool = False
    max_reservations: int | None = None  # live reservations it may hold (None: no bound)


PUBLISHED_GPUS = "published"  # an agent binding's reportedGpus: only what slices publish


@dataclass(frozen=True)
class Binding:
    name: str
    subjects: tuple[Subject, ...]
    roles: tuple[Role, ...]
    tenant: str | None = None
    act_for: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    act_for_tenants: tuple[str, ...] = ()  # tenants (or one-`*` patterns) a call may act for
    # An agent binding's bound on the GPUs its reports describe: PUBLISHED_GPUS (only GPUs
    # the node's ResourceSlices publish), a count (at most that many per report), None: none.
    reported_gpus: str | int | None = None


@dataclass(frozen=True)
class JwtIssuer:
    issuer: str
    audiences: tuple[str, ...]
    jwks_file: str


@dataclass(frozen=True)
class Access:
    """What one call asks to do: a permission, and the facts of the request it depends on."""

    method: str
    permission: Permission
    node: str = ""  # ReportNode: the node reported
    admin_access: bool = False  # any request or result asks for adminAccess


@dataclass(frozen=True)
class AccessPolicy:
    name: str
    tenants: Mapping[str, Tenant]
    bindings: tuple[Binding, ...]
    jwt_issuers: tuple[JwtIssuer, ...] = ()
    quotas: QuotaModel = QuotaModel((), {})
    kueue: KueueTranslation | None = None  # the quota section was given as Kueue's objects

    def resolve(self, identity: Identity) -> Principal | None:
        """The principal of a proven identity; None when no binding names it (the edge then
        answers PERMISSION_DENIED: authenticated, but nobody granted it anything)."""
        matched: list[tuple[Binding, str]] = []
        for binding in self.bindings:
            for subject in binding.subjects:
                captured = subject.capture(identity)
                if captured is not None:
                    matched.append((binding, captured))
                    break
        if not matched:
            return None
        tenants = sorted({b.tenant for b, _ in matched if b.tenant is not None})
        if len(tenants) > 1:
            raise PermissionDenied(
                f"identity {identity.display} is bound to several tenants "
                f"({', '.join(tenants)}) by bindings {', '.join(b.name for b, _ in matched)}; "
                "a call acts in one tenant: fix the policy"
            )
        tenant = tenants[0] if tenants else None
        roles = tuple(sorted({role for b, _ in matched for role in b.roles}))
        nodes: set[str] = set()
        for binding, captured in matched:
            if Role.AGENT in binding.roles:
                own = (captured,) if captured else (identity.node,) if identity.node else ()
                nodes.update(binding.nodes or own)
        published_only, most = _report_bound(
            [b for b, _ in matched if Role.AGENT in b.roles],
            any(Permission.INVENTORY_REPORT_ANY in ROLE_PERMISSIONS[r] for r in roles),
        )
        return Principal(
            identity,
            tenant=tenant,
            roles=roles,
            permissions=frozenset(p for role in roles for p in ROLE_PERMISSIONS[role]),
            act_for=tuple(sorted({p for b, _ in matched for p in b.act_for})),
            nodes=tuple(sorted(nodes)),
            allow_admin_access=tenant is not None and self.tenants[tenant].allow_admin_access,
            max_reservations=self.tenants[tenant].max_reservations if tenant else None,
            published_gpus_only=published_only,
            max_reported_gpus=most,
            tenants_acted_for=tuple(sorted({p for b, _ in matched for p in b.act_for_tenants})),
        )

    def act_for_tenant(self, principal: Principal, tenant: str) -> Principal:
        """`principal` acting for `tenant` (a call's `x-gpualloc-tenant`): the same identity,
        roles and owner patterns, in that tenant, with its bounds. Its own tenant is itself.
        PermissionDenied when no binding of the identity lets it act for `tenant`, or when
        `tenant` is not one of the policy's."""
        if tenant == principal.tenant and not principal.acts_for_tenant:
            return principal
        if not any(glob_capture(p, tenant) is not None for p in principal.tenants_acted_for):
            allowed = ", ".join(principal.tenants_acted_for) or "none"
            own = f"its own is {principal.tenant}" if principal.tenant else "it has none"
            raise PermissionDenied(
                f"identity {principal.name} may not act for tenant {_shown(tenant)} (the "
                f"policy's actForTenants let it act for: {allowed}; {own})"
            )
        if tenant not in self.tenants:
            raise PermissionDenied(
                f"identity {principal.name} may not act for tenant {_shown(tenant)}: the "
                "access policy has no such tenant"
            )
        return replace(
            principal,
            tenant=tenant,
            allow_admin_access=self.tenants[tenant].allow_admin_access,
            max_reservations=self.tenants[tenant].max_reservations,
            acts_for_tenant=True,
            identity_tenant=principal.tenant,
        )


def _shown(value: str, limit: int = 80) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "…")


def _report_bound(agents: Sequence[Binding], reports_any: bool) -> tuple[bool, int | None]:
    """(only published GPUs, at most this many GPUs per report) of an identity's matching
    agent bindings: the most any of them allows (bindings add up, as roles do); none for an
    identity that may report any node (an inventory admin)."""
    bounds = [b.reported_gpus for b in agents]
    if reports_any or not bounds or None in bounds:
        return False, None
    counts = [b for b in bounds if isinstance(b, int)]
    if counts:
        return False, max(counts)
    return True, None


def authorize(principal: Principal, access: Access) -> None:
    """Allow the call or raise PermissionDenied naming what is missing. The one check."""
    if access.permission is Permission.INVENTORY_REPORT_OWN:
        if not principal.may_report(access.node):
            if principal.can(Permission.INVENTORY_REPORT_OWN):
                mine = ", ".join(principal.nodes) or "none"
                raise PermissionDenied(
                    f"{access.method}: identity {principal.name} may report only its own node "
                    f"({mine}), not {access.node!r}"
                )
            _deny(principal, access, Permission.INVENTORY_REPORT_OWN)
        return
    if not principal.can(access.permission):
        _deny(principal, access, access.permission)
    if access.admin_access and not principal.allow_admin_access:
        where = f"tenant {principal.tenant}" if principal.tenant else "callers without a tenant"
        raise PermissionDenied(
            f"{access.method}: adminAccess device requests are not allowed for {where} "
            "(the policy's tenant allowAdminAccess)"
        )


def _deny(principal: Principal, access: Access, permission: Permission) -> None:
    roles = ", ".join(principal.roles) or "none"
    raise PermissionDenied(
        f"{access.method}: identity {principal.name} lacks permission {permission} "
        f"(its roles: {roles})"
    )


# --- parsing --------------------------------------------------------------------------------


def parse_policy(
    document: object,
    source: str = "policy",
    kueue_files: Mapping[str, Sequence[tuple[str, object]]] | None = None,
) -> AccessPolicy:
    """An AccessPolicy from its decoded YAML; InvalidArgument listing every bad field.
    `kueue_files`: per `spec.quota.kueue.files` entry, its decoded documents with their
    origins (the edge reads them: kueue_quota/)."""
    errors: list[FieldViolation] = []
    reader = _Reader(errors)
    root = reader.mapping(document, "", {"apiVersion", "kind", "metadata", "spec"})
    if root.get("apiVersion") != API_VERSION:
        errors.append(
            FieldViolation("apiVersion", f"must be {API_VERSION}, got {root.get('apiVersion')!r}")
        )
    if root.get("kind") != KIND:
        errors.append(FieldViolation("kind", f"must be {KIND}, got {root.get('kind')!r}"))
    metadata = reader.mapping(root.get("metadata", {}), "metadata", {"name", "labels"})
    name = reader.string(metadata.get("name", ""), "metadata.name", required=False)
    spec = reader.mapping(
        root.get("spec"), "spec", {"authentication", "tenants", "bindings", "quota"}
    )
    quota = reader.mapping(
        spec.get("quota", {}),
        "spec.quota",
        {
            "resources",
            "priorityClasses",
            "resourceFlavors",
            "cohorts",
            "fairSharing",
            "admissionFairSharing",
            "uncountedDevices",
            "kueue",
        },
    )
    quota, tenant_items, kueue = apply_kueue(
        quota, spec.get("tenants", []), kueue_files or {}, errors
    )
    flavors = _resource_flavors(reader, quota.get("resourceFlavors", []))
    resources = _quota_resources(reader, quota.get("resources", []), flavors)
    priorities, default_priority = _priority_classes(reader, quota.get("priorityClasses", []))
    tenants, quotas = _tenants(reader, tenant_items, resources)
    cohorts = _cohorts(reader, quota.get("cohorts", []), resources, tenants, quotas)
    fair_sharing = _fair_sharing(reader, quota.get("fairSharing", {}))
    usage_decay = _admission_fair_sharing(reader, quota.get("admissionFairSharing"), resources)
    refuse_uncounted = _uncounted_devices(reader, quota.get("uncountedDevices", "Allow"))
    bindings = _bindings(reader, spec.get("bindings", []), tenants)
    issuers = _issuers(reader, spec.get("authentication", {}))
    known_issuers = {issuer.issuer for issuer in issuers}
    for i, binding in enumerate(bindings):
        for j, subject in enumerate(binding.subjects):
            if subject.kind is SubjectKind.JWT and subject.issuer not in known_issuers:
                errors.append(
                    FieldViolation(
                        f"spec.bindings[{i}].subjects[{j}].issuer",
                        f"{subject.issuer!r} is not in spec.authentication.jwt",
                    )
                )
    if errors:
        first = errors[0]
        raise InvalidArgument(f"{source}: {first}" + _more(errors), errors)
    return AccessPolicy(
        name,
        tenants,
        tuple(bindings),
        tuple(issuers),
        QuotaModel(
            tuple(resources),
            quotas,
            priorities,
            default_priority,
            cohorts,
            fair_sharing,
            usage_decay,
            refuse_uncounted,
        ),
        kueue,
    )


_UNCOUNTED_DEVICES = ("Allow", "Refuse")


def _uncounted_devices(reader: _Reader, value: object) -> bool:
    """`spec.quota.uncountedDevices`: whether a tenant with quotas is refused the devices no
    quota resource counts (Refuse; Allow, the default: they are not limited)."""
    if value not in _UNCOUNTED_DEVICES:
        reader.fail(
            "spec.quota.uncountedDevices",
            f"must be one of {', '.join(_UNCOUNTED_DEVICES)}, got {value!r}",
        )
        return False
    return value == "Refuse"


def _more(errors: Sequence[FieldViolation]) -> str:
    return f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""


def _tenants(
    reader: _Reader, value: object, resources: Sequence[QuotaResource]
) -> tuple[dict[str, Tenant], dict[str, TenantQuota]]:
    tenants: dict[str, Tenant] = {}
    quotas: dict[str, TenantQuota] = {}
    allowed = {
        "name",
        "allowAdminAccess",
        "maxReservations",
        "cohort",
        "quotas",
        "preemption",
        "flavorFungibility",
        "tolerations",
        "fairSharing",
    }
    for i, item in enumerate(reader.sequence(value, "spec.tenants")):
        path = f"spec.tenants[{i}]"
        fields = reader.mapping(item, path, allowed)
        name = reader.string(fields.get("name"), f"{path}.name")
        if "/" in name:
            reader.fail(f"{path}.name", "must not contain '/' (owners are <tenant>/<name>)")
        if name in tenants:
            reader.fail(f"{path}.name", f"duplicate tenant {name!r}")
        admin = reader.boolean(fields.get("allowAdminAccess", False), f"{path}.allowAdminAccess")
        most = fields.get("maxReservations")
        if most is not None and (isinstance(most, bool) or not isinstance(most, int) or most < 0):
            reader.fail(f"{path}.maxReservations", f"must be an integer >= 0, got {most!r}")
            most = None
        tenants[name] = Tenant(name, admin, most)
        cohort = reader.string(fields.get("cohort", ""), f"{path}.cohort", required=False)
        if any(c in cohort for c in "{}"):
            reader.fail(f"{path}.cohort", "must not contain '{' or '}' (a store hash tag)")
        if "quotas" in fields:
            limits = _quota_limits(reader, fields["quotas"], f"{path}.quotas", resources)
            preemption = _preemption(reader, fields.get("preemption", {}), f"{path}.preemption")
            fungibility = _fungibility(
                reader, fields.get("flavorFungibility", {}), f"{path}.flavorFungibility"
            )
            tolerations = _tolerations(reader, fields.get("tolerations", []), f"{path}.tolerations")
            weight = _fair_weight(reader, fields.get("fairSharing", {}), f"{path}.fairSharing")
            quotas[name] = TenantQuota(
                name, cohort, limits, preemption, fungibility, tolerations, weight
            )
        elif cohort:
            reader.fail(f"{path}.cohort", "a tenant without quotas is in no cohort")
        elif "preemption" in fields:
            reader.fail(f"{path}.preemption", "a tenant without quotas preempts by no policy")
        elif "flavorFungibility" in fields:
            reader.fail(f"{path}.flavorFungibility", "a tenant without quotas has no flavors")
        elif "tolerations" in fields:
            reader.fail(f"{path}.tolerations", "a tenant without quotas has no flavors")
        elif "fairSharing" in fields:
            reader.fail(f"{path}.fairSharing", "a tenant without quotas shares nothing")
    return tenants, quotas


def _cohorts(
    reader: _Reader,
    value: object,
    resources: Sequence[QuotaResource],
    tenants: Mapping[str, Tenant],
    quotas: Mapping[str, TenantQuota],
) -> dict[str, CohortQuota]:
    """Kueue's Cohort objects: a parent (which must be declared here too), quotas of the
    cohort's own (limits only towards a parent, as Kueue's webhook has it) and a fair-sharing
    weight; no cycles, and no name a tenant has."""
    cohorts: dict[str, CohortQuota] = {}
    paths: dict[str, str] = {}
    for i, item in enumerate(reader.sequence(value, "spec.quota.cohorts")):
        path = f"spec.quota.cohorts[{i}]"
        fields = reader.mapping(item, path, {"name", "parent", "quotas", "fairSharing"})
        name = reader.string(fields.get("name"), f"{path}.name")
        if any(c in name for c in "/{}"):
            reader.fail(f"{path}.name", "must not contain '/', '{' or '}' (a store hash tag)")
        if name in cohorts:
            reader.fail(f"{path}.name", f"duplicate cohort {name!r}")
        if name in tenants:
            reader.fail(f"{path}.name", f"a tenant is named {name!r} (they share names)")
        parent = reader.string(fields.get("parent", ""), f"{path}.parent", required=False)
        if parent and parent == name:
            reader.fail(f"{path}.parent", "a cohort cannot be its own parent")
            parent = ""
        limits: dict[str, QuotaLimits] = {}
        if "quotas" in fields:
            limits = _quota_limits(
                reader, fields["quotas"], f"{path}.quotas", resources, cohort=True
            )
            if not parent:
                _refuse_limits_at_a_root(reader, fields["quotas"], f"{path}.quotas")
        weight = _fair_weight(reader, fields.get("fairSharing", {}), f"{path}.fairSharing")
        if name and name not in cohorts:
            cohorts[name] = CohortQuota(name, parent, limits, weight)
            paths[name] = path
    for name, cohort in cohorts.items():
        if cohort.parent and cohort.parent not in cohorts:
            known = ", ".join(sorted(cohorts))
            reader.fail(
                f"{paths[name]}.parent",
                f"unknown cohort {cohort.parent!r} (spec.quota.cohorts: {known})",
            )
    reported: set[str] = set()
    for name in cohorts:
        chain, at = [name], cohorts[name].parent
        while at in cohorts and at not in chain:
            chain.append(at)
            at = cohorts[at].parent
        if at in chain and at not in reported:
            loop = chain[chain.index(at) :] + [at]
            reported.update(loop)
            reader.fail(f"{paths[at]}.parent", "cohorts form a cycle: " + " -> ".join(loop))
    for tenant, quota in quotas.items():
        if quota.cohort in tenants:
            reader.fail(
                f"spec.tenants[{list(tenants).index(tenant)}].cohort",
                f"{quota.cohort!r} is a tenant: a tenant's cohort must be a cohort",
            )
    return cohorts


def _refuse_limits_at_a_root(reader: _Reader, value: object, path: str) -> None:
    if not isinstance(value, list):
        return
    for j, item in enumerate(value):
        if not isinstance(item, Mapping):
            continue
        for limit in ("borrowingLimit", "lendingLimit"):
            if limit in item:
                reader.fail(
                    f"{path}[{j}].{limit}",
                    "only a cohort with a parent borrows or lends (Kueue: must be nil when "
                    "parent is empty)",
                )


def _fair_weight(reader: _Reader, value: object, path: str) -> Fraction:
    """`fairSharing: {weight: <quantity>}`: >= 0, and not so small it collapses (Kueue's
    webhook: 0 or more than 1n); 1 when unset."""
    fields = reader.mapping(value, path, {"weight"})
    raw = fields.get("weight")
    if raw is None:
        return Fraction(1)
    where = f"{path}.weight"
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        reader.fail(where, f"must be a quantity such as 1, 0.5 or 500m, got {raw!r}")
        return Fraction(1)
    try:
        weight = Quantity.parse(str(raw)).value
    except ValueError:
        reader.fail(where, f"must be a quantity such as 1, 0.5 or 500m, got {raw!r}")
        return Fraction(1)
    if weight < 0:
        reader.fail(where, "must not be negative")
        return Fraction(1)
    if 0 < weight <= Fraction(1, 10**9):
        reader.fail(where, "when not 0, must be more than 1n (10e-9)")
        return Fraction(1)
    return weight


def _fair_sharing(reader: _Reader, value: object) -> FairSharing:
    """`spec.quota.fairSharing` (Kueue's Configuration fairSharing): enabled, and the
    preemption strategies as one of the lists Kueue accepts."""
    path = "spec.quota.fairSharing"
    fields = reader.mapping(value, path, {"enabled", "preemptionStrategies"})
    enabled = reader.boolean(fields.get("enabled", False), f"{path}.enabled")
    if "preemptionStrategies" not in fields:
        return FairSharing(enabled)
    where = f"{path}.preemptionStrategies"
    names = reader.sequence(fields["preemptionStrategies"], where)
    chosen = []
    for j, name in enumerate(names):
        strategy = _choice(reader, name, f"{where}[{j}]", PreemptionStrategy)
        if strategy is not None:
            chosen.append(strategy)
    if len(chosen) == len(names) and tuple(chosen) not in VALID_STRATEGIES:
        allowed = "; ".join("[" + ", ".join(s) + "]" for s in VALID_STRATEGIES)
        reader.fail(where, f"must be one of {allowed}")
        return FairSharing(enabled)
    return FairSharing(enabled, tuple(chosen)) if chosen else FairSharing(enabled)


def _admission_fair_sharing(
    reader: _Reader, value: object, resources: Sequence[QuotaResource]
) -> AdmissionFairSharing | None:
    """`spec.quota.admissionFairSharing` (Kueue's Configuration field): the usage half-life
    (>= 0), the sampling interval (> 0, 5m by default) and resource weights (>= 0)."""
    if value is None:
        return None
    path = "spec.quota.admissionFairSharing"
    fields = reader.mapping(
        value, path, {"usageHalfLifeTime", "usageSamplingInterval", "resourceWeights"}
    )
    half_life = _duration(reader, fields.get("usageHalfLifeTime"), f"{path}.usageHalfLifeTime")
    interval = 300.0
    if "usageSamplingInterval" in fields:
        where = f"{path}.usageSamplingInterval"
        interval = _duration(reader, fields["usageSamplingInterval"], where)
        if interval <= 0:
            reader.fail(where, "must be greater than 0")
    known = {resource.base or resource.name for resource in resources}
    weights: dict[str, Fraction] = {}
    where = f"{path}.resourceWeights"
    raw = fields.get("resourceWeights", {})
    if not isinstance(raw, Mapping):
        reader.fail(where, f"must be a mapping, got {type(raw).__name__}")
        raw = {}
    for name, weight in raw.items():
        at = f"{where}.{name}"
        if name not in known:
            names = ", ".join(sorted(known)) or "none"
            reader.fail(at, f"unknown quota resource {name!r} (spec.quota.resources: {names})")
            continue
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            reader.fail(at, f"must be a number, got {weight!r}")
            continue
        if not math.isfinite(weight) or weight < 0:
            reader.fail(at, "must be a finite number >= 0")
            continue
        weights[str(name)] = Fraction(weight)
    return AdmissionFairSharing(half_life, interval if interval > 0 else 300.0, weights)


def _duration(reader: _Reader, value: object, path: str) -> float:
    """A Go duration (`168h`, `5m`, `1h30m`), as Kubernetes' metav1.Duration; >= 0."""
    if value is None:
        reader.fail(path, "Required value")
        return 0.0
    seconds = parse_go_duration(value) if isinstance(value, str) else None
    if seconds is None:
        reader.fail(path, f"must be a duration such as 168h, 5m or 1h30m, got {value!r}")
        return 0.0
    return seconds


_E = TypeVar("_E", bound=StrEnum)


def _preemption(reader: _Reader, value: object, path: str) -> PreemptionPolicy:
    """A tenant's `preemption`, as Kueue's ClusterQueue spells it (docs/tenancy.md)."""
    fields = reader.mapping(
        value, path, {"withinClusterQueue", "reclaimWithinCohort", "borrowWithinCohort"}
    )
    default = PreemptionPolicy()
    within = _choice(
        reader, fields.get("withinClusterQueue"), f"{path}.withinClusterQueue", WithinTenant
    )
    reclaim_path = f"{path}.reclaimWithinCohort"
    reclaim = _choice(reader, fields.get("reclaimWithinCohort"), reclaim_path, ReclaimWithinCohort)
    borrow = reader.mapping(
        fields.get("borrowWithinCohort", {}),
        f"{path}.borrowWithinCohort",
        {"policy", "maxPriorityThreshold"},
    )
    policy = _choice(
        reader, borrow.get("policy"), f"{path}.borrowWithinCohort.policy", BorrowWithinCohort
    )
    threshold = borrow.get("maxPriorityThreshold")
    where = f"{path}.borrowWithinCohort.maxPriorityThreshold"
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int)):
        reader.fail(where, f"must be an integer, got {threshold!r}")
        threshold = None
    if threshold is not None and policy in (None, BorrowWithinCohort.NEVER):
        reader.fail(where, "only with policy LowerPriority")
    return PreemptionPolicy(
        within or default.within_tenant,
        reclaim or default.reclaim_within_cohort,
        policy or default.borrow_within_cohort,
        threshold,
    )


def _choice(
    reader: _Reader,
    value: object,
    path: str,
    kind: type[_E],
    older: Mapping[str, _E] | None = None,
) -> _E | None:
    """One of `kind`'s values by its Kueue spelling (or an `older` name Kueue still accepts);
    None when unset (or refused)."""
    if value is None:
        return None
    for member in kind:
        if value == member.value:
            return member
    if older and isinstance(value, str) and value in older:
        return older[value]
    choices = ", ".join([member.value for member in kind] + list(older or ()))
    reader.fail(path, f"must be one of {choices}, got {value!r}")
    return None


def _fungibility(reader: _Reader, value: object, path: str) -> FlavorFungibility:
    """A tenant's `flavorFungibility`, as Kueue's ClusterQueue spells it (v1beta1's older
    names `Borrow` and `Preempt` too), with Kueue's defaults and its rule that `preference`
    needs both policies TryNextFlavor."""
    fields = reader.mapping(value, path, {"whenCanBorrow", "whenCanPreempt", "preference"})
    default = FlavorFungibility()
    borrow = _choice(
        reader,
        fields.get("whenCanBorrow"),
        f"{path}.whenCanBorrow",
        WhenCanBorrow,
        {"Borrow": WhenCanBorrow.MAY_STOP_SEARCH},
    )
    preempt = _choice(
        reader,
        fields.get("whenCanPreempt"),
        f"{path}.whenCanPreempt",
        WhenCanPreempt,
        {"Preempt": WhenCanPreempt.MAY_STOP_SEARCH},
    )
    preference = _choice(reader, fields.get("preference"), f"{path}.preference", FlavorPreference)
    made = FlavorFungibility(
        borrow or default.when_can_borrow, preempt or default.when_can_preempt, preference
    )
    both = (made.when_can_borrow, made.when_can_preempt) == (
        WhenCanBorrow.TRY_NEXT_FLAVOR,
        WhenCanPreempt.TRY_NEXT_FLAVOR,
    )
    if preference is not None and not both:
        reader.fail(
            f"{path}.preference",
            "preference can only be set when both whenCanBorrow and whenCanPreempt are "
            "TryNextFlavor",
        )
    return made


_MAX_TAINTS = 8  # Kueue's ResourceFlavor: at most 8 nodeTaints and 8 tolerations
_EFFECTS = {"NoSchedule": TaintEffect.NO_SCHEDULE, "NoExecute": TaintEffect.NO_EXECUTE}
_PREFER_NO_SCHEDULE = "PreferNoSchedule"  # accepted; never refuses (Kueue's check skips it)


def _taints(reader: _Reader, value: object, path: str) -> tuple[DeviceTaint, ...]:
    """A flavor's `nodeTaints` (Kubernetes Taints: key, value, effect), at most 8; the
    PreferNoSchedule ones are accepted and dropped, as Kueue's flavor check ignores them."""
    items = reader.sequence(value, path)
    if len(items) > _MAX_TAINTS:
        reader.fail(path, f"must have at most {_MAX_TAINTS} items, got {len(items)}")
    taints: list[DeviceTaint] = []
    seen: set[tuple[str, str]] = set()
    for i, item in enumerate(items):
        where = f"{path}[{i}]"
        fields = reader.mapping(item, where, {"key", "value", "effect"})
        key = _taint_key(reader, fields.get("key"), f"{where}.key", required=True)
        taint_value = reader.string(fields.get("value", ""), f"{where}.value", required=False)
        effect = fields.get("effect")
        if effect not in (*_EFFECTS, _PREFER_NO_SCHEDULE):
            reader.fail(
                f"{where}.effect",
                f"must be one of NoSchedule, PreferNoSchedule, NoExecute, got {effect!r}",
            )
            continue
        if (key, effect) in seen:
            reader.fail(where, f"duplicate taint {key!r} with effect {effect}")
        seen.add((key, effect))
        if effect in _EFFECTS:
            taints.append(DeviceTaint(key, _EFFECTS[effect], taint_value))
    return tuple(taints)


def _tolerations(reader: _Reader, value: object, path: str) -> tuple[DeviceToleration, ...]:
    """Kubernetes Tolerations (key, operator Equal or Exists, value, effect), at most 8, with
    their validation: Exists takes no value, an empty key only with Exists. A PreferNoSchedule
    toleration is dropped (no taint it tolerates refuses anything)."""
    items = reader.sequence(value, path)
    if len(items) > _MAX_TAINTS:
        reader.fail(path, f"must have at most {_MAX_TAINTS} items, got {len(items)}")
    tolerations: list[DeviceToleration] = []
    for i, item in enumerate(items):
        where = f"{path}[{i}]"
        fields = reader.mapping(item, where, {"key", "operator", "value", "effect"})
        key = _taint_key(reader, fields.get("key"), f"{where}.key", required=False)
        operator = _choice(
            reader, fields.get("operator"), f"{where}.operator", TolerationOperator
        ) or (TolerationOperator.EQUAL)
        wanted = reader.string(fields.get("value", ""), f"{where}.value", required=False)
        if operator is TolerationOperator.EXISTS and wanted:
            reader.fail(f"{where}.value", "must be empty when operator is Exists")
        if not key and operator is not TolerationOperator.EXISTS:
            reader.fail(f"{where}.operator", "must be Exists when key is empty")
        effect = fields.get("effect", "")
        if effect not in ("", *_EFFECTS, _PREFER_NO_SCHEDULE):
            reader.fail(
                f"{where}.effect",
                f"must be one of NoSchedule, PreferNoSchedule, NoExecute, got {effect!r}",
            )
            continue
        if effect != _PREFER_NO_SCHEDULE:
            tolerations.append(DeviceToleration(key, operator, wanted, _EFFECTS.get(effect)))
    return tuple(tolerations)


def _taint_key(reader: _Reader, value: object, path: str, *, required: bool) -> str:
    key = reader.string(value, path, required=required)
    problems = qualified_name_errors(key) if key else []
    if problems:
        reader.fail(path, f"{key!r}: {'; '.join(problems)}")
    return key


def _priority_classes(
    reader: _Reader, value: object
) -> tuple[dict[str, PriorityClass], PriorityClass]:
    classes: dict[str, PriorityClass] = {}
    default = DEFAULT_PRIORITY
    allowed = {"name", "value", "globalDefault", "preemptionPolicy", "preemptible", "movable"}
    items = reader.sequence(value, "spec.quota.priorityClasses")
    for i, item in enumerate(items):
        path = f"spec.quota.priorityClasses[{i}]"
        fields = reader.mapping(item, path, allowed)
        name = reader.string(fields.get("name"), f"{path}.name")
        if name in classes:
            reader.fail(f"{path}.name", f"duplicate priority class {name!r}")
        number = fields.get("value")
        if isinstance(number, bool) or not isinstance(number, int):
            reader.fail(f"{path}.value", f"must be an integer, got {number!r}")
            number = 0
        policy = fields.get("preemptionPolicy", "PreemptLowerPriority")
        if policy not in ("PreemptLowerPriority", "Never"):
            reader.fail(
                f"{path}.preemptionPolicy", f"must be PreemptLowerPriority or Never, got {policy!r}"
            )
        preemptible = reader.boolean(fields.get("preemptible", True), f"{path}.preemptible")
        movable = reader.boolean(fields.get("movable", False), f"{path}.movable")
        made = PriorityClass(name, number, policy != "Never", preemptible, movable)
        classes[name] = made
        if reader.boolean(fields.get("globalDefault", False), f"{path}.globalDefault"):
            if default is not DEFAULT_PRIORITY:
                reader.fail(f"{path}.globalDefault", "only one priority class may be the default")
            default = made
    return classes, default


_MAX_FLAVOR_SELECTORS = 32  # a DeviceClass's limit on selectors
_MAX_CEL_CHARACTERS = 10 * 1024  # DRA's limit on one CEL expression


def _resource_flavors(reader: _Reader, value: object) -> dict[str, ResourceFlavor]:
    """Kueue's ResourceFlavors: a name, the node labels its devices' nodes carry, its node
    taints and tolerations; and gpualloc's device-level selection (device classes, CEL
    selectors; a CEL expression is compiled where the allocator loads the policy)."""
    flavors: dict[str, ResourceFlavor] = {}
    allowed = {"name", "nodeLabels", "nodeTaints", "tolerations", "deviceClassNames", "selectors"}
    for i, item in enumerate(reader.sequence(value, "spec.quota.resourceFlavors")):
        path = f"spec.quota.resourceFlavors[{i}]"
        fields = reader.mapping(item, path, allowed)
        name = reader.string(fields.get("name"), f"{path}.name")
        if "/" in name or name == NO_FLAVOR:
            reader.fail(f"{path}.name", "must not contain '/' (quotas are <resource>/<flavor>)")
        if name in flavors:
            reader.fail(f"{path}.name", f"duplicate resource flavor {name!r}")
        labels = fields.get("nodeLabels", {})
        if not isinstance(labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            reader.fail(f"{path}.nodeLabels", "must map label names to string values")
            labels = {}
        classes = tuple(
            reader.string(c, f"{path}.deviceClassNames[{j}]")
            for j, c in enumerate(
                reader.sequence(fields.get("deviceClassNames", []), f"{path}.deviceClassNames")
            )
        )
        flavors[name] = ResourceFlavor(
            name,
            tuple(sorted(labels.items())),
            _taints(reader, fields.get("nodeTaints", []), f"{path}.nodeTaints"),
            _tolerations(reader, fields.get("tolerations", []), f"{path}.tolerations"),
            classes,
            _cel_selectors(reader, fields.get("selectors", []), f"{path}.selectors"),
        )
    return flavors


def _cel_selectors(reader: _Reader, value: object, path: str) -> tuple[str, ...]:
    """`[{cel: {expression: ...}}]`, a DeviceClass's selectors' shape: the expressions."""
    items = reader.sequence(value, path)
    if len(items) > _MAX_FLAVOR_SELECTORS:
        reader.fail(path, f"must have at most {_MAX_FLAVOR_SELECTORS} items, got {len(items)}")
    expressions: list[str] = []
    for i, item in enumerate(items):
        selector = reader.mapping(item, f"{path}[{i}]", {"cel"})
        cel = reader.mapping(selector.get("cel"), f"{path}[{i}].cel", {"expression"})
        where = f"{path}[{i}].cel.expression"
        expression = cel.get("expression")
        if not isinstance(expression, str) or not expression.strip():
            reader.fail(where, "Required value")
            continue
        if len(expression) > _MAX_CEL_CHARACTERS:
            reader.fail(where, f"must be at most {_MAX_CEL_CHARACTERS} characters")
            continue
        expressions.append(expression)
    return tuple(expressions)


def _quota_resources(
    reader: _Reader, value: object, flavors: Mapping[str, ResourceFlavor]
) -> list[QuotaResource]:
    """The quota resources; one given `flavors` is one QuotaResource per flavor."""
    resources: list[QuotaResource] = []
    allowed = {"name", "deviceClassNames", "counter", "gpuShare", "flavors", "selectors"}
    for i, item in enumerate(reader.sequence(value, "spec.quota.resources")):
        path = f"spec.quota.resources[{i}]"
        fields = reader.mapping(item, path, allowed)
        name = reader.string(fields.get("name"), f"{path}.name")
        if any((resource.base or resource.name) == name for resource in resources):
            reader.fail(f"{path}.name", f"duplicate quota resource {name!r}")
        if name == UNCOUNTED:
            reader.fail(f"{path}.name", f"{UNCOUNTED} names the devices no resource counts")
        if name.count("/") > 1:
            reader.fail(
                f"{path}.name",
                "may hold one '/' (a resource name such as nvidia.com/gpu; per flavor, quotas "
                "are <resource>/<flavor>)",
            )
        classes = tuple(
            reader.string(c, f"{path}.deviceClassNames[{j}]")
            for j, c in enumerate(
                reader.sequence(fields.get("deviceClassNames"), f"{path}.deviceClassNames")
            )
        )
        if not classes:
            reader.fail(f"{path}.deviceClassNames", "must name at least one DeviceClass")
        counter = reader.string(fields.get("counter", ""), f"{path}.counter", required=False)
        share = reader.boolean(fields.get("gpuShare", False), f"{path}.gpuShare")
        if share and counter:
            reader.fail(f"{path}.gpuShare", "counts a counter or GPU shares, not both")
        selectors = _cel_selectors(reader, fields.get("selectors", []), f"{path}.selectors")
        if "flavors" not in fields:
            resources.append(QuotaResource(name, classes, counter, share, selectors=selectors))
            continue
        names = reader.sequence(fields["flavors"], f"{path}.flavors")
        if not names:
            reader.fail(f"{path}.flavors", "must name at least one resource flavor")
        listed: set[str] = set()
        for j, flavor in enumerate(names):
            where = f"{path}.flavors[{j}]"
            flavor_name = reader.string(flavor, where)
            if flavor_name not in flavors:
                known = ", ".join(sorted(flavors)) or "none"
                reader.fail(
                    where,
                    f"unknown resource flavor {flavor_name!r} (spec.quota.resourceFlavors: "
                    f"{known})",
                )
                continue
            if flavor_name in listed:
                reader.fail(where, f"resource flavor {flavor_name!r} twice")
                continue
            listed.add(flavor_name)
            spec = flavors[flavor_name]
            if spec.device_classes and not set(spec.device_classes) & set(classes):
                reader.fail(
                    where,
                    f"resource flavor {flavor_name!r} selects none of the resource's device "
                    f"classes ({', '.join(classes)})",
                )
            resources.append(
                QuotaResource(
                    f"{name}/{flavor_name}",
                    classes,
                    counter,
                    share,
                    base=name,
                    flavor=flavor_name,
                    spec=spec,
                    selectors=selectors,
                )
            )
        resources.append(
            QuotaResource(
                f"{name}/{NO_FLAVOR}",
                classes,
                counter,
                share,
                base=name,
                flavor=NO_FLAVOR,
                selectors=selectors,
            )
        )
    every = [r.name for r in resources]
    for repeated in sorted({n for n in every if every.count(n) > 1}):
        reader.fail("spec.quota.resources", f"{repeated!r} is both a resource and a flavor's")
    return resources


def _quota_limits(
    reader: _Reader,
    value: object,
    path: str,
    resources: Sequence[QuotaResource],
    *,
    cohort: bool = False,
) -> dict[str, QuotaLimits]:
    """A tenant's or (`cohort`) a cohort's quotas; a cohort's lendingLimit may pass its own
    nominal (it lends its children's quota too)."""
    known = {resource.base or resource.name for resource in resources}
    flavored = {r.name for r in resources if r.spec is not None}
    with_flavors = {r.base for r in resources if r.flavor}
    limits: dict[str, QuotaLimits] = {}
    allowed = {"resource", "flavor", "nominal", "borrowingLimit", "lendingLimit"}
    for j, item in enumerate(reader.sequence(value, path)):
        where = f"{path}[{j}]"
        fields = reader.mapping(item, where, allowed)
        resource = base = reader.string(fields.get("resource"), f"{where}.resource")
        per_flavor = resource in with_flavors
        if "flavor" in fields or per_flavor:
            flavor = reader.string(fields.get("flavor"), f"{where}.flavor")
            if not per_flavor:
                reader.fail(f"{where}.flavor", f"quota resource {resource!r} has no flavors")
            elif flavor and f"{resource}/{flavor}" not in flavored:
                reader.fail(
                    f"{where}.flavor", f"quota resource {resource!r} has no flavor {flavor!r}"
                )
            resource = f"{resource}/{flavor}"
        elif resource and resource not in known:
            names = ", ".join(sorted(known)) or "none"
            reader.fail(
                f"{where}.resource",
                f"unknown quota resource {resource!r} (spec.quota.resources: {names})",
            )
        if resource in limits:
            reader.fail(f"{where}.resource", f"duplicate quota for {resource!r}")
        if base not in known:
            continue
        nominal = _amount(reader, fields.get("nominal"), f"{where}.nominal")
        borrowing = lending = None
        if "borrowingLimit" in fields:
            borrowing = _amount(reader, fields["borrowingLimit"], f"{where}.borrowingLimit")
        if "lendingLimit" in fields:
            lending = _amount(reader, fields["lendingLimit"], f"{where}.lendingLimit")
            if lending > nominal and not cohort:
                reader.fail(f"{where}.lendingLimit", "must not exceed nominal")
        limits[resource] = QuotaLimits(nominal, borrowing, lending)
    return limits


def _amount(reader: _Reader, value: object, path: str) -> int:
    """A quantity (`8`, `320Gi`) in milli-units, rounded up; >= 0."""
    if value is None:
        reader.fail(path, "Required value")
        return 0
    if isinstance(value, bool) or not isinstance(value, int | str):
        reader.fail(path, f"must be a quantity such as 8 or 320Gi, got {value!r}")
        return 0
    try:
        quantity = Quantity.parse(str(value))
    except ValueError:
        reader.fail(path, f"must be a quantity such as 8 or 320Gi, got {value!r}")
        return 0
    if quantity.value < 0:
        reader.fail(path, "must not be negative")
        return 0
    return math.ceil(quantity.value * 1000)


def _bindings(reader: _Reader, value: object, tenants: Mapping[str, Tenant]) -> list[Binding]:
    bindings: list[Binding] = []
    names: set[str] = set()
    allowed = {
        "name", "subjects", "roles", "tenant", "actFor", "actForTenants", "nodes", "reportedGpus",
    }  # fmt: skip
    for i, item in enumerate(reader.sequence(value, "spec.bindings")):
        path = f"spec.bindings[{i}]"
        fields = reader.mapping(item, path, allowed)
        name = reader.string(fields.get("name"), f"{path}.name")
        if name in names:
            reader.fail(f"{path}.name", f"duplicate binding {name!r}")
        names.add(name)
        subjects = [
            _subject(reader, s, f"{path}.subjects[{j}]")
            for j, s in enumerate(reader.sequence(fields.get("subjects"), f"{path}.subjects"))
        ]
        if not subjects:
            reader.fail(f"{path}.subjects", "must name at least one subject")
        roles = [
            _role(reader, r, f"{path}.roles[{j}]")
            for j, r in enumerate(reader.sequence(fields.get("roles"), f"{path}.roles"))
        ]
        if not roles:
            reader.fail(f"{path}.roles", "must name at least one role")
        act_for_tenants = _tenant_patterns(reader, fields.get("actForTenants", []), path, tenants)
        tenant = None
        if "tenant" in fields:
            tenant = reader.string(fields["tenant"], f"{path}.tenant")
            if tenant not in tenants:
                known = ", ".join(sorted(tenants)) or "none"
                reader.fail(f"{path}.tenant", f"unknown tenant {tenant!r} (spec.tenants: {known})")
        elif Role.SCHEDULER in roles and not act_for_tenants:
            reader.fail(
                f"{path}.tenant",
                "a scheduler binding needs a tenant to hold reservations (or actForTenants)",
            )
        act_for = tuple(
            _pattern(reader, p, f"{path}.actFor[{j}]")
            for j, p in enumerate(reader.sequence(fields.get("actFor", []), f"{path}.actFor"))
        )
        nodes = tuple(
            reader.string(n, f"{path}.nodes[{j}]")
            for j, n in enumerate(reader.sequence(fields.get("nodes", []), f"{path}.nodes"))
        )
        own_node = any("*" in s.name or s.kind is SubjectKind.JWT for s in subjects)
        if Role.AGENT in roles and not nodes and not own_node:
            reader.fail(
                f"{path}.nodes",
                "an agent binding needs nodes, a `*` in its subject names (the node's name) "
                "or a JWT subject (the node its service-account token is bound to)",
            )
        reported = _reported_gpus(reader, fields.get("reportedGpus"), f"{path}.reportedGpus")
        if reported is not None and Role.AGENT not in roles:
            reader.fail(f"{path}.reportedGpus", "only an agent binding reports GPUs")
        if act_for_tenants and not {Role.SCHEDULER, Role.READER, Role.ADMIN} & set(roles):
            reader.fail(
                f"{path}.actForTenants",
                "only a scheduler, reader or admin binding acts for tenants (an agent or "
                "inventory-admin has no tenant's business)",
            )
        bindings.append(
            Binding(
                name,
                tuple(subjects),
                tuple(roles),
                tenant,
                act_for,
                nodes,
                act_for_tenants,
                reported,
            )
        )
    return bindings


def _tenant_patterns(
    reader: _Reader, value: object, path: str, tenants: Mapping[str, Tenant]
) -> tuple[str, ...]:
    """A binding's actForTenants: tenant names (each one of spec.tenants) or patterns with
    one `*` (matching the tenants a call names), no duplicates."""
    patterns: list[str] = []
    for j, item in enumerate(reader.sequence(value, f"{path}.actForTenants")):
        where = f"{path}.actForTenants[{j}]"
        pattern = _pattern(reader, item, where)
        if not pattern:
            continue
        if pattern in patterns:
            reader.fail(where, f"duplicate {pattern!r}")
        elif "*" not in pattern and pattern not in tenants:
            known = ", ".join(sorted(tenants)) or "none"
            reader.fail(where, f"unknown tenant {pattern!r} (spec.tenants: {known})")
        patterns.append(pattern)
    return tuple(patterns)


def _reported_gpus(reader: _Reader, value: object, path: str) -> str | int | None:
    if value is None or value == PUBLISHED_GPUS:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        reader.fail(path, f"must be {PUBLISHED_GPUS!r} or a count >= 0, got {value!r}")
        return None
    return value


def _subject(reader: _Reader, value: object, path: str) -> Subject:
    fields = reader.mapping(value, path, {"kind", "name", "issuer"})
    raw_kind = reader.string(fields.get("kind"), f"{path}.kind")
    try:
        kind = SubjectKind(raw_kind)
    except ValueError:
        kinds = ", ".join(k.value for k in SubjectKind)
        reader.fail(f"{path}.kind", f"unknown subject kind {raw_kind!r} (one of {kinds})")
        kind = SubjectKind.DNS
    name = _pattern(reader, fields.get("name"), f"{path}.name")
    issuer = ""
    if kind is SubjectKind.JWT:
        issuer = reader.string(fields.get("issuer"), f"{path}.issuer")
    elif "issuer" in fields:
        reader.fail(f"{path}.issuer", "only JWT subjects have an issuer")
    return Subject(kind, name, issuer)


def _role(reader: _Reader, value: object, path: str) -> Role:
    raw = reader.string(value, path)
    try:
        return Role(raw)
    except ValueError:
        roles = ", ".join(r.value for r in Role)
        reader.fail(path, f"unknown role {raw!r} (one of {roles})")
        return Role.READER


def _pattern(reader: _Reader, value: object, path: str) -> str:
    pattern = reader.string(value, path)
    if pattern.count("*") > 1:
        reader.fail(path, f"may hold one `*` at most, got {pattern!r}")
    return pattern


def _issuers(reader: _Reader, value: object) -> list[JwtIssuer]:
    authentication = reader.mapping(value, "spec.authentication", {"jwt"})
    issuers: list[JwtIssuer] = []
    seen: set[str] = set()
    allowed = {"issuer", "audiences", "jwksFile"}
    for i, item in enumerate(
        reader.sequence(authentication.get("jwt", []), "spec.authentication.jwt")
    ):
        path = f"spec.authentication.jwt[{i}]"
        fields = reader.mapping(item, path, allowed)
        issuer = reader.string(fields.get("issuer"), f"{path}.issuer")
        if issuer in seen:
            reader.fail(f"{path}.issuer", f"duplicate issuer {issuer!r}")
        seen.add(issuer)
        audiences = tuple(
            reader.string(a, f"{path}.audiences[{j}]")
            for j, a in enumerate(reader.sequence(fields.get("audiences"), f"{path}.audiences"))
        )
        if not audiences:
            reader.fail(f"{path}.audiences", "must name at least one audience (checked as aud)")
        jwks = reader.string(fields.get("jwksFile"), f"{path}.jwksFile")
        issuers.append(JwtIssuer(issuer, audiences, jwks))
    return issuers


class _Reader:
    """Typed field readers that record a violation and return a harmless value."""

    def __init__(self, errors: list[FieldViolation]) -> None:
        self.errors = errors

    def fail(self, path: str, description: str) -> None:
        self.errors.append(FieldViolation(path, description))

    def mapping(self, value: object, path: str, allowed: Iterable[str]) -> Mapping[str, Any]:
        if value is None and path:
            self.fail(path, "Required value")
            return {}
        if not isinstance(value, Mapping):
            self.fail(path or "(document)", f"must be a mapping, got {type(value).__name__}")
            return {}
        known = set(allowed)
        for key in value:
            if key not in known:
                where = f"{path}.{key}" if path else str(key)
                self.fail(where, f"unknown field (known: {', '.join(sorted(known))})")
        return value

    def sequence(self, value: object, path: str) -> Sequence[object]:
        if value is None:
            self.fail(path, "Required value")
            return ()
        if not isinstance(value, list):
            self.fail(path, f"must be a list, got {type(value).__name__}")
            return ()
        return value

    def string(self, value: object, path: str, *, required: bool = True) -> str:
        if value is None or value == "":
            if required:
                self.fail(path, "Required value")
            return ""
        if not isinstance(value, str):
            self.fail(path, f"must be a string, got {type(value).__name__}")
            return ""
        if len(value) > _NAME_LIMIT * 4:
            self.fail(path, f"must be at most {_NAME_LIMIT * 4} characters")
            return ""
        return value

    def boolean(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, f"must be true or false, got {value!r}")
            return False
        return value
