"""Kueue's objects as the access policy's quota section (services/common/security/kueue_quota.py).

Each mapping row gives Kueue objects and the native quota section they stand for, and asserts
the two parse to the same QuotaModel. Each validation row breaks one field rule of Kueue's CRDs
and webhooks (v0.17, pkg/webhooks/*_webhook.go and the apis' validation markers), or one field
gpualloc refuses, and asserts the error by type, object and field path.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.allocator.app.quotas import check_flavor_selectors
from services.cel import SelectorCache
from services.common.errors import FieldViolation, InvalidArgument
from services.common.security import kueue_quota
from services.common.security.kueue_quota import FieldError, KueueViolation
from services.common.security.policy import AccessPolicy, parse_policy
from services.common.security.policy_files import load_policy
from services.common.security.tls import WatchedFiles

V2 = "kueue.x-k8s.io/v1beta2"
V1 = "kueue.x-k8s.io/v1beta1"

DEFAULT_FLAVOR = f"""
apiVersion: {V2}
kind: ResourceFlavor
metadata: {{name: default-flavor}}
"""
GPU_QUEUE = f"""
apiVersion: {V2}
kind: ClusterQueue
metadata: {{name: team-a}}
spec:
  resourceGroups:
  - coveredResources: [nvidia.com/gpu]
    flavors:
    - name: default-flavor
      resources: [{{name: nvidia.com/gpu, nominalQuota: 4}}]
"""
KUEUE_DEFAULTS = """
    preemption:
      withinClusterQueue: Never
      reclaimWithinCohort: Never
      borrowWithinCohort: {policy: Never}
    flavorFungibility: {whenCanBorrow: MayStopSearch, whenCanPreempt: TryNextFlavor}
"""
NATIVE_GPU = """
    resources:
    - {name: nvidia.com/gpu, deviceClassNames: [gpu.nvidia.com], flavors: [default-flavor]}
    resourceFlavors: [{name: default-flavor, nodeLabels: {}}]
"""


def policy_of(spec: dict[str, Any], files: dict[str, str] | None = None) -> AccessPolicy:
    document = {
        "apiVersion": "gpualloc.dev/v1alpha1",
        "kind": "AccessPolicy",
        "metadata": {"name": "site"},
        "spec": {"bindings": [], **spec},
    }
    read = {
        name: [(f"{name}[{i}]", d) for i, d in enumerate(yaml.safe_load_all(text))]
        for name, text in (files or {}).items()
    }
    return parse_policy(document, "policy.yaml", read)


def kueue(objects: str, tenants: str = "[]", **section: Any) -> AccessPolicy:
    """A policy whose quota section is `objects` (one file, site.yaml)."""
    spec = {"quota": {"kueue": {"files": ["site.yaml"], **section}}}
    return policy_of({**spec, "tenants": yaml.safe_load(tenants)}, {"site.yaml": objects})


def native(quota: str, tenants: str) -> AccessPolicy:
    return policy_of({"quota": yaml.safe_load(quota), "tenants": yaml.safe_load(tenants)})


def documents(*parts: str) -> str:
    return "\n---\n".join(parts)


# --- the mapping ----------------------------------------------------------------------------

# (id, Kueue objects, spec.quota.kueue's other fields, the native quota section, native tenants)
MAPPING = [
    (
        "cluster-queue-is-a-tenant-with-kueues-defaults-written-out",
        documents(DEFAULT_FLAVOR, GPU_QUEUE),
        {},
        NATIVE_GPU,
        f"""
  - name: team-a
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS}""",
    ),
    (
        "cohort-name-and-limits",
        documents(
            DEFAULT_FLAVOR,
            GPU_QUEUE.replace("spec:", "spec:\n  cohortName: research").replace(
                "nominalQuota: 4", "nominalQuota: 4, borrowingLimit: 2, lendingLimit: 1"
            ),
        ),
        {},
        NATIVE_GPU,
        f"""
  - name: team-a
    cohort: research
    quotas:
    - {{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4, borrowingLimit: 2,
       lendingLimit: 1}}
{KUEUE_DEFAULTS}""",
    ),
    (
        "v1beta1-cohort-is-the-cohort",
        documents(
            DEFAULT_FLAVOR, GPU_QUEUE.replace(V2, V1).replace("spec:", "spec:\n  cohort: research")
        ),
        {},
        NATIVE_GPU,
        f"""
  - name: team-a
    cohort: research
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS}""",
    ),
    (
        "covered-resources-times-flavors-are-quotas-in-the-queues-order",
        documents(
            f"""
apiVersion: {V2}
kind: ResourceFlavor
metadata: {{name: hopper}}
spec: {{nodeLabels: {{nvidia.com/gpu.family: hopper}}}}
---
apiVersion: {V2}
kind: ResourceFlavor
metadata: {{name: ada}}
spec: {{nodeLabels: {{nvidia.com/gpu.family: ada-lovelace, pool: shared}}}}
---
apiVersion: {V2}
kind: ClusterQueue
metadata: {{name: hpc}}
spec:
  resourceGroups:
  - coveredResources: [nvidia.com/gpu, example.com/gpus]
    flavors:
    - name: ada
      resources:
      - {{name: nvidia.com/gpu, nominalQuota: 3}}
      - {{name: example.com/gpus, nominalQuota: 1}}
    - name: hopper
      resources:
      - {{name: nvidia.com/gpu, nominalQuota: 2}}
      - {{name: example.com/gpus, nominalQuota: 0}}
---
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
resources:
  deviceClassMappings: [{{name: example.com/gpus, deviceClassNames: [gpu.nvidia.com]}}]
""",
        ),
        {},
        """
    resources:
    - {name: nvidia.com/gpu, deviceClassNames: [gpu.nvidia.com], flavors: [ada, hopper]}
    - {name: example.com/gpus, deviceClassNames: [gpu.nvidia.com], flavors: [ada, hopper]}
    resourceFlavors:
    - {name: hopper, nodeLabels: {nvidia.com/gpu.family: hopper}}
    - {name: ada, nodeLabels: {nvidia.com/gpu.family: ada-lovelace, pool: shared}}
""",
        f"""
  - name: hpc
    quotas:
    - {{resource: nvidia.com/gpu, flavor: ada, nominal: 3}}
    - {{resource: example.com/gpus, flavor: ada, nominal: 1}}
    - {{resource: nvidia.com/gpu, flavor: hopper, nominal: 2}}
    - {{resource: example.com/gpus, flavor: hopper, nominal: 0}}
{KUEUE_DEFAULTS}""",
    ),
    (
        "preemption-and-fungibility-are-the-tenants",
        documents(
            DEFAULT_FLAVOR,
            GPU_QUEUE.replace(
                "spec:",
                """spec:
  cohortName: research
  preemption:
    withinClusterQueue: LowerOrNewerEqualPriority
    reclaimWithinCohort: Any
    borrowWithinCohort: {policy: LowerPriority, maxPriorityThreshold: 100}
  flavorFungibility: {whenCanBorrow: TryNextFlavor, whenCanPreempt: TryNextFlavor}""",
            ),
        ),
        {},
        NATIVE_GPU,
        """
  - name: team-a
    cohort: research
    quotas: [{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}]
    preemption:
      withinClusterQueue: LowerOrNewerEqualPriority
      reclaimWithinCohort: Any
      borrowWithinCohort: {policy: LowerPriority, maxPriorityThreshold: 100}
    flavorFungibility: {whenCanBorrow: TryNextFlavor}
""",
    ),
    (
        "one-preemption-knob-the-others-kueues-never",
        documents(
            DEFAULT_FLAVOR,
            GPU_QUEUE.replace("spec:", "spec:\n  preemption: {withinClusterQueue: LowerPriority}"),
        ),
        {},
        NATIVE_GPU,
        f"""
  - name: team-a
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS.replace("withinClusterQueue: Never", "withinClusterQueue: LowerPriority")}""",
    ),
    (
        "a-threshold-with-policy-never-has-no-effect-as-in-kueue",
        documents(
            DEFAULT_FLAVOR,
            GPU_QUEUE.replace(
                "spec:", "spec:\n  preemption: {borrowWithinCohort: {maxPriorityThreshold: 5}}"
            ),
        ),
        {},
        NATIVE_GPU,
        f"""
  - name: team-a
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS}""",
    ),
    (
        "v1beta1s-borrow-is-may-stop-search",
        documents(
            DEFAULT_FLAVOR,
            GPU_QUEUE.replace(V2, V1).replace(
                "spec:", "spec:\n  flavorFungibility: {whenCanBorrow: Borrow}"
            ),
        ),
        {},
        NATIVE_GPU,
        f"""
  - name: team-a
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS}""",
    ),
    (
        "workload-priority-classes-and-priority-classes",
        documents(
            f"""
apiVersion: {V2}
kind: WorkloadPriorityClass
metadata: {{name: sample-priority}}
value: 10000
description: "Sample priority"
---
apiVersion: {V1}
kind: WorkloadPriorityClass
metadata: {{name: low}}
value: -5
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {{name: standard}}
value: 100
globalDefault: true
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {{name: polite}}
value: 1000
preemptionPolicy: Never
""",
            DEFAULT_FLAVOR,
            GPU_QUEUE,
        ),
        {},
        NATIVE_GPU
        + """
    priorityClasses:
    - {name: sample-priority, value: 10000}
    - {name: low, value: -5}
    - {name: standard, value: 100, globalDefault: true}
    - {name: polite, value: 1000, preemptionPolicy: Never}
""",
        f"""
  - name: team-a
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS}""",
    ),
    (
        "spec-quota-kueue-resources-say-how-a-name-counts",
        documents(
            DEFAULT_FLAVOR,
            GPU_QUEUE.replace("[nvidia.com/gpu]", "[nvidia.com/gpu, example.com/mig-memory]")
            .replace(
                "resources: [{name: nvidia.com/gpu, nominalQuota: 4}]",
                "resources: [{name: nvidia.com/gpu, nominalQuota: 4}, "
                "{name: example.com/mig-memory, nominalQuota: 40Gi}]",
            )
            .replace("nominalQuota: 4}", "nominalQuota: 4}"),
        ),
        {
            "resources": [
                {
                    "name": "nvidia.com/gpu",
                    "deviceClassNames": ["gpu.nvidia.com", "mig.nvidia.com"],
                    "gpuShare": True,
                },
                {
                    "name": "example.com/mig-memory",
                    "deviceClassNames": ["mig.nvidia.com"],
                    "counter": "memory",
                },
            ]
        },
        """
    resources:
    - {name: nvidia.com/gpu, deviceClassNames: [gpu.nvidia.com, mig.nvidia.com], gpuShare: true,
       flavors: [default-flavor]}
    - {name: example.com/mig-memory, deviceClassNames: [mig.nvidia.com], counter: memory,
       flavors: [default-flavor]}
    resourceFlavors: [{name: default-flavor, nodeLabels: {}}]
""",
        f"""
  - name: team-a
    quotas:
    - {{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}
    - {{resource: example.com/mig-memory, flavor: default-flavor, nominal: 40Gi}}
{KUEUE_DEFAULTS}""",
    ),
    (
        "cpu-memory-and-listed-resources-are-not-enforced",
        documents(
            DEFAULT_FLAVOR,
            GPU_QUEUE.replace(
                "[nvidia.com/gpu]", "[cpu, memory, nvidia.com/gpu, rdma/hca]"
            ).replace(
                "resources: [{name: nvidia.com/gpu, nominalQuota: 4}]",
                "resources: [{name: cpu, nominalQuota: 64}, {name: memory, nominalQuota: 512Gi}, "
                "{name: nvidia.com/gpu, nominalQuota: 4}, {name: rdma/hca, nominalQuota: 8}]",
            ),
        ),
        {"notEnforced": ["rdma/hca"]},
        NATIVE_GPU,
        f"""
  - name: team-a
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS}""",
    ),
    (
        "kueues-own-fields-stay-with-kueue",
        documents(
            DEFAULT_FLAVOR,
            GPU_QUEUE.replace(
                "spec:",
                """spec:
  namespaceSelector: {matchExpressions: [{key: team, operator: In, values: [a]}]}
  queueingStrategy: StrictFIFO
  stopPolicy: None
  admissionScope: {admissionMode: UsageBasedAdmissionFairSharing}
  admissionChecksStrategy:
    admissionChecks: [{name: gpualloc, onFlavors: [default-flavor]}]""",
            ),
            f"""
apiVersion: {V2}
kind: LocalQueue
metadata: {{namespace: team-a, name: gpu-queue}}
spec: {{clusterQueue: team-a}}
---
apiVersion: {V2}
kind: AdmissionCheck
metadata: {{name: gpualloc}}
spec: {{controllerName: gpualloc.dev/admission}}
""",
        ),
        {},
        NATIVE_GPU,
        f"""
  - name: team-a
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS}""",
    ),
    (
        "a-list-and-a-configmap-of-kueues-configuration-are-read",
        f"""
apiVersion: v1
kind: List
items:
- {{apiVersion: {V2}, kind: ResourceFlavor, metadata: {{name: default-flavor}}}}
- apiVersion: {V2}
  kind: ClusterQueue
  metadata: {{name: team-a}}
  spec:
    resourceGroups:
    - coveredResources: [example.com/gpus]
      flavors: [{{name: default-flavor, resources: [{{name: example.com/gpus, nominalQuota: 4}}]}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: kueue-manager-config, namespace: kueue-system}}
data:
  controller_manager_config.yaml: |
    apiVersion: config.kueue.x-k8s.io/v1beta1
    kind: Configuration
    namespace: kueue-system
    manageJobsWithoutQueueName: false
    fairSharing: {{enable: false}}
    resources:
      deviceClassMappings: [{{name: example.com/gpus, deviceClassNames: [gpu.nvidia.com]}}]
""",
        {},
        NATIVE_GPU.replace("nvidia.com/gpu", "example.com/gpus"),
        f"""
  - name: team-a
    quotas: [{{resource: example.com/gpus, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS}""",
    ),
    (
        "cohorts-with-a-parent-quotas-and-weights",
        documents(
            DEFAULT_FLAVOR,
            f"""
apiVersion: {V2}
kind: Cohort
metadata: {{name: org}}
spec:
  fairSharing: {{weight: 2}}
  resourceGroups:
  - coveredResources: [nvidia.com/gpu]
    flavors: [{{name: default-flavor, resources: [{{name: nvidia.com/gpu, nominalQuota: 8}}]}}]
---
apiVersion: {V1}
kind: Cohort
metadata: {{name: research}}
spec:
  parentName: org
  resourceGroups:
  - coveredResources: [cpu, nvidia.com/gpu]
    flavors:
    - name: default-flavor
      resources:
      - {{name: cpu, nominalQuota: 10}}
      - {{name: nvidia.com/gpu, nominalQuota: 2, borrowingLimit: 4, lendingLimit: 10}}
""",
            GPU_QUEUE.replace(
                "spec:", "spec:\n  cohortName: research\n  fairSharing: {weight: 500m}"
            ),
        ),
        {},
        NATIVE_GPU
        + """
    cohorts:
    - name: org
      quotas: [{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 8}]
      fairSharing: {weight: 2}
    - name: research
      parent: org
      quotas:
      - {resource: nvidia.com/gpu, flavor: default-flavor, nominal: 2, borrowingLimit: 4,
         lendingLimit: 10}
""",
        f"""
  - name: team-a
    cohort: research
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
    fairSharing: {{weight: 500m}}
{KUEUE_DEFAULTS}""",
    ),
    (
        "a-parent-no-object-declares-is-kueues-default-cohort",
        documents(
            DEFAULT_FLAVOR,
            f"{{apiVersion: {V2}, kind: Cohort, metadata: {{name: research}}, "
            "spec: {parentName: org}}",
            GPU_QUEUE.replace("spec:", "spec:\n  cohortName: research"),
        ),
        {},
        NATIVE_GPU + "    cohorts: [{name: research, parent: org}, {name: org}]\n",
        f"""
  - name: team-a
    cohort: research
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS}""",
    ),
    (
        "v1beta1s-fair-sharing-not-enabled-is-off",
        documents(
            DEFAULT_FLAVOR,
            GPU_QUEUE,
            "apiVersion: config.kueue.x-k8s.io/v1beta1\nkind: Configuration\n"
            "fairSharing: {enable: false}",
        ),
        {},
        NATIVE_GPU,
        f"""
  - name: team-a
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS}""",
    ),
    (
        "the-configurations-fair-sharing",
        documents(
            DEFAULT_FLAVOR,
            GPU_QUEUE,
            "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"
            "fairSharing: {preemptionStrategies: [LessThanInitialShare]}\n"
            "admissionFairSharing:\n  usageHalfLifeTime: 168h\n  usageSamplingInterval: 0s\n"
            "  resourceWeights: {nvidia.com/gpu: 2, cpu: 1}",
        ),
        {},
        NATIVE_GPU
        + """
    fairSharing: {enabled: true, preemptionStrategies: [LessThanInitialShare]}
    admissionFairSharing:
      usageHalfLifeTime: 168h
      usageSamplingInterval: 5m
      resourceWeights: {nvidia.com/gpu: 2}
""",
        f"""
  - name: team-a
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS}""",
    ),
    (
        "v1beta1s-enabled-fair-sharing-takes-both-strategies",
        documents(
            DEFAULT_FLAVOR,
            GPU_QUEUE,
            "apiVersion: config.kueue.x-k8s.io/v1beta1\nkind: Configuration\n"
            "fairSharing: {enable: true}",
        ),
        {},
        NATIVE_GPU
        + """
    fairSharing:
      enabled: true
      preemptionStrategies: [LessThanOrEqualToFinalShare, LessThanInitialShare]
""",
        f"""
  - name: team-a
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS}""",
    ),
    (
        "a-flavors-taints-and-tolerations",
        documents(
            f"""
apiVersion: {V2}
kind: ResourceFlavor
metadata: {{name: default-flavor}}
spec:
  nodeLabels: {{pool: spot}}
  nodeTaints:
  - {{key: spot, value: "true", effect: NoSchedule, timeAdded: "2026-01-01T00:00:00Z"}}
  - {{key: maintenance, effect: PreferNoSchedule}}
  tolerations:
  - {{key: spot, operator: Exists, effect: NoExecute, tolerationSeconds: 300}}
  - {{operator: Exists}}
""",
            GPU_QUEUE,
        ),
        {},
        """
    resources:
    - {name: nvidia.com/gpu, deviceClassNames: [gpu.nvidia.com], flavors: [default-flavor]}
    resourceFlavors:
    - name: default-flavor
      nodeLabels: {pool: spot}
      nodeTaints:
      - {key: spot, value: "true", effect: NoSchedule}
      - {key: maintenance, effect: PreferNoSchedule}
      tolerations:
      - {key: spot, operator: Exists, effect: NoExecute}
      - {operator: Exists}
""",
        f"""
  - name: team-a
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS}""",
    ),
    (
        "when-can-preempt-and-preference",
        documents(
            DEFAULT_FLAVOR,
            GPU_QUEUE.replace(
                "spec:",
                "spec:\n  flavorFungibility: {whenCanBorrow: TryNextFlavor, "
                "whenCanPreempt: TryNextFlavor, preference: PreemptionOverBorrowing}",
            ),
        ),
        {},
        NATIVE_GPU,
        """
  - name: team-a
    quotas: [{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}]
    preemption:
      withinClusterQueue: Never
      reclaimWithinCohort: Never
      borrowWithinCohort: {policy: Never}
    flavorFungibility:
      whenCanBorrow: TryNextFlavor
      whenCanPreempt: TryNextFlavor
      preference: PreemptionOverBorrowing
""",
    ),
    (
        "v1beta1s-preempt-is-may-stop-search",
        documents(
            DEFAULT_FLAVOR,
            GPU_QUEUE.replace(V2, V1).replace(
                "spec:", "spec:\n  flavorFungibility: {whenCanPreempt: Preempt}"
            ),
        ),
        {},
        NATIVE_GPU,
        f"""
  - name: team-a
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS.replace("whenCanPreempt: TryNextFlavor", "whenCanPreempt: MayStopSearch")}""",
    ),
    (
        "a-mig-profile-counts-the-mig-devices-of-that-profile",
        documents(
            DEFAULT_FLAVOR,
            GPU_QUEUE.replace(
                "[nvidia.com/gpu]", "[nvidia.com/gpu, nvidia.com/mig-1g.10gb]"
            ).replace(
                "resources: [{name: nvidia.com/gpu, nominalQuota: 4}]",
                "resources: [{name: nvidia.com/gpu, nominalQuota: 4}, "
                "{name: nvidia.com/mig-1g.10gb, nominalQuota: 16}]",
            ),
        ),
        {},
        """
    resources:
    - {name: nvidia.com/gpu, deviceClassNames: [gpu.nvidia.com], flavors: [default-flavor]}
    - name: nvidia.com/mig-1g.10gb
      deviceClassNames: [mig.nvidia.com]
      selectors:
      - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}
      flavors: [default-flavor]
    resourceFlavors: [{name: default-flavor, nodeLabels: {}}]
""",
        f"""
  - name: team-a
    quotas:
    - {{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}
    - {{resource: nvidia.com/mig-1g.10gb, flavor: default-flavor, nominal: 16}}
{KUEUE_DEFAULTS}""",
    ),
    (
        "a-queue-without-resource-groups-is-granted-nothing",
        documents(
            DEFAULT_FLAVOR,
            GPU_QUEUE,
            f"{{apiVersion: {V2}, kind: ClusterQueue, metadata: {{name: frozen}}, spec: {{}}}}",
        ),
        {},
        NATIVE_GPU,
        f"""
  - name: team-a
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS}
  - name: frozen
    quotas: []
{KUEUE_DEFAULTS}""",
    ),
]


@pytest.mark.parametrize(
    ("objects", "section", "quota", "tenants"),
    [pytest.param(*case[1:], id=case[0]) for case in MAPPING],
)
def test_kueue_objects_are_the_native_quota_section(
    objects: str, section: dict[str, Any], quota: str, tenants: str
) -> None:
    assert kueue(objects, **section).quotas == translated(quota, tenants).quotas


def translated(quota: str, tenants: str) -> AccessPolicy:
    """The native form the translation writes: `quota` with `uncountedDevices: Refuse`."""
    return policy_of(
        {
            "quota": {**yaml.safe_load(quota), "uncountedDevices": "Refuse"},
            "tenants": yaml.safe_load(tenants),
        }
    )


# (id, spec.quota beside kueue, whether devices no quota resource counts are refused)
UNCOUNTED_DEVICES = [
    ("kueue-objects-refuse-uncounted-devices", {}, True),
    ("the-site-may-allow-them-beside-kueue", {"uncountedDevices": "Allow"}, False),
    ("or-say-refuse-as-the-translation-does", {"uncountedDevices": "Refuse"}, True),
]


@pytest.mark.parametrize(
    ("beside", "refused"), [pytest.param(*case[1:], id=case[0]) for case in UNCOUNTED_DEVICES]
)
def test_kueue_objects_refuse_devices_no_quota_resource_counts(
    beside: dict[str, Any], refused: bool
) -> None:
    """Kueue admits no workload asking for a resource its ClusterQueue does not cover: the
    translation writes `uncountedDevices: Refuse`, unless the policy says otherwise (Kueue has
    no word for devices it does not see)."""
    spec = {"quota": {"kueue": {"files": ["site.yaml"]}, **beside}}
    policy = policy_of(spec, {"site.yaml": documents(DEFAULT_FLAVOR, GPU_QUEUE)})
    assert policy.quotas.refuse_uncounted is refused
    assert native(NATIVE_GPU, "[]").quotas.refuse_uncounted is False  # the native default


def test_what_is_left_out_on_purpose_is_listed() -> None:
    rows: dict[str, Any] = {case[0]: case for case in MAPPING}
    objects, section = rows["cpu-memory-and-listed-resources-are-not-enforced"][1:3]
    translation = kueue(objects, **section).kueue
    assert translation is not None
    assert translation.not_enforced == (
        ("team-a", "cpu"),
        ("team-a", "memory"),
        ("team-a", "rdma/hca"),
    )
    objects = rows["kueues-own-fields-stay-with-kueue"][1]
    translation = kueue(objects).kueue
    assert translation is not None
    assert [(r.kind, r.name, r.origin) for r in translation.kueue_only] == [
        ("LocalQueue", "team-a/gpu-queue", "site.yaml[2]"),
        ("AdmissionCheck", "gpualloc", "site.yaml[3]"),
    ]
    assert translation.notes() == (
        "Kueue objects without quota, left to Kueue: LocalQueue team-a/gpu-queue, "
        "AdmissionCheck gpualloc",
    )


def test_a_cluster_queue_is_a_tenant_the_bindings_may_name() -> None:
    """A ClusterQueue the policy's tenants do not list is a tenant; one they list keeps its
    allowAdminAccess and maxReservations; a tenant without a ClusterQueue is not limited."""
    tenants = (
        "[{name: team-a, allowAdminAccess: true, maxReservations: 5, "
        "tolerations: [{key: spot, operator: Exists}]}, {name: tools}]"
    )
    policy = kueue(
        documents(DEFAULT_FLAVOR, GPU_QUEUE, GPU_QUEUE.replace("team-a", "team-b")), tenants
    )
    assert sorted(policy.tenants) == ["team-a", "team-b", "tools"]
    assert policy.tenants["team-a"].allow_admin_access
    assert policy.tenants["team-a"].max_reservations == 5
    team_a = policy.quotas.quota_of("team-a")
    assert team_a is not None and [t.key for t in team_a.tolerations] == ["spot"]
    assert policy.quotas.quota_of("team-b") is not None
    assert policy.quotas.quota_of("tools") is None


def test_inline_objects_and_files_together() -> None:
    policy = policy_of(
        {
            "quota": {
                "kueue": {
                    "files": ["flavors.yaml"],
                    "objects": [yaml.safe_load(GPU_QUEUE)],
                }
            }
        },
        {"flavors.yaml": DEFAULT_FLAVOR},
    )
    assert (
        policy.quotas
        == translated(
            NATIVE_GPU,
            f"""
  - name: team-a
    quotas: [{{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 4}}]
{KUEUE_DEFAULTS}""",
        ).quotas
    )


# --- validation -----------------------------------------------------------------------------


def _queue(spec: str, version: str = V2, name: str = "team-a") -> str:
    return f"apiVersion: {version}\nkind: ClusterQueue\nmetadata: {{name: {name}}}\nspec:\n{spec}"


GROUP = """
  resourceGroups:
  - coveredResources: [nvidia.com/gpu]
    flavors: [{name: default-flavor, resources: [{name: nvidia.com/gpu, nominalQuota: 4}]}]
"""
COHORT = "  cohortName: research\n"


def _with(spec: str, **replacements: str) -> str:
    for old, new in replacements.items():
        assert old.replace("_", " ") in spec or old in spec, old
        spec = spec.replace(old, new)
    return spec


R, INV, D, NS, NF, TM, TL, F, U, X = (
    FieldError.REQUIRED,
    FieldError.INVALID,
    FieldError.DUPLICATE,
    FieldError.NOT_SUPPORTED,
    FieldError.NOT_FOUND,
    FieldError.TOO_MANY,
    FieldError.TOO_LONG,
    FieldError.FORBIDDEN,
    FieldError.UNKNOWN,
    FieldError.REFUSED,
)
Q = ("ClusterQueue", "team-a")
RF = ("ResourceFlavor", "default-flavor")

# (id, objects besides the default flavor, [(error, kind, name, path)])
INVALID = [
    ("unknown-spec-field", _queue(GROUP + "  cohorts: x\n"), [(U, *Q, "spec.cohorts")]),
    ("v1beta2-has-no-cohort-field", _queue(GROUP + "  cohort: x\n"), [(U, *Q, "spec.cohort")]),
    (
        "v1beta1-has-no-cohort-name-field",
        _queue(GROUP + COHORT, V1),
        [(U, *Q, "spec.cohortName")],
    ),
    ("unknown-top-level-field", _queue(GROUP) + "\nextra: 1", [(U, *Q, "extra")]),
    (
        "name-required",
        f"{{apiVersion: {V2}, kind: ClusterQueue, metadata: {{}}}}",
        [(R, "ClusterQueue", "", "metadata.name")],
    ),
    (
        "name-not-a-dns-subdomain",
        _queue(GROUP, name="Team_A"),
        [(INV, "ClusterQueue", "Team_A", "metadata.name")],
    ),
    ("duplicate-name", documents(_queue(GROUP), _queue(GROUP)), [(D, *Q, "metadata.name")]),
    (
        "cohort-not-a-dns-subdomain",
        _queue(GROUP + "  cohortName: Research\n"),
        [(INV, *Q, "spec.cohortName")],
    ),
    (
        "more-than-16-resource-groups",
        _queue(
            "  resourceGroups:\n"
            + "".join(
                f"  - coveredResources: [r{i}]\n    flavors: [{{name: f{i}, resources: "
                f"[{{name: r{i}, nominalQuota: 1}}]}}]\n"
                for i in range(17)
            )
        ),
        [(TM, *Q, "spec.resourceGroups")],
    ),
    (
        "more-than-64-covered-resources",
        _queue(
            "  resourceGroups:\n  - coveredResources: ["
            + ", ".join(f"r{i}" for i in range(65))
            + "]\n    flavors: [{name: default-flavor, resources: ["
            + ", ".join(f"{{name: r{i}, nominalQuota: 1}}" for i in range(65))
            + "]}]\n"
        ),
        [
            (TM, *Q, "spec.resourceGroups[0].coveredResources"),
            (TM, *Q, "spec.resourceGroups[0].flavors[0].resources"),
        ],
    ),
    (
        "covered-resources-required",
        _queue("  resourceGroups: [{coveredResources: [], flavors: []}]\n"),
        [
            (R, *Q, "spec.resourceGroups[0].coveredResources"),
            (R, *Q, "spec.resourceGroups[0].flavors"),
        ],
    ),
    (
        "covered-resource-not-a-qualified-name",
        _queue(_with(GROUP, **{"[nvidia.com/gpu]": "[nvidia.com/gpu/x]"})),
        [
            (INV, *Q, "spec.resourceGroups[0].coveredResources[0]"),
            (INV, *Q, "spec.resourceGroups[0].flavors[0].resources[0].name"),
        ],
    ),
    (
        "a-resource-in-two-groups",
        _queue(GROUP + GROUP.replace("  resourceGroups:\n", "").replace("default-flavor", "other")),
        [(D, *Q, "spec.resourceGroups[1].coveredResources[0]")],
    ),
    (
        "a-flavor-in-two-groups",
        _queue(GROUP + GROUP.replace("  resourceGroups:\n", "").replace("nvidia.com/gpu", "x/y")),
        [
            (D, *Q, "spec.resourceGroups[1].flavors[0].name"),
        ],
    ),
    (
        "flavor-name-not-a-dns-subdomain",
        _queue(GROUP.replace("name: default-flavor", "name: A")),
        [
            (INV, *Q, "spec.resourceGroups[0].flavors[0].name"),
        ],
    ),
    (
        "a-flavor-lists-fewer-resources-than-covered",
        _queue(GROUP.replace("[nvidia.com/gpu]", "[nvidia.com/gpu, cpu]")),
        [(INV, *Q, "spec.resourceGroups[0]")],
    ),
    (
        "resource-name-not-the-covered-ones",
        _queue(GROUP.replace("{name: nvidia.com/gpu, nominalQuota", "{name: cpu, nominalQuota")),
        [(INV, *Q, "spec.resourceGroups[0].flavors[0].resources[0].name")],
    ),
    (
        "nominal-required",
        _queue(GROUP.replace(", nominalQuota: 4", "")),
        [(R, *Q, "spec.resourceGroups[0].flavors[0].resources[0].nominalQuota")],
    ),
    (
        "nominal-negative",
        _queue(GROUP.replace("nominalQuota: 4", "nominalQuota: -1")),
        [(INV, *Q, "spec.resourceGroups[0].flavors[0].resources[0].nominalQuota")],
    ),
    (
        "nominal-not-a-quantity",
        _queue(GROUP.replace("nominalQuota: 4", "nominalQuota: lots")),
        [(INV, *Q, "spec.resourceGroups[0].flavors[0].resources[0].nominalQuota")],
    ),
    (
        "nominal-a-float",
        _queue(GROUP.replace("nominalQuota: 4", "nominalQuota: 0.5")),
        [(INV, *Q, "spec.resourceGroups[0].flavors[0].resources[0].nominalQuota")],
    ),
    (
        "borrowing-limit-without-cohort",
        _queue(GROUP.replace("4}", "4, borrowingLimit: 1}")),
        [(INV, *Q, "spec.resourceGroups[0].flavors[0].resources[0].borrowingLimit")],
    ),
    (
        "lending-limit-without-cohort",
        _queue(GROUP.replace("4}", "4, lendingLimit: 1}")),
        [(INV, *Q, "spec.resourceGroups[0].flavors[0].resources[0].lendingLimit")],
    ),
    (
        "lending-limit-above-nominal",
        _queue(COHORT + GROUP.replace("4}", "4, lendingLimit: 5}")),
        [(INV, *Q, "spec.resourceGroups[0].flavors[0].resources[0].lendingLimit")],
    ),
    (
        "borrowing-limit-negative",
        _queue(COHORT + GROUP.replace("4}", "4, borrowingLimit: -1}")),
        [(INV, *Q, "spec.resourceGroups[0].flavors[0].resources[0].borrowingLimit")],
    ),
    (
        "within-cluster-queue-not-kueues",
        _queue(GROUP + "  preemption: {withinClusterQueue: Any}\n"),
        [(NS, *Q, "spec.preemption.withinClusterQueue")],
    ),
    (
        "reclaim-not-kueues",
        _queue(GROUP + "  preemption: {reclaimWithinCohort: Lower}\n"),
        [(NS, *Q, "spec.preemption.reclaimWithinCohort")],
    ),
    (
        "borrow-within-cohort-with-reclaim-never",
        _queue(
            COHORT + GROUP + "  preemption: {reclaimWithinCohort: Never, "
            "borrowWithinCohort: {policy: LowerPriority}}\n"
        ),
        [(INV, *Q, "spec.preemption")],
    ),
    (
        "borrow-within-cohort-with-reclaim-defaulted-to-never",
        _queue(COHORT + GROUP + "  preemption: {borrowWithinCohort: {policy: LowerPriority}}\n"),
        [(INV, *Q, "spec.preemption")],
    ),
    (
        "threshold-not-an-int32",
        _queue(
            COHORT + GROUP + "  preemption: {reclaimWithinCohort: Any, borrowWithinCohort: "
            "{policy: LowerPriority, maxPriorityThreshold: 3000000000}}\n"
        ),
        [(INV, *Q, "spec.preemption.borrowWithinCohort.maxPriorityThreshold")],
    ),
    (
        "when-can-borrow-not-kueues",
        _queue(GROUP + "  flavorFungibility: {whenCanBorrow: Never}\n"),
        [(NS, *Q, "spec.flavorFungibility.whenCanBorrow")],
    ),
    (
        "v1beta2-has-no-borrow-alias",
        _queue(GROUP + "  flavorFungibility: {whenCanBorrow: Borrow}\n"),
        [(NS, *Q, "spec.flavorFungibility.whenCanBorrow")],
    ),
    (
        "preference-without-both-try-next-flavor",
        _queue(GROUP + "  flavorFungibility: {preference: BorrowingOverPreemption}\n"),
        [(INV, *Q, "spec.flavorFungibility.preference")],
    ),
    (
        "stop-policy-hold-is-refused",
        _queue(GROUP + "  stopPolicy: Hold\n"),
        [(X, *Q, "spec.stopPolicy")],
    ),
    (
        "stop-policy-not-kueues",
        _queue(GROUP + "  stopPolicy: Pause\n"),
        [(NS, *Q, "spec.stopPolicy")],
    ),
    (
        "queueing-strategy-not-kueues",
        _queue(GROUP + "  queueingStrategy: FIFO\n"),
        [(NS, *Q, "spec.queueingStrategy")],
    ),
    (
        "namespace-selector-exists-with-values",
        _queue(
            GROUP + "  namespaceSelector: {matchExpressions: "
            "[{key: team, operator: Exists, values: [a]}]}\n"
        ),
        [(F, *Q, "spec.namespaceSelector.matchExpressions[0].values")],
    ),
    (
        "fair-sharing-weight-negative",
        _queue(GROUP + "  fairSharing: {weight: -1}\n"),
        [(INV, *Q, "spec.fairSharing.weight")],
    ),
    (
        "fair-sharing-weight-below-a-nano",
        _queue(GROUP + "  fairSharing: {weight: 1n}\n"),
        [(INV, *Q, "spec.fairSharing.weight")],
    ),
    (
        "admission-mode-not-kueues",
        _queue(GROUP + "  admissionScope: {admissionMode: Fair}\n"),
        [(NS, *Q, "spec.admissionScope.admissionMode")],
    ),
    (
        "flavor-not-given",
        _queue(GROUP.replace("name: default-flavor", "name: hopper")),
        [(NF, *Q, "spec.resourceGroups[0].flavors[0].name")],
    ),
    (
        "a-resource-gpualloc-does-not-allocate",
        _queue(GROUP.replace("nvidia.com/gpu", "example.com/fpga")),
        [(X, *Q, "spec.resourceGroups[0].coveredResources[0]")],
    ),
    (
        "a-mig-name-that-is-no-profile",
        _queue(GROUP.replace("nvidia.com/gpu", "nvidia.com/mig-big")),
        [(X, *Q, "spec.resourceGroups[0].coveredResources[0]")],
    ),
    (
        "flavor-more-than-8-labels",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: many}\n"
        "spec: {nodeLabels: {" + ", ".join(f"l{i}: v" for i in range(9)) + "}}",
        [(TM, "ResourceFlavor", "many", "spec.nodeLabels")],
    ),
    (
        "flavor-label-not-a-label",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: bad}\n"
        "spec: {nodeLabels: {gpu: 'not a value'}}",
        [(INV, "ResourceFlavor", "bad", "spec.nodeLabels[gpu]")],
    ),
    (
        "flavor-topology-is-refused",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: tas}\n"
        "spec: {nodeLabels: {a: b}, topologyName: default}",
        [(X, "ResourceFlavor", "tas", "spec.topologyName")],
    ),
    (
        "taint-effect-not-kubernetes",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: spot}\n"
        "spec: {nodeTaints: [{key: spot, effect: Never}]}",
        [(NS, "ResourceFlavor", "spot", "spec.nodeTaints[0].effect")],
    ),
    (
        "a-taint-twice-for-one-key-and-effect",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: spot}\n"
        "spec: {nodeTaints: [{key: spot, effect: NoSchedule}, "
        "{key: spot, value: 'yes', effect: NoSchedule}]}",
        [(D, "ResourceFlavor", "spot", "spec.nodeTaints[1]")],
    ),
    (
        "more-than-8-taints",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: spot}\n"
        "spec: {nodeTaints: ["
        + ", ".join(f"{{key: t{i}, effect: NoSchedule}}" for i in range(9))
        + "]}",
        [(TM, "ResourceFlavor", "spot", "spec.nodeTaints")],
    ),
    (
        "toleration-without-a-key-not-exists",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: spot}\n"
        "spec: {tolerations: [{operator: Equal, value: x}]}",
        [(INV, "ResourceFlavor", "spot", "spec.tolerations[0].operator")],
    ),
    (
        "toleration-exists-with-a-value",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: spot}\n"
        "spec: {tolerations: [{key: spot, operator: Exists, value: x}]}",
        [(INV, "ResourceFlavor", "spot", "spec.tolerations[0].value")],
    ),
    (
        "toleration-seconds-without-no-execute",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: spot}\n"
        "spec: {tolerations: [{key: spot, operator: Exists, effect: NoSchedule, "
        "tolerationSeconds: 5}]}",
        [(INV, "ResourceFlavor", "spot", "spec.tolerations[0].effect")],
    ),
    (
        "toleration-key-not-a-label-name",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: spot}\n"
        "spec: {tolerations: [{key: 'spot instance', operator: Exists}]}",
        [(INV, "ResourceFlavor", "spot", "spec.tolerations[0].key")],
    ),
    (
        "workload-priority-value-required",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: WorkloadPriorityClass\nmetadata: {name: p}",
        [(R, "WorkloadPriorityClass", "p", "value")],
    ),
    (
        "workload-priority-description-too-long",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: WorkloadPriorityClass\nmetadata: {name: p}\n"
        f"value: 1\ndescription: {'x' * 2049}",
        [(TL, "WorkloadPriorityClass", "p", "description")],
    ),
    (
        "priority-class-above-a-billion",
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: p}\n"
        "value: 1000000001",
        [(F, "PriorityClass", "p", "value")],
    ),
    (
        "two-global-defaults",
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: p}\nvalue: 1\n"
        "globalDefault: true\n---\napiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\n"
        "metadata: {name: q}\nvalue: 2\nglobalDefault: true",
        [(F, "PriorityClass", "q", "globalDefault")],
    ),
    (
        "a-workload-priority-class-and-a-priority-class-of-one-name",
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: p}\nvalue: 1\n"
        "---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: WorkloadPriorityClass\n"
        "metadata: {name: p}\nvalue: 2",
        [(D, "WorkloadPriorityClass", "p", "metadata.name")],
    ),
    (
        "cohorts-in-a-cycle",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: Cohort\nmetadata: {name: a}\n"
        "spec: {parentName: b}\n---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: Cohort\n"
        "metadata: {name: b}\nspec: {parentName: a}",
        [(X, "Cohort", "a", "spec.parentName")],
    ),
    (
        "a-cohort-named-as-a-cluster-queue",
        _queue(GROUP + COHORT)
        + "\n---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: Cohort\nmetadata: {name: team-a}",
        [(X, "Cohort", "team-a", "metadata.name")],
    ),
    (
        "a-root-cohort-cannot-borrow",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: Cohort\nmetadata: {name: org}\nspec:\n"
        + GROUP.replace("4}", "4, borrowingLimit: 1}"),
        [(INV, "Cohort", "org", "spec.resourceGroups[0].flavors[0].resources[0].borrowingLimit")],
    ),
    (
        "cohort-parent-not-a-dns-subdomain",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: Cohort\nmetadata: {name: org}\n"
        "spec: {parentName: Org}",
        [(INV, "Cohort", "org", "spec.parentName")],
    ),
    (
        "fair-sharing-without-strategies",
        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\nfairSharing: {}",
        [(R, "Configuration", "", "fairSharing.preemptionStrategies")],
    ),
    (
        "fair-sharing-strategies-not-kueues",
        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"
        "fairSharing: {preemptionStrategies: [LessThanInitialShare, LessThanOrEqualToFinalShare]}",
        [(NS, "Configuration", "", "fairSharing.preemptionStrategies")],
    ),
    (
        "admission-fair-sharing-negative-half-life",
        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"
        "admissionFairSharing: {usageHalfLifeTime: -1h}",
        [(INV, "Configuration", "", "admissionFairSharing.usageHalfLifeTime")],
    ),
    (
        "admission-fair-sharing-sampling-every-negative",
        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"
        "admissionFairSharing: {usageHalfLifeTime: 1h, usageSamplingInterval: -5m}",
        [(INV, "Configuration", "", "admissionFairSharing.usageSamplingInterval")],
    ),
    (
        "admission-fair-sharing-negative-weight",
        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"
        "admissionFairSharing: {usageHalfLifeTime: 1h, resourceWeights: {nvidia.com/gpu: -1}}",
        [(INV, "Configuration", "", "admissionFairSharing.resourceWeights[nvidia.com/gpu]")],
    ),
    (
        "transformations-are-refused",
        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"
        "resources: {transformations: [{input: nvidia.com/mig-1g.5gb, strategy: Replace}]}",
        [(X, "Configuration", "", "resources.transformations")],
    ),
    (
        "a-feature-gate-that-changes-a-quota-decision",
        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"
        "featureGates: {LendingLimit: false, PriorityBoost: false, TLSOptions: true}",
        [(X, "Configuration", "", "featureGates[LendingLimit]")],
    ),
    (
        "a-device-class-mapped-to-two-names",
        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"
        "resources: {deviceClassMappings: [{name: a/gpus, deviceClassNames: [gpu.nvidia.com]}, "
        "{name: b/gpus, deviceClassNames: [gpu.nvidia.com]}]}",
        [(INV, "Configuration", "", "resources.deviceClassMappings[1].deviceClassNames[0]")],
    ),
    (
        "a-mapping-without-classes",
        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"
        "resources: {deviceClassMappings: [{name: a/gpus, deviceClassNames: []}]}",
        [(R, "Configuration", "", "resources.deviceClassMappings[0].deviceClassNames")],
    ),
    (
        "an-excluded-prefix-that-excludes-gpus",
        _queue(GROUP) + "\n---\napiVersion: config.kueue.x-k8s.io/v1beta2\n"
        "kind: Configuration\nresources: {excludeResourcePrefixes: [nvidia.com/]}",
        [(X, "Configuration", "", "resources.excludeResourcePrefixes")],
    ),
    (
        "two-configurations",
        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n---\n"
        "apiVersion: config.kueue.x-k8s.io/v1beta1\nkind: Configuration",
        [(D, "Configuration", "", "kind")],
    ),
    (
        "a-config-map-that-is-not-kueues",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}",
        [(NS, "ConfigMap", "x", "kind")],
    ),
    (
        "a-kind-gpualloc-does-not-read",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: kueue}",
        [(NS, "Deployment", "kueue", "kind")],
    ),
    (
        "a-kueue-version-not-served",
        _queue(GROUP, "kueue.x-k8s.io/v1alpha1"),
        [(NS, *Q, "kind")],
    ),
    (
        "a-workload-is-not-a-policy-object",
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: Workload\nmetadata: {name: w}",
        [(NS, "Workload", "w", "kind")],
    ),
]


@pytest.mark.parametrize(
    ("objects", "expected"), [pytest.param(*case[1:], id=case[0]) for case in INVALID]
)
def test_kueue_objects_are_validated_as_kueue_does(
    objects: str, expected: list[tuple[FieldError, str, str, str]]
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        kueue(documents(DEFAULT_FLAVOR, objects))
    found = [
        (v.error, v.kind, v.name, v.path)
        for v in caught.value.violations
        if isinstance(v, KueueViolation)
    ]
    assert found == expected, caught.value.violations
    assert all(isinstance(v, KueueViolation) for v in caught.value.violations)
    first = caught.value.violations[0]
    assert str(first) in str(caught.value)  # the message names the object and the field


# (id, the policy's spec, [field paths of the policy refused])
POLICY_INVALID = [
    (
        "a-native-quota-field-beside-kueue",
        {"quota": {"kueue": {"files": ["site.yaml"]}, "resources": []}},
        ["spec.quota.resources"],
    ),
    (
        "a-tenants-quota-field-for-a-cluster-queue",
        {
            "quota": {"kueue": {"files": ["site.yaml"]}},
            "tenants": [{"name": "team-a", "cohort": "x"}],
        },
        ["spec.tenants[0].cohort"],
    ),
    (
        "a-tenants-fair-sharing-for-a-cluster-queue",
        {
            "quota": {"kueue": {"files": ["site.yaml"]}},
            "tenants": [{"name": "team-a", "fairSharing": {"weight": 2}}],
        },
        ["spec.tenants[0].fairSharing"],
    ),
    (
        "an-unknown-field-of-the-section",
        {"quota": {"kueue": {"files": ["site.yaml"], "file": "x"}}},
        ["spec.quota.kueue.file"],
    ),
    ("a-section-naming-nothing", {"quota": {"kueue": {}}}, ["spec.quota.kueue"]),
    (
        "a-file-not-read",
        {"quota": {"kueue": {"files": ["site.yaml", "other.yaml"]}}},
        ["spec.quota.kueue.files[1]"],
    ),
    (
        "a-not-enforced-resource-that-is-mapped",
        {
            "quota": {
                "kueue": {
                    "files": ["site.yaml"],
                    "notEnforced": ["nvidia.com/gpu"],
                    "resources": [
                        {"name": "nvidia.com/gpu", "deviceClassNames": ["gpu.nvidia.com"]}
                    ],
                }
            }
        },
        ["spec.quota.kueue.notEnforced"],
    ),
    (
        "an-explicit-resource-without-classes",
        {
            "quota": {
                "kueue": {
                    "files": ["site.yaml"],
                    "resources": [{"name": "nvidia.com/gpu", "deviceClassNames": []}],
                }
            }
        },
        ["spec.quota.kueue.resources[0].deviceClassNames"],
    ),
]


@pytest.mark.parametrize(
    ("spec", "paths"), [pytest.param(*case[1:], id=case[0]) for case in POLICY_INVALID]
)
def test_the_policys_kueue_section_is_validated(spec: dict[str, Any], paths: list[str]) -> None:
    with pytest.raises(InvalidArgument) as caught:
        policy_of(spec, {"site.yaml": documents(DEFAULT_FLAVOR, GPU_QUEUE)})
    assert [v.path for v in caught.value.violations] == paths
    assert all(isinstance(v, FieldViolation) for v in caught.value.violations)


def test_native_resource_names_may_be_kubernetes_resource_names() -> None:
    """Translated resources keep Kueue's names (nvidia.com/gpu): the native form takes a
    name with one '/', per flavor <resource>/<flavor>; more '/' or a collision is refused."""
    quotas = native(
        NATIVE_GPU,
        "[{name: t, quotas: [{resource: nvidia.com/gpu, flavor: default-flavor, nominal: 1}]}]",
    ).quotas
    assert [r.name for r in quotas.resources] == [
        "nvidia.com/gpu/default-flavor",
        "nvidia.com/gpu/(none)",
    ]
    with pytest.raises(InvalidArgument) as caught:
        native("{resources: [{name: a/b/c, deviceClassNames: [x]}]}", "[]")
    assert [v.path for v in caught.value.violations] == ["spec.quota.resources[0].name"]
    with pytest.raises(InvalidArgument) as caught:
        native(
            """
    resourceFlavors: [{name: b}]
    resources:
    - {name: a, deviceClassNames: [x], flavors: [b]}
    - {name: a/b, deviceClassNames: [x]}
""",
            "[]",
        )
    assert [v.path for v in caught.value.violations] == ["spec.quota.resources"]


# --- the files, read at the edge and watched ------------------------------------------------

POLICY_FILE = """
apiVersion: gpualloc.dev/v1alpha1
kind: AccessPolicy
metadata: {name: site}
spec:
  quota:
    kueue: {files: [kueue/, extra.yaml]}
  bindings: []
"""


def _site(tmp_path: Path) -> Path:
    (tmp_path / "kueue").mkdir()
    (tmp_path / "kueue" / "flavors.yaml").write_text(DEFAULT_FLAVOR)
    (tmp_path / "kueue" / "queues.yml").write_text(GPU_QUEUE)
    (tmp_path / "kueue" / "notes.txt").write_text("not read")
    (tmp_path / "kueue" / "priority.json").write_text(
        '{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", '
        '"metadata": {"name": "from-json"}, "value": 7}'
    )
    (tmp_path / "extra.yaml").write_text(GPU_QUEUE.replace("team-a", "team-b"))
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY_FILE)
    return policy


def test_files_and_directories_are_read_relative_to_the_policy(tmp_path: Path) -> None:
    policy = _site(tmp_path)
    loaded = load_policy(str(policy), policy.read_bytes())
    assert sorted(loaded.policy.quotas.tenants) == ["team-a", "team-b"]
    assert loaded.policy.quotas.priority("from-json").value == 7  # a JSON file of the directory
    read = ("kueue", "kueue/flavors.yaml", "kueue/priority.json", "kueue/queues.yml", "extra.yaml")
    assert sorted(loaded.followed) == sorted(str(tmp_path / p) for p in read)
    (tmp_path / "extra.yaml").write_text(GPU_QUEUE.replace("nominalQuota: 4", "nominalQuota: x"))
    with pytest.raises(InvalidArgument) as caught:
        load_policy(str(policy), policy.read_bytes())
    (violation,) = caught.value.violations
    assert isinstance(violation, KueueViolation)
    assert (violation.origin, violation.kind, violation.name) == (
        "extra.yaml[0]",
        "ClusterQueue",
        "team-a",
    )
    (tmp_path / "extra.yaml").unlink()
    with pytest.raises(InvalidArgument) as caught:
        load_policy(str(policy), policy.read_bytes())
    assert caught.value.field_path == f"{policy}: spec.quota.kueue.files[1]"


def test_a_change_of_a_named_file_reloads_the_policy(tmp_path: Path) -> None:
    """WatchedFiles follows the files the policy names: editing one, or adding a file to a
    named directory, makes a new policy; a broken edit keeps the last good one."""
    policy = _site(tmp_path)
    now = [0.0]
    watched = WatchedFiles(
        [str(policy)],
        lambda contents: load_policy(str(policy), contents[0]),
        what="policy",
        clock=lambda: now[0],
        follow=lambda loaded: loaded.followed,
    )

    def nominal(tenant: str) -> int:
        quota = watched.current().policy.quotas.quota_of(tenant)
        assert quota is not None
        return quota.of("nvidia.com/gpu/default-flavor").nominal

    assert nominal("team-a") == 4000
    queues = tmp_path / "kueue" / "queues.yml"
    queues.write_text(GPU_QUEUE.replace("nominalQuota: 4", "nominalQuota: 6") + "\n")
    now[0] += 2
    assert nominal("team-a") == 6000
    queues.write_text(GPU_QUEUE.replace("nominalQuota: 4", "nominalQuota: -6"))
    now[0] += 2
    assert nominal("team-a") == 6000  # refused: the last good policy stays
    (tmp_path / "kueue" / "more.yaml").write_text(GPU_QUEUE.replace("team-a", "team-c"))
    queues.write_text(GPU_QUEUE)
    now[0] += 2
    assert nominal("team-a") == 4000 and nominal("team-c") == 4000


def test_nothing_past_kueues_limits_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ClusterQueue of 10,000 resource groups (one group aliased over and over, each with an
    unknown field) is refused with one TOO_MANY and the errors of the 16 groups Kueue allows
    at most, not 10,000 of them; and past the objects' limit (5,000; 10 here) none is read."""
    group = "{coveredResources: [nvidia.com/gpu], flavors: [], bogus: 1}"
    aliased = f"&g {group}, " + ", ".join(["*g"] * 9_999)
    text = _queue(f"  resourceGroups: [{aliased}]\n")
    with pytest.raises(InvalidArgument) as caught:
        kueue(documents(DEFAULT_FLAVOR, text))
    errors = [(v.error, v.path) for v in caught.value.violations if isinstance(v, KueueViolation)]
    assert errors[0] == (TM, "spec.resourceGroups")
    assert len(errors) == 1 + 16 * 2 + 15  # each: the unknown field, no flavors; a duplicate
    monkeypatch.setattr(kueue_quota, "_OBJECTS_LIMIT", 10)
    many = "apiVersion: v1\nkind: List\nitems:\n" + "".join(
        f"- {{apiVersion: {V2}, kind: ResourceFlavor, metadata: {{name: f{i}}}}}\n"
        for i in range(20)
    )
    with pytest.raises(InvalidArgument) as caught:
        kueue(many)
    found = [v for v in caught.value.violations if isinstance(v, KueueViolation)]
    assert len(found) == len(caught.value.violations)
    assert [(v.error, v.origin) for v in found] == [(TM, "site.yaml[0].items[9]")]


def _kubelet_projects(directory: Path, files: dict[str, str], version: str) -> None:
    """`files` as kubelet projects a ConfigMap volume: in a hidden timestamped directory,
    `..data` a symlink to it swapped atomically (a rename), each key a symlink through
    `..data`; the previous version removed."""
    directory.mkdir(exist_ok=True)
    target = directory / f"..{version}"
    target.mkdir()
    for name, text in files.items():
        (target / name).write_text(text)
    previous = (directory / "..data").resolve() if (directory / "..data").exists() else None
    (directory / "..data_tmp").symlink_to(target.name)
    (directory / "..data_tmp").rename(directory / "..data")
    for name in files:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    if previous is not None:
        shutil.rmtree(previous)


def test_a_configmap_volume_of_kueue_files_reloads_when_kubelet_swaps_it(tmp_path: Path) -> None:
    """The Kueue files mounted from a ConfigMap (kubelet's layout: keys as symlinks through
    `..data`, a new version swapped in with one rename): its hidden directories are not read,
    and an update of the ConfigMap reloads the policy."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY_FILE.replace("[kueue/, extra.yaml]", "[kueue/]"))
    _kubelet_projects(
        tmp_path / "kueue", {"flavors.yaml": DEFAULT_FLAVOR, "queues.yaml": GPU_QUEUE}, "v1"
    )
    now = [0.0]
    watched = WatchedFiles(
        [str(policy)],
        lambda contents: load_policy(str(policy), contents[0]),
        what="policy",
        clock=lambda: now[0],
        follow=lambda loaded: loaded.followed,
    )

    def nominal() -> int:
        quota = watched.current().policy.quotas.quota_of("team-a")
        assert quota is not None
        return quota.of("nvidia.com/gpu/default-flavor").nominal

    assert nominal() == 4000
    assert sorted(Path(p).name for p in watched.current().followed) == [
        "flavors.yaml",
        "kueue",
        "queues.yaml",
    ]
    raised = GPU_QUEUE.replace("nominalQuota: 4", "nominalQuota: 7")
    _kubelet_projects(
        tmp_path / "kueue", {"flavors.yaml": DEFAULT_FLAVOR, "queues.yaml": raised}, "v2"
    )
    now[0] += 2
    assert nominal() == 7000


def test_at_most_256_files_of_at_most_4_mib_are_read(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as caught:
        policy_of({"quota": {"kueue": {"files": [f"f{i}.yaml" for i in range(257)]}}})
    assert caught.value.violations[0].path == "spec.quota.kueue.files"
    policy = _site(tmp_path)
    (tmp_path / "extra.yaml").write_text("# padding\n" * (4 * 2**20 // 10 + 1))
    with pytest.raises(InvalidArgument) as caught:
        load_policy(str(policy), policy.read_bytes())
    assert caught.value.field_path == f"{policy}: spec.quota.kueue.files[1]"
    assert "larger than 4194304 bytes" in str(caught.value)


def test_a_quota_resources_selector_that_does_not_compile_is_refused_at_load() -> None:
    """A resource's own CEL selectors (a MIG profile's, or one written in the native form)
    are compiled where the allocator loads the policy: one that does not compile names the
    resource and the selector, and the policy is not loaded."""
    policy = native(
        """
    resources:
    - name: nvidia.com/mig-1g.10gb
      deviceClassNames: [mig.nvidia.com]
      selectors: [{cel: {expression: "device.attributes['gpu.nvidia.com'].profile =="}}]
""",
        "[{name: t, quotas: [{resource: nvidia.com/mig-1g.10gb, nominal: 1}]}]",
    )
    with pytest.raises(InvalidArgument) as caught:
        check_flavor_selectors(policy.quotas, SelectorCache())
    assert caught.value.field_path == (
        "spec.quota.resources[nvidia.com/mig-1g.10gb].selectors[0].cel.expression"
    )
