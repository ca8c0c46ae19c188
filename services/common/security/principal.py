"""Identities, permissions and roles: the values the edge computes once per call.

An `Identity` is what a caller *proved*: the names in its client certificate (SPIFFE ID, DNS
SANs, common name) or the subject of a verified bearer JWT. The access policy turns it into a
`Principal`: the tenant it acts in, the permissions its roles grant, the owners it may name and
the nodes it may report. Development mode (no policy) has a principal too: whoever the owner
header says, allowed everything — the behaviour of a server nobody shares.

Owners and tenants. A reservation's owner is `<tenant>/<name>` under a policy (the tenant is
prefixed by the server, never trusted from the caller), so a reservation's tenant is always the
part of its owner before the first `/` — `tenant_of_owner` — in every layout and store.

Acting for a tenant. An identity the policy lets act for other tenants (a binding's
`actForTenants`, as Kubernetes impersonation) may name one per call; its principal is then
that tenant's (`tenant`, and the tenant's bounds), with `identity_tenant` the identity's own
and `acts_for_tenant` set, so everything downstream follows the tenant acted for while the
audit trail records both (policy.py's `act_for_tenant`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import StrEnum

from services.common.errors import PermissionDenied

__all__ = [
    "DEVELOPMENT_ANONYMOUS",
    "ROLE_PERMISSIONS",
    "Identity",
    "IdentityKind",
    "Permission",
    "Principal",
    "Role",
    "development_principal",
    "glob_capture",
    "tenant_of_owner",
]

DEVELOPMENT_ANONYMOUS = "anonymous"


class Permission(StrEnum):
    """Verbs on resources, Kubernetes RBAC style (`resource.verb`)."""

    INVENTORY_READ = "inventory.read"  # GetInventory, WatchInventory
    INVENTORY_WRITE = "inventory.write"  # ApplyResourceSlices, DeleteResourceSlices
    INVENTORY_REPORT_OWN = "inventory.report-own-node"  # ReportNode for the caller's node
    INVENTORY_REPORT_ANY = "inventory.report-any-node"  # ReportNode for any node
    PLACEMENTS_READ = "placements.read"  # Allocate without reserving, Explain, Capacity
    RESERVATIONS_CREATE = "reservations.create"  # Allocate(reserve), Reserve
    RESERVATIONS_UPDATE = "reservations.update"  # Commit, Renew, Release (own tenant)
    RESERVATIONS_READ = "reservations.read"  # Get, List (other tenants redacted)
    RESERVATIONS_ALL_TENANTS = "reservations.all-tenants"  # see and act on every tenant's


class Role(StrEnum):
    AGENT = "agent"
    INVENTORY_ADMIN = "inventory-admin"
    SCHEDULER = "scheduler"
    READER = "reader"
    ADMIN = "admin"


_READS = frozenset(
    {Permission.INVENTORY_READ, Permission.PLACEMENTS_READ, Permission.RESERVATIONS_READ}
)

ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.AGENT: frozenset({Permission.INVENTORY_REPORT_OWN}),
    Role.INVENTORY_ADMIN: frozenset(
        {
            Permission.INVENTORY_READ,
            Permission.INVENTORY_WRITE,
            Permission.INVENTORY_REPORT_ANY,
        }
    ),
    Role.SCHEDULER: _READS | {Permission.RESERVATIONS_CREATE, Permission.RESERVATIONS_UPDATE},
    Role.READER: _READS,
    Role.ADMIN: frozenset(Permission),
}
"""What each built-in role may do. Deny by default: a permission no role grants is refused."""


class IdentityKind(StrEnum):
    CERTIFICATE = "certificate"
    JWT = "jwt"
    DEVELOPMENT = "development"  # the owner header, believed (no policy configured)
    ANONYMOUS = "anonymous"  # proved nothing: the web view's reader (no tenant, no permission)


@dataclass(frozen=True)
class Identity:
    """What a caller proved. `names` are the subject names policy bindings match against:
    `spiffe:<id>`, `dns:<name>`, `cn:<name>` for a certificate, `jwt:<issuer>#<sub>` for a
    token. `display` is the one name logs and default owners use."""

    kind: IdentityKind
    display: str
    names: tuple[str, ...] = ()
    node: str = ""  # a token bound to a pod on a node (Kubernetes' kubernetes.io.node.name)


@dataclass(frozen=True)
class Principal:
    """An identity with what the policy grants it. Frozen: computed once per call."""

    identity: Identity
    tenant: str | None = None
    roles: tuple[Role, ...] = ()
    permissions: frozenset[Permission] = frozenset()
    act_for: tuple[str, ...] = ()  # owner patterns (one `*` each) it may name, sans tenant
    nodes: tuple[str, ...] = ()  # nodes it may report (agent)
    allow_admin_access: bool = False
    development: bool = False
    claimed_owner: str = ""  # development mode: the x-gpualloc-owner header, if any
    max_reservations: int | None = None  # its tenant's live reservations bound (None: none)
    published_gpus_only: bool = False  # an agent that may report only GPUs slices publish
    max_reported_gpus: int | None = None  # an agent's bound on the GPUs of one report
    tenants_acted_for: tuple[str, ...] = ()  # tenant patterns (one `*` each) it may act for
    acts_for_tenant: bool = False  # this call acts for `tenant`, not the identity's own
    identity_tenant: str | None = None  # then: the identity's own tenant (None: none)

    @property
    def name(self) -> str:
        return self.identity.display

    def can(self, permission: Permission) -> bool:
        return permission in self.permissions

    @property
    def sees_all_tenants(self) -> bool:
        return self.development or self.can(Permission.RESERVATIONS_ALL_TENANTS)

    def may_report(self, node: str) -> bool:
        if self.can(Permission.INVENTORY_REPORT_ANY):
            return True
        return self.can(Permission.INVENTORY_REPORT_OWN) and node in self.nodes

    def owner(self, field: str = "") -> str:
        """The owner a reserving or reservation-changing call acts as; `field` is the
        request's `owner` (the `x-gpualloc-owner` header, kept in `claimed_owner`, wins).

        Development mode keeps the old rule: the header, else the field, else `anonymous`.
        Under a policy the owner is `<tenant>/<name>`: the name asked for when the policy lets
        this identity act for it (asked with the tenant prefix or without), else the
        identity's own name. Raises PermissionDenied for an owner it may not name, or when the
        identity has no tenant to hold reservations in."""
        requested = self.claimed_owner or field
        if self.development:
            return requested or DEVELOPMENT_ANONYMOUS
        if self.tenant is None:
            raise PermissionDenied(
                f"identity {self.name} belongs to no tenant, so it cannot hold reservations"
            )
        prefix = f"{self.tenant}/"
        name = requested.removeprefix(prefix)
        if not name or name == self.name:
            return prefix + self.name
        if any(glob_capture(pattern, name) is not None for pattern in self.act_for):
            return prefix + name
        allowed = ", ".join(self.act_for) or "none"
        raise PermissionDenied(
            f"identity {self.name} may not act for owner {_shown(name)} "
            f"(the policy lets it act for: {allowed})"
        )

    def qualified(self, owner: str) -> str:
        """An owner named in a read (a List filter) as stored: with the tenant prefix."""
        if not owner or self.development or self.tenant is None:
            return owner
        prefix = f"{self.tenant}/"
        return owner if owner.startswith(prefix) else prefix + owner

    def may_see(self, owner: str) -> bool:
        """Whether a reservation of `owner` is shown in full (else as `held by tenant X`)."""
        return self.sees_all_tenants or (
            self.tenant is not None and tenant_of_owner(owner) == self.tenant
        )


@functools.lru_cache(maxsize=1024)
def development_principal(claimed_owner: str = "") -> Principal:
    """Development mode: the owner header is believed and everything is allowed. Made once
    per owner header (a value: every call of a development server asks for one)."""
    owner = claimed_owner or DEVELOPMENT_ANONYMOUS
    return Principal(
        Identity(IdentityKind.DEVELOPMENT, owner, (f"owner:{owner}",)),
        tenant=tenant_of_owner(owner),
        roles=(Role.ADMIN,),
        permissions=ROLE_PERMISSIONS[Role.ADMIN],
        allow_admin_access=True,
        development=True,
        claimed_owner=claimed_owner,
    )


def tenant_of_owner(owner: str) -> str:
    """The tenant of a reservation owner: the part before the first `/` (all of it if none)."""
    return owner.split("/", 1)[0]


def glob_capture(pattern: str, name: str) -> str | None:
    """Match `name` against `pattern`, which may hold one `*` (any run of characters, `/`
    included); returns what the `*` matched ("" without one), or None when it does not match.
    Deliberately not fnmatch: `?` and `[` in an owner or a SAN are plain characters."""
    head, star, tail = pattern.partition("*")
    if not star:
        return "" if name == pattern else None
    if len(name) < len(head) + len(tail) or not name.startswith(head) or not name.endswith(tail):
        return None
    return name[len(head) : len(name) - len(tail)]


def _shown(value: str, limit: int = 80) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "…")
