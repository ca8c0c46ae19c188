"""Who is calling, over real mutual TLS and real signed JWTs: every RPC x role x tenant.

One fleet (the example cluster) is served with mTLS and an AccessPolicy
(tests/security_fixtures.py). `CASES` is the authorization table: each row calls one RPC as
one identity and names the outcome — `ok`, `denied` (PERMISSION_DENIED), `unauthenticated`,
`full` (another tenant's reservation shown in full) or `hidden` (shown only as held by its
tenant). Every denial row fails if its rule is removed, every `hidden` row if redaction is.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from protos.common.v1 import dra_pb2
from protos.inventory.v1 import inventory_pb2 as ipb
from protos.inventory.v1 import inventory_pb2_grpc
from services.bridges.local_cluster import EXAMPLE_CLUSTER
from services.inventory.core.report import XidEvent
from tests.security_fixtures import (
    AGENT_SUBJECT,
    ISSUER,
    KUEUE_SUBJECT,
    POLICY,
    SecuredFleet,
    secured_fleet,
)

pytestmark = pytest.mark.timeout(180)


def _claim(admin_access: bool = False) -> dra_pb2.ResourceClaim:
    exactly = dra_pb2.ExactDeviceRequest(device_class_name="gpu.nvidia.com", count=1)
    if admin_access:
        exactly.admin_access = True
    return dra_pb2.ResourceClaim(
        name="one-gpu",
        namespace="default",
        requests=[dra_pb2.DeviceRequest(name="gpu", exactly=exactly)],
    )


def _allocate(
    reserve: bool = False, admin_access: bool = False, owner: str = ""
) -> pb.AllocateRequest:
    request = pb.AllocateRequest(claims=[_claim(admin_access)], node_name="l40s-node-1")
    if reserve:
        request.reserve = True
        request.owner = owner or "job/table"
        request.lease_ttl.FromSeconds(60)
    return request


@dataclass
class Held:
    """scheduler-a's reservation that the table's cross-tenant rows aim at."""

    id: str
    token: int
    device: dra_pb2.DeviceID | None = None  # one it holds (ReportDeviceConditions)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredFleet]:
    with secured_fleet(tmp_path_factory.mktemp("pki")) as made:
        yield made


@pytest.fixture(scope="module")
def held(fleet: SecuredFleet) -> Held:
    stub = allocator_pb2_grpc.AllocatorStub(fleet.channel("scheduler-a"))
    request = _allocate(reserve=True, owner="job/1")
    request.lease_ttl.FromSeconds(3600)
    answer = stub.Allocate(request, timeout=10)
    assert answer.outcome == pb.OUTCOME_ALLOCATED
    reservation = answer.reservations[0]
    assert reservation.owner == "team-a/job/1" and reservation.tenant == "team-a"
    return Held(reservation.id, reservation.fencing_token, reservation.devices[0])


Call = Callable[[grpc.Channel, Held], Any]


def _alloc(channel: grpc.Channel) -> allocator_pb2_grpc.AllocatorStub:
    return allocator_pb2_grpc.AllocatorStub(channel)


def _inv(channel: grpc.Channel) -> inventory_pb2_grpc.InventoryStub:
    return inventory_pb2_grpc.InventoryStub(channel)


def _release_made(channel: grpc.Channel, answer: pb.AllocateResponse) -> pb.AllocateResponse:
    for reservation in answer.reservations:
        _alloc(channel).Release(
            pb.ReleaseRequest(reservation_id=reservation.id, owner=reservation.owner), timeout=10
        )
    return answer


def _reserve_direct(channel: grpc.Channel, held: Held) -> Any:
    stub = _alloc(channel)
    placed = stub.Allocate(_allocate(), timeout=10)
    request = pb.ReserveRequest(
        node_name=placed.node_name, allocations=placed.allocations, owner="job/direct"
    )
    request.lease_ttl.FromSeconds(60)
    made = stub.Reserve(request, timeout=10)
    stub.Release(
        pb.ReleaseRequest(reservation_id=made.reservation.id, owner=made.reservation.owner),
        timeout=10,
    )
    return made


def _listed(channel: grpc.Channel, held: Held) -> pb.Reservation:
    """`held` as ListReservations shows it: by its id, or as team-a's reservation with none."""
    listed = _alloc(channel).ListReservations(pb.ListReservationsRequest(), timeout=10)
    for reservation in listed.reservations:
        if reservation.id == held.id:
            return reservation
    return next(r for r in listed.reservations if r.tenant == "team-a" and not r.id)


def _report(node: str) -> ipb.ReportNodeRequest:
    return ipb.ReportNodeRequest(report=ipb.NodeReport(node_name=node, source="test"))


CALLS: dict[str, Call] = {
    "allocate": lambda c, h: _alloc(c).Allocate(_allocate(), timeout=10),
    "allocate-reserve": lambda c, h: _release_made(
        c, _alloc(c).Allocate(_allocate(reserve=True), timeout=10)
    ),
    "allocate-reserve-admin-access": lambda c, h: _release_made(
        c, _alloc(c).Allocate(_allocate(reserve=True, admin_access=True), timeout=10)
    ),
    "explain": lambda c, h: _alloc(c).Explain(pb.ExplainRequest(claims=[_claim()]), timeout=10),
    "capacity": lambda c, h: _alloc(c).Capacity(pb.CapacityRequest(claims=[_claim()]), timeout=10),
    "reserve": _reserve_direct,
    "renew-a": lambda c, h: _alloc(c).Renew(
        pb.RenewRequest(reservation_id=h.id, owner="job/1"), timeout=10
    ),
    "release-a": lambda c, h: _alloc(c).Release(
        pb.ReleaseRequest(reservation_id=h.id, owner="job/1"), timeout=10
    ),
    "commit-a": lambda c, h: _alloc(c).Commit(
        pb.CommitRequest(reservation_id=h.id, owner="job/1", fencing_token=h.token), timeout=10
    ),
    "get-a": lambda c, h: (
        _alloc(c)
        .GetReservation(pb.GetReservationRequest(reservation_id=h.id), timeout=10)
        .reservation
    ),
    "list-a": lambda c, h: _listed(c, h),
    "get-inventory": lambda c, h: _inv(c).GetInventory(
        ipb.GetInventoryRequest(node_name="l40s-node-1"), timeout=10
    ),
    "apply-dry-run": lambda c, h: _inv(c).ApplyResourceSlices(
        ipb.ApplyResourceSlicesRequest(
            manifest=(EXAMPLE_CLUSTER / "l40s-node.yaml").read_text(), dry_run=True
        ),
        timeout=10,
    ),
    "delete-missing": lambda c, h: _inv(c).DeleteResourceSlices(
        ipb.DeleteResourceSlicesRequest(names=["no-such-slice"], allow_missing=True), timeout=10
    ),
    "watch-inventory": lambda c, h: next(
        iter(_inv(c).WatchInventory(ipb.WatchInventoryRequest(), timeout=10))
    ),
    "report-own-node": lambda c, h: _inv(c).ReportNode(_report("agent-node-1"), timeout=10),
    "report-conditions-a": lambda c, h: _alloc(c).ReportDeviceConditions(
        pb.ReportDeviceConditionsRequest(
            reservation_id=h.id,
            conditions=[pb.DeviceCondition(device=h.device, type="example.com/ready", status=True)],
        ),
        timeout=10,
    ),
    "report-other-node": lambda c, h: _inv(c).ReportNode(_report("l40s-node-1"), timeout=10),
    "report-new-node": lambda c, h: _inv(c).ReportNode(_report("agent-node-2"), timeout=10),
}

OK, DENIED, UNAUTHENTICATED, FULL, HIDDEN = "ok", "denied", "unauthenticated", "full", "hidden"

# identity -> call -> outcome. `stranger` holds a valid certificate that no binding names.
TABLE: dict[str, dict[str, str]] = {
    "scheduler-a": {
        "allocate": OK,
        "allocate-reserve": OK,
        "allocate-reserve-admin-access": DENIED,
        "explain": OK,
        "capacity": OK,
        "reserve": OK,
        "renew-a": OK,
        "get-a": FULL,
        "list-a": FULL,
        "get-inventory": OK,
        "apply-dry-run": DENIED,
        "delete-missing": DENIED,
        "report-own-node": DENIED,
        "report-conditions-a": DENIED,
        "report-new-node": DENIED,
        "watch-inventory": OK,
    },
    "scheduler-b": {
        "allocate": OK,
        "allocate-reserve": OK,
        "allocate-reserve-admin-access": DENIED,
        "explain": OK,
        "capacity": OK,
        "reserve": OK,
        "renew-a": DENIED,
        "release-a": DENIED,
        "commit-a": DENIED,
        "get-a": HIDDEN,
        "list-a": HIDDEN,
        "get-inventory": OK,
        "apply-dry-run": DENIED,
        "delete-missing": DENIED,
        "report-own-node": DENIED,
    },
    "reader": {
        "allocate": OK,
        "allocate-reserve": DENIED,
        "explain": OK,
        "capacity": OK,
        "reserve": DENIED,
        "renew-a": DENIED,
        "release-a": DENIED,
        "get-a": HIDDEN,
        "list-a": HIDDEN,
        "get-inventory": OK,
        "apply-dry-run": DENIED,
        "delete-missing": DENIED,
        "report-own-node": DENIED,
        "watch-inventory": OK,
    },
    "agent": {
        "allocate": DENIED,
        "allocate-reserve": DENIED,
        "explain": DENIED,
        "capacity": DENIED,
        "renew-a": DENIED,
        "release-a": DENIED,
        "get-a": DENIED,
        "list-a": DENIED,
        "get-inventory": DENIED,
        "apply-dry-run": DENIED,
        "delete-missing": DENIED,
        "report-own-node": OK,
        "report-other-node": DENIED,
        "report-conditions-a": DENIED,  # l40s-node-1's
        "report-new-node": DENIED,
        "watch-inventory": DENIED,
    },
    "inventory-admin": {
        "allocate": DENIED,
        "allocate-reserve": DENIED,
        "renew-a": DENIED,
        "release-a": DENIED,
        "get-a": DENIED,
        "get-inventory": OK,
        "apply-dry-run": OK,
        "delete-missing": OK,
        "report-new-node": OK,
        "report-conditions-a": OK,
        "watch-inventory": OK,
    },
    "admin": {
        "allocate": OK,
        "allocate-reserve": DENIED,
        "explain": OK,
        "capacity": OK,
        "renew-a": OK,
        "get-a": FULL,
        "list-a": FULL,
        "get-inventory": OK,
        "apply-dry-run": OK,
        "delete-missing": OK,
        "report-new-node": OK,
        "report-conditions-a": OK,
        "watch-inventory": OK,
    },
    "monitor": {
        "allocate-reserve": OK,
        "allocate-reserve-admin-access": OK,
        "renew-a": DENIED,
        "get-a": HIDDEN,
    },
    "stranger": {
        "allocate": DENIED,
        "allocate-reserve": DENIED,
        "explain": DENIED,
        "renew-a": DENIED,
        "release-a": DENIED,
        "get-a": DENIED,
        "list-a": DENIED,
        "get-inventory": DENIED,
        "apply-dry-run": DENIED,
        "report-own-node": DENIED,
        "report-conditions-a": DENIED,
        "watch-inventory": DENIED,
    },
}

CASES = [
    pytest.param(who, call, outcome, id=f"{who}-{call}")
    for who, row in TABLE.items()
    for call, outcome in row.items()
]


def _outcome(call: Call, channel: grpc.Channel, held: Held) -> str:
    try:
        result = call(channel, held)
    except grpc.RpcError as error:
        code = error.code()
        if code is grpc.StatusCode.PERMISSION_DENIED:
            return DENIED
        if code is grpc.StatusCode.UNAUTHENTICATED:
            return UNAUTHENTICATED
        raise AssertionError(f"unexpected {code.name}: {error.details()}") from None
    if isinstance(result, pb.Reservation):
        if result.id == held.id and result.fencing_token == held.token and result.owner:
            return FULL
        assert result.tenant == "team-a" and result.node_name == "l40s-node-1"
        assert not result.id and not result.owner and not result.fencing_token
        assert not result.labels and not result.idempotency_key and result.devices
        return HIDDEN
    return OK


@pytest.mark.parametrize(("who", "call", "outcome"), CASES)
def test_authorization_table(fleet: SecuredFleet, held: Held, who: str, call: str, outcome: str):
    assert _outcome(CALLS[call], fleet.channel(who), held) == outcome


def test_authorization_table_counts():
    """The closing note's figures: how many rows of each outcome (and that all RPCs appear)."""
    counts = Counter(outcome for _, _, outcome in (c.values for c in CASES))
    assert counts[DENIED] >= 45 and counts[OK] >= 30 and counts[HIDDEN] >= 5
    called = {call for row in TABLE.values() for call in row}
    assert called == set(CALLS)


def test_every_rpc_has_an_access_rule():
    from services.allocator.adapters.grpc.servicer import ACCESS as ALLOCATOR
    from services.inventory.adapters.grpc.servicer import ACCESS as INVENTORY

    for service, rules in (
        (pb.DESCRIPTOR.services_by_name["Allocator"], ALLOCATOR),
        (ipb.DESCRIPTOR.services_by_name["Inventory"], INVENTORY),
    ):
        methods = {f"/{service.full_name}/{m.name}" for m in service.methods}
        assert methods == set(rules), service.full_name


# --- spoofing -------------------------------------------------------------------------------


def test_another_tenants_owner_header_cannot_touch_a_reservation(fleet: SecuredFleet, held: Held):
    stub = _alloc(fleet.channel("scheduler-b"))
    for owner in ("job/1", "team-a/job/1"):
        metadata = (("x-gpualloc-owner", owner),)
        calls: tuple[tuple[Any, Any], ...] = (
            (stub.Release, pb.ReleaseRequest(reservation_id=held.id, owner=owner)),
            (stub.Renew, pb.RenewRequest(reservation_id=held.id, owner=owner)),
            (
                stub.Commit,
                pb.CommitRequest(reservation_id=held.id, owner=owner, fencing_token=held.token),
            ),
        )
        for method, request in calls:
            with pytest.raises(grpc.RpcError) as caught:
                method(request, metadata=metadata, timeout=10)
            assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    got = _alloc(fleet.channel("scheduler-a")).GetReservation(
        pb.GetReservationRequest(reservation_id=held.id), timeout=10
    )
    assert got.reservation.state == pb.RESERVATION_STATE_RESERVED


def test_an_owner_outside_act_for_is_denied(fleet: SecuredFleet):
    stub = _alloc(fleet.channel("scheduler-a"))
    with pytest.raises(grpc.RpcError) as caught:
        stub.Allocate(_allocate(reserve=True, owner="kueue/ns/workload"), timeout=10)
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "may not act for owner" in str(caught.value.details())


def test_explain_names_another_tenants_holder_only_by_tenant(fleet: SecuredFleet, held: Held):
    whole_node = pb.ExplainRequest(
        claims=[
            dra_pb2.ResourceClaim(
                name="all",
                namespace="default",
                requests=[
                    dra_pb2.DeviceRequest(
                        name="gpu",
                        exactly=dra_pb2.ExactDeviceRequest(
                            device_class_name="gpu.nvidia.com",
                            allocation_mode=dra_pb2.ALLOCATION_MODE_ALL,
                        ),
                    )
                ],
            )
        ],
        node_name="l40s-node-1",
    )
    seen_by_b = _alloc(fleet.channel("scheduler-b")).Explain(whole_node, timeout=10)
    assert seen_by_b.holders, "the reservation of team-a blocks the whole node"
    others = [h for h in seen_by_b.holders if h.tenant != "team-b"]
    assert others and all(not h.reservation_id and not h.owner for h in others)
    assert "team-a" in {h.tenant for h in others}
    assert held.id not in str(seen_by_b)
    seen_by_a = _alloc(fleet.channel("scheduler-a")).Explain(whole_node, timeout=10)
    assert held.id in {h.reservation_id for h in seen_by_a.holders}


def test_a_reserve_conflict_names_another_tenants_holder_only_by_tenant(
    fleet: SecuredFleet, held: Held
):
    """team-b reserves the devices team-a holds: ABORTED naming the devices and `held by
    tenant team-a`, never team-a's reservation id; team-a itself is told its own id."""
    a, b = _alloc(fleet.channel("scheduler-a")), _alloc(fleet.channel("scheduler-b"))
    mine = a.GetReservation(pb.GetReservationRequest(reservation_id=held.id), timeout=10)
    taken = pb.ReserveRequest(
        node_name=mine.reservation.node_name,
        allocations=mine.reservation.allocations,
        owner="job/taker",
    )
    taken.lease_ttl.FromSeconds(60)
    with pytest.raises(grpc.RpcError) as by_b:
        b.Reserve(taken, timeout=10)
    assert by_b.value.code() is grpc.StatusCode.ABORTED
    assert "held by tenant team-a" in str(by_b.value.details())
    assert held.id not in str(by_b.value.details())
    assert held.id not in str(by_b.value.trailing_metadata())
    taken.owner = "job/again"
    with pytest.raises(grpc.RpcError) as by_a:
        a.Reserve(taken, timeout=10)
    assert by_a.value.code() is grpc.StatusCode.ABORTED
    assert f"held by reservation {held.id}" in str(by_a.value.details())


def test_a_tenant_holds_at_most_its_max_reservations_admin_access_included(tmp_path):
    """tools may use adminAccess (which no quota counts) and holds at most 3 live reservations:
    the 4th, adminAccess or not, Allocate or Reserve, is RESOURCE_EXHAUSTED naming the bound;
    releasing one makes room. Another tenant is not bounded by it."""
    bounded = POLICY.replace(
        "  - name: tools\n    allowAdminAccess: true\n",
        "  - name: tools\n    allowAdminAccess: true\n    maxReservations: 3\n",
    )
    assert bounded != POLICY
    with secured_fleet(tmp_path, policy=bounded) as fleet:
        monitor = _alloc(fleet.channel("monitor"))
        held = [
            monitor.Allocate(_allocate(True, admin_access=True, owner=f"job/{i}"), timeout=10)
            for i in range(3)
        ]
        assert all(a.outcome == pb.OUTCOME_ALLOCATED for a in held)
        for request in (_allocate(True, admin_access=True, owner="job/4"), _allocate(True)):
            with pytest.raises(grpc.RpcError) as refused:
                monitor.Allocate(request, timeout=10)
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "at most 3 live reservations" in str(refused.value.details())
            assert "maxReservations" in str(refused.value.details())
        others = _alloc(fleet.channel("scheduler-a"))
        assert others.Allocate(_allocate(True), timeout=10).outcome == pb.OUTCOME_ALLOCATED
        placed = monitor.Allocate(_allocate(), timeout=10)
        direct = pb.ReserveRequest(
            node_name=placed.node_name, allocations=placed.allocations, owner="job/direct"
        )
        with pytest.raises(grpc.RpcError) as refused:
            monitor.Reserve(direct, timeout=10)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        _release_made(fleet.channel("monitor"), held[0])
        made = monitor.Reserve(direct, timeout=10)
        assert made.reservation.owner == "tools/job/direct"


L40S_GPU_0 = "GPU-1dbe7936-6226-6461-f10f-fc2f32d2f039"  # examples/cluster/l40s-node.yaml


def _gpus_report(node: str, *uuids: str) -> ipb.ReportNodeRequest:
    buses = ["0000:3b:00.0", *(f"0000:{0x80 + i:02x}:00.0" for i in range(1, len(uuids)))]
    gpus = [  # the first at L40S_GPU_0's bus id, the others at buses no slice publishes
        ipb.GpuReport(uuid=u, name="NVIDIA L40S", index=i, pci_bus_id=bus)
        for i, (u, bus) in enumerate(zip(uuids, buses, strict=True))
    ]
    return ipb.ReportNodeRequest(report=ipb.NodeReport(node_name=node, source="t", gpus=gpus))


def test_an_agent_binding_bounds_the_gpus_its_reports_add(tmp_path):
    """The review's attack: an agent's certificate adding made-up GPUs to its node, on which
    other tenants' jobs then land. `reportedGpus: published` lets the token agents report only
    the GPUs the node's ResourceSlices publish (health, not new devices); a count caps the
    certificate agents' reports. Refused reports change nothing."""
    bounded = POLICY.replace(
        '    subjects: [{kind: DNS, name: "*.agents.fleet.test"}]\n    roles: [agent]\n',
        '    subjects: [{kind: DNS, name: "*.agents.fleet.test"}]\n    roles: [agent]\n'
        "    reportedGpus: 2\n",
    ).replace(
        f'    subjects: [{{kind: JWT, issuer: "{ISSUER}", name: "{AGENT_SUBJECT}"}}]\n'
        "    roles: [agent]\n",
        f'    subjects: [{{kind: JWT, issuer: "{ISSUER}", name: "{AGENT_SUBJECT}"}}]\n'
        "    roles: [agent]\n    reportedGpus: published\n",
    )
    assert bounded.count("reportedGpus") == 2
    with secured_fleet(tmp_path, policy=bounded) as fleet:
        stub = _inv(fleet.token_channel())
        token = (("authorization", f"Bearer {fleet.token(AGENT_SUBJECT, node='l40s-node-1')}"),)
        made_up = "GPU-00000000-0000-0000-0000-00000000beef"
        with pytest.raises(grpc.RpcError) as refused:
            stub.ReportNode(
                _gpus_report("l40s-node-1", L40S_GPU_0, made_up), metadata=token, timeout=10
            )
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "only published GPUs" in str(refused.value.details())
        listed = _inv(fleet.channel("reader")).GetInventory(ipb.GetInventoryRequest(), timeout=10)
        assert made_up not in str(listed)
        answer = stub.ReportNode(
            _gpus_report("l40s-node-1", L40S_GPU_0), metadata=token, timeout=10
        )
        assert len(answer.matched_devices) >= 1 and not answer.synthesized_devices
        agent = _inv(fleet.channel("agent"))
        three = [f"GPU-00000000-0000-0000-0000-00000000000{i}" for i in range(3)]
        with pytest.raises(grpc.RpcError) as refused:
            agent.ReportNode(_gpus_report("agent-node-1", *three), timeout=10)
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "at most 2" in str(refused.value.details())
        two = agent.ReportNode(_gpus_report("agent-node-1", *three[:2]), timeout=10)
        assert len(two.synthesized_devices) == 2


def test_reserve_refuses_a_device_with_an_untolerated_taint(fleet: SecuredFleet):
    """The rule Allocate applies (taints not tolerated rule a device out) holds for a direct
    Reserve of a device that fell off the bus (XID 79 -> NoExecute) after it was placed."""
    stub = _alloc(fleet.channel("scheduler-a"))
    request = _allocate()
    request.node_name = "h100-node-2"
    placed = stub.Allocate(request, timeout=10)
    result = placed.allocations[0].allocation.results[0]
    inventory = fleet.cluster.inventory.service
    record = inventory.snapshot().entries["h100-node-2"].record
    assert record is not None
    original = record.report
    index = int(result.device.removeprefix("gpu-"))
    gpus = tuple(
        replace(g, health=replace(g.health, xid_events=(XidEvent(79, "2026-01-01T00:00:00Z"),)))
        if g.index == index
        else g
        for g in original.gpus
    )
    inventory.report(replace(original, gpus=gpus))
    try:
        _wait_for_taint(fleet, "h100-node-2", result.device)
        reserve = pb.ReserveRequest(node_name="h100-node-2", allocations=placed.allocations)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Reserve(reserve, timeout=10)
        assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        details = str(caught.value.details())
        assert "NoExecute" in details and result.device in details
    finally:
        inventory.report(original)


def _wait_for_taint(fleet: SecuredFleet, node: str, device: str) -> None:
    view = fleet.cluster.allocator.view
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        current = view.current()
        if current is not None:
            entry = next(
                (e for e in current.snapshot.view(node).devices() if e.id.device == device), None
            )
            if entry is not None and entry.device.taints:
                return
        time.sleep(0.05)
    raise AssertionError(f"{node}/{device} never showed the XID 79 taint")


# --- tokens ---------------------------------------------------------------------------------


def _token_call(fleet: SecuredFleet, token: str | None) -> grpc.StatusCode:
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else None
    try:
        _alloc(fleet.token_channel()).Allocate(
            _allocate(reserve=True, owner="kueue/ns/wl"), metadata=metadata, timeout=10
        ).reservations[0]
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


TOKENS: dict[str, tuple[Callable[[SecuredFleet], str | None], grpc.StatusCode]] = {
    "valid-service-account-token": (lambda f: f.token(), grpc.StatusCode.OK),
    "no-token-no-certificate": (lambda f: None, grpc.StatusCode.UNAUTHENTICATED),
    "expired": (lambda f: f.token(expires_in=-120), grpc.StatusCode.UNAUTHENTICATED),
    "wrong-audience": (lambda f: f.token(audience="other"), grpc.StatusCode.UNAUTHENTICATED),
    "untrusted-issuer": (
        lambda f: f.token(issuer="https://evil.example"),
        grpc.StatusCode.UNAUTHENTICATED,
    ),
    "wrongly-signed": (
        lambda f: f.token(key=rsa.generate_private_key(public_exponent=65537, key_size=2048)),
        grpc.StatusCode.UNAUTHENTICATED,
    ),
    "unknown-key-id": (lambda f: f.token(kid="rotated-away"), grpc.StatusCode.UNAUTHENTICATED),
    "not-a-jwt": (lambda f: "not.a.jwt", grpc.StatusCode.UNAUTHENTICATED),
    "valid-but-unbound-subject": (
        lambda f: f.token(subject="system:serviceaccount:x:y"),
        grpc.StatusCode.PERMISSION_DENIED,
    ),
}


@pytest.mark.parametrize(("make", "code"), TOKENS.values(), ids=TOKENS.keys())
def test_bearer_tokens(fleet: SecuredFleet, make: Any, code: grpc.StatusCode):
    assert _token_call(fleet, make(fleet)) is code


def test_an_agent_token_reports_only_the_node_its_pod_runs_on(fleet: SecuredFleet):
    stub = _inv(fleet.token_channel())
    metadata = (("authorization", f"Bearer {fleet.token(AGENT_SUBJECT, node='agent-node-3')}"),)
    stub.ReportNode(_report("agent-node-3"), metadata=metadata, timeout=10)
    with pytest.raises(grpc.RpcError) as caught:
        stub.ReportNode(_report("agent-node-4"), metadata=metadata, timeout=10)
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    unbound = (("authorization", f"Bearer {fleet.token(AGENT_SUBJECT)}"),)  # no node claim
    with pytest.raises(grpc.RpcError) as caught:
        stub.ReportNode(_report("agent-node-3"), metadata=unbound, timeout=10)
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED


def test_a_token_identity_owns_as_its_tenant(fleet: SecuredFleet):
    stub = _alloc(fleet.token_channel())
    metadata = (("authorization", f"Bearer {fleet.token()}"),)
    answer = stub.Allocate(
        _allocate(reserve=True, owner="kueue/ns/wl-1"), metadata=metadata, timeout=10
    )
    reservation = answer.reservations[0]
    assert (reservation.owner, reservation.tenant) == ("team-c/kueue/ns/wl-1", "team-c")
    stub.Release(
        pb.ReleaseRequest(reservation_id=reservation.id, owner="kueue/ns/wl-1"),
        metadata=metadata,
        timeout=10,
    )
    assert KUEUE_SUBJECT  # the subject the policy binds


def test_a_client_without_a_certificate_cannot_reach_the_mtls_port(fleet: SecuredFleet):
    channel = fleet.channel(None)
    with pytest.raises(grpc.RpcError) as caught:
        _alloc(channel).Allocate(_allocate(), timeout=5)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


def test_health_and_reflection_need_no_identity(fleet: SecuredFleet):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    status = health_pb2_grpc.HealthStub(fleet.token_channel()).Check(
        health_pb2.HealthCheckRequest(service="gpualloc.allocator.v1.Allocator"), timeout=5
    )
    assert status.status == health_pb2.HealthCheckResponse.SERVING


def test_policy_changes_apply_without_a_restart(fleet: SecuredFleet):
    original = fleet.policy_file.read_text()
    stub = _alloc(fleet.channel("reader"))
    stub.Explain(pb.ExplainRequest(claims=[_claim()]), timeout=10)
    try:
        fleet.policy_file.write_text(original.replace("name: fleet-reader", "name: someone-else"))
        deadline = time.monotonic() + 5
        code = grpc.StatusCode.OK
        while time.monotonic() < deadline and code is grpc.StatusCode.OK:
            time.sleep(0.2)
            try:
                stub.Explain(pb.ExplainRequest(claims=[_claim()]), timeout=10)
            except grpc.RpcError as error:
                code = error.code()
        assert code is grpc.StatusCode.PERMISSION_DENIED
        fleet.policy_file.write_text("kind: AccessPolicy\nspec: [broken")
        time.sleep(1.2)  # a broken file keeps the last good policy
        with pytest.raises(grpc.RpcError) as caught:
            stub.Explain(pb.ExplainRequest(claims=[_claim()]), timeout=10)
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
        _alloc(fleet.channel("scheduler-a")).Explain(
            pb.ExplainRequest(claims=[_claim()]), timeout=10
        )
    finally:
        fleet.policy_file.write_text(original)
        time.sleep(1.2)


# --- the issue's attacks, replayed ----------------------------------------------------------


def _attacks(fleet: SecuredFleet, held: Held) -> dict[str, Callable[[], object]]:
    """What tenant B (and callers with no identity or the wrong role) tried against tenant A
    before identities existed; each returns normally only if the attack worked."""
    b = _alloc(fleet.channel("scheduler-b"))
    b_inventory = _inv(fleet.channel("scheduler-b"))
    as_a = (("x-gpualloc-owner", "team-a/job/1"),)
    listed_token = next(
        (r.fencing_token for r in b.ListReservations(pb.ListReservationsRequest(), timeout=10)
         .reservations if r.tenant == "team-a" and r.fencing_token),
        0,
    )  # fmt: skip

    def leaked(reservation: pb.Reservation) -> object:
        if reservation.id or reservation.fencing_token or reservation.labels:
            return reservation
        raise AssertionError("redacted")

    whole_node = _allocate(reserve=True, admin_access=True, owner="job/attack")
    return {
        "renew-a-lease-for-24h-with-a-spoofed-owner": lambda: b.Renew(
            pb.RenewRequest(reservation_id=held.id, owner="job/1"), metadata=as_a, timeout=10
        ),
        "commit-a-reservation-with-a-token-read-from-list": lambda: b.Commit(
            pb.CommitRequest(
                reservation_id=held.id, owner="job/1", fencing_token=listed_token or held.token
            ),
            metadata=as_a,
            timeout=10,
        ),  # fmt: skip
        "release-a-reservation": lambda: b.Release(
            pb.ReleaseRequest(reservation_id=held.id, owner="job/1"), metadata=as_a, timeout=10
        ),
        "taint-a-node-by-reporting-xid-79": lambda: b_inventory.ReportNode(
            _report("l40s-node-1"), timeout=10
        ),
        "delete-every-slice-of-the-driver": lambda: b_inventory.DeleteResourceSlices(
            ipb.DeleteResourceSlicesRequest(driver="gpu.nvidia.com"), timeout=10
        ),
        "publish-a-fake-node": lambda: b_inventory.ApplyResourceSlices(
            ipb.ApplyResourceSlicesRequest(
                manifest=(EXAMPLE_CLUSTER / "l40s-node.yaml")
                .read_text()
                .replace("l40s-node-1", "fake-node")
            ),
            timeout=10,
        ),
        "read-ids-tokens-labels-with-list": lambda: leaked(
            next(
                r
                for r in b.ListReservations(pb.ListReservationsRequest(), timeout=10).reservations
                if r.tenant == "team-a"
            )
        ),  # fmt: skip
        "read-any-reservation-by-id": lambda: leaked(
            b.GetReservation(
                pb.GetReservationRequest(reservation_id=held.id), timeout=10
            ).reservation
        ),  # fmt: skip
        "learn-holders-from-explain": lambda: next(
            h
            for h in b.Explain(
                pb.ExplainRequest(claims=[_claim()], node_name="l40s-node-1"), timeout=10
            ).holders
            if h.reservation_id == held.id
        ),  # fmt: skip
        "admin-access-on-a-reserved-node": lambda: b.Allocate(whole_node, timeout=10),
        "report-as-an-agent-for-another-node": lambda: _inv(fleet.channel("agent")).ReportNode(
            _report("l40s-node-1"), timeout=10
        ),
        "call-with-no-identity": lambda: _alloc(fleet.token_channel()).Allocate(
            _allocate(reserve=True), timeout=10
        ),
        "call-with-a-valid-certificate-nobody-bound": lambda: _alloc(
            fleet.channel("stranger")
        ).Allocate(_allocate(reserve=True), timeout=10),
    }


def test_every_attack_of_the_issue_fails(fleet: SecuredFleet, held: Held):
    succeeded = []
    for name, attack in _attacks(fleet, held).items():
        try:
            attack()
        except grpc.RpcError as error:
            assert error.code() in (
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.UNAUTHENTICATED,
            ), (name, error.code(), error.details())
            continue
        except (AssertionError, StopIteration):
            continue  # what it wanted to read was not there
        succeeded.append(name)
    assert succeeded == [], f"attacks that worked: {succeeded}"
    got = _alloc(fleet.channel("scheduler-a")).GetReservation(
        pb.GetReservationRequest(reservation_id=held.id), timeout=10
    )
    assert got.reservation.state == pb.RESERVATION_STATE_RESERVED


def test_a_condition_report_shows_another_tenants_reservation_only_as_held(
    fleet: SecuredFleet, held: Held
) -> None:
    """An inventory-admin (or a node's agent) may report any reservation's device conditions
    but reads no reservation: the answer shows it as GetReservation shows another tenant's,
    its devices, conditions and binding phase, not its id, owner, token or labels."""
    stub = allocator_pb2_grpc.AllocatorStub(fleet.channel("inventory-admin"))
    condition = pb.DeviceCondition(device=held.device, type="example.com/seen", status=True)

    shown = stub.ReportDeviceConditions(
        pb.ReportDeviceConditionsRequest(reservation_id=held.id, conditions=[condition]),
        timeout=10,
    ).reservation

    assert (shown.id, shown.owner, shown.tenant, shown.fencing_token) == ("", "", "team-a", 0)
    assert not shown.labels and not shown.idempotency_key
    assert list(shown.devices) == [held.device] and condition in shown.conditions
