"""Bearer JWTs verified against the issuers of the AccessPolicy (PyJWT; keys from JWKS files).

Kubernetes service-account tokens and OIDC ID tokens are JWTs signed by their issuer. A token is
accepted when its `iss` is one of the policy's issuers, its signature verifies with a key of
that issuer's JWKS (chosen by `kid`), it names one of the issuer's audiences in `aud`, and `exp`
(required) and `nbf` hold, with 30 s of leeway for clock skew. Only asymmetric algorithms are
allowed: a shared-secret HS256 token could be minted by anyone who can read the JWKS file.
The JWKS files are re-read when they change (issuers rotate keys).

The identity is `jwt:<issuer>#<sub>`, which JWT subjects in the policy match; a Kubernetes
token bound to a pod also names the pod's node (`kubernetes.io.node.name`), which is the node
an agent bound by a JWT subject may report — one service account for every agent, each token
good for its own node only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import jwt

from services.common.errors import InvalidArgument, Unauthenticated
from services.common.security.policy import JwtIssuer
from services.common.security.principal import Identity, IdentityKind
from services.common.security.tls import WatchedFiles

__all__ = ["ALGORITHMS", "TokenVerifier"]

ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA")
_LEEWAY_SECONDS = 30
_MAX_TOKEN_BYTES = 16 * 1024


def _load_jwks(contents: Sequence[bytes]) -> jwt.PyJWKSet:
    try:
        return jwt.PyJWKSet.from_dict(json.loads(contents[0]))
    except (ValueError, jwt.PyJWKError, jwt.PyJWKSetError) as error:
        raise InvalidArgument.at("jwksFile", f"not a JSON Web Key Set: {error}") from None


def _bound_node(claims: dict[str, object]) -> str:
    """The node of a pod-bound Kubernetes service-account token (`kubernetes.io.node.name`,
    present since Kubernetes 1.30 for tokens projected into pods), else ""."""
    kubernetes = claims.get("kubernetes.io")
    node = kubernetes.get("node") if isinstance(kubernetes, dict) else None
    name = node.get("name") if isinstance(node, dict) else None
    return name if isinstance(name, str) else ""


class TokenVerifier:
    """Verifies tokens of the policy's issuers; one JWKS watcher per issuer."""

    def __init__(self, issuers: Sequence[JwtIssuer]) -> None:
        self._issuers = {issuer.issuer: issuer for issuer in issuers}
        self._keys = {
            issuer.issuer: WatchedFiles(
                [issuer.jwks_file], _load_jwks, what=f"JWKS of {issuer.issuer}"
            )
            for issuer in issuers
        }

    @staticmethod
    def presented(token: str) -> str:
        """What a token claims to be, unverified, for the audit of a denial: `jwt iss=<issuer>
        sub=<subject>` (each cut to 200 characters), never the token itself."""
        if len(token) > _MAX_TOKEN_BYTES:
            return f"a bearer token over {_MAX_TOKEN_BYTES} bytes"
        try:
            claims = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            return "a bearer token that is not a JWT"
        if not isinstance(claims, dict):
            return "a bearer token that is not a JWT"
        return f"jwt iss={str(claims.get('iss'))[:200]} sub={str(claims.get('sub'))[:200]}"

    def verify(self, token: str) -> Identity:
        """The token's identity; Unauthenticated saying what is wrong (never the token)."""
        if len(token) > _MAX_TOKEN_BYTES:
            raise Unauthenticated(f"bearer token over {_MAX_TOKEN_BYTES} bytes")
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError as error:
            raise Unauthenticated(f"bearer token is not a JWT: {error}") from None
        issuer_name = unverified.get("iss")
        issuer = self._issuers.get(issuer_name) if isinstance(issuer_name, str) else None
        if issuer is None:
            raise Unauthenticated(f"bearer token issuer {str(issuer_name)[:200]!r} is not trusted")
        key = self._key(issuer.issuer, header.get("kid"))
        try:
            claims = jwt.decode(
                token,
                key=key.key,
                algorithms=list(ALGORITHMS),
                audience=list(issuer.audiences),
                issuer=issuer.issuer,
                leeway=_LEEWAY_SECONDS,
                options={"require": ["exp", "iss", "sub", "aud"]},
            )
        except jwt.PyJWTError as error:
            raise Unauthenticated(f"bearer token rejected: {error}") from None
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            raise Unauthenticated("bearer token has no subject")
        return Identity(
            IdentityKind.JWT, subject, (f"jwt:{issuer.issuer}#{subject}",), _bound_node(claims)
        )

    def _key(self, issuer: str, kid: object) -> jwt.PyJWK:
        keys = self._keys[issuer].current()
        if kid is None:
            if len(keys.keys) == 1:
                return keys.keys[0]
            raise Unauthenticated("bearer token names no key (kid) and its issuer has several")
        for key in keys.keys:
            if key.key_id == kid:
                return key
        raise Unauthenticated(f"bearer token key {str(kid)[:100]!r} is not in its issuer's JWKS")
