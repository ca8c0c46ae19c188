"""The client commands' TLS and identity flags, defined once: every CLI that dials a server.

    parser = argparse.ArgumentParser(...)
    add_client_flags(parser)
    args = parser.parse_args()
    settings = client_settings(args, os.environ)      # ClientSettings: tls, token_file, ...

Flags: `--tls-ca --tls-cert --tls-key --tls-server-name --token-file`. Each defaults to its
environment variable (GPUALLOC_CLIENT_TLS_CA / _CERT / _KEY / _SERVER_NAME,
GPUALLOC_CLIENT_TOKEN_FILE) and overrides it when given, so a Deployment sets the variables once
and a person at a shell types a flag. A flag is applied by putting it in the environment that
`ClientSettings.from_env` reads, so flags and variables share one parser and one set of checks
(a token without TLS, a certificate without its key, an unreadable file).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from services.client.config import ClientSettings

__all__ = ["CLIENT_FLAGS", "add_client_flags", "client_environ", "client_settings"]

CLIENT_FLAGS: dict[str, tuple[str, str, str]] = {
    # flag -> (argparse dest, environment variable, help)
    "--tls-ca": (
        "tls_ca",
        "GPUALLOC_CLIENT_TLS_CA",
        "PEM CA bundle the server's certificate must chain to (turns TLS on)",
    ),
    "--tls-cert": (
        "tls_cert",
        "GPUALLOC_CLIENT_TLS_CERT",
        "PEM client certificate chain: with --tls-key, mutual TLS",
    ),
    "--tls-key": ("tls_key", "GPUALLOC_CLIENT_TLS_KEY", "PEM private key of --tls-cert"),
    "--tls-server-name": (
        "tls_server_name",
        "GPUALLOC_CLIENT_TLS_SERVER_NAME",
        "name to check the server's certificate against (default: the host dialed)",
    ),
    "--token-file": (
        "token_file",
        "GPUALLOC_CLIENT_TOKEN_FILE",
        "file holding a bearer JWT, sent as `authorization: Bearer` and re-read when it "
        "changes (TLS only)",
    ),
}


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    """Add the flags above, as one help group."""
    group = parser.add_argument_group("TLS and identity (flags override the variables)")
    for flag, (dest, variable, text) in CLIENT_FLAGS.items():
        metavar = "NAME" if flag == "--tls-server-name" else "PATH"
        group.add_argument(flag, dest=dest, metavar=metavar, help=f"{text}; env {variable}")


def client_environ(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with the given flags written over their variables."""
    merged = dict(environ)
    for dest, variable, _ in CLIENT_FLAGS.values():
        value = getattr(args, dest, None)
        if value:
            merged[variable] = value
    return merged


def client_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> ClientSettings:
    """ClientSettings from the environment with the flags over it (InvalidArgument on bad ones)."""
    return ClientSettings.from_env(client_environ(args, environ))
