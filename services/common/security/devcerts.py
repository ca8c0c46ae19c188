"""Throwaway certificates for development, tests and docker-compose: a CA, servers and clients.

Files are written with cert-manager's names so the servers read them the same way in every
layout: `<dir>/ca.crt` (the CA), and per certificate `<dir>/<name>/tls.crt` (the leaf, then the
CA), `<dir>/<name>/tls.key` (PKCS#8 PEM, mode 0600) and `<dir>/<name>/ca.crt`.

Keys are ECDSA P-256 (fast handshakes, what cert-manager issues with `algorithm: ECDSA`). The CA
key stays in `<dir>/ca.key` so that more certificates can be issued later; production uses
cert-manager (deploy/k8s) or the site's own PKI instead.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertificateAuthority", "IssuedCertificate", "write_certificate"]

_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class IssuedCertificate:
    """PEM bytes of one leaf certificate (chain: leaf then CA) and its key."""

    certificate_chain: bytes
    private_key: bytes
    ca_certificate: bytes


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, certificate: x509.Certificate) -> None:
        self.key = key
        self.certificate = certificate

    @classmethod
    def create(cls, common_name: str = "gpualloc development CA") -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = _now()
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY * 5)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, certificate)

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{directory / 'ca.key'}: not an ECDSA key")
        certificate = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
        return cls(key, certificate)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "ca.crt").write_bytes(self.certificate_pem)
        _write_private(directory / "ca.key", _key_pem(self.key))

    def _authority_key_identifier(self) -> x509.AuthorityKeyIdentifier:
        try:
            ski = self.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
        except x509.ExtensionNotFound:  # a CA made before the CA carried one
            return x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key())
        return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski.value)

    @property
    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str,
        *,
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
        uris: Sequence[str] = (),
        server: bool = True,
        client: bool = True,
        valid_for: datetime.timedelta = _VALIDITY,
        not_before: datetime.datetime | None = None,
    ) -> IssuedCertificate:
        """A leaf certificate for a server and/or a client (both usages by default, as the
        allocator is the inventory's client too)."""
        key = ec.generate_private_key(ec.SECP256R1())
        start = not_before or (_now() - datetime.timedelta(minutes=5))
        names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        names += [x509.UniformResourceIdentifier(uri) for uri in uris]
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] * server + [ExtendedKeyUsageOID.CLIENT_AUTH] * (
            client
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + valid_for)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            # RFC 5280 requires it, and strict verifiers (cryptography's, Go's) refuse without it
            .add_extension(self._authority_key_identifier(), critical=False)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        chain = certificate.public_bytes(serialization.Encoding.PEM) + self.certificate_pem
        return IssuedCertificate(chain, _key_pem(key), self.certificate_pem)


def write_certificate(directory: Path, issued: IssuedCertificate) -> Path:
    """Write `tls.crt`, `tls.key` (0600) and `ca.crt` into `directory`; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.crt").write_bytes(issued.ca_certificate)
    # Key first, certificate last: a watcher that sees the new certificate finds its key.
    _write_private(directory / "tls.key", issued.private_key)
    _replace(directory / "tls.crt", issued.certificate_chain)
    return directory


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_private(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)


def _replace(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)
