"""One place where a client calls the wire: channel, deadline, owner metadata, retries, errors.

`open_channel` is the one way every client of gpualloc (library, CLIs, agent, bridges, the
allocator's inventory feed, the load runner) dials: plaintext, TLS, mutual TLS, bearer token.

Every RPC of the client library goes through `Caller.call`, so the rules hold everywhere: each
attempt has the client's deadline; UNAVAILABLE is retried (any call), DEADLINE_EXCEEDED only
for reads, with the policy's backoff; a failure comes back as the typed error of
`services.common.errors` (via `error_from_rpc`), never as a grpc exception.
"""

from __future__ import annotations

import copy
import logging
import random as random_module
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc

from services.client.config import RetryPolicy, TlsConfig, check_token_needs_tls
from services.client.credentials import BearerTokenFile
from services.common.grpc_errors import error_from_rpc

__all__ = ["OWNER_METADATA", "TENANT_METADATA", "Caller", "is_retryable", "open_channel"]

OWNER_METADATA = "x-gpualloc-owner"
"""The call metadata the allocator reads the caller's owner from (it wins over request fields)."""
TENANT_METADATA = "x-gpualloc-tenant"
"""The call metadata naming the tenant a call acts for (a binding's actForTenants)."""

_ALWAYS_RETRIED = frozenset({grpc.StatusCode.UNAVAILABLE})
_RETRIED_FOR_READS = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

Response = TypeVar("Response")

log = logging.getLogger("gpualloc.client")


def is_retryable(code: grpc.StatusCode, *, read: bool) -> bool:
    """Whether a failed attempt may be repeated (see RetryPolicy for why)."""
    return code in (_RETRIED_FOR_READS if read else _ALWAYS_RETRIED)


RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)
"""gRPC's own wait before it dials again after a failed connection: 1 s by default (with
jitter, growing), so the RetryPolicy's attempts (0.1, 0.2, 0.4 s apart) all met the same failed
connection and a single connection closed at its start (a proxy, a restarting server) failed
the call: a Slurm prolog requeued its job, a node Epilog left its release to the lease. Now the
channel dials again as soon as the policy's backoff does (`test_a_retry_dials_again`)."""


def open_channel(
    target: str,
    tls: TlsConfig | None,
    *,
    token_file: Path | str | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A plaintext channel, or a TLS one (mutual when the config has a client certificate);
    with `token_file`, every call carries `authorization: Bearer <token>` (re-read when the
    file changes, see credentials.py). A token without TLS is refused (InvalidArgument).
    RECONNECT_OPTIONS unless `options` name them."""
    check_token_needs_tls(tls, token_file)
    given = {name for name, _ in options}
    options = [*options, *(option for option in RECONNECT_OPTIONS if option[0] not in given)]
    if tls is None:
        return grpc.insecure_channel(target, options=list(options))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.root_certificates,
        private_key=tls.client_key,
        certificate_chain=tls.client_certificate,
    )
    if token_file:
        token = grpc.metadata_call_credentials(BearerTokenFile(token_file), name="bearer-token")
        credentials = grpc.composite_channel_credentials(credentials, token)
    channel_options = list(options)
    if tls.server_name:
        channel_options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.secure_channel(target, credentials, options=channel_options)


class Caller:
    """Calls unary methods with the deadline, metadata and retry rules above."""

    def __init__(
        self,
        channel: grpc.Channel,
        *,
        deadline_seconds: float,
        retry: RetryPolicy,
        sleep: Callable[[float], None] = time.sleep,
        random: Callable[[], float] = random_module.random,
        tenant: str = "",
    ) -> None:
        """`tenant`: sent with every call (TENANT_METADATA) when set."""
        self.channel = channel
        self.deadline_seconds = deadline_seconds
        self.retry = retry
        self.tenant = tenant
        self._sleep = sleep
        self._random = random

    def for_tenant(self, tenant: str) -> Caller:
        """This caller with every call acting for `tenant`."""
        acting = copy.copy(self)
        acting.tenant = tenant
        return acting

    def metadata(self, owner: str = "") -> tuple[tuple[str, str], ...] | None:
        """The metadata of a call: the owner and the tenant, each when set."""
        pairs = ((OWNER_METADATA, owner), (TENANT_METADATA, self.tenant))
        return tuple((key, value) for key, value in pairs if value) or None

    def call(
        self,
        method: Callable[..., Response],
        request: Any,
        *,
        read: bool,
        owner: str = "",
    ) -> Response:
        """`method(request)` with retries; raises the typed error of the last attempt."""
        metadata = self.metadata(owner)
        attempt = 1
        while True:
            try:
                return method(request, timeout=self.deadline_seconds, metadata=metadata)
            except grpc.RpcError as error:
                code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
                if attempt >= self.retry.max_attempts or not is_retryable(code, read=read):
                    raise error_from_rpc(error) from None
                delay = self.retry.delay(attempt, self._random)
                log.debug("attempt %d failed with %s; retrying in %.3fs", attempt, code, delay)
                self._sleep(delay)
                attempt += 1
