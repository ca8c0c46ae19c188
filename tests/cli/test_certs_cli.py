"""`gpualloc certs` run for real (the console script, in a subprocess, and run_certs in process):
the files it writes are read back with `cryptography` and verified against the CA it made."""

from __future__ import annotations

import io
import ipaddress
import stat
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.security.certs_cli import EXIT_INVALID, parse_spec, run_certs

SPIFFE = "spiffe://fleet.example/ns/slurm/sa/bridge"


def gpualloc_certs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "certs", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def run(out: Path, servers: list[str], clients: list[str]) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = run_certs(out, servers=servers, clients=clients, stdout=stdout, stderr=stderr)
    return code, stdout.getvalue(), stderr.getvalue()


def load_ca(out: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())


def leaf_and_chain(directory: Path) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates((directory / "tls.crt").read_bytes())


def sans(certificate: x509.Certificate) -> list[str]:
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    result = [f"DNS:{n}" for n in names.get_values_for_type(x509.DNSName)]
    result += [f"IP:{n}" for n in names.get_values_for_type(x509.IPAddress)]
    result += [f"URI:{n}" for n in names.get_values_for_type(x509.UniformResourceIdentifier)]
    return result


def usages(certificate: x509.Certificate) -> set[x509.ObjectIdentifier]:
    return set(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def common_name(certificate: x509.Certificate) -> str:
    (attribute,) = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attribute.value)


# --- the console script, end to end --------------------------------------------------------------


def test_the_console_script_writes_cert_manager_files_and_prints_the_settings(
    tmp_path: Path,
) -> None:
    out = tmp_path / "certs"
    done = gpualloc_certs(
        "--out",
        str(out),
        "--server",
        "inventory:localhost,127.0.0.1",
        "--client",
        f"bridge:{SPIFFE}",
    )
    assert done.returncode == 0, done.stderr
    assert {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} == {
        "ca.crt",
        "ca.key",
        *(f"{name}/{file}" for name in ("inventory", "bridge")
          for file in ("tls.crt", "tls.key", "ca.crt")),
    }  # fmt: skip
    for key in (out / "ca.key", out / "inventory" / "tls.key", out / "bridge" / "tls.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    lines = done.stdout.splitlines()
    assert f"  GPUALLOC_TLS_CERT={out / 'inventory' / 'tls.crt'}" in lines
    assert f"  GPUALLOC_TLS_KEY={out / 'inventory' / 'tls.key'}" in lines
    assert f"  GPUALLOC_TLS_CLIENT_CA={out / 'ca.crt'}" in lines
    assert f"  GPUALLOC_CLIENT_TLS_CA={out / 'ca.crt'}" in lines
    assert f"  GPUALLOC_CLIENT_TLS_CERT={out / 'bridge' / 'tls.crt'}" in lines
    assert f"  GPUALLOC_CLIENT_TLS_KEY={out / 'bridge' / 'tls.key'}" in lines


def test_the_help_documents_the_forms() -> None:
    done = gpualloc_certs("--help")
    assert done.returncode == 0
    assert "--server NAME[:SAN,...]" in done.stdout and "spiffe://" in done.stdout


# --- what the certificates say -------------------------------------------------------------------


def test_a_server_certificate_verifies_for_each_of_its_names_and_serves_and_connects(
    tmp_path: Path,
) -> None:
    code, _, err = run(tmp_path, ["allocator:gpualloc-allocator.gpualloc.svc,127.0.0.1,::1"], [])
    assert code == 0, err
    leaf, ca_in_chain = leaf_and_chain(tmp_path / "allocator")
    ca = load_ca(tmp_path)
    assert ca_in_chain == ca
    assert (tmp_path / "allocator" / "ca.crt").read_bytes() == (tmp_path / "ca.crt").read_bytes()
    assert common_name(leaf) == "allocator"
    assert sans(leaf) == [
        "DNS:allocator",
        "DNS:gpualloc-allocator.gpualloc.svc",
        "IP:127.0.0.1",
        "IP:::1",
    ]
    # the allocator is the inventory's client too: both usages
    assert usages(leaf) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    store = Store([ca])
    names: list[x509.DNSName | x509.IPAddress] = [
        x509.DNSName("allocator"),
        x509.DNSName("gpualloc-allocator.gpualloc.svc"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    for name in names:
        chain = PolicyBuilder().store(store).build_server_verifier(name).verify(leaf, [])
        assert chain[-1] == ca
    with pytest.raises(x509.verification.VerificationError):
        PolicyBuilder().store(store).build_server_verifier(x509.DNSName("elsewhere")).verify(
            leaf, []
        )


@pytest.mark.parametrize(
    ("spec", "expected_sans"),
    [
        pytest.param(f"bridge:{SPIFFE}", [f"URI:{SPIFFE}"], id="spiffe-id"),
        pytest.param(f"bridge={SPIFFE}", [f"URI:{SPIFFE}"], id="spiffe-id-with-equals"),
        pytest.param(f"bridge,{SPIFFE}", [f"URI:{SPIFFE}"], id="spiffe-id-with-comma"),
        pytest.param("node-1:node-1.agents.fleet.example", ["DNS:node-1.agents.fleet.example"],
                     id="dns-name"),
        pytest.param("mixed:a.example,spiffe://fleet.example/x,10.0.0.1",
                     ["DNS:a.example", "IP:10.0.0.1", "URI:spiffe://fleet.example/x"],
                     id="dns-ip-and-uri"),
    ],
)  # fmt: skip
def test_a_client_certificate_carries_its_sans_and_verifies_as_a_client(
    tmp_path: Path, spec: str, expected_sans: list[str]
) -> None:
    code, _, err = run(tmp_path, [], [spec])
    assert code == 0, err
    name = parse_spec(spec, server=False).name
    leaf, _ = leaf_and_chain(tmp_path / name)
    assert common_name(leaf) == name
    assert sans(leaf) == expected_sans
    assert usages(leaf) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    verified = PolicyBuilder().store(Store([load_ca(tmp_path)])).build_client_verifier()
    result = verified.verify(leaf, [])
    verified_names = [str(s.value) for s in result.subjects or []]
    assert verified_names == [s.split(":", 1)[1] for s in expected_sans]


def test_a_client_without_sans_is_known_by_its_common_name(tmp_path: Path) -> None:
    code, _, err = run(tmp_path, [], ["ops-admin"])
    assert code == 0, err
    leaf, _ = leaf_and_chain(tmp_path / "ops-admin")
    assert (common_name(leaf), sans(leaf)) == ("ops-admin", [])
    assert usages(leaf) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    leaf.verify_directly_issued_by(load_ca(tmp_path))  # raises when the signature is not the CA's


def test_a_second_run_reuses_the_ca_and_its_certificates_still_verify(tmp_path: Path) -> None:
    assert run(tmp_path, ["inventory"], [])[0] == 0
    first_ca = (tmp_path / "ca.crt").read_bytes()
    code, out, _ = run(tmp_path, ["allocator"], ["ops-admin"])
    assert code == 0
    assert out.startswith("reused CA")
    assert (tmp_path / "ca.crt").read_bytes() == first_ca
    ca = load_ca(tmp_path)
    for name in ("inventory", "allocator", "ops-admin"):
        leaf_and_chain(tmp_path / name)[0].verify_directly_issued_by(ca)


def test_a_ca_from_another_directory_does_not_verify(tmp_path: Path) -> None:
    assert run(tmp_path / "a", ["inventory"], [])[0] == 0
    assert run(tmp_path / "b", ["inventory"], [])[0] == 0
    leaf, _ = leaf_and_chain(tmp_path / "a" / "inventory")
    with pytest.raises(x509.verification.VerificationError):
        PolicyBuilder().store(Store([load_ca(tmp_path / "b")])).build_server_verifier(
            x509.DNSName("inventory")
        ).verify(leaf, [])


# --- bad input: exit 2, one line, nothing written ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param([], "nothing to issue", id="nothing-to-issue"),
        pytest.param(["--server", "bad name"], "the name must be", id="name-with-a-space"),
        pytest.param(["--server", "../up"], "the name must be", id="name-escaping-the-directory"),
        pytest.param(["--client", "ca.key"], "the name must be", id="name-of-the-ca-key"),
        pytest.param(["--server", "api:"], "empty SAN", id="empty-san"),
        pytest.param(["--server", "api:a,,b"], "empty SAN", id="empty-san-in-the-list"),
        pytest.param(["--server", "api:bad_host!"], "is not a DNS name", id="bad-dns-name"),
        pytest.param(["--server", f"api:{SPIFFE}"], "servers take DNS names", id="uri-on-a-server"),
        pytest.param(["--client", "b:https://fleet.example/x"], "is not a SPIFFE ID",
                     id="uri-that-is-not-spiffe"),
        pytest.param(["--client", "b:spiffe://"], "is not a SPIFFE ID", id="spiffe-without-domain"),
        pytest.param(["--server", "api", "--client", "api"], "named twice", id="duplicate-name"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_with_a_message_and_writes_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "certs"
    done = gpualloc_certs("--out", str(out), *args)
    assert done.returncode == EXIT_INVALID
    assert message in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.startswith("gpualloc certs: ")
    assert not out.exists()


def test_a_ca_certificate_without_its_key_is_never_replaced(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("someone else's CA\n")
    code, _, err = run(tmp_path, ["inventory"], [])
    assert code == EXIT_INVALID and "refusing to replace" in err
    assert (tmp_path / "ca.crt").read_text() == "someone else's CA\n"
    assert not (tmp_path / "inventory").exists()


def test_an_unreadable_ca_key_is_a_clear_error(tmp_path: Path) -> None:
    assert run(tmp_path, ["inventory"], [])[0] == 0
    (tmp_path / "ca.key").write_text("not a key\n")
    code, _, err = run(tmp_path, ["allocator"], [])
    assert code == EXIT_INVALID and "cannot reuse the CA" in err
    assert not (tmp_path / "allocator").exists()


def test_out_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    done = gpualloc_certs("--out", str(tmp_path / "file"), "--server", "api")
    assert done.returncode == EXIT_INVALID and "not a directory" in done.stderr


# --- the certificates in gRPC's own TLS, as the servers and clients use them ----------------------


@pytest.fixture
def mtls_health_server(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A gRPC health server on 127.0.0.1 requiring client certificates from the CA `gpualloc
    certs` made (the server certificate `inventory` from it too)."""
    assert run(tmp_path, ["inventory:localhost,127.0.0.1"], ["dev"])[0] == 0
    directory = tmp_path / "inventory"
    credentials = grpc.ssl_server_credentials(
        [((directory / "tls.key").read_bytes(), (directory / "tls.crt").read_bytes())],
        root_certificates=(tmp_path / "ca.crt").read_bytes(),
        require_client_auth=True,
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    yield tmp_path, port
    server.stop(grace=None).wait()


def health_check(port: int, ca: Path, client: Path | None, server_name: str) -> grpc.StatusCode:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=(client / "tls.key").read_bytes() if client else None,
        certificate_chain=(client / "tls.crt").read_bytes() if client else None,
    )
    options = [("grpc.ssl_target_name_override", server_name)]
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials, options=options) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize(
    ("client", "server_name", "expected"),
    [
        pytest.param("dev", "localhost", grpc.StatusCode.OK, id="client-cert-and-dns-name"),
        pytest.param("dev", "inventory", grpc.StatusCode.OK, id="client-cert-and-the-cn-name"),
        pytest.param(None, "localhost", grpc.StatusCode.UNAVAILABLE, id="no-client-cert-refused"),
        pytest.param("dev", "elsewhere", grpc.StatusCode.UNAVAILABLE,
                     id="name-not-in-the-certificate-refused"),
    ],
)  # fmt: skip
def test_the_certificates_work_in_grpc_mutual_tls(
    mtls_health_server: tuple[Path, int],
    client: str | None,
    server_name: str,
    expected: grpc.StatusCode,
) -> None:
    out, port = mtls_health_server
    got = health_check(port, out / "ca.crt", out / client if client else None, server_name)
    assert got == expected


def test_a_client_of_another_ca_is_refused(
    mtls_health_server: tuple[Path, int], tmp_path: Path
) -> None:
    out, port = mtls_health_server
    assert run(tmp_path / "other", [], ["dev"])[0] == 0
    got = health_check(port, out / "ca.crt", tmp_path / "other" / "dev", "localhost")
    assert got == grpc.StatusCode.UNAVAILABLE
