"""TLS as a server operator meets it: rotation without a restart, versions, exposure guards,
the plaintext health port for probes, `make run`'s first line, and the audit trail."""

from __future__ import annotations

import json
import logging
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from protos.inventory.v1 import inventory_pb2 as ipb
from protos.inventory.v1 import inventory_pb2_grpc
from services.common.config import ServerSettings
from services.common.errors import FailedPrecondition
from services.common.grpc_server import create_server
from services.common.health import Health
from services.common.security.audit import AUDIT_LOGGER
from services.common.security.devcerts import CertificateAuthority, write_certificate
from tests.integration.test_security import _allocate
from tests.ports import free_port
from tests.security_fixtures import ISSUER, KUEUE_SUBJECT, SecuredFleet, secured_fleet

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def _served_serial(port: int, ca: bytes, *, version: ssl.TLSVersion | None = None) -> int:
    """The serial number of the certificate a new TLS connection to `port` is served."""
    context = ssl.create_default_context(cadata=ca.decode())
    context.set_alpn_protocols(["h2"])
    if version is not None:
        context.minimum_version = context.maximum_version = version
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[int, CertificateAuthority, Path]]:
    ca = CertificateAuthority.create()
    directory = write_certificate(
        tmp_path / "server",
        ca.issue("server", dns_names=("localhost",), ip_addresses=("127.0.0.1",)),
    )
    settings = ServerSettings(
        tls_cert_file=str(directory / "tls.crt"), tls_key_file=str(directory / "tls.key")
    )
    server, port = create_server("127.0.0.1:0", [], settings, health=Health())
    server.start()
    yield port, ca, directory
    server.stop(None).wait()


def _health(channel: grpc.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status)


def _secure(port: int, ca: CertificateAuthority) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.certificate_pem)
    return grpc.secure_channel(f"127.0.0.1:{port}", credentials)


def test_a_rotated_certificate_is_served_without_a_restart_while_calls_continue(tls_server):
    port, ca, directory = tls_server
    before = _served_serial(port, ca.certificate_pem)
    channel = _secure(port, ca)
    failures: list[BaseException] = []
    stop = threading.Event()

    def keep_calling() -> None:
        while not stop.is_set():
            try:
                assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
            except BaseException as error:  # noqa: BLE001 - reported below
                failures.append(error)
            time.sleep(0.02)

    caller = threading.Thread(target=keep_calling)
    caller.start()
    try:
        write_certificate(directory, ca.issue("server", dns_names=("localhost",)))
        deadline = time.monotonic() + 5
        after = before
        while after == before and time.monotonic() < deadline:
            time.sleep(0.2)
            after = _served_serial(port, ca.certificate_pem)
    finally:
        stop.set()
        caller.join()
        channel.close()
    assert after != before, "the new certificate was never served"
    assert not failures


def test_a_certificate_of_a_new_ca_is_picked_up_and_the_old_ca_no_longer_verifies(tls_server):
    port, old_ca, directory = tls_server
    new_ca = CertificateAuthority.create("next CA")
    write_certificate(directory, new_ca.issue("server", dns_names=("localhost",)))
    deadline = time.monotonic() + 5
    while True:
        try:
            _served_serial(port, new_ca.certificate_pem)
            break
        except ssl.SSLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    with pytest.raises(ssl.SSLError):
        _served_serial(port, old_ca.certificate_pem)


def test_a_half_written_rotation_keeps_the_old_certificate(tls_server):
    port, ca, directory = tls_server
    before = _served_serial(port, ca.certificate_pem)
    other = ca.issue("server", dns_names=("localhost",))
    (directory / "tls.crt").write_bytes(other.certificate_chain)  # the key is still the old one
    time.sleep(1.3)
    assert _served_serial(port, ca.certificate_pem) == before


@pytest.mark.parametrize(
    "version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["tls-1.2", "tls-1.3"]
)
def test_tls_versions_served(tls_server, version):
    port, ca, _ = tls_server
    assert _served_serial(port, ca.certificate_pem, version=version)


EXPOSURE = {
    "plaintext-development-on-all-interfaces": (ServerSettings(), False),
    "insecure-says-so": (ServerSettings(insecure=True), True),
}


@pytest.mark.parametrize(("settings", "starts"), EXPOSURE.values(), ids=EXPOSURE.keys())
def test_a_non_loopback_address_needs_tls_and_a_policy_or_insecure(settings, starts, caplog):
    if not starts:
        with pytest.raises(FailedPrecondition, match="--insecure"):
            create_server("0.0.0.0:0", [], settings)
        return
    with caplog.at_level(logging.WARNING, logger="services.common.grpc_server"):
        server, _ = create_server("0.0.0.0:0", [], settings)
    server.stop(None)
    assert any("anyone who reaches the port" in r.getMessage() for r in caplog.records)


def test_the_health_port_answers_plaintext_probes_beside_a_tls_server(tmp_path: Path):
    ca = CertificateAuthority.create()
    directory = write_certificate(tmp_path / "s", ca.issue("s", dns_names=("localhost",)))
    with socket.socket() as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        free = probe_port.getsockname()[1]
    settings = ServerSettings(
        tls_cert_file=str(directory / "tls.crt"),
        tls_key_file=str(directory / "tls.key"),
        health_listen_address=f"127.0.0.1:{free}",
    )
    health = Health()
    health.set_not_serving("gpualloc.allocator.v1.Allocator")
    server, _ = create_server("127.0.0.1:0", [], settings, health=health)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{free}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            check = stub.Check(
                health_pb2.HealthCheckRequest(service="gpualloc.allocator.v1.Allocator"), timeout=5
            )
            assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING
            health.set_serving("gpualloc.allocator.v1.Allocator")
            check = stub.Check(
                health_pb2.HealthCheckRequest(service="gpualloc.allocator.v1.Allocator"), timeout=5
            )
            assert check.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as caught:
                allocator_pb2_grpc.AllocatorStub(channel).Allocate(pb.AllocateRequest(), timeout=5)
            assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED
            # reflection there lists the health service (grpcurl's Check works) and nothing else
            reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            (answer,) = reflect.ServerReflectionInfo(iter([request]), timeout=5)
            assert {s.name for s in answer.list_services_response.service} == {
                "grpc.health.v1.Health",
                "grpc.reflection.v1alpha.ServerReflection",
            }
    finally:
        server.stop(None).wait()


def _serve(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "GPUALLOC_LOG_FORMAT": "text", "GPUALLOC_REDIS_URL": ""}
    return subprocess.Popen(
        [sys.executable, "-m", "services.cli", "serve", "--demo", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_make_run_says_plaintext_and_development_mode_first():
    process = _serve("--listen", "127.0.0.1:0")
    assert process.stdout is not None
    try:
        first = process.stdout.readline()
    finally:
        process.kill()
        process.wait(10)
        process.stdout.close()
    assert "plaintext on 127.0.0.1:0" in first and "development mode" in first, first


def test_serve_on_all_interfaces_without_tls_is_refused_with_the_way_out():
    process = _serve("--listen", "0.0.0.0:0")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "--insecure" in output and "Traceback" not in output


def test_grpc_core_lines_join_the_json_log_and_a_failed_handshake_is_audited(tmp_path: Path):
    """With JSON logs (the default) every stderr line of a server is one JSON object: grpc-core's
    own lines (a plaintext client against the TLS port makes one: `Handshake failed`) come as
    records of logger `grpc.core`, and the failed handshake as a `tls.handshake_failed` audit
    event, the only trace a handshake that never reached the server's code leaves."""
    ca = CertificateAuthority.create("gpualloc test CA")
    server = write_certificate(
        tmp_path / "server",
        ca.issue("localhost", dns_names=("localhost",), ip_addresses=("127.0.0.1",)),
    )
    port = free_port()
    env = {**os.environ, "GPUALLOC_LOG_FORMAT": "json", "GPUALLOC_REDIS_URL": ""}
    env.pop("GRPC_VERBOSITY", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "serve", "--demo", "--web-listen", ""]
        + ["--listen", f"127.0.0.1:{port}", "--metrics-listen", ""]
        + ["--tls-cert", str(server / "tls.crt"), "--tls-key", str(server / "tls.key")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not _tls_listening(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        with (
            grpc.insecure_channel(f"127.0.0.1:{port}") as plaintext,
            pytest.raises(grpc.RpcError) as refused,
        ):
            health_pb2_grpc.HealthStub(plaintext).Check(health_pb2.HealthCheckRequest(), timeout=2)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        time.sleep(1.0)  # the forwarder logs it
    finally:
        process.terminate()
        _, errors = process.communicate(timeout=30)
    lines = [line for line in errors.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is JSON
    native = [r for r in records if r["logger"] == "grpc.core"]
    assert native, records
    assert any(r["msg"].startswith("Handshake failed") and r.get("source") for r in native)
    (audited, *_) = [r for r in records if r.get("event") == "tls.handshake_failed"]
    assert audited["logger"] == AUDIT_LOGGER and audited["identity"] == "unauthenticated"


def _tls_listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


# --- audit ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredFleet]:
    with secured_fleet(tmp_path_factory.mktemp("pki-audit")) as made:
        yield made


def _events(caplog: Any) -> list[dict[str, Any]]:
    return [
        {
            k: v
            for k, v in vars(r).items()
            if k
            in {
                "event",
                "identity",
                "tenant",
                "reservation",
                "owner",
                "node",
                "devices",
                "trace_id",
                "code",
                "reason",
                "method",
                "presented",
                "item",
            }
        }
        for r in caplog.records
        if r.name == AUDIT_LOGGER
    ]


def test_every_grant_change_expiry_write_and_denial_is_an_audit_event(fleet, caplog):
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    stub = allocator_pb2_grpc.AllocatorStub(fleet.channel("scheduler-a"))
    traceparent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    request = _allocate(reserve=True, owner="job/audit")
    answer = stub.Allocate(request, metadata=(("traceparent", traceparent),), timeout=10)
    made = answer.reservations[0]
    with pytest.raises(grpc.RpcError):  # another tenant: denied by the owner rule
        allocator_pb2_grpc.AllocatorStub(fleet.channel("scheduler-b")).Release(
            pb.ReleaseRequest(reservation_id=made.id), timeout=10
        )
    stub.Renew(pb.RenewRequest(reservation_id=made.id, owner="job/audit"), timeout=10)
    stub.Commit(pb.CommitRequest(reservation_id=made.id, owner="job/audit"), timeout=10)
    stub.Release(pb.ReleaseRequest(reservation_id=made.id, owner="job/audit"), timeout=10)
    short = _allocate(reserve=True, owner="job/short")
    short.lease_ttl.FromSeconds(1)
    expiring = stub.Allocate(short, timeout=10).reservations[0]
    with pytest.raises(grpc.RpcError):
        inventory_pb2_grpc.InventoryStub(fleet.channel("scheduler-a")).ApplyResourceSlices(
            ipb.ApplyResourceSlicesRequest(manifest=""), timeout=10
        )
    inventory_pb2_grpc.InventoryStub(fleet.channel("agent")).ReportNode(
        ipb.ReportNodeRequest(report=ipb.NodeReport(node_name="agent-node-1")), timeout=10
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(
        e["event"] == "reservation.expire" for e in _events(caplog)
    ):
        time.sleep(0.1)
    events = _events(caplog)
    by_event: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_event.setdefault(event["event"], []).append(event)
    grant = by_event["reservation.grant"][0]
    assert grant["identity"] == "spiffe://fleet.test/ns/team-a/sa/scheduler"
    assert grant["tenant"] == "team-a" and grant["owner"] == "team-a/job/audit"
    assert grant["reservation"] == made.id and grant["node"] == "l40s-node-1"
    assert grant["devices"] and grant["trace_id"] == "ab" * 16
    for name in ("reservation.renew", "reservation.commit", "reservation.release"):
        assert by_event[name][0]["reservation"] == made.id, name
    expiry = by_event["reservation.expire"][0]
    assert expiry["reservation"] == expiring.id and expiry["identity"] == "system"
    assert expiry["tenant"] == "team-a" and expiry["devices"]
    denied = by_event["call.denied"]
    assert {(d["identity"], d["code"], d["method"]) for d in denied} >= {
        ("scheduler.team-b.fleet.test", "PERMISSION_DENIED", "Release"),
        ("spiffe://fleet.test/ns/team-a/sa/scheduler", "PERMISSION_DENIED", "ApplyResourceSlices"),
    }
    report = by_event["inventory.report"][0]
    assert (
        report["identity"] == "agent-node-1.agents.fleet.test" and report["node"] == "agent-node-1"
    )
    assert all(e.get("trace_id") for e in events if e["event"] != "reservation.expire")


DENIED_WITHOUT_A_PRINCIPAL = {
    "unbound-certificate": (
        lambda f: (f.channel("stranger"), None),
        "PERMISSION_DENIED",
        "certificate cn:stranger",
    ),
    "expired-token": (
        lambda f: (f.token_channel(), f.token(expires_in=-120)),
        "UNAUTHENTICATED",
        f"jwt iss={ISSUER} sub={KUEUE_SUBJECT}",
    ),
    "wrongly-signed-token": (
        lambda f: (
            f.token_channel(),
            f.token(subject="forged", key=rsa.generate_private_key(65537, 2048)),
        ),
        "UNAUTHENTICATED",
        f"jwt iss={ISSUER} sub=forged",
    ),
    "not-a-jwt": (
        lambda f: (f.token_channel(), "not.a.jwt"),
        "UNAUTHENTICATED",
        "a bearer token that is not a JWT",
    ),
    "nothing": (
        lambda f: (f.token_channel(), None),
        "UNAUTHENTICATED",
        "no client certificate and no bearer token",
    ),
}


@pytest.mark.parametrize(
    ("make", "code", "presented"),
    DENIED_WITHOUT_A_PRINCIPAL.values(),
    ids=DENIED_WITHOUT_A_PRINCIPAL.keys(),
)
def test_a_caller_denied_without_a_principal_is_audited_as_unauthenticated(
    fleet, caplog, make, code, presented
):
    """Not as `system` (the server's own expiries): its own identity value, with what it
    presented — the certificate's names, the token's unverified issuer and subject — and
    never the token."""
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    channel, token = make(fleet)
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with pytest.raises(grpc.RpcError) as caught:
        allocator_pb2_grpc.AllocatorStub(channel).Allocate(
            _allocate(), metadata=metadata, timeout=10
        )
    assert caught.value.code().name == code
    (denied,) = [e for e in _events(caplog) if e["event"] == "call.denied"]
    assert denied["identity"] == "unauthenticated" and denied["code"] == code
    assert denied["presented"] == presented and denied["method"] == "Allocate"
    if token:
        assert token not in str(caplog.records[-1].__dict__)


# A batch's or a stream's item denied on its own (an owner outside the caller's actFor; on the
# stream also a right the item needs) is audited as a denied unary Allocate is: one
# `call.denied` per denied item, with its index. Items: None places (no owner), a string
# reserves as that owner. `denied`: the `item` of each call.denied event the call logs (None:
# the call itself was denied, by the auth interceptor, before any item ran).
DENIED_ITEMS = {
    "a-batch-item-naming-an-owner-outside-act-for": (
        "scheduler-a",
        "AllocateBatch",
        [None, "kueue/ns/workload", None],
        [1],
    ),
    "each-denied-item-of-a-batch-is-its-own-event": (
        "scheduler-b",
        "AllocateBatch",
        ["kueue/ns/workload", None, "slurm/job/1"],
        [0, 2],
    ),
    "identical-denied-items-of-a-batch-are-each-audited": (
        "scheduler-a",
        "AllocateBatch",
        ["kueue/ns/workload", "kueue/ns/workload"],
        [0, 1],
    ),
    "a-token-identitys-batch-item-outside-act-for": (
        "kueue-token",
        "AllocateBatch",
        ["job/1"],
        [0],
    ),
    "a-batch-without-a-denied-item-audits-no-denial": (
        "scheduler-a",
        "AllocateBatch",
        [None, None],
        [],
    ),
    "a-readers-reserving-batch-is-denied-as-a-whole": (
        "reader",
        "AllocateBatch",
        [None, "job/1"],
        [None],
    ),
    "a-stream-item-naming-an-owner-outside-act-for": (
        "scheduler-a",
        "AllocateStream",
        [None, "kueue/ns/workload"],
        [1],
    ),
    "a-token-identitys-stream-item-outside-act-for": (
        "kueue-token",
        "AllocateStream",
        ["job/1", None],
        [0],
    ),
}


@pytest.mark.parametrize(
    ("who", "method", "owners", "denied"), DENIED_ITEMS.values(), ids=DENIED_ITEMS.keys()
)
def test_a_denied_batch_or_stream_item_is_audited_as_a_denied_allocate(
    fleet, caplog, who, method, owners, denied
):
    """The event of each denied item is the one the same request sent alone as an Allocate
    makes (identity, tenant, code, reason), with `method` the call's and `item` its index,
    and the call's trace id."""
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    if who == "kueue-token":
        channel = fleet.token_channel()
        metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {fleet.token()}"),)
    else:
        channel, metadata = fleet.channel(who), ()
    stub = allocator_pb2_grpc.AllocatorStub(channel)
    traceparent = "00-" + "7a" * 16 + "-" + "cd" * 8 + "-01"
    metadata += (("traceparent", traceparent),)
    items = [_allocate() if o is None else _allocate(reserve=True, owner=o) for o in owners]
    try:
        if method == "AllocateBatch":
            reply = stub.AllocateBatch(
                pb.AllocateBatchRequest(items=items), metadata=metadata, timeout=30
            )
            errors = [i.error.code if i.HasField("error") else 0 for i in reply.items]
        else:
            requests = (pb.AllocateStreamRequest(item=item) for item in items)
            answers = stub.AllocateStream(requests, metadata=metadata, timeout=30)
            errors = [a.item.error.code if a.item.HasField("error") else 0 for a in answers]
    except grpc.RpcError as error:
        assert denied == [None] and error.code() is grpc.StatusCode.PERMISSION_DENIED
        errors = []
    events = [e for e in _events(caplog) if e["event"] == "call.denied"]
    assert [e.get("item") for e in events] == denied
    if errors:  # each denied item's own status is PERMISSION_DENIED; the others are not errors
        code = grpc.StatusCode.PERMISSION_DENIED.value[0]
        assert [i for i, c in enumerate(errors) if c] == denied
        assert all(c in (0, code) for c in errors)
    for event in events:
        assert event["method"] == method and event["trace_id"] == "7a" * 16
        if event.get("item") is None:
            continue
        caplog.clear()
        with pytest.raises(grpc.RpcError) as caught:  # the same item alone, as an Allocate
            stub.Allocate(items[event["item"]], metadata=metadata, timeout=10)
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
        (alone,) = [e for e in _events(caplog) if e["event"] == "call.denied"]
        assert alone["method"] == "Allocate" and "item" not in alone
        same = {k: v for k, v in event.items() if k not in ("method", "item")}
        assert same == {k: v for k, v in alone.items() if k != "method"}


def test_audit_events_are_one_json_object_per_line():
    """What a log pipeline reads with GPUALLOC_LOG_FORMAT=json (the default)."""
    from services.common.log import JsonFormatter
    from services.common.security.audit import audit_event
    from services.common.security.principal import development_principal

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    logger = logging.getLogger(AUDIT_LOGGER)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        audit_event(
            "reservation.grant",
            development_principal("tour"),
            trace_id="t" * 32,
            reservation="res-1",
            devices=["d/p/gpu-1", "d/p/gpu-0"],
        )
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    line = JsonFormatter().format(records[0])
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["logger"] == AUDIT_LOGGER and entry["event"] == "reservation.grant"
    assert entry["devices"] == ["d/p/gpu-0", "d/p/gpu-1"] and entry["auth"] == "development"
