"""parse.allocation_result_from_dict: a claim's status.allocation on its own, decoded exactly as
inside a ResourceClaim, with the same field paths and descriptions."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from services.common.dra.model import ConfigSource, DeviceID, ResourceClaim, TaintEffect
from services.common.dra.parse import allocation_result_from_dict, load_objects
from services.common.dra.quantity import Quantity
from services.common.dra.serialize import allocation_result_to_dict
from services.common.errors import InvalidArgument

BAD_REF = (
    "must be the name of a request in the claim or the name of a request and a subrequest "
    "separated by '/'"
)

# The status.allocation of `kubectl get resourceclaim -o yaml` (allocationTimestamp included).
ALLOCATION_YAML = """\
allocationTimestamp: "2025-09-01T10:00:01Z"
devices:
  config:
  - opaque:
      driver: gpu.nvidia.com
      parameters:
        apiVersion: resource.nvidia.com/v1beta1
        kind: GpuConfig
        sharing:
          strategy: TimeSlicing
    requests:
    - gpus
    source: FromClass
  results:
  - device: gpu-0
    driver: gpu.nvidia.com
    pool: node-1
    request: gpus
    consumedCapacity:
      memory: 40Gi
    shareID: 4b2d6f0c-7e3c-4a55-9c55-3d0f3c1a2b4e
    tolerations:
    - effect: NoSchedule
      key: example.com/maintenance
      operator: Exists
  - device: gpu-0-mig-1g5gb-19-0
    driver: gpu.nvidia.com
    pool: node-1
    request: extra/small
nodeSelector:
  nodeSelectorTerms:
  - matchFields:
    - key: metadata.name
      operator: In
      values:
      - node-1
"""
CLAIM_YAML = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: two-gpus, namespace: ml}
spec:
  devices:
    requests:
    - name: gpus
      exactly: {deviceClassName: gpu.nvidia.com}
    - name: extra
      firstAvailable:
      - {name: small, deviceClassName: mig.nvidia.com}
status:
  allocation:
"""


def allocation() -> dict[str, Any]:
    data = yaml.safe_load(ALLOCATION_YAML)
    assert isinstance(data, dict)
    return data


def result(data: dict[str, Any], index: int = 0) -> dict[str, Any]:
    item = data["devices"]["results"][index]
    assert isinstance(item, dict)
    return item


def test_decodes_every_field() -> None:
    decoded = allocation_result_from_dict(allocation())
    assert [r.device_id for r in decoded.results] == [
        DeviceID("gpu.nvidia.com", "node-1", "gpu-0"),
        DeviceID("gpu.nvidia.com", "node-1", "gpu-0-mig-1g5gb-19-0"),
    ]
    first = decoded.results[0]
    assert first.consumed_capacity == {"memory": Quantity.parse("40Gi")}
    assert first.share_id == "4b2d6f0c-7e3c-4a55-9c55-3d0f3c1a2b4e"
    assert [t.effect for t in first.tolerations] == [TaintEffect.NO_SCHEDULE]
    assert decoded.results[1].request == "extra/small"
    assert [(c.source, c.requests) for c in decoded.config] == [
        (ConfigSource.FROM_CLASS, ("gpus",))
    ]
    assert decoded.config[0].opaque.parameters["sharing"] == {"strategy": "TimeSlicing"}
    assert decoded.node_selector is not None
    assert decoded.node_selector.node_selector_terms[0].match_fields[0].values == ("node-1",)


def test_same_as_inside_a_resource_claim() -> None:
    indented = "".join(f"    {line}\n" for line in ALLOCATION_YAML.splitlines())
    (claim,) = load_objects(CLAIM_YAML + indented)
    assert isinstance(claim, ResourceClaim)
    assert claim.allocation == allocation_result_from_dict(allocation())


def test_inverts_the_shared_serializer() -> None:
    decoded = allocation_result_from_dict(allocation())
    assert allocation_result_from_dict(allocation_result_to_dict(decoded)) == decoded


def test_reads_json_too() -> None:
    text = json.dumps(allocation())
    assert allocation_result_from_dict(json.loads(text)) == allocation_result_from_dict(
        allocation()
    )


def set_driver(data: dict[str, Any]) -> None:
    result(data)["driver"] = "GPU!"


def drop_device(data: dict[str, Any]) -> None:
    del result(data, 1)["device"]


def results_as_object(data: dict[str, Any]) -> None:
    data["devices"]["results"] = {"device": "gpu-0"}


def unknown_source(data: dict[str, Any]) -> None:
    data["devices"]["config"][0]["source"] = "FromNowhere"


def bad_quantity(data: dict[str, Any]) -> None:
    result(data)["consumedCapacity"]["memory"] = "40 gigs"


def three_segment_request(data: dict[str, Any]) -> None:
    result(data)["request"] = "extra/small/tiny"


def empty_parameters(data: dict[str, Any]) -> None:
    data["devices"]["config"][0]["opaque"]["parameters"] = {}


def node_selector_without_values(data: dict[str, Any]) -> None:
    data["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] = []


Change = Callable[[dict[str, Any]], None]

# change -> (path, description prefix, whether check=False still rejects it: shape errors do)
INVALID: dict[str, tuple[Change, str, str, bool]] = {
    "driver-not-a-domain": (
        set_driver,
        "status.allocation.devices.results[0].driver",
        'Invalid value: "GPU!": a lowercase RFC 1123 subdomain',
        False,
    ),
    "missing-device": (
        drop_device,
        "status.allocation.devices.results[1].device",
        "Required value",
        False,
    ),
    "request-with-two-slashes": (
        three_segment_request,
        "status.allocation.devices.results[0].request",
        f'Invalid value: "extra/small/tiny": {BAD_REF}',
        False,
    ),
    "empty-opaque-parameters": (
        empty_parameters,
        "status.allocation.devices.config[0].opaque.parameters",
        "Required value",
        False,
    ),
    "field-selector-without-values": (
        node_selector_without_values,
        "status.allocation.nodeSelector.nodeSelectorTerms[0].matchFields[0].values",
        "Required value: must be only one value when `operator` is 'In' or 'NotIn' for node "
        "field selector",
        False,
    ),
    "results-not-a-list": (
        results_as_object,
        "status.allocation.devices.results",
        "must be a list, got an object",
        True,
    ),
    "unknown-config-source": (
        unknown_source,
        "status.allocation.devices.config[0].source",
        'Unsupported value: "FromNowhere": supported values: "FromClaim", "FromClass"',
        True,
    ),
    "malformed-consumed-capacity": (
        bad_quantity,
        'status.allocation.devices.results[0].consumedCapacity["memory"]',
        'Invalid value: "40 gigs": ',
        True,
    ),
}


@pytest.mark.parametrize(
    ("change", "path", "description", "is_shape_error"),
    [pytest.param(*case, id=name) for name, case in INVALID.items()],
)
def test_invalid_allocation(
    change: Change, path: str, description: str, is_shape_error: bool
) -> None:
    data = allocation()
    change(data)
    with pytest.raises(InvalidArgument) as caught:
        allocation_result_from_dict(data)
    first = caught.value.violations[0]
    assert first.path == path
    assert first.description.startswith(description)
    assert caught.value.message.startswith(f"{path}: {description}")
    if is_shape_error:
        with pytest.raises(InvalidArgument, match=re.escape(path)):
            allocation_result_from_dict(data, check=False)
    else:
        assert allocation_result_from_dict(data, check=False).results


def test_paths_start_at_the_given_path() -> None:
    data = allocation()
    drop_device(data)
    with pytest.raises(InvalidArgument) as caught:
        allocation_result_from_dict(data, path="allocations[0]")
    assert caught.value.violations[0].path == "allocations[0].devices.results[1].device"


def test_every_violation_is_reported() -> None:
    data = allocation()
    set_driver(data)
    drop_device(data)
    with pytest.raises(InvalidArgument) as caught:
        allocation_result_from_dict(data)
    assert [v.path for v in caught.value.violations] == [
        "status.allocation.devices.results[0].driver",
        "status.allocation.devices.results[1].device",
    ]
    assert caught.value.message.endswith("(and 1 more)")


@pytest.mark.parametrize(
    ("data", "description"),
    [
        pytest.param([], "must be an object, got a list", id="a-list"),
        pytest.param("results", "must be an object, got a string", id="a-string"),
    ],
)
def test_not_an_object(data: Any, description: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        allocation_result_from_dict(data)
    assert (caught.value.violations[0].path, caught.value.violations[0].description) == (
        "status.allocation",
        description,
    )


def test_empty_allocation_is_valid() -> None:
    decoded = allocation_result_from_dict({})
    assert (decoded.results, decoded.config, decoded.node_selector) == ((), (), None)


def test_input_is_not_modified() -> None:
    data = allocation()
    before = copy.deepcopy(data)
    allocation_result_from_dict(data)
    assert data == before
