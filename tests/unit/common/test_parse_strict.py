"""Strict decoding (_schema.py): a field the 1.34 API lacks is reported as unknown, by its path
and line, with the closest known name, as kubectl's strict validation does; fields the API has
but gpualloc ignores still pass, and objects read back from a server are decoded leniently."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass

import pytest

from services.common.dra.model import Node, ResourceClaim, ResourceSlice
from services.common.dra.parse import decode_object, load_objects
from services.common.errors import InvalidArgument

CLAIM = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: typo
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        {field}: gpu.nvidia.com
"""

SLICE = """\
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: node-1-gpu
spec:
  driver: gpu.nvidia.com
  nodeName: node-1
  pool: {{name: node-1, generation: 1, resourceSliceCount: 1}}
  devices:
  - name: gpu-0
    attributes:
      productName: {{{attribute}: NVIDIA H100 80GB HBM3}}
    capacity:
      memory: {{value: 80Gi}}
"""


@dataclass(frozen=True)
class Unknown:
    text: str
    message: str  # the whole error message after `<source>:`
    path: str  # the violation's field path (gRPC's BadRequest carries it)


UNKNOWN = {
    "claim-exactly-typo": Unknown(
        CLAIM.format(field="deviceClasName"),
        'in.yaml:10: document 1 (ResourceClaim "typo"): unknown field '
        '"spec.devices.requests[0].exactly.deviceClasName" (did you mean "deviceClassName"?)',
        "spec.devices.requests[0].exactly.deviceClasName",
    ),
    "claim-field-nothing-like-a-known-one": Unknown(
        CLAIM.format(field="zzz"),
        'in.yaml:10: document 1 (ResourceClaim "typo"): unknown field '
        '"spec.devices.requests[0].exactly.zzz"',
        "spec.devices.requests[0].exactly.zzz",
    ),
    "slice-attribute-value-typo": Unknown(
        SLICE.format(attribute="strng"),
        'in.yaml:12: document 1 (ResourceSlice "node-1-gpu"): unknown field '
        '"spec.devices[0].attributes["productName"].strng" (did you mean "string"?)',
        'spec.devices[0].attributes["productName"].strng',
    ),
    "class-spec-misspelt": Unknown(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: c}\n"
        "specs: {selectors: []}\n",
        'in.yaml:4: document 1 (DeviceClass "c"): unknown field "specs" (did you mean "spec"?)',
        "specs",
    ),
    "template-inner-spec-typo": Unknown(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: t}\n"
        "spec:\n  spec:\n    devices:\n      request: []\n",
        'in.yaml:7: document 1 (ResourceClaimTemplate "t"): unknown field '
        '"spec.spec.devices.request" (did you mean "requests"?)',
        "spec.spec.devices.request",
    ),
    "metadata-typo-in-a-list-item": Unknown(
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n"
        "  metadata: {name: n, lables: {a: b}}\n",
        'in.yaml:6: document 1, items[0] (Node "n"): unknown field "metadata.lables" '
        '(did you mean "labels"?)',
        "metadata.lables",
    ),
    "json-allocation-typo": Unknown(
        json.dumps(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "done"},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                        ]
                    }
                },
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {
                                    "request": "gpu",
                                    "driver": "gpu.nvidia.com",
                                    "pool": "p",
                                    "devices": "d",
                                }
                            ]
                        }
                    }
                },
            },
            indent=2,
        ),  # fmt: skip
        'in.yaml:27: document 1 (ResourceClaim "done"): unknown field '
        '"status.allocation.devices.results[0].devices" (did you mean "device"?)',
        "status.allocation.devices.results[0].devices",
    ),
}


@pytest.mark.parametrize("case", UNKNOWN.values(), ids=UNKNOWN.keys())
def test_unknown_fields_are_named_with_their_line_and_the_closest_known_field(
    case: Unknown,
) -> None:
    with pytest.raises(InvalidArgument) as info:
        load_objects(case.text, "in.yaml")

    assert info.value.message == case.message
    assert [v.path for v in info.value.violations] == [case.path]


def test_many_unknown_fields_are_capped_and_counted() -> None:
    fields = "".join(f"  extra{i}: 1\n" for i in range(25))
    text = "apiVersion: v1\nkind: Node\nmetadata: {name: n}\n" + textwrap.dedent(fields)

    with pytest.raises(InvalidArgument) as info:
        load_objects(text, "in.yaml")

    violations = info.value.violations
    assert len(violations) == 21
    assert str(violations[-1]) == "and 5 more unknown fields"
    assert info.value.message.endswith("(and 20 more)")


ACCEPTED = {
    # fields of the 1.34 API, modelled or not: accepted, as the API server accepts them
    "slice-alpha-fields": SLICE.format(attribute="string").replace(
        "  - name: gpu-0\n",
        "  - name: gpu-0\n    bindsToNode: true\n    allowMultipleAllocations: true\n"
        "    bindingConditions: [ready]\n",
    ),
    "claim-status-reserved-for-and-devices": CLAIM.format(field="deviceClassName")
    + "status:\n  reservedFor: [{resource: pods, name: p, uid: u}]\n  devices: []\n",
    "node-spec-and-status-as-kubectl-prints-them": (
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: n\n  annotations: {a: b}\n"
        "spec:\n  podCIDR: 10.0.0.0/24\n  taints: [{key: k, effect: NoSchedule}]\n"
        "status:\n  capacity: {nvidia.com/gpu: '8'}\n  nodeInfo: {kubeletVersion: v1.34.1}\n"
    ),
}


@pytest.mark.parametrize("text", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_fields_of_the_api_that_gpualloc_ignores_are_accepted(text: str) -> None:
    [obj] = load_objects(text, "in.yaml")
    assert isinstance(obj, ResourceSlice | ResourceClaim | Node)


def test_objects_read_back_from_a_server_ignore_unknown_fields() -> None:
    """A newer API server may send fields 1.34 lacks: a watch must not stop on them."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "from-1-36"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "someFutureField": True}}]}},
    }  # fmt: skip
    obj = decode_object(claim)
    assert isinstance(obj, ResourceClaim)
    assert obj.requests[0].exactly is not None
    assert obj.requests[0].exactly.device_class_name == "gpu.nvidia.com"
