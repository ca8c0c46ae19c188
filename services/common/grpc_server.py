"""Build and run a gpualloc gRPC server the same way for every service.

`create_server` returns an unstarted `(server, port)` so tests can bind `127.0.0.1:0` and learn
the port. Every server gets:

* a thread pool of `settings.max_workers` (sync grpc: the solver is CPU-bound Python, so scale
  with replicas, not threads);
* interceptors, outermost first: error mapping (typed errors -> status codes), any extra ones
  (telemetry) given by the caller, then authentication and authorization
  (`services.common.security.edge`: the call's principal, checked against each method's access
  rule, before the servicer runs);
* TLS when the settings name a certificate (mutual TLS with a client CA), the files reloaded
  when they change; plaintext otherwise, which a non-loopback address refuses unless
  `insecure` (an exposed port without TLS or a policy lets anyone act as any tenant);
* optionally a second, plaintext server with only the health service (`health_listen_address`)
  for probes that cannot do TLS (kubelet's gRPC probes);
* message size limits (oversized requests fail with RESOURCE_EXHAUSTED before reaching code),
  a per-connection stream limit, keepalive and a maximum connection age so that long-lived
  HTTP/2 connections rebalance across replicas behind a Kubernetes Service;
* the standard health service, each registered service (and "" for the whole server) SERVING;
* server reflection listing every registered service, health and reflection (grpcurl, ghz).

Call deadlines. A sync grpc server cannot preempt a running handler thread, so a cap is a budget
the service layer honours, not a kill switch: a servicer turns each call's deadline into a value,
`call_deadline(context, cap)` = now + min(client deadline, cap) with a flag set when the call
ends or is cancelled, and passes it down explicitly (services.common.deadline: the solver's
budget, waits, and `Deadline.check()` before store calls, which raises DeadlineExceeded for the
error interceptor to map). The allocator's cap is `settings.max_call_seconds`; streaming
responses (watches) are bounded by the client's deadline only; `stop()` ends them at shutdown.

`serve_until_signal` blocks until SIGTERM/SIGINT, then reports NOT_SERVING and drains.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_reflection.v1alpha import reflection

from services.common.admission import Admission, AdmissionLimits
from services.common.config import ServerSettings
from services.common.deadline import Deadline, Ended
from services.common.errors import FailedPrecondition
from services.common.grpc_errors import (
    ErrorMappingInterceptor,
)
from services.common.health import SERVICE_NAME as HEALTH_SERVICE_NAME
from services.common.health import Health, graceful_shutdown
from services.common.security.edge import (
    AccessRule,
    Authenticator,
    AuthInterceptor,
    check_exposure,
)
from services.common.security.tls import ServerTls, server_credentials

__all__ = [
    "ServiceRegistration",
    "call_deadline",
    "create_server",
    "security_summary",
    "serve_until_signal",
]

_KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 60_000),  # ping idle clients every minute: find dead peers
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),  # clients may ping every 10 s
    ("grpc.max_connection_age_ms", 300_000),  # reconnect every 5 min: rebalance across replicas
    ("grpc.max_connection_age_grace_ms", 30_000),
)
_SIGNAL_POLL_SECONDS = 0.2

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceRegistration:
    """One service to serve: its full proto name and how to add its servicer.

    `add_to_server` is the generated `add_XxxServicer_to_server(servicer, server)`. `access`
    maps each full method name (`/pkg.Service/Method`) to the access it needs; under an access
    policy a method without one is denied.
    """

    name: str
    add_to_server: Callable[[Any, grpc.Server], None]
    servicer: object
    access: Mapping[str, AccessRule] = field(default_factory=dict)


def security_summary(settings: ServerSettings) -> str:
    """One line on how a server with these settings is exposed (its first log line)."""
    if settings.tls_client_ca_file:
        transport = "mutual TLS"
    elif settings.tls:
        transport = "TLS"
    else:
        transport = "plaintext"
    if settings.auth_policy_file:
        identities = f"identities from certificates/tokens under {settings.auth_policy_file}"
    else:
        identities = "development mode: the x-gpualloc-owner header is believed, all allowed"
    return f"{transport} on {settings.listen_address}; {identities}"


def create_server(
    address: str,
    services: Sequence[ServiceRegistration],
    settings: ServerSettings,
    *,
    health: Health | None = None,
    interceptors: Sequence[grpc.ServerInterceptor] = (),
    reuse_port: bool = False,
) -> tuple[grpc.Server, int]:
    """An unstarted server listening on `address`; returns it and the bound port.

    Pass `health` to change statuses later (and to `serve_until_signal`); otherwise a private one
    is used. `reuse_port` lets several worker processes listen on one port (SO_REUSEPORT: the
    kernel spreads connections over them); otherwise binding a busy port fails. Raises
    FailedPrecondition when the address cannot be bound.
    """
    names = [service.name for service in services]
    if len(set(names)) != len(names):
        raise ValueError(f"a service is registered twice: {sorted(names)}")
    exposure = check_exposure(
        address,
        tls=settings.tls,
        policy=bool(settings.auth_policy_file),
        insecure=settings.insecure,
    )
    authenticator = Authenticator(settings.auth_policy_file)
    rules = {method: r for service in services for method, r in service.access.items()}
    per_caller, per_tenant = settings.caller_limits
    admission = Admission(
        AdmissionLimits(
            settings.max_streams,
            per_caller,
            per_tenant,
            per_tenant_streams=settings.tenant_stream_limit,
        )
    )
    health = health if health is not None else Health()
    server: grpc.Server = grpc.server(
        futures.ThreadPoolExecutor(
            # streams hold a thread each while open: they get their own share (admission.py)
            max_workers=settings.max_workers + settings.max_streams,
            thread_name_prefix="grpc-worker",
        ),
        interceptors=[
            ErrorMappingInterceptor(),
            *interceptors,
            AuthInterceptor(authenticator, rules, admission),
        ],
        options=[
            ("grpc.max_receive_message_length", settings.max_receive_message_bytes),
            ("grpc.max_send_message_length", settings.max_send_message_bytes),
            ("grpc.max_concurrent_streams", settings.max_concurrent_streams),
            ("grpc.so_reuseport", 1 if reuse_port else 0),  # grpc reads the first occurrence
            *_KEEPALIVE_OPTIONS,
        ],
    )
    for service in services:
        service.add_to_server(service.servicer, server)
        health.set_serving(service.name)
    health.add_to_server(server)
    reflection.enable_server_reflection(
        [*names, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME], server, pool=_MethodSymbolPool()
    )
    port = _listen(server, address, settings)
    if exposure is not None:
        _log.warning("%s", exposure)
    _log.info(
        "gRPC server on %s (port %d) serving %s (%s)",
        address,
        port,
        ", ".join(names),
        security_summary(replace(settings, listen_address=address)),
    )
    if settings.health_listen_address:
        server = _with_health_port(server, health, settings)
    return server, port


class _MethodSymbolPool:
    """The default descriptor pool for reflection, which also finds the file of a method's
    name (`grpc.health.v1.Health.Check`). ghz asks for the method itself; protobuf's upb pool
    only knows messages, enums, services and extensions, so ghz's `--call` failed with "Symbol
    not found" (tests/integration/test_doc_commands_real.py runs the real ghz)."""

    def __init__(self) -> None:
        self._pool = descriptor_pool.Default()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def FindFileContainingSymbol(self, symbol: str) -> FileDescriptor:  # noqa: N802 - the pool's
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            service, _, method = symbol.rpartition(".")
            try:
                found = self._pool.FindServiceByName(service)
            except KeyError:
                raise KeyError(symbol) from None
            if method not in found.methods_by_name:
                raise KeyError(symbol) from None
            return found.file


def _listen(server: grpc.Server, address: str, settings: ServerSettings) -> int:
    try:
        if settings.tls:
            credentials = server_credentials(
                ServerTls(
                    settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file
                )
            )
            return server.add_secure_port(address, credentials)
        return server.add_insecure_port(address)
    except RuntimeError:  # grpc says only "Failed to bind"; core logs the errno
        raise FailedPrecondition(
            f"cannot listen on {address}: the address is in use or not local"
        ) from None


def _with_health_port(main: grpc.Server, health: Health, settings: ServerSettings) -> grpc.Server:
    probe = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="grpc-health"),
        options=[("grpc.so_reuseport", 0)],
    )
    health.add_to_server(probe)
    # reflection of the health service alone, so `grpcurl -plaintext HOST:PORT
    # grpc.health.v1.Health/Check` works there as docs/deploy.md shows (nothing else is served)
    reflection.enable_server_reflection(
        [HEALTH_SERVICE_NAME, reflection.SERVICE_NAME], probe, pool=_MethodSymbolPool()
    )
    address = settings.health_listen_address
    try:
        port = probe.add_insecure_port(address)
    except RuntimeError:
        raise FailedPrecondition(
            f"cannot listen on {address} (GPUALLOC_HEALTH_LISTEN): in use or not local"
        ) from None
    _log.info("health-only plaintext server on %s (port %d)", address, port)
    return _ServerWithHealthPort(main, probe, port)


class _ServerWithHealthPort(grpc.Server):
    """The main server, with the health-only server started and stopped beside it."""

    def __init__(self, main: grpc.Server, probe: grpc.Server, probe_port: int) -> None:
        self._main = main
        self._probe = probe
        self.health_port = probe_port

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Any) -> None:
        self._main.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: Any, method_handlers: Any) -> None:
        self._main.add_registered_method_handlers(service_name, method_handlers)

    def add_insecure_port(self, address: str) -> int:
        return self._main.add_insecure_port(address)

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        return self._main.add_secure_port(address, server_credentials)

    def start(self) -> None:
        self._probe.start()
        self._main.start()

    def stop(self, grace: float | None) -> threading.Event:
        self._probe.stop(grace)
        return self._main.stop(grace)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._main.wait_for_termination(timeout)


def serve_until_signal(
    server: grpc.Server,
    health: Health,
    grace_seconds: float,
    signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
) -> int | None:
    """Block until one of `signals` (main thread only), then shut down gracefully.

    Returns the signal received, or None if the server stopped by other means. The previous
    handlers are back before draining starts, so a second Ctrl-C interrupts a slow drain.
    """
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in signals}
    try:
        while not received:
            if not server.wait_for_termination(timeout=_SIGNAL_POLL_SECONDS):
                return None  # the server stopped without a signal
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _log.info("received %s", signal.Signals(received[0]).name)
    graceful_shutdown(server, health, grace_seconds)
    return received[0]


# --- call deadlines ---------------------------------------------------------------------------


def call_deadline(context: grpc.ServicerContext, cap: float | None = None) -> Deadline:
    """The call's deadline as a value, for the servicer to pass down: now + the shorter of the
    client's deadline and `cap` (None: no bound without a client deadline), and a flag
    (`Ended`) that grpc sets when the call ends, in particular when its client cancels it or
    goes away, so that work done for it can stop at once."""
    ended = Ended()
    context.add_callback(ended.set)  # grpc calls it on completion and on cancellation
    return Deadline(_deadline(context, cap), ended)


_NO_CLIENT_DEADLINE = 1e9  # grpc reports ~9.2e18 s remaining when the client set none


def _deadline(context: grpc.ServicerContext, cap: float | None) -> float | None:
    client = context.time_remaining()
    budget = client if client is not None and client < _NO_CLIENT_DEADLINE else None
    if cap is not None:
        budget = cap if budget is None else min(budget, cap)
    return None if budget is None else time.monotonic() + budget
