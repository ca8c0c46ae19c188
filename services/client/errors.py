"""The one error the client adds to services.common.errors: claims that do not fit; and what
a failed connection's message means for the TLS settings.

Allocate answers "does not fit" as a normal response (never an RPC error). Code that needs the
devices to proceed — `client.lease()`, the bridges' prologs — turns that answer into
`Unplaceable`, which carries the placement (explanation and holders included).

`connection_hint` reads grpc-core's words for a failed handshake (a TLS server closes the
socket on a plaintext client or one without an acceptable certificate; the client's own checks
name CERTIFICATE_VERIFY_FAILED, the hostname check, WRONG_VERSION_NUMBER) and says which flag
or variable to set.
"""

from __future__ import annotations

from services.client.config import TlsConfig
from services.client.results import Placement
from services.common.errors import GpuallocError

__all__ = ["Unplaceable", "connection_hint"]

_CERT = "--tls-cert and --tls-key (GPUALLOC_CLIENT_TLS_CERT, GPUALLOC_CLIENT_TLS_KEY)"
_CA = "--tls-ca (GPUALLOC_CLIENT_TLS_CA)"


def connection_hint(message: str, tls: TlsConfig | None) -> str:
    """What probably went wrong and what to set, or "" when the message says nothing of TLS."""
    if "CERTIFICATE_VERIFY_FAILED" in message:
        return f"the server's certificate is not signed by the CA of {_CA}"
    if "Hostname Verification" in message:
        return (
            "the server's certificate does not name the host dialed: set --tls-server-name "
            "(GPUALLOC_CLIENT_TLS_SERVER_NAME) to a name it has"
        )
    if "WRONG_VERSION_NUMBER" in message:
        return "the server does not speak TLS: drop the --tls-* flags (GPUALLOC_CLIENT_TLS_*)"
    if "Socket closed" not in message and "Connection reset" not in message:
        return ""
    if tls is None:
        return f"the server may require TLS: set {_CA}, and for mutual TLS {_CERT}"
    if tls.client_certificate is None:
        return f"the server may require a client certificate: set {_CERT}"
    return (
        "the server may not accept the client certificate of --tls-cert "
        "(GPUALLOC_CLIENT_TLS_CERT): is it issued by a CA the server trusts, and not expired?"
    )


class Unplaceable(GpuallocError):
    """The claims do not fit now; `placement.reason()` says why and who holds what."""

    def __init__(self, placement: Placement, what: str = "the claims") -> None:
        super().__init__(f"{what} cannot be placed:\n{placement.reason()}")
        self.placement = placement
