"""Real certificates and real TLS servers for tests (registered in tests/conftest.py).

    def test_mtls(pki, tls_server):
        served = tls_server(pki)                       # mTLS required, records every call
        with open_channel(served.target, pki.client_tls()) as channel:
            ...
        assert served.calls[-1].peer_uris == (pki.client_uri,)

`pki` (fixture): a fresh CA under tmp_path with a `server` certificate (DNS `localhost`,
`gpualloc.test`, IP 127.0.0.1) and a `client` certificate (SPIFFE URI `client_uri`, DNS
`client.test`), written with cert-manager's names by services/common/security/devcerts.py.
`Pki.create(directory)` makes another one (a foreign CA for wrong-CA tests); `pki.issue(...)`
more leaves.

`tls_server` (fixture): `tls_server(pki, registrations=(), require_client_auth=True,
interceptors=())` starts a grpc server on 127.0.0.1:0 with the pki's server certificate, health
(grpc.health.v1, SERVING), server reflection, the given services (ServiceRegistration), and a
catch-all handler that answers any other unary method
with an empty message (which decodes as the default response of every method) and records the
call: its method, metadata and TLS peer (`RecordedCall`). Every served call, the registered
ones included, is recorded, so a test can assert on what reached the server. The lead's
`create_server` with TLS settings replaces the server part once it exists; the pki stays.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from grpc_reflection.v1alpha import reflection

from services.client.config import TlsConfig
from services.common.grpc_server import ServiceRegistration
from services.common.health import Health
from services.common.security.devcerts import CertificateAuthority, write_certificate

__all__ = ["CertFiles", "Pki", "RecordedCall", "TlsServer", "pki", "tls_server"]

CLIENT_URI = "spiffe://gpualloc.test/ns/tests/sa/client"
SERVER_NAMES = ("localhost", "gpualloc.test")
HEALTH_SERVICE = "grpc.health.v1.Health"


@dataclass(frozen=True)
class CertFiles:
    """One issued certificate on disk: `<directory>/tls.crt`, `tls.key`, `ca.crt`."""

    directory: Path

    @property
    def cert(self) -> Path:
        return self.directory / "tls.crt"

    @property
    def key(self) -> Path:
        return self.directory / "tls.key"

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"


@dataclass(frozen=True)
class Pki:
    """A CA (`ca`: its certificate file) with a server and a client certificate."""

    directory: Path
    authority: CertificateAuthority
    server: CertFiles
    client: CertFiles
    client_uri: str = CLIENT_URI

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    @classmethod
    def create(cls, directory: Path) -> Pki:
        authority = CertificateAuthority.create()
        authority.save(directory)
        server = authority.issue(
            "gpualloc-server", dns_names=SERVER_NAMES, ip_addresses=("127.0.0.1",), client=False
        )
        client = authority.issue(
            "gpualloc-client", dns_names=("client.test",), uris=(CLIENT_URI,), server=False
        )
        return cls(
            directory,
            authority,
            CertFiles(write_certificate(directory / "server", server)),
            CertFiles(write_certificate(directory / "client", client)),
        )

    def issue(self, name: str, **names: Any) -> CertFiles:
        """Another leaf (devcerts `issue` keywords: dns_names, ip_addresses, uris, ...)."""
        return CertFiles(
            write_certificate(self.directory / name, self.authority.issue(name, **names))
        )

    def client_tls(
        self,
        client: CertFiles | None = None,
        *,
        mutual: bool = True,
        server_name: str | None = None,
    ) -> TlsConfig:
        """A client config trusting this CA; with the `client` certificate unless `mutual` is
        false (or another certificate given)."""
        chosen = client or (self.client if mutual else None)
        return TlsConfig.from_files(
            str(self.ca),
            str(chosen.cert) if chosen else None,
            str(chosen.key) if chosen else None,
            server_name,
        )

    def server_credentials(self, *, require_client_auth: bool = True) -> grpc.ServerCredentials:
        pair = (self.server.key.read_bytes(), self.server.cert.read_bytes())
        return grpc.ssl_server_credentials(
            [pair],
            root_certificates=self.ca.read_bytes() if require_client_auth else None,
            require_client_auth=require_client_auth,
        )


@dataclass(frozen=True)
class RecordedCall:
    """What one call brought to the server."""

    method: str
    metadata: dict[str, str]
    auth_context: dict[str, tuple[bytes, ...]]

    @property
    def authorization(self) -> str:
        return self.metadata.get("authorization", "")

    @property
    def peer_uris(self) -> tuple[str, ...]:
        """The client certificate's URI SANs (gRPC's `x509_subject_alternative_name` holds
        every SAN; URIs are the ones with a scheme)."""
        names = self.auth_context.get("x509_subject_alternative_name", ())
        return tuple(n.decode() for n in names if b"://" in n)

    @property
    def peer_common_name(self) -> str:
        values = self.auth_context.get("x509_common_name", ())
        return values[0].decode() if values else ""


@dataclass
class TlsServer:
    server: grpc.Server
    port: int
    calls: list[RecordedCall] = field(default_factory=list)

    @property
    def target(self) -> str:
        """127.0.0.1:<port>: the server certificate has the IP SAN, so no name override."""
        return f"127.0.0.1:{self.port}"

    @property
    def localhost(self) -> str:
        return f"localhost:{self.port}"


def _record(
    calls: list[RecordedCall], lock: threading.Lock, method: str, context: grpc.ServicerContext
) -> None:
    metadata = {key: str(value) for key, value in context.invocation_metadata()}
    # At run time each value is a list of bytes (the stubs say bytes).
    found = cast(Mapping[str, Sequence[bytes]], context.auth_context())
    auth = {key: tuple(values) for key, values in found.items()}
    with lock:
        calls.append(RecordedCall(method, metadata, auth))


class _Recording(grpc.ServerInterceptor):
    """Records every call (registered services too) once its context exists."""

    def __init__(self, calls: list[RecordedCall]) -> None:
        self._calls = calls
        self._lock = threading.Lock()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(details)
        method = details.method
        if handler is None:
            handler = grpc.unary_unary_rpc_method_handler(lambda request, context: b"")
        return _wrapped(handler, method, self._calls, self._lock)


def _wrapped(
    handler: grpc.RpcMethodHandler[Any, Any],
    method: str,
    calls: list[RecordedCall],
    lock: threading.Lock,
) -> grpc.RpcMethodHandler[Any, Any]:
    def note(context: grpc.ServicerContext) -> None:
        if not method.startswith("/grpc.reflection."):
            _record(calls, lock, method, context)

    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
            note(context)
            return inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary_unary, handler.request_deserializer, handler.response_serializer
        )
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            note(context)
            yield from inner_us(request, context)

        return grpc.unary_stream_rpc_method_handler(
            unary_stream, handler.request_deserializer, handler.response_serializer
        )
    if handler.stream_stream is not None:
        inner_ss = handler.stream_stream

        def stream_stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            note(context)
            yield from inner_ss(requests, context)

        return grpc.stream_stream_rpc_method_handler(
            stream_stream, handler.request_deserializer, handler.response_serializer
        )
    return handler


TlsServerFactory = Callable[..., TlsServer]


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki.create(tmp_path / "pki")


@pytest.fixture
def tls_server() -> Iterator[TlsServerFactory]:
    servers: list[grpc.Server] = []

    def start(
        pki: Pki,
        registrations: Sequence[ServiceRegistration] = (),
        *,
        require_client_auth: bool = True,
        interceptors: Sequence[grpc.ServerInterceptor] = (),
    ) -> TlsServer:
        calls: list[RecordedCall] = []
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8),
            interceptors=[_Recording(calls), *interceptors],
        )
        health = Health()
        health.add_to_server(server)
        for registration in registrations:
            registration.add_to_server(registration.servicer, server)
        names = [r.name for r in registrations] + [HEALTH_SERVICE, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, server)
        port = server.add_secure_port(
            "127.0.0.1:0", pki.server_credentials(require_client_auth=require_client_auth)
        )
        servers.append(server)
        server.start()
        return TlsServer(server, port, calls)

    yield start
    for server in servers:
        server.stop(None).wait()
