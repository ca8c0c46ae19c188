"""parse.py: every input shape kubectl produces, and exact error locations for bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common.dra.model import (
    AllocationMode,
    AttributeType,
    AttributeValue,
    DeviceClass,
    Node,
    ResourceClaim,
    ResourceSlice,
    TaintEffect,
)
from services.common.dra.parse import decode_object, load_files, load_objects, read_text
from services.common.dra.quantity import Quantity
from services.common.errors import InvalidArgument, ParseError

DATA = Path(__file__).parents[2] / "data" / "resourceslices"
T4_SLICE = DATA / "openshift-v1.35_2x-tesla-t4_condensed.yaml"
T4_NAME = "harpatil4220c-g9kfm-gpu-c-rd8r8-gpu.nvidia.com-wvrlc"
T4_TEXT = T4_SLICE.read_text()
BAD_REF = (
    "must be the name of a request in the claim or the name of a request and a subrequest "
    "separated by '/'"
)

# What `kubectl get resourceclaim two-gpus -o yaml` prints after allocation (noise included).
CLAIM_YAML = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  creationTimestamp: "2025-09-01T10:00:00Z"
  finalizers:
  - resource.kubernetes.io/delete-protection
  managedFields:
  - apiVersion: resource.k8s.io/v1
    fieldsType: FieldsV1
    fieldsV1:
      f:spec:
        f:devices: {}
    manager: kubectl-create
    operation: Update
    time: "2025-09-01T10:00:00Z"
  name: two-gpus
  namespace: ml
  resourceVersion: "12345"
  uid: 7d6f0c7e-3c1a-4a55-9c55-3d0f3c1a2b4e
spec:
  devices:
    constraints:
    - matchAttribute: resource.kubernetes.io/pcieRoot
      requests:
      - gpus
    requests:
    - exactly:
        allocationMode: ExactCount
        count: 2
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel:
            expression: device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('15Gi')) >= 0
        tolerations:
        - effect: NoSchedule
          key: example.com/maintenance
          operator: Exists
      name: gpus
    - firstAvailable:
      - deviceClassName: mig.nvidia.com
        name: small
      - allocationMode: All
        deviceClassName: gpu.nvidia.com
        name: any
      name: extra
status:
  allocation:
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
        pool: harpatil4220c-g9kfm-gpu-c-rd8r8
        request: gpus
      - device: gpu-1
        driver: gpu.nvidia.com
        pool: harpatil4220c-g9kfm-gpu-c-rd8r8
        request: gpus
      - device: gpu-0-mig-1g5gb-19-0
        driver: gpu.nvidia.com
        pool: harpatil4220c-g9kfm-gpu-c-rd8r8
        request: extra/small
    nodeSelector:
      nodeSelectorTerms:
      - matchFields:
        - key: metadata.name
          operator: In
          values:
          - harpatil4220c-g9kfm-gpu-c-rd8r8
  reservedFor:
  - name: trainer
    resource: pods
    uid: 0b6ef1a8-5b2e-4a7e-8f7e-5b1e2d3c4f5a
"""

DEVICE_CLASS_YAML = """\
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.nvidia.com
  labels:
    app.kubernetes.io/name: dra-driver-nvidia-gpu
spec:
  selectors:
  - cel:
      expression: >-
        device.driver == 'gpu.nvidia.com' &&
        device.attributes['gpu.nvidia.com'].type == 'gpu'
"""

NODE_YAML = """\
apiVersion: v1
kind: Node
metadata:
  name: harpatil4220c-g9kfm-gpu-c-rd8r8
  labels:
    kubernetes.io/hostname: harpatil4220c-g9kfm-gpu-c-rd8r8
    nvidia.com/gpu.present: "true"
status:
  capacity:
    cpu: "16"
"""

TEMPLATE_YAML = """\
apiVersion: resource.k8s.io/v1beta2
kind: ResourceClaimTemplate
metadata:
  name: one-gpu
  namespace: ml
spec:
  metadata:
    labels:
      team: research
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
"""


def t4_data() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(T4_TEXT)
    return data


def only(objects: list[Any], kind: type) -> Any:
    assert len(objects) == 1 and isinstance(objects[0], kind)
    return objects[0]


def failure(text: str, source: str = "in.yaml") -> InvalidArgument:
    with pytest.raises(InvalidArgument) as info:
        load_objects(text, source)
    return info.value


# --- the real sample ----------------------------------------------------------------------


def test_real_openshift_t4_slice() -> None:
    slice_ = only(load_files([T4_SLICE]), ResourceSlice)
    assert slice_.name == T4_NAME
    assert slice_.driver == "gpu.nvidia.com"
    assert slice_.node_name == "harpatil4220c-g9kfm-gpu-c-rd8r8"
    assert (slice_.pool.name, slice_.pool.generation, slice_.pool.resource_slice_count) == (
        "harpatil4220c-g9kfm-gpu-c-rd8r8",
        1,
        1,
    )
    assert slice_.api_version == "resource.k8s.io/v1"
    assert [d.name for d in slice_.devices] == ["gpu-0", "gpu-1"]
    gpu0, gpu1 = slice_.devices
    assert gpu0.capacity["memory"].value == Quantity.parse("15Gi")
    assert str(gpu0.capacity["memory"].value) == "15Gi"
    assert gpu0.attributes["resource.kubernetes.io/pciBusID"] == AttributeValue.string(
        "0000:00:04.0"
    )
    assert gpu1.attributes["resource.kubernetes.io/pciBusID"].value == "0000:00:05.0"
    assert gpu0.attributes["productName"] == AttributeValue.string("Tesla T4")
    assert gpu0.attributes["addressingMode"].value == "HMM"
    assert gpu0.attributes["cudaComputeCapability"] == AttributeValue.version("7.5.0")
    assert gpu0.attributes["driverVersion"] == AttributeValue(AttributeType.VERSION, "580.126.20")
    assert gpu1.attributes["uuid"].value == "GPU-204349eb-0405-e927-278b-8804172f1be3"
    assert len(gpu0.attributes) == 11 and not gpu0.taints and not gpu0.consumes_counters


# --- every input shape --------------------------------------------------------------------


def _as_list(kind: str, items: list[dict[str, Any]], api_version: str = "v1") -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "items": items,
        "metadata": {"resourceVersion": "9"},
    }


def _typed_list_items() -> list[dict[str, Any]]:
    item = t4_data()
    del item["apiVersion"], item["kind"]  # typed lists from the API omit them on items
    return [item]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(T4_TEXT, id="yaml-single"),
        pytest.param(yaml.safe_dump(_as_list("List", [t4_data()])), id="yaml-list"),
        pytest.param("---\n" + T4_TEXT + "---\n", id="yaml-stream-with-separators"),
        pytest.param(json.dumps(t4_data(), indent=4), id="json-single"),
        pytest.param(json.dumps(_as_list("List", [t4_data()])), id="json-list"),
        pytest.param(
            json.dumps(_as_list("ResourceSliceList", _typed_list_items(), "resource.k8s.io/v1")),
            id="json-typed-list-items-without-kind",
        ),
        pytest.param(
            T4_TEXT.replace("resource.k8s.io/v1", "resource.k8s.io/v1beta2"), id="v1beta2"
        ),
        pytest.param(
            "\n\n  " + json.dumps(t4_data()) + "\n", id="stdin-like-json-with-blank-lines"
        ),
    ],
)
def test_every_shape_yields_the_same_slice(text: str) -> None:
    slice_ = only(load_objects(text), ResourceSlice)
    assert slice_.name == T4_NAME
    assert [str(d.capacity["memory"].value) for d in slice_.devices] == ["15Gi", "15Gi"]


def test_v1beta2_keeps_its_api_version() -> None:
    text = T4_TEXT.replace("resource.k8s.io/v1", "resource.k8s.io/v1beta2")
    assert only(load_objects(text), ResourceSlice).api_version == "resource.k8s.io/v1beta2"


def test_v1beta1_devices_under_basic_are_converted() -> None:
    data = t4_data()
    data["apiVersion"] = "resource.k8s.io/v1beta1"
    data["spec"]["devices"] = [
        {"name": d["name"], "basic": {"attributes": d["attributes"], "capacity": d["capacity"]}}
        for d in data["spec"]["devices"]
    ]
    slice_ = only(load_objects(yaml.safe_dump(data)), ResourceSlice)
    assert slice_ == only(load_objects(T4_TEXT), ResourceSlice)
    assert slice_.api_version == "resource.k8s.io/v1"


def test_v1beta1_claim_requests_move_under_exactly() -> None:
    text = """\
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaim
metadata: {name: c, namespace: ml}
spec:
  devices:
    requests:
    - {name: gpu, deviceClassName: gpu.nvidia.com, allocationMode: ExactCount, count: 2}
    - name: either
      firstAvailable: [{name: big, deviceClassName: gpu.nvidia.com}]
"""
    claim = only(load_objects(text), ResourceClaim)
    assert claim.requests[0].exactly is not None and claim.requests[0].exactly.count == 2
    assert [s.name for s in claim.requests[1].first_available] == ["big"]


def test_multi_document_stream_of_mixed_kinds() -> None:
    text = "\n---\n".join([NODE_YAML, DEVICE_CLASS_YAML, T4_TEXT, CLAIM_YAML])
    objects = load_objects(text, "cluster.yaml")
    assert [type(o) for o in objects] == [Node, DeviceClass, ResourceSlice, ResourceClaim]


def test_concatenated_json_documents() -> None:
    node, device_class = yaml.safe_load(NODE_YAML), yaml.safe_load(DEVICE_CLASS_YAML)
    text = json.dumps(node) + "\n" + json.dumps(device_class, indent=2)
    assert [type(o) for o in load_objects(text)] == [Node, DeviceClass]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("   \n", id="blank"),
        pytest.param("---\n---\n", id="empty-documents"),
        pytest.param('{"apiVersion": "v1", "kind": "List", "items": []}', id="empty-list"),
    ],
)
def test_nothing_to_load(text: str) -> None:
    assert load_objects(text) == []


# --- each kind ----------------------------------------------------------------------------


def test_resource_claim_with_allocation() -> None:
    claim = only(load_objects(CLAIM_YAML), ResourceClaim)
    assert (claim.name, claim.namespace, claim.uid) == (
        "two-gpus",
        "ml",
        "7d6f0c7e-3c1a-4a55-9c55-3d0f3c1a2b4e",
    )
    gpus, extra = claim.requests
    assert gpus.exactly is not None
    assert (gpus.exactly.device_class_name, gpus.exactly.count) == ("gpu.nvidia.com", 2)
    assert gpus.exactly.allocation_mode is AllocationMode.EXACT_COUNT
    assert gpus.exactly.selectors[0].cel.startswith("device.capacity['gpu.nvidia.com'].memory")
    assert gpus.exactly.tolerations[0].effect is TaintEffect.NO_SCHEDULE
    assert [(s.name, s.allocation_mode) for s in extra.first_available] == [
        ("small", AllocationMode.EXACT_COUNT),
        ("any", AllocationMode.ALL),
    ]
    assert claim.constraints[0].match_attribute == "resource.kubernetes.io/pcieRoot"
    allocation = claim.allocation
    assert allocation is not None
    assert [str(r.device_id) for r in allocation.results] == [
        "gpu.nvidia.com/harpatil4220c-g9kfm-gpu-c-rd8r8/gpu-0",
        "gpu.nvidia.com/harpatil4220c-g9kfm-gpu-c-rd8r8/gpu-1",
        "gpu.nvidia.com/harpatil4220c-g9kfm-gpu-c-rd8r8/gpu-0-mig-1g5gb-19-0",
    ]
    assert allocation.results[2].request == "extra/small"
    assert allocation.config[0].opaque.parameters["sharing"] == {"strategy": "TimeSlicing"}
    assert allocation.node_selector is not None
    field = allocation.node_selector.node_selector_terms[0].match_fields[0]
    assert (field.key, field.operator, field.values) == (
        "metadata.name",
        "In",
        ("harpatil4220c-g9kfm-gpu-c-rd8r8",),
    )


def test_resource_claim_template_yields_its_claim() -> None:
    claim = only(load_objects(TEMPLATE_YAML), ResourceClaim)
    assert (claim.name, claim.namespace, claim.allocation) == ("one-gpu", "ml", None)
    assert claim.requests[0].exactly is not None
    assert claim.requests[0].exactly.device_class_name == "gpu.nvidia.com"
    assert claim.requests[0].exactly.count == 1  # the API default


def test_device_class() -> None:
    device_class = only(load_objects(DEVICE_CLASS_YAML), DeviceClass)
    assert device_class.name == "gpu.nvidia.com"
    assert device_class.labels == {"app.kubernetes.io/name": "dra-driver-nvidia-gpu"}
    assert device_class.selectors[0].cel == (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    )


def test_node() -> None:
    node = only(load_objects(NODE_YAML), Node)
    assert node == Node(
        "harpatil4220c-g9kfm-gpu-c-rd8r8",
        {
            "kubernetes.io/hostname": "harpatil4220c-g9kfm-gpu-c-rd8r8",
            "nvidia.com/gpu.present": "true",
        },
    )


def test_decode_object_takes_a_dict() -> None:
    assert decode_object(t4_data()) == only(load_objects(T4_TEXT), ResourceSlice)


def test_load_files_reads_in_order(tmp_path: Path) -> None:
    second = tmp_path / "node.yaml"
    second.write_text(NODE_YAML)
    assert [type(o) for o in load_files([T4_SLICE, str(second)])] == [ResourceSlice, Node]


def test_read_text_names_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(InvalidArgument, match=r"absent\.yaml: cannot read"):
        read_text(missing)


# --- errors: exact locations --------------------------------------------------------------


def test_error_message_names_file_line_document_object_and_field() -> None:
    bad = T4_TEXT.replace("productName: {string: Tesla T4}", "productName: {}", 1)
    error = failure(NODE_YAML + "---\n" + bad, "slices.yaml")
    assert error.message == (
        f'slices.yaml:32: document 2 (ResourceSlice "{T4_NAME}"): '
        'spec.devices[0].attributes["productName"]: '
        "must have exactly one of int, bool, string, version"
    )
    assert [v.path for v in error.violations] == ['spec.devices[0].attributes["productName"]']


def test_error_in_a_list_item_names_the_item() -> None:
    broken = t4_data()
    broken["spec"]["devices"][1]["name"] = "GPU_1"
    text = json.dumps(_as_list("List", [t4_data(), broken]), indent=2)
    error = failure(text, "slices.json")
    assert error.message.startswith("slices.json:"), error.message
    assert (
        f'document 1, items[1] (ResourceSlice "{T4_NAME}"): '
        'spec.devices[1].name: Invalid value: "GPU_1"' in error.message
    )


@pytest.mark.parametrize(
    ("old", "new", "path", "description"),
    [
        pytest.param(
            "productName: {string: Tesla T4}",
            "productName: {string: Tesla T4, version: 1.0.0}",
            'spec.devices[0].attributes["productName"]',
            "must have exactly one of int, bool, string, version",
            id="attribute-with-two-values",
        ),
        pytest.param(
            "brand: {string: Nvidia}",
            "brand: {int: Nvidia}",
            'spec.devices[0].attributes["brand"].int',
            "must be an integer, got a string",
            id="attribute-of-wrong-type",
        ),
        pytest.param(
            "driverVersion: {version: 580.126.20}",
            "driverVersion: {version: 580.126.020}",
            'spec.devices[0].attributes["driverVersion"].version',
            'Invalid value: "580.126.020": must be a string compatible with semver.org spec 2.0.0',
            id="version-not-semver",
        ),
        pytest.param(
            "driver: gpu.nvidia.com",
            "driver: 5",
            "spec.driver",
            "must be a string, got a number",
            id="driver-not-a-string",
        ),
        pytest.param(
            "memory: {value: 15Gi}",
            "memory: {value: 15GB}",
            'spec.devices[0].capacity["memory"].value',
            "Invalid value: \"15GB\": quantity '15GB' does not match the Kubernetes quantity "
            "grammar (e.g. '40Gi', '1.5', '100m', '1e3', '80G')",
            id="bad-quantity",
        ),
        pytest.param(
            "- name: gpu-1",
            "- name: gpu-0",
            "spec.devices[1].name",
            'Duplicate value: "gpu-0"',
            id="duplicate-device",
        ),
        pytest.param(
            "  nodeName: harpatil4220c-g9kfm-gpu-c-rd8r8\n",
            "  allNodes: false\n",
            "spec.allNodes",
            "Invalid value: false: must be either unset or set to true",
            id="all-nodes-false",
        ),
        pytest.param(
            "  nodeName: harpatil4220c-g9kfm-gpu-c-rd8r8\n",
            "",
            "spec",
            "Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
            "`perDeviceNodeSelection` is required",
            id="no-node-access",
        ),
        pytest.param(
            "resourceSliceCount: 1",
            "resourceSliceCount: 0",
            "spec.pool.resourceSliceCount",
            "Invalid value: 0: must be greater than zero",
            id="zero-slice-count",
        ),
        pytest.param(
            "  name: harpatil4220c-g9kfm-gpu-c-rd8r8-gpu.nvidia.com-wvrlc\n",
            "  labels: {a: b}\n",
            "metadata.name",
            "Required value",
            id="missing-name",
        ),
        pytest.param(
            "kind: ResourceSlice",
            "kind: Pod",
            "kind",
            'Unsupported value: "Pod": supported values: "DeviceClass", "Node", '
            '"ResourceClaim", "ResourceClaimTemplate", "ResourceSlice"',
            id="unknown-kind",
        ),
        pytest.param(
            "apiVersion: resource.k8s.io/v1",
            "apiVersion: resource.k8s.io/v1alpha3",
            "apiVersion",
            'Unsupported value: "resource.k8s.io/v1alpha3": supported values: '
            '"resource.k8s.io/v1", "resource.k8s.io/v1beta1", "resource.k8s.io/v1beta2"',
            id="unsupported-version",
        ),
        pytest.param("kind: ResourceSlice\n", "", "kind", "Required value", id="missing-kind"),
    ],
)
def test_invalid_slice(old: str, new: str, path: str, description: str) -> None:
    assert old in T4_TEXT
    error = failure(T4_TEXT.replace(old, new, 1))
    assert error.violations[0].path == path
    assert error.violations[0].description == description
    assert error.message.startswith("in.yaml")
    assert f"{path}: {description}" in error.message


def test_missing_spec() -> None:
    error = failure("apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s}\n")
    assert (error.violations[0].path, error.violations[0].description) == ("spec", "Required value")
    assert error.message == 'in.yaml:1: document 1 (ResourceSlice "s"): spec: Required value'


@pytest.mark.parametrize(
    ("old", "new", "path", "description"),
    [
        pytest.param(
            "        count: 2\n",
            "        count: 0\n",
            "spec.devices.requests[0].exactly.count",
            "Invalid value: 0: must be greater than zero",
            id="zero-count",
        ),
        pytest.param(
            "      - allocationMode: All\n",
            "      - allocationMode: All\n        count: 3\n",
            "spec.devices.requests[1].firstAvailable[1].count",
            "Invalid value: 3: must not be specified when allocationMode is 'All'",
            id="count-with-all",
        ),
        pytest.param(
            "allocationMode: ExactCount",
            "allocationMode: Some",
            "spec.devices.requests[0].exactly.allocationMode",
            'Unsupported value: "Some": supported values: "All", "ExactCount"',
            id="unknown-allocation-mode",
        ),
        pytest.param(
            "        request: extra/small\n",
            "        request: extra/large\n",
            "status.allocation.devices.results[2].request",
            f'Invalid value: "extra/large": {BAD_REF}',
            id="result-for-unknown-subrequest",
        ),
        pytest.param(
            "        source: FromClass\n",
            "        source: FromNowhere\n",
            "status.allocation.devices.config[0].source",
            'Unsupported value: "FromNowhere": supported values: "FromClaim", "FromClass"',
            id="unknown-config-source",
        ),
        pytest.param(
            "          operator: Exists\n",
            "          operator: Exists\n          value: x\n",
            "spec.devices.requests[0].exactly.tolerations[0].value",
            'Invalid value: "x": must be empty for operator `Exists`',
            id="exists-with-value",
        ),
        pytest.param(
            "      requests:\n      - gpus\n",
            "      requests:\n      - gpu\n",
            "spec.devices.constraints[0].requests[0]",
            f'Invalid value: "gpu": {BAD_REF}',
            id="constraint-on-unknown-request",
        ),
    ],
)
def test_invalid_claim(old: str, new: str, path: str, description: str) -> None:
    assert old in CLAIM_YAML
    error = failure(CLAIM_YAML.replace(old, new, 1))
    assert (error.violations[0].path, error.violations[0].description) == (path, description)
    assert f'(ResourceClaim "two-gpus"): {path}: {description}' in error.message


def test_invalid_template_uses_spec_spec_paths() -> None:
    error = failure(
        TEMPLATE_YAML.replace("deviceClassName: gpu.nvidia.com", "deviceClassName: GPU!")
    )
    assert error.violations[0].path == "spec.spec.devices.requests[0].exactly.deviceClassName"


def test_invalid_v1beta1_reports_v1_paths() -> None:
    text = """\
apiVersion: resource.k8s.io/v1beta1
kind: ResourceSlice
metadata: {name: s}
spec:
  driver: gpu.nvidia.com
  nodeName: n
  pool: {name: n, generation: 1, resourceSliceCount: 1}
  devices:
  - name: gpu-0
    basic:
      attributes:
        model: {string: a, int: 1}
"""
    assert failure(text).violations[0].path == 'spec.devices[0].attributes["model"]'


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        pytest.param("a: b\nc: [d\n", 3, "document 1: invalid YAML", id="unclosed-flow-sequence"),
        pytest.param(
            "kind: Node\n---\nmetadata:\n  name: x\n bad: indent\n",
            5,
            "document 2: invalid YAML",
            id="bad-indentation",
        ),
        pytest.param(
            '{"kind": "Node",\n "metadata": }', 2, "invalid JSON", id="json-missing-value"
        ),
    ],
)
def test_malformed_text_is_a_parse_error_with_line(text: str, line: int, fragment: str) -> None:
    with pytest.raises(ParseError) as info:
        load_objects(text, "bad.txt")
    assert (info.value.source, info.value.line) == ("bad.txt", line)
    assert info.value.message.startswith(f"bad.txt:{line}: ") and fragment in info.value.message


@pytest.mark.parametrize(
    ("text", "description"),
    [
        pytest.param(
            "- a\n- b\n",
            "must be a Kubernetes object (a mapping with apiVersion and kind), got a list",
            id="list",
        ),
        pytest.param(
            "just text\n",
            "must be a Kubernetes object (a mapping with apiVersion and kind), got a string",
            id="scalar",
        ),
    ],
)
def test_document_that_is_not_an_object(text: str, description: str) -> None:
    error = failure(text)
    assert error.violations[0].description == description
    assert error.message == f"in.yaml:1: document 1: {description}"


def test_every_violation_is_reported() -> None:
    text = T4_TEXT.replace("driver: gpu.nvidia.com", "driver: GPU_NVIDIA").replace(
        "name: gpu-1", "name: gpu-0"
    )
    error = failure(text)
    assert [v.path for v in error.violations] == ["spec.driver", "spec.devices[1].name"]
    assert error.message.endswith("(and 1 more)")


def test_taints_and_unquoted_timestamps_stay_strings() -> None:
    text = T4_TEXT.replace(
        "    capacity:\n      memory: {value: 15Gi}\n  - name: gpu-1",
        "    capacity:\n      memory: {value: 15Gi}\n"
        "    taints:\n"
        "    - {key: example.com/xid, effect: NoExecute, timeAdded: 2025-09-01T10:00:00Z}\n"
        "  - name: gpu-1",
        1,
    )
    (taint,) = only(load_objects(text), ResourceSlice).devices[0].taints
    assert (taint.key, taint.effect, taint.time_added) == (
        "example.com/xid",
        TaintEffect.NO_EXECUTE,
        "2025-09-01T10:00:00Z",
    )


def test_json_errors_carry_the_line_too() -> None:
    broken = t4_data()
    broken["spec"]["devices"][1]["capacity"]["memory"]["value"] = "lots"
    error = failure(json.dumps(broken, indent=2), "slice.json")
    lines = json.dumps(broken, indent=2).splitlines()
    line = next(i for i, text in enumerate(lines, start=1) if '"lots"' in text)
    assert error.message.startswith(f"slice.json:{line}: document 1 (ResourceSlice")


def test_typed_list_items_take_the_list_version() -> None:
    text = json.dumps(_as_list("ResourceSliceList", _typed_list_items(), "resource.k8s.io/v1beta2"))
    assert only(load_objects(text), ResourceSlice).api_version == "resource.k8s.io/v1beta2"


def test_text_without_a_file_is_named_input() -> None:
    with pytest.raises(InvalidArgument) as info:
        load_objects(NODE_YAML.replace("name: harpatil4220c-g9kfm-gpu-c-rd8r8\n  labels", "labels"))
    assert info.value.message == "<input>:3: document 1 (Node): metadata.name: Required value"
