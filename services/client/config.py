"""Connection settings of the client library: TLS, a bearer token, retries, read from the env.

Frozen values, like the servers' settings, so one `RetryPolicy` can be shared by every client of a
process. `ClientSettings.from_env` reads the `GPUALLOC_CLIENT_*` variables that the bridges'
commands (`gpualloc-slurm`, `gpualloc-kueue`) document, so a Slurm prolog and a Kubernetes
Deployment are configured the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.common.config import env_duration, env_int, env_str
from services.common.errors import InvalidArgument

__all__ = [
    "DEFAULT_TARGET",
    "NO_RETRY",
    "ClientSettings",
    "RetryPolicy",
    "TlsConfig",
    "check_token_needs_tls",
]

DEFAULT_TARGET = "127.0.0.1:50051"
"""Where `gpualloc serve` (and `make run`) listens."""


@dataclass(frozen=True)
class TlsConfig:
    """TLS for the channel. Without `root_certificates` the system's trust store is used; a
    client certificate and key together turn on mutual TLS."""

    root_certificates: bytes | None = None
    client_certificate: bytes | None = None
    client_key: bytes | None = None
    server_name: str | None = None
    """Overrides the name checked against the server's certificate (e.g. when dialing an IP)."""

    def __post_init__(self) -> None:
        if (self.client_certificate is None) != (self.client_key is None):
            raise InvalidArgument.at(
                "tls", "a client certificate and its key go together (mutual TLS)"
            )

    @classmethod
    def from_files(
        cls,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        server_name: str | None = None,
    ) -> TlsConfig:
        """PEM files as written by cert-manager or `openssl`; any of them may be omitted."""

        def read(path: str | None, what: str) -> bytes | None:
            if not path:
                return None
            try:
                return Path(path).read_bytes()
            except OSError as error:
                raise InvalidArgument.at(
                    f"tls.{what}", f"cannot read {path}: {error.strerror}"
                ) from None

        return cls(read(ca_file, "ca"), read(cert_file, "cert"), read(key_file, "key"), server_name)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for calls that failed before the server acted on them.

    Retried: UNAVAILABLE (the server or its store could not be reached) on every call — safe for
    reserving calls because the client always sends an idempotency key — and DEADLINE_EXCEEDED
    on reads only (a timed-out write may have happened). Never retried: ABORTED (a reservation
    race: re-run Allocate on fresh state instead), INVALID_ARGUMENT and every other code.
    """

    max_attempts: int = 4
    initial_backoff_seconds: float = 0.1
    max_backoff_seconds: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.2
    """Each delay is scaled by a random factor in [1 - jitter, 1 + jitter]."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise InvalidArgument.at("retry.max_attempts", "must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise InvalidArgument.at("retry.jitter", "must be between 0 and 1")
        if self.initial_backoff_seconds < 0 or self.max_backoff_seconds < 0:
            raise InvalidArgument.at("retry", "backoff must not be negative")

    def delay(self, retry: int, random: Callable[[], float]) -> float:
        """Seconds to wait before retry number `retry` (1 for the first retry)."""
        base = self.initial_backoff_seconds * self.multiplier ** (retry - 1)
        capped = min(self.max_backoff_seconds, base)
        return capped * (1.0 - self.jitter + 2.0 * self.jitter * random())


NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass(frozen=True)
class ClientSettings:
    """Where the allocator (and inventory) is and how to talk to it, as the bridges read it."""

    target: str = DEFAULT_TARGET
    inventory_target: str = ""
    """Empty: the same address as `target` (as with `gpualloc serve`)."""
    deadline_seconds: float = 10.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    tls: TlsConfig | None = None
    token_file: Path | None = None
    """A bearer JWT sent with every call (re-read when it changes); TLS channels only."""

    def __post_init__(self) -> None:
        check_token_needs_tls(self.tls, self.token_file)

    @property
    def inventory(self) -> str:
        return self.inventory_target or self.target

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ClientSettings:
        """GPUALLOC_ALLOCATOR_ADDR and GPUALLOC_INVENTORY_ADDR (host:port; the inventory
        defaults to the allocator's address, as `gpualloc serve` serves both),
        GPUALLOC_CLIENT_DEADLINE (a Go duration), GPUALLOC_CLIENT_RETRIES (attempts),
        GPUALLOC_CLIENT_TLS_CA / _CERT / _KEY / _SERVER_NAME (PEM paths; any of them turns TLS
        on; cert and key together: mutual TLS), GPUALLOC_CLIENT_TOKEN_FILE (a file holding a
        bearer JWT, e.g. a projected service-account token; needs TLS)."""
        ca = env_str(environ, "GPUALLOC_CLIENT_TLS_CA", "")
        cert = env_str(environ, "GPUALLOC_CLIENT_TLS_CERT", "")
        key = env_str(environ, "GPUALLOC_CLIENT_TLS_KEY", "")
        server_name = env_str(environ, "GPUALLOC_CLIENT_TLS_SERVER_NAME", "")
        tls = None
        if ca or cert or key or server_name:
            tls = TlsConfig.from_files(ca or None, cert or None, key or None, server_name or None)
        token_file = env_str(environ, "GPUALLOC_CLIENT_TOKEN_FILE", "")
        attempts = env_int(environ, "GPUALLOC_CLIENT_RETRIES", 4, minimum=1, maximum=20)
        return cls(
            target=env_str(environ, "GPUALLOC_ALLOCATOR_ADDR", DEFAULT_TARGET),
            inventory_target=env_str(environ, "GPUALLOC_INVENTORY_ADDR", ""),
            deadline_seconds=env_duration(environ, "GPUALLOC_CLIENT_DEADLINE", 10.0, minimum=0.001),
            retry=RetryPolicy(max_attempts=attempts),
            tls=tls,
            token_file=Path(token_file) if token_file else None,
        )


def check_token_needs_tls(tls: TlsConfig | None, token_file: Path | str | None) -> None:
    """A bearer token is a password: never on a plaintext channel (gRPC does not send call
    credentials there, so the server would see an anonymous caller instead)."""
    if token_file and tls is None:
        raise InvalidArgument.at(
            "token_file",
            f"a bearer token ({token_file}) is sent over TLS only: set GPUALLOC_CLIENT_TLS_CA "
            "(--tls-ca) or another GPUALLOC_CLIENT_TLS_* setting too",
        )
