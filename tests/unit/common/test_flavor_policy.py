"""The policy's resource flavors and flavor fungibility (services/common/security/policy.py):
Kueue's ResourceFlavor fields (nodeLabels, nodeTaints, tolerations) and gpualloc's device
selection (deviceClassNames, CEL selectors), a tenant's flavorFungibility with Kueue's values,
older names, defaults and its preference rule, and a tenant's tolerations. Every bad value is
refused naming its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from services.allocator.app.quotas import check_flavor_selectors
from services.allocator.core import SelectorCache
from services.common.dra.model import (
    DeviceTaint,
    DeviceToleration,
    TaintEffect,
    TolerationOperator,
)
from services.common.errors import InvalidArgument
from services.common.quota.model import (
    FlavorFungibility,
    FlavorPreference,
    QuotaModel,
    ResourceFlavor,
    WhenCanBorrow,
    WhenCanPreempt,
)
from services.common.security.policy import parse_policy

FLAVORS = """
- name: hopper
  nodeLabels: {nvidia.com/gpu.family: hopper}
  nodeTaints:
  - {key: reserved, value: ml, effect: NoSchedule}
  - {key: spot, effect: PreferNoSchedule}
  tolerations:
  - {key: nvidia.com/gpu, operator: Exists, effect: NoExecute}
  - {key: maintenance, value: soon}
- name: mig
  deviceClassNames: [mig.nvidia.com]
  selectors: [{cel: {expression: 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'}}]
"""


def document(
    flavors: str = FLAVORS,
    flavor_names: str = "[hopper, mig]",
    tenant: str = "{name: ml, quotas: [{resource: gpus, flavor: hopper, nominal: 4}]}",
) -> dict[str, Any]:
    resources = (
        "[{name: gpus, deviceClassNames: [gpu.nvidia.com, mig.nvidia.com], "
        f"flavors: {flavor_names}}}]"
    )
    return {
        "apiVersion": "gpualloc.dev/v1alpha1",
        "kind": "AccessPolicy",
        "metadata": {"name": "flavors"},
        "spec": {
            "quota": {
                "resourceFlavors": yaml.safe_load(flavors),
                "resources": yaml.safe_load(resources),
            },
            "tenants": [yaml.safe_load(tenant)],
        },
    }


def test_policy_declares_resource_flavors_as_kueue_and_by_device() -> None:
    quotas = parse_policy(document()).quotas
    hopper, mig = (r.spec for r in quotas.flavors_of("gpus"))
    assert hopper == ResourceFlavor(
        "hopper",
        (("nvidia.com/gpu.family", "hopper"),),
        (DeviceTaint("reserved", TaintEffect.NO_SCHEDULE, "ml"),),  # PreferNoSchedule dropped
        (
            DeviceToleration(
                "nvidia.com/gpu", TolerationOperator.EXISTS, "", TaintEffect.NO_EXECUTE
            ),
            DeviceToleration("maintenance", TolerationOperator.EQUAL, "soon", None),
        ),
    )
    assert mig is not None and mig.device_classes == ("mig.nvidia.com",) and mig.by_device
    assert mig.selectors == ('device.attributes["gpu.nvidia.com"].profile == "1g.10gb"',)


# (id, tenant's flavorFungibility, what it is)
FUNGIBILITY = [
    ("kueues-defaults", "{}", FlavorFungibility()),
    ("when-can-borrow-try-next-flavor", "{whenCanBorrow: TryNextFlavor}",
     FlavorFungibility(WhenCanBorrow.TRY_NEXT_FLAVOR)),
    ("when-can-borrow-older-name-borrow", "{whenCanBorrow: Borrow}",
     FlavorFungibility(WhenCanBorrow.MAY_STOP_SEARCH)),
    ("when-can-preempt-may-stop-search", "{whenCanPreempt: MayStopSearch}",
     FlavorFungibility(when_can_preempt=WhenCanPreempt.MAY_STOP_SEARCH)),
    ("when-can-preempt-older-name-preempt", "{whenCanPreempt: Preempt}",
     FlavorFungibility(when_can_preempt=WhenCanPreempt.MAY_STOP_SEARCH)),
    ("preference-with-both-try-next-flavor",
     "{whenCanBorrow: TryNextFlavor, whenCanPreempt: TryNextFlavor, "
     "preference: PreemptionOverBorrowing}",
     FlavorFungibility(WhenCanBorrow.TRY_NEXT_FLAVOR, WhenCanPreempt.TRY_NEXT_FLAVOR,
                       FlavorPreference.PREEMPTION_OVER_BORROWING)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("given", "expected"), [pytest.param(*case[1:], id=case[0]) for case in FUNGIBILITY]
)
def test_policy_declares_a_tenants_flavor_fungibility(
    given: str, expected: FlavorFungibility
) -> None:
    tenant = (
        "{name: ml, quotas: [{resource: gpus, flavor: hopper, nominal: 4}], "
        f"flavorFungibility: {given}, tolerations: [{{key: reserved, operator: Exists}}]}}"
    )
    quota = parse_policy(document(tenant=tenant)).quotas.quota_of("ml")
    assert quota is not None and quota.fungibility == expected
    assert quota.tolerations == (DeviceToleration("reserved", TolerationOperator.EXISTS),)


FLAVORED = "[{resource: gpus, flavor: hopper, nominal: 4}]"

# (id, the flavors, the resource's flavors, the tenant, the error's field and text)
BAD = [
    ("taint-without-effect", "[{name: hopper, nodeTaints: [{key: a}]}]", "[hopper]", None,
     "resourceFlavors[0].nodeTaints[0].effect: must be one of NoSchedule, PreferNoSchedule"),
    ("taint-of-an-unknown-effect", "[{name: hopper, nodeTaints: [{key: a, effect: Evict}]}]",
     "[hopper]", None, "nodeTaints[0].effect: must be one of"),
    ("taint-without-key", "[{name: hopper, nodeTaints: [{effect: NoSchedule}]}]", "[hopper]",
     None, "nodeTaints[0].key: Required value"),
    ("taint-key-not-a-qualified-name",
     "[{name: hopper, nodeTaints: [{key: 'a b', effect: NoSchedule}]}]", "[hopper]", None,
     "nodeTaints[0].key: 'a b'"),
    ("taint-twice", "[{name: hopper, nodeTaints: [{key: a, effect: NoSchedule}, "
     "{key: a, value: b, effect: NoSchedule}]}]", "[hopper]", None,
     "nodeTaints[1]: duplicate taint 'a' with effect NoSchedule"),
    ("more-than-eight-taints",
     "[{name: hopper, nodeTaints: [" + ", ".join(
         f"{{key: k{i}, effect: NoSchedule}}" for i in range(9)) + "]}]",
     "[hopper]", None, "nodeTaints: must have at most 8 items, got 9"),
    ("taint-unknown-field",
     "[{name: hopper, nodeTaints: [{key: a, effect: NoSchedule, timeAdded: x}]}]", "[hopper]",
     None, "nodeTaints[0].timeAdded: unknown field"),
    ("toleration-exists-with-a-value",
     "[{name: hopper, tolerations: [{key: a, operator: Exists, value: b}]}]", "[hopper]", None,
     "tolerations[0].value: must be empty when operator is Exists"),
    ("toleration-without-key-must-be-exists", "[{name: hopper, tolerations: [{value: b}]}]",
     "[hopper]", None, "tolerations[0].operator: must be Exists when key is empty"),
    ("toleration-unknown-operator", "[{name: hopper, tolerations: [{key: a, operator: In}]}]",
     "[hopper]", None, "tolerations[0].operator: must be one of Exists, Equal"),
    ("toleration-unknown-effect", "[{name: hopper, tolerations: [{key: a, effect: Evict}]}]",
     "[hopper]", None, "tolerations[0].effect: must be one of"),
    ("selector-without-expression", "[{name: hopper, selectors: [{cel: {}}]}]", "[hopper]",
     None, "selectors[0].cel.expression: Required value"),
    ("selector-not-cel", "[{name: hopper, selectors: [{match: x}]}]", "[hopper]", None,
     "selectors[0].match: unknown field"),
    ("device-classes-selecting-none-of-the-resources",
     "[{name: hopper, deviceClassNames: [nic.example.com]}]", "[hopper]", None,
     "flavors[0]: resource flavor 'hopper' selects none of the resource's device classes"),
    ("a-flavor-twice-on-a-resource", "[{name: hopper}]", "[hopper, hopper]", None,
     "flavors[1]: resource flavor 'hopper' twice"),
    ("topology-name-is-not-supported", "[{name: hopper, topologyName: t}]", "[hopper]", None,
     "resourceFlavors[0].topologyName: unknown field"),
    ("preference-without-both-try-next-flavor", "[{name: hopper}]", "[hopper]",
     "{name: ml, quotas: " + FLAVORED + ", flavorFungibility: {preference: "
     "PreemptionOverBorrowing}}",
     "flavorFungibility.preference: preference can only be set when both whenCanBorrow and "
     "whenCanPreempt are TryNextFlavor"),
    ("preference-unknown", "[{name: hopper}]", "[hopper]",
     "{name: ml, quotas: " + FLAVORED + ", flavorFungibility: {preference: Cheapest}}",
     "flavorFungibility.preference: must be one of BorrowingOverPreemption"),
    ("fungibility-unknown-field", "[{name: hopper}]", "[hopper]",
     "{name: ml, quotas: " + FLAVORED + ", flavorFungibility: {whenCanWait: x}}",
     "flavorFungibility.whenCanWait: unknown field"),
    ("tenant-tolerations-without-quotas", "[{name: hopper}]", "[hopper]",
     "{name: ml, tolerations: [{key: a, operator: Exists}]}",
     "tenants[0].tolerations: a tenant without quotas has no flavors"),
    ("tenant-toleration-bad", "[{name: hopper}]", "[hopper]",
     "{name: ml, quotas: " + FLAVORED + ", tolerations: [{key: a, operator: Exists, value: b}]}",
     "tenants[0].tolerations[0].value: must be empty when operator is Exists"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("flavors", "names", "tenant", "message"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD],
)
def test_policy_refuses_bad_resource_flavors(
    flavors: str, names: str, tenant: str | None, message: str
) -> None:
    given = document(flavors, names, tenant) if tenant else document(flavors, names)
    with pytest.raises(InvalidArgument, match="spec\\.") as refused:
        parse_policy(given)
    assert message in str(refused.value)


def test_a_flavor_selector_that_does_not_compile_keeps_the_policy_from_loading() -> None:
    """The allocator compiles every flavor's CEL where it loads the policy (bootstrap's
    loader): an error names the flavor and the selector, and the last good quotas stay."""
    bad = document(
        "[{name: hopper, selectors: [{cel: {expression: 'device.attributes['}}]}]", "[hopper]"
    )
    quotas: QuotaModel = parse_policy(bad).quotas
    with pytest.raises(InvalidArgument) as refused:
        check_flavor_selectors(quotas, SelectorCache())
    assert refused.value.field_path == (
        "spec.quota.resourceFlavors[hopper].selectors[0].cel.expression"
    )
    good = parse_policy(document()).quotas
    assert check_flavor_selectors(good, SelectorCache()) is good


def test_the_resource_flavors_example_of_the_docs_loads() -> None:
    """docs/tenancy.md's "Resource flavors" example, as written, is a valid quota section."""
    text = (Path(__file__).parents[3] / "docs" / "tenancy.md").read_text()
    section = text[text.index("## Resource flavors") :]
    example = section[section.index("```yaml\n") + 8 : section.index("```\n", 8)]
    parsed = yaml.safe_load(example)
    document = {
        "apiVersion": "gpualloc.dev/v1alpha1",
        "kind": "AccessPolicy",
        "metadata": {"name": "docs"},
        "spec": {"quota": parsed["quota"], "tenants": parsed["tenants"]},
    }
    quotas = parse_policy(document).quotas
    hpc = quotas.quota_of("hpc")
    assert hpc is not None and [r.flavor for r in quotas.flavor_order("hpc", "gpus")] == [
        "hopper",
        "ada",
    ]
    assert hpc.tolerations == (DeviceToleration("reserved", TolerationOperator.EXISTS),)
    flavors = {r.flavor: r.spec for r in quotas.flavors_of("gpus")}
    assert flavors["ampere"] is not None and flavors["ampere"].node_taints


CHARGED = """
- {name: gpu-flavor}
- {name: hopper, nodeLabels: {nvidia.com/gpu.family: hopper}}
- {name: ada, nodeLabels: {nvidia.com/gpu.family: ada-lovelace}}
"""

# (id, the tenant's flavors in its order (None: a tenant without quotas), the charge order)
CHARGE_ORDER = [
    ("the-tenants-own-flavor-before-another-tenants-label-less-one",
     ["hopper"], ["hopper", "gpu-flavor", "ada"]),
    ("the-tenants-own-flavors-in-its-order-not-the-resources",
     ["ada", "hopper"], ["ada", "hopper", "gpu-flavor"]),
    ("listed-as-the-resource-lists-them-the-resources-order",
     ["gpu-flavor", "hopper", "ada"], ["gpu-flavor", "hopper", "ada"]),
    ("a-tenant-without-quotas-the-resources-order",
     None, ["gpu-flavor", "hopper", "ada"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("listed", "expected"), [pytest.param(*case[1:], id=case[0]) for case in CHARGE_ORDER]
)
def test_a_device_is_charged_in_its_tenants_own_flavor_order(
    listed: list[str] | None, expected: list[str]
) -> None:
    """The order in which a device a tenant holds is charged to a flavor (the first that
    selects it): the tenant's own flavors in its order, then the resource's others (whose
    devices it is then refused, naming the flavor)."""
    quotas = ", ".join(f"{{resource: gpus, flavor: {f}, nominal: 1}}" for f in listed or [])
    tenant = f"{{name: ml, quotas: [{quotas}]}}" if listed is not None else "{name: ml}"
    model = parse_policy(document(CHARGED, "[gpu-flavor, hopper, ada]", tenant)).quotas
    assert [r.flavor for r in model.charge_order("ml", "gpus")] == expected
