"""cert-manager's Issuer and Certificate (cert-manager.io/v1), the fields deploy/k8s uses.

kubernetes-validate bundles only the built-in Kubernetes schemas, and cert-manager's CRDs are
not vendored here, so these objects are checked against a strict subset of the CRDs' schemas:
only the fields we use, by cert-manager's names and types (hand-checked against cert-manager's
Certificate reference, docs/usage/certificate.md). Anything else, such as a misspelt field that
cert-manager would silently drop (`dnsName`, `secretname`), is an error.
"""

from __future__ import annotations

from typing import Any

import pytest

API_VERSION = "cert-manager.io/v1"

# cert-manager's KeyUsage values (pkg/apis/certmanager/v1 types.go)
KEY_USAGES = [
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
    "server auth", "client auth", "code signing", "email protection", "s/mime",
    "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
    "microsoft sgc", "netscape sgc",
]  # fmt: skip

_DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(h|m|s|ms))+$"}
_STRINGS = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}


def custom_object(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The schema of a namespaced custom object: these apiVersion and kind, name, labels and
    annotations, and `spec` (also deploy/k8s/monitoring's, monitoring.py)."""
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
        "additionalProperties": False,
    }


def _object(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return custom_object(API_VERSION, kind, spec)


CERTIFICATE = _object(
    "Certificate",
    {
        "type": "object",
        "required": ["secretName", "issuerRef"],
        "properties": {
            "secretName": {"type": "string", "minLength": 1},
            "commonName": {"type": "string", "minLength": 1, "maxLength": 64},
            "dnsNames": _STRINGS,
            "ipAddresses": _STRINGS,
            "uris": _STRINGS,
            "isCA": {"type": "boolean"},
            "duration": _DURATION,
            "renewBefore": _DURATION,
            "usages": {"type": "array", "items": {"enum": KEY_USAGES}, "minItems": 1},
            "privateKey": {
                "type": "object",
                "properties": {
                    "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                    "size": {"type": "integer"},
                    "encoding": {"enum": ["PKCS1", "PKCS8"]},
                    "rotationPolicy": {"enum": ["Never", "Always"]},
                },
                "additionalProperties": False,
            },
            "issuerRef": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "kind": {"enum": ["Issuer", "ClusterIssuer"]},
                    "group": {"const": "cert-manager.io"},
                },
                "additionalProperties": False,
            },
        },
        "additionalProperties": False,
    },
)

ISSUER = _object(
    "Issuer",
    {
        "type": "object",
        # exactly one issuer type, as cert-manager's webhook demands
        "oneOf": [{"required": ["selfSigned"]}, {"required": ["ca"]}],
        "properties": {
            "selfSigned": {"type": "object", "additionalProperties": False},
            "ca": {
                "type": "object",
                "required": ["secretName"],
                "properties": {"secretName": {"type": "string", "minLength": 1}},
                "additionalProperties": False,
            },
        },
        "additionalProperties": False,
    },
)

SCHEMAS = {(API_VERSION, "Certificate"): CERTIFICATE, (API_VERSION, "Issuer"): ISSUER}


def is_cert_manager(obj: dict[str, Any]) -> bool:
    return (obj.get("apiVersion"), obj.get("kind")) in SCHEMAS


def validate_cert_manager(obj: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = SCHEMAS[(obj["apiVersion"], obj["kind"])]
    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(obj), key=lambda e: list(e.path)
    )
    if errors:
        name = obj.get("metadata", {}).get("name")
        where = ".".join(str(part) for part in errors[0].path)
        pytest.fail(f"{obj['kind']}/{name}: {where}: {errors[0].message}")
