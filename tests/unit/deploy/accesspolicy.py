"""The AccessPolicy file (gpualloc.dev/v1alpha1) as the deploy files ship it, checked by structure.

A strict schema of the format everyone codes against (issue 14's spec: tenants, bindings of
subjects to roles, JWT authentication): a misspelt field, an unknown subject kind or role, a JWT
subject without its issuer, or a binding to a tenant the file does not declare is an error here,
before any server reads the file. The servers' own loader is the authority on meaning; this
catches what a typo in a manifest would otherwise only show at startup.
"""

from __future__ import annotations

from typing import Any

import pytest

ROLES = ["agent", "inventory-admin", "scheduler", "reader", "admin"]
SUBJECT_KINDS = ["SPIFFE", "DNS", "CommonName", "JWT"]

_NAME = {"type": "string", "minLength": 1}
_SUBJECT = {
    "type": "object",
    "required": ["kind", "name"],
    "properties": {"kind": {"enum": SUBJECT_KINDS}, "name": _NAME, "issuer": _NAME},
    "additionalProperties": False,
    # a JWT subject is its token's `sub` at one issuer; the other kinds have no issuer
    "if": {"properties": {"kind": {"const": "JWT"}}},
    "then": {"required": ["issuer"]},
    "else": {"not": {"required": ["issuer"]}},
}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "gpualloc.dev/v1alpha1"},
        "kind": {"const": "AccessPolicy"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": _NAME},
            "additionalProperties": False,
        },
        "spec": {
            "type": "object",
            "required": ["bindings"],
            "properties": {
                "authentication": {
                    "type": "object",
                    "properties": {
                        "jwt": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "type": "object",
                                "required": ["issuer", "audiences", "jwksFile"],
                                "properties": {
                                    "issuer": {"type": "string", "pattern": "^https://"},
                                    "audiences": {"type": "array", "items": _NAME, "minItems": 1},
                                    "jwksFile": {"type": "string", "pattern": "^/"},
                                },
                                "additionalProperties": False,
                            },
                        }
                    },
                    "additionalProperties": False,
                },
                "tenants": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": _NAME, "allowAdminAccess": {"type": "boolean"}},
                        "additionalProperties": False,
                    },
                },
                "bindings": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "subjects", "roles"],
                        "properties": {
                            "name": _NAME,
                            "subjects": {"type": "array", "items": _SUBJECT, "minItems": 1},
                            "tenant": _NAME,
                            "roles": {
                                "type": "array",
                                "items": {"enum": ROLES},
                                "minItems": 1,
                                "uniqueItems": True,
                            },
                            "actFor": {"type": "array", "items": _NAME},
                        },
                        "additionalProperties": False,
                    },
                },
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}


def check_access_policy(policy: Any) -> None:
    """Fail the test with the first problem of an AccessPolicy document."""
    jsonschema = pytest.importorskip("jsonschema")
    errors = sorted(
        jsonschema.Draft202012Validator(SCHEMA).iter_errors(policy), key=lambda e: list(e.path)
    )
    if errors:
        where = ".".join(str(part) for part in errors[0].path)
        pytest.fail(f"AccessPolicy: {where}: {errors[0].message}")
    spec = policy["spec"]
    tenants = [t["name"] for t in spec.get("tenants", [])]
    assert len(tenants) == len(set(tenants)), f"tenants named twice: {tenants}"
    bindings = [b["name"] for b in spec["bindings"]]
    assert len(bindings) == len(set(bindings)), f"bindings named twice: {bindings}"
    issuers = {j["issuer"] for j in spec.get("authentication", {}).get("jwt", [])}
    for binding in spec["bindings"]:
        name = binding["name"]
        if "tenant" in binding:
            assert binding["tenant"] in tenants, f"{name}: undeclared tenant {binding['tenant']}"
        if "scheduler" in binding["roles"]:
            assert "tenant" in binding, f"{name}: a scheduler acts for one tenant"
        for subject in binding["subjects"]:
            if subject["kind"] == "JWT":
                assert subject["issuer"] in issuers, f"{name}: no JWT issuer {subject['issuer']}"
