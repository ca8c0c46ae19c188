"""Acting for a tenant (a binding's `actForTenants`, the call's `x-gpualloc-tenant`), as pure
values: which identity may act for which tenant, and what its principal is then (policy.py's
`act_for_tenant`; the edge and real servers: tests/integration/test_kueue_tenants.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import yaml

from services.common.errors import InvalidArgument, PermissionDenied
from services.common.security.audit import AUDIT_LOGGER, audit_event
from services.common.security.policy import AccessPolicy, parse_policy
from services.common.security.principal import Identity, IdentityKind, Principal
from tests.unit.bridges.support import ROOT

BASE = """
apiVersion: gpualloc.dev/v1alpha1
kind: AccessPolicy
metadata: {name: t}
spec:
  tenants:
  - {name: hpc, maxReservations: 10}
  - {name: team-a, maxReservations: 3}
  - {name: team-b, allowAdminAccess: true}
  - {name: ml}
  bindings:
  - name: kueue-sidecar
    subjects: [{kind: CommonName, name: sidecar}]
    roles: [scheduler]
    actFor: ["kueue/*"]
    actForTenants: [hpc, "team-*"]
  - name: ml-sidecar
    subjects: [{kind: CommonName, name: ml-sidecar}]
    tenant: ml
    roles: [scheduler]
    actFor: ["kueue/*"]
    actForTenants: [team-a]
  - name: slurm
    subjects: [{kind: CommonName, name: slurm}]
    tenant: hpc
    roles: [scheduler]
    actFor: ["slurm/job/*"]
  - name: watcher
    subjects: [{kind: CommonName, name: watcher}]
    roles: [reader]
    actForTenants: ["*"]
"""


def policy(text: str = BASE) -> AccessPolicy:
    return parse_policy(yaml.safe_load(text))


def principal_of(name: str, text: str = BASE) -> Principal:
    found = policy(text).resolve(Identity(IdentityKind.CERTIFICATE, name, (f"cn:{name}",)))
    assert found is not None
    return found


# identity, tenant named, expected: (tenant, maxReservations, allowAdminAccess, own tenant)
# or the denial's words
ACTING: dict[str, tuple[str, str, tuple[str, int | None, bool, str | None] | str]] = {
    "a-tenant-named-in-act-for-tenants": ("sidecar", "hpc", ("hpc", 10, False, None)),
    "a-tenant-a-pattern-matches": ("sidecar", "team-a", ("team-a", 3, False, None)),
    "the-tenants-bounds-come-with-it": ("sidecar", "team-b", ("team-b", None, True, None)),
    "an-identity-with-a-tenant-of-its-own-acts-for-another": (
        "ml-sidecar",
        "team-a",
        ("team-a", 3, False, "ml"),
    ),
    "naming-its-own-tenant-changes-nothing": ("ml-sidecar", "ml", ("ml", None, False, None)),
    "a-tenant-not-granted-is-denied": (
        "ml-sidecar",
        "team-b",
        "may not act for tenant 'team-b' (the policy's actForTenants let it act for: team-a; "
        "its own is ml)",
    ),
    "a-pattern-does-not-match-another-prefix": (
        "sidecar",
        "ml",
        "may not act for tenant 'ml' (the policy's actForTenants let it act for: hpc, team-*; "
        "it has none)",
    ),
    "a-tenant-the-policy-lacks-is-denied": (
        "sidecar",
        "team-z",
        "may not act for tenant 'team-z': the access policy has no such tenant",
    ),
    "deny-by-default-without-act-for-tenants": (
        "slurm",
        "team-a",
        "may not act for tenant 'team-a' (the policy's actForTenants let it act for: none; "
        "its own is hpc)",
    ),
    "a-reader-acts-for-any-tenant-by-a-star": ("watcher", "ml", ("ml", None, False, None)),
    "a-long-name-is-cut-in-the-message": ("slurm", "x" * 300, "may not act for tenant 'xxxx"),
}


@pytest.mark.parametrize(("identity", "tenant", "expected"), ACTING.values(), ids=ACTING.keys())
def test_who_may_act_for_which_tenant(identity: str, tenant: str, expected: Any):
    principal = principal_of(identity)
    if isinstance(expected, str):
        with pytest.raises(PermissionDenied) as denied:
            policy().act_for_tenant(principal, tenant)
        assert expected in denied.value.message
        assert f"identity {identity} " in denied.value.message
        assert len(denied.value.message) < 300
        return
    acting = policy().act_for_tenant(principal, tenant)
    name, most, admin, own = expected
    assert (acting.tenant, acting.max_reservations, acting.allow_admin_access) == (
        name,
        most,
        admin,
    )
    assert acting.identity == principal.identity
    assert acting.roles == principal.roles and acting.act_for == principal.act_for
    assert acting.acts_for_tenant == (name != principal.tenant)
    assert acting.identity_tenant == own


# the tenant acted for, then the owner asked for: the owner held (None: denied)
OWNERS: dict[str, tuple[str, str, str | None]] = {
    "owners-are-in-the-tenant-acted-for": ("team-a", "kueue/ns/w", "team-a/kueue/ns/w"),
    "the-tenant-prefix-may-be-given": ("team-a", "team-a/kueue/ns/w", "team-a/kueue/ns/w"),
    "another-tenants-prefix-is-just-a-name": ("team-a", "team-b/kueue/ns/w", None),
    "act-for-owners-still-hold": ("team-a", "slurm/job/1", None),
    "no-owner-is-the-identity-in-the-tenant": ("hpc", "", "hpc/sidecar"),
}


@pytest.mark.parametrize(("tenant", "asked", "owner"), OWNERS.values(), ids=OWNERS.keys())
def test_owners_follow_the_tenant_acted_for(tenant: str, asked: str, owner: str | None):
    acting = policy().act_for_tenant(principal_of("sidecar"), tenant)
    if owner is None:
        with pytest.raises(PermissionDenied, match="may not act for owner"):
            acting.owner(asked)
    else:
        assert acting.owner(asked) == owner


def test_reads_follow_the_tenant_acted_for():
    acting = policy().act_for_tenant(principal_of("sidecar"), "team-a")
    assert acting.may_see("team-a/kueue/ns/w")
    assert not acting.may_see("team-b/kueue/ns/w")
    assert not acting.sees_all_tenants
    assert acting.qualified("kueue/ns/w") == "team-a/kueue/ns/w"


def test_without_a_tenant_named_an_identity_without_its_own_holds_nothing():
    with pytest.raises(PermissionDenied, match="belongs to no tenant"):
        principal_of("sidecar").owner("kueue/ns/w")


def _edit(path: str, value: Any) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(BASE)
    target: Any = document
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    last = keys[-1]
    target[int(last) if last.isdigit() else last] = value
    return document


INVALID: dict[str, tuple[str, Any, str]] = {
    "an-unknown-tenant": (
        "spec.bindings.0.actForTenants",
        ["hcp"],
        "spec.bindings[0].actForTenants[0]",
    ),
    "two-stars": ("spec.bindings.0.actForTenants", ["t-*-*"], "spec.bindings[0].actForTenants[0]"),
    "a-duplicate": (
        "spec.bindings.0.actForTenants",
        ["hpc", "hpc"],
        "spec.bindings[0].actForTenants[1]",
    ),
    "not-a-list": ("spec.bindings.0.actForTenants", "hpc", "spec.bindings[0].actForTenants"),
    "an-empty-name": ("spec.bindings.0.actForTenants", [""], "spec.bindings[0].actForTenants[0]"),
    "an-agent-acts-for-no-tenant": (
        "spec.bindings.2",
        {
            "name": "a",
            "subjects": [{"kind": "DNS", "name": "*.agents"}],
            "roles": ["agent"],
            "actForTenants": ["hpc"],
        },
        "spec.bindings[2].actForTenants",
    ),  # fmt: skip
    "a-scheduler-with-neither-tenant-nor-act-for-tenants": (
        "spec.bindings.0.actForTenants",
        [],
        "spec.bindings[0].tenant",
    ),
}


@pytest.mark.parametrize(("path", "value", "field"), INVALID.values(), ids=INVALID.keys())
def test_act_for_tenants_is_validated(path: str, value: Any, field: str):
    with pytest.raises(InvalidArgument) as caught:
        parse_policy(_edit(path, value))
    assert field in [v.path for v in caught.value.violations]


KUEUE = """
apiVersion: gpualloc.dev/v1alpha1
kind: AccessPolicy
metadata: {name: t}
spec:
  quota:
    kueue:
      objects:
      - {apiVersion: kueue.x-k8s.io/v1beta2, kind: ResourceFlavor, metadata: {name: f}}
      - apiVersion: kueue.x-k8s.io/v1beta2
        kind: ClusterQueue
        metadata: {name: team-a}
        spec:
          resourceGroups:
          - coveredResources: [nvidia.com/gpu]
            flavors: [{name: f, resources: [{name: nvidia.com/gpu, nominalQuota: 2}]}]
  bindings:
  - name: kueue-sidecar
    subjects: [{kind: CommonName, name: sidecar}]
    roles: [scheduler]
    actFor: ["kueue/*"]
    actForTenants: [team-a]
"""


def test_a_cluster_queue_is_a_tenant_the_sidecar_may_act_for():
    kueue = policy(KUEUE)
    acting = kueue.act_for_tenant(principal_of("sidecar", KUEUE), "team-a")
    assert acting.tenant == "team-a"
    assert kueue.quotas.quota_of("team-a") is not None


def test_the_audit_trail_records_the_identity_and_the_tenant_acted_for(
    caplog: pytest.LogCaptureFixture,
):
    acting = policy().act_for_tenant(principal_of("ml-sidecar"), "team-a")
    own = principal_of("ml-sidecar")
    with caplog.at_level(logging.INFO, logger=AUDIT_LOGGER):
        audit_event("reservation.grant", acting, owner="team-a/kueue/ns/w")
        audit_event("reservation.grant", own, owner="ml/kueue/ns/w")
    acted, itself = caplog.records[-2:]
    assert (acted.identity, acted.tenant) == ("ml-sidecar", "team-a")  # type: ignore[attr-defined]
    assert acted.acts_for_tenant is True  # type: ignore[attr-defined]
    assert acted.identity_tenant == "ml"  # type: ignore[attr-defined]
    assert (itself.identity, itself.tenant) == ("ml-sidecar", "ml")  # type: ignore[attr-defined]
    assert not hasattr(itself, "acts_for_tenant")


def test_the_binding_docs_security_md_shows_parses_and_acts_as_it_says():
    """docs/security.md's "Acting for a tenant" binding, in a policy of its tenants."""
    text = (ROOT / "docs" / "security.md").read_text()
    section = text.split("### Acting for a tenant", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    (binding,) = yaml.safe_load(block)
    document = {
        "apiVersion": "gpualloc.dev/v1alpha1",
        "kind": "AccessPolicy",
        "metadata": {"name": "doc"},
        "spec": {
            "authentication": {
                "jwt": [
                    {
                        "issuer": "https://kubernetes.default.svc.cluster.local",
                        "audiences": ["gpualloc"],
                        "jwksFile": "/dev/null",
                    }
                ]
            },
            "tenants": [{"name": "hpc"}, {"name": "team-a"}, {"name": "ml"}],
            "bindings": [binding],
        },
    }
    parsed = parse_policy(document)
    sidecar = Identity(
        IdentityKind.JWT,
        "system:serviceaccount:kueue-system:gpualloc-kueue",
        (
            "jwt:https://kubernetes.default.svc.cluster.local#"
            "system:serviceaccount:kueue-system:gpualloc-kueue",
        ),
    )
    principal = parsed.resolve(sidecar)
    assert principal is not None and principal.tenant is None
    assert parsed.act_for_tenant(principal, "team-a").tenant == "team-a"
    assert parsed.act_for_tenant(principal, "hpc").tenant == "hpc"
    with pytest.raises(PermissionDenied, match="may not act for tenant 'ml'"):
        parsed.act_for_tenant(principal, "ml")
