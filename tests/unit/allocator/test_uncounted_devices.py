"""`spec.quota.uncountedDevices` in the use-case layer (the real AllocatorService on the
embedded store and quota ledger, tests/unit/allocator/test_flavor_search.py's fleet): with
Refuse (what the translation of Kueue's objects writes), a tenant with quotas is not granted a
device no quota resource counts (Kueue admits no workload asking for a resource its
ClusterQueue does not cover); with Allow (the native default) such a device is not limited."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from services.allocator.app.messages import LeaseOptions, Outcome, Query
from services.common.dra.model import ResourceClaim
from services.common.quota.model import UNCOUNTED
from tests.builders import claim
from tests.unit.allocator.test_flavor_search import PRIORITIES, fleet_of, model_of

GPUS_ONLY = """\
    resources:
    - {name: gpus, deviceClassNames: [gpu]}
"""
TENANTS = """\
- {name: hpc, quotas: [{resource: gpus, nominal: 4}]}
- {name: ops}
"""
WHOLE = claim("c").request("g", "gpu", 1).build()
SLICE = claim("c").request("s", "mig", 1).build()
BOTH = claim("c").request("g", "gpu", 1).request("s", "mig", 1).build()


@dataclass(frozen=True)
class Uncounted:
    word: str  # spec.quota.uncountedDevices ("": not given)
    tenant: str
    request: ResourceClaim
    outcome: Outcome
    used: dict[str, int]  # the tenant's QuotaStatus usage afterwards (rows used)


CASES = {
    "refuse-keeps-a-limited-tenant-from-a-device-no-resource-counts": Uncounted(
        "Refuse", "hpc", SLICE, Outcome.QUOTA_EXCEEDED, {}
    ),
    "refuse-refuses-a-request-of-both-whole": Uncounted(
        "Refuse", "hpc", BOTH, Outcome.QUOTA_EXCEEDED, {}
    ),
    "refuse-grants-what-a-resource-counts": Uncounted(
        "Refuse", "hpc", WHOLE, Outcome.ALLOCATED, {"gpus": 1000}
    ),
    "refuse-leaves-a-tenant-without-quotas-unlimited": Uncounted(
        "Refuse", "ops", SLICE, Outcome.ALLOCATED, {}
    ),
    "allow-grants-it-uncounted": Uncounted("Allow", "hpc", SLICE, Outcome.ALLOCATED, {}),
    "the-native-default-is-allow": Uncounted("", "hpc", BOTH, Outcome.ALLOCATED, {"gpus": 1000}),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_devices_no_quota_resource_counts(case: Uncounted) -> None:
    """The outcome, the refusal (naming the uncounted devices, never a quota resource) and
    what the tenant's QuotaStatus counts afterwards (the uncounted devices never)."""
    word = f"    uncountedDevices: {case.word}\n" if case.word else ""
    for fleet in fleet_of(model_of(GPUS_ONLY + word + PRIORITIES, TENANTS)):
        lease = LeaseOptions(f"{case.tenant}/grant")
        answer = fleet.service.allocate(Query((case.request,)), lease)
        assert answer.outcome is case.outcome, (answer.quota, answer.outcome)
        if case.outcome is Outcome.QUOTA_EXCEEDED:
            assert not answer.reservations and not answer.preemption
            (refusal,) = answer.quota
            assert (refusal.resource, refusal.requested, refusal.listed) == (UNCOUNTED, 1000, False)
            assert "no quota resource counts" in str(refusal)
            explained = fleet.service.explain(Query((case.request,)), owner=lease.owner)
            assert [r.resource for r in explained.quota] == [UNCOUNTED]
            # no preemption makes room for it: nothing proposed, nothing revoked
            fleet.hold(case.tenant, "low", 1, "low", "hop-1")
            urgent = LeaseOptions(f"{case.tenant}/urgent", priority_class="high", preempt=True)
            pressed = fleet.service.allocate(Query((case.request,)), urgent)
            assert pressed.outcome is Outcome.QUOTA_EXCEEDED and not pressed.preemption
            assert fleet.service.holdings.reservations()  # the low one is still held
            case = replace(case, used={"gpus": 1000})
        status = fleet.service.quotas.status([case.tenant])  # type: ignore[union-attr]
        assert {row.resource: row.used for row in status if row.used} == case.used
