"""A fleet served with mutual TLS and an AccessPolicy, for the security tests and benchmarks.

`secured_fleet(directory)` makes a throwaway CA (services.common.security.devcerts), a server
certificate for 127.0.0.1/localhost, one client certificate per identity in `IDENTITIES`, an
RSA key for signing JWTs with its JWKS, and the policy file below; then starts the example
cluster (services.bridges.local_cluster) twice over the same apps: on an mTLS port (client
certificates are the identity) and on a TLS-only port (bearer JWTs are).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from services.allocator.config import AllocatorSettings
from services.bridges import local_cluster
from services.common.config import ServerSettings
from services.common.grpc_server import create_server
from services.common.health import Health
from services.common.security.devcerts import (
    CertificateAuthority,
    IssuedCertificate,
    write_certificate,
)

ISSUER = "https://kubernetes.default.svc.cluster.local"
AUDIENCE = "gpualloc"
KUEUE_SUBJECT = "system:serviceaccount:kueue-system:gpualloc-kueue"
AGENT_SUBJECT = "system:serviceaccount:gpualloc:gpualloc-agent"

# name -> (common name, DNS SANs, URI SANs)
IDENTITIES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "scheduler-a": ("scheduler-a", (), ("spiffe://fleet.test/ns/team-a/sa/scheduler",)),
    "scheduler-b": ("scheduler-b", ("scheduler.team-b.fleet.test",), ()),
    "reader": ("fleet-reader", (), ()),
    "agent": ("agent", ("agent-node-1.agents.fleet.test",), ()),
    "inventory-admin": ("inventory-admin", (), ()),
    "admin": ("ops-admin", (), ()),
    "monitor": ("monitor", (), ()),  # a scheduler of a tenant allowed adminAccess
    "stranger": ("stranger", (), ()),  # a valid certificate nobody bound
    "slurm-bridge": ("slurm-bridge", (), ("spiffe://fleet.test/ns/slurm/sa/bridge",)),
}

TENANTS = """\
  tenants:
  - name: team-a
  - name: team-b
  - name: team-c
  - name: tools
    allowAdminAccess: true
  - name: hpc
"""

POLICY = f"""\
apiVersion: gpualloc.dev/v1alpha1
kind: AccessPolicy
metadata:
  name: test-fleet
spec:
  authentication:
    jwt:
    - issuer: {ISSUER}
      audiences: [{AUDIENCE}]
      jwksFile: JWKS_FILE
{TENANTS}  bindings:
  - name: scheduler-a
    subjects: [{{kind: SPIFFE, name: "spiffe://fleet.test/ns/team-a/sa/scheduler"}}]
    tenant: team-a
    roles: [scheduler]
    actFor: ["job/*"]
  - name: scheduler-b
    subjects: [{{kind: DNS, name: scheduler.team-b.fleet.test}}]
    tenant: team-b
    roles: [scheduler]
    actFor: ["job/*"]
  - name: kueue
    subjects: [{{kind: JWT, issuer: "{ISSUER}", name: "{KUEUE_SUBJECT}"}}]
    tenant: team-c
    roles: [scheduler]
    actFor: ["kueue/*"]
  - name: slurm-bridge
    subjects: [{{kind: SPIFFE, name: "spiffe://fleet.test/ns/slurm/sa/bridge"}}]
    tenant: hpc
    roles: [scheduler]
    actFor: ["slurm/job/*"]
  - name: readers
    subjects: [{{kind: CommonName, name: fleet-reader}}]
    roles: [reader]
  - name: agents
    subjects: [{{kind: DNS, name: "*.agents.fleet.test"}}]
    roles: [agent]
  - name: agent-tokens
    subjects: [{{kind: JWT, issuer: "{ISSUER}", name: "{AGENT_SUBJECT}"}}]
    roles: [agent]
  - name: inventory-admins
    subjects: [{{kind: CommonName, name: inventory-admin}}]
    roles: [inventory-admin]
  - name: operators
    subjects: [{{kind: CommonName, name: ops-admin}}]
    roles: [admin]
  - name: monitor
    subjects: [{{kind: CommonName, name: monitor}}]
    tenant: tools
    roles: [scheduler]
    actFor: ["job/*"]
"""


def policy_with(section: str) -> str:
    """POLICY with its `tenants` section replaced by `section` (quotas, cohorts...)."""
    return POLICY.replace(TENANTS, section)


@dataclass
class SecuredFleet:
    directory: Path
    ca: CertificateAuthority
    certificates: dict[str, IssuedCertificate]
    signing_key: rsa.RSAPrivateKey
    mtls_port: int
    tls_port: int
    policy_file: Path
    cluster: local_cluster.LocalCluster
    tls_server: grpc.Server
    _channels: list[grpc.Channel] = field(default_factory=list)

    def channel(self, who: str | None, *, port: int | None = None) -> grpc.Channel:
        """A TLS channel to the mTLS port, with `who`'s client certificate (None: none)."""
        issued = self.certificates[who] if who is not None else None
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.ca.certificate_pem,
            private_key=issued.private_key if issued else None,
            certificate_chain=issued.certificate_chain if issued else None,
        )
        target = f"127.0.0.1:{port if port is not None else self.mtls_port}"
        channel = grpc.secure_channel(target, credentials)
        self._channels.append(channel)
        return channel

    def client_environ(self, who: str) -> dict[str, str]:
        """The GPUALLOC_CLIENT_* variables a bridge or CLI dials the mTLS port with as `who`."""
        directory = self.directory / who
        return {
            "GPUALLOC_ALLOCATOR_ADDR": f"127.0.0.1:{self.mtls_port}",
            "GPUALLOC_CLIENT_TLS_CA": str(self.directory / "ca.crt"),
            "GPUALLOC_CLIENT_TLS_CERT": str(directory / "tls.crt"),
            "GPUALLOC_CLIENT_TLS_KEY": str(directory / "tls.key"),
        }

    def token_channel(self) -> grpc.Channel:
        """A TLS channel (no client certificate) to the token port."""
        return self.channel(None, port=self.tls_port)

    def token(
        self,
        subject: str = KUEUE_SUBJECT,
        *,
        audience: str = AUDIENCE,
        issuer: str = ISSUER,
        expires_in: float = 600,
        key: rsa.RSAPrivateKey | None = None,
        kid: str = "test-key",
        node: str = "",
    ) -> str:
        now = int(time.time())
        claims: dict[str, object] = {
            "iss": issuer,
            "sub": subject,
            "aud": audience,
            "iat": now,
            "exp": now + int(expires_in),
        }
        if node:  # as the tokens kubelet projects into a pod carry it
            claims["kubernetes.io"] = {"namespace": "gpualloc", "node": {"name": node, "uid": "u"}}
        return jwt.encode(claims, key or self.signing_key, algorithm="RS256", headers={"kid": kid})

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        self.tls_server.stop(None).wait()
        self.cluster.close()


def issue_all(ca: CertificateAuthority, directory: Path) -> dict[str, IssuedCertificate]:
    issued = {"server": ca.issue("gpualloc", dns_names=("localhost",), ip_addresses=("127.0.0.1",))}
    for name, (common_name, dns, uris) in IDENTITIES.items():
        issued[name] = ca.issue(common_name, dns_names=dns, uris=uris, server=False)
    for name, certificate in issued.items():
        write_certificate(directory / name, certificate)
    return issued


def write_jwks(path: Path, keys: Sequence[tuple[str, rsa.RSAPrivateKey]]) -> None:
    entries = []
    for kid, key in keys:
        entry = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
        entry.update({"kid": kid, "use": "sig", "alg": "RS256"})
        entries.append(entry)
    path.write_text(json.dumps({"keys": entries}))


@contextmanager
def secured_fleet(
    directory: Path,
    *,
    policy: str = POLICY,
    allocator: AllocatorSettings | None = None,
    **server: Any,
) -> Iterator[SecuredFleet]:
    """The fleet; `policy` replaces the policy file's text (JWKS_FILE is filled in),
    `allocator` the allocator's settings (e.g. a Redis URL), `server` overrides ServerSettings
    fields of the mTLS port (limits)."""
    ca = CertificateAuthority.create("gpualloc test CA")
    ca.save(directory)
    certificates = issue_all(ca, directory)
    signing_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks = directory / "jwks.json"
    write_jwks(jwks, [("test-key", signing_key)])
    policy_file = directory / "policy.yaml"
    policy_file.write_text(policy.replace("JWKS_FILE", str(jwks)))
    server_dir = directory / "server"
    mtls = ServerSettings(
        tls_cert_file=str(server_dir / "tls.crt"),
        tls_key_file=str(server_dir / "tls.key"),
        tls_client_ca_file=str(directory / "ca.crt"),
        auth_policy_file=str(policy_file),
        **server,
    )
    cluster = local_cluster.start(server=mtls, settings=allocator)
    tls_only = ServerSettings(
        tls_cert_file=mtls.tls_cert_file,
        tls_key_file=mtls.tls_key_file,
        auth_policy_file=str(policy_file),
    )
    tls_server, tls_port = create_server(
        "127.0.0.1:0",
        [cluster.inventory.registration, cluster.allocator.registration],
        tls_only,
        health=Health(),
    )
    tls_server.start()
    fleet = SecuredFleet(
        directory,
        ca,
        certificates,
        signing_key,
        cluster.port,
        tls_port,
        policy_file,
        cluster,
        tls_server,
    )
    try:
        yield fleet
    finally:
        fleet.close()
