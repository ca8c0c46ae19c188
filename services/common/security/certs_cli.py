"""`gpualloc certs`: a throwaway CA and certificates for development, tests and docker compose.

    gpualloc certs --out certs --server inventory:localhost,127.0.0.1 --client ops-admin
    gpualloc certs --out certs --client slurm-bridge:spiffe://fleet.example/ns/slurm/sa/bridge
    gpualloc certs --out certs --client node-1:node-1.agents.fleet.example

Creates a CA in `--out DIR` (`DIR/ca.crt`, `DIR/ca.key`), or reuses it when `DIR/ca.key`
exists, then issues each certificate into `DIR/NAME/` with cert-manager's names: `tls.crt` (the
leaf, then the CA), `tls.key` (mode 0600) and `ca.crt`. Issuing a NAME again replaces its files
(a rotation the servers pick up); the CA stays.

`--server NAME[:SAN,...]`: a server certificate (server and client usage: the allocator is the
inventory's client too) with NAME as its CN and first DNS name, plus the SANs given (DNS names,
IP addresses). `--client NAME[:SAN,...]`: a client certificate with NAME as its CN and the SANs
given: `spiffe://` URIs, DNS names, IP addresses; none leaves the CN as its only identity.
`=` or `,` may stand for the `:` (`--client NAME=spiffe://...`, `--server NAME,SAN`). Every
input is checked before anything is written. Exit codes: 0 written, 2 invalid input or an
unreadable CA (nothing written), 1 a file could not be written.

This is not a PKI: production uses cert-manager (deploy/k8s) or the site's own CA.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

from services.common.security.devcerts import CertificateAuthority, write_certificate

__all__ = ["EXIT_FAILED", "EXIT_INVALID", "CertificateSpec", "parse_spec", "register", "run_certs"]

EXIT_FAILED = 1
EXIT_INVALID = 2

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_RESERVED_NAMES = frozenset({"ca.crt", "ca.key"})


class CertsError(ValueError):
    """Bad input for `gpualloc certs`: the message says which argument and why."""


@dataclass(frozen=True)
class CertificateSpec:
    """One certificate to issue: its name (CN and directory) and its SANs, sorted by kind."""

    name: str
    server: bool
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    uris: tuple[str, ...] = field(default=())


def parse_spec(text: str, *, server: bool) -> CertificateSpec:
    """`NAME[:SAN,SAN...]` (or `NAME=SAN,...`, `NAME,SAN,...`) as a CertificateSpec; CertsError
    when invalid."""
    flag = "--server" if server else "--client"
    name, separator, rest = _split_name(text)
    if not _NAME.fullmatch(name) or name in _RESERVED_NAMES:
        raise CertsError(
            f"{flag} {text!r}: the name must be 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (it names the certificate's directory)"
        )
    sans = [s.strip() for s in rest.split(",")] if separator else []
    if separator and not all(sans):
        raise CertsError(f"{flag} {text!r}: empty SAN (write NAME:SAN,SAN,...)")
    dns: list[str] = [name] if server else []
    ips: list[str] = []
    uris: list[str] = []
    for san in sans:
        kind = _san_kind(san)
        if kind == "uri":
            if server:
                raise CertsError(f"{flag} {text!r}: {san!r}: servers take DNS names and IPs")
            _check_spiffe(flag, text, san)
            uris.append(san)
        elif kind == "ip":
            ips.append(str(ipaddress.ip_address(san)))
        else:
            _check_dns(flag, text, san)
            dns.append(san.lower())
    return CertificateSpec(
        name=name,
        server=server,
        dns_names=tuple(dict.fromkeys(dns)),
        ip_addresses=tuple(dict.fromkeys(ips)),
        uris=tuple(dict.fromkeys(uris)),
    )


def _split_name(text: str) -> tuple[str, str, str]:
    """NAME, separator, rest: split at the first ':', '=' or ',' (a name holds none)."""
    positions = [i for i in (text.find(":"), text.find("="), text.find(",")) if i >= 0]
    if not positions:
        return text, "", ""
    at = min(positions)
    return text[:at], text[at], text[at + 1 :]


def _san_kind(san: str) -> str:
    if "://" in san:
        return "uri"
    try:
        ipaddress.ip_address(san)
    except ValueError:
        return "dns"
    return "ip"


def _check_spiffe(flag: str, text: str, san: str) -> None:
    parts = urlsplit(san)
    if (
        parts.scheme != "spiffe"
        or not parts.netloc
        or parts.query
        or parts.fragment
        or not all(_DNS_LABEL.fullmatch(label) for label in parts.netloc.split("."))
        or "//" in parts.path
    ):
        raise CertsError(
            f"{flag} {text!r}: {san!r} is not a SPIFFE ID (spiffe://trust-domain/path)"
        )


def _check_dns(flag: str, text: str, san: str) -> None:
    labels = san.split(".")
    if labels[0] == "*" and len(labels) > 1:  # one leading wildcard label, as in TLS
        labels = labels[1:]
    if len(san) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        raise CertsError(
            f"{flag} {text!r}: {san!r} is not a DNS name, an IP address or a spiffe:// URI"
        )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "certs",
        help="make a throwaway CA and server/client certificates (dev, tests, compose)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="where the CA and certs go")
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="NAME[:SAN,...]",
        help="a server certificate (DNS names, IPs); repeatable",
    )
    parser.add_argument(
        "--client",
        action="append",
        default=[],
        metavar="NAME[:SAN,...]",
        help="a client certificate (spiffe:// URIs, DNS names, IPs; none: the CN); repeatable",
    )
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    return run_certs(Path(args.out), servers=args.server, clients=args.client)


def run_certs(
    out: Path,
    *,
    servers: Sequence[str] = (),
    clients: Sequence[str] = (),
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Issue the certificates; prints what it wrote and the settings that use them."""
    so, se = stdout or sys.stdout, stderr or sys.stderr
    try:
        specs = _parse_all(servers, clients)
        authority, created = _authority(out)
    except CertsError as error:
        print(f"gpualloc certs: {error}", file=se)
        return EXIT_INVALID
    try:
        if created:
            authority.save(out)
        verb = "created" if created else "reused"
        print(f"{verb} CA {out / 'ca.crt'} (key {out / 'ca.key'})", file=so)
        for spec in specs:
            issued = authority.issue(
                spec.name,
                dns_names=spec.dns_names,
                ip_addresses=spec.ip_addresses,
                uris=spec.uris,
                server=spec.server,
                client=True,
            )
            directory = write_certificate(out / spec.name, issued)
            _describe(spec, directory, out, so)
    except OSError as error:
        print(f"gpualloc certs: cannot write: {error}", file=se)
        return EXIT_FAILED
    return 0


def _parse_all(servers: Sequence[str], clients: Sequence[str]) -> list[CertificateSpec]:
    specs = [parse_spec(s, server=True) for s in servers]
    specs += [parse_spec(c, server=False) for c in clients]
    if not specs:
        raise CertsError("nothing to issue: give --server and/or --client")
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise CertsError(f"{spec.name!r} is named twice (each name is one directory)")
        seen.add(spec.name)
    return specs


def _authority(out: Path) -> tuple[CertificateAuthority, bool]:
    """The CA in `out` (reused when its key is there) and whether it is new."""
    if out.exists() and not out.is_dir():
        raise CertsError(f"--out {out}: not a directory")
    if (out / "ca.key").exists():
        try:
            return CertificateAuthority.load(out), False
        except (OSError, ValueError, TypeError) as error:
            raise CertsError(f"cannot reuse the CA in {out}: {error}") from None
    if (out / "ca.crt").exists():
        raise CertsError(
            f"{out / 'ca.crt'} exists without its key ca.key: refusing to replace that CA "
            "(certificates it signed would stop verifying); use another --out"
        )
    return CertificateAuthority.create(), True


def _describe(spec: CertificateSpec, directory: Path, out: Path, stdout: TextIO) -> None:
    sans = [f"DNS:{d}" for d in spec.dns_names] + [f"IP:{i}" for i in spec.ip_addresses]
    sans += [f"URI:{u}" for u in spec.uris]
    kind = "server" if spec.server else "client"
    print(f"{kind} {spec.name}: {directory}/{{tls.crt,tls.key,ca.crt}}", file=stdout)
    print(f"  CN={spec.name}" + (f" SAN {', '.join(sans)}" if sans else ""), file=stdout)
    if spec.server:
        print(f"  GPUALLOC_TLS_CERT={directory / 'tls.crt'}", file=stdout)
        print(f"  GPUALLOC_TLS_KEY={directory / 'tls.key'}", file=stdout)
        print(f"  GPUALLOC_TLS_CLIENT_CA={out / 'ca.crt'}", file=stdout)
    else:
        print(f"  GPUALLOC_CLIENT_TLS_CA={out / 'ca.crt'}", file=stdout)
        print(f"  GPUALLOC_CLIENT_TLS_CERT={directory / 'tls.crt'}", file=stdout)
        print(f"  GPUALLOC_CLIENT_TLS_KEY={directory / 'tls.key'}", file=stdout)
