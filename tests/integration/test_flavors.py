"""Resource flavors end to end: real mTLS servers under an access policy, the example fleet
(two H100 nodes of 8, `nvidia.com/gpu.family: hopper`; an A100 MIG node, `ampere`; an L40S
node of 4, `ada-lovelace`), reservations made over gRPC.

- `test_flavor_search_table`: Kueue's fungibility and flavor taints, one row each: where the
  grant lands, the flavors the answer lists with their modes, and the victims a `preempt`
  call revokes (on the flavor the search chose).
- `test_explain_answers_per_flavor`: Explain's flavor attempts on the wire.
- `test_a_cel_flavor_charges_each_first_available_alternative_to_its_flavor`: device-level
  flavors (a CEL selector on productName), a firstAvailable request landing its second
  alternative on one flavor, then its first on another, each charged to its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from protos.common.v1 import dra_pb2
from services.allocator.config import AllocatorSettings
from services.client import AllocatorClient
from services.client.config import ClientSettings
from services.common.pb.dra_mapping import from_pb_resource_claim
from tests.integration.test_quotas import (
    _rewrite_policy,
    claim,
    release_all,
    reserve,
    status,
    stub,
)
from tests.security_fixtures import SecuredFleet, policy_with, secured_fleet

pytestmark = pytest.mark.timeout(300)

QUOTA = """\
  quota:
    resourceFlavors:
    - {name: hopper, nodeLabels: {nvidia.com/gpu.family: hopper}}
    - {name: ada, nodeLabels: {nvidia.com/gpu.family: ada-lovelace}}
    - name: ampere
      nodeLabels: {nvidia.com/gpu.family: ampere}
      nodeTaints: [{key: reserved, value: ml, effect: NoSchedule}]
    resources:
    - {name: gpus, deviceClassNames: [gpu.nvidia.com], flavors: [hopper, ada, ampere]}
    priorityClasses:
    - {name: low, value: 0}
    - {name: standard, value: 100, globalDefault: true}
    - {name: high, value: 1000}
  tenants:
  - name: hpc
    quotas:
    - {resource: gpus, flavor: hopper, nominal: 2}
    - {resource: gpus, flavor: ada, nominal: 4}
  - name: team-a
    flavorFungibility: {whenCanPreempt: MayStopSearch}
    quotas:
    - {resource: gpus, flavor: hopper, nominal: 2}
    - {resource: gpus, flavor: ada, nominal: 4}
  - name: team-b
    quotas:
    - {resource: gpus, flavor: ampere, nominal: 4}
    - {resource: gpus, flavor: hopper, nominal: 2}
  - name: team-c
  - name: tools
    allowAdminAccess: true
"""
WHO = {"hpc": ("slurm-bridge", "slurm/job"), "team-a": ("scheduler-a", "job")}
WHO["team-b"] = ("scheduler-b", "job")
HOPPER = {"h100-node-1", "h100-node-2"}
FAMILY = {"h100-node-1": "hopper", "h100-node-2": "hopper", "l40s-node-1": "ada"}
FAMILY["a100-node-1"] = "ampere"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredFleet]:
    settings = AllocatorSettings(expire_interval=0.2, quota_grace_seconds=0.5)
    with secured_fleet(
        tmp_path_factory.mktemp("flavors-pki"), policy=policy_with(QUOTA), allocator=settings
    ) as made:
        yield made


def tolerating(count: int, key: str, value: str) -> dra_pb2.ResourceClaim:
    made = claim(count)
    made.requests[0].exactly.tolerations.append(
        dra_pb2.DeviceToleration(
            key=key,
            operator=dra_pb2.TOLERATION_OPERATOR_EQUAL,
            value=value,
            effect=dra_pb2.TAINT_EFFECT_NO_SCHEDULE,
        )
    )
    return made


@dataclass(frozen=True)
class Row:
    tenant: str
    holdings: tuple[tuple[str, int, str, str], ...]  # (name, GPUs, priority, node)
    asks: int
    priority: str
    tried: tuple[tuple[str, int, bool], ...]  # (flavor, mode, chosen)
    lands: str | None  # the family of the node the grant lands on (None: not ALLOCATED)
    victims: tuple[str, ...] = ()
    toleration: tuple[str, str] | None = None


LOW_ON_HOPPER = (("low-1", 1, "low", "h100-node-1"), ("low-2", 1, "low", "h100-node-2"))
ROWS = {
    "when-can-preempt-try-next-flavor-lands-on-the-next-that-fits": Row(
        "hpc", LOW_ON_HOPPER, 1, "high",
        (("hopper", pb.FLAVOR_MODE_PREEMPT, False), ("ada", pb.FLAVOR_MODE_FIT, True)),
        "ada",
    ),
    "when-can-preempt-may-stop-search-preempts-on-the-first": Row(
        "team-a", LOW_ON_HOPPER, 1, "high",
        (("hopper", pb.FLAVOR_MODE_PREEMPT, True),),
        None,
        ("low-2",),
    ),
    "an-untolerated-flavor-taint-is-skipped": Row(
        "team-b", (), 1, "",
        (("ampere", pb.FLAVOR_MODE_NO_FIT, False), ("hopper", pb.FLAVOR_MODE_FIT, True)),
        "hopper",
    ),
    "a-request-tolerating-the-taint-takes-the-flavor": Row(
        "team-b", (), 1, "",
        (("ampere", pb.FLAVOR_MODE_FIT, True),),
        "ampere",
        toleration=("reserved", "ml"),
    ),
}  # fmt: skip


def _ask(fleet: SecuredFleet, row: Row, name: str, *, preempt: bool) -> pb.AllocateResponse:
    who, prefix = WHO[row.tenant]
    request = pb.AllocateRequest(
        claims=[tolerating(row.asks, *row.toleration) if row.toleration else claim(row.asks)],
        reserve=True,
        owner=f"{prefix}/{name}",
        priority_class_name=row.priority,
        preempt=preempt,
    )
    request.lease_ttl.FromSeconds(120)
    return stub(fleet, who).Allocate(request, timeout=20)


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_flavor_search_table(fleet: SecuredFleet, row: Row) -> None:
    who, prefix = WHO[row.tenant]
    caller = stub(fleet, who)
    held: list[pb.AllocateResponse] = []
    _release_everything(fleet)
    try:
        owners = {}
        for name, count, priority, node in row.holdings:
            made = reserve(caller, count, owner=f"{prefix}/{name}", priority=priority, node=node)
            assert made.outcome == pb.OUTCOME_ALLOCATED, name
            held.append(made)
            owners[made.reservations[0].id] = name
        asked = _ask(fleet, row, "grant", preempt=False)
        tried = [(f.flavor, f.mode, f.chosen) for f in asked.flavors]
        assert tried == list(row.tried)
        if row.lands is not None:
            assert asked.outcome == pb.OUTCOME_ALLOCATED
            assert {FAMILY[r.node_name] for r in asked.reservations} == {row.lands}
            held.append(asked)
            return
        assert asked.outcome != pb.OUTCOME_ALLOCATED and not asked.reservations
        proposed = [owners[v.holder.reservation_id] for v in asked.preemption.victims]
        assert proposed == list(row.victims)
        taken = _ask(fleet, row, "grant", preempt=True)
        held.append(taken)
        assert taken.outcome == pb.OUTCOME_ALLOCATED
        assert [owners[v.holder.reservation_id] for v in taken.preemption.victims] == proposed
        chosen = next(f.flavor for f in asked.flavors if f.chosen)
        assert {FAMILY[r.node_name] for r in taken.reservations} == {chosen}
    finally:
        _release_everything(fleet)


def _release_everything(fleet: SecuredFleet) -> None:
    admin = stub(fleet, "admin")
    listed = admin.ListReservations(pb.ListReservationsRequest(page_size=1000), timeout=10)
    for reservation in listed.reservations:
        admin.Release(pb.ReleaseRequest(reservation_id=reservation.id), timeout=10)


def test_explain_answers_per_flavor(fleet: SecuredFleet) -> None:
    """team-b's Explain of one GPU, without a toleration: the tainted ampere flavor is NoFit
    with its reason and the taint named, hopper is taken."""
    explained = stub(fleet, "scheduler-b").Explain(pb.ExplainRequest(claims=[claim(1)]), timeout=20)
    assert explained.outcome == pb.OUTCOME_ALLOCATED
    ampere, hopper = explained.flavors
    assert (ampere.resource, ampere.flavor, ampere.mode) == (
        "gpus",
        "ampere",
        pb.FLAVOR_MODE_NO_FIT,
    )
    assert ampere.reason == pb.FLAVOR_REFUSAL_UNTOLERATED_TAINT and not ampere.chosen
    assert ampere.message == "untolerated taint reserved=ml:NoSchedule in flavor ampere"
    assert (hopper.flavor, hopper.mode, hopper.borrowing, hopper.chosen) == (
        "hopper",
        pb.FLAVOR_MODE_FIT,
        0,
        True,
    )
    assert hopper.reason == pb.FLAVOR_REFUSAL_UNSPECIFIED
    assert {explained.node_name} <= HOPPER


_PRODUCT = 'device.attributes["gpu.nvidia.com"].productName'
CEL_FLAVORS = """\
  quota:
    resourceFlavors:
    - name: h100
      selectors:
      - cel: {expression: 'PRODUCT.startsWith("NVIDIA H100")'}
    - name: l40s
      selectors:
      - cel: {expression: 'PRODUCT == "NVIDIA L40S"'}
    resources:
    - {name: gpus, deviceClassNames: [gpu.nvidia.com], flavors: [h100, l40s]}
  tenants:
  - name: team-a
  - name: team-b
  - name: team-c
  - name: tools
    allowAdminAccess: true
  - name: hpc
    quotas:
    - {resource: gpus, flavor: l40s, nominal: 2}
    - {resource: gpus, flavor: h100, nominal: 8}
""".replace("PRODUCT", _PRODUCT)


def test_a_cel_flavor_charges_each_first_available_alternative_to_its_flavor(
    tmp_path: Path,
) -> None:
    """hpc lists l40s (2) before h100 (8); its claim asks firstAvailable [8 GPUs, 2 GPUs]:
    on l40s (4 GPUs) only the second alternative fits, charged to gpus/l40s; the next call
    finds l40s spent (NoCandidates: nothing of hpc it may take) and lands the first
    alternative on an H100 node, charged to gpus/h100."""
    first_available = dra_pb2.ResourceClaim(
        name="gpus",
        namespace="default",
        requests=[
            dra_pb2.DeviceRequest(
                name="gpu",
                first_available=[
                    dra_pb2.DeviceSubRequest(
                        name="eight", device_class_name="gpu.nvidia.com", count=8
                    ),
                    dra_pb2.DeviceSubRequest(
                        name="two", device_class_name="gpu.nvidia.com", count=2
                    ),
                ],
            )
        ],
    )
    settings = AllocatorSettings(expire_interval=0.2, quota_grace_seconds=0.5)
    with secured_fleet(tmp_path, policy=policy_with(CEL_FLAVORS), allocator=settings) as fleet:
        hpc = stub(fleet, "slurm-bridge")
        held = []
        for name in ("small", "big"):
            request = pb.AllocateRequest(
                claims=[first_available], reserve=True, owner=f"slurm/job/{name}"
            )
            request.lease_ttl.FromSeconds(120)
            held.append(hpc.Allocate(request, timeout=20))
        small, big = held
        assert [r.node_name for r in small.reservations] == ["l40s-node-1"]
        (allocation,) = small.allocations
        assert {d.request for d in allocation.allocation.results} == {"gpu/two"}
        assert {r.node_name for r in big.reservations} <= HOPPER
        (allocation,) = big.allocations
        assert len(allocation.allocation.results) == 8
        assert [(f.flavor, f.mode, f.chosen) for f in big.flavors] == [
            ("l40s", pb.FLAVOR_MODE_NO_CANDIDATES, False),
            ("h100", pb.FLAVOR_MODE_FIT, True),
        ]
        rows = status(stub(fleet, "admin"), "hpc")
        used = {resource: rows[t, resource].used for t, resource in rows}
        assert used == {"gpus/h100": "8", "gpus/l40s": "2", "gpus/(none)": "0"}
        release_all(hpc, held)


def test_a_reload_with_a_flavor_selector_that_does_not_compile_keeps_the_old_quotas(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The policy file is rewritten with an h100 flavor selector that does not compile and a
    raised nominal: the allocator refuses the reload, logging the flavor's selector by field,
    and QuotaStatus and grants keep the old quotas."""
    settings = AllocatorSettings(expire_interval=0.2, quota_grace_seconds=0.5)
    with secured_fleet(tmp_path, policy=policy_with(CEL_FLAVORS), allocator=settings) as fleet:
        caplog.set_level(logging.ERROR, logger="gpualloc.tls")
        l40s = "{resource: gpus, flavor: l40s, nominal: %d}"
        _rewrite_policy(
            fleet,
            (f'{_PRODUCT}.startsWith("NVIDIA H100")', "device.attributes["),
            (l40s % 2, l40s % 3),
        )
        deadline = time.monotonic() + 10
        refused: list[str] = []
        while not refused and time.monotonic() < deadline:
            time.sleep(0.2)
            rows = status(stub(fleet, "admin"), "hpc")  # a look polls the file
            assert rows["hpc", "gpus/l40s"].nominal == "2", "the invalid policy was applied"
            refused = [
                r.getMessage()
                for r in caplog.records
                if "access policy (quotas) changed but cannot be loaded" in r.getMessage()
            ]
        assert refused, "the reload was not refused"
        assert "spec.quota.resourceFlavors[h100].selectors[0].cel.expression" in refused[0]
        hpc = stub(fleet, "slurm-bridge")
        held = [reserve(hpc, 2, owner="slurm/job/old-quota")]
        assert [r.node_name for r in held[0].reservations] == ["l40s-node-1"]
        release_all(hpc, held)


def test_the_client_tells_the_flavors_tried(fleet: SecuredFleet) -> None:
    """The client library's Placement lists each flavor tried in its reason (what the bridges
    log) and in the CLI's text: team-b's Explain names ampere NoFit with the taint, hopper
    taken."""
    settings = ClientSettings.from_env(fleet.client_environ("scheduler-b"))
    with AllocatorClient(settings.target, tls=settings.tls) as client:
        placement = client.explain([from_pb_resource_claim(claim(1))])
    assert placement.flavors == (
        "gpus/ampere: NoFit: untolerated taint reserved=ml:NoSchedule in flavor ampere",
        "gpus/hopper: Fit (taken)",
    )
    assert "flavor: gpus/ampere: NoFit" in placement.reason()


CLASS_FLAVORS = """\
  quota:
    resourceFlavors:
    - {name: whole, deviceClassNames: [gpu.nvidia.com]}
    - {name: mig, deviceClassNames: [mig.nvidia.com]}
    resources:
    - {name: gpus, deviceClassNames: [gpu.nvidia.com, mig.nvidia.com], gpuShare: true,
       flavors: [whole, mig]}
  tenants:
  - name: team-a
  - name: team-b
  - name: team-c
  - name: tools
    allowAdminAccess: true
  - name: hpc
    quotas:
    - {resource: gpus, flavor: mig, nominal: 1}
    - {resource: gpus, flavor: whole, nominal: 2}
"""


def test_device_class_flavors_charge_whole_gpus_and_mig_slices_apart(tmp_path: Path) -> None:
    """Flavors by device class on one resource of GPU shares: hpc's MIG slice is charged to
    gpus/mig, its whole GPU to gpus/whole, each request landing on the one flavor whose devices
    serve it (the other is NoFit, no devices)."""
    settings = AllocatorSettings(expire_interval=0.2, quota_grace_seconds=0.5)
    with secured_fleet(tmp_path, policy=policy_with(CLASS_FLAVORS), allocator=settings) as fleet:
        hpc = stub(fleet, "slurm-bridge")
        held = [reserve(hpc, 1, owner="slurm/job/slice", device_class="mig.nvidia.com")]
        held.append(reserve(hpc, 1, owner="slurm/job/whole"))
        slice_, whole = held
        assert (slice_.outcome, whole.outcome) == (pb.OUTCOME_ALLOCATED, pb.OUTCOME_ALLOCATED)
        assert [(f.flavor, f.mode) for f in slice_.flavors] == [("mig", pb.FLAVOR_MODE_FIT)]
        assert [(f.flavor, f.mode, f.reason) for f in whole.flavors] == [
            ("mig", pb.FLAVOR_MODE_NO_FIT, pb.FLAVOR_REFUSAL_NO_DEVICES),
            ("whole", pb.FLAVOR_MODE_FIT, pb.FLAVOR_REFUSAL_UNSPECIFIED),
        ]
        rows = status(stub(fleet, "admin"), "hpc")
        assert rows["hpc", "gpus/whole"].used == "1"
        assert rows["hpc", "gpus/mig"].used not in ("0", "1")  # a slice's share of its GPU
        release_all(hpc, held)
