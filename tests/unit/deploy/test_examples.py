"""examples/: the demo cluster, device classes and claims obey the Kubernetes API rules and model
the NVIDIA DRA driver faithfully.

Checked without the project's parser (that lands separately; when `services.common.dra.parse`
exists, every example must also load through it): API limits of resource.k8s.io/v1 as of
Kubernetes 1.34, the driver's attribute and naming conventions, that the MIG counters admit
exactly the packings the hardware admits, and that the generated files are up to date.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path
from typing import Any

import celpy
import pytest
from celpy.celparser import CELParseError

from services.common.dra.quantity import Quantity
from tests.unit.deploy.manifests import (
    ROOT,
    optional_module,
    relative,
    validate_kubernetes,
    yaml_documents,
    yaml_files,
)

EXAMPLES = ROOT / "examples"
CLUSTER = EXAMPLES / "cluster"
DRIVER = "gpu.nvidia.com"

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$"
)
PCI_BUS_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")
PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIG_NAME = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")

# resource.k8s.io/v1 limits in Kubernetes 1.34 (k8s.io/api resource/v1 types.go).
MAX_DEVICES = 128
MAX_DEVICES_WITH_COUNTERS_OR_TAINTS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUE_LENGTH = 64
MAX_COUNTER_SETS = 8
MAX_SHARED_COUNTERS_PER_SLICE = 32  # 1.34: "the maximum number of counters in all sets is 32"
MAX_COUNTERS_PER_DEVICE = 32
MAX_CONSUMED_COUNTERS_PER_SLICE = 1024
MAX_DEVICES_PER_CLAIM = 32
MAX_SUBREQUESTS = 8

# The attribute set of a full GPU, driver v25.12+ (shared/reference/nvidia-dra-attributes.md §2).
GPU_ATTRIBUTES = frozenset(
    {
        "type",
        "uuid",
        "productName",
        "brand",
        "architecture",
        "cudaComputeCapability",
        "driverVersion",
        "cudaDriverVersion",
        "addressingMode",
        "resource.kubernetes.io/pciBusID",
        "resource.kubernetes.io/pcieRoot",
    }
)
# Dynamic MIG devices: the parent's attributes minus uuid, plus parentUUID and profile (§3).
MIG_ATTRIBUTES = (GPU_ATTRIBUTES - {"uuid"}) | {"parentUUID", "profile"}
MIG_CAPACITIES = frozenset(
    {
        "multiprocessors",
        "copyEngines",
        "decoders",
        "encoders",
        "jpegEngines",
        "ofaEngines",
        "memory",
    }
)


# --- loading ---------------------------------------------------------------------------------


def documents(paths: Iterable[Path]) -> list[dict[str, Any]]:
    return [doc for path in paths for doc in yaml_documents(path)]


@functools.cache
def cluster_slices() -> list[dict[str, Any]]:
    return [d for d in documents(yaml_files(CLUSTER)) if d["kind"] == "ResourceSlice"]


def cluster_nodes() -> dict[str, dict[str, Any]]:
    nodes = [d for d in yaml_documents(CLUSTER / "nodes.yaml") if d["kind"] == "Node"]
    return {n["metadata"]["name"]: n for n in nodes}


def device_classes() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in yaml_documents(EXAMPLES / "deviceclasses.yaml")}


def claims() -> list[dict[str, Any]]:
    return documents(yaml_files(EXAMPLES / "claims"))


@functools.cache
def devices_of_node(node: str) -> list[dict[str, Any]]:
    return [
        device
        for s in cluster_slices()
        if s["spec"].get("nodeName") == node
        for device in s["spec"].get("devices", [])
    ]


def attribute(device: dict[str, Any], name: str) -> Any:
    (value,) = device["attributes"][name].values()
    return value


def example_ids(paths: list[Path]) -> list[Any]:
    return [pytest.param(p, id=relative(p).removeprefix("examples/")) for p in paths]


ALL_EXAMPLE_FILES = yaml_files(EXAMPLES)
KNOWN_KINDS = {
    ("resource.k8s.io/v1", "ResourceSlice"),
    ("resource.k8s.io/v1", "DeviceClass"),
    ("resource.k8s.io/v1", "ResourceClaim"),
    ("v1", "Node"),
}


# --- files -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", example_ids(ALL_EXAMPLE_FILES))
def test_every_example_holds_known_kubernetes_objects(path: Path) -> None:
    docs = yaml_documents(path)
    assert docs, f"{relative(path)} has no objects"
    for doc in docs:
        assert (doc["apiVersion"], doc["kind"]) in KNOWN_KINDS
        name = doc["metadata"]["name"]
        assert DNS_SUBDOMAIN.match(name) and len(name) <= 253, name


@pytest.mark.parametrize("path", example_ids(ALL_EXAMPLE_FILES))
def test_every_example_validates_against_the_kubernetes_schema(path: Path) -> None:
    for doc in yaml_documents(path):
        validate_kubernetes(doc)


@pytest.mark.parametrize("path", example_ids(ALL_EXAMPLE_FILES))
def test_every_example_loads_through_the_project_parser(path: Path) -> None:
    parse = optional_module("services.common.dra.parse")
    if parse is None:
        pytest.skip("services.common.dra.parse has not landed yet")
    objects = parse.load_objects(path.read_text(encoding="utf-8"), relative(path))
    assert [type(o).__name__ for o in objects] == [d["kind"] for d in yaml_documents(path)]


def test_generated_cluster_files_are_up_to_date() -> None:
    spec = importlib.util.spec_from_file_location("examples_generate", EXAMPLES / "generate.py")
    assert spec is not None and spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = generate  # dataclasses look their module up while being built
    try:
        spec.loader.exec_module(generate)
        rendered: dict[str, str] = generate.render()
    finally:
        del sys.modules[spec.name]
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in CLUSTER.glob("*.yaml")}
    assert sorted(rendered) == sorted(on_disk)
    stale = [name for name, text in rendered.items() if on_disk[name] != text]
    assert not stale, f"run `python examples/generate.py`; stale: {stale}"


def test_readme_describes_every_example_file() -> None:
    readme = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    files = [p for p in EXAMPLES.rglob("*") if p.is_file() and p.name != "README.md"]
    missing = [relative(p) for p in files if p.name not in readme]
    assert not missing, f"examples/README.md does not mention {missing}"


# --- ResourceSlices: API rules ---------------------------------------------------------------


def slice_params() -> list[Any]:
    return [pytest.param(s, id=s["metadata"]["name"]) for s in cluster_slices()]


def is_qualified_name(name: str) -> bool:
    domain, _, ident = name.rpartition("/")
    if domain and not (len(domain) <= 63 and DNS_SUBDOMAIN.match(domain)):
        return False
    return len(ident) <= 32 and C_IDENTIFIER.match(ident) is not None


@pytest.mark.parametrize("resource_slice", slice_params())
def test_slice_spec_obeys_api_limits(resource_slice: dict[str, Any]) -> None:
    spec = resource_slice["spec"]
    assert DNS_SUBDOMAIN.match(spec["driver"])
    access = [
        k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if k in spec
    ]
    assert access == ["nodeName"]
    pool = spec["pool"]
    assert DNS_SUBDOMAIN.match(pool["name"]) and pool["generation"] >= 0
    assert pool["resourceSliceCount"] >= 1
    devices = spec["devices"]
    limited = any("consumesCounters" in d or "taints" in d for d in devices)
    assert len(devices) <= (MAX_DEVICES_WITH_COUNTERS_OR_TAINTS if limited else MAX_DEVICES)
    counter_sets = spec.get("sharedCounters", [])
    assert len(counter_sets) <= MAX_COUNTER_SETS
    assert sum(len(cs["counters"]) for cs in counter_sets) <= MAX_SHARED_COUNTERS_PER_SLICE
    consumed = sum(len(c["counters"]) for d in devices for c in d.get("consumesCounters", []))
    assert consumed <= MAX_CONSUMED_COUNTERS_PER_SLICE


@pytest.mark.parametrize("resource_slice", slice_params())
def test_slice_devices_obey_api_limits(resource_slice: dict[str, Any]) -> None:
    for device in resource_slice["spec"]["devices"]:
        assert DNS_LABEL.match(device["name"]), device["name"]
        attributes, capacity = device.get("attributes", {}), device.get("capacity", {})
        assert len(attributes) + len(capacity) <= MAX_ATTRIBUTES_AND_CAPACITIES
        for name, value in attributes.items():
            assert is_qualified_name(name), name
            assert len(value) == 1 and next(iter(value)) in {"int", "bool", "string", "version"}
            ((kind, raw),) = value.items()
            if kind in {"string", "version"}:
                assert len(raw) <= MAX_ATTRIBUTE_VALUE_LENGTH
            if kind == "version":
                assert SEMVER.match(raw), f"{device['name']}: {name}={raw!r} is not semver 2.0.0"
        for name, entry in capacity.items():
            assert is_qualified_name(name), name
            Quantity.parse(entry["value"])


@pytest.mark.parametrize("resource_slice", slice_params())
def test_counter_consumption_refers_to_counters_of_the_same_slice(
    resource_slice: dict[str, Any],
) -> None:
    # Kubernetes 1.34 requires a device's counter sets in its own slice (1.35 relaxed this).
    sets = {cs["name"]: cs["counters"] for cs in resource_slice["spec"].get("sharedCounters", [])}
    for name, counters in sets.items():
        assert DNS_LABEL.match(name) and all(DNS_LABEL.match(c) for c in counters)
    for device in resource_slice["spec"]["devices"]:
        consumptions = device.get("consumesCounters", [])
        assert len({c["counterSet"] for c in consumptions}) == len(consumptions)
        assert sum(len(c["counters"]) for c in consumptions) <= MAX_COUNTERS_PER_DEVICE
        for consumption in consumptions:
            available = sets[consumption["counterSet"]]
            for counter, entry in consumption["counters"].items():
                assert Quantity.parse(entry["value"]) <= Quantity.parse(available[counter]["value"])


def test_pools_are_complete_and_device_names_unique() -> None:
    pools: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for s in cluster_slices():
        pools[(s["spec"]["driver"], s["spec"]["pool"]["name"])].append(s)
    for (driver, pool), slices in pools.items():
        generations = {s["spec"]["pool"]["generation"] for s in slices}
        counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
        assert len(generations) == 1 and counts == {len(slices)}, f"{driver}/{pool}"
        names = [d["name"] for s in slices for d in s["spec"]["devices"]]
        assert len(names) == len(set(names)), f"{driver}/{pool} repeats a device name"
    slice_names = [s["metadata"]["name"] for s in cluster_slices()]
    assert len(slice_names) == len(set(slice_names))


# --- ResourceSlices: what the NVIDIA driver publishes ------------------------------------------


@pytest.mark.parametrize("resource_slice", slice_params())
def test_devices_carry_the_nvidia_driver_attributes(resource_slice: dict[str, Any]) -> None:
    assert resource_slice["spec"]["driver"] == DRIVER
    assert resource_slice["spec"]["pool"]["name"] == resource_slice["spec"]["nodeName"]
    for device in resource_slice["spec"]["devices"]:
        kind = attribute(device, "type")
        expected = {"gpu": GPU_ATTRIBUTES, "mig": MIG_ATTRIBUTES}[kind]
        assert set(device["attributes"]) == expected, device["name"]
        assert PCI_BUS_ID.match(attribute(device, "resource.kubernetes.io/pciBusID"))
        assert PCIE_ROOT.match(attribute(device, "resource.kubernetes.io/pcieRoot"))
        assert attribute(device, "brand") == "Nvidia"
        if kind == "gpu":
            assert re.fullmatch(r"gpu-\d+", device["name"])
            assert GPU_UUID.match(attribute(device, "uuid"))
        else:
            assert MIG_NAME.match(device["name"])
            assert set(device["capacity"]) == MIG_CAPACITIES


def test_gpu_identities_are_unique_across_the_cluster() -> None:
    gpus = [
        (s["spec"]["nodeName"], d)
        for s in cluster_slices()
        for d in s["spec"]["devices"]
        if attribute(d, "type") == "gpu"
    ]
    uuids = [attribute(d, "uuid") for _, d in gpus]
    assert len(uuids) == len(set(uuids))
    per_node_bus_ids = Counter(
        (node, attribute(d, "resource.kubernetes.io/pciBusID")) for node, d in gpus
    )
    assert max(per_node_bus_ids.values()) == 1


NODE_SHAPES = [
    # node, productName, architecture, GPUs, PCIe roots, memory of a full GPU, MIG devices
    pytest.param(
        "h100-node-1", "NVIDIA H100 80GB HBM3", "Hopper", 8, 4, "81559Mi", 0, id="h100-node-1"
    ),
    pytest.param(
        "h100-node-2", "NVIDIA H100 80GB HBM3", "Hopper", 8, 4, "81559Mi", 0, id="h100-node-2"
    ),
    pytest.param(
        "a100-node-1", "NVIDIA A100-SXM4-40GB", "Ampere", 4, 2, "40192Mi", 4 * 25, id="a100-mig"
    ),
    pytest.param("l40s-node-1", "NVIDIA L40S", "Ada Lovelace", 4, 2, "46068Mi", 0, id="l40s"),
]


@pytest.mark.parametrize(
    ("node", "product", "architecture", "gpus", "roots", "memory", "migs"), NODE_SHAPES
)
def test_node_publishes_the_expected_gpus(
    node: str, product: str, architecture: str, gpus: int, roots: int, memory: str, migs: int
) -> None:
    devices = devices_of_node(node)
    full = [d for d in devices if attribute(d, "type") == "gpu"]
    assert len(full) == gpus
    assert len([d for d in devices if attribute(d, "type") == "mig"]) == migs
    assert {attribute(d, "productName") for d in devices} == {product}
    assert {attribute(d, "architecture") for d in devices} == {architecture}
    assert {d["capacity"]["memory"]["value"] for d in full} == {memory}
    pcie_roots = Counter(attribute(d, "resource.kubernetes.io/pcieRoot") for d in full)
    assert len(pcie_roots) == roots and set(pcie_roots.values()) == {gpus // roots}


# --- MIG: counters admit exactly what the A100 admits -------------------------------------------

# A100-SXM4-40GB (reference §8): profile -> (id, memorySizeMB, SMs, placement size, starts).
A100_MIG_TABLE = {
    "1g.5gb": (19, 4864, 14, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1g.5gb+me": (20, 4864, 14, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1g.10gb": (15, 9856, 14, 2, (0, 2, 4, 6)),
    "2g.10gb": (14, 9856, 28, 2, (0, 2, 4)),
    "3g.20gb": (9, 19968, 42, 4, (0, 4)),
    "4g.20gb": (5, 19968, 56, 4, (0,)),
    "7g.40gb": (0, 40192, 98, 8, (0,)),
}


def a100_gpu0_devices() -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in devices_of_node("a100-node-1") if d["name"].startswith("gpu-0")}


@pytest.mark.parametrize(
    "profile", [pytest.param(p, id=p.replace(".", "-").replace("+", "-")) for p in A100_MIG_TABLE]
)
def test_mig_devices_follow_the_a100_profile_table(profile: str) -> None:
    profile_id, memory_mb, sms, size, starts = A100_MIG_TABLE[profile]
    migs = [
        d
        for d in a100_gpu0_devices().values()
        if attribute(d, "type") == "mig" and attribute(d, "profile") == profile
    ]
    found_starts = []
    for device in migs:
        match = MIG_NAME.match(device["name"])
        assert match is not None and int(match[3]) == profile_id
        found_starts.append(int(match[4]))
        assert device["capacity"]["memory"]["value"] == f"{memory_mb}Mi"
        assert device["capacity"]["multiprocessors"]["value"] == str(sms)
        (consumption,) = device["consumesCounters"]
        slices = sorted(k for k in consumption["counters"] if k.startswith("memory-slice-"))
        start = int(match[4])
        assert slices == sorted(f"memory-slice-{i}" for i in range(start, start + size))
    assert sorted(found_starts) == list(starts)


def fits_counters(device_names: list[str]) -> bool:
    """Whether these gpu-0 devices can be allocated together, by the counters alone (KEP-4815)."""
    devices = a100_gpu0_devices()
    (gpu0_slice,) = [
        s
        for s in cluster_slices()
        if any(cs["name"] == "gpu-0-counter-set" for cs in s["spec"].get("sharedCounters", []))
    ]
    (counter_set,) = gpu0_slice["spec"]["sharedCounters"]
    used: dict[str, Fraction] = defaultdict(Fraction)
    for name in device_names:
        for consumption in devices[name]["consumesCounters"]:
            for counter, entry in consumption["counters"].items():
                used[counter] += Quantity.parse(entry["value"]).value
    return all(
        used[c] <= Quantity.parse(entry["value"]).value
        for c, entry in counter_set["counters"].items()
    )


PACKINGS = [
    # Valid A100 MIG configurations (nvidia-smi would create them) must fit ...
    pytest.param([f"gpu-0-mig-1g5gb-19-{i}" for i in range(7)], True, id="seven-1g5gb"),
    pytest.param(
        [
            "gpu-0-mig-2g10gb-14-0",
            "gpu-0-mig-2g10gb-14-2",
            "gpu-0-mig-2g10gb-14-4",
            "gpu-0-mig-1g5gb-19-6",
        ],
        True,
        id="three-2g10gb-and-one-1g5gb",
    ),
    pytest.param(["gpu-0-mig-4g20gb-5-0", "gpu-0-mig-3g20gb-9-4"], True, id="4g-and-3g"),
    pytest.param(["gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4"], True, id="two-3g20gb"),
    pytest.param(["gpu-0-mig-1g5gb-me-20-0", "gpu-0-mig-1g5gb-19-1"], True, id="one-me-and-1g"),
    pytest.param(["gpu-0"], True, id="whole-gpu"),
    # ... and impossible ones must not.
    pytest.param(["gpu-0", "gpu-0-mig-1g5gb-19-0"], False, id="whole-gpu-and-a-slice"),
    pytest.param(["gpu-0-mig-7g40gb-0-0", "gpu-0-mig-1g5gb-19-6"], False, id="7g-and-1g"),
    pytest.param(
        ["gpu-0-mig-1g5gb-me-20-0", "gpu-0-mig-1g5gb-me-20-1"], False, id="two-media-extensions"
    ),
    pytest.param(["gpu-0-mig-3g20gb-9-0", "gpu-0-mig-2g10gb-14-2"], False, id="overlapping"),
    pytest.param(
        ["gpu-0-mig-3g20gb-9-0", "gpu-0-mig-2g10gb-14-4", "gpu-0-mig-2g10gb-14-0"],
        False,
        id="overlapping-three",
    ),
]


@pytest.mark.parametrize(("device_names", "fits"), PACKINGS)
def test_mig_counters_admit_exactly_the_hardware_packings(
    device_names: list[str], fits: bool
) -> None:
    assert fits_counters(device_names) is fits


# --- Nodes -----------------------------------------------------------------------------------

REQUIRED_NODE_LABELS = (
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "gpualloc.dev/rack",
    "nvidia.com/gpu.present",
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.count",
)


def test_nodes_match_the_slices() -> None:
    nodes = cluster_nodes()
    assert {s["spec"]["nodeName"] for s in cluster_slices()} == set(nodes)
    for name, node in nodes.items():
        labels = node["metadata"]["labels"]
        assert all(key in labels for key in REQUIRED_NODE_LABELS), name
        assert labels["kubernetes.io/hostname"] == name
        assert all(isinstance(v, str) for v in labels.values())
        gpus = [d for d in devices_of_node(name) if attribute(d, "type") == "gpu"]
        assert labels["nvidia.com/gpu.count"] == str(len(gpus))
        product = attribute(gpus[0], "productName")
        assert labels["nvidia.com/gpu.product"] == product.replace(" ", "-")


@pytest.mark.parametrize("path", example_ids(sorted((EXAMPLES / "nvml").glob("*.topo.txt"))))
def test_topology_matrices_cover_each_node_gpu(path: Path) -> None:
    node = path.name.removesuffix(".topo.txt")
    header, *rows = path.read_text(encoding="utf-8").splitlines()
    columns = [c for c in header.split() if c.startswith("GPU")]
    matrix = {row.split()[0]: row.split()[1 : 1 + len(columns)] for row in rows}
    assert list(matrix) == columns
    for i, a in enumerate(columns):
        assert matrix[a][i] == "X"
        assert all(matrix[a][j] == matrix[b][i] for j, b in enumerate(columns))
    gpus = [d for d in devices_of_node(node) if attribute(d, "type") == "gpu"]
    assert len(columns) == len(gpus)


# --- DeviceClasses and claims ---------------------------------------------------------------------


def compiles(expression: str) -> bool:
    try:
        celpy.Environment().compile(expression)
    except CELParseError:
        return False
    return True


def test_device_classes_select_by_the_driver_type_attribute() -> None:
    classes = device_classes()
    assert {"gpu.nvidia.com", "mig.nvidia.com"} <= set(classes)
    for name, device_class in classes.items():
        expressions = [s["cel"]["expression"] for s in device_class["spec"]["selectors"]]
        assert all(compiles(e) for e in expressions), name
        assert f"device.driver == '{DRIVER}'" in expressions[0]
    assert "type == 'gpu'" in classes["gpu.nvidia.com"]["spec"]["selectors"][0]["cel"]["expression"]
    assert "type == 'mig'" in classes["mig.nvidia.com"]["spec"]["selectors"][0]["cel"]["expression"]


def claim_params() -> list[Any]:
    return [pytest.param(c, id=c["metadata"]["name"]) for c in claims()]


def minimum_devices(request: dict[str, Any]) -> int:
    """Devices a request needs at least (All counts as one, as upstream's size check does)."""
    options = request.get("firstAvailable") or [request["exactly"]]
    return min(o.get("count", 1) if o.get("allocationMode") != "All" else 1 for o in options)


@pytest.mark.parametrize("claim", claim_params())
def test_claim_requests_use_the_upstream_fields(claim: dict[str, Any]) -> None:
    devices = claim["spec"]["devices"]
    classes = device_classes()
    names = [r["name"] for r in devices["requests"]]
    assert len(names) == len(set(names)) and all(DNS_LABEL.match(n) for n in names)
    valid_targets = set(names)
    for request in devices["requests"]:
        assert ("exactly" in request) != ("firstAvailable" in request), request["name"]
        options = request.get("firstAvailable") or [request["exactly"]]
        assert 1 <= len(options) <= MAX_SUBREQUESTS
        if "firstAvailable" in request:
            subnames = [o["name"] for o in options]
            assert len(subnames) == len(set(subnames))
            valid_targets |= {f"{request['name']}/{s}" for s in subnames}
        for option in options:
            assert option["deviceClassName"] in classes
            mode = option.get("allocationMode", "ExactCount")
            assert mode in {"ExactCount", "All"}
            assert ("count" not in option) if mode == "All" else option.get("count", 1) >= 1
            assert all(compiles(s["cel"]["expression"]) for s in option.get("selectors", []))
    assert sum(minimum_devices(r) for r in devices["requests"]) <= MAX_DEVICES_PER_CLAIM
    for constraint in devices.get("constraints", []):
        assert set(constraint.get("requests", [])) <= valid_targets
        (kind,) = {"matchAttribute", "distinctAttribute"} & set(constraint)
        domain, _, ident = constraint[kind].partition("/")
        assert domain and ident, "constraint attributes must be fully qualified"


H100 = "NVIDIA H100 80GB HBM3"

CLAIM_SIZES = [
    # claim, product it asks for, GPUs it needs on one node, whether some node has that many
    pytest.param("one-h100", H100, 1, True, id="one-h100"),
    pytest.param("eight-h100", H100, 8, True, id="eight-h100"),
    pytest.param("sixteen-h100-one-node", H100, 16, False, id="sixteen-h100-one-node"),
]


@pytest.mark.parametrize(("claim_name", "product", "needed", "fits"), CLAIM_SIZES)
def test_claim_sizes_against_the_cluster(
    claim_name: str, product: str, needed: int, fits: bool
) -> None:
    (claim,) = [c for c in claims() if c["metadata"]["name"] == claim_name]
    assert sum(minimum_devices(r) for r in claim["spec"]["devices"]["requests"]) == needed
    most_on_one_node = max(
        sum(
            1
            for d in devices_of_node(node)
            if attribute(d, "productName") == product and attribute(d, "type") == "gpu"
        )
        for node in cluster_nodes()
    )
    assert (most_on_one_node >= needed) is fits


# --- selectors, evaluated by the project's CEL (when it has landed) ------------------------------

A100 = "NVIDIA A100-SXM4-40GB"

SELECTIONS = [
    # claim, request (or request/subrequest), devices in the cluster its class + selectors match
    pytest.param("one-h100", "gpu", 16, {H100}, id="one-h100"),
    pytest.param("eight-h100", "gpus", 16, {H100}, id="eight-h100-by-class"),
    pytest.param("sixteen-h100-one-node", "gpus", 16, {H100}, id="sixteen-h100"),
    pytest.param("all-l40s", "gpus", 4, {"NVIDIA L40S"}, id="all-l40s"),
    pytest.param("two-gpus-same-pcie-root", "gpus", 24, {H100, A100, "NVIDIA L40S"}, id="any-gpu"),
    pytest.param("mig-small-else-medium", "mig/small", 4 * 7, {A100}, id="mig-small"),
    pytest.param("mig-small-else-medium", "mig/medium", 4 * 3, {A100}, id="mig-medium"),
    pytest.param("mig-small-else-medium", "mig/whole", 4, {A100}, id="mig-whole-gpu"),
]


def request_option(claim_name: str, request_name: str) -> dict[str, Any]:
    (claim,) = [c for c in claims() if c["metadata"]["name"] == claim_name]
    name, _, sub = request_name.partition("/")
    (request,) = [r for r in claim["spec"]["devices"]["requests"] if r["name"] == name]
    if not sub:
        option: dict[str, Any] = request["exactly"]
        return option
    (option,) = [o for o in request["firstAvailable"] if o["name"] == sub]
    return option


@pytest.mark.parametrize(("claim_name", "request_name", "count", "products"), SELECTIONS)
def test_selectors_pick_the_intended_devices(
    claim_name: str, request_name: str, count: int, products: set[str]
) -> None:
    cel = optional_module("services.cel.selectors")
    parse = optional_module("services.common.dra.parse")
    if cel is None or parse is None:
        pytest.skip("the project's CEL selectors or parser have not landed yet")
    option = request_option(claim_name, request_name)
    class_selectors = device_classes()[option["deviceClassName"]]["spec"]["selectors"]
    cache = cel.SelectorCache()
    selectors = [
        cache.compile(s["cel"]["expression"])
        for s in [*class_selectors, *option.get("selectors", [])]
    ]
    slices = [
        o for o in parse.load_files(yaml_files(CLUSTER)) if type(o).__name__ == "ResourceSlice"
    ]
    picked = [
        device
        for resource_slice in slices
        for device in resource_slice.devices
        if all(
            s.matches(cel.CelDevice.from_device(resource_slice.driver, device)) for s in selectors
        )
    ]
    assert len(picked) == count
    assert {d.attributes["productName"].value for d in picked} == products
