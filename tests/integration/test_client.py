"""The client library against a real gpualloc (inventory + allocator on a free port)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from services.bridges import local_cluster
from services.client import (
    AllocatorClient,
    Gang,
    InventoryClient,
    Outcome,
    ReservationState,
    RetryPolicy,
    TlsConfig,
    Unplaceable,
    claim_from_spec,
)
from services.common.dra.model import (
    DeviceRequest,
    DeviceSelector,
    ExactDeviceRequest,
    ResourceClaim,
)
from services.common.errors import (
    Conflict,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from tests.unit.bridges.support import release_everything


@pytest.fixture(scope="module")
def cluster() -> Iterator[local_cluster.LocalCluster]:
    with local_cluster.start() as started:
        yield started


@pytest.fixture
def client(cluster) -> Iterator[AllocatorClient]:
    with AllocatorClient(cluster.target, owner="test/client", deadline_seconds=5) as made:
        yield made
    release_everything(cluster.target)


def test_allocate_reserve_commit_release(client):
    placement = client.allocate([claim_from_spec("2 x h100", name="job")], reserve=True)
    assert placement.fits and placement.node_name.startswith("h100-node")
    (reservation,) = placement.reservations
    assert reservation.state is ReservationState.RESERVED and reservation.owner == "test/client"
    assert set(reservation.devices) == set(placement.devices)
    committed = client.commit(reservation)
    assert committed.state is ReservationState.COMMITTED and committed.expires_at is None
    assert client.get(reservation.id).state is ReservationState.COMMITTED
    assert [r.id for r in client.list(owner="test/client")] == [reservation.id]
    released = client.release(reservation)
    assert released is not None and released.id == reservation.id
    assert client.release(reservation, allow_missing=True) is None
    with pytest.raises(NotFound):
        client.get(reservation.id)


def test_allocate_then_reserve_separately(client):
    claim = claim_from_spec("1 x mig 1g.10gb else 2g.20gb", name="infer")
    placement = client.allocate([claim])
    assert placement.fits and not placement.reservations
    (reservation,) = client.reserve(placement, lease_ttl_seconds=30, labels={"k": "v"})
    assert reservation.labels == {"k": "v"}
    assert reservation.devices == placement.devices
    # the same placement again: someone (we) took it since Allocate -> ABORTED, never retried
    sleeps: list[float] = []
    again = AllocatorClient(client.target, owner="test/client", sleep=sleeps.append)
    with again, pytest.raises(Conflict) as raised:
        again.reserve(placement)
    assert raised.value.conflicts and sleeps == []


def test_idempotency_key_returns_the_first_reservation(client):
    claim = claim_from_spec("1 x l40s", name="once")
    first = client.allocate([claim], reserve=True, idempotency_key="k-1")
    second = client.allocate([claim], reserve=True, idempotency_key="k-1")
    assert [r.id for r in first.reservations] == [r.id for r in second.reservations]
    assert len(client.list(owner="test/client")) == 1


def test_explain_and_capacity(client):
    client.allocate([claim_from_spec("8 x h100", name="a")], reserve=True, owner="slurm/job/1")
    placement = client.explain([claim_from_spec("16 x h100", name="big")])
    assert placement.outcome is Outcome.UNSATISFIABLE
    assert placement.explanation is not None and placement.explanation.messages
    capacity = client.capacity([claim_from_spec("8 x h100", name="unit")])
    total = client.capacity([claim_from_spec("8 x h100", name="unit")], ignore_reservations=True)
    assert (capacity.total, total.total) == (1, 2) and capacity.exact
    assert capacity.models == {"NVIDIA H100 80GB HBM3": 1}
    blocked = client.explain(
        [claim_from_spec("8 x h100", name="u")], node_name=placement_node(client)
    )
    assert [h.owner for h in blocked.holders] == ["slurm/job/1"]
    assert "held: slurm/job/1 holds gpu-0" in blocked.reason()


def test_gang_allocate_capacity_and_explain(client):
    zone = Gang(2, "topology.kubernetes.io/zone")
    workers = [claim_from_spec("4 x h100", name="worker")]
    placement = client.allocate(workers, gang=zone, reserve=True, owner="slurm/job/9")
    assert placement.fits and not placement.node_name
    assert sorted(p.node_name for p in placement.gang) == ["h100-node-1", "h100-node-2"]
    assert sorted(r.node_name for r in placement.reservations) == ["h100-node-1", "h100-node-2"]
    assert len(placement.devices) == 8
    assert client.capacity(workers, gang=zone).total == 1
    blocked = client.explain([claim_from_spec("8 x h100", name="worker")], gang=zone)
    assert blocked.outcome is Outcome.UNSATISFIABLE
    assert {h.owner for h in blocked.holders} == {"slurm/job/9"}


def placement_node(client: AllocatorClient) -> str:
    (held,) = client.list(owner="slurm/job/1")
    return held.node_name


def test_typed_errors_with_field_paths(client):
    exact = ExactDeviceRequest("gpu.nvidia.com", selectors=(DeviceSelector("device.("),))
    broken = ResourceClaim(name="bad", requests=(DeviceRequest("gpus", exactly=exact),))
    with pytest.raises(InvalidArgument) as raised:
        client.allocate([broken])
    assert raised.value.field_path == "claims[0].requests[0].exactly.selectors[0].cel"
    with pytest.raises(NotFound):
        client.commit("res-does-not-exist")
    (reservation,) = client.allocate(
        [claim_from_spec("1 x l40s", name="mine")], reserve=True
    ).reservations
    with pytest.raises(PermissionDenied):
        client.release(reservation, owner="someone-else")


def test_lease_commits_on_a_clean_exit(client):
    with client.lease(
        [claim_from_spec("2 x h100", name="job")], idempotency_key="lease-1"
    ) as lease:
        assert lease.placement is not None and lease.placement.fits
    assert lease.committed
    (held,) = client.list(owner="test/client")
    assert held.state is ReservationState.COMMITTED


def test_lease_releases_when_the_block_fails(client):
    with pytest.raises(RuntimeError), client.lease([claim_from_spec("2 x h100", name="job")]):
        raise RuntimeError("the job did not start")
    assert client.list(owner="test/client") == []


def test_lease_renews_in_the_background(client):
    claim = claim_from_spec("1 x l40s", name="long")
    with client.lease([claim], lease_ttl_seconds=0.6, commit_on_exit=False) as lease:
        time.sleep(1.5)  # more than two TTLs: alive only because it is renewed
        assert lease.renewals >= 2 and lease.lost is None
        (held,) = client.list(owner="test/client")
        assert held.state is ReservationState.RESERVED
    assert client.list(owner="test/client") == []


def test_a_kept_lease_stays_reserved_and_then_expires(client):
    claim = claim_from_spec("1 x l40s", name="handed-on")
    with client.lease([claim], lease_ttl_seconds=0.6) as lease:
        kept = lease.keep()  # someone else renews it from here on (the Slurm bridge's sync)
    assert lease.kept and not lease.committed and not lease.released
    (held,) = client.list(owner="test/client")
    assert held.id == kept[0].id and held.state is ReservationState.RESERVED
    time.sleep(1.0)  # nobody renewed it: the lease ran out
    assert client.list(owner="test/client") == []


def test_lease_that_cannot_be_placed_says_why(client):
    with (
        pytest.raises(Unplaceable) as raised,
        client.lease([claim_from_spec("16 x h100", name="x")]),
    ):
        pass
    assert raised.value.placement.outcome is Outcome.UNSATISFIABLE
    assert "16 devices" in str(raised.value)


def test_nvlink_request_reaches_the_allocator(client):
    """The allocator either places NVLink-connected GPUs or, until it supports topology
    constraints, refuses the field by name; never silently drops it."""
    try:
        placement = client.allocate([claim_from_spec("4 x h100 nvlink", name="nv")])
    except InvalidArgument as error:
        assert error.field_path == "topology_constraints"
    else:
        assert placement.fits and placement.node_name.startswith("h100-node")


def test_inventory_has_uuids_and_nvlinks(cluster):
    with InventoryClient(cluster.target) as inventory:
        node = inventory.node("h100-node-1")
        assert node is not None
        gpus = [d for d in node.devices if d.type == "gpu"]
        assert len(gpus) == 8 and all((d.uuid or "").startswith("GPU-") for d in gpus)
        assert len(node.nvlinks) == 28 and {link.links for link in node.nvlinks} == {18}
        a100 = inventory.node("a100-node-1")
        assert a100 is not None and a100.counter_sets
        assert inventory.node("no-such-node") is None


# --- retries, deadlines, TLS -----------------------------------------------------------------


def test_unavailable_is_retried_with_backoff(tmp_path):
    sleeps: list[float] = []
    retry = RetryPolicy(max_attempts=3, initial_backoff_seconds=0.01, jitter=0.0)
    client = AllocatorClient("127.0.0.1:1", retry=retry, deadline_seconds=1, sleep=sleeps.append)
    with client, pytest.raises(Unavailable):
        client.allocate([claim_from_spec("1 x h100", name="x")], reserve=True)
    assert sleeps == [0.01, 0.02]


class _ClosesFirst:
    """127.0.0.1:<port> -> `upstream`, closing the first `closed` connections at once (a load
    balancer without a backend for a moment, a server restarting)."""

    def __init__(self, upstream: int, closed: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.upstream, self.closed, self.accepted = upstream, closed, 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            if self.accepted <= self.closed:
                client.close()
                continue
            server = socket.create_connection(("127.0.0.1", self.upstream))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def test_a_retry_dials_again(cluster):
    # the first connection is closed as it opens: the call's retry (0.1 s later) dials again
    # and succeeds; with gRPC's default reconnect backoff (1 s) all four attempts met the
    # same failed connection within 0.7 s and the call failed (Unavailable)
    proxy = _ClosesFirst(cluster.port, closed=1)
    with AllocatorClient(f"127.0.0.1:{proxy.port}", deadline_seconds=5) as client:
        assert client.list() == []
    assert proxy.accepted == 2
    proxy.listener.close()


class _Slow(grpc.GenericRpcHandler):
    """A real server whose every method answers later than the client waits."""

    def service(self, handler_call_details):
        def slow(request: bytes, context: grpc.ServicerContext) -> bytes:
            time.sleep(0.3)
            return b""

        return grpc.unary_unary_rpc_method_handler(slow)


@pytest.fixture
def slow_server() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((_Slow(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None).wait()


@pytest.mark.parametrize(
    ("call", "retried"),
    [
        pytest.param(lambda c: c.get("res-1"), True, id="read-retried"),
        pytest.param(lambda c: c.commit("res-1"), False, id="write-not-retried"),
    ],
)
def test_deadline_exceeded_is_retried_for_reads_only(slow_server, call, retried):
    sleeps: list[float] = []
    retry = RetryPolicy(max_attempts=2, initial_backoff_seconds=0.0)
    client = AllocatorClient(slow_server, retry=retry, deadline_seconds=0.05, sleep=sleeps.append)
    with client, pytest.raises(DeadlineExceeded):
        call(client)
    assert len(sleeps) == (1 if retried else 0)


def test_tls(tmp_path: Path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=gpualloc-test", "-addext", "subjectAltName=DNS:gpualloc-test",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    with local_cluster.start(seed=(local_cluster.EXAMPLE_CLUSTER,), topology=()) as plain:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        proxy = _Forward(plain.target)
        server.add_generic_rpc_handlers((proxy,))
        port = server.add_secure_port("127.0.0.1:0", credentials)
        server.start()
        try:
            tls = TlsConfig.from_files(str(cert), server_name="gpualloc-test")
            with AllocatorClient(f"127.0.0.1:{port}", tls=tls) as secure:
                assert secure.capacity([claim_from_spec("1 x h100", name="x")]).total == 16
        finally:
            server.stop(None).wait()
            proxy.close()


class _Forward(grpc.GenericRpcHandler):
    """TLS in front of the plaintext allocator: forwards each unary call's bytes."""

    def __init__(self, target: str) -> None:
        self._channel = grpc.insecure_channel(target)

    def service(self, handler_call_details):
        method = handler_call_details.method
        forward: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(method)

        def call(request: bytes, context: grpc.ServicerContext) -> bytes:
            response: bytes = forward(request, timeout=5)
            return response

        return grpc.unary_unary_rpc_method_handler(call)

    def close(self) -> None:
        self._channel.close()
