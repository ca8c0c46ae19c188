"""CEL device selectors: DRA semantics, the Kubernetes libraries, errors, cost bound, profile memo.

Devices come from a real NVIDIA ResourceSlice (tests/data/cel, two Tesla T4) and from an H100
built with the attribute set the NVIDIA driver publishes (shared/reference/nvidia-dra-attributes).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from services.cel.selectors import (
    CelCostExceeded,
    CelDevice,
    CelError,
    SelectorCache,
    Version,
)
from services.common.dra.model import AttributeType, AttributeValue, Device, DeviceCapacity
from services.common.dra.quantity import Quantity
from services.common.errors import InvalidArgument

DATA = Path(__file__).parents[2] / "data" / "cel"
NVIDIA = "gpu.nvidia.com"
A = AttributeValue


def slice_devices(name: str) -> list[CelDevice]:
    """The devices of a ResourceSlice YAML file, as selectors see them."""
    spec = yaml.safe_load((DATA / name).read_text())["spec"]
    devices = []
    for device in spec["devices"]:
        attributes = {}
        for key, value in device.get("attributes", {}).items():
            ((kind, raw),) = value.items()
            attributes[key] = AttributeValue(AttributeType(kind), raw)
        capacity = {
            k: Quantity.parse(str(v["value"])) for k, v in device.get("capacity", {}).items()
        }
        devices.append(CelDevice(spec["driver"], attributes, capacity))
    return devices


T4_0, T4_1 = slice_devices("openshift-v1.35_2x-tesla-t4_condensed.yaml")


def h100(**overrides: Any) -> CelDevice:
    attributes = {
        "type": A.string("gpu"),
        "uuid": A.string("GPU-4b9b3b2e-0e0f-4c3a-9d53-6f0c1f1e2a3b"),
        "productName": A.string("NVIDIA H100 80GB HBM3"),
        "brand": A.string("Nvidia"),
        "architecture": A.string("Hopper"),
        "cudaComputeCapability": A.version("9.0.0"),
        "driverVersion": A.version("580.126.9"),
        "cudaDriverVersion": A.version("13.0.0"),
        "resource.kubernetes.io/pciBusID": A.string("0000:3b:00.0"),
        "resource.kubernetes.io/pcieRoot": A.string("pci0000:3a"),
        "index": A.int_(3),
        "mig": A.bool_(False),
    }
    attributes.update(overrides)
    return CelDevice(NVIDIA, attributes, {"memory": Quantity.parse("80Gi")})


H100 = h100()
EMPTY = CelDevice("dra.example.com", {}, {})


def match(expression: str, device: CelDevice = EMPTY, **cache_args: Any) -> bool:
    return SelectorCache(**cache_args).compile(expression).matches(device)


# --- real selectors ---------------------------------------------------------------------

NV = f'device.attributes["{NVIDIA}"]'
NV_CAP = f'device.capacity["{NVIDIA}"]'

SELECTORS = [
    pytest.param(f'device.driver == "{NVIDIA}" && {NV}.type == "gpu"', T4_0, True, id="gpu-class"),
    pytest.param(f'device.driver == "{NVIDIA}" && {NV}.type == "mig"', T4_0, False, id="mig-class"),
    pytest.param(
        f'{NV_CAP}.memory.compareTo(quantity("40Gi")) >= 0', H100, True, id="memory-40gi-h100"
    ),
    pytest.param(
        f'{NV_CAP}.memory.compareTo(quantity("40Gi")) >= 0', T4_0, False, id="memory-40gi-t4"
    ),
    pytest.param(
        f'{NV_CAP}.memory.isGreaterThan(quantity("15Gi"))',
        T4_0,
        False,
        id="memory-not-above-itself",
    ),
    pytest.param(
        f'{NV_CAP}.memory == quantity("16106127360")', T4_0, True, id="memory-equal-across-formats"
    ),
    pytest.param(
        f'{NV}.productName.lowerAscii().matches("h100")', H100, True, id="product-regex-h100"
    ),
    pytest.param(
        f'{NV}.productName.lowerAscii().matches("h100")', T4_0, False, id="product-regex-t4"
    ),
    pytest.param(f'{NV}["productName"] == "Tesla T4"', T4_1, True, id="bare-name-by-index"),
    pytest.param(
        f'{NV}.driverVersion.isGreaterThan(semver("550.54.15"))',
        T4_0,
        True,
        id="driver-version-newer",
    ),
    pytest.param(
        f'{NV}.driverVersion.compareTo(semver("580.126.20")) == 0',
        T4_0,
        True,
        id="driver-version-equal",
    ),
    pytest.param(f'{NV}.driverVersion == semver("580.126.20")', T4_0, True, id="version-eq-semver"),
    pytest.param(f'{NV}.driverVersion == "580.126.20"', T4_0, False, id="version-ne-string"),
    pytest.param(
        f'{NV}.cudaComputeCapability.isLessThan(semver("8.0.0"))', T4_0, True, id="cc-below-ampere"
    ),
    pytest.param(f"{NV}.cudaComputeCapability.major() >= 9", H100, True, id="cc-major-hopper"),
    pytest.param(
        f"{NV}.cudaDriverVersion.major() == 13 && {NV}.cudaDriverVersion.minor() == 0",
        H100,
        True,
        id="cuda-driver-major-minor",
    ),
    pytest.param(
        '"resource.kubernetes.io" in device.attributes', T4_0, True, id="standard-domain-present"
    ),
    pytest.param('"example.com" in device.attributes', T4_0, False, id="domain-absent"),
    pytest.param(
        'device.attributes["resource.kubernetes.io"].pciBusID == "0000:00:05.0"',
        T4_1,
        True,
        id="qualified-pcibusid",
    ),
    pytest.param(
        'device.attributes["resource.kubernetes.io"].pcieRoot.startsWith("pci0000:")',
        T4_0,
        True,
        id="qualified-pcieroot",
    ),
    pytest.param(
        '"x" in device.attributes["other.example.com"]', T4_0, False, id="missing-domain-is-empty"
    ),
    pytest.param(
        'device.attributes["other.example.com"].size() == 0', T4_0, True, id="missing-domain-size"
    ),
    pytest.param(
        f'has({NV}.addressingMode) && {NV}.addressingMode == "HMM"',
        T4_0,
        True,
        id="has-guard-present",
    ),
    pytest.param(
        f'!has({NV}.addressingMode) || {NV}.addressingMode == "HMM"',
        H100,
        True,
        id="has-guard-absent",
    ),
    pytest.param(f'"addressingMode" in {NV}', H100, False, id="in-guard-absent"),
    pytest.param(f"cel.bind(gpu, {NV}, gpu.index > 1 && !gpu.mig)", H100, True, id="bind-domain"),
    pytest.param(f'{NV}.exists(k, k == "uuid")', T4_0, True, id="exists-over-ids"),
    pytest.param(
        f'device.attributes.exists_one(d, d == "{NVIDIA}")',
        T4_0,
        True,
        id="exists-one-over-domains",
    ),
    pytest.param(f"{NV}.all(k, k.size() < 64)", T4_0, True, id="all-over-ids"),
    pytest.param(
        "device.allowMultipleAllocations == false", T4_0, True, id="allow-multiple-default"
    ),
    pytest.param(
        f'{NV}.productName in ["Tesla T4", "NVIDIA A100-SXM4-40GB"]',
        T4_0,
        True,
        id="product-in-list",
    ),
    pytest.param(
        f'{NV}.uuid.startsWith("GPU-") && {NV}.brand.upperAscii() == "NVIDIA"',
        T4_0,
        True,
        id="uuid-brand",
    ),
]


@pytest.mark.parametrize(("expression", "device", "expected"), SELECTORS)
def test_real_selectors(expression: str, device: CelDevice, expected: bool) -> None:
    assert match(expression, device) is expected


def test_qualified_name_in_driver_domain_wins_over_bare() -> None:
    device = CelDevice(
        NVIDIA, {"model": A.string("bare"), f"{NVIDIA}/model": A.string("qualified")}, {}
    )
    assert match(f'{NV}.model == "qualified"', device)


def test_from_device_uses_capacity_values() -> None:
    device = Device(
        "gpu-0", {"type": A.string("gpu")}, {"memory": DeviceCapacity(Quantity.parse("1Gi"))}
    )
    cel_device = CelDevice.from_device(NVIDIA, device)
    assert match(f'{NV_CAP}.memory.isLessThan(quantity("2Gi")) && {NV}.type == "gpu"', cel_device)


# Cases of upstream dynamic-resource-allocation cel/compile_test.go (1.34 semantics; driver
# dra.example.com unless the case sets none), with upstream's names.
DRA = "dra.example.com"
DRA_ATTRS = f'device.attributes["{DRA}"]'
DRA_CAPS = f'device.capacity["{DRA}"]'
UPSTREAM = [
    pytest.param(
        '"no-such-domain" in device.attributes', "", {}, {}, False, id="domain-check-negative"
    ),
    pytest.param(
        f'"{DRA}" in device.attributes', "", {f"{DRA}/something": A.bool_(True)}, {}, True,
        id="domain-check-positive",
    ),
    pytest.param('device.driver == ""', "", {}, {}, True, id="empty-driver-name"),
    pytest.param(
        f"{DRA_ATTRS}.name", DRA, {"name": A.bool_(True)}, {}, True, id="driver-name-qualifier"
    ),
    pytest.param(
        f'{DRA_ATTRS}["name"]', DRA, {"name": A.bool_(True)}, {}, True,
        id="driver-name-qualifier-map-lookup",
    ),
    pytest.param(
        f"cel.bind(dra, {DRA_ATTRS}, dra.name)", DRA, {"name": A.bool_(True)}, {}, True, id="bind"
    ),
    pytest.param(
        'device.attributes["other.example.com"].name', DRA,
        {"other.example.com/name": A.bool_(True)}, {}, True, id="qualified-attribute-name",
    ),
    pytest.param(f"{DRA_ATTRS}.name > 0", DRA, {"name": A.int_(1)}, {}, True, id="int"),
    pytest.param(
        f'{DRA_ATTRS}.name == "fish"', DRA, {"name": A.string("fish")}, {}, True, id="string"
    ),
    pytest.param(
        f'{DRA_ATTRS}.name.isGreaterThan(semver("0.0.1"))', DRA, {"name": A.version("1.0.0")}, {},
        True, id="version",
    ),
    pytest.param(
        f'{DRA_ATTRS}.name.isGreaterThan(semver("v0.0.1", true)) && isSemver("v1.0.0", true)', DRA,
        {"name": A.version("1.0.0")}, {}, True, id="version_v",
    ),
    pytest.param(
        f'{DRA_CAPS}.name.isGreaterThan(quantity("1Ki"))', DRA, {}, {"name": Quantity.parse("1Mi")},
        True, id="quantity",
    ),
    pytest.param(
        f'!("name" in {DRA_CAPS}) || {DRA_CAPS}.name.isGreaterThan(quantity("1Ki"))', "", {}, {},
        True, id="check-negative",
    ),
    pytest.param(
        f'device.attributes.exists_one(x, x == "{DRA}")', DRA,
        {"services": A.string("some_example_value")}, {}, True, id="check_attribute_domains",
    ),
    pytest.param(
        f'{DRA_ATTRS}.exists_one(x, x == "services")', DRA,
        {"services": A.string("some_example_value")}, {}, True, id="check_attribute_ids",
    ),
    pytest.param(
        f'{DRA_ATTRS}.services.split("example").size() >= 2', DRA,
        {"services": A.string("some_example_value")}, {}, True, id="split_attribute",
    ),
    pytest.param(
        f'{DRA_ATTRS}.services.matches("[^a]?sym")', DRA, {"services": A.string("asymetric")}, {},
        True, id="regexp_attribute",
    ),
    pytest.param(
        f'device.capacity.exists_one(x, x == "{DRA}")', DRA, {}, {"memory": Quantity.parse("1Mi")},
        True, id="check_capacity_domains",
    ),
    pytest.param(
        "device.allowMultipleAllocations == false", DRA, {}, {}, True,
        id="allow_multiple_allocations_default",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("expression", "driver", "attributes", "capacity", "expected"), UPSTREAM)
def test_upstream_cases(
    expression: str,
    driver: str,
    attributes: dict[str, AttributeValue],
    capacity: dict[str, Quantity],
    expected: bool,
) -> None:
    assert match(expression, CelDevice(driver, attributes, capacity)) is expected


def test_root_scoped_device_survives_a_loop_variable_named_device() -> None:
    assert match('[1].all(device, device == 1 && .device.driver == "gpu.nvidia.com")', H100)


# --- the libraries ----------------------------------------------------------------------

TRUE_EXPRESSIONS = [
    # Kubernetes quantity library
    pytest.param('quantity("1.5G") == quantity("1500M")', id="quantity-equality"),
    pytest.param(
        'isQuantity("1.3Gi") && !isQuantity("200K") && !isQuantity("Mi")', id="is-quantity"
    ),
    pytest.param('quantity("200M").compareTo(quantity("0.2G")) == 0', id="quantity-compare-equal"),
    pytest.param('quantity("50M").compareTo(quantity("50Mi")) == -1', id="quantity-compare-less"),
    pytest.param('quantity("150Mi").isGreaterThan(quantity("100Mi"))', id="quantity-greater"),
    pytest.param('quantity("50M").isLessThan(quantity("100M"))', id="quantity-less"),
    pytest.param('quantity("50k").add(quantity("20k")) == quantity("70k")', id="quantity-add"),
    pytest.param('quantity("50k").add(20) == quantity("50020")', id="quantity-add-int"),
    pytest.param('quantity("50k").sub(20000) == quantity("30k")', id="quantity-sub-int"),
    pytest.param(
        'quantity("50k").add(20).sub(quantity("100k")).sub(-50000) == quantity("20")',
        id="quantity-chain",
    ),
    pytest.param('quantity("50k").asInteger() == 50000', id="quantity-as-integer"),
    pytest.param('quantity("50000000G").isInteger()', id="quantity-is-integer"),
    pytest.param(
        '!quantity("9999999999999999999999999999999999999G").isInteger()', id="quantity-too-big"
    ),
    pytest.param('!quantity("1500m").isInteger()', id="quantity-fraction-not-integer"),
    pytest.param('quantity("50k").sub(20000).asApproximateFloat() == 30000.0', id="quantity-float"),
    pytest.param(
        'quantity("-1").sign() == -1 && quantity("0").sign() == 0 && quantity("3m").sign() == 1',
        id="quantity-sign",
    ),
    # Kubernetes semver library
    pytest.param('semver("1.2.3").major() == 1 && semver("1.2.3").minor() == 2', id="semver-parts"),
    pytest.param('semver("1.2.3").patch() == 3', id="semver-patch"),
    pytest.param(
        'isSemver("1.0.0") && !isSemver("v1.0.0") && !isSemver("1.0")', id="is-semver-strict"
    ),
    pytest.param(
        'isSemver("v1.0", true) && semver("v01.2", true) == semver("1.2.0")', id="semver-normalize"
    ),
    pytest.param('semver("1.2.3").compareTo(semver("2.0.0")) == -1', id="semver-compare"),
    pytest.param(
        'semver("1.0.0-alpha").isLessThan(semver("1.0.0"))', id="semver-prerelease-below-release"
    ),
    pytest.param(
        'semver("1.0.0-beta.2").isLessThan(semver("1.0.0-beta.11"))', id="semver-numeric-prerelease"
    ),
    pytest.param(
        'semver("1.0.0-alpha.1").isLessThan(semver("1.0.0-alpha.beta"))',
        id="semver-numeric-below-alpha",
    ),
    pytest.param('semver("1.0.0+build.1") == semver("1.0.0+build.2")', id="semver-build-ignored"),
    # strings: standard and ext Strings v2
    pytest.param('"NVIDIA H100".contains("H100") && "abc".endsWith("bc")', id="contains-ends-with"),
    pytest.param('"Tesla T4".matches("^Tesla") && !"Tesla T4".matches("^T4")', id="matches-re2"),
    pytest.param('matches("gpu-12", "[0-9]+$")', id="matches-global"),
    pytest.param('"abc".charAt(1) == "b" && "abc".charAt(3) == ""', id="char-at"),
    pytest.param(
        '"hello mellow".indexOf("ello") == 1 && "hello".indexOf("", 2) == 2', id="index-of"
    ),
    pytest.param(
        '"hello mellow".indexOf("ello", 2) == 7 && "abc".indexOf("z") == -1', id="index-of-offset"
    ),
    pytest.param('"hello mellow".lastIndexOf("ello") == 7', id="last-index-of"),
    pytest.param('"hello mellow".lastIndexOf("ello", 6) == 1', id="last-index-of-offset"),
    pytest.param(
        '"TacoCat".lowerAscii() == "tacocat" && "Ünï".lowerAscii() == "Ünï"', id="lower-ascii"
    ),
    pytest.param('"TacoCat".upperAscii() == "TACOCAT"', id="upper-ascii"),
    pytest.param(
        '"aaa".replace("a", "b") == "bbb" && "aaa".replace("a", "b", 1) == "baa"', id="replace"
    ),
    pytest.param(
        '"a,b,c".split(",") == ["a", "b", "c"] && "a,b,c".split(",", 2) == ["a", "b,c"]', id="split"
    ),
    pytest.param(
        '"abc".split("") == ["a", "b", "c"] && "a,b".split(",", 0) == []', id="split-edge"
    ),
    pytest.param(
        '"tacocat".substring(4) == "cat" && "tacocat".substring(0, 4) == "taco"', id="substring"
    ),
    pytest.param('"  \\t trim\\n ".trim() == "trim"', id="trim"),
    pytest.param('["a", "b"].join() == "ab" && ["a", "b"].join("-") == "a-b"', id="join"),
    pytest.param('"%s is %d, %.2f %%".format(["x", 3, 1.5]) == "x is 3, 1.50 %"', id="format"),
    pytest.param('"%x %o %b".format([255, 8, 5]) == "ff 10 101"', id="format-radix"),
    pytest.param('strings.quote("a\\"b") == "\\"a\\\\\\"b\\""', id="strings-quote"),
    pytest.param(
        '"gpu-12-mig".find("[0-9]+") == "12" && "abc".find("[0-9]") == ""', id="regex-find"
    ),
    pytest.param('"a1b22c333".findAll("[0-9]+") == ["1", "22", "333"]', id="regex-find-all"),
    pytest.param('"a1b22c333".findAll("[0-9]+", 2) == ["1", "22"]', id="regex-find-all-limit"),
    pytest.param(
        'size("héllo") == 5 && "héllo".size() == 5 && size(b"h\\xc3") == 2', id="size-code-points"
    ),
    # lists and sets
    pytest.param("[1, 2, 3].isSorted() && ![3, 1].isSorted()", id="is-sorted"),
    pytest.param("[1, 2, 3].sum() == 6 && [1.5, 2.5].sum() == 4.0", id="sum"),
    pytest.param("[3, 1, 2].min() == 1 && [3, 1, 2].max() == 3", id="min-max"),
    pytest.param("[1, 2, 1].indexOf(1) == 0 && [1, 2, 1].lastIndexOf(1) == 2", id="list-index-of"),
    pytest.param("[1, 2, 3, 4].slice(1, 3) == [2, 3]", id="slice"),
    pytest.param(
        "[1, [2, [3]]].flatten() == [1, 2, [3]] && [1, [2, [3]]].flatten(2) == [1, 2, 3]",
        id="flatten",
    ),
    pytest.param("[1, 2, 1, 3].distinct() == [1, 2, 3]", id="distinct"),
    pytest.param('[3, 1, 2].sort() == [1, 2, 3] && ["b", "a"].sort() == ["a", "b"]', id="sort"),
    pytest.param("[1, 2].reverse() == [2, 1]", id="reverse"),
    pytest.param("lists.range(3) == [0, 1, 2]", id="lists-range"),
    pytest.param(
        "sets.contains([1, 2, 3], [3, 1]) && !sets.contains([1], [2])", id="sets-contains"
    ),
    pytest.param(
        "sets.equivalent([1, 2], [2, 1, 2]) && sets.intersects([1, 2], [2, 5])",
        id="sets-equivalent",
    ),
    # macros
    pytest.param("[1, 2, 3].all(x, x > 0) && [1, 2, 3].exists(x, x == 2)", id="all-exists"),
    pytest.param(
        "[1, 2, 3].exists_one(x, x > 2) && ![1, 2, 3].exists_one(x, x > 1)", id="exists-one"
    ),
    pytest.param("[1, 2, 3].map(x, x * 2) == [2, 4, 6]", id="map"),
    pytest.param("[1, 2, 3].map(x, x > 1, x * 10) == [20, 30]", id="map-with-filter"),
    pytest.param("[1, 2, 3].filter(x, x % 2 == 1) == [1, 3]", id="filter"),
    pytest.param('{"a": 1, "b": 2}.all(k, k.size() == 1)', id="map-iterates-keys"),
    pytest.param("[10, 20].all(i, v, v == (i + 1) * 10)", id="two-var-all"),
    pytest.param('{"a": 1, "b": 2}.exists(k, v, k == "b" && v == 2)', id="two-var-exists"),
    pytest.param("[1, 2, 3].existsOne(i, v, v == 2)", id="two-var-exists-one"),
    pytest.param("[5, 6].transformList(i, v, i * v) == [0, 6]", id="transform-list"),
    pytest.param('{"a": 1}.transformMap(k, v, v + 1) == {"a": 2}', id="transform-map"),
    pytest.param("cel.bind(x, 2, cel.bind(y, x * 3, y == 6))", id="bind-nested"),
    pytest.param(
        "[1].all(x, [2].all(x, x == 2)) && [1].all(x, x == 1)", id="shadowed-loop-variable"
    ),
    # standard: arithmetic, equality, conversions
    pytest.param("7 / 2 == 3 && -7 / 2 == -3 && -7 % 2 == -1", id="int-division-truncates"),
    pytest.param("1u + 2u == 3u && 1 == 1.0 && 1u == 1", id="numeric-equality"),
    pytest.param("1 < 1.5 && 2u > 1", id="cross-type-ordering"),
    pytest.param("1 != true && [1] != [true] && null == null", id="heterogeneous-inequality"),
    pytest.param(
        'int("-42") == -42 && uint("7") == 7u && double("1.5") == 1.5', id="conversions-from-string"
    ),
    pytest.param(
        'string(1.5) == "1.5" && string(1e6) == "1e+06" && string(2u) == "2"', id="string-of-number"
    ),
    pytest.param('bool("true") && !bool("0") && bytes("a") == b"a"', id="bool-bytes-conversions"),
    pytest.param('type(1) == int && type("") == string && dyn(1) == 1', id="type-values"),
    pytest.param('{"a": [1, 2]}["a"][1] == 2 && "a" in {"a": 1}', id="map-list-index"),
    pytest.param("2 in [1, 2] && !(3 in [1, 2])", id="in-list"),
    pytest.param("(true ? 1 : 2) == 1 && (false ? 1 : 2) == 2", id="ternary"),
    pytest.param("1.0 / 0.0 > 1e308", id="double-division-by-zero-is-inf"),
    pytest.param("true || 1 / 0 == 1", id="or-absorbs-right-error"),
    pytest.param("1 / 0 == 1 || true", id="or-absorbs-left-error"),
    pytest.param("!(false && 1 / 0 == 1) && !(1 / 0 == 1 && false)", id="and-absorbs-errors"),
    pytest.param("[0, 1].exists(x, 1 / x == 1)", id="exists-absorbs-error"),
    pytest.param("![0, 1].all(x, 1 / x == 0)", id="all-false-wins-over-error"),
    pytest.param('r"a\\d" == "a\\\\d" && """x""" == "x"', id="raw-and-triple-quoted-strings"),
    pytest.param("0x10 == 16 && -9223372036854775808 < 0", id="int-literals"),
]


@pytest.mark.parametrize("expression", TRUE_EXPRESSIONS)
def test_library_expression_is_true(expression: str) -> None:
    assert match(expression) is True


# --- errors -----------------------------------------------------------------------------

RUNTIME_ERRORS = [
    pytest.param(f"{NV}.noSuchAttr", H100, "no such key: noSuchAttr", id="missing-attribute"),
    pytest.param(
        f'{NV}["noSuchAttr"] == 1', H100, "no such key: noSuchAttr", id="missing-attribute-index"
    ),
    pytest.param(
        'device.attributes["no-such-domain"].noSuchAttr.isGreaterThan(quantity("0"))',
        H100,
        "no such key: noSuchAttr",
        id="upstream-runtime-error-lookup-identifier",
    ),
    pytest.param(f"{NV}.productName > 1", H100, "no such overload", id="string-vs-int-ordering"),
    pytest.param(
        f"{NV}.productName.major() == 1",
        H100,
        "no such overload: major(string)",
        id="wrong-receiver",
    ),
    pytest.param(f"{NV}.index", H100, "must evaluate to bool, not int", id="non-bool-result"),
    pytest.param(f"{NV}.mig || {NV}.productName", H100, "no such overload", id="or-on-string"),
    pytest.param('quantity("3Kb") == quantity("1")', EMPTY, "does not match", id="bad-quantity"),
    pytest.param('semver("v1.0") == semver("1.0.0")', EMPTY, "MAJOR.MINOR.PATCH", id="bad-semver"),
    pytest.param(
        'quantity("1.5").asInteger() == 1',
        EMPTY,
        "cannot convert value to integer",
        id="as-integer-fraction",
    ),
    pytest.param("1 / 0 == 1", EMPTY, "division by zero", id="division-by-zero"),
    pytest.param("9223372036854775807 + 1 > 0", EMPTY, "integer overflow", id="int-overflow"),
    pytest.param("[1, 2][2] == 1", EMPTY, "index out of bounds", id="list-index-out-of-range"),
    pytest.param('"abc".substring(2, 1) == ""', EMPTY, "index out of range", id="substring-range"),
    pytest.param("[].min() == 1", EMPTY, "min called on empty list", id="min-empty"),
    pytest.param(
        '"a".matches(device.driver + "(")',
        EMPTY,
        "invalid regular expression",
        id="dynamic-bad-regex",
    ),
    pytest.param('{"a": 1, "a": 2}.size() == 1', EMPTY, "repeated key", id="duplicate-map-key"),
    pytest.param(
        "(1).exists(x, true)", EMPTY, "cannot be range of a comprehension", id="range-over-int"
    ),
    pytest.param('int("1.5") == 1', EMPTY, "cannot convert", id="int-parse"),
]


@pytest.mark.parametrize(("expression", "device", "message"), RUNTIME_ERRORS)
def test_runtime_error(expression: str, device: CelDevice, message: str) -> None:
    with pytest.raises(CelError) as caught:
        match(expression, device)
    error = caught.value
    assert message in error.detail
    assert error.phase == "runtime" and error.expression == expression
    assert expression[:60] in str(error) and isinstance(error, InvalidArgument)


def test_missing_key_error_carries_hint() -> None:
    with pytest.raises(
        CelError, match=r"no such key: uuid\. consider guarding the check with has\(\)"
    ):
        match(f'{NV}.uuid == ""', CelDevice(NVIDIA, {}, {}))


def test_invalid_version_attribute_fails_every_selector() -> None:
    device = h100(driverVersion=A.version("580.126.09"))  # leading zero: not semver
    with pytest.raises(CelError, match="attribute driverVersion"):
        match("true", device)


COMPILE_ERRORS = [
    pytest.param("?!", "Syntax error", id="syntax-error"),
    pytest.param("device.driver ==", "Syntax error", id="truncated"),
    pytest.param(
        "1", "must evaluate to bool or the unknown type, not int", id="upstream-type-error"
    ),
    pytest.param("device.driver", "not string", id="string-result"),
    pytest.param(f"{NV_CAP}.memory", "not kubernetes.Quantity", id="quantity-result"),
    pytest.param(
        'device.attributes["x"].y.fooBar()', "undeclared reference to 'fooBar'", id="unknown-method"
    ),
    pytest.param(
        'noSuchFunction("x")', "undeclared reference to 'noSuchFunction'", id="unknown-function"
    ),
    pytest.param("other.driver == 1", "undeclared reference to 'other'", id="unknown-variable"),
    pytest.param('device.foo == "x"', "undefined field 'foo'", id="unknown-device-field"),
    pytest.param('device["driver"] == "x"', "cannot be indexed", id="device-indexed"),
    pytest.param(
        'quantity("1", "2") == quantity("1")',
        "no matching overload for 'quantity'",
        id="wrong-arity",
    ),
    pytest.param(
        'url("https://x").getHost() == "x"', "not supported by gpualloc", id="unsupported-library"
    ),
    pytest.param('"a".matches("(")', "invalid regular expression", id="constant-bad-regex"),
    pytest.param("has(device)", "invalid argument to has() macro", id="has-without-field"),
    pytest.param("[1].all(1, true)", "loop variables", id="macro-needs-identifier"),
    pytest.param("9223372036854775808 > 0", "out of range", id="int-literal-range"),
    pytest.param("Msg{a: 1} == 1", "message construction is not supported", id="message-literal"),
    pytest.param("!" * 120 + "true", "nests deeper", id="too-deep"),
    pytest.param("true && " * 2000 + "true", "more than 10240", id="too-long"),
]


@pytest.mark.parametrize(("expression", "message"), COMPILE_ERRORS)
def test_compile_error(expression: str, message: str) -> None:
    with pytest.raises(CelError) as caught:
        SelectorCache().compile(expression)
    error = caught.value
    assert message in error.detail and error.phase == "compile"
    assert error.expression == expression and expression[:40] in str(error)


def test_allow_multiple_allocations_needs_the_feature() -> None:
    expression = "device.allowMultipleAllocations"
    with pytest.raises(CelError, match="undefined field 'allowMultipleAllocations'"):
        SelectorCache(allow_multiple_allocations_field=False).compile(expression)
    shared = CelDevice(NVIDIA, {}, {}, allow_multiple_allocations=True)
    assert match(expression, shared)


# --- the cost bound ---------------------------------------------------------------------

TEN = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"
RUNAWAYS = [
    pytest.param(
        # The "expensive" case of upstream cel/compile_test.go (estimated 85,555,551 units).
        f"{TEN}.all(x, {TEN}.all(y, {TEN}.all(z, {TEN}.all(z2, {TEN}.all(z3, {TEN}.all(z4, "
        f"{TEN}.all(z5, int('1'.find('[0-9]*')) < 100)))))))",
        id="upstream-expensive",
    ),
    pytest.param(
        "cel.bind(a, 'xxxxxxxxxx', cel.bind(b, a+a+a+a+a+a+a+a+a+a,"
        " cel.bind(c, b+b+b+b+b+b+b+b+b+b, cel.bind(d, c+c+c+c+c+c+c+c+c+c,"
        " cel.bind(e, d+d+d+d+d+d+d+d+d+d, cel.bind(f, e+e+e+e+e+e+e+e+e+e,"
        " cel.bind(g, f+f+f+f+f+f+f+f+f+f, g.size() > 0)))))))",
        id="string-growth",
    ),
    pytest.param(
        '"' + "a" * 100 + '".replace("a", "' + "a" * 100 + '").replace("a", "' + "a" * 100 + '")'
        '.replace("a", "' + "a" * 100 + '").size() > 0',
        id="replace-growth",
    ),
    pytest.param("lists.range(1000000000).size() > 0", id="huge-range"),
    pytest.param(
        f"{TEN}.map(a, {TEN}.map(b, {TEN}.map(c, {TEN}.map(d, {TEN}.map(e,"
        f" {TEN}.map(f, a + b + c + d + e + f)))))) != []",
        id="map-chain",
    ),
]


@pytest.mark.parametrize("expression", RUNAWAYS)
def test_runaway_expression_stops_with_cost_exceeded(expression: str) -> None:
    with pytest.raises(CelCostExceeded, match="actual cost limit exceeded"):
        match(expression)


@pytest.mark.parametrize(
    ("expression", "cost"),
    [
        pytest.param(f'{NV}.type == "gpu"', 4, id="select-and-compare"),
        pytest.param("[1, 2, 3].all(x, x > 0)", 10 + 3 * (2 + 1), id="comprehension-steps"),
    ],
)
def test_cost_limit_is_exact(expression: str, cost: int) -> None:
    assert match(expression, H100, cost_limit=cost)
    with pytest.raises(CelCostExceeded):
        match(expression, H100, cost_limit=cost - 1)


# --- profile memo and counters ----------------------------------------------------------


def test_identical_devices_cost_one_evaluation() -> None:
    cache = SelectorCache()
    selector = cache.compile(
        f'{NV}.productName.matches("H100") && {NV_CAP}.memory.isGreaterThan(quantity("40Gi"))'
    )
    devices = [h100(uuid=A.string(f"GPU-{i}")) for i in range(1000)]
    assert all(selector.matches(d) for d in devices)
    assert cache.evaluations == 1 and cache.profile_hits == 999


def test_distinct_values_read_cost_one_evaluation_each() -> None:
    cache = SelectorCache()
    selector = cache.compile(f'{NV}.productName.lowerAscii().contains("h100")')
    devices = [h100(), T4_0, h100(), T4_1, h100()]
    assert [selector.matches(d) for d in devices] == [True, False, True, False, True]
    assert cache.evaluations == 2


def test_errors_are_memoised_per_profile() -> None:
    cache = SelectorCache()
    selector = cache.compile(f"{NV}.noSuchAttr == 1")
    for _ in range(3):
        with pytest.raises(CelError, match="no such key"):
            selector.matches(H100)
    assert cache.evaluations == 1


def test_selector_reading_a_unique_attribute_evaluates_each_device() -> None:
    cache = SelectorCache()
    selector = cache.compile('device.attributes["resource.kubernetes.io"].pciBusID.endsWith(".0")')
    devices = [
        h100(**{"resource.kubernetes.io/pciBusID": A.string(f"0000:{i:02x}:00.0")})
        for i in range(20)
    ]
    assert all(selector.matches(d) for d in devices)
    assert cache.evaluations == 20


def key(expression: str, device: CelDevice) -> Any:
    return SelectorCache().compile(expression).profile_key(device)


PROFILE_KEYS = [
    pytest.param("true", (), id="reads-nothing"),
    pytest.param(f'device.driver == "{NVIDIA}"', NVIDIA, id="driver"),
    pytest.param(f'{NV}.productName == "x"', A.string("NVIDIA H100 80GB HBM3"), id="one-attribute"),
    pytest.param(f"has({NV}.addressingMode)", None, id="has-missing-attribute"),
    pytest.param(f'{NV_CAP}["memory"].sign() == 1', Quantity.parse("80Gi"), id="capacity-by-index"),
    pytest.param(
        f'device.driver == "x" || {NV}.index > 1',
        (NVIDIA, A.int_(3)),
        id="driver-and-attribute",
    ),
    pytest.param(
        'device.attributes["resource.kubernetes.io"].size() == 2',
        frozenset({("pciBusID", A.string("0000:3b:00.0")), ("pcieRoot", A.string("pci0000:3a"))}),
        id="whole-domain-when-used-as-map",
    ),
    pytest.param(
        '"pciBusID" in device.attributes["resource.kubernetes.io"]',
        A.string("0000:3b:00.0"),
        id="in-reads-one-attribute",
    ),
    pytest.param('"x" in device.attributes["other.example.com"]', None, id="in-missing-domain"),
    pytest.param(
        '"resource.kubernetes.io" in device.attributes',
        frozenset({("pciBusID", A.string("0000:3b:00.0")), ("pcieRoot", A.string("pci0000:3a"))}),
        id="domain-presence-reads-that-domain",
    ),
]


@pytest.mark.parametrize(("expression", "expected"), PROFILE_KEYS)
def test_profile_key_holds_exactly_what_is_read(expression: str, expected: Any) -> None:
    assert key(expression, H100) == expected


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param('device.attributes.exists(d, d == "x")', id="iterate-domains"),
        pytest.param('device.attributes[device.driver].productName == "x"', id="dynamic-domain"),
        pytest.param('cel.bind(d, device, d.driver == "x")', id="device-as-value"),
    ],
)
def test_dynamic_access_widens_the_key(expression: str) -> None:
    other = h100(uuid=A.string("GPU-other"))
    assert key(expression, H100) != key(expression, other)


def test_attribute_key_ignores_unread_attributes() -> None:
    expression = f'{NV}.productName == "NVIDIA H100 80GB HBM3"'
    assert key(expression, H100) == key(expression, h100(uuid=A.string("GPU-other")))


def test_loop_variable_named_device_is_not_the_device() -> None:
    assert key("[1].all(device, device > 0)", H100) == ()


SOUNDNESS_EXPRESSIONS = [
    f'{NV}.type == "gpu"',
    f'has({NV}.type) && {NV}.type == "gpu"',
    f'"type" in {NV}',
    f'"{NVIDIA}" in device.attributes',
    'device.attributes["other.example.com"].x == 1',
    f"{NV}.size() > 1",
    f'device.driver == "{NVIDIA}" || {NV}.index == 1',
    'device.attributes.exists(d, d == "resource.kubernetes.io")',
    f'device.attributes.exists(d, d == "{NVIDIA}")',
    f'device.capacity.exists(d, d == "{NVIDIA}")',
    f'cel.bind(g, {NV}, "index" in g && g.index == 1)',
    f'{NV_CAP}.memory.isGreaterThan(quantity("40Gi"))',
    f'"memory" in {NV_CAP} && {NV_CAP}["memory"].isInteger()',
    'device.attributes[device.driver].type == "gpu"',
]
SHARED_CACHE = SelectorCache()
ATTRIBUTE_NAMES = [
    "type",
    f"{NVIDIA}/type",
    "index",
    "resource.kubernetes.io/pciBusID",
    "other.example.com/x",
]
ATTRIBUTE_VALUES = [A.string("gpu"), A.string("mig"), A.int_(1), A.bool_(True), A.version("1.2.3")]


def outcome(cache: SelectorCache, expression: str, device: CelDevice) -> object:
    try:
        return cache.compile(expression).matches(device)
    except CelError as error:
        return type(error), error.detail


@given(
    st.sampled_from([NVIDIA, "other.example.com"]),
    st.dictionaries(
        st.sampled_from(ATTRIBUTE_NAMES), st.sampled_from(ATTRIBUTE_VALUES), max_size=4
    ),
    st.sampled_from([None, "1Gi", "80Gi", "1.5"]),
)
def test_memoised_outcome_equals_fresh_evaluation(
    driver: str, attributes: dict[str, AttributeValue], memory: str | None
) -> None:
    capacity = {} if memory is None else {"memory": Quantity.parse(memory)}
    for expression in SOUNDNESS_EXPRESSIONS:
        memoised = outcome(SHARED_CACHE, expression, CelDevice(driver, attributes, capacity))
        fresh = outcome(SelectorCache(), expression, CelDevice(driver, attributes, capacity))
        assert memoised == fresh, expression


# --- the compile cache ------------------------------------------------------------------


def test_compile_cache_hits_misses_and_lru_bound() -> None:
    cache = SelectorCache(max_entries=2)
    first = cache.compile("true")
    assert cache.compile("true") is first
    cache.compile("false")
    cache.compile("true")  # refresh: "false" is now the oldest
    cache.compile("1 == 1")
    assert len(cache) == 2 and (cache.compile_hits, cache.compile_misses) == (2, 3)
    assert cache.compile("true") is first
    cache.compile("false")
    assert cache.compile_misses == 4


def test_failed_compiles_are_not_cached() -> None:
    cache = SelectorCache()
    for _ in range(2):
        with pytest.raises(CelError):
            cache.compile("device.foo")
    assert len(cache) == 0 and cache.compile_misses == 2


def test_profile_memo_is_bounded() -> None:
    cache = SelectorCache(max_profiles_per_selector=2)
    selector = cache.compile(f"{NV}.index >= 0")
    devices = [h100(index=A.int_(i)) for i in (1, 2, 3)]
    for device in devices + devices:
        assert selector.matches(device)
    assert cache.evaluations == 6  # round-robin over 3 profiles never hits a 2-entry memo


def test_cache_rejects_non_positive_bounds() -> None:
    with pytest.raises(ValueError):
        SelectorCache(cost_limit=0)


def test_concurrent_matching_agrees() -> None:
    cache = SelectorCache()
    devices = [h100(), T4_0, T4_1] * 50
    expected = [d is not T4_0 and d is not T4_1 for d in devices]

    def run(_: int) -> list[bool]:
        selector = cache.compile(f'{NV_CAP}.memory.compareTo(quantity("40Gi")) >= 0')
        return [selector.matches(d) for d in devices]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, range(8)))
    assert all(r == expected for r in results)
    assert cache.compile_misses + cache.compile_hits == 8


# --- Version ----------------------------------------------------------------------------

# semver.org §11 example chain, each strictly lower than the next.
PRECEDENCE = [
    "1.0.0-alpha",
    "1.0.0-alpha.1",
    "1.0.0-alpha.beta",
    "1.0.0-beta",
    "1.0.0-beta.2",
    "1.0.0-beta.11",
    "1.0.0-rc.1",
    "1.0.0",
    "1.0.1",
    "1.1.0",
    "2.0.0",
]


def test_version_precedence_follows_semver_org() -> None:
    versions = [Version.parse(v) for v in PRECEDENCE]
    assert sorted(reversed(versions)) == versions
    assert all(
        a.compare(b) == -1 and b.compare(a) == 1
        for a, b in zip(versions, versions[1:], strict=False)
    )


@pytest.mark.parametrize(
    "text",
    [
        "1.0",
        "v1.0.0",
        "01.0.0",
        "1.0.0-01",
        "1.0.0-",
        "1.0.0+",
        "1.0.0-a..b",
        "1.0.0 ",
        "a.b.c",
        "1.0.0\n",
    ],
)
def test_version_rejects_non_semver(text: str) -> None:
    assert not Version.is_valid(text)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        pytest.param(" v1.2 ", "1.2.0", id="v-prefix-short"),
        pytest.param("1", "1.0.0", id="major-only"),
        pytest.param("01.002.0003", "1.2.3", id="leading-zeros"),
        pytest.param("1.2.3-rc.1+b", "1.2.3-rc.1+b", id="already-strict"),
    ],
)
def test_version_normalize(text: str, canonical: str) -> None:
    assert str(Version.parse(text, normalize=True)) == canonical


@given(
    st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6)),
    st.lists(st.from_regex(r"[1-9][0-9]{0,3}|[a-z][a-z0-9-]{0,5}", fullmatch=True), max_size=3),
)
def test_version_round_trips_and_orders_like_tuples(
    core: tuple[int, int, int], pre: list[str]
) -> None:
    text = "{}.{}.{}".format(*core) + ("-" + ".".join(pre) if pre else "")
    version = Version.parse(text)
    assert str(version) == text and Version.parse(str(version)) == version
    release = Version(*core)
    assert (version < release) is bool(pre)


@given(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1).filter(lambda b: b != 0))
def test_int_division_and_modulo_truncate_like_cel(a: int, b: int) -> None:
    quotient = math.trunc(a / b) if abs(a) < 2**52 and abs(b) < 2**52 else None
    cache = SelectorCache()
    if a == -(2**63) and b == -1:
        with pytest.raises(CelError, match="overflow"):
            cache.compile(f"{a} / {b} == 0").matches(EMPTY)
        return
    assert cache.compile(f"({a} / {b}) * {b} + {a} % {b} == {a}").matches(EMPTY)
    if quotient is not None:
        assert cache.compile(f"{a} / {b} == {quotient}").matches(EMPTY)
