"""The allocator's read-only web view of the fleet: the standard library's HTTP server, in a thread.

    web = WebView(service, WebSettings("127.0.0.1:8080", tenants_only=False))
    web.start()          # serves until web.close()

Routes: `GET /` (the page), `GET /fleet` (the fleet part, which web.js polls 4 times a second
with the last ETag: 304 while nothing changed), `POST /explain` (the Explain box), and the two
static files. It reads the allocator in process — the same view, holdings and Explain the RPCs
use (app/fleet_view.py; `AllocatorService.explain`) — and changes nothing.

Who sees what. Served with the gRPC port's TLS and access policy (`WebSettings.tls` and
`authenticator`, as bootstrap.start_web_view sets them when the server has both), it is HTTPS
with the same identities: every request needs a client certificate the server's client CA
signed or an `Authorization: Bearer <JWT>` of the policy's issuers (401 without, 403 for an
identity the policy binds to no role or to one without `reservations.read`, and
`placements.read` for Explain), and may listen beyond loopback. Otherwise the page has no
login: what it shows, it shows to whoever reaches the port.
So it listens on loopback unless `GPUALLOC_INSECURE` (a non-loopback address is refused
otherwise, like the gRPC port without TLS or a policy), answers only requests whose Host is
a loopback name there (a DNS-rebinding page cannot read it), and under an access policy
(`GPUALLOC_AUTH_POLICY`) it shows every reservation as a caller of no tenant would see it over
gRPC (app/tenancy.py): node, devices, state, lease expiry and the tenant — no owner, reservation
id, claim names or labels; Explain names holders as "a reservation of tenant X". Without a
policy (development mode) everything is shown, as the RPCs show it.

Bounds. A request body over `max_body_bytes` is refused unread (413); the pasted text is read
with the document limits of every `-f` file (GPUALLOC_MAX_DOCUMENT_*), parsed as
`gpualloc solve` parses files, and explained by the allocator's own Explain with the RPC's
search and CEL budgets, within GPUALLOC_MAX_CALL_DURATION; at most `max_explains` run at once
(more: 503 with Retry-After), at most `max_connections` connections are served at once, and a
client that stalls for `socket_timeout` seconds is dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import socket
import ssl
import threading
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from services.allocator.adapters.web.page import (
    answer_fragment,
    error_fragment,
    fleet_fragment,
    page,
    quotas_fragment,
)
from services.allocator.app.cluster_view import ViewSnapshot
from services.allocator.app.fleet_view import Fleet, fleet_of
from services.allocator.app.messages import Answer, Query
from services.allocator.app.service import AllocatorService
from services.allocator.app.tenancy import visible_answer
from services.common.deadline import Deadline
from services.common.dra.limits import DocumentLimits
from services.common.dra.model import DeviceClass, ResourceClaim
from services.common.dra.parse import load_objects
from services.common.errors import (
    FailedPrecondition,
    GpuallocError,
    InvalidArgument,
    PermissionDenied,
    Unauthenticated,
)
from services.common.grpc_errors import status_code_of
from services.common.security.edge import (
    Authenticator,
    certificate_identity,
    is_loopback_address,
)
from services.common.security.policy import Access, authorize
from services.common.security.principal import (
    Identity,
    IdentityKind,
    Permission,
    Principal,
    development_principal,
)

__all__ = ["WEB_VIEWER", "WebSettings", "WebTls", "WebView", "check_web_exposure"]

log = logging.getLogger(__name__)

WEB_VIEWER = Principal(Identity(IdentityKind.ANONYMOUS, "web-viewer"))
"""Who the page is shown to under an access policy: a caller of no tenant (sees tenants only)."""

_PASTED = "<pasted claim>"
_MAX_QUOTA_SCOPES = 64  # quota panels kept (one per tenant looking, and one of every tenant)
_LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
_STATIC = {
    "/web.css": ("web.css", "text/css; charset=utf-8"),
    "/web.js": ("web.js", "text/javascript; charset=utf-8"),
}
_SECURITY_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)
# gRPC code names -> HTTP status, as Google's HTTP mapping of google.rpc.Code does.
_HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ABORTED": 409,
    "ALREADY_EXISTS": 409,
    "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}


@dataclass(frozen=True)
class WebTls:
    """The gRPC port's certificate and key (GPUALLOC_TLS_CERT_FILE, _KEY_FILE) and the CA its
    clients' certificates must chain to (GPUALLOC_TLS_CLIENT_CA_FILE; empty: tokens only)."""

    cert_file: str
    key_file: str
    client_ca_file: str = ""

    def context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
            if self.client_ca_file:
                context.load_verify_locations(self.client_ca_file)
                context.verify_mode = ssl.CERT_OPTIONAL  # a certificate, or else a token
        except (OSError, ssl.SSLError) as error:
            raise InvalidArgument.at("GPUALLOC_TLS_CERT_FILE", f"web view TLS: {error}") from None
        return context


@dataclass(frozen=True)
class WebSettings:
    listen_address: str  # host:port (port 0: any)
    tenants_only: bool = False  # an access policy is on: show tenants only
    insecure: bool = False  # a non-loopback address is allowed (GPUALLOC_INSECURE)
    tls: WebTls | None = None  # HTTPS with the gRPC port's certificate
    authenticator: Authenticator | None = None  # with `tls`: each request's identity
    document_limits: DocumentLimits = field(default_factory=DocumentLimits)
    explain_seconds: float = 30.0  # GPUALLOC_MAX_CALL_DURATION
    max_body_bytes: int = 256 * 1024
    max_explains: int = 2
    max_connections: int = 16
    socket_timeout: float = 10.0


def check_web_exposure(address: str, insecure: bool, *, authenticated: bool = False) -> None:
    """FailedPrecondition for a non-loopback web address without `insecure`; a warning with.
    Served over TLS with the policy's identities (`authenticated`), any address is fine."""
    if is_loopback_address(address) or authenticated:
        return
    message = (
        f"the web view on {address} (not loopback) has no TLS and no login: anyone who "
        "reaches the port sees the fleet and can run Explain"
    )
    if not insecure:
        raise FailedPrecondition(
            message + ". Keep GPUALLOC_WEB_LISTEN on loopback (reach it with `kubectl "
            "port-forward` or an SSH tunnel), or set GPUALLOC_INSECURE=true to accept that"
        )
    log.warning(message)


class WebView:
    """The HTTP server and what its pages read; thread-safe."""

    def __init__(
        self, service: AllocatorService, settings: WebSettings, *, reuse_port: bool = False
    ) -> None:
        check_web_exposure(
            settings.listen_address, settings.insecure, authenticated=_authenticated(settings)
        )
        self._service = service
        self.settings = settings
        self.viewer = WEB_VIEWER if settings.tenants_only else development_principal()
        self._explains = threading.BoundedSemaphore(settings.max_explains)
        self._loopback = is_loopback_address(settings.listen_address)
        self._server = _bind(settings, reuse_port, self)
        self._thread: threading.Thread | None = None
        self._drawn: tuple[object, bytes] | None = None  # the last fleet_fragment
        self._quotas: dict[str, tuple[object, str]] = {}  # scope -> (change key, panel)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = str(self._server.server_address[0])
        scheme = "https" if self.settings.tls else "http"
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{self.port}/"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="web-view"
        )
        self._thread.daemon = True
        self._thread.start()
        log.info(
            "web view serving", extra={"url": self.url, "tenants_only": self.settings.tenants_only}
        )

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5.0)
        self._server.server_close()

    # --- what the pages read -------------------------------------------------------------

    def fleet(self, view: ViewSnapshot | None = None) -> Fleet:
        """The fleet of `view` (default: the current one) as the viewer may see it."""
        view = view or self._service.view.require(0)
        holdings = self._service.holdings
        state = holdings.state_for(view)
        reservations = {r.id: r for r in holdings.reservations()}
        return fleet_of(view, state, reservations, self.viewer)

    def fleet_fragment(self, viewer: Principal | None = None) -> tuple[bytes, str]:
        """The fleet's and the quotas' HTML (those `viewer`, default the page's viewer, may
        see) and its ETag, drawn again only when the view, the holdings or a reservation's
        state or lease changed (every viewer polls it several times a second)."""
        view = self._service.view.require(0)
        key = self._change_key(view)
        cached = self._drawn
        if cached is None or cached[0] != key:
            cached = (key, fleet_fragment(self.fleet(view)).encode())
            self._drawn = cached
        body = cached[1] + self.quotas_fragment(viewer or self.viewer, key).encode()
        etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
        return body, etag

    def quotas_fragment(self, viewer: Principal, key: object | None = None) -> str:
        """The quotas panel as `viewer` may see it: every tenant's rows for one who sees every
        tenant, its own tenant's, else none (QuotaStatus's rule); kept per change key."""
        key = key if key is not None else self._change_key(self._service.view.require(0))
        scope = "*" if viewer.sees_all_tenants else (viewer.tenant or "")
        cached = self._quotas.get(scope)
        if cached is not None and cached[0] == key:
            return cached[1]
        rows, enabled = self._service.quota_status([] if scope == "*" else [scope])
        shown = rows if scope else []
        text = quotas_fragment(shown, enabled)
        if len(self._quotas) >= _MAX_QUOTA_SCOPES:
            self._quotas.clear()
        self._quotas[scope] = (key, text)
        return text

    def _change_key(self, view: ViewSnapshot) -> object:
        holdings = self._service.holdings
        leases = tuple(sorted((r.id, r.state, r.expires_at) for r in holdings.reservations()))
        return (view, holdings.version, leases)  # a ViewSnapshot compares by identity

    def explain(self, text: str) -> Answer:
        """Explain the claims of `text` (DeviceClasses in it are used for this call only), as
        the viewer may see the answer. Raises the typed errors of parsing and of Explain."""
        objects = load_objects(text, _PASTED, self.settings.document_limits)
        claims = tuple(o for o in objects if isinstance(o, ResourceClaim) and o.allocation is None)
        classes = tuple(o for o in objects if isinstance(o, DeviceClass))
        if not claims:
            raise InvalidArgument(
                f"{_PASTED}: holds no ResourceClaim without status.allocation to explain"
            )
        if not self._explains.acquire(blocking=False):
            raise _Busy()
        try:
            deadline = Deadline.after(self.settings.explain_seconds)
            answer = self._service.explain(Query(claims, device_classes=classes), deadline=deadline)
        finally:
            self._explains.release()
        return visible_answer(answer, self.viewer, self._service.holdings.owner_of)

    def authorize(
        self, authorization: str, peer: dict[str, Any] | None, explain: bool
    ) -> Principal:
        """Who the request is shown to. Under the policy (`authenticated` settings): its
        token's or certificate's principal, or Unauthenticated / PermissionDenied unless that
        is bound to a role that may read reservations (and place, for Explain); otherwise the
        page's viewer."""
        authenticator = self.settings.authenticator
        if not _authenticated(self.settings) or authenticator is None:
            return self.viewer
        principal = authenticator.http_principal(authorization, _peer_identity(peer))
        authorize(principal, Access("web view", Permission.RESERVATIONS_READ))
        if explain:
            authorize(principal, Access("web view Explain", Permission.PLACEMENTS_READ))
        return principal

    def host_allowed(self, host: str | None) -> bool:
        """On loopback, only loopback Host names (DNS rebinding); anything otherwise."""
        if not self._loopback:
            return True
        if not host:
            return False
        name = urlsplit(f"//{host}").hostname or ""
        return name in _LOOPBACK_HOSTS


def _authenticated(settings: WebSettings) -> bool:
    authenticator = settings.authenticator
    return settings.tls is not None and authenticator is not None and not authenticator.development


def _peer_identity(peer: dict[str, Any] | None) -> Identity | None:
    """A verified client certificate (ssl's getpeercert()) as gRPC names the peer: its DNS and
    URI subject alternative names when it has any, else its subject common name."""
    if not peer:
        return None
    names = [v for kind, v in peer.get("subjectAltName", ()) if kind in ("DNS", "URI")]
    if names:
        return certificate_identity(
            "x509_subject_alternative_name", tuple(n.encode() for n in names)
        )
    common = [v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"]
    return (
        certificate_identity("x509_common_name", tuple(c.encode() for c in common[:1]))
        if common
        else None
    )


class _Busy(GpuallocError):
    def __init__(self) -> None:
        super().__init__("other Explains are running; retry in a second")


class _Server(ThreadingHTTPServer):
    """At most `max_connections` handler threads: more connections get 503 and are closed."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], web: WebView, limit: int, reuse: bool) -> None:
        self.web = web
        self.allow_reuse_port = reuse
        self._slots = threading.BoundedSemaphore(limit)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\n\r\n")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed (a TLS handshake refused: no or a bad certificate, plain
        HTTP to HTTPS; a client gone) is logged, not printed as a traceback on stderr."""
        log.debug("web: connection from %s failed", client_address, exc_info=True)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Server6(_Server):
    address_family = socket.AF_INET6


def _bind(settings: WebSettings, reuse_port: bool, web: WebView) -> _Server:
    host, _, port = settings.listen_address.rpartition(":")
    host = host.strip("[]")
    try:
        number = int(port)
    except ValueError:
        raise InvalidArgument.at(
            "GPUALLOC_WEB_LISTEN", f"must be host:port, got {settings.listen_address!r}"
        ) from None
    server_class = _Server6 if ":" in host else _Server
    context = settings.tls.context() if settings.tls else None
    try:
        server = server_class((host, number), web, settings.max_connections, reuse_port)
    except OSError as error:
        raise InvalidArgument.at(
            "GPUALLOC_WEB_LISTEN",
            f"cannot listen on {settings.listen_address}: the address is in use or not local "
            f"({error.strerror})",
        ) from None
    if context is not None:  # the handshake runs in the connection's thread, on first read
        server.socket = context.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    return server


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "gpualloc-web"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.web.settings.socket_timeout)

    viewer: Principal | None = None  # who this request is shown to (_identity_checked)

    def do_GET(self) -> None:
        if not self._host_checked() or not self._identity_checked(explain=False):
            return
        try:
            self._get(urlsplit(self.path).path)
        except GpuallocError as error:  # no inventory view yet, the store unreachable
            self._send_error(_http_status(error), error.message)

    def _get(self, path: str) -> None:
        web = self.server.web
        if path in _STATIC:
            name, content_type = _STATIC[path]
            body = resources.files(__package__).joinpath("web_static", name).read_bytes()
            self._send(HTTPStatus.OK, body, content_type)
        elif path == "/":
            text = page(
                self._fleet(), tenants_only=web.settings.tenants_only, quotas=self._quotas()
            )
            self._send(HTTPStatus.OK, text.encode(), "text/html; charset=utf-8")
        elif path == "/fleet":
            body, etag = self.server.web.fleet_fragment(self.viewer)
            if self.headers.get("If-None-Match") == etag:
                self._send(HTTPStatus.NOT_MODIFIED, b"", "", etag=etag)
            else:
                self._send(HTTPStatus.OK, body, "text/html; charset=utf-8", etag=etag)
        else:
            self._send_error(HTTPStatus.NOT_FOUND, f"no page {path}")

    def do_POST(self) -> None:
        if not self._host_checked() or not self._identity_checked(explain=True):
            return
        if urlsplit(self.path).path != "/explain":
            self._send_error(HTTPStatus.NOT_FOUND, "only /explain takes a POST")
            return
        text = self._body()
        if text is None:
            return
        form = self.headers.get_content_type() == "application/x-www-form-urlencoded"
        if form:
            text = parse_qs(text).get("claim", [""])[0]
        status: int = HTTPStatus.OK
        try:
            fragment = answer_fragment(self.server.web.explain(text))
        except GpuallocError as error:
            status = _http_status(error)
            fragment = error_fragment(status, error.message)
        if form:  # the page without JavaScript: the whole page, the answer in it
            try:
                fleet = self._fleet()
            except GpuallocError as error:
                self._send_error(_http_status(error), error.message)
                return
            settings = self.server.web.settings
            whole = page(
                fleet,
                tenants_only=settings.tenants_only,
                explain=fragment,
                claim=text,
                quotas=self._quotas(),
            )
            self._send(status, whole.encode(), "text/html; charset=utf-8")
        else:
            self._send(status, fragment.encode(), "text/html; charset=utf-8")

    def _body(self) -> str | None:
        """The request body as text, or None after answering why not."""
        length_text = self.headers.get("Content-Length")
        limit = self.server.web.settings.max_body_bytes
        if length_text is None or not length_text.isdigit():
            self._send_error(HTTPStatus.LENGTH_REQUIRED, "a POST needs a Content-Length")
            return None
        length = int(length_text)
        if length > limit:
            self.close_connection = True
            self._send_error(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"the claim is {length:,} bytes; the Explain box takes at most {limit:,}",
            )
            return None
        try:
            return self.rfile.read(length).decode("utf-8")
        except UnicodeDecodeError as error:
            self._send_error(HTTPStatus.BAD_REQUEST, f"not UTF-8 text: {error.reason}")
            return None

    def _fleet(self) -> Fleet:
        return self.server.web.fleet()

    def _quotas(self) -> str:
        web = self.server.web
        return web.quotas_fragment(self.viewer or web.viewer)

    def _host_checked(self) -> bool:
        if self.server.web.host_allowed(self.headers.get("Host")):
            return True
        self._send_error(
            HTTPStatus.MISDIRECTED_REQUEST,
            "this web view answers on localhost only (the Host header is not a loopback name)",
        )
        return False

    def _identity_checked(self, *, explain: bool) -> bool:
        peer = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        try:
            self.viewer = self.server.web.authorize(
                self.headers.get("Authorization", ""), peer, explain
            )
        except (Unauthenticated, PermissionDenied) as error:
            self.close_connection = True
            self._send_error(_http_status(error), error.message)
            return False
        return True

    def _send_error(self, status: int, message: str) -> None:
        self._send(status, error_fragment(status, message).encode(), "text/html; charset=utf-8")

    def _send(self, status: int, body: bytes, content_type: str, *, etag: str = "") -> None:
        self.send_response(status)
        for name, value in _SECURITY_HEADERS:
            self.send_header(name, value)
        if status == HTTPStatus.SERVICE_UNAVAILABLE:
            self.send_header("Retry-After", "1")
        if status == HTTPStatus.UNAUTHORIZED:
            self.send_header("WWW-Authenticate", 'Bearer realm="gpualloc"')
        if etag:
            self.send_header("ETag", etag)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("web: " + format, *args)


def _http_status(error: GpuallocError) -> int:
    if isinstance(error, _Busy):
        return HTTPStatus.SERVICE_UNAVAILABLE
    code = status_code_of(error)
    return _HTTP_STATUS.get(code.name if code is not None else "", 500)
