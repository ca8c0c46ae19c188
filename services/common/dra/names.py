"""Name and value formats of the Kubernetes API, as k8s.io/apimachinery util/validation checks them.

Each checker returns the list of problems (empty when the value is fine), worded like upstream,
so a caller can attach them to a field path. They are cached: the same driver, attribute and
device names repeat across thousands of slices, and validating 10,000 slices must stay cheap.
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = [
    "DEVICE_MAX_DOMAIN_LENGTH",
    "DEVICE_MAX_ID_LENGTH",
    "DNS1123_LABEL_MAX_LENGTH",
    "DNS1123_SUBDOMAIN_MAX_LENGTH",
    "DRIVER_NAME_MAX_LENGTH",
    "c_identifier_errors",
    "dns1123_label_errors",
    "dns1123_subdomain_errors",
    "driver_name_errors",
    "fully_qualified_name_errors",
    "label_name_errors",
    "label_value_errors",
    "pool_name_errors",
    "qualified_name_errors",
    "semver_errors",
    "uid_errors",
]

DNS1123_LABEL_MAX_LENGTH = 63
DNS1123_SUBDOMAIN_MAX_LENGTH = 253
DRIVER_NAME_MAX_LENGTH = 63  # same as a CSI driver name
DEVICE_MAX_DOMAIN_LENGTH = 63  # the domain of a qualified attribute/capacity name
DEVICE_MAX_ID_LENGTH = 32  # the C identifier of a qualified attribute/capacity name
LABEL_VALUE_MAX_LENGTH = 63
_LABEL_NAME_MAX_LENGTH = 63

_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL_RE = re.compile(_DNS1123_LABEL)
_DNS1123_SUBDOMAIN_RE = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_C_IDENTIFIER_RE = re.compile("[A-Za-z_][A-Za-z0-9_]*")
_QUALIFIED_NAME_RE = re.compile("([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE_RE = re.compile("(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_UID_RE = re.compile("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# Semantic Versioning 2.0.0, exactly as resource/validation's semverRe.
_NUMERIC_ID = r"(0|[1-9]\d*)"
_PRERELEASE_ID = r"(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
_BUILD_ID = r"[0-9a-zA-Z-]+"
_SEMVER_RE = re.compile(
    rf"{_NUMERIC_ID}\.{_NUMERIC_ID}\.{_NUMERIC_ID}"
    rf"(-{_PRERELEASE_ID}(\.{_PRERELEASE_ID})*)?"
    rf"(\+{_BUILD_ID}(\.{_BUILD_ID})*)?",
    re.ASCII,
)

_DNS1123_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name', or '123-abc')"
)
_DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com')"
)
_C_IDENTIFIER_MSG = (
    "a valid C identifier must start with alphabetic character or '_', followed by a string "
    "of alphanumeric characters or '_' (e.g. 'my_name', or 'MY_NAME', or 'MyName')"
)
_QUALIFIED_NAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName', or 'my.name', or '123-abc')"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue', or 'my_value', "
    "or '12345')"
)


def _max_length(limit: int) -> str:
    return f"must be no more than {limit} characters"


@lru_cache(maxsize=4096)
def dns1123_label_errors(value: str) -> tuple[str, ...]:
    """Device, request, counter and counter-set names (upstream IsDNS1123Label)."""
    errors: list[str] = []
    if len(value) > DNS1123_LABEL_MAX_LENGTH:
        errors.append(_max_length(DNS1123_LABEL_MAX_LENGTH))
    if not _DNS1123_LABEL_RE.fullmatch(value):
        errors.append(_DNS1123_LABEL_MSG)
    return tuple(errors)


@lru_cache(maxsize=4096)
def dns1123_subdomain_errors(value: str) -> tuple[str, ...]:
    """Object, node and device-class names (upstream IsDNS1123Subdomain)."""
    errors: list[str] = []
    if len(value) > DNS1123_SUBDOMAIN_MAX_LENGTH:
        errors.append(_max_length(DNS1123_SUBDOMAIN_MAX_LENGTH))
    if not _DNS1123_SUBDOMAIN_RE.fullmatch(value):
        errors.append(_DNS1123_SUBDOMAIN_MSG)
    return tuple(errors)


@lru_cache(maxsize=1024)
def driver_name_errors(value: str) -> tuple[str, ...]:
    """A DRA driver name, checked like a CSI driver name (upstream ValidateCSIDriverName):
    at most 63 characters, and a DNS subdomain once lower-cased (upper case is accepted)."""
    if not value:
        return ("Required value",)
    errors: list[str] = []
    if len(value) > DRIVER_NAME_MAX_LENGTH:
        errors.append(_max_length(DRIVER_NAME_MAX_LENGTH))
    errors.extend(dns1123_subdomain_errors(value.lower()))
    return tuple(errors)


@lru_cache(maxsize=1024)
def pool_name_errors(value: str) -> tuple[str, ...]:
    """A pool name: at most 253 characters, one or more DNS subdomains separated by '/'."""
    if not value:
        return ("Required value",)
    errors: list[str] = []
    if len(value) > DNS1123_SUBDOMAIN_MAX_LENGTH:
        errors.append(_max_length(DNS1123_SUBDOMAIN_MAX_LENGTH))
    for part in value.split("/"):
        errors.extend(dns1123_subdomain_errors(part))
    return tuple(errors)


@lru_cache(maxsize=4096)
def c_identifier_errors(value: str) -> tuple[str, ...]:
    """The id part of a qualified attribute/capacity name: a C identifier of <= 32 characters."""
    errors: list[str] = []
    if len(value) > DEVICE_MAX_ID_LENGTH:
        errors.append(_max_length(DEVICE_MAX_ID_LENGTH))
    if not _C_IDENTIFIER_RE.fullmatch(value):
        errors.append(_C_IDENTIFIER_MSG)
    return tuple(errors)


@lru_cache(maxsize=4096)
def qualified_name_errors(name: str) -> tuple[str, ...]:
    """An attribute or capacity name: `<id>` or `<domain>/<id>` (DRA QualifiedName).

    The domain is checked like a driver name (<= 63 characters). Upstream silently accepts more
    than one '/'; such a name could never be looked up, so it is rejected here."""
    if not name:
        return ("Required value",)
    parts = name.split("/")
    if len(parts) == 1:
        return c_identifier_errors(name)
    if len(parts) > 2:
        return ("must be a C identifier, optionally prefixed by a domain and a single '/'",)
    domain, identifier = parts
    errors: list[str] = []
    if domain:
        errors.extend(driver_name_errors(domain))
    else:
        errors.append("the domain must not be empty")
    if identifier:
        errors.extend(c_identifier_errors(identifier))
    else:
        errors.append("the name must not be empty")
    return tuple(errors)


@lru_cache(maxsize=1024)
def fully_qualified_name_errors(name: str) -> tuple[str, ...]:
    """A qualified name that must carry a domain (matchAttribute, distinctAttribute)."""
    errors = list(qualified_name_errors(name))
    if name and "/" not in name:
        errors.append("a fully qualified name must be a domain and a name separated by a slash")
    return tuple(errors)


@lru_cache(maxsize=1024)
def label_name_errors(name: str) -> tuple[str, ...]:
    """A label key, taint key or node-selector key (upstream IsQualifiedName)."""
    parts = name.split("/")
    if len(parts) > 2:
        return (
            "a qualified name "
            + _QUALIFIED_NAME_MSG
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
        )
    errors: list[str] = []
    if len(parts) == 2:
        prefix, short = parts
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors.extend("prefix part " + e for e in dns1123_subdomain_errors(prefix))
    else:
        short = name
    if not short:
        errors.append("name part must be non-empty")
    elif len(short) > _LABEL_NAME_MAX_LENGTH:
        errors.append("name part " + _max_length(_LABEL_NAME_MAX_LENGTH))
    if not _QUALIFIED_NAME_RE.fullmatch(short):
        errors.append("name part " + _QUALIFIED_NAME_MSG)
    return tuple(errors)


@lru_cache(maxsize=1024)
def label_value_errors(value: str) -> tuple[str, ...]:
    """A label value, taint value or node-selector value (upstream IsValidLabelValue)."""
    errors: list[str] = []
    if len(value) > LABEL_VALUE_MAX_LENGTH:
        errors.append(_max_length(LABEL_VALUE_MAX_LENGTH))
    if not _LABEL_VALUE_RE.fullmatch(value):
        errors.append(_LABEL_VALUE_MSG)
    return tuple(errors)


@lru_cache(maxsize=1024)
def semver_errors(value: str) -> tuple[str, ...]:
    """A version attribute: Semantic Versioning 2.0.0, e.g. `580.126.20` or `1.2.3-rc.1+build`."""
    if _SEMVER_RE.fullmatch(value):
        return ()
    return ("must be a string compatible with semver.org spec 2.0.0",)


def uid_errors(value: str) -> tuple[str, ...]:
    """A share ID: an RFC 4122 UUID in normalized form (36 lower-case characters)."""
    if _UID_RE.fullmatch(value):
        return ()
    return (
        "uid must be in RFC 4122 normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with "
        "lowercase hexadecimal characters",
    )
