"""`gpualloc policy check FILE`: load an AccessPolicy as the servers do, without a server.

    gpualloc policy check /etc/gpualloc/policy.yaml            # valid? what is left out?
    gpualloc policy check policy.yaml -o yaml > native.yaml    # the quotas in gpualloc's form

The policy file and the Kueue files it names (spec.quota.kueue, docs/tenancy.md) are read and
checked exactly as a server loads them (policy_files.load_policy). A valid policy prints one
line, then one line per thing gpualloc leaves out on purpose (Kueue resources it does not
enforce, Kueue objects left to Kueue); an invalid one prints every violation, each naming the
file, the object and the field, and exits 2. `-o yaml|json` prints the policy with its quota
section in gpualloc's own form instead (the translation of the Kueue objects), which loads to
the same quotas.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from services.common.errors import InvalidArgument
from services.common.security.policy import AccessPolicy
from services.common.security.policy_files import load_policy

__all__ = ["native_document", "register"]

EXIT_INVALID = 2


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "policy",
        help="check an AccessPolicy file (and the Kueue files it names) as a server loads it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    check = verbs.add_parser("check", help="load the policy; print what is wrong or left out")
    check.add_argument("file", metavar="FILE", help="the AccessPolicy file")
    check.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json"),
        help="print the policy with its quotas in gpualloc's own form",
    )
    check.set_defaults(func=_check)


def _check(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        contents = path.read_bytes()
    except OSError as error:
        print(f"gpualloc policy: {path}: {error.strerror}", file=sys.stderr)
        return EXIT_INVALID
    try:
        loaded = load_policy(str(path), contents)
    except InvalidArgument as error:
        for violation in error.violations or (error.message,):
            text = " ".join(str(violation).split())  # one line each (a YAML error spans several)
            where = "" if text.startswith(str(path)) else f"{path}: "
            print(f"gpualloc policy: {where}{text}", file=sys.stderr)
        return EXIT_INVALID
    policy = loaded.policy
    if args.output:
        document = native_document(yaml.safe_load(contents.decode("utf-8")), policy)
        if args.output == "json":
            print(json.dumps(document, indent=2))
        else:
            print(yaml.safe_dump(document, sort_keys=False), end="")
        return 0
    limited = len(policy.quotas.tenants)
    print(
        f"{path}: valid: {len(policy.tenants)} tenants ({limited} with quotas), "
        f"{len(policy.bindings)} bindings"
        + (", quotas from Kueue objects" if policy.kueue is not None else "")
    )
    for note in policy.kueue.notes() if policy.kueue is not None else ():
        print(f"  {note}")
    return 0


def native_document(document: Any, policy: AccessPolicy) -> Any:
    """The policy `document` with `spec.quota.kueue` replaced by the native quota section and
    tenants it was translated into (unchanged when it has none)."""
    if policy.kueue is None:
        return document
    spec = dict(document["spec"])
    quota = {k: v for k, v in spec.get("quota", {}).items() if k != "kueue"}
    spec["quota"] = {**quota, **_plain(policy.kueue.quota)}
    listed = {t["name"]: t for t in spec.get("tenants", []) if isinstance(t, dict)}
    tenants = []
    for name, tenant in listed.items():
        tenants.append({**tenant, **_plain(policy.kueue.tenants.get(name, {}))})
    for name, fields in policy.kueue.tenants.items():
        if name not in listed:
            tenants.append({"name": name, **_plain(fields)})
    spec["tenants"] = tenants
    return {**document, "spec": spec}


def _plain(value: Any) -> Any:
    """Mappings and sequences as dicts and lists (what yaml.safe_dump and json take)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
