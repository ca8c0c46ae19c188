"""Hierarchical cohorts end to end: real mTLS servers under an access policy whose cohorts form
a tree, reservations over gRPC, QuotaStatus and `gpualloc get quotas` showing the tree.

The policy (TREE_POLICY), docs/tenancy.md's worked example:

    org (2 GPUs of its own)
    |-- research (none of its own; borrows at most 2 from org)
    |   |-- team-a (2)
    |   `-- team-b (2)
    `-- hpc (4, lends org at most 2: keeps 2)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from services import cli as gpualloc_cli
from services.allocator.config import AllocatorSettings
from tests.integration.test_quotas import _rewrite_policy, release_all, reserve, status, stub
from tests.security_fixtures import SecuredFleet, policy_with, secured_fleet

pytestmark = pytest.mark.timeout(300)

TREE = """\
  quota:
    resources:
    - {name: gpus, deviceClassNames: [gpu.nvidia.com]}
    priorityClasses:
    - {name: standard, value: 100, globalDefault: true}
    cohorts:
    - name: org
      quotas: [{resource: gpus, nominal: 2}]
    - name: research
      parent: org
      quotas: [{resource: gpus, nominal: 0, borrowingLimit: 2}]
  tenants:
  - name: team-a
    cohort: research
    quotas: [{resource: gpus, nominal: 2}]
  - name: team-b
    cohort: research
    quotas: [{resource: gpus, nominal: 2}]
  - name: hpc
    cohort: org
    quotas: [{resource: gpus, nominal: 4, lendingLimit: 2}]
  - name: team-c
  - name: tools
    allowAdminAccess: true
"""
TREE_POLICY = policy_with(TREE)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredFleet]:
    settings = AllocatorSettings(expire_interval=0.2, quota_grace_seconds=0.5)
    with secured_fleet(
        tmp_path_factory.mktemp("tree-pki"), policy=TREE_POLICY, allocator=settings
    ) as made:
        yield made


def cohorts(answer: pb.QuotaStatusResponse) -> dict[str, pb.CohortQuotaStatus]:
    return {row.cohort: row for row in answer.cohorts}


def test_borrowing_goes_up_the_tree_within_each_levels_limits(fleet: SecuredFleet) -> None:
    """The worked example: team-a takes its 2 and team-b's 2 inside research, then 2 more
    from org (research's borrowing limit), and is refused the next; hpc still gets its 4
    (2 kept, 2 lent to org and free); team-b finds its own 2 in team-a's hands."""
    a, b, hpc = stub(fleet, "scheduler-a"), stub(fleet, "scheduler-b"), stub(fleet, "slurm-bridge")
    held_a: list[pb.AllocateResponse] = []
    held_hpc: list[pb.AllocateResponse] = []
    try:
        held_a.append(reserve(a, 4, owner="job/research"))
        held_a.append(reserve(a, 2, owner="job/org"))
        assert [h.outcome for h in held_a] == [pb.OUTCOME_ALLOCATED] * 2
        refused = reserve(a, 1, owner="job/over")
        assert refused.outcome == pb.OUTCOME_QUOTA_EXCEEDED
        (refusal,) = refused.quota_refusals
        assert (refusal.cohort, refusal.used, refusal.nominal, refusal.left) == (
            "research",
            "6",
            "2",
            "0",
        )
        held_hpc.append(reserve(hpc, 4, owner="slurm/job/all"))
        assert held_hpc[0].outcome == pb.OUTCOME_ALLOCATED
        assert reserve(b, 1, owner="job/own").outcome == pb.OUTCOME_QUOTA_EXCEEDED

        answer = stub(fleet, "admin").QuotaStatus(pb.QuotaStatusRequest(), timeout=10)
        rows = {(r.tenant, r.resource): r for r in answer.tenants}
        assert list(rows["team-a", "gpus"].cohort_path) == ["org", "research"]
        assert list(rows["hpc", "gpus"].cohort_path) == ["org"]
        assert (rows["team-a", "gpus"].borrowed, rows["team-b", "gpus"].lent) == ("4", "2")
        tree = cohorts(answer)
        assert list(tree) == ["org", "research"]
        research, org = tree["research"], tree["org"]
        assert list(research.cohort_path) == ["org"] and list(org.cohort_path) == []
        assert (research.subtree_quota, research.used, research.borrowed) == ("4", "6", "2")
        assert (research.borrowing_limit, research.left) == ("2", "0")
        # research borrows 2 of the 8 org could lend it: share 250 (shown with fair sharing
        # off too); team-a borrows 4 of the 6 research could give it at most: 667
        assert (research.weighted_share, research.dominant_resource) == (250, "gpus")
        assert rows["team-a", "gpus"].weighted_share == 667
        # org: its own 2, research's 4, hpc's lent 2; research uses 6, hpc 2 beyond its 2
        assert (org.nominal, org.subtree_quota, org.used, org.left) == ("2", "8", "8", "0")
    finally:
        release_all(a, held_a)
        release_all(hpc, held_hpc)
    assert status(stub(fleet, "admin"), "team-a")["team-a", "gpus"].used == "0"


def test_a_tenant_below_nominal_reclaims_down_the_tree(fleet: SecuredFleet) -> None:
    """team-b, within its nominal, reclaims from team-a, which borrows its 2 in research:
    the newest of team-a's reservations goes (reason reclaim)."""
    a, b = stub(fleet, "scheduler-a"), stub(fleet, "scheduler-b")
    held = [reserve(a, 4, owner="job/first"), reserve(a, 2, owner="job/second")]
    try:
        taken = reserve(b, 1, owner="job/reclaim", preempt=True)
        assert taken.outcome == pb.OUTCOME_ALLOCATED
        [victim] = taken.preemption.victims  # another tenant's: shown by tenant only
        assert (victim.reason, victim.holder.tenant) == ("reclaim", "team-a")
        release_all(b, [taken])
    finally:
        with pytest.raises(grpc.RpcError) as caught:  # revoked: its holder is told so
            release_all(a, held[1:])
        assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        release_all(a, held[:1])  # the older one was spared


def test_a_tenant_sees_the_cohorts_above_it(
    fleet: SecuredFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """QuotaStatus shows a tenant its own rows and the cohorts on its path (aggregates only);
    `gpualloc get quotas` prints them as a second table, each cohort by its path."""
    a = stub(fleet, "scheduler-a")
    held = [reserve(a, 3, owner="job/cli")]
    try:
        answer = a.QuotaStatus(pb.QuotaStatusRequest(), timeout=10)
        assert [r.tenant for r in answer.tenants] == ["team-a"]
        assert sorted(cohorts(answer)) == ["org", "research"]
        assert not answer.fair_sharing
        hpc = stub(fleet, "slurm-bridge").QuotaStatus(pb.QuotaStatusRequest(), timeout=10)
        assert sorted(cohorts(hpc)) == ["org"]
        lines = _get_quotas(fleet, "scheduler-a", capsys)
        assert lines[0].split() == [
            "TENANT", "RESOURCE", "COHORT", "NOMINAL", "USED", "BORROWED", "LENT", "LEFT",
            "PENDING",
        ]  # fmt: skip
        assert lines[1].split() == ["team-a", "gpus", "org/research", "2", "3", "1", "0", "3", "0"]
        assert lines[2] == ""
        assert lines[3].split() == [
            "COHORT", "RESOURCE", "NOMINAL", "SUBTREE", "USED", "BORROWED", "LENT", "LEFT",
        ]  # fmt: skip
        assert [line.split() for line in lines[4:]] == [
            ["org", "gpus", "2", "8", "3", "0", "0", "5"],  # research keeps nothing back
            ["org/research", "gpus", "0", "4", "3", "0", "0", "3"],
        ]
    finally:
        release_all(a, held)


def _get_quotas(
    fleet: SecuredFleet, who: str, capsys: pytest.CaptureFixture[str], *options: str
) -> list[str]:
    """`gpualloc get quotas [options]` as `who` (its certificate), its output's lines."""
    certs = fleet.directory / who
    argv = ["get", "quotas", *options, "-s", f"127.0.0.1:{fleet.mtls_port}"]
    argv += ["--tls-ca", str(fleet.directory / "ca.crt")]
    argv += ["--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key")]
    assert gpualloc_cli.main(argv) == 0
    return capsys.readouterr().out.splitlines()


def test_get_quotas_wide_adds_the_limits_and_json_and_yaml_list_both_kinds(
    fleet: SecuredFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gpualloc get quotas -o wide` adds SHARE and the limits (BORROWING-LIMIT, LENDING-LIMIT,
    WEIGHT) to both tables: research borrows at most 2, hpc lends at most 2, "-" where
    unlimited; `-o json` and `-o yaml` list the same items, the tenants' of kind TenantQuota
    and the cohorts' of kind CohortQuota."""
    a = stub(fleet, "scheduler-a")
    held = [reserve(a, 3, owner="job/wide")]
    try:
        lines = _get_quotas(fleet, "scheduler-a", capsys, "-o", "wide")
        assert lines[0].split() == [
            "TENANT", "RESOURCE", "COHORT", "NOMINAL", "USED", "BORROWED", "LENT", "LEFT",
            "SHARE", "PENDING", "BORROWING-LIMIT", "LENDING-LIMIT", "WEIGHT",
        ]  # fmt: skip
        # team-a borrows 1 of the 6 research could give it at most: share 167
        assert lines[1].split() == [
            "team-a", "gpus", "org/research", "2", "3", "1", "0", "3", "167", "0", "-", "-", "1"
        ]  # fmt: skip
        assert lines[2] == ""
        assert lines[3].split() == [
            "COHORT", "RESOURCE", "NOMINAL", "SUBTREE", "USED", "BORROWED", "LENT", "LEFT",
            "SHARE", "BORROWING-LIMIT", "LENDING-LIMIT", "WEIGHT",
        ]  # fmt: skip
        assert [line.split() for line in lines[4:]] == [
            ["org", "gpus", "2", "8", "3", "0", "0", "5", "0", "-", "-", "1"],
            ["org/research", "gpus", "0", "4", "3", "0", "0", "3", "0", "2", "-", "1"],
        ]
        hpc = _get_quotas(fleet, "slurm-bridge", capsys, "-o", "wide")[1].split()
        assert (hpc[0], hpc[-3:]) == ("hpc", ["-", "2", "1"])  # lends org at most 2
        as_json = json.loads("\n".join(_get_quotas(fleet, "scheduler-a", capsys, "-o", "json")))
        as_yaml = yaml.safe_load("\n".join(_get_quotas(fleet, "scheduler-a", capsys, "-o", "yaml")))
        assert as_json == as_yaml
        assert [(i["kind"], i.get("tenant") or i["cohort"]) for i in as_json["items"]] == [
            ("TenantQuota", "team-a"),
            ("CohortQuota", "org"),
            ("CohortQuota", "research"),
        ]
        tenant, org, research = as_json["items"]
        assert {i["apiVersion"] for i in as_json["items"]} == {"gpualloc.io/v1alpha1"}
        assert (tenant["cohortPath"], tenant["used"], tenant["borrowed"]) == (
            ["org", "research"],
            "3",
            "1",
        )
        # an unset limit (unlimited) is left out, as every kind's empty fields are
        assert (tenant["weightedShare"], "borrowingLimit" in tenant) == (167, False)
        assert (org["subtreeQuota"], org["left"]) == ("8", "5")
        assert (research["cohortPath"], research["borrowingLimit"]) == (["org"], "2")
    finally:
        release_all(a, held)


def test_a_reload_that_moves_a_cohort_moves_its_usage(tmp_path: Path) -> None:
    """research moves from org to a new root `lab` (a hot reload): team-a's usage goes to
    lab's ledger with it, so lab's quota counts it at once, and org's ledger forgets it."""
    settings = AllocatorSettings(expire_interval=0.2, quota_grace_seconds=0.5)
    with secured_fleet(tmp_path, policy=TREE_POLICY, allocator=settings) as fleet:
        a, admin = stub(fleet, "scheduler-a"), stub(fleet, "admin")
        held = [reserve(a, 4, owner="job/before")]
        _rewrite_policy(
            fleet,
            (
                "    - name: research\n      parent: org\n",
                "    - name: lab\n      quotas: [{resource: gpus, nominal: 1}]\n"
                "    - name: research\n      parent: lab\n",
            ),
        )
        deadline = time.monotonic() + 10
        while _path(admin, "team-a") != ["lab", "research"]:
            assert time.monotonic() < deadline, "the reloaded tree was never applied"
            time.sleep(0.2)
        tree = cohorts(admin.QuotaStatus(pb.QuotaStatusRequest(), timeout=10))
        assert (tree["research"].used, tree["lab"].subtree_quota) == ("4", "5")
        assert tree["org"].used == "0"  # hpc alone in org now
        # research may borrow at most 2 from lab, which has 1 of its own: 5 in all, 4 held
        assert reserve(a, 2, owner="job/after").outcome == pb.OUTCOME_QUOTA_EXCEEDED
        held.append(reserve(a, 1, owner="job/after"))
        assert held[-1].outcome == pb.OUTCOME_ALLOCATED
        release_all(a, held)
        assert status(admin, "team-a")["team-a", "gpus"].used == "0"


def _path(admin: allocator_pb2_grpc.AllocatorStub, tenant: str) -> list[str]:
    return list(status(admin, tenant)[tenant, "gpus"].cohort_path)
