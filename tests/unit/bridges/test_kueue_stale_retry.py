"""Which of our Retry checks the controller resets to Pending: only a Retry on a Workload
that holds no quota and may be queued again (Kueue evicted it for another reason first, so it
never resets the check itself, and its scheduler admits no Workload with a Retry check)."""

from __future__ import annotations

from typing import Any

import pytest

from services.bridges.kueue.controller import _stale_retry
from services.bridges.kueue.objects import Workload


def workload(state: str, conditions: dict[str, bool], **spec: Any) -> Workload:
    return Workload.from_dict(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": "w", "namespace": "team-a"},
            "spec": {"podSets": [], **spec},
            "status": {
                "conditions": [
                    {"type": t, "status": "True" if v else "False"} for t, v in conditions.items()
                ],
                "admissionChecks": [{"name": "gpualloc", "state": state, "message": ""}],
            },
        }
    )


@pytest.mark.parametrize(
    ("state", "conditions", "spec", "stale"),
    [
        pytest.param(
            "Retry", {"Evicted": True, "QuotaReserved": False}, {}, True, id="preempted-first"
        ),
        pytest.param("Retry", {"QuotaReserved": False}, {}, True, id="pending-with-retry"),
        pytest.param(
            "Retry", {"Evicted": True, "QuotaReserved": True}, {}, False, id="kueue-evicting-it"
        ),
        pytest.param("Retry", {"QuotaReserved": True}, {}, False, id="kueue-not-yet-evicted"),
        pytest.param("Rejected", {"QuotaReserved": False}, {}, False, id="rejected-stays"),
        pytest.param("Pending", {"QuotaReserved": False}, {}, False, id="already-pending"),
        pytest.param("Retry", {"QuotaReserved": False}, {"active": False}, False, id="deactivated"),
        pytest.param("Retry", {"QuotaReserved": False, "Finished": True}, {}, False, id="finished"),
    ],
)
def test_only_a_retry_on_a_workload_kueue_may_queue_again_is_reset(state, conditions, spec, stale):
    found = workload(state, conditions, **spec)
    check = found.check("gpualloc")
    assert check is not None
    assert _stale_retry(found, check) is stale
