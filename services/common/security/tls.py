"""Server TLS from PEM files, reloaded when the files change; files watched without a restart.

cert-manager (and kubelet's Secret volumes) rotate certificates by swapping the files behind a
symlink; `WatchedFiles` notices a change of any file's (inode, size, mtime) — checked at most
once per `min_interval` — and reloads. The server's credentials are grpc's *dynamic* SSL
credentials: grpc asks for the current certificate at every new handshake, so a rotation is
picked up by the next connection while calls on existing connections carry on.

A rotation caught half-way (the new certificate beside the old key) is not applied: the pair is
checked to belong together first, and the old one keeps serving until the files agree.
TLS versions are grpc's defaults: 1.2 and 1.3 are served (tested); older ones are left to grpc.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar, cast

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from services.common.errors import FailedPrecondition, InvalidArgument

__all__ = [
    "ServerTls",
    "Stamp",
    "WatchedFiles",
    "file_stamp",
    "server_credentials",
    "tls_pair_problem",
]

T = TypeVar("T")

log = logging.getLogger("gpualloc.tls")

Stamp = tuple[int, int, int]  # inode, size, mtime_ns


def file_stamp(path: str) -> Stamp:
    """What tells a file (or a directory: its entries) changed; OSError when it is missing."""
    info = os.stat(path)
    return (info.st_ino, info.st_size, info.st_mtime_ns)


class WatchedFiles(Generic[T]):
    """The value `load` makes of some files' contents, made again when any of them changes.

    `current()` is cheap (one `stat` per file at most every `min_interval` seconds). A reload
    that fails keeps the last good value and logs why; the first load's failure is raised.
    `follow`: the other files a value was made from (the files an access policy names), with
    the stamps they had when `load` read them; a change of any of them reloads too."""

    def __init__(
        self,
        paths: Sequence[str],
        load: Callable[[Sequence[bytes]], T],
        *,
        what: str,
        min_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        follow: Callable[[T], Mapping[str, Stamp]] | None = None,
    ) -> None:
        self._paths = tuple(paths)
        self._follow = follow
        self._load = load
        self._what = what
        self._min_interval = min_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._stamps = self._stat()
        self._value = load(self._read())
        self._checked = clock()

    def current(self) -> T:
        self.poll()
        return self._value

    def poll(self) -> bool:
        """Reload if a file changed since the last look; True when a new value was loaded."""
        now = self._clock()
        if now - self._checked < self._min_interval:
            return False
        with self._lock:
            self._checked = now
            try:
                stamps = self._stat()
            except FailedPrecondition as error:
                log.error("%s: keeping the previous one: %s", self._what, error)
                return False
            if stamps == self._stamps and not self._followed_changed():
                return False
            try:
                value = self._load(self._read())
            except Exception as error:  # a broken rotation must not take the server down
                log.error(
                    "%s changed but cannot be loaded, keeping the previous one: %s",
                    self._what,
                    error,
                )
                return False
            self._stamps, self._value = stamps, value
            log.info("%s reloaded from %s", self._what, ", ".join(self._paths))
            return True

    def _followed_changed(self) -> bool:
        if self._follow is None:
            return False
        for path, stamp in self._follow(self._value).items():
            try:
                if file_stamp(path) != stamp:
                    return True
            except OSError:
                return True
        return False

    def _stat(self) -> tuple[Stamp, ...]:
        stamps = []
        for path in self._paths:
            try:
                info = os.stat(path)
            except OSError as error:
                raise FailedPrecondition(
                    f"{self._what}: cannot read {path}: {error.strerror}"
                ) from None
            stamps.append((info.st_ino, info.st_size, info.st_mtime_ns))
        return tuple(stamps)

    def _read(self) -> list[bytes]:
        contents = []
        for path in self._paths:
            try:
                contents.append(Path(path).read_bytes())
            except OSError as error:
                raise FailedPrecondition(
                    f"{self._what}: cannot read {path}: {error.strerror}"
                ) from None
        return contents


@dataclass(frozen=True)
class ServerTls:
    """PEM paths: the certificate chain and key, and the CA of client certificates (mTLS)."""

    cert_file: str
    key_file: str
    client_ca_file: str = ""

    @property
    def mutual(self) -> bool:
        return bool(self.client_ca_file)


@dataclass(frozen=True)
class _Material:
    chain: bytes
    key: bytes
    client_ca: bytes | None


def tls_pair_problem(chain: bytes, key: bytes) -> str | None:
    """Why a certificate chain and a key cannot serve together, or None when they can."""
    try:
        certificate = x509.load_pem_x509_certificates(chain)[0]
    except ValueError as error:
        return f"the certificate is not PEM X.509: {error}"
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as error:
        return f"the key is not an unencrypted PEM private key: {error}"
    raw = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if certificate.public_key().public_bytes(*raw) != private.public_key().public_bytes(*raw):
        return "the key does not belong to the certificate"
    return None


def _load_material(contents: Sequence[bytes]) -> _Material:
    chain, key = contents[0], contents[1]
    problem = tls_pair_problem(chain, key)
    if problem is not None:
        raise InvalidArgument.at("GPUALLOC_TLS_CERT", problem)
    client_ca = contents[2] if len(contents) > 2 else None
    if client_ca is not None:
        try:
            x509.load_pem_x509_certificates(client_ca)
        except ValueError as error:
            raise InvalidArgument.at(
                "GPUALLOC_TLS_CLIENT_CA", f"not PEM X.509 certificates: {error}"
            ) from None
    return _Material(chain, key, client_ca)


def server_credentials(tls: ServerTls, *, min_interval: float = 1.0) -> grpc.ServerCredentials:
    """Credentials serving the files' current certificate at every handshake. Raises
    InvalidArgument/FailedPrecondition at start."""
    paths = [tls.cert_file, tls.key_file, *([tls.client_ca_file] if tls.mutual else [])]
    watched = WatchedFiles(paths, _load_material, what="TLS certificate", min_interval=min_interval)

    def configuration(material: _Material) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(material.key, material.chain)], root_certificates=material.client_ca
        )

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        # Called by grpc before each handshake; None keeps the configuration it has.
        return configuration(watched.current()) if watched.poll() else None

    # grpc documents None as "keep the current configuration"; the type stubs omit it.
    fetcher = cast(Callable[[], grpc.ServerCertificateConfiguration], fetch)
    credentials = grpc.dynamic_ssl_server_credentials(
        configuration(watched.current()), fetcher, require_client_authentication=tls.mutual
    )
    return credentials
