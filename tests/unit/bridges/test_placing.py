"""The NVLink fallback's rules: which nodes are fully meshed, and the node selector it sends."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.bridges.placing import (
    _restrict,
    kueue_owner_of,
    needs_nvlink,
    nvlink_meshed_nodes,
    slurm_job_of,
)
from services.client.specs import claim_from_spec
from services.common.dra.model import NodeSelector, NodeSelectorRequirement, NodeSelectorTerm
from tests.unit.bridges.support import example_nodes


def test_only_fully_meshed_nodes_qualify():
    assert nvlink_meshed_nodes(example_nodes()) == ["h100-node-1", "h100-node-2"]


def test_a_partial_mesh_does_not_qualify():
    h100 = next(n for n in example_nodes() if n.name == "h100-node-1")
    partial = replace(h100, nvlinks=h100.nvlinks[1:])
    assert nvlink_meshed_nodes([partial]) == []


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param("4 x h100 nvlink", True, id="nvlink"),
        pytest.param("4 x h100", False, id="no-nvlink"),
        pytest.param("1 x h100 nvlink", False, id="single-gpu-needs-none"),
    ],
)
def test_needs_nvlink(spec, expected):
    assert needs_nvlink([claim_from_spec(spec)]) is expected


def test_restrict_ands_each_term_with_one_name_per_term():
    label = NodeSelectorRequirement("nvidia.com/gpu.product", "In", ("NVIDIA-H100-80GB-HBM3",))
    selector = NodeSelector((NodeSelectorTerm(match_expressions=(label,)),))
    restricted = _restrict(selector, ["h100-node-1", "h100-node-2"])
    assert restricted == NodeSelector(
        tuple(
            NodeSelectorTerm(
                match_expressions=(label,),
                match_fields=(NodeSelectorRequirement("metadata.name", "In", (name,)),),
            )
            for name in ("h100-node-1", "h100-node-2")
        )
    )


@pytest.mark.parametrize(
    ("owner", "job", "workload"),
    [
        pytest.param("slurm/job/7001", "7001", None, id="a-slurm-job"),
        pytest.param("hpc/slurm/job/7001", "7001", None, id="a-slurm-job-under-a-policy"),
        pytest.param("slurm/job/", None, None, id="a-slurm-owner-without-a-job"),
        pytest.param("kueue/team-a/w", None, "kueue/team-a/w", id="a-workload"),
        pytest.param(
            "team-c/kueue/team-a/w", None, "kueue/team-a/w", id="a-workload-under-a-policy"
        ),
        pytest.param("team-c/job/kueue/w", None, None, id="kueue-further-down-is-not-ours"),
        pytest.param("a/b/slurm/job/1", None, None, id="two-prefixes-are-not-ours"),
        pytest.param("team-a/train", None, None, id="a-direct-client"),
    ],
)
def test_a_bridges_owner_is_known_with_or_without_its_tenant(
    owner: str, job: str | None, workload: str | None
) -> None:
    assert slurm_job_of(owner) == job
    assert kueue_owner_of(owner) == workload
