"""The access policy's quotas given as Kueue's own objects, on real mTLS servers.

examples/security/kueue/ holds the site's Kueue files (ResourceFlavors, ClusterQueues,
LocalQueues, WorkloadPriorityClasses, a PriorityClass); examples/security/quotas-native.yml
holds the same quotas in gpualloc's own form. One fleet is served with each, the same
scenario runs against both, and every decision must agree: the outcome, the nodes, the quota
refusals, the preemption's victims, and QuotaStatus after each step (resource names aside:
`nvidia.com/gpu/<flavor>` in one, `gpus/<flavor>` in the other). Then the Kueue files are
edited under a running server: a changed ClusterQueue is reloaded, a broken one is not.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from protos.common.v1 import dra_pb2
from services.allocator.config import AllocatorSettings
from services.client.mapping import placement_from_pb
from tests.integration.test_quota_tree import TREE_POLICY
from tests.integration.test_quotas import claim, release_all, reserve, status, stub
from tests.security_fixtures import SecuredFleet, policy_with, secured_fleet
from tests.unit.bridges.support import ROOT

pytestmark = pytest.mark.timeout(300)

EXAMPLES = ROOT / "examples" / "security"
OTHER_TENANTS = [{"name": "team-c"}, {"name": "tools", "allowAdminAccess": True}]
WHO = {"team-a": "scheduler-a", "team-b": "scheduler-b", "hpc": "slurm-bridge"}
PREFIX = {"team-a": "job", "team-b": "job", "hpc": "slurm/job"}


def _section(spec: dict[str, Any]) -> str:
    """`spec` as the lines of a policy's spec (two spaces in)."""
    text = yaml.safe_dump(spec, sort_keys=False)
    return "".join(f"  {line}\n" for line in text.splitlines())


def kueue_policy() -> str:
    """The test fleet's policy (its identities and bindings) with the example's Kueue quotas."""
    kueue = yaml.safe_load((EXAMPLES / "quotas-kueue.yml").read_text())["spec"]
    tenants = [t for t in kueue["tenants"] if t["name"] != "tools"] + OTHER_TENANTS
    return policy_with(_section({"quota": kueue["quota"], "tenants": tenants}))


def native_policy() -> str:
    native = yaml.safe_load((EXAMPLES / "quotas-native.yml").read_text())["spec"]
    tenants = [t for t in native["tenants"] if t["name"] != "tools"] + OTHER_TENANTS
    return policy_with(_section({"quota": native["quota"], "tenants": tenants}))


def kueue_fleet(directory: Path, settings: AllocatorSettings) -> Any:
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copytree(EXAMPLES / "kueue", directory / "kueue")
    return secured_fleet(directory, policy=kueue_policy(), allocator=settings)


SETTINGS = AllocatorSettings(expire_interval=0.2, quota_grace_seconds=0.5)


@pytest.fixture(scope="module")
def fleets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SecuredFleet]]:
    root = tmp_path_factory.mktemp("kueue-policy")
    with (
        kueue_fleet(root / "kueue", SETTINGS) as kueue,
        secured_fleet(root / "native", policy=native_policy(), allocator=SETTINGS) as native,
    ):
        yield {"kueue": kueue, "native": native}


# A scenario: (tenant, name, count, priority, preempt) reserves; ("release", name) releases.
SCENARIO: list[tuple[Any, ...]] = [
    ("team-a", "a-own", 4, "", False),  # within team-a's hopper nominal
    ("team-a", "a-borrows", 2, "", False),  # borrows hopper from team-b (which lends 2)
    ("team-a", "a-more", 1, "", False),  # hopper spent: MayStopSearch, ada borrowed from team-b
    ("team-b", "b-own", 2, "", False),  # team-b's guaranteed hopper
    ("team-b", "b-more", 2, "", False),  # over: refused, with a proposal
    ("team-b", "b-more", 2, "high", False),  # a proposal of reclaim victims
    ("team-b", "b-more", 2, "high", True),  # reclaims from team-a
    ("hpc", "h-low", 2, "low", False),
    ("hpc", "h-high", 1, "high", False),  # over: its own low one is the proposed victim
    ("hpc", "h-high", 1, "high", True),
    ("hpc", "h-fits", 1, "high", True),  # fits its nominal again: no victim
    ("release", "a-own"),
    ("team-b", "b-borrows", 3, "standard", False),
    ("team-a", "a-again", 4, "low", True),  # team-a reclaims at any priority (Any)
    ("release", "b-own"),
    ("release", "b-more"),
    ("team-a", "a-last", 2, "", False),
]


# What docs/tenancy.md's worked example says of some steps (index: outcome, node families,
# the victims' rules); the rest must only agree between the forms.
H100, L40S = ("h100-node-1", "h100-node-2"), ("l40s-node-1",)
DOCUMENTED = {
    0: ("OUTCOME_ALLOCATED", H100, []),
    1: ("OUTCOME_ALLOCATED", H100, []),
    2: ("OUTCOME_ALLOCATED", L40S, []),
    3: ("OUTCOME_ALLOCATED", H100, []),
    4: ("OUTCOME_QUOTA_EXCEEDED", (), []),
    6: ("OUTCOME_ALLOCATED", H100, ["reclaim"]),
    7: ("OUTCOME_ALLOCATED", H100, []),
    9: ("OUTCOME_ALLOCATED", H100, ["priority"]),
}


def _decision(fleet: SecuredFleet, held: dict[str, Any], step: tuple[Any, ...]) -> Any:
    if step[0] == "release":
        tenant, answer = held.pop(step[1])
        return ("released", step[1], _release(fleet, tenant, answer))
    tenant, name, count, priority, preempt = step
    caller = stub(fleet, WHO[tenant])
    answer = reserve(
        caller, count, owner=f"{PREFIX[tenant]}/{name}", priority=priority, preempt=preempt
    )
    if answer.outcome == pb.OUTCOME_ALLOCATED:
        held[name] = (tenant, answer)
    return (
        pb.Outcome.Name(answer.outcome),
        sorted(r.node_name for r in answer.reservations),
        sorted(
            (
                q.tenant,
                q.resource.rsplit("/", 1)[-1],
                q.requested,
                q.used,
                q.nominal,
                q.borrowed,
                q.left,
            )
            for q in answer.quota_refusals
        ),  # fmt: skip
        [
            (v.holder.owner, v.holder.tenant, v.holder.node_name, v.reason)
            for v in answer.preemption.victims
        ],
    )


def _release(fleet: SecuredFleet, tenant: str, answer: pb.AllocateResponse) -> str:
    """Release as the holder: "released", or the code of a reservation a preemption took."""
    try:
        release_all(stub(fleet, WHO[tenant]), [answer])
    except grpc.RpcError as error:
        return str(error.code())
    return "released"


def _quota_rows(fleet: SecuredFleet) -> dict[tuple[str, str], tuple[str, ...]]:
    return {
        (tenant, resource.rsplit("/", 1)[1]): (r.nominal, r.used, r.borrowed, r.lent, r.left)
        for (tenant, resource), r in status(stub(fleet, "admin")).items()
    }


def test_the_same_quotas_as_kueue_objects_and_native_make_the_same_decisions(
    fleets: dict[str, SecuredFleet],
) -> None:
    runs: dict[str, list[Any]] = {}
    for form, fleet in fleets.items():
        held: dict[str, Any] = {}
        runs[form] = [(_decision(fleet, held, step), _quota_rows(fleet)) for step in SCENARIO]
        for tenant, answer in held.values():
            _release(fleet, tenant, answer)
    for i, (kueue, native) in enumerate(zip(runs["kueue"], runs["native"], strict=True)):
        assert kueue == native, f"step {i} {SCENARIO[i]}"
    decisions = [decision for decision, _ in runs["kueue"]]
    for index, (outcome, nodes, reasons) in DOCUMENTED.items():
        decision = decisions[index]
        assert decision[0] == outcome, (index, decision)
        assert set(decision[1]) <= set(nodes) and bool(decision[1]) == bool(nodes), decision
        assert [victim[3] for victim in decision[3]] == reasons, (index, decision)
    refusal = decisions[4][2]
    assert refusal == [("team-b", "hopper", "2", "2", "4", "0", "0")]  # used 2 of 4, 0 left
    assert decisions[6][3][0][1] == "team-a"  # team-a's borrowed reservation


# docs/tenancy.md's tree of cohorts (tests/integration/test_quota_tree.py's TREE_POLICY, in
# gpualloc's form, its tenants without a preemption section: gpualloc's defaults) as Kueue's
# objects, given inline (spec.quota.kueue.objects), with those defaults spelled as Kueue's.
TREE_OBJECTS = """
- {apiVersion: kueue.x-k8s.io/v1beta2, kind: ResourceFlavor, metadata: {name: any-gpu}}
- apiVersion: kueue.x-k8s.io/v1beta2
  kind: WorkloadPriorityClass
  metadata: {name: standard}
  value: 100
- apiVersion: kueue.x-k8s.io/v1beta2
  kind: Cohort
  metadata: {name: org}
  spec:
    resourceGroups:
    - coveredResources: [nvidia.com/gpu]
      flavors: [{name: any-gpu, resources: [{name: nvidia.com/gpu, nominalQuota: 2}]}]
- apiVersion: kueue.x-k8s.io/v1beta2
  kind: Cohort
  metadata: {name: research}
  spec:
    parentName: org
    resourceGroups:
    - coveredResources: [nvidia.com/gpu]
      flavors:
      - name: any-gpu
        resources: [{name: nvidia.com/gpu, nominalQuota: 0, borrowingLimit: 2}]
"""
TREE_QUEUES = {"team-a": ("research", "nominalQuota: 2"), "team-b": ("research", "nominalQuota: 2"),
               "hpc": ("org", "nominalQuota: 4, lendingLimit: 2")}  # fmt: skip
TREE_QUEUE = """
- apiVersion: kueue.x-k8s.io/v1beta2
  kind: ClusterQueue
  metadata: {{name: {name}}}
  spec:
    cohortName: {cohort}
    preemption: {{withinClusterQueue: LowerPriority, reclaimWithinCohort: Any}}
    resourceGroups:
    - coveredResources: [nvidia.com/gpu]
      flavors: [{{name: any-gpu, resources: [{{name: nvidia.com/gpu, {quota}}}]}}]
"""
TREE_SCENARIO: list[tuple[Any, ...]] = [
    ("team-a", "a-own", 4, "", False),  # its 2 and team-b's 2, inside research
    ("team-a", "a-org", 2, "", False),  # research borrows 2 from org, its borrowingLimit
    ("team-a", "a-over", 1, "", False),  # research may borrow no more
    ("hpc", "h-own", 4, "", False),  # the 2 it keeps and the 2 it lends, unused so far
    ("team-b", "b-own", 1, "", False),  # its 2 are in team-a's hands
    ("team-b", "b-own", 1, "", True),  # reclaimed from team-a, which borrows in research
    ("release", "h-own"),
    ("team-a", "a-more", 2, "", False),
]


FAIR = {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]}


def tree_policies(fair: bool) -> dict[str, str]:
    """The tree in both forms; `fair`: with fair sharing on (Kueue's Configuration; the
    native `quota.fairSharing`)."""
    objects = yaml.safe_load(TREE_OBJECTS) + [
        yaml.safe_load(TREE_QUEUE.format(name=name, cohort=cohort, quota=quota))[0]
        for name, (cohort, quota) in TREE_QUEUES.items()
    ]
    native = TREE_POLICY
    if fair:
        config = {"apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration"}
        objects.append({**config, "fairSharing": FAIR})
        fair_sharing = f"    fairSharing: {json.dumps({'enabled': True, **FAIR})}\n"
        native = native.replace("  quota:\n", "  quota:\n" + fair_sharing, 1)
    kueue = {"quota": {"kueue": {"objects": objects}}, "tenants": OTHER_TENANTS}
    return {"kueue": policy_with(_section(kueue)), "native": native}


def _tree_rows(fleet: SecuredFleet) -> Any:
    """QuotaStatus's tenant and cohort rows of the one GPU resource (by any name)."""
    answer = stub(fleet, "admin").QuotaStatus(pb.QuotaStatusRequest(), timeout=10)
    tenants = sorted(
        (r.tenant, r.nominal, r.used, r.borrowed, r.lent, r.left, r.weighted_share)
        for r in answer.tenants
        if not r.resource.endswith("/(none)")
    )
    cohorts = sorted(
        (
            r.cohort,
            tuple(r.cohort_path),
            r.nominal,
            r.subtree_quota,
            r.used,
            r.borrowed,
            r.left,
            r.weighted_share,
        )
        for r in answer.cohorts
        if not r.resource.endswith("/(none)")
    )
    return tenants, cohorts


@pytest.mark.parametrize("fair", [False, True], ids=["classic", "fair-sharing"])
def test_a_tree_of_kueue_cohorts_and_the_native_tree_make_the_same_decisions(
    tmp_path: Path, fair: bool
) -> None:
    """The hierarchical worked example run on both forms, with classic preemption and with
    fair sharing on: the same outcomes, victims and QuotaStatus (tenants and cohorts, shares
    included) after every step; and what docs/tenancy.md's tree example says of its steps holds
    for the Kueue objects too."""
    runs: dict[str, list[Any]] = {}
    for form, text in tree_policies(fair).items():
        with secured_fleet(tmp_path / form, policy=text, allocator=SETTINGS) as fleet:
            held: dict[str, Any] = {}
            runs[form] = []
            for step in TREE_SCENARIO:
                decision = _decision(fleet, held, step)
                if decision[0] != "released":  # one resource: its name differs between forms
                    decision = (*decision[:2], [r[:1] + r[2:] for r in decision[2]], decision[3])
                runs[form].append((decision, _tree_rows(fleet)))
    for i, (kueue, native) in enumerate(zip(runs["kueue"], runs["native"], strict=True)):
        assert kueue == native, f"step {i} {TREE_SCENARIO[i]}"
    outcomes = [decision[0] for decision, _ in runs["kueue"]]
    if fair:  # the reclaim then follows the shares: that both forms agree is the point
        assert outcomes[:5] == [outcomes[0], "OUTCOME_ALLOCATED", "OUTCOME_QUOTA_EXCEEDED",
                                "OUTCOME_ALLOCATED", "OUTCOME_QUOTA_EXCEEDED"]  # fmt: skip
        return
    assert outcomes[:6] == [
        "OUTCOME_ALLOCATED",
        "OUTCOME_ALLOCATED",
        "OUTCOME_QUOTA_EXCEEDED",
        "OUTCOME_ALLOCATED",
        "OUTCOME_QUOTA_EXCEEDED",
        "OUTCOME_ALLOCATED",
    ]
    assert [v[3] for v in runs["kueue"][5][0][3]] == ["reclaim"]
    tenants, cohorts = runs["kueue"][1][1]  # after team-a's 6: research borrows 2 of org
    assert [row[0] for row in tenants] == ["hpc", "team-a", "team-b"]
    assert [(row[0], row[4], row[5]) for row in cohorts] == [
        ("org", "6", "0"),
        ("research", "6", "2"),
    ]


def test_a_changed_cluster_queue_is_reloaded_and_a_broken_one_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """hpc's ClusterQueue (hopper nominal 2) is raised to 3 in queues.yml under a running
    server: QuotaStatus shows 3 and a third GPU is granted. A ClusterQueue added as a new file
    of the directory limits its tenant. Then queues.yml gets a negative nominalQuota: the
    reload is refused and logged naming the object and field, and the last quotas stay."""
    caplog.set_level(logging.INFO, logger="services.allocator.bootstrap")
    with kueue_fleet(tmp_path, SETTINGS) as fleet:
        notes = [r.getMessage() for r in caplog.records if "not enforced" in r.getMessage()]
        assert notes and notes[0].endswith(
            "Kueue quotas of resources gpualloc does not allocate, not enforced: "
            "cpu (team-a, team-b); memory (team-a, team-b)"
        )
        assert ("hpc", "nvidia.com/gpu/hopper") in status(stub(fleet, "admin"), "hpc")
        hpc = stub(fleet, "slurm-bridge")
        held = [reserve(hpc, 2, owner="slurm/job/first")]
        assert held[0].outcome == pb.OUTCOME_ALLOCATED
        assert reserve(hpc, 1, owner="slurm/job/over").outcome == pb.OUTCOME_QUOTA_EXCEEDED

        queues = tmp_path / "kueue" / "queues.yml"
        hpc_quota = "{name: nvidia.com/gpu, nominalQuota: 2}"
        _rewrite(
            queues, _edit_queue(queues.read_text(), "hpc", hpc_quota, hpc_quota.replace("2}", "3}"))
        )
        _until(lambda: _quota_rows(fleet)["hpc", "hopper"][0] == "3", "hpc's nominal of 3")
        held.append(reserve(hpc, 1, owner="slurm/job/third"))
        assert held[1].outcome == pb.OUTCOME_ALLOCATED

        assert ("team-c", "hopper") not in _quota_rows(fleet)
        team_c = _edit_queue(queues.read_text(), "hpc", "name: hpc", "name: team-c", only=True)
        _rewrite(tmp_path / "kueue" / "team-c.yaml", team_c)
        _until(lambda: ("team-c", "hopper") in _quota_rows(fleet), "team-c's ClusterQueue")

        caplog.set_level(logging.ERROR, logger="gpualloc.tls")
        raised = hpc_quota.replace("2}", "3}")
        _rewrite(
            queues, _edit_queue(queues.read_text(), "hpc", raised, raised.replace("3}", "-1}"))
        )
        refused: list[str] = []

        def logged() -> bool:
            assert _quota_rows(fleet)["hpc", "hopper"][0] == "3", "the broken file was applied"
            refused.extend(
                r.getMessage()
                for r in caplog.records
                if "access policy (quotas) changed but cannot be loaded" in r.getMessage()
            )
            return bool(refused)

        _until(logged, "the refused reload in the log")
        assert refused[0].endswith(
            "kueue/queues.yml[2]: ClusterQueue hpc: "
            "spec.resourceGroups[0].flavors[0].resources[0].nominalQuota: Invalid value: "
            "must be greater than or equal to 0"
        ), refused[0]
        release_all(hpc, held)


def _edit_queue(text: str, queue: str, old: str, new: str, *, only: bool = False) -> str:
    """`text` (a multi-document file) with `old` replaced by `new` in ClusterQueue `queue`'s
    document (which must hold it once); `only`: that document alone."""
    documents = text.split("\n---\n")
    (index,) = [
        i for i, d in enumerate(documents) if "kind: ClusterQueue" in d and f"name: {queue}\n" in d
    ]
    assert documents[index].count(old) == 1, (old, documents[index])
    documents[index] = documents[index].replace(old, new)
    return documents[index] if only else "\n---\n".join(documents)


def _rewrite(path: Path, text: str) -> None:
    """Write `path` past the watcher's 1 s between looks (a new mtime)."""
    time.sleep(1.1)
    path.write_text(text)


def _until(found: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not found():
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.2)


BRIDGE_QUEUE = ROOT / "examples" / "bridges" / "kueue" / "cluster-queue.yml"


def _mig(stub_: allocator_pb2_grpc.AllocatorStub, profile: str, owner: str) -> pb.AllocateResponse:
    expression = f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"
    exactly = dra_pb2.ExactDeviceRequest(
        device_class_name="mig.nvidia.com",
        count=1,
        selectors=[dra_pb2.DeviceSelector(cel=expression)],
    )
    claim = dra_pb2.ResourceClaim(
        name="mig", namespace="default", requests=[dra_pb2.DeviceRequest(name="m", exactly=exactly)]
    )
    request = pb.AllocateRequest(claims=[claim], reserve=True, owner=owner)
    request.lease_ttl.FromSeconds(120)
    return stub_.Allocate(request, timeout=20)


def test_the_kueue_bridges_own_cluster_queue_is_a_policy_and_counts_mig_slices_by_profile(
    tmp_path: Path,
) -> None:
    """examples/bridges/kueue/cluster-queue.yml, the ClusterQueue the Kueue bridge's docs apply
    (cpu, memory, nvidia.com/gpu and nvidia.com/mig-1g.10gb, an admission check, a LocalQueue),
    as the policy's quotas (renamed team-a, its MIG quota 2): MIG 1g.10gb slices count against
    `nvidia.com/mig-1g.10gb/gpu-flavor` until its nominal, then QUOTA_EXCEEDED naming it; a
    2g.10gb slice, a profile the queue does not cover, is counted by no quota resource: refused
    to team-a (the translation's `uncountedDevices: Refuse`, as Kueue admits nothing its
    ClusterQueue does not cover), granted to hpc, a tenant without quotas."""
    text = BRIDGE_QUEUE.read_text()
    assert text.count('name: "gpu-cluster-queue"') == 1 and "nominalQuota: 16" in text
    (tmp_path / "kueue").mkdir()
    (tmp_path / "kueue" / "cluster-queue.yml").write_text(
        text.replace('name: "gpu-cluster-queue"', "name: team-a").replace(
            "nominalQuota: 16", "nominalQuota: 2"
        )
    )
    tenants = [*OTHER_TENANTS, {"name": "team-b"}, {"name": "hpc"}]  # bound, not limited
    policy = policy_with(_section({"quota": {"kueue": {"files": ["kueue/"]}}, "tenants": tenants}))
    with secured_fleet(tmp_path, policy=policy, allocator=SETTINGS) as fleet:
        a = stub(fleet, "scheduler-a")
        held = [_mig(a, "1g.10gb", f"job/slice-{i}") for i in range(2)]
        assert [h.outcome for h in held] == [pb.OUTCOME_ALLOCATED] * 2
        over = _mig(a, "1g.10gb", "job/slice-over")
        assert over.outcome == pb.OUTCOME_QUOTA_EXCEEDED
        assert [(q.resource, q.used, q.nominal) for q in over.quota_refusals] == [
            ("nvidia.com/mig-1g.10gb/gpu-flavor", "2", "2")
        ]
        other = _mig(a, "2g.10gb", "job/other-profile")
        assert other.outcome == pb.OUTCOME_QUOTA_EXCEEDED and not other.reservations
        assert [(q.resource, q.requested) for q in other.quota_refusals] == [("(uncounted)", "1")]
        assert "requested 1 devices no quota resource counts" in placement_from_pb(other).reason()
        hpc = stub(fleet, "slurm-bridge")
        unlimited = _mig(hpc, "2g.10gb", "slurm/job/other-profile")
        assert unlimited.outcome == pb.OUTCOME_ALLOCATED
        rows = status(stub(fleet, "admin"), "team-a")
        assert rows["team-a", "nvidia.com/mig-1g.10gb/gpu-flavor"].used == "2"
        assert rows["team-a", "nvidia.com/gpu/gpu-flavor"].used == "0"
        release_all(a, held)
        release_all(hpc, [unlimited])


RESEARCH_QUEUE = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: hopper
spec:
  nodeLabels:
    nvidia.com/gpu.family: hopper
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: team-b
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [nvidia.com/gpu]
    flavors:
    - name: hopper
      resources:
      - {name: nvidia.com/gpu, nominalQuota: 4}
"""


def _flavors_tried(answer: pb.AllocateResponse) -> list[tuple[str, str]]:
    return [(f.flavor, pb.FlavorMode.Name(f.mode)) for f in answer.flavors]


def test_each_cluster_queue_charges_the_devices_to_its_own_flavors(tmp_path: Path) -> None:
    """The case found under a real Kueue: the Kueue bridge's ClusterQueue (flavor gpu-flavor,
    no nodeLabels: every GPU; renamed team-a) beside a ClusterQueue team-b on flavor hopper
    (nodeLabels family=hopper). Flavors are per ClusterQueue, as in Kueue: team-b's grants land
    on H100 nodes and are charged to `nvidia.com/gpu/hopper` until its nominal 4; team-a's on
    the same nodes to `nvidia.com/gpu/gpu-flavor`; team-b is never granted an L40S (no flavor
    it lists selects one: refused naming gpu-flavor, which it does not list)."""
    (tmp_path / "kueue").mkdir()
    bridge = BRIDGE_QUEUE.read_text().replace('name: "gpu-cluster-queue"', "name: team-a")
    (tmp_path / "kueue" / "cluster-queue.yml").write_text(bridge)
    (tmp_path / "kueue" / "research.yml").write_text(RESEARCH_QUEUE)
    tenants = [*OTHER_TENANTS, {"name": "hpc"}]  # bound, not limited
    policy = policy_with(_section({"quota": {"kueue": {"files": ["kueue/"]}}, "tenants": tenants}))
    with secured_fleet(tmp_path, policy=policy, allocator=SETTINGS) as fleet:
        a, b = stub(fleet, "scheduler-a"), stub(fleet, "scheduler-b")
        held: list[pb.AllocateResponse] = []
        try:
            mine = reserve(b, 4, owner="job/research")
            assert mine.outcome == pb.OUTCOME_ALLOCATED, mine.quota_refusals
            held.append(mine)
            assert {r.node_name for r in mine.reservations} <= {"h100-node-1", "h100-node-2"}
            assert _flavors_tried(mine) == [("hopper", "FLAVOR_MODE_FIT")]
            theirs = reserve(a, 4, owner="job/bridge", node=mine.reservations[0].node_name)
            assert theirs.outcome == pb.OUTCOME_ALLOCATED, theirs.quota_refusals
            held.append(theirs)
            assert _flavors_tried(theirs) == [("gpu-flavor", "FLAVOR_MODE_FIT")]
            over = reserve(b, 1, owner="job/research-over")
            assert over.outcome == pb.OUTCOME_QUOTA_EXCEEDED and not over.reservations
            assert [(q.resource, q.used, q.nominal) for q in over.quota_refusals] == [
                ("nvidia.com/gpu/hopper", "4", "4")
            ]
            elsewhere = reserve(b, 1, owner="job/research-l40s", node="l40s-node-1")
            assert elsewhere.outcome == pb.OUTCOME_QUOTA_EXCEEDED and not elsewhere.reservations
            assert _flavors_tried(elsewhere) == [("hopper", "FLAVOR_MODE_NO_FIT")]
            assert [(q.resource, q.nominal) for q in elsewhere.quota_refusals] == [
                ("nvidia.com/gpu/gpu-flavor", "0")
            ]
            rows = status(stub(fleet, "admin"), "team-a", "team-b")
            used = {key: row.used for key, row in rows.items() if row.used != "0"}
            assert used == {
                ("team-a", "nvidia.com/gpu/gpu-flavor"): "4",
                ("team-b", "nvidia.com/gpu/hopper"): "4",
            }
        finally:
            release_all(a, held[1:])
            release_all(b, held[:1])


CATCH_ALL_FIRST_QUEUE = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: gpu-flavor
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: hopper
spec:
  nodeLabels:
    nvidia.com/gpu.family: hopper
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: team-b
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [nvidia.com/gpu]
    flavors:
    - name: gpu-flavor
      resources:
      - {name: nvidia.com/gpu, nominalQuota: 2}
    - name: hopper
      resources:
      - {name: nvidia.com/gpu, nominalQuota: 4}
"""


def _used(fleet: SecuredFleet, tenant: str) -> dict[str, str]:
    rows = status(stub(fleet, "admin"), tenant)
    return {resource: row.used for (_, resource), row in rows.items() if row.used != "0"}


def test_a_catch_all_listed_first_falls_to_the_labelled_flavor_and_is_charged_there(
    tmp_path: Path,
) -> None:
    """A ClusterQueue listing the label-less gpu-flavor (nominal 2) before hopper (nominal 4):
    once gpu-flavor's quota is spent (2 L40Ss), a grant of 2 falls to hopper and is charged to
    hopper, the flavor its search assigned (Kueue admits it there), not to gpu-flavor, which
    also selects H100s; QuotaStatus shows it on hopper, its release frees hopper, and the items
    of an AllocateBatch are charged there alike."""
    (tmp_path / "kueue").mkdir()
    (tmp_path / "kueue" / "team-b.yml").write_text(CATCH_ALL_FIRST_QUEUE)
    tenants = [*OTHER_TENANTS, {"name": "team-a"}, {"name": "hpc"}]  # bound, not limited
    policy = policy_with(_section({"quota": {"kueue": {"files": ["kueue/"]}}, "tenants": tenants}))
    with secured_fleet(tmp_path, policy=policy, allocator=SETTINGS) as fleet:
        b = stub(fleet, "scheduler-b")
        held: list[pb.AllocateResponse] = []
        try:
            first = reserve(b, 2, owner="job/any", node="l40s-node-1")
            assert first.outcome == pb.OUTCOME_ALLOCATED, first.quota_refusals
            held.append(first)
            assert _flavors_tried(first) == [("gpu-flavor", "FLAVOR_MODE_FIT")]
            fallen = reserve(b, 2, owner="job/hopper")
            assert fallen.outcome == pb.OUTCOME_ALLOCATED, (fallen.quota_refusals, fallen.flavors)
            assert {r.node_name for r in fallen.reservations} <= {"h100-node-1", "h100-node-2"}
            assert _flavors_tried(fallen) == [
                ("gpu-flavor", "FLAVOR_MODE_NO_CANDIDATES"),
                ("hopper", "FLAVOR_MODE_FIT"),
            ]
            assert _used(fleet, "team-b") == {
                "nvidia.com/gpu/gpu-flavor": "2",
                "nvidia.com/gpu/hopper": "2",
            }
            release_all(b, [fallen])
            assert _used(fleet, "team-b") == {"nvidia.com/gpu/gpu-flavor": "2"}
            items = []
            for index in range(2):
                item = pb.AllocateRequest(claims=[claim(1)], reserve=True, owner=f"job/b-{index}")
                item.lease_ttl.FromSeconds(120)
                items.append(item)
            batch = b.AllocateBatch(pb.AllocateBatchRequest(items=items), timeout=30)
            answers = [i.response for i in batch.items]
            held.extend(answers)
            assert [a.outcome for a in answers] == [pb.OUTCOME_ALLOCATED] * 2
            assert {r.node_name for a in answers for r in a.reservations} <= {
                "h100-node-1",
                "h100-node-2",
            }
            assert _used(fleet, "team-b") == {
                "nvidia.com/gpu/gpu-flavor": "2",
                "nvidia.com/gpu/hopper": "2",
            }
        finally:
            release_all(b, held)
