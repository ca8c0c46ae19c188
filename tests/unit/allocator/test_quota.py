"""Tenant quotas as pure values: the policy section (services/common/quota/model.py), the one
rule (services/allocator/core/quota/rule.py), and a brute-force model of it.

The model below states the rule the way docs/tenancy.md does, without the closed form of
the rule's `_left`: a cohort is feasible when every tenant stays within nominal + borrowingLimit
and what the tenants hold above nominal fits in what the others leave unused of what they lend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from services.allocator.core import admit, tenant_status
from services.common.errors import InvalidArgument
from services.common.quota.model import (
    BorrowWithinCohort,
    PreemptionPolicy,
    QuotaLimits,
    QuotaModel,
    QuotaResource,
    ReclaimWithinCohort,
    TenantQuota,
    WhenCanBorrow,
    WithinTenant,
    quantity_text,
)
from services.common.security.policy import parse_policy

GPU = 1000  # one device, in milli-units
GPUS = QuotaResource("gpus", ("gpu.nvidia.com",))


def model(*tenants: TenantQuota) -> QuotaModel:
    return QuotaModel((GPUS,), {t.tenant: t for t in tenants})


def tenant(
    name: str, nominal: int, cohort: str = "c", borrow: int | None = None, lend: int | None = None
) -> TenantQuota:
    limits = QuotaLimits(
        nominal * GPU,
        None if borrow is None else borrow * GPU,
        None if lend is None else lend * GPU,
    )
    return TenantQuota(name, cohort, {"gpus": limits})


def used(**gpus: int) -> dict[str, dict[str, int]]:
    return {name: {"gpus": count * GPU} for name, count in gpus.items()}


# --- the rule, case by case ------------------------------------------------------------------

CASES = [
    # (id, tenants, usage, who asks, how many, admitted, left before)
    ("within-nominal", [tenant("a", 4), tenant("b", 4)], used(), "a", 4, True, 8),
    ("borrow-from-idle-cohort", [tenant("a", 4), tenant("b", 4)], used(a=4), "a", 4, True, 4),
    ("cohort-exhausted", [tenant("a", 4), tenant("b", 4)], used(a=4, b=4), "a", 1, False, 0),
    (
        "borrowing-limit-caps",
        [tenant("a", 4, borrow=2), tenant("b", 4)],
        used(a=4),
        "a",
        3,
        False,
        2,
    ),
    (
        "lending-limit-keeps-guaranteed",
        [tenant("a", 4), tenant("b", 4, lend=1)],
        used(a=4),
        "a",
        2,
        False,
        1,
    ),
    (
        "guaranteed-part-always-fits",
        [tenant("a", 4), tenant("b", 4, lend=1)],
        used(a=7),
        "b",
        3,
        True,
        3,
    ),
    (
        "nominal-reclaimable-only-when-free",  # b borrowed all of a's quota: a gets nothing now
        [tenant("a", 4), tenant("b", 4)],
        used(b=8),
        "a",
        1,
        False,
        0,
    ),
    ("lone-tenant-never-borrows", [tenant("a", 4, cohort="")], used(a=3), "a", 2, False, 1),
    ("unlisted-tenant-unlimited", [tenant("a", 1)], used(a=1), "z", 100, True, None),
    ("zero-amount-always-fits", [tenant("a", 0)], used(), "a", 0, True, 0),
    # Kueue admits nothing asking for a resource the ClusterQueue does not cover; gpualloc let
    # a tenant borrow an unlisted resource without limit before
    ("unlisted-resource-is-refused", [TenantQuota("a", "c", {}), tenant("b", 4)], used(), "a",
     1, False, 0),
    ("nominal-zero-borrows-from-its-cohort", [tenant("a", 0), tenant("b", 4)], used(), "a", 2,
     True, 4),
    ("borrowing-limit-zero-forbids-it", [tenant("a", 0, borrow=0), tenant("b", 4)], used(), "a",
     1, False, 0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("tenants", "usage", "asker", "count", "admitted", "left"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_admit_table(
    tenants: list[TenantQuota],
    usage: dict[str, dict[str, int]],
    asker: str,
    count: int,
    admitted: bool,
    left: int | None,
) -> None:
    quotas = model(*tenants)
    refusals = admit(quotas, asker, {"gpus": count * GPU}, usage)
    assert (refusals == ()) is admitted
    if left is not None:
        row = next(r for r in tenant_status(quotas, usage) if r.tenant == asker)
        assert row.left == left * GPU
    if refusals:
        refusal = refusals[0]
        assert refusal.requested == count * GPU and refusal.left == left * GPU  # type: ignore[operator]
        assert "requested" in str(refusal) and f"{left} left" in str(refusal)


def test_status_reports_borrowed_and_lent() -> None:
    quotas = model(tenant("a", 4), tenant("b", 4), tenant("c", 2))
    rows = {r.tenant: r for r in tenant_status(quotas, used(a=7, b=1))}
    assert rows["a"].borrowed == 3 * GPU
    # a's 3 borrowed GPUs are charged to the lenders in name order: b's 3 unused, then c's
    assert (rows["b"].lent, rows["c"].lent, rows["a"].lent) == (3 * GPU, 0, 0)
    assert rows["c"].left == 2 * GPU  # its guaranteed part is lendable, and unused: free
    assert rows["a"].left == 2 * GPU  # 10 in the cohort, 8 held


# --- the rule against a brute-force model -----------------------------------------------------


def feasible(quotas: QuotaModel, usage: Mapping[str, Mapping[str, int]]) -> bool:
    for members in _cohorts(quotas):
        above = 0  # held above nominal
        spare = 0  # unused and lendable
        for name in members:
            limits = quotas.tenants[name].of("gpus")
            u = usage.get(name, {}).get("gpus", 0)
            if limits.borrowing_limit is not None and u > limits.nominal + limits.borrowing_limit:
                return False
            above += max(0, u - limits.nominal)
            spare += min(limits.lendable, max(0, limits.nominal - u))
        if above > spare:
            return False
    return True


def _cohorts(quotas: QuotaModel) -> list[list[str]]:
    groups: dict[str, list[str]] = {}
    for quota in quotas.tenants.values():
        groups.setdefault(quota.cohort or "lone:" + quota.tenant, []).append(quota.tenant)
    return list(groups.values())


limits_st = st.tuples(
    st.integers(0, 4), st.none() | st.integers(0, 4), st.none() | st.integers(0, 4)
)


@st.composite
def cohorts(draw: Any) -> QuotaModel:
    count = draw(st.integers(1, 4))
    tenants = []
    for i in range(count):
        nominal, borrow, lend = draw(limits_st)
        lend = None if lend is None else min(lend, nominal)
        cohort = draw(st.sampled_from(["x", "x", "y", ""]))
        tenants.append(tenant(f"t{i}", nominal, cohort, borrow, lend))
    return model(*tenants)


@given(cohorts(), st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3)), max_size=12))
def test_admit_never_overruns_and_never_refuses_needlessly(
    quotas: QuotaModel, steps: list[tuple[int, int]]
) -> None:
    """Grants from an empty ledger: each is admitted exactly when the cohorts stay feasible."""
    names = sorted(quotas.tenants)
    usage: dict[str, dict[str, int]] = {}
    for who, count in steps:
        name = names[who % len(names)]
        amount = count * GPU
        after = {k: dict(v) for k, v in usage.items()}
        after.setdefault(name, {})["gpus"] = after.get(name, {}).get("gpus", 0) + amount
        admitted = admit(quotas, name, {"gpus": amount}, usage) == ()
        assert admitted == feasible(quotas, after), (name, amount, usage)
        if admitted:
            usage = after
        assert feasible(quotas, usage)


@given(cohorts(), st.lists(st.integers(0, 6), min_size=4, max_size=4))
def test_left_is_the_largest_admitted_grant(quotas: QuotaModel, held: list[int]) -> None:
    names = sorted(quotas.tenants)
    usage = {n: {"gpus": held[i] * GPU} for i, n in enumerate(names)}
    if not feasible(quotas, usage):
        return  # usage above quota (a shrunk policy): nothing more is granted, checked below
    for row in tenant_status(quotas, usage):
        assert admit(quotas, row.tenant, {"gpus": row.left}, usage) == () or row.left == 0
        assert admit(quotas, row.tenant, {"gpus": row.left + 1}, usage) != ()


def test_over_quota_after_a_policy_shrink_refuses_new_grants() -> None:
    quotas = model(tenant("a", 2, cohort=""))
    assert admit(quotas, "a", {"gpus": GPU}, used(a=5)) != ()
    row = tenant_status(quotas, used(a=5))[0]
    assert (row.borrowed, row.left) == (3 * GPU, 0)


# --- the policy section ------------------------------------------------------------------------

POLICY = """
apiVersion: gpualloc.dev/v1alpha1
kind: AccessPolicy
metadata: {name: t}
spec:
  quota:
    resources:
    - {name: gpus, deviceClassNames: [gpu.nvidia.com]}
    - {name: mig-memory, deviceClassNames: [mig.nvidia.com], counter: memory}
    - {name: gpu-share, deviceClassNames: [gpu.nvidia.com, mig.nvidia.com], gpuShare: true}
  tenants:
  - name: hpc
    cohort: research
    quotas:
    - {resource: gpus, nominal: 8, borrowingLimit: 4, lendingLimit: 2}
    - {resource: mig-memory, nominal: 160Gi}
  - {name: ml, cohort: research, quotas: [{resource: gpus, nominal: 8}]}
  - {name: ops}
  bindings: []
"""


def test_policy_declares_quotas() -> None:
    quotas = parse_policy(yaml.safe_load(POLICY)).quotas
    assert quotas.enabled
    assert [r.name for r in quotas.resources] == ["gpus", "mig-memory", "gpu-share"]
    assert quotas.resources[2] == QuotaResource(
        "gpu-share", ("gpu.nvidia.com", "mig.nvidia.com"), gpu_share=True
    )
    hpc = quotas.quota_of("hpc")
    assert hpc is not None and hpc.cohort == "research"
    assert hpc.of("gpus") == QuotaLimits(8 * GPU, 4 * GPU, 2 * GPU)
    assert hpc.of("mig-memory").nominal == 160 * 2**30 * 1000
    assert quantity_text(hpc.of("mig-memory").nominal, binary=True) == "160Gi"
    assert quotas.quota_of("ops") is None  # no quotas: not limited
    assert quotas.members(hpc) == ("hpc", "ml")


def _edit(path: str, value: Any) -> str:
    document = yaml.safe_load(POLICY)
    target = document
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last = keys[-1]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return yaml.safe_dump(document)


BAD = [
    ("unknown-resource", "spec.tenants.1.quotas.0.resource", "cpus", "unknown quota resource"),
    ("negative-nominal", "spec.tenants.1.quotas.0.nominal", "-1", "must not be negative"),
    ("not-a-quantity", "spec.tenants.1.quotas.0.nominal", "lots", "must be a quantity"),
    (
        "lending-above-nominal",
        "spec.tenants.1.quotas.0",
        {"resource": "gpus", "nominal": 1, "lendingLimit": 2},
        "must not exceed nominal",
    ),
    (
        "unknown-field",
        "spec.tenants.1.quotas.0",
        {"resource": "gpus", "nominal": 1, "borowingLimit": 2},
        "unknown field",
    ),
    (
        "cohort-without-quotas",
        "spec.tenants.2",
        {"name": "ops", "cohort": "research"},
        "a tenant without quotas is in no cohort",
    ),
    ("hash-tag-in-cohort", "spec.tenants.1.cohort", "a{b}", "hash tag"),
    (
        "no-classes",
        "spec.quota.resources.0",
        {"name": "gpus", "deviceClassNames": []},
        "at least one DeviceClass",
    ),
    (
        "a-counter-and-gpu-shares",
        "spec.quota.resources.2",
        {
            "name": "x",
            "deviceClassNames": ["mig.nvidia.com"],
            "counter": "memory",
            "gpuShare": True,
        },
        "counts a counter or GPU shares, not both",
    ),
    (
        "preemption-unknown-within",
        "spec.tenants.1.preemption",
        {"withinClusterQueue": "Sometimes"},
        "spec.tenants[1].preemption.withinClusterQueue: must be one of Never, LowerPriority, "
        "LowerOrNewerEqualPriority, got 'Sometimes'",
    ),
    (
        "preemption-unknown-reclaim",
        "spec.tenants.1.preemption",
        {"reclaimWithinCohort": "Lower"},
        "spec.tenants[1].preemption.reclaimWithinCohort: must be one of Never, LowerPriority, Any",
    ),
    (
        "preemption-borrow-any-is-not-kueues",
        "spec.tenants.1.preemption",
        {"borrowWithinCohort": {"policy": "Any"}},
        "spec.tenants[1].preemption.borrowWithinCohort.policy: must be one of Never, LowerPriority",
    ),
    (
        "preemption-threshold-without-policy",
        "spec.tenants.1.preemption",
        {"borrowWithinCohort": {"maxPriorityThreshold": 10}},
        "maxPriorityThreshold: only with policy LowerPriority",
    ),
    (
        "preemption-threshold-not-an-integer",
        "spec.tenants.1.preemption",
        {"borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": "high"}},
        "maxPriorityThreshold: must be an integer",
    ),
    (
        "preemption-unknown-field",
        "spec.tenants.1.preemption",
        {"withinCohort": "Any"},
        "unknown field",
    ),
    (
        "preemption-without-quotas",
        "spec.tenants.2",
        {"name": "ops", "preemption": {"withinClusterQueue": "Never"}},
        "a tenant without quotas preempts by no policy",
    ),
    (
        "gpu-share-not-a-bool",
        "spec.quota.resources.2",
        {"name": "x", "deviceClassNames": ["mig.nvidia.com"], "gpuShare": "yes"},
        "must be true or false",
    ),
    (
        "uncounted-devices-of-an-unknown-word",
        "spec.quota.uncountedDevices",
        "Deny",
        "spec.quota.uncountedDevices: must be one of Allow, Refuse, got 'Deny'",
    ),
    (
        "a-resource-named-as-the-uncounted-devices",
        "spec.quota.resources.2",
        {"name": "(uncounted)", "deviceClassNames": ["mig.nvidia.com"]},
        "(uncounted) names the devices no resource counts",
    ),
]


@pytest.mark.parametrize(("path", "value", "message"), [pytest.param(*b[1:], id=b[0]) for b in BAD])
def test_policy_refuses_bad_quotas(path: str, value: Any, message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_policy(yaml.safe_load(_edit(path, value)))
    assert message in str(caught.value) or any(message in str(v) for v in caught.value.violations)


PREEMPTION_CASES = [
    ("unset-keeps-gpualloc-rules", None, PreemptionPolicy()),
    (
        "every-knob",
        {
            "withinClusterQueue": "LowerOrNewerEqualPriority",
            "reclaimWithinCohort": "LowerPriority",
            "borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": 100},
        },
        PreemptionPolicy(
            WithinTenant.LOWER_OR_NEWER_EQUAL_PRIORITY,
            ReclaimWithinCohort.LOWER_PRIORITY,
            BorrowWithinCohort.LOWER_PRIORITY,
            100,
        ),
    ),
    (
        "kueues-defaults-spelled-out",
        {
            "withinClusterQueue": "Never",
            "reclaimWithinCohort": "Never",
            "borrowWithinCohort": {"policy": "Never"},
        },
        PreemptionPolicy(WithinTenant.NEVER, ReclaimWithinCohort.NEVER, BorrowWithinCohort.NEVER),
    ),
    (
        "one-knob-the-others-default",
        {"reclaimWithinCohort": "Never"},
        PreemptionPolicy(reclaim_within_cohort=ReclaimWithinCohort.NEVER),
    ),
]


@pytest.mark.parametrize(
    ("given", "expected"), [pytest.param(*case[1:], id=case[0]) for case in PREEMPTION_CASES]
)
def test_policy_declares_a_tenants_preemption(
    given: dict[str, Any] | None, expected: PreemptionPolicy
) -> None:
    document = yaml.safe_load(POLICY)
    if given is not None:
        document["spec"]["tenants"][1]["preemption"] = given
    ml = parse_policy(document).quotas.quota_of("ml")
    assert ml is not None and ml.preemption == expected


FLAVORS = """
    resourceFlavors:
    - {name: h100, nodeLabels: {nvidia.com/gpu.family: hopper}}
    - {name: a100, nodeLabels: {nvidia.com/gpu.family: ampere}}
"""


def _flavored(tenant_quotas: str, fungibility: str = "") -> dict[str, Any]:
    text = POLICY.replace("  quota:\n", "  quota:\n" + FLAVORS.lstrip("\n"), 1).replace(
        "    - {name: gpus, deviceClassNames: [gpu.nvidia.com]}",
        "    - {name: gpus, deviceClassNames: [gpu.nvidia.com], flavors: [h100, a100]}",
    )
    document = yaml.safe_load(text)
    document["spec"]["tenants"][1] = yaml.safe_load(
        "{name: ml, cohort: research, quotas: " + tenant_quotas + fungibility + "}"
    )
    document["spec"]["tenants"][0]["quotas"] = [
        {"resource": "gpus", "flavor": "h100", "nominal": 8}
    ]
    return document  # type: ignore[no-any-return]


def test_policy_declares_flavored_quotas_in_the_tenants_order() -> None:
    quotas = parse_policy(
        _flavored(
            "[{resource: gpus, flavor: a100, nominal: 4}, {resource: gpus, flavor: h100,"
            " nominal: 2, borrowingLimit: 1}]",
            ", flavorFungibility: {whenCanBorrow: TryNextFlavor}",
        )
    ).quotas
    names = [r.name for r in quotas.resources]
    assert names[:3] == ["gpus/h100", "gpus/a100", "gpus/(none)"]
    nowhere = quotas.resources[2]  # devices of no flavor: no tenant can list them
    assert nowhere.spec is None and nowhere.flavor == "(none)"
    assert admit(quotas, "ml", {"gpus/(none)": GPU}, {}) != ()
    h100 = quotas.resources[0]
    assert h100.spec is not None
    assert (h100.base, h100.flavor, h100.spec.node_labels) == (
        "gpus",
        "h100",
        (("nvidia.com/gpu.family", "hopper"),),
    )
    assert [r.flavor for r in quotas.flavors_of("gpus")] == ["h100", "a100"]
    ml = quotas.quota_of("ml")
    assert ml is not None and ml.of("gpus/h100") == QuotaLimits(2 * GPU, 1 * GPU)
    assert [r.flavor for r in quotas.flavor_order("ml", "gpus")] == ["a100", "h100"]
    assert ml.fungibility.when_can_borrow is WhenCanBorrow.TRY_NEXT_FLAVOR
    hpc = quotas.quota_of("hpc")
    assert hpc is not None and hpc.fungibility.when_can_borrow is WhenCanBorrow.MAY_STOP_SEARCH
    # a flavor the tenant does not list is never granted to it (Kueue: not in its queue)
    assert admit(quotas, "hpc", {"gpus/a100": GPU}, {}) != ()


FLAVOR_BAD = [
    ("flavor-unknown", "[{resource: gpus, flavor: l40s, nominal: 1}]", "", "has no flavor 'l40s'"),
    ("flavor-missing", "[{resource: gpus, nominal: 1}]", "", "quotas[0].flavor: Required value"),
    ("flavor-of-no-flavor", "[{resource: gpus, flavor: (none), nominal: 1}]", "",
     "has no flavor '(none)'"),
    ("flavor-on-an-unflavored-resource",
     "[{resource: mig-memory, flavor: h100, nominal: 1Gi}]", "", "has no flavors"),
    ("flavor-twice", "[{resource: gpus, flavor: h100, nominal: 1}, {resource: gpus, flavor: h100,"
     " nominal: 1}]", "", "duplicate quota for 'gpus/h100'"),
    ("when-can-borrow-unknown", "[{resource: gpus, flavor: h100, nominal: 1}]",
     ", flavorFungibility: {whenCanBorrow: Preempt}",
     "must be one of MayStopSearch, TryNextFlavor, Borrow"),
    ("when-can-preempt-unknown", "[{resource: gpus, flavor: h100, nominal: 1}]",
     ", flavorFungibility: {whenCanPreempt: Borrow}",
     "must be one of MayStopSearch, TryNextFlavor, Preempt"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("tenant_quotas", "fungibility", "message"),
    [pytest.param(*b[1:], id=b[0]) for b in FLAVOR_BAD],
)
def test_policy_refuses_bad_flavored_quotas(
    tenant_quotas: str, fungibility: str, message: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_policy(_flavored(tenant_quotas, fungibility))
    assert any(message in str(v) for v in caught.value.violations), caught.value.violations


def test_policy_refuses_an_unknown_flavor_in_a_resource() -> None:
    document = _flavored("[{resource: gpus, flavor: h100, nominal: 1}]")
    document["spec"]["quota"]["resources"][0]["flavors"] = ["h100", "b200"]
    with pytest.raises(InvalidArgument, match="unknown resource flavor 'b200'"):
        parse_policy(document)


def test_policy_declares_movable_classes() -> None:
    text = POLICY.replace(
        "  tenants:\n",
        "    priorityClasses:\n    - {name: batch, value: 10, movable: true}\n  tenants:\n",
        1,
    )
    quotas = parse_policy(yaml.safe_load(text)).quotas
    assert quotas.priority("batch").movable
    assert not quotas.priority("").movable  # the default is not movable
    with pytest.raises(InvalidArgument, match="movable"):
        parse_policy(yaml.safe_load(text.replace("movable: true", "movable: 3")))


# --- two quota resources, a cohort of 2-3 tenants, against the documented rule ----------------

# what one unit of each resource is in milli-units: a GPU, and 5Gi of MIG memory (bytes)
UNIT = {"gpus": GPU, "mig-memory": 5 * 2**30 * 1000}


def quantity(resource: str, units: int) -> int | str:
    """`units` of `resource` as the policy file writes it: 3 GPUs, 15Gi of memory."""
    return units if resource == "gpus" else f"{5 * units}Gi"


# tenant -> resource -> (nominal, borrowingLimit, lendingLimit) in units, None: unset; a
# resource a tenant does not list is never granted to it (docs/tenancy.md)
Spec = dict[str, dict[str, tuple[int, int | None, int | None]]]


@st.composite
def two_resource_cohorts(draw: Any) -> Spec:
    spec: Spec = {}
    for i in range(draw(st.integers(2, 3))):
        listed: dict[str, tuple[int, int | None, int | None]] = {}
        for resource in draw(st.sets(st.sampled_from(sorted(UNIT)))):
            nominal = draw(st.integers(0, 4))
            borrow = draw(st.none() | st.integers(0, 4))
            lend = draw(st.none() | st.integers(0, nominal))
            listed[resource] = (nominal, borrow, lend)
        spec[f"t{i}"] = listed
    return spec


def two_resource_policy(spec: Spec) -> QuotaModel:
    """The spec as a policy file's quota section, through the real parser."""
    tenants = []
    for name, listed in spec.items():
        quotas = []
        for resource, (nominal, borrow, lend) in listed.items():
            item: dict[str, Any] = {"resource": resource, "nominal": quantity(resource, nominal)}
            if borrow is not None:
                item["borrowingLimit"] = quantity(resource, borrow)
            if lend is not None:
                item["lendingLimit"] = quantity(resource, lend)
            quotas.append(item)
        tenants.append({"name": name, "cohort": "research", "quotas": quotas})
    document = yaml.safe_load(POLICY)
    document["spec"]["quota"]["resources"] = [
        {"name": "gpus", "deviceClassNames": ["gpu.nvidia.com"]},
        {"name": "mig-memory", "deviceClassNames": ["mig.nvidia.com"], "counter": "memory"},
    ]
    document["spec"]["tenants"] = tenants
    return parse_policy(document).quotas


def _limits(spec: Spec, tenant: str, resource: str) -> tuple[int, int | None, int]:
    """(nominal, nominal + borrowingLimit or None, what it lends at most) in units."""
    if resource not in spec[tenant]:
        return 0, 0, 0  # never granted: nominal 0, nothing to borrow, nothing lent
    nominal, borrow, lend = spec[tenant][resource]
    return nominal, None if borrow is None else nominal + borrow, nominal if lend is None else lend


def pool_holds(spec: Spec, resource: str, units: Mapping[str, int]) -> bool:
    """What the tenants hold above nominal fits in what the others leave unused of what they
    lend (`units`: tenant -> its usage of `resource`, in units)."""
    above = spare = 0
    for name in spec:
        nominal, _, lends = _limits(spec, name, resource)
        held = units.get(name, 0)
        above += max(0, held - nominal)
        spare += min(lends, max(0, nominal - held))
    return above <= spare


def cohort_feasible(spec: Spec, resource: str, units: Mapping[str, int]) -> bool:
    """docs/tenancy.md's equivalent statement of the rule: every tenant within nominal +
    borrowingLimit, and the pool holds."""
    for name in spec:
        _, ceiling, _ = _limits(spec, name, resource)
        if ceiling is not None and units.get(name, 0) > ceiling:
            return False
    return pool_holds(spec, resource, units)


def refused_by_rule(
    spec: Spec, tenant: str, asked: Mapping[str, int], units: Mapping[str, Mapping[str, int]]
) -> set[str]:
    """The resources the documented rule refuses `asked` on (units), from any usage, a shrunk
    policy's too: for each resource the grant adds to, the tenant stays within nominal +
    borrowingLimit, and either the pool still holds or the tenant stays within its guaranteed
    part (nominal - lendingLimit, never lent)."""
    refused = set()
    for resource, amount in asked.items():
        if amount <= 0:
            continue
        nominal, ceiling, lends = _limits(spec, tenant, resource)
        after = {name: units.get(name, {}).get(resource, 0) for name in spec}
        after[tenant] += amount
        within_ceiling = ceiling is None or after[tenant] <= ceiling
        guaranteed = after[tenant] <= nominal - lends
        if not (within_ceiling and (guaranteed or pool_holds(spec, resource, after))):
            refused.add(resource)
    return refused


def _milli(units: Mapping[str, int]) -> dict[str, int]:
    return {resource: count * UNIT[resource] for resource, count in units.items()}


grant_st = st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 3))
step_st = st.one_of(grant_st, st.integers(0, 20))  # a grant (who, GPUs, memory) or a release


# the borrowing limit of the second resource binds, the first fits: refused on memory only
@example(
    spec={
        "t0": {"gpus": (4, None, None), "mig-memory": (0, 1, None)},
        "t1": {"mig-memory": (4, None, None)},
    },
    steps=[(0, 1, 2), (0, 1, 1)],
)
# a lending limit on memory only; a tenant listing no gpus is refused them
@example(
    spec={
        "t0": {"gpus": (1, None, None)},
        "t1": {"gpus": (2, None, None), "mig-memory": (4, None, 1)},
    },
    steps=[(0, 3, 2), (0, 3, 1), (1, 1, 3), (1, 0, 1), 0, (1, 0, 1)],
)
@settings(max_examples=300)
@given(two_resource_cohorts(), st.lists(step_st, max_size=24))
def test_admit_with_two_resources_never_overruns_and_never_refuses_needlessly(
    spec: Spec, steps: list[tuple[int, int, int] | int]
) -> None:
    """Grants and releases from an empty ledger: each grant is admitted exactly when every
    resource's cohort stays feasible (no overrun, no needless refusal), and each refusal names
    exactly the resources that would overrun, with the tenant's usage and nominal."""
    quotas = two_resource_policy(spec)
    names = sorted(spec)
    granted: list[tuple[str, dict[str, int]]] = []
    units: dict[str, dict[str, int]] = {}
    for step in steps:
        if isinstance(step, int):
            if granted:
                name, asked = granted.pop(step % len(granted))
                for resource, count in asked.items():
                    units[name][resource] -= count
            continue
        who, gpus, memory = step
        name = names[who % len(names)]
        asked = {"gpus": gpus, "mig-memory": memory}
        after = {n: dict(u) for n, u in units.items()}
        mine = after.setdefault(name, {})
        for resource, count in asked.items():
            mine[resource] = mine.get(resource, 0) + count
        overrun = {
            r
            for r in UNIT
            if asked[r] > 0
            and not cohort_feasible(spec, r, {n: u.get(r, 0) for n, u in after.items()})
        }
        refusals = admit(quotas, name, _milli(asked), {n: _milli(u) for n, u in units.items()})
        assert {r.resource for r in refusals} == overrun, (name, asked, units)
        for refusal in refusals:
            used = units.get(name, {}).get(refusal.resource, 0) * UNIT[refusal.resource]
            nominal = _limits(spec, name, refusal.resource)[0] * UNIT[refusal.resource]
            assert (refusal.requested, refusal.used, refusal.nominal) == (
                asked[refusal.resource] * UNIT[refusal.resource],
                used,
                nominal,
            )
        if not refusals:
            units = after
            granted.append((name, asked))
        for resource in UNIT:  # the ledger never leaves a feasible state
            assert cohort_feasible(
                spec, resource, {n: u.get(resource, 0) for n, u in units.items()}
            )


# the pool overdrawn on memory by t0 (nominal cut to 1): t1 still gets its guaranteed 3
@example(
    spec={
        "t0": {"mig-memory": (1, None, None)},
        "t1": {"gpus": (2, 0, 2), "mig-memory": (4, 2, 1)},
    },
    held=[(0, 5), (2, 0), (0, 0)],
    grant=(1, 0, 3),
)
@settings(max_examples=300)
@given(
    two_resource_cohorts(),
    st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), min_size=3, max_size=3),
    grant_st,
)
def test_admit_and_left_with_two_resources_follow_the_rule_after_a_shrink(
    spec: Spec, held: list[tuple[int, int]], grant: tuple[int, int, int]
) -> None:
    """Any usage, over quota too (what a policy that shrank leaves): admit refuses exactly the
    resources the documented rule refuses, and QuotaStatus's `left` is the largest grant of
    each resource alone that the rule admits."""
    quotas = two_resource_policy(spec)
    names = sorted(spec)
    units = {n: {"gpus": held[i][0], "mig-memory": held[i][1]} for i, n in enumerate(names)}
    usage = {n: _milli(u) for n, u in units.items()}
    who, gpus, memory = grant
    name = names[who % len(names)]
    asked = {"gpus": gpus, "mig-memory": memory}
    refusals = admit(quotas, name, _milli(asked), usage)
    assert {r.resource for r in refusals} == refused_by_rule(spec, name, asked, units)
    for row in tenant_status(quotas, usage):
        largest = max(
            k
            for k in range(40)
            if k == 0 or not refused_by_rule(spec, row.tenant, {row.resource: k}, units)
        )
        assert row.left == largest * UNIT[row.resource], (row.tenant, row.resource)
