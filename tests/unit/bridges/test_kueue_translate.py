"""Workload pod sets -> claims, on Kueue's documented Jobs and the bridge's examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.bridges.kueue.memory_api import workload_for_job
from services.bridges.kueue.objects import Workload
from services.bridges.kueue.translate import node_selector_of, with_node_labels, workload_claims
from services.client.topology import ANNOTATION
from services.common.dra.model import NodeSelector, NodeSelectorRequirement, NodeSelectorTerm
from services.common.errors import InvalidArgument
from tests.unit.bridges.support import DATA, ROOT, documents, solve

KUEUE = DATA / "kueue"
EXAMPLES = ROOT / "examples" / "bridges" / "kueue"


def workload_and_templates(path: Path) -> tuple[Workload, dict[tuple[str, str], dict[str, Any]]]:
    templates = {}
    workload = None
    for document in documents(path):
        if document["kind"] == "Job":
            workload = Workload.from_dict(workload_for_job(document, name="wl"))
        elif document["kind"] == "ResourceClaimTemplate":
            meta = document["metadata"]
            templates[(meta["namespace"], meta["name"])] = document
    assert workload is not None
    return workload, templates


def claims_of(path: Path):
    workload, templates = workload_and_templates(path)
    return workload_claims(workload, lambda ns, name: templates.get((ns, name)))


def test_documented_gpu_job_becomes_one_claim_per_pod():
    (unit,) = claims_of(KUEUE / "sample-job.yaml")
    assert (unit.pod_set, unit.count) == ("main", 3)
    assert [c.name for c in unit.claims] == ["wl-main-0-gpu", "wl-main-1-gpu", "wl-main-2-gpu"]
    assert all(c.requests[0].exactly.count == 1 for c in unit.claims)
    assert unit.node_selector is None


def test_documented_dra_job_uses_its_template():
    (unit,) = claims_of(KUEUE / "sample-dra-rct-job.yaml")
    (claim,) = unit.claims
    assert claim.name == "wl-main-0-gpu" and claim.namespace == "default"
    assert claim.requests[0].exactly.device_class_name == "gpu.example.com"


def test_cpu_only_workload_needs_no_gpus():
    (workload_doc,) = documents(KUEUE / "workload-sample-job.yaml")
    assert workload_claims(Workload.from_dict(workload_doc), lambda ns, n: None) == []


@pytest.mark.parametrize(
    ("example", "count", "node_prefix", "device_part"),
    [
        pytest.param("mig-inference-job.yml", 3, "a100-node", "-mig-1g10gb-", id="mig-resource"),
        pytest.param(
            "dra-template-job.yml", 1, "a100-node", "-mig-2g10gb-", id="template-first-available"
        ),
    ],
)
def test_example_jobs_allocate_on_the_example_cluster(
    example, count, node_prefix, device_part, tmp_path
):
    (unit,) = claims_of(EXAMPLES / example)
    code, report = solve(unit.claims, tmp_path)
    assert code == 0, report
    assert report["node"].startswith(node_prefix)
    results = [r for c in report["claims"] for r in c["allocation"]["devices"]["results"]]
    assert len(results) == count and all(device_part in r["device"] for r in results)


def test_nvlink_annotation_and_node_selector_carry_over():
    (unit,) = claims_of(EXAMPLES / "h100-nvlink-job.yml")
    assert ANNOTATION in unit.claims[0].annotations
    requirement = NodeSelectorRequirement(
        "nvidia.com/gpu.product", "In", ("NVIDIA-H100-80GB-HBM3",)
    )
    assert unit.node_selector == NodeSelector((NodeSelectorTerm(match_expressions=(requirement,)),))


def pod_spec(**spec: Any) -> dict[str, Any]:
    return {"containers": [{"name": "c", "resources": {}}], **spec}


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        pytest.param(
            pod_spec(resourceClaims=[{"name": "gpu", "resourceClaimName": "shared"}]),
            "spec.podSets[0].template.spec.resourceClaims[0]",
            id="shared-claim",
        ),
        pytest.param(
            pod_spec(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "missing"}]),
            "spec.podSets[0].template.spec.resourceClaims[0]",
            id="missing-template",
        ),
        pytest.param(
            {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1.5"}}}]},
            "spec.podSets[0].template.spec.containers[0].resources['nvidia.com/gpu']",
            id="fractional-gpu",
        ),
        pytest.param(
            {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-big": 1}}}]},
            "spec.podSets[0].template.spec",
            id="not-a-mig-profile",
        ),
    ],
)
def test_untranslatable_pod_sets_name_the_field(spec, path):
    workload = Workload.from_dict(
        {
            "kind": "Workload",
            "metadata": {"name": "w", "namespace": "ns"},
            "spec": {"podSets": [{"name": "main", "count": 1, "template": {"spec": spec}}]},
        }
    )
    with pytest.raises(InvalidArgument) as raised:
        workload_claims(workload, lambda ns, name: None)
    assert raised.value.field_path == path


def test_empty_node_selector_is_none():
    assert node_selector_of({}) is None


def _term(*labels: tuple[str, str]) -> NodeSelectorTerm:
    return NodeSelectorTerm(
        match_expressions=tuple(NodeSelectorRequirement(k, "In", (v,)) for k, v in labels)
    )


HOPPER = {"nvidia.com/gpu.family": "hopper"}
PRODUCT = ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        pytest.param(None, {}, None, id="no-flavor-labels-no-selector"),
        pytest.param(NodeSelector((_term(PRODUCT),)), {}, NodeSelector((_term(PRODUCT),)),
                     id="no-flavor-labels-keep-the-selector"),
        pytest.param(None, HOPPER, NodeSelector((_term(("nvidia.com/gpu.family", "hopper")),)),
                     id="the-flavors-labels-alone"),
        pytest.param(
            NodeSelector((_term(PRODUCT),)),
            HOPPER,
            NodeSelector((_term(PRODUCT, ("nvidia.com/gpu.family", "hopper")),)),
            id="anded-with-the-pod-sets-selector",
        ),
        pytest.param(
            NodeSelector((_term(PRODUCT), _term(("zone", "a")))),
            HOPPER,
            NodeSelector(
                (
                    _term(PRODUCT, ("nvidia.com/gpu.family", "hopper")),
                    _term(("zone", "a"), ("nvidia.com/gpu.family", "hopper")),
                )
            ),
            id="anded-into-every-term",
        ),
    ],
)  # fmt: skip
def test_a_flavors_node_labels_narrow_the_pod_sets_nodes(selector, labels, expected):
    assert with_node_labels(selector, labels) == expected
