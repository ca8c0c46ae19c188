"""The policy's cohort tree and fair-sharing sections (services/common/security/policy.py):
what they load into, and every wrong field refused with its path, as Kueue's webhooks and
configuration validation refuse them."""

from __future__ import annotations

import copy
from fractions import Fraction
from typing import Any

import pytest
import yaml

from services.allocator.core import admit, tenant_status
from services.common.errors import InvalidArgument
from services.common.quota.model import (
    AdmissionFairSharing,
    CohortQuota,
    FairSharing,
    PreemptionStrategy,
    QuotaLimits,
)
from services.common.security.policy import parse_policy

POLICY = yaml.safe_load(
    """
apiVersion: gpualloc.dev/v1alpha1
kind: AccessPolicy
metadata: {name: tree}
spec:
  quota:
    resources: [{name: gpus, deviceClassNames: [gpu.nvidia.com]}]
    cohorts:
    - name: org
      quotas: [{resource: gpus, nominal: 2}]
    - name: research
      parent: org
      quotas: [{resource: gpus, nominal: 4, borrowingLimit: 2, lendingLimit: 1}]
      fairSharing: {weight: 2}
    fairSharing:
      enabled: true
      preemptionStrategies: [LessThanOrEqualToFinalShare, LessThanInitialShare]
    admissionFairSharing:
      usageHalfLifeTime: 168h
      usageSamplingInterval: 5m
      resourceWeights: {gpus: 1}
  tenants:
  - name: team-a
    cohort: research
    quotas: [{resource: gpus, nominal: 2}]
    fairSharing: {weight: 500m}
  - name: team-b
    cohort: org
    quotas: [{resource: gpus, nominal: 2}]
  - name: tools
  bindings: []
"""
)
GPU = 1000


def test_the_tree_and_fair_sharing_load() -> None:
    quotas = parse_policy(copy.deepcopy(POLICY)).quotas
    assert quotas.cohorts == {
        "org": CohortQuota("org", "", {"gpus": QuotaLimits(2 * GPU)}),
        "research": CohortQuota(
            "research", "org", {"gpus": QuotaLimits(4 * GPU, 2 * GPU, 1 * GPU)}, Fraction(2)
        ),
    }
    assert quotas.tenants["team-a"].weight == Fraction(1, 2)
    assert quotas.tenants["team-b"].weight == 1
    assert quotas.path("team-a") == ("org", "research")
    assert quotas.ledgers() == ("cohort:org",)  # one tree, one ledger
    assert quotas.fair_sharing == FairSharing(
        True,
        (
            PreemptionStrategy.LESS_THAN_OR_EQUAL_TO_FINAL_SHARE,
            PreemptionStrategy.LESS_THAN_INITIAL_SHARE,
        ),
    )
    assert quotas.admission_fair_sharing == AdmissionFairSharing(
        7 * 24 * 3600.0, 300.0, {"gpus": Fraction(1)}
    )


DEFAULTS = [
    ("fair-sharing-off-by-default", "spec.quota.fairSharing", None, "fair_sharing", FairSharing()),
    (
        "strategies-default-to-kueues-list",
        "spec.quota.fairSharing",
        {"enabled": True},
        "fair_sharing",
        FairSharing(True),
    ),
    (
        "one-strategy",
        "spec.quota.fairSharing",
        {"enabled": True, "preemptionStrategies": ["LessThanInitialShare"]},
        "fair_sharing",
        FairSharing(True, (PreemptionStrategy.LESS_THAN_INITIAL_SHARE,)),
    ),
    (
        "no-usage-decay-by-default",
        "spec.quota.admissionFairSharing",
        None,
        "admission_fair_sharing",
        None,
    ),
    (
        "sampling-every-5m-by-default-and-weights-1",
        "spec.quota.admissionFairSharing",
        {"usageHalfLifeTime": "1h30m"},
        "admission_fair_sharing",
        AdmissionFairSharing(5400.0, 300.0, {}),
    ),
    (
        "a-half-life-of-0-resets-usage",
        "spec.quota.admissionFairSharing",
        {"usageHalfLifeTime": "0s"},
        "admission_fair_sharing",
        AdmissionFairSharing(0.0),
    ),
]


@pytest.mark.parametrize(
    ("path", "value", "attribute", "expected"), [pytest.param(*d[1:], id=d[0]) for d in DEFAULTS]
)
def test_policy_defaults(path: str, value: Any, attribute: str, expected: Any) -> None:
    assert getattr(parse_policy(_edit(path, value)).quotas, attribute) == expected


BAD = [
    ("cohort-without-a-name", "spec.quota.cohorts[0].name", None, "Required value"),
    (
        "cohort-named-like-a-tenant",
        "spec.quota.cohorts[0].name",
        "team-b",
        "a tenant is named 'team-b'",
    ),
    ("cohort-twice", "spec.quota.cohorts[1].name", "org", "duplicate cohort 'org'"),
    ("cohort-name-hash-tag", "spec.quota.cohorts[0].name", "o{rg}", "store hash tag"),
    ("unknown-parent", "spec.quota.cohorts[1].parent", "nope", "unknown cohort 'nope'"),
    ("own-parent", "spec.quota.cohorts[0].parent", "org", "cannot be its own parent"),
    ("cycle", "spec.quota.cohorts[0].parent", "research", "cycle: org -> research -> org"),
    (
        "root-borrows",
        "spec.quota.cohorts[0].quotas[0].borrowingLimit",
        1,
        "only a cohort with a parent borrows or lends",
    ),
    (
        "root-lends",
        "spec.quota.cohorts[0].quotas[0].lendingLimit",
        1,
        "only a cohort with a parent borrows or lends",
    ),
    ("cohort-unknown-field", "spec.quota.cohorts[0].nominal", 4, "unknown field"),
    (
        "cohort-unknown-resource",
        "spec.quota.cohorts[0].quotas[0].resource",
        "tpus",
        "unknown quota resource 'tpus'",
    ),
    (
        "cohort-negative-quota",
        "spec.quota.cohorts[0].quotas[0].nominal",
        -1,
        "must not be negative",
    ),
    (
        "tenant-cohort-is-a-tenant",
        "spec.tenants[0].cohort",
        "team-b",
        "'team-b' is a tenant",
    ),
    ("weight-negative", "spec.tenants[0].fairSharing.weight", -1, "must not be negative"),
    ("weight-collapses", "spec.quota.cohorts[1].fairSharing.weight", "1n", "more than 1n"),
    ("weight-not-a-quantity", "spec.tenants[0].fairSharing.weight", "heavy", "quantity"),
    ("weight-unknown-field", "spec.tenants[0].fairSharing.share", 1, "unknown field"),
    (
        "weight-without-quotas",
        "spec.tenants[2].fairSharing",
        {"weight": 1},
        "a tenant without quotas shares nothing",
    ),
    ("fair-sharing-not-boolean", "spec.quota.fairSharing.enabled", "yes", "true or false"),
    (
        "unknown-strategy",
        "spec.quota.fairSharing.preemptionStrategies",
        ["LessThanFinalShare"],
        "must be one of LessThanOrEqualToFinalShare, LessThanInitialShare",
    ),
    (
        "strategies-in-another-order",
        "spec.quota.fairSharing.preemptionStrategies",
        ["LessThanInitialShare", "LessThanOrEqualToFinalShare"],
        "must be one of [LessThanOrEqualToFinalShare]",
    ),
    (
        "half-life-required",
        "spec.quota.admissionFairSharing",
        {"usageSamplingInterval": "5m"},
        "Required value",
    ),
    (
        "half-life-not-a-duration",
        "spec.quota.admissionFairSharing",
        {"usageHalfLifeTime": "a week"},
        "must be a duration",
    ),
    (
        "half-life-a-bare-number",
        "spec.quota.admissionFairSharing",
        {"usageHalfLifeTime": 3600},
        "must be a duration",
    ),
    (
        "sampling-zero",
        "spec.quota.admissionFairSharing",
        {"usageHalfLifeTime": "1h", "usageSamplingInterval": "0s"},
        "must be greater than 0",
    ),
    (
        "weight-of-an-unknown-resource",
        "spec.quota.admissionFairSharing",
        {"usageHalfLifeTime": "1h", "resourceWeights": {"cpu": 1}},
        "unknown quota resource 'cpu'",
    ),
    (
        "resource-weight-negative",
        "spec.quota.admissionFairSharing",
        {"usageHalfLifeTime": "1h", "resourceWeights": {"gpus": -1}},
        "must be a finite number >= 0",
    ),
]


@pytest.mark.parametrize(("path", "value", "message"), [pytest.param(*b[1:], id=b[0]) for b in BAD])
def test_policy_refuses_a_bad_tree_or_fair_sharing(path: str, value: Any, message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_policy(_edit(path, value))
    found = [str(v) for v in caught.value.violations]
    assert any(path.split("[")[0] in v and message in v for v in found), found


def _edit(path: str, value: Any) -> dict[str, Any]:
    """POLICY with the field at `path` (dots and [i]) set to `value` (None: removed)."""
    document: Any = copy.deepcopy(POLICY)
    parts = path.replace("]", "").replace("[", ".").split(".")
    where = document
    for part in parts[:-1]:
        where = where[int(part)] if part.isdigit() else where.setdefault(part, {})
    last = parts[-1]
    if value is None:
        if isinstance(where, dict):
            where.pop(last, None)
    elif last.isdigit():
        where[int(last)] = value
    else:
        where[last] = value
    return dict(document)


@pytest.mark.parametrize(
    ("lend", "team_b_left"),
    [
        pytest.param(6, 10, id="a-lending-limit-above-its-nominal-lends-its-childrens-quota"),
        pytest.param(4, 8, id="a-lending-limit-of-its-nominal-keeps-its-childrens-quota"),
        pytest.param(None, 10, id="no-lending-limit-lends-the-whole-subtree"),
    ],
)
def test_a_cohorts_lending_limit_may_pass_its_own_nominal(
    lend: int | None, team_b_left: int
) -> None:
    """research's own nominal is 4, its subtree's quota 6 (team-a's 2 too): a lendingLimit of 6
    loads (Kueue's webhook does not bound it by the cohort's own nominal) and lends team-a's
    quota as well, so team-b (in org, beside research) may take its 2, org's 2 and research's 6
    with nothing used; a lendingLimit of 4 lends 4."""
    document = _edit("spec.quota.cohorts[1].quotas[0].lendingLimit", lend)
    quotas = parse_policy(document).quotas
    assert quotas.cohorts["research"].limits["gpus"] == QuotaLimits(
        4 * GPU, 2 * GPU, None if lend is None else lend * GPU
    )
    (row,) = tenant_status(quotas, {}, ["team-b"])
    assert row.left == team_b_left * GPU
    assert admit(quotas, "team-b", {"gpus": team_b_left * GPU}, {}) == ()
    assert admit(quotas, "team-b", {"gpus": team_b_left * GPU + 1}, {}) != ()
