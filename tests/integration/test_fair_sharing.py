"""Fair sharing end to end: real mTLS servers under an access policy with
`spec.quota.fairSharing`, preemptions decided by dominant resource share, QuotaStatus and
`gpualloc get quotas` showing each tenant's share.

The policy (FAIR_POLICY), docs/tenancy.md's worked example: team-a, team-b and hpc share the
cohort `all`, 2 GPUs each, every tenant reclaims and preempts as Kueue's fair sharing cases do
(withinClusterQueue LowerPriority, reclaimWithinCohort Any)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from services.allocator.config import AllocatorSettings
from services.common.dra.quantity import Quantity
from tests.integration.test_quota_tree import _get_quotas
from tests.integration.test_quotas import (
    ON_STANDALONE_AND_CLUSTER,
    release_all,
    reserve,
    status,
    stub,
)
from tests.security_fixtures import SecuredFleet, policy_with, secured_fleet

pytestmark = pytest.mark.timeout(300)

FAIR = """\
  quota:
    resources:
    - {name: gpus, deviceClassNames: [gpu.nvidia.com]}
    priorityClasses:
    - {name: standard, value: 100, globalDefault: true}
    fairSharing: {enabled: true}
  tenants:
  - name: team-a
    cohort: all
    quotas: [{resource: gpus, nominal: 2}]
    preemption: {withinClusterQueue: LowerPriority, reclaimWithinCohort: Any}
  - name: team-b
    cohort: all
    quotas: [{resource: gpus, nominal: 2}]
    preemption: {withinClusterQueue: LowerPriority, reclaimWithinCohort: Any}
  - name: hpc
    cohort: all
    quotas: [{resource: gpus, nominal: 2}]
    fairSharing: {weight: 2}
  - name: team-c
  - name: tools
    allowAdminAccess: true
"""
FAIR_POLICY = policy_with(FAIR)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredFleet]:
    settings = AllocatorSettings(expire_interval=0.2, quota_grace_seconds=0.5)
    with secured_fleet(
        tmp_path_factory.mktemp("fair-pki"), policy=FAIR_POLICY, allocator=settings
    ) as made:
        yield made


def shares(fleet: SecuredFleet) -> dict[str, int]:
    rows = status(stub(fleet, "admin"))
    return {tenant: row.weighted_share for (tenant, _), row in rows.items()}


def test_a_borrowing_tenant_preempts_one_that_borrows_more(fleet: SecuredFleet) -> None:
    """team-b borrows the 2 GPUs hpc does not use (share 2 of the 6 the cohort lends: 334,
    rounded up as Kueue's status rounds it);
    team-a, at its nominal 2, asks 1 more: borrowing, it may preempt by fair sharing, since
    its share with the grant (167) is not above team-b's once one of team-b's goes (167).
    team-b's newest goes, reason fair-sharing; asking 1 more after that, team-a's share (333)
    would pass team-b's (167 -> 0), so nothing goes."""
    a, b = stub(fleet, "scheduler-a"), stub(fleet, "scheduler-b")
    held_b = [reserve(b, 2, owner="job/b-nominal"), reserve(b, 1, owner="job/b-1")]
    held_b.append(reserve(b, 1, owner="job/b-2"))
    held_a = [reserve(a, 2, owner="job/a-nominal")]
    try:
        assert [h.outcome for h in held_b + held_a] == [pb.OUTCOME_ALLOCATED] * 4
        assert shares(fleet) == {"team-a": 0, "team-b": 334, "hpc": 0}
        refused = reserve(a, 1, owner="job/a-more")  # no preempt: the cohort is full
        assert refused.outcome == pb.OUTCOME_QUOTA_EXCEEDED
        taken = reserve(a, 1, owner="job/a-more", preempt=True)
        assert taken.outcome == pb.OUTCOME_ALLOCATED
        [victim] = taken.preemption.victims
        assert (victim.reason, victim.holder.tenant) == ("fair-sharing", "team-b")
        held_a.append(taken)
        assert shares(fleet) == {"team-a": 167, "team-b": 167, "hpc": 0}
        again = reserve(a, 1, owner="job/a-again", preempt=True)
        assert again.outcome == pb.OUTCOME_QUOTA_EXCEEDED and not again.preemption.victims
    finally:
        release_all(a, held_a)
        with pytest.raises(grpc.RpcError):  # b-2 was revoked (the newest)
            release_all(b, held_b[2:])
        release_all(b, held_b[:2])


def test_a_tenant_within_nominal_reclaims_whatever_the_shares(fleet: SecuredFleet) -> None:
    """hpc (weight 2) holds nothing, team-b its 2; team-a borrows all of hpc's 2. hpc asks for
    its own 2:
    within its nominal, it reclaims (Kueue's FairSharingPreemptWithinNominal, on since
    v0.17): team-a's newest reservations go, reason reclaim."""
    a, b, hpc = stub(fleet, "scheduler-a"), stub(fleet, "scheduler-b"), stub(fleet, "slurm-bridge")
    held = [reserve(a, 2, owner="job/nominal"), reserve(a, 1, owner="job/x1")]
    held.append(reserve(a, 1, owner="job/x2"))
    held_b = [reserve(b, 2, owner="job/b-nominal")]
    try:
        taken = reserve(hpc, 2, owner="slurm/job/mine", preempt=True)
        assert taken.outcome == pb.OUTCOME_ALLOCATED
        assert sorted((v.reason, v.holder.tenant) for v in taken.preemption.victims) == [
            ("reclaim", "team-a"),
            ("reclaim", "team-a"),
        ]
        release_all(hpc, [taken])
    finally:
        release_all(b, held_b)
        for revoked in held[1:]:  # each holder told it was preempted: nothing stays pending
            with pytest.raises(grpc.RpcError):
                release_all(a, [revoked])
        release_all(a, held[:1])


def test_quota_status_shows_the_shares(
    fleet: SecuredFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """QuotaStatus says fair sharing is on and shows each tenant's weighted share and weight;
    `gpualloc get quotas` adds a SHARE column."""
    a = stub(fleet, "scheduler-a")
    held = [reserve(a, 3, owner="job/share")]
    try:
        answer = a.QuotaStatus(pb.QuotaStatusRequest(), timeout=10)
        assert answer.fair_sharing
        [row] = answer.tenants
        assert (row.weighted_share, row.dominant_resource, row.fair_sharing_weight) == (
            167,
            "gpus",
            "1",
        )
        assert status(stub(fleet, "admin"), "hpc")["hpc", "gpus"].fair_sharing_weight == "2"
        lines = _get_quotas(fleet, "scheduler-a", capsys)
        assert lines[0].split() == [
            "TENANT", "RESOURCE", "COHORT", "NOMINAL", "USED", "BORROWED", "LENT", "LEFT",
            "SHARE", "PENDING",
        ]  # fmt: skip
        assert lines[1].split() == ["team-a", "gpus", "all", "2", "3", "1", "0", "3", "167", "0"]
    finally:
        release_all(a, held)


DECAY = FAIR.replace(
    "    fairSharing: {enabled: true}\n",
    "    fairSharing: {enabled: true}\n"
    "    admissionFairSharing:\n"
    "      usageHalfLifeTime: 2s\n"
    "      usageSamplingInterval: 500ms\n"
    "      resourceWeights: {gpus: 1}\n",
)


@pytest.mark.redis
@ON_STANDALONE_AND_CLUSTER
def test_two_replicas_show_the_same_decayed_usage(
    tmp_path: Path,
    layout: str,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Usage decayed with a 2 s half-life, sampled every 500 ms, kept in the store: team-a
    holds 3 GPUs and team-b 1; within a few samples team-a's decayed usage is above 0 and
    below 3 and above team-b's (what a bridge orders its queue by, lowest first); both
    replicas show the same sample (value and time), and `gpualloc get quotas` against the
    other replica a DECAYED column with team-a's above 0 (the column's every value:
    test_get_quotas_shows_decayed_usage)."""
    redis_url = request.getfixturevalue(layout)
    settings = AllocatorSettings(expire_interval=0.2, redis_url=redis_url)
    policy = policy_with(DECAY)
    with (
        secured_fleet(tmp_path / "one", policy=policy, allocator=settings) as one,
        secured_fleet(tmp_path / "two", policy=policy, allocator=settings) as two,
    ):
        a, b = stub(one, "scheduler-a"), stub(two, "scheduler-b")
        held_a, held_b = [reserve(a, 3, owner="job/decay")], [reserve(b, 1, owner="job/decay")]
        try:
            deadline = time.monotonic() + 30
            while True:
                rows = status(stub(one, "admin"))
                used = quantity(rows["team-a", "gpus"].decayed_used)
                if used > 0 and quantity(rows["team-b", "gpus"].decayed_used) > 0:
                    break
                assert time.monotonic() < deadline, "no sample of the held GPUs in 30 s"
                time.sleep(0.2)
            assert used < 3
            score = {t: float(row.decayed_usage) for (t, _), row in rows.items()}
            assert score["team-a"] > score["team-b"] > 0 and score["hpc"] == 0
            for _ in range(20):  # a sample may land between the two reads: read again
                seen = [status(stub(f, "admin"), "team-a")["team-a", "gpus"] for f in (one, two)]
                if seen[0].decayed_at == seen[1].decayed_at:
                    break
            assert seen[0].decayed_used == seen[1].decayed_used
            assert seen[0].decayed_at == seen[1].decayed_at and seen[0].HasField("decayed_at")
            lines = _get_quotas(two, "scheduler-a", capsys)
            header, values = lines[0].split(), lines[1].split()
            assert "DECAYED" in header and values[0] == "team-a"
            assert 0 < quantity(values[header.index("DECAYED")]) < 3
        finally:
            release_all(a, held_a)
            release_all(b, held_b)


def quantity(text: str) -> float:
    return float(Quantity.parse(text).value)


# hpc's fair-sharing weight 0: its decayed usage is infinite once it holds anything
ZERO_WEIGHT = DECAY.replace("    fairSharing: {weight: 2}\n", "    fairSharing: {weight: 0}\n")


def test_get_quotas_shows_decayed_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`gpualloc get quotas` shows a DECAYED column (each tenant's decayed usage of the
    resource, as last sampled), and with `-o wide` DECAYED-USAGE (the weighted sum over the
    tenant's fair-sharing weight): 0 with nothing held; once team-a holds 3 GPUs and hpc 1 for
    a few samples (2 s half-life, every 500 ms), team-a's are above 0 and below 3, team-b's
    stay 0, and hpc's, of weight 0, is "inf" on the wire (QuotaStatus) and in the column."""
    settings = AllocatorSettings(expire_interval=0.2, quota_grace_seconds=0.5)
    with secured_fleet(tmp_path, policy=policy_with(ZERO_WEIGHT), allocator=settings) as fleet:
        lines = _get_quotas(fleet, "scheduler-a", capsys)
        assert lines[0].split() == [
            "TENANT", "RESOURCE", "COHORT", "NOMINAL", "USED", "BORROWED", "LENT", "LEFT",
            "SHARE", "DECAYED", "PENDING",
        ]  # fmt: skip
        assert lines[1].split() == ["team-a", "gpus", "all", "2", "0", "0", "0", "6", "0", "0", "0"]
        a, hpc, admin = (
            stub(fleet, "scheduler-a"),
            stub(fleet, "slurm-bridge"),
            stub(fleet, "admin"),
        )
        held_a, held_hpc = (
            [reserve(a, 3, owner="job/decay")],
            [reserve(hpc, 1, owner="slurm/job/1")],
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                rows = status(admin)
                if all(quantity(rows[t, "gpus"].decayed_used) > 0 for t in ("team-a", "hpc")):
                    break
                assert time.monotonic() < deadline, "no sample of the held GPUs in 30 s"
                time.sleep(0.2)
            assert rows["hpc", "gpus"].decayed_usage == "inf"
            assert 0 < float(rows["team-a", "gpus"].decayed_usage) < 3
            lines = _get_quotas(fleet, "admin", capsys, "-o", "wide")
            header = lines[0].split()
            assert header == [
                "TENANT", "RESOURCE", "COHORT", "NOMINAL", "USED", "BORROWED", "LENT", "LEFT",
                "SHARE", "DECAYED", "PENDING", "BORROWING-LIMIT", "LENDING-LIMIT", "WEIGHT",
                "DECAYED-USAGE",
            ]  # fmt: skip
            table = {}
            for line in lines[1 : lines.index("")]:
                values = line.split()
                table[values[0]] = dict(zip(header, values, strict=True))
            assert 0 < quantity(table["team-a"]["DECAYED"]) < 3
            assert 0 < float(table["team-a"]["DECAYED-USAGE"]) < 3
            assert (table["team-b"]["DECAYED"], table["team-b"]["DECAYED-USAGE"]) == ("0", "0")
            assert quantity(table["hpc"]["DECAYED"]) > 0
            assert (table["hpc"]["WEIGHT"], table["hpc"]["DECAYED-USAGE"]) == ("0", "inf")
        finally:
            release_all(a, held_a)
            release_all(hpc, held_hpc)
