"""A tenant's preemption policy end to end: real mTLS servers under an access policy, the
example fleet, reservations made over gRPC (Allocate and AllocateBatch).

- Queued times: hpc's `withinClusterQueue: LowerOrNewerEqualPriority` takes its own
  reservations of its priority queued after the grant (`queued_time`), never one of a request
  that only says "now"; an AllocateBatch's items without queued times never take each other;
  a queued time in the future is INVALID_ARGUMENT naming the field.
- The defaults: team-a writes no `preemption` section (gpualloc's rules: reclaim of any
  priority), team-b writes Kueue's defaults out (Never for all three): team-a reclaims what
  team-b borrows, team-b reclaims nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from services.allocator.config import AllocatorSettings
from tests.integration.test_quotas import claim, stub
from tests.security_fixtures import SecuredFleet, policy_with, secured_fleet

pytestmark = pytest.mark.timeout(300)

QUOTA = """\
  quota:
    resources:
    - {name: gpus, deviceClassNames: [gpu.nvidia.com]}
  tenants:
  - name: hpc
    quotas: [{resource: gpus, nominal: 2}]
    preemption: {withinClusterQueue: LowerOrNewerEqualPriority}
  - name: team-a
    cohort: research
    quotas: [{resource: gpus, nominal: 2}]
  - name: team-b
    cohort: research
    quotas: [{resource: gpus, nominal: 2}]
    preemption:
      withinClusterQueue: Never
      reclaimWithinCohort: Never
      borrowWithinCohort: {policy: Never}
  - name: team-c
  - name: tools
    allowAdminAccess: true
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredFleet]:
    settings = AllocatorSettings(expire_interval=0.2, quota_grace_seconds=0.5)
    with secured_fleet(
        tmp_path_factory.mktemp("policy-pki"), policy=policy_with(QUOTA), allocator=settings
    ) as made:
        yield made


@pytest.fixture(autouse=True)
def empty(fleet: SecuredFleet) -> Iterator[None]:
    _release_everything(fleet)
    yield
    _release_everything(fleet)


def _release_everything(fleet: SecuredFleet) -> None:
    admin = stub(fleet, "admin")
    listed = admin.ListReservations(pb.ListReservationsRequest(page_size=1000), timeout=10)
    for reservation in listed.reservations:
        admin.Release(pb.ReleaseRequest(reservation_id=reservation.id), timeout=10)


def request(
    owner: str, count: int = 1, *, queued: float | None = None, preempt: bool = False
) -> pb.AllocateRequest:
    made = pb.AllocateRequest(claims=[claim(count)], reserve=True, owner=owner, preempt=preempt)
    made.lease_ttl.FromSeconds(120)
    if queued is not None:
        made.queued_time.FromNanoseconds(int(queued * 1e9))
    return made


def owners(answer: pb.AllocateResponse, held: dict[str, str]) -> list[str]:
    names = {i: n for n, i in held.items()}
    return [names[v.holder.reservation_id] for v in answer.preemption.victims]


def test_lower_or_newer_equal_priority_compares_queued_times(fleet: SecuredFleet) -> None:
    hpc = stub(fleet, "slurm-bridge")
    start = time.time() - 3600
    held = {}
    for name, queued in (("first", start + 10), ("second", start + 20)):
        made = hpc.Allocate(request(f"slurm/job/{name}", queued=queued), timeout=20)
        assert made.outcome == pb.OUTCOME_ALLOCATED
        (reservation,) = made.reservations
        assert "gpualloc.dev/queued-at" in reservation.labels
        held[name] = reservation.id
    now = hpc.Allocate(request("slurm/job/now", preempt=True), timeout=20)
    assert now.outcome == pb.OUTCOME_QUOTA_EXCEEDED and not now.preemption.victims
    asking = pb.ExplainRequest(claims=[claim(1)])
    asking.queued_time.FromNanoseconds(int((start + 15) * 1e9))
    explained = hpc.Explain(asking, timeout=20)
    names = {i: n for n, i in held.items()}
    assert [names[v.holder.reservation_id] for v in explained.preemption.victims] == ["second"]
    taken = hpc.Allocate(request("slurm/job/early", queued=start + 15, preempt=True), timeout=20)
    assert taken.outcome == pb.OUTCOME_ALLOCATED and owners(taken, held) == ["second"]


def test_a_batchs_items_take_each_other_only_by_their_queued_times(fleet: SecuredFleet) -> None:
    """Four items: two fill hpc's 2; a third without a queued time takes neither (QUOTA_EXCEEDED,
    no victims); a fourth queued an hour ago takes one of the first two (both queued when they
    were reserved, after it; reserved in one write, they are equally new)."""
    hpc = stub(fleet, "slurm-bridge")
    batch = pb.AllocateBatchRequest(
        items=[
            request("slurm/job/one"),
            request("slurm/job/two"),
            request("slurm/job/three", preempt=True),
            request("slurm/job/four", queued=time.time() - 3600, preempt=True),
        ]
    )
    one, two, three, four = (item.response for item in hpc.AllocateBatch(batch, timeout=30).items)
    assert (one.outcome, two.outcome) == (pb.OUTCOME_ALLOCATED, pb.OUTCOME_ALLOCATED)
    assert three.outcome == pb.OUTCOME_QUOTA_EXCEEDED and not three.preemption.victims
    assert four.outcome == pb.OUTCOME_ALLOCATED
    (victim,) = four.preemption.victims
    assert victim.holder.reservation_id in {one.reservations[0].id, two.reservations[0].id}


def test_a_queued_time_in_the_future_is_refused(fleet: SecuredFleet) -> None:
    hpc = stub(fleet, "slurm-bridge")
    with pytest.raises(grpc.RpcError) as refused:
        hpc.Allocate(request("slurm/job/later", queued=time.time() + 3600), timeout=20)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "queued_time: must not be in the future" in (refused.value.details() or "")
    batch = pb.AllocateBatchRequest(
        items=[request("slurm/job/a"), request("slurm/job/b", queued=time.time() + 3600)]
    )
    first, second = hpc.AllocateBatch(batch, timeout=30).items
    assert first.response.outcome == pb.OUTCOME_ALLOCATED
    assert second.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert second.error.message.startswith("items[1]: ")
    assert "items[1].queued_time" in second.error.message
    assert "must not be in the future" in second.error.message


def test_without_a_preemption_section_gpuallocs_rules_with_kueues_defaults_none(
    fleet: SecuredFleet,
) -> None:
    """team-a (no section: reclaim of any priority) reclaims the 2 GPUs team-b borrows from it;
    team-b (Kueue's defaults written out: Never) reclaims nothing of what team-a borrows."""
    a, b = stub(fleet, "scheduler-a"), stub(fleet, "scheduler-b")
    borrowed = b.Allocate(request("job/b-borrows", 4), timeout=20)
    assert borrowed.outcome == pb.OUTCOME_ALLOCATED
    taken = a.Allocate(request("job/a-reclaims", 2, preempt=True), timeout=20)
    assert taken.outcome == pb.OUTCOME_ALLOCATED
    assert [v.reason for v in taken.preemption.victims] == ["reclaim"]
    _release_everything(fleet)
    assert a.Allocate(request("job/a-borrows", 4), timeout=20).outcome == pb.OUTCOME_ALLOCATED
    refused = b.Allocate(request("job/b-asks", 1, preempt=True), timeout=20)
    assert refused.outcome == pb.OUTCOME_QUOTA_EXCEEDED and not refused.preemption.victims
