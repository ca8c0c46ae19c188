"""The AccessPolicy file and the one `authorize` rule, as pure values (no server)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from services.common.errors import InvalidArgument, PermissionDenied
from services.common.security.policy import Access, authorize, parse_policy
from services.common.security.principal import (
    ROLE_PERMISSIONS,
    Identity,
    IdentityKind,
    Permission,
    Role,
    development_principal,
    glob_capture,
    tenant_of_owner,
)

BASE = """
apiVersion: gpualloc.dev/v1alpha1
kind: AccessPolicy
metadata: {name: t}
spec:
  authentication:
    jwt: [{issuer: "https://issuer.test", audiences: [gpualloc], jwksFile: /dev/null}]
  tenants: [{name: hpc}, {name: ml, allowAdminAccess: true}]
  bindings:
  - name: slurm
    subjects: [{kind: SPIFFE, name: "spiffe://fleet/ns/slurm/sa/bridge"}]
    tenant: hpc
    roles: [scheduler]
    actFor: ["slurm/job/*"]
  - name: ml-sidecar
    subjects: [{kind: JWT, issuer: "https://issuer.test", name: "system:serviceaccount:ml:kueue"}]
    tenant: ml
    roles: [scheduler]
  - name: agents
    subjects: [{kind: DNS, name: "*.agents.fleet"}]
    roles: [agent]
  - name: pinned-agent
    subjects: [{kind: CommonName, name: gpu-box}]
    roles: [agent]
    nodes: [box-1]
  - name: ops
    subjects: [{kind: CommonName, name: ops}]
    roles: [admin, reader]
  - name: also-hpc
    subjects: [{kind: CommonName, name: two-bindings}]
    tenant: hpc
    roles: [reader]
  - name: also-ml
    subjects: [{kind: CommonName, name: two-bindings}]
    tenant: ml
    roles: [reader]
"""


def policy() -> Any:
    return parse_policy(yaml.safe_load(BASE))


def certificate(*names: str) -> Identity:
    return Identity(IdentityKind.CERTIFICATE, names[0].split(":", 1)[1], names)


def _edit(change: Any) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(BASE)
    change(document)
    return document


def _set(path: str, value: Any) -> Any:
    def change(document: dict[str, Any]) -> None:
        target: Any = document
        keys = path.split(".")
        for key in keys[:-1]:
            target = target[int(key)] if key.isdigit() else target[key]
        last = keys[-1]
        target[int(last) if last.isdigit() else last] = value

    return change


INVALID: dict[str, tuple[Any, str]] = {
    "wrong-api-version": (_set("apiVersion", "v1"), "apiVersion"),
    "wrong-kind": (_set("kind", "Policy"), "kind"),
    "unknown-top-field": (_set("spec.roles", []), "spec.roles"),
    "unknown-role": (_set("spec.bindings.0.roles", ["schedular"]), "spec.bindings[0].roles[0]"),
    "unknown-tenant": (_set("spec.bindings.0.tenant", "hcp"), "spec.bindings[0].tenant"),
    "scheduler-without-tenant": (
        lambda d: d["spec"]["bindings"][0].pop("tenant"),
        "spec.bindings[0].tenant",
    ),
    "unknown-subject-kind": (
        _set("spec.bindings.0.subjects.0.kind", "Email"),
        "spec.bindings[0].subjects[0].kind",
    ),
    "jwt-subject-of-unknown-issuer": (
        _set("spec.bindings.1.subjects.0.issuer", "https://other"),
        "spec.bindings[1].subjects[0].issuer",
    ),
    "issuer-on-a-certificate-subject": (
        _set("spec.bindings.0.subjects.0.issuer", "x"),
        "spec.bindings[0].subjects[0].issuer",
    ),
    "two-stars": (_set("spec.bindings.0.actFor", ["a/*/b/*"]), "spec.bindings[0].actFor[0]"),
    "agent-without-node": (
        _set("spec.bindings.2.subjects", [{"kind": "DNS", "name": "agent.fleet"}]),
        "spec.bindings[2].nodes",
    ),
    "duplicate-binding": (_set("spec.bindings.1.name", "slurm"), "spec.bindings[1].name"),
    "duplicate-tenant": (_set("spec.tenants.1.name", "hpc"), "spec.tenants[1].name"),
    "slash-in-tenant": (_set("spec.tenants.0.name", "a/b"), "spec.tenants[0].name"),
    "admin-access-not-a-bool": (
        _set("spec.tenants.1.allowAdminAccess", "yes"),
        "spec.tenants[1].allowAdminAccess",
    ),
    "max-reservations-negative": (
        _set("spec.tenants.1.maxReservations", -1),
        "spec.tenants[1].maxReservations",
    ),
    "max-reservations-not-an-integer": (
        _set("spec.tenants.1.maxReservations", "100"),
        "spec.tenants[1].maxReservations",
    ),
    "reported-gpus-not-published-nor-a-count": (
        _set("spec.bindings.2.reportedGpus", "some"),
        "spec.bindings[2].reportedGpus",
    ),
    "reported-gpus-on-a-scheduler": (
        _set("spec.bindings.0.reportedGpus", 4),
        "spec.bindings[0].reportedGpus",
    ),
    "binding-without-subjects": (_set("spec.bindings.0.subjects", []), "spec.bindings[0].subjects"),
    "jwt-without-audience": (
        _set("spec.authentication.jwt.0.audiences", []),
        "spec.authentication.jwt[0].audiences",
    ),
    "spec-missing": (lambda d: d.pop("spec"), "spec"),
}


@pytest.mark.parametrize(("change", "path"), INVALID.values(), ids=INVALID.keys())
def test_invalid_policies_name_the_field(change: Any, path: str):
    with pytest.raises(InvalidArgument) as caught:
        parse_policy(_edit(change), source="policy.yaml")
    assert path in [v.path for v in caught.value.violations]
    assert caught.value.message.startswith("policy.yaml: ")


def test_the_example_policy_parses():
    parsed = policy()
    assert [b.name for b in parsed.bindings][:2] == ["slurm", "ml-sidecar"]
    assert parsed.tenants["ml"].allow_admin_access


RESOLVE: dict[str, tuple[Identity, str | None, tuple[Role, ...], tuple[str, ...]]] = {
    "spiffe-scheduler": (
        certificate("spiffe:spiffe://fleet/ns/slurm/sa/bridge", "cn:bridge"),
        "hpc",
        (Role.SCHEDULER,),
        (),
    ),
    "jwt-subject": (
        Identity(
            IdentityKind.JWT, "x", ("jwt:https://issuer.test#system:serviceaccount:ml:kueue",)
        ),
        "ml",
        (Role.SCHEDULER,),
        (),
    ),
    "agent-node-from-the-star": (
        certificate("dns:h100-7.agents.fleet"),
        None,
        (Role.AGENT,),
        ("h100-7",),
    ),
    "agent-with-listed-nodes": (certificate("cn:gpu-box"), None, (Role.AGENT,), ("box-1",)),
    "roles-add-up": (certificate("cn:ops"), None, (Role.ADMIN, Role.READER), ()),
}


@pytest.mark.parametrize(
    ("identity", "tenant", "roles", "nodes"), RESOLVE.values(), ids=RESOLVE.keys()
)
def test_resolve(identity: Identity, tenant: str | None, roles: tuple[Role, ...], nodes: Any):
    principal = policy().resolve(identity)
    assert principal is not None
    assert (principal.tenant, principal.roles, principal.nodes) == (tenant, roles, nodes)


@pytest.mark.parametrize(
    ("agents", "pinned", "expected"),
    [
        pytest.param(None, None, (False, None), id="unbounded"),
        pytest.param("published", None, (True, None), id="published-only"),
        pytest.param(8, None, (False, 8), id="a-count"),
        pytest.param("published", 4, (False, 4), id="the-most-any-binding-allows"),
    ],
)
def test_an_agents_reported_gpus(agents: Any, pinned: Any, expected: Any):
    def bound(document: dict[str, Any]) -> None:
        if agents is not None:
            document["spec"]["bindings"][2]["reportedGpus"] = agents
        document["spec"]["bindings"][3]["subjects"].append({"kind": "DNS", "name": "box-1.x"})
        document["spec"]["bindings"][2]["subjects"].append({"kind": "DNS", "name": "box-1.x"})
        if pinned is not None:
            document["spec"]["bindings"][3]["reportedGpus"] = pinned
        elif agents is not None:
            document["spec"]["bindings"][3]["reportedGpus"] = agents

    principal = parse_policy(_edit(bound)).resolve(certificate("dns:box-1.x"))
    assert principal is not None
    assert (principal.published_gpus_only, principal.max_reported_gpus) == expected


def test_unbound_identities_resolve_to_nothing():
    assert policy().resolve(certificate("cn:stranger")) is None
    # a JWT subject of another issuer is another identity
    other = Identity(IdentityKind.JWT, "x", ("jwt:https://evil#system:serviceaccount:ml:kueue",))
    assert policy().resolve(other) is None


def test_an_identity_in_two_tenants_is_refused():
    with pytest.raises(PermissionDenied, match="several tenants"):
        policy().resolve(certificate("cn:two-bindings"))


def _principal(*names: str) -> Any:
    found = policy().resolve(certificate(*names))
    assert found is not None
    return found


SLURM = ("spiffe:spiffe://fleet/ns/slurm/sa/bridge",)

OWNERS: dict[str, tuple[str, str, str | None]] = {
    # requested owner (field), header, expected owner (None: PermissionDenied)
    "default-is-the-identity": ("", "", "hpc/spiffe://fleet/ns/slurm/sa/bridge"),
    "act-for-pattern": ("slurm/job/42", "", "hpc/slurm/job/42"),
    "act-for-with-the-tenant-prefix": ("hpc/slurm/job/42", "", "hpc/slurm/job/42"),
    "header-wins-over-field": ("slurm/job/1", "slurm/job/2", "hpc/slurm/job/2"),
    "outside-act-for": ("kueue/ns/w", "", None),
    "another-tenants-prefix-is-just-a-name": ("ml/slurm/job/1", "", None),
    "pattern-is-not-a-prefix-match": ("slurm/jobs/1", "", None),
}


@pytest.mark.parametrize(("field", "header", "expected"), OWNERS.values(), ids=OWNERS.keys())
def test_owner_a_call_acts_as(field: str, header: str, expected: str | None):
    from dataclasses import replace

    principal = replace(_principal(*SLURM), claimed_owner=header)
    if expected is None:
        with pytest.raises(PermissionDenied, match="may not act for owner"):
            principal.owner(field)
    else:
        assert principal.owner(field) == expected
        assert tenant_of_owner(principal.owner(field)) == "hpc"


def test_development_mode_keeps_the_old_owner_rule():
    assert development_principal("").owner("") == "anonymous"
    assert development_principal("").owner("job-1") == "job-1"
    assert development_principal("tour").owner("job-1") == "tour"


def test_a_tenantless_identity_cannot_hold_reservations():
    with pytest.raises(PermissionDenied, match="no tenant"):
        _principal("cn:ops").owner("x")


AUTHORIZE: dict[str, tuple[tuple[str, ...], Access, str | None]] = {
    "scheduler-reserves": (SLURM, Access("Reserve", Permission.RESERVATIONS_CREATE), None),
    "scheduler-cannot-write-inventory": (
        SLURM,
        Access("ApplyResourceSlices", Permission.INVENTORY_WRITE),
        "lacks permission inventory.write",
    ),
    "admin-access-refused-for-hpc": (
        SLURM,
        Access("Allocate", Permission.RESERVATIONS_CREATE, admin_access=True),
        "adminAccess",
    ),
    "agent-reports-its-node": (
        ("dns:h100-7.agents.fleet",),
        Access("ReportNode", Permission.INVENTORY_REPORT_OWN, node="h100-7"),
        None,
    ),
    "agent-reports-another-node": (
        ("dns:h100-7.agents.fleet",),
        Access("ReportNode", Permission.INVENTORY_REPORT_OWN, node="h100-8"),
        "only its own node",
    ),
    "agent-cannot-read": (
        ("dns:h100-7.agents.fleet",),
        Access("GetInventory", Permission.INVENTORY_READ),
        "lacks permission inventory.read",
    ),
    "admin-reports-any-node": (
        ("cn:ops",),
        Access("ReportNode", Permission.INVENTORY_REPORT_OWN, node="anything"),
        None,
    ),
    "scheduler-cannot-report": (
        SLURM,
        Access("ReportNode", Permission.INVENTORY_REPORT_OWN, node="h100-7"),
        "lacks permission inventory.report-own-node",
    ),
}


@pytest.mark.parametrize(("names", "access", "denial"), AUTHORIZE.values(), ids=AUTHORIZE.keys())
def test_authorize(names: tuple[str, ...], access: Access, denial: str | None):
    principal = _principal(*names)
    if denial is None:
        authorize(principal, access)
    else:
        with pytest.raises(PermissionDenied, match=denial):
            authorize(principal, access)


def test_roles_only_reader_and_above_read_and_only_admin_sees_all_tenants():
    for role, permissions in ROLE_PERMISSIONS.items():
        assert (Permission.RESERVATIONS_ALL_TENANTS in permissions) == (role is Role.ADMIN)
    assert Permission.RESERVATIONS_CREATE not in ROLE_PERMISSIONS[Role.READER]
    assert ROLE_PERMISSIONS[Role.AGENT] == {Permission.INVENTORY_REPORT_OWN}


GLOBS: dict[str, tuple[str, str, str | None]] = {
    "exact": ("a/b", "a/b", ""),
    "exact-mismatch": ("a/b", "a/c", None),
    "star-spans-slashes": ("slurm/*", "slurm/job/1", "job/1"),
    "star-in-the-middle": ("*.agents.fleet", "n1.agents.fleet", "n1"),
    "too-short": ("ab*ba", "aba", None),
    "question-mark-is-literal": ("job?", "job1", None),
    "bracket-is-literal": ("job[1]", "job[1]", ""),
}


@pytest.mark.parametrize(("pattern", "name", "captured"), GLOBS.values(), ids=GLOBS.keys())
def test_glob_capture(pattern: str, name: str, captured: str | None):
    assert glob_capture(pattern, name) == captured
