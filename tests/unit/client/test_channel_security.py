"""The client's channel over real TLS: server TLS, mutual TLS, bearer token files, refusals.

Every case dials a real grpc server on 127.0.0.1:0 (tests/tls_fixtures.py) with certificates
made by the test, and asserts on what reached the server: the `authorization` metadata and the
TLS peer gRPC authenticated (`auth_context`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.client import (
    AllocatorClient,
    ClientSettings,
    InventoryClient,
    RetryPolicy,
    TlsConfig,
)
from services.client.calls import open_channel
from services.client.credentials import BearerTokenFile
from services.common.errors import InvalidArgument, Unavailable
from tests.tls_fixtures import Pki, TlsServer


def check(channel: grpc.Channel) -> None:
    """One health Check, failing fast (no retry, short deadline) when TLS does not work."""
    health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)


def token_file(directory: Path, token: str) -> Path:
    """Written as the kubelet does: a new file renamed over the old one."""
    path = directory / "token"
    fresh = directory / "token.new"
    fresh.write_text(token + "\n")
    os.replace(fresh, path)
    return path


def test_server_tls_without_client_certificate(pki: Pki, tls_server) -> None:
    served: TlsServer = tls_server(pki, require_client_auth=False)
    with open_channel(served.target, pki.client_tls(mutual=False)) as channel:
        check(channel)
    assert served.calls[-1].auth_context.get("transport_security_type") == (b"ssl",)
    assert served.calls[-1].peer_uris == ()


def test_mutual_tls_presents_the_client_certificate(pki: Pki, tls_server) -> None:
    served: TlsServer = tls_server(pki)
    with open_channel(served.target, pki.client_tls()) as channel:
        check(channel)
    call = served.calls[-1]
    assert call.peer_uris == (pki.client_uri,)
    assert call.peer_common_name == "gpualloc-client"
    assert call.authorization == ""


@pytest.mark.parametrize(
    ("target", "server_name"),
    [
        pytest.param("ip", None, id="ip-san"),
        pytest.param("localhost", None, id="dns-san"),
        pytest.param("ip", "gpualloc.test", id="server-name-override"),
    ],
)
def test_server_names_that_match_the_certificate(
    pki: Pki, tls_server, target: str, server_name: str | None
) -> None:
    served: TlsServer = tls_server(pki)
    address = served.target if target == "ip" else served.localhost
    with open_channel(address, pki.client_tls(server_name=server_name)) as channel:
        check(channel)


def _wrong_ca(pki: Pki, tmp_path: Path) -> TlsConfig:
    return Pki.create(tmp_path / "other").client_tls()


def _no_client_certificate(pki: Pki, tmp_path: Path) -> TlsConfig:
    return pki.client_tls(mutual=False)


def _client_certificate_of_another_ca(pki: Pki, tmp_path: Path) -> TlsConfig:
    other = Pki.create(tmp_path / "other")
    return pki.client_tls(other.client)


def _wrong_server_name(pki: Pki, tmp_path: Path) -> TlsConfig:
    return pki.client_tls(server_name="not-the-server.test")


@pytest.mark.parametrize(
    "make_tls",
    [
        pytest.param(_wrong_ca, id="server-certificate-from-another-ca"),
        pytest.param(_no_client_certificate, id="mtls-required-no-client-certificate"),
        pytest.param(_client_certificate_of_another_ca, id="client-certificate-from-another-ca"),
        pytest.param(_wrong_server_name, id="server-name-not-in-certificate"),
    ],
)
def test_handshakes_that_fail_are_unavailable(pki: Pki, tls_server, tmp_path, make_tls) -> None:
    served: TlsServer = tls_server(pki)
    tls = make_tls(pki, tmp_path)
    with open_channel(served.target, tls) as channel, pytest.raises(grpc.RpcError) as raised:
        check(channel)
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
    assert served.calls == []


def test_library_reports_a_failed_handshake_as_unavailable_after_retries(
    pki: Pki, tls_server, tmp_path: Path
) -> None:
    served: TlsServer = tls_server(pki)
    sleeps: list[float] = []
    with (
        AllocatorClient(
            served.target,
            tls=Pki.create(tmp_path / "other").client_tls(),
            retry=RetryPolicy(max_attempts=3),
            sleep=sleeps.append,
        ) as client,
        pytest.raises(Unavailable),
    ):
        client.list()
    assert len(sleeps) == 2  # retried as any unreachable server
    assert served.calls == []


def test_plaintext_client_cannot_talk_to_a_tls_server(pki: Pki, tls_server) -> None:
    served: TlsServer = tls_server(pki)
    with open_channel(served.target, None) as channel, pytest.raises(grpc.RpcError) as raised:
        check(channel)
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE


def test_token_is_sent_and_reread_when_the_file_is_rotated(
    pki: Pki, tls_server, tmp_path: Path
) -> None:
    served: TlsServer = tls_server(pki)
    path = token_file(tmp_path, "eyJ.first.token")
    with open_channel(served.target, pki.client_tls(), token_file=path) as channel:
        check(channel)
        check(channel)
        token_file(tmp_path, "eyJ.second.token-after-rotation")
        check(channel)
    assert [c.authorization for c in served.calls] == [
        "Bearer eyJ.first.token",
        "Bearer eyJ.first.token",
        "Bearer eyJ.second.token-after-rotation",
    ]
    assert all(c.peer_uris == (pki.client_uri,) for c in served.calls)


def test_token_file_is_read_again_only_when_it_changes(tmp_path: Path) -> None:
    path = token_file(tmp_path, "tok-1")
    plugin = BearerTokenFile(path)
    assert [plugin.token(), plugin.token()] == ["tok-1", "tok-1"]
    assert plugin.reads == 1
    path.write_text("tok-22")  # rewritten in place (another size): seen too
    assert plugin.token() == "tok-22"
    assert plugin.reads == 2


def test_unreadable_token_after_start_keeps_the_last_one(tmp_path: Path) -> None:
    path = token_file(tmp_path, "tok-1")
    plugin = BearerTokenFile(path)
    path.unlink()
    assert plugin.token() == "tok-1"
    path.write_text("")  # an empty file mid-swap is not a token either
    assert plugin.token() == "tok-1"
    token_file(tmp_path, "tok-2")
    assert plugin.token() == "tok-2"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(None, "cannot read", id="missing"),
        pytest.param("", "is empty", id="empty"),
        pytest.param("  \n", "is empty", id="only-whitespace"),
        pytest.param("two words", "no spaces", id="space-inside"),
        pytest.param("tök", "ASCII", id="not-ascii"),
    ],
)
def test_bad_token_files_are_refused_at_start(
    pki: Pki, tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(InvalidArgument) as raised:
        open_channel("127.0.0.1:1", pki.client_tls(), token_file=path)
    assert raised.value.field_path == "token_file"
    assert message in str(raised.value)


def test_token_without_tls_is_refused(tmp_path: Path) -> None:
    path = token_file(tmp_path, "tok")
    refusals: list[Callable[[], object]] = [
        lambda: open_channel("127.0.0.1:1", None, token_file=path),
        lambda: AllocatorClient("127.0.0.1:1", token_file=path),
        lambda: InventoryClient("127.0.0.1:1", token_file=path),
        lambda: ClientSettings(token_file=path),
        lambda: ClientSettings.from_env({"GPUALLOC_CLIENT_TOKEN_FILE": str(path)}),
    ]
    for refuse in refusals:
        with pytest.raises(InvalidArgument, match="over TLS only") as raised:
            refuse()
        assert raised.value.field_path == "token_file"


def test_settings_from_env_reach_the_server(pki: Pki, tls_server, tmp_path: Path) -> None:
    served: TlsServer = tls_server(pki)
    path = token_file(tmp_path, "env-token")
    settings = ClientSettings.from_env(
        {
            "GPUALLOC_ALLOCATOR_ADDR": served.target,
            "GPUALLOC_CLIENT_TLS_CA": str(pki.ca),
            "GPUALLOC_CLIENT_TLS_CERT": str(pki.client.cert),
            "GPUALLOC_CLIENT_TLS_KEY": str(pki.client.key),
            "GPUALLOC_CLIENT_TLS_SERVER_NAME": "gpualloc.test",
            "GPUALLOC_CLIENT_TOKEN_FILE": str(path),
        }
    )
    assert settings.token_file == path
    assert settings.tls is not None and settings.tls.server_name == "gpualloc.test"
    with (
        AllocatorClient(settings.target, tls=settings.tls, token_file=settings.token_file) as c,
        InventoryClient(settings.inventory, tls=settings.tls, token_file=path) as inventory,
    ):
        assert c.list() == []
        assert inventory.nodes() == []
    methods = [call.method for call in served.calls]
    assert methods == [
        "/gpualloc.allocator.v1.Allocator/ListReservations",
        "/gpualloc.inventory.v1.Inventory/GetInventory",
    ]
    assert {c.authorization for c in served.calls} == {"Bearer env-token"}
    assert {c.peer_uris for c in served.calls} == {(pki.client_uri,)}


@pytest.mark.parametrize(
    ("variable", "field"),
    [
        pytest.param("GPUALLOC_CLIENT_TLS_CA", "tls.ca", id="ca"),
        pytest.param("GPUALLOC_CLIENT_TLS_CERT", "tls.cert", id="cert"),
        pytest.param("GPUALLOC_CLIENT_TLS_KEY", "tls.key", id="key"),
    ],
)
def test_missing_pem_file_is_a_clear_error(tmp_path: Path, variable: str, field: str) -> None:
    with pytest.raises(InvalidArgument, match="cannot read") as raised:
        ClientSettings.from_env({variable: str(tmp_path / "absent.pem")})
    assert raised.value.field_path == field
