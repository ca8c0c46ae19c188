"""The topology-constraints annotation: format, parse, and the request fields it becomes."""

from __future__ import annotations

import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from protos.common.v1 import topology_pb2
from services.client.topology import (
    ANNOTATION,
    TopologyConstraint,
    TopologyKind,
    format_annotation,
    parse_annotation,
    to_pb_topology_constraints,
)
from services.common.dra.model import DeviceRequest, ExactDeviceRequest, ResourceClaim
from services.common.errors import InvalidArgument


@pytest.mark.parametrize(
    "constraints",
    [
        pytest.param([TopologyConstraint(TopologyKind.NVLINK_CONNECTED)], id="nvlink"),
        pytest.param(
            [TopologyConstraint(TopologyKind.NVLINK_CONNECTED, ("gpus",), False, 4)],
            id="preferred-nvlink-with-links",
        ),
        pytest.param(
            [
                TopologyConstraint(TopologyKind.SAME_NUMA_NODE),
                TopologyConstraint(TopologyKind.GPU_NIC_AFFINITY, max_nic_relation="PIX"),
            ],
            id="numa-and-nic",
        ),
    ],
)
def test_annotation_round_trips(constraints):
    assert list(parse_annotation(format_annotation(constraints))) == constraints


@pytest.mark.parametrize(
    ("text", "path"),
    [
        pytest.param("not json", "", id="not-json"),
        pytest.param('{"kind": "NVLinkConnected"}', "", id="not-a-list"),
        pytest.param('[{"kind": "Rack"}]', "[0].kind", id="unknown-kind"),
        pytest.param(
            '[{"kind": "NVLinkConnected", "minNVLinks": 0}]', "[0].minNVLinks", id="zero-links"
        ),
        pytest.param('[{"kind": "NVLinkConnected", "color": 1}]', "[0].color", id="unknown-field"),
        pytest.param(
            '[{"kind": "SameNUMANode", "requests": [""]}]', "[0].requests", id="empty-name"
        ),
        pytest.param(
            '[{"kind": "GPUNICAffinity", "maxNICRelation": "FAR"}]',
            "[0].maxNICRelation",
            id="unknown-nic-relation",
        ),
        pytest.param(
            '[{"kind": "SamePCIeRoot", "enforcement": "Maybe"}]',
            "[0].enforcement",
            id="bad-enforcement",
        ),
    ],
)
def test_malformed_annotations_name_the_field(text, path):
    with pytest.raises(InvalidArgument) as raised:
        parse_annotation(text, "a")
    assert raised.value.field_path == f"a{path}"


def claim(name: str, annotation: str | None, *requests: str) -> ResourceClaim:
    return ResourceClaim(
        name=name,
        requests=tuple(
            DeviceRequest(r, exactly=ExactDeviceRequest("gpu.nvidia.com")) for r in requests
        ),
        annotations={ANNOTATION: annotation} if annotation else {},
    )


def test_annotations_become_request_topology_constraints():
    claims = [
        claim("train", '[{"kind": "NVLinkConnected", "minNVLinks": 2}]', "a", "b"),
        claim("eval", None, "gpus"),
        claim(
            "infer",
            '[{"kind": "GPUNICAffinity", "requests": ["x"], "enforcement": "Preferred"}]',
            "x",
        ),
    ]
    messages = to_pb_topology_constraints(claims)
    assert messages == [
        pb.TopologyConstraint(
            requests=[
                pb.RequestRef(claim="train", request="a"),
                pb.RequestRef(claim="train", request="b"),
            ],
            kind=pb.TOPOLOGY_CONSTRAINT_KIND_NVLINK_CONNECTED,
            enforcement=pb.ENFORCEMENT_REQUIRED,
            min_nvlink_links=2,
        ),
        pb.TopologyConstraint(
            requests=[pb.RequestRef(claim="infer", request="x")],
            kind=pb.TOPOLOGY_CONSTRAINT_KIND_GPU_NIC_AFFINITY,
            enforcement=pb.ENFORCEMENT_PREFERRED,
            min_nvlink_links=1,
            max_nic_relation=topology_pb2.PCIE_RELATION_PXB,
        ),
    ]
