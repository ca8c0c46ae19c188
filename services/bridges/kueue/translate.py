"""A Workload's pod sets -> the claims gpualloc allocates, one unit per pod set.

Per pod (every pod of a pod set is alike), the GPUs it asks for:

- `nvidia.com/gpu: N` in its containers' resources (limits, or requests: for extended
  resources they are equal) -> a claim of N whole GPUs (class gpu.nvidia.com);
- `nvidia.com/mig-<profile>: N` (the GPU Operator's "mixed" MIG strategy, e.g.
  `nvidia.com/mig-1g.10gb`) -> a claim of N MIG devices of that profile (class mig.nvidia.com);
- `spec.resourceClaims[].resourceClaimTemplateName` -> the ResourceClaimTemplate's claim (read
  through the KueueApi port), one per pod, exactly as Kubernetes would stamp it out;
- the annotation `gpualloc.io/nvlink: "true"` on the pod template -> the pod's GPUs must be
  NVLink-connected.

The pod template's `nodeSelector` (e.g. GPU Feature Discovery's `nvidia.com/gpu.product:
NVIDIA-H100-80GB-HBM3`) becomes the allocator's node selector. All pods of a pod set are
allocated together on one node, because the admission check pins the pod set to one node
(`podSetUpdates[].nodeSelector`); a pod set larger than any node can never be admitted.
Claims referenced by name (`resourceClaimName`, shared by all pods) are refused: their
allocation is the scheduler's, not per pod.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from services.bridges.kueue.objects import PodSet, Workload
from services.client.specs import DeviceChoice, RequestSpec, build_claim, is_mig_profile
from services.common.dra.model import (
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceClaim,
)
from services.common.dra.parse import decode_object
from services.common.errors import InvalidArgument

__all__ = [
    "GPU_RESOURCE",
    "MIG_RESOURCE_PREFIX",
    "NVLINK_ANNOTATION",
    "PodSetClaims",
    "TemplateReader",
    "node_selector_of",
    "pod_set_claims",
    "with_node_labels",
    "workload_claims",
]

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
NVLINK_ANNOTATION = "gpualloc.io/nvlink"
_TRUE = frozenset({"true", "1", "yes"})

TemplateReader = Callable[[str, str], Mapping[str, Any] | None]
"""(namespace, name) -> the ResourceClaimTemplate object, None when absent."""


@dataclass(frozen=True)
class PodSetClaims:
    """The claims of every pod of a pod set, to be allocated together on one node."""

    pod_set: str
    count: int
    claims: tuple[ResourceClaim, ...]
    node_selector: NodeSelector | None = None


def _quantity(value: object, where: str) -> int:
    text = str(value).strip()
    if not re.fullmatch(r"\d+", text):
        raise InvalidArgument.at(where, f"GPU counts are whole numbers, got {value!r}")
    return int(text)


def _container_gpus(pod_spec: Mapping[str, Any], path: str) -> dict[str, int]:
    """Resource name -> count per pod, summed over the containers."""
    totals: dict[str, int] = {}
    for i, container in enumerate(pod_spec.get("containers") or ()):
        resources = container.get("resources") or {}
        amounts = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for name, value in amounts.items():
            if name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX):
                where = f"{path}.containers[{i}].resources[{name!r}]"
                totals[name] = totals.get(name, 0) + _quantity(value, where)
    return {name: count for name, count in totals.items() if count > 0}


def _resource_claim(
    name: str, namespace: str, gpus: Mapping[str, int], nvlink: bool, path: str
) -> ResourceClaim | None:
    specs = []
    for resource, count in sorted(gpus.items()):
        if resource == GPU_RESOURCE:
            specs.append(RequestSpec("gpus", count, (DeviceChoice(),)))
            continue
        profile = resource.removeprefix(MIG_RESOURCE_PREFIX)
        if not is_mig_profile(profile):
            raise InvalidArgument.at(path, f"{resource}: {profile!r} is not a MIG profile")
        specs.append(
            RequestSpec(
                f"mig-{re.sub(r'[^a-z0-9]+', '-', profile)}",
                count,
                (DeviceChoice(mig_profile=profile),),
            )
        )
    if not specs:
        return None
    whole = any(s.name == "gpus" for s in specs)
    return build_claim(name, specs, namespace=namespace, nvlink=nvlink and whole)


def _template_claims(
    pod_spec: Mapping[str, Any], namespace: str, prefix: str, read: TemplateReader, path: str
) -> list[ResourceClaim]:
    claims = []
    for i, entry in enumerate(pod_spec.get("resourceClaims") or ()):
        where = f"{path}.resourceClaims[{i}]"
        if entry.get("resourceClaimName"):
            raise InvalidArgument.at(
                where,
                f"claim {entry['resourceClaimName']!r} is shared by name; gpualloc admits "
                "per-pod claims (resourceClaimTemplateName) only",
            )
        template_name = entry.get("resourceClaimTemplateName")
        if not template_name:
            continue
        template = read(namespace, template_name)
        if template is None:
            raise InvalidArgument.at(
                where, f"ResourceClaimTemplate {namespace}/{template_name} not found"
            )
        decoded = decode_object(template, f"ResourceClaimTemplate {namespace}/{template_name}")
        assert isinstance(decoded, ResourceClaim)
        claims.append(
            replace(decoded, name=f"{prefix}-{entry.get('name', i)}", namespace=namespace)
        )
    return claims


def node_selector_of(pod_spec: Mapping[str, Any]) -> NodeSelector | None:
    """The pod template's nodeSelector as a NodeSelector over node labels (None when empty)."""
    labels = pod_spec.get("nodeSelector") or {}
    if not labels:
        return None
    requirements = tuple(
        NodeSelectorRequirement(str(k), "In", (str(v),)) for k, v in sorted(labels.items())
    )
    return NodeSelector((NodeSelectorTerm(match_expressions=requirements),))


def with_node_labels(
    selector: NodeSelector | None, labels: Mapping[str, str]
) -> NodeSelector | None:
    """`selector` AND "the node has `labels`" (what Kueue adds to a pod set's pods from the
    ResourceFlavors it assigned: their nodeLabels)."""
    if not labels:
        return selector
    required = tuple(
        NodeSelectorRequirement(str(k), "In", (str(v),)) for k, v in sorted(labels.items())
    )
    terms = selector.node_selector_terms if selector is not None else (NodeSelectorTerm(),)
    return NodeSelector(
        tuple(
            NodeSelectorTerm(
                match_expressions=(*term.match_expressions, *required),
                match_fields=term.match_fields,
            )
            for term in terms
        )
    )


def pod_set_claims(
    workload: Workload, pod_set: PodSet, index: int, read: TemplateReader
) -> PodSetClaims | None:
    """The pod set's claims (None when its pods ask for no GPU)."""
    path = f"spec.podSets[{index}].template.spec"
    spec = pod_set.pod_spec
    nvlink = str(pod_set.annotations.get(NVLINK_ANNOTATION, "")).lower() in _TRUE
    gpus = _container_gpus(spec, path)
    claims: list[ResourceClaim] = []
    for pod in range(pod_set.count):
        prefix = f"{workload.name}-{pod_set.name}-{pod}"
        own = _resource_claim(f"{prefix}-gpu", workload.namespace, gpus, nvlink, path)
        claims.extend([own] if own is not None else [])
        claims.extend(_template_claims(spec, workload.namespace, prefix, read, path))
    if not claims:
        return None
    return PodSetClaims(pod_set.name, pod_set.count, tuple(claims), node_selector_of(spec))


def workload_claims(workload: Workload, read: TemplateReader) -> list[PodSetClaims]:
    """Every pod set that asks for GPUs, in spec order."""
    found = []
    for index, pod_set in enumerate(workload.pod_sets):
        claims = pod_set_claims(workload, pod_set, index, read)
        if claims is not None:
            found.append(claims)
    return found
