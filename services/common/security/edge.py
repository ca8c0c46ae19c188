"""The call's principal, computed once at the edge: authenticate, authorize, then hand it down.

    TLS/mTLS handshake -> authenticate (bearer JWT, else the client certificate's names)
      -> Principal (policy: tenant, roles) -> authorize(principal, the method's Access) -> handler

`AuthInterceptor` does all of it for every RPC but health and reflection, in one place, before
the servicer runs. Each servicer declares an `AccessRule` per method (what permission it needs
and which facts of the request matter: the node a report is for, adminAccess); a method without
a rule is denied (deny by default, so a new RPC cannot ship unguarded). The servicer reads the
principal with `current_principal(context)` and passes it down as a value.

Without a policy the server is in development mode: the `x-gpualloc-owner` header is believed
and every call is allowed, as before identities existed. `Authenticator.for_settings` allows
that only on a loopback address unless the operator says `--insecure`.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import re
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
from google.protobuf.message import Message

from services.common.admission import Admission, AdmissionLimits
from services.common.errors import (
    FailedPrecondition,
    PermissionDenied,
    Unauthenticated,
)
from services.common.grpc_errors import (
    Handler,
    HandlerInterceptor,
    StreamBehavior,
    UnaryBehavior,
    rewrap_handler,
    status_code_of,
    stream_in_context,
)
from services.common.log import current_trace_ids
from services.common.security.audit import audit_event
from services.common.security.policy import Access, AccessPolicy, authorize
from services.common.security.policy_files import LoadedPolicy, load_policy
from services.common.security.principal import (
    Identity,
    IdentityKind,
    Permission,
    Principal,
    development_principal,
)
from services.common.security.tls import WatchedFiles
from services.common.security.tokens import TokenVerifier

__all__ = [
    "OWNER_METADATA",
    "TENANT_METADATA",
    "AccessRule",
    "AuthInterceptor",
    "Authenticator",
    "CallInfo",
    "asks_admin_access",
    "audit_call",
    "call_info",
    "certificate_identity",
    "check_exposure",
    "current_principal",
    "is_loopback_address",
    "load_policy_file",
    "rule",
]

OWNER_METADATA = "x-gpualloc-owner"
"""Development mode's owner header; under a policy only a sub-owner the policy allows."""

TENANT_METADATA = "x-gpualloc-tenant"
"""The tenant a call acts for, under a policy that lets its identity (a binding's
actForTenants); ignored in development mode, which has no tenants to keep apart."""

AccessRule = Callable[[Any], Access]
"""The access one method needs, from its decoded request (the method name is filled in)."""

log = logging.getLogger("gpualloc.auth")


def rule(permission: Permission) -> AccessRule:
    """The rule of a method that needs `permission` whatever the request says."""
    access = Access("", permission)
    return lambda request: access


class CallInfo:
    """The current call's principal and method; its trace id, worked out when first needed
    (only calls that are audited need one)."""

    __slots__ = ("_context", "_trace_id", "method", "principal")

    def __init__(self, principal: Principal, method: str, context: grpc.ServicerContext) -> None:
        self.principal = principal
        self.method = method
        self._context = context
        self._trace_id = ""

    @property
    def trace_id(self) -> str:
        if not self._trace_id:
            self._trace_id = _trace_id(self._context)
        return self._trace_id


_current: ContextVar[CallInfo | None] = ContextVar("gpualloc_call_info", default=None)


def call_info() -> CallInfo | None:
    """The current call's principal, trace id and method (None outside an intercepted call)."""
    return _current.get()


def current_principal(context: grpc.ServicerContext) -> Principal:
    """The principal the interceptor computed for this call. A servicer called without the
    interceptor (a server not built by create_server) gets development mode's principal."""
    info = _current.get()
    if info is not None:
        return info.principal
    return development_principal(_owner_header(context))


def audit_call(context: grpc.ServicerContext, event: str, **fields: Any) -> None:
    """An audit event of the current call: its principal and trace id, and `fields`."""
    info = _current.get()
    principal = info.principal if info is not None else current_principal(context)
    trace_id = info.trace_id if info is not None else _trace_id(context)
    method = info.method if info is not None else ""
    audit_event(event, principal, trace_id=trace_id, method=method, **fields)


# --- authentication -------------------------------------------------------------------------


_RESOLVED_LIMIT = 4096  # distinct identities remembered per loaded policy


@dataclass(frozen=True)
class _Loaded:
    """A loaded policy, its token verifier, and the principals it resolved: resolving is a
    loop over the bindings, done once per identity until the file changes (a reload makes a
    new `_Loaded`, so nothing stale survives it)."""

    policy: AccessPolicy
    tokens: TokenVerifier
    source: LoadedPolicy  # the policy with the files it was read from (what a reload watches)
    resolved: dict[Identity, Principal | None] = field(default_factory=dict)
    acting: dict[tuple[Identity, str], Principal] = field(default_factory=dict)

    def resolve(self, identity: Identity) -> Principal | None:
        try:
            return self.resolved[identity]
        except KeyError:
            pass
        principal = self.policy.resolve(identity)
        if len(self.resolved) >= _RESOLVED_LIMIT:
            self.resolved.clear()
        self.resolved[identity] = principal
        return principal

    def act_for_tenant(self, principal: Principal, tenant: str) -> Principal:
        """policy.act_for_tenant, remembered per identity and tenant (a refusal is not)."""
        key = (principal.identity, tenant)
        try:
            return self.acting[key]
        except KeyError:
            pass
        acting = self.policy.act_for_tenant(principal, tenant)
        if len(self.acting) >= _RESOLVED_LIMIT:
            self.acting.clear()
        self.acting[key] = acting
        return acting


def load_policy_file(path: str, contents: bytes) -> AccessPolicy:
    """Parse an AccessPolicy file (YAML) and the Kueue files it names (policy_files.py);
    InvalidArgument naming the file and the field."""
    return load_policy(path, contents).policy


class Authenticator:
    """Identity -> principal for each call, under the policy file (reloaded when it changes)
    or in development mode."""

    def __init__(self, policy_file: str = "", *, min_interval: float = 1.0) -> None:
        self.policy_file = policy_file
        self._watched: WatchedFiles[_Loaded] | None = None
        if policy_file:

            def load(contents: Sequence[bytes]) -> _Loaded:
                loaded = load_policy(policy_file, contents[0])
                return _Loaded(loaded.policy, TokenVerifier(loaded.policy.jwt_issuers), loaded)

            self._watched = WatchedFiles(
                [policy_file],
                load,
                what="access policy",
                min_interval=min_interval,
                follow=lambda loaded: loaded.source.followed,
            )

    @property
    def development(self) -> bool:
        return self._watched is None

    @property
    def policy(self) -> AccessPolicy | None:
        return self._watched.current().policy if self._watched is not None else None

    def principal(self, context: grpc.ServicerContext) -> Principal:
        """The caller's principal, in the tenant its call acts for (`acting_for_tenant`)."""
        return self.acting_for_tenant(self.identity_principal(context), context)

    def identity_principal(self, context: grpc.ServicerContext) -> Principal:
        """The principal the policy gives the caller's identity, in its own tenant."""
        if self._watched is None:
            return development_principal(_owner_header(context))
        loaded = self._watched.current()
        identity = self._identity(context, loaded.tokens)
        principal = loaded.resolve(identity)
        if principal is None:
            raise PermissionDenied(
                f"identity {identity.display} is not bound to any role by the access policy"
            )
        return principal

    def acting_for_tenant(self, principal: Principal, context: grpc.ServicerContext) -> Principal:
        """`principal` in the tenant the call names (TENANT_METADATA) when the policy lets it
        act for that tenant (PermissionDenied else), with its sub-owner header. Development
        mode ignores the tenant: it has none to keep apart."""
        if principal.development:
            return principal
        tenant = _metadata(context, TENANT_METADATA)
        if tenant:
            assert self._watched is not None  # a principal of a policy
            principal = self._watched.current().act_for_tenant(principal, tenant)
        if principal.tenant is not None:
            claimed = _owner_header(context)
            if claimed:  # a sub-owner: checked by principal.owner() where owners are used
                principal = replace(principal, claimed_owner=claimed)
        return principal

    def _identity(self, context: grpc.ServicerContext, tokens: TokenVerifier) -> Identity:
        for key, value in context.invocation_metadata():
            if key == "authorization" and isinstance(value, str):
                scheme, _, token = value.partition(" ")
                if scheme.lower() != "bearer" or not token.strip():
                    raise Unauthenticated("the authorization metadata must be `Bearer <JWT>`")
                return tokens.verify(token.strip())
        values = context.peer_identities()
        if values:
            return certificate_identity(context.peer_identity_key() or "", tuple(values))
        raise Unauthenticated(
            "no client certificate and no bearer token: this server needs an identity "
            "(mutual TLS or `authorization: Bearer <JWT>`; see docs/security.md)"
        )

    def http_principal(self, authorization: str, certificate: Identity | None) -> Principal:
        """`principal` for an HTTP request (the web view, served over the same TLS): the
        `Authorization: Bearer <JWT>` header, else the verified client certificate's identity
        (`certificate`), bound by the same policy. Unauthenticated without either."""
        if self._watched is None:
            return development_principal()
        loaded = self._watched.current()
        scheme, _, token = authorization.partition(" ")
        if authorization and (scheme.lower() != "bearer" or not token.strip()):
            raise Unauthenticated("the Authorization header must be `Bearer <JWT>`")
        if token.strip():
            identity = loaded.tokens.verify(token.strip())
        elif certificate is not None:
            identity = certificate
        else:
            raise Unauthenticated(
                "no client certificate and no bearer token: this web view needs an identity "
                "(a client certificate or `Authorization: Bearer <JWT>`; see docs/security.md)"
            )
        principal = loaded.resolve(identity)
        if principal is None:
            raise PermissionDenied(
                f"identity {identity.display} is not bound to any role by the access policy"
            )
        return principal


@functools.lru_cache(maxsize=4096)
def certificate_identity(property_name: str, values: tuple[bytes, ...]) -> Identity:
    """A verified client certificate's identity, as gRPC reports the peer: its subject
    alternative names when it has any — a `spiffe://` URI is its SPIFFE ID, other names are DNS
    names (IP and e-mail SANs are not identities here) — else its subject common name. Cheap
    (gRPC keeps these per connection; `auth_context()` would copy the whole PEM per call)."""
    texts = [v.decode("utf-8", "replace") for v in values]
    if property_name == "x509_common_name":
        return Identity(IdentityKind.CERTIFICATE, texts[0], tuple(f"cn:{t}" for t in texts))
    spiffe = [t for t in texts if t.startswith("spiffe://")]
    dns = [t for t in texts if "://" not in t and "@" not in t and not _is_ip(t)]
    names = (*(f"spiffe:{t}" for t in spiffe), *(f"dns:{t}" for t in dns))
    display = (spiffe or dns or texts or ["(no name)"])[0]
    return Identity(IdentityKind.CERTIFICATE, display, names)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _owner_header(context: grpc.ServicerContext) -> str:
    return _metadata(context, OWNER_METADATA)


def _metadata(context: grpc.ServicerContext, key: str) -> str:
    """The first non-empty value of a text metadata key ("" when none)."""
    for name, value in context.invocation_metadata():
        if name == key and isinstance(value, str) and value:
            return value
    return ""


# --- the interceptor ------------------------------------------------------------------------

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


class AuthInterceptor(HandlerInterceptor):
    """Authenticates and authorizes every call but health and reflection (module docstring)."""

    def __init__(
        self,
        authenticator: Authenticator,
        rules: Mapping[str, AccessRule],
        admission: Admission | None = None,
    ) -> None:
        super().__init__()
        self._authenticator = authenticator
        self._rules = dict(rules)
        self._admission = admission or Admission(AdmissionLimits())

    def wrap(self, method: str, handler: Handler) -> Handler:
        access_rule = self._rules.get(method)
        admit = functools.partial(self._admit, method.rsplit("/", 1)[-1], access_rule)
        admission = self._admission

        def wrap_unary(behavior: UnaryBehavior) -> UnaryBehavior:
            def call(request: Any, context: grpc.ServicerContext) -> Any:
                info = admit(request, context)
                principal = info.principal
                caller = context.peer() if principal.development else principal.name
                tenant = None if principal.development else principal.tenant
                admission.enter_unary(info.method, caller, tenant)
                token = _current.set(info)
                try:
                    return behavior(request, context)
                except PermissionDenied as error:  # the use case's own denials (owners)
                    _audit_denial(info.principal, info.trace_id, info.method, error)
                    raise
                finally:
                    _current.reset(token)
                    admission.leave_unary(caller, tenant)

            return call

        def wrap_stream(behavior: StreamBehavior) -> StreamBehavior:
            def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                info = admit(request, context)
                tenant = None if info.principal.development else info.principal.tenant
                with admission.stream(info.method, tenant):
                    yield from stream_in_context(_current, info, lambda: behavior(request, context))

            return call

        return rewrap_handler(handler, wrap_unary, wrap_stream)

    def _admit(
        self,
        short: str,
        access_rule: AccessRule | None,
        request: Any,
        context: grpc.ServicerContext,
    ) -> CallInfo:
        """The call's principal, authorized for `access_rule`; `short`: the method's name."""
        principal: Principal | None = None
        try:
            principal = self._authenticator.identity_principal(context)
            principal = self._authenticator.acting_for_tenant(principal, context)
            if not principal.development:  # development mode allows every call
                if access_rule is None:
                    raise PermissionDenied(
                        f"{short}: no access rule for this method (deny by default)"
                    )
                authorize(principal, replace(access_rule(request), method=short))
        except (Unauthenticated, PermissionDenied) as error:
            presented = _presented(context) if principal is None else None
            _audit_denial(principal, _trace_id(context), short, error, presented)
            raise
        return CallInfo(principal, short, context)


def _presented(context: grpc.ServicerContext) -> str:
    """What a caller without a principal showed, for its denial's audit event: the bearer
    token's unverified issuer and subject, else its client certificate's names (SANs, else
    the common name), else nothing."""
    for key, value in context.invocation_metadata():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return "authorization metadata that is not `Bearer <JWT>`"
            return TokenVerifier.presented(token.strip())
    values = context.peer_identities()
    if values:
        identity = certificate_identity(context.peer_identity_key() or "", tuple(values))
        return "certificate " + " ".join(identity.names or (identity.display,))
    return "no client certificate and no bearer token"


def _audit_denial(
    principal: Principal | None,
    trace_id: str,
    method: str,
    error: Unauthenticated | PermissionDenied,
    presented: str | None = None,
) -> None:
    code = status_code_of(error)
    audit_event(
        "call.denied",
        principal,
        trace_id=trace_id,
        method=method,
        presented=presented,
        code=code.name if code is not None else "",
        reason=error.message,
    )


def _trace_id(context: grpc.ServicerContext) -> str:
    ids = current_trace_ids()
    if ids is not None:
        return ids[0]
    for key, value in context.invocation_metadata():
        if key == "traceparent" and isinstance(value, str):
            match = _TRACEPARENT.match(value.strip())
            if match:
                return match[1]
    return secrets.token_hex(16)


def asks_admin_access(message: Message) -> bool:
    """Whether any request or result anywhere in `message` sets `admin_access` (claims, gangs,
    reserved allocations alike), so the rule cannot miss a new place that carries it."""
    for descriptor, value in message.ListFields():
        if descriptor.name == "admin_access" and value is True:
            return True
        if descriptor.message_type is None:
            continue
        if descriptor.message_type.GetOptions().map_entry:
            values = value.values()
        elif descriptor.is_repeated:
            values = value
        else:
            values = (value,)
        for item in values:
            if isinstance(item, Message) and asks_admin_access(item):
                return True
    return False


def is_loopback_address(address: str) -> bool:
    """Whether a listen address (host:port) is reachable from this machine only."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(address: str, *, tls: bool, policy: bool, insecure: bool) -> str | None:
    """None when serving `address` this way is safe; else the warning to log (with
    `insecure`) — raises FailedPrecondition when not even `insecure` was given."""
    if is_loopback_address(address):
        return None
    missing = [
        what for what, present in (("TLS", tls), ("an access policy", policy)) if not present
    ]
    if not missing:
        return None
    message = (
        f"listening on {address} (not loopback) without {' and without '.join(missing)}: "
        "anyone who reaches the port can act as any tenant"
    )
    if not insecure:
        raise FailedPrecondition(
            message + ". Configure GPUALLOC_TLS_CERT/GPUALLOC_TLS_KEY and GPUALLOC_AUTH_POLICY "
            "(docs/security.md), or pass --insecure (GPUALLOC_INSECURE=true) to accept that"
        )
    return message
