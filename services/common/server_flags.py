"""The command-line flags every server shares for TLS and identities (they win over env)."""

from __future__ import annotations

import argparse
from dataclasses import replace

from services.common.config import ServerSettings

__all__ = ["add_security_flags", "metrics_listen_source", "with_security_flags"]


def add_security_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS and identities (docs/security.md)")
    group.add_argument("--tls-cert", metavar="PEM", help="server certificate (GPUALLOC_TLS_CERT)")
    group.add_argument("--tls-key", metavar="PEM", help="its private key (GPUALLOC_TLS_KEY)")
    group.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        help="CA of client certificates: require mutual TLS (GPUALLOC_TLS_CLIENT_CA)",
    )
    group.add_argument(
        "--auth-policy",
        metavar="YAML",
        help="AccessPolicy file: identities -> tenants and roles (GPUALLOC_AUTH_POLICY)",
    )
    group.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow a non-loopback address without TLS or a policy (GPUALLOC_INSECURE)",
    )
    group.add_argument(
        "--health-listen",
        metavar="ADDR",
        help="extra plaintext health-only host:port for probes (GPUALLOC_HEALTH_LISTEN)",
    )
    group.add_argument(
        "--metrics-listen",
        metavar="ADDR",
        help="plaintext HTTP host:port serving Prometheus /metrics (GPUALLOC_METRICS_LISTEN)",
    )


def with_security_flags(settings: ServerSettings, args: argparse.Namespace) -> ServerSettings:
    """`settings` with the flags that were given; the same pairing rules as the env."""
    changes = {
        field: value
        for field, value in (
            ("tls_cert_file", args.tls_cert),
            ("tls_key_file", args.tls_key),
            ("tls_client_ca_file", args.tls_client_ca),
            ("auth_policy_file", args.auth_policy),
            ("insecure", args.insecure),
            ("health_listen_address", args.health_listen),
            ("metrics_listen_address", args.metrics_listen),
        )
        if value is not None
    }
    updated = replace(settings, **changes)
    return ServerSettings.checked(updated)


def metrics_listen_source(args: argparse.Namespace) -> str:
    """Where the metrics address came from, for its errors: the flag when given (it wins over
    GPUALLOC_METRICS_LISTEN, whose value is then ignored), else the variable."""
    if getattr(args, "metrics_listen", None) is not None:
        return "--metrics-listen"
    return "GPUALLOC_METRICS_LISTEN"
