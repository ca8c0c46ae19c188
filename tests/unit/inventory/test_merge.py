"""NodeReport -> DRA devices, counter sets, slices and taints, on the real samples."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from services.common.dra.model import AttributeValue, Device, DeviceTaint, TaintEffect
from services.common.dra.quantity import Quantity
from services.inventory.adapters.sources.nvidia_smi_xml import parse_nvidia_smi_xml
from services.inventory.core.health import ECC_TAINT_KEY, XID_TAINT_KEY
from services.inventory.core.merge import (
    CREATED_ATTRIBUTE,
    GPU_INSTANCE_ATTRIBUTE,
    devices_from_report,
    semver,
    slices_from_report,
    taints_from_health,
)
from services.inventory.core.mig import KNOWN_PROFILE_TABLES
from services.inventory.core.report import (
    EccCounts,
    Gpu,
    GpuHealth,
    MigDevice,
    MigMode,
    NodeReport,
    Placement,
    RemappedRows,
    RetiredPages,
    XidEvent,
)

DATA = Path(__file__).parents[2] / "data" / "nvidia-smi-xml"
TS = "2026-01-01T00:00:00Z"


def report_of(name: str) -> NodeReport:
    return parse_nvidia_smi_xml((DATA / name).read_text(), "node-a", name, TS)


def strings(device: Device) -> dict[str, int | bool | str]:
    return {k: v.value for k, v in device.attributes.items()}


def test_t4_device_has_the_dra_driver_shape():
    devices, counter_sets = devices_from_report(report_of("tesla-t4_turing_drv515_telegraf.xml"))
    assert counter_sets == []
    (device,) = devices
    assert device.name == "gpu-0"
    # Attribute names and values as the NVIDIA DRA driver published them for a Tesla T4
    # (real slice: cncf/k8s-ai-conformance v1.35/openshift/dra-support.md, see
    # shared/samples/resourceslices); the XML lacks addressingMode, compute capability, pcieRoot.
    real_names = {
        "addressingMode", "architecture", "brand", "cudaComputeCapability", "cudaDriverVersion",
        "driverVersion", "productName", "resource.kubernetes.io/pciBusID",
        "resource.kubernetes.io/pcieRoot", "type", "uuid",
    }  # fmt: skip
    assert set(device.attributes) <= real_names
    assert strings(device) == {
        "type": "gpu",
        "uuid": "GPU-d37e67a5-91dd-3774-a5cb-99096249601a",
        "productName": "Tesla T4",
        "brand": "Nvidia",
        "architecture": "Turing",
        "resource.kubernetes.io/pciBusID": "0000:00:1e.0",
        "driverVersion": "515.105.1",
        "cudaDriverVersion": "11.7.0",
    }
    assert device.attributes["driverVersion"] == AttributeValue.version("515.105.1")
    assert str(device.capacity["memory"].value) == "15Gi"  # the real slice says 15Gi too
    assert device.taints == ()


def test_a5000_devices_are_named_by_minor():
    devices, _ = devices_from_report(report_of("2x-rtx-a5000_drv590.44.01_telegraf.xml"))
    assert [d.name for d in devices] == ["gpu-1", "gpu-0"]
    assert [strings(d)["resource.kubernetes.io/pciBusID"] for d in devices] == [
        "0000:81:00.0",
        "0000:c1:00.0",
    ]
    assert strings(devices[0])["addressingMode"] == "HMM"
    assert strings(devices[0])["brand"] == "NvidiaRTX"
    assert str(devices[0].capacity["memory"].value) == "24564Mi"


def test_a100_mig_is_partitionable():
    devices, counter_sets = devices_from_report(
        report_of("a100-sxm4-40gb_mig-2x3g.20gb_drv510.47.03_netdata.xml")
    )
    (counter_set,) = counter_sets
    assert counter_set.name == "gpu-0-counter-set"
    placements = sum(len(p.placements) for p in KNOWN_PROFILE_TABLES["0x20B010DE"])
    assert len(devices) == placements == 25
    assert all(strings(d)["type"] == "mig" for d in devices)  # no whole GPU while MIG is on
    by_name = {d.name: d for d in devices}
    three = by_name["gpu-0-mig-3g20gb-9-4"]
    assert strings(three)["profile"] == "3g.20gb"
    assert strings(three)["parentUUID"] == "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a"
    assert {k: str(c.value) for k, c in three.capacity.items()} == {
        "multiprocessors": "42",
        "copyEngines": "3",
        "decoders": "2",
        "encoders": "0",
        "jpegEngines": "0",
        "ofaEngines": "0",
        "memory": "19968Mi",
    }
    (consumption,) = three.consumes_counters
    assert consumption.counter_set == "gpu-0-counter-set"
    slices = sorted(k for k in consumption.counters if k.startswith("memory-slice-"))
    assert slices == [f"memory-slice-{i}" for i in range(4, 8)]
    # Both 3g.20gb placements are taken by the two existing instances (which one is GI 1 the
    # XML does not say), and nothing else is marked.
    created = sorted(n for n, d in by_name.items() if CREATED_ATTRIBUTE in d.attributes)
    assert created == ["gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4"]
    assert GPU_INSTANCE_ATTRIBUTE not in three.attributes
    assert "uuid" not in three.attributes


def mig_gpu(**changes) -> Gpu:
    base = Gpu(
        index=0,
        uuid="GPU-0",
        product_name="NVIDIA A100-SXM4-40GB",
        pci_bus_id="0000:00:04.0",
        minor=3,
        pci_device_id="0x20B010DE",
        memory_bytes=40960 * 2**20,
        mig_mode=MigMode(True, True),
    )
    return replace(base, **changes)


def test_existing_mig_device_with_placement_is_marked_with_uuid():
    existing = MigDevice(7, 0, uuid="MIG-abc", profile="1g.5gb", profile_id=19,
                         placement=Placement(2, 1))  # fmt: skip
    report = replace(
        report_of("tesla-t4_turing_drv515_telegraf.xml"), gpus=(mig_gpu(mig_devices=(existing,)),)
    )
    devices, _ = devices_from_report(report)
    marked = [d for d in devices if CREATED_ATTRIBUTE in d.attributes]
    assert [d.name for d in marked] == ["gpu-3-mig-1g5gb-19-2"]
    assert marked[0].attributes["uuid"] == AttributeValue.string("MIG-abc")
    assert marked[0].attributes[GPU_INSTANCE_ATTRIBUTE] == AttributeValue.int_(7)


def test_mig_without_profile_data_publishes_existing_devices():
    mig = MigDevice(1, 0, uuid="MIG-x", memory_bytes=2**30, multiprocessors=16)
    gpu = mig_gpu(pci_device_id="0x12345678", mig_devices=(mig,))
    report = replace(report_of("tesla-t4_turing_drv515_telegraf.xml"), gpus=(gpu,))
    devices, counter_sets = devices_from_report(report)
    assert counter_sets == []
    (device,) = devices
    assert device.name == "gpu-3-mig-gi1-ci0"
    assert strings(device)["uuid"] == "MIG-x"
    assert device.capacity["multiprocessors"].value == Quantity.of(16)


def test_health_taints_reach_every_device_of_the_gpu():
    health = GpuHealth(xid_events=(XidEvent(79, TS),))
    report = replace(
        report_of("tesla-t4_turing_drv515_telegraf.xml"), gpus=(mig_gpu(health=health),)
    )
    devices, _ = devices_from_report(report)
    taint = DeviceTaint(XID_TAINT_KEY, TaintEffect.NO_EXECUTE, "79-fell-off-bus", TS)
    assert {d.taints for d in devices} == {(taint,)}


def test_one_slice_per_gpu():
    report = report_of("2x-rtx-a5000_drv590.44.01_telegraf.xml")
    slices = slices_from_report(report, generation=4)
    assert [s.name for s in slices] == [
        "node-a-gpu.nvidia.com-gpu-1",
        "node-a-gpu.nvidia.com-gpu-0",
    ]
    for resource_slice in slices:
        assert resource_slice.driver == "gpu.nvidia.com"
        assert resource_slice.node_name == "node-a"
        assert (resource_slice.pool.name, resource_slice.pool.generation) == ("node-a", 4)
        assert resource_slice.pool.resource_slice_count == 2
        assert len(resource_slice.devices) == 1
        assert resource_slice.shared_counters == ()
    mig = slices_from_report(
        report_of("a100-sxm4-40gb_mig-2x3g.20gb_drv510.47.03_netdata.xml"), 1, pool="p"
    )
    assert [len(s.devices) for s in mig] == [25]
    assert [c.name for c in mig[0].shared_counters] == ["gpu-0-counter-set"]
    assert mig[0].pool.name == "p"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("510.47.03", "510.47.3", id="driver-leading-zero"),
        pytest.param("13.1", "13.1.0", id="cuda-two-parts"),
        pytest.param("8", "8.0.0", id="one-part"),
        pytest.param("580.126.09", "580.126.9", id="dra-example"),
        pytest.param("1.2.3.4", None, id="four-parts"),
        pytest.param("r535", None, id="not-numbers"),
        pytest.param(None, None, id="unknown"),
    ],
)
def test_semver(text, expected):
    assert semver(text) == expected


LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
NO_EXECUTE, NO_SCHEDULE = TaintEffect.NO_EXECUTE, TaintEffect.NO_SCHEDULE
LATER = "2026-01-02T00:00:00Z"


def xids(*codes: int) -> GpuHealth:
    return GpuHealth(xid_events=tuple(XidEvent(code, LATER) for code in codes))


@pytest.mark.parametrize(
    ("health", "expected"),
    [
        pytest.param(GpuHealth(), [], id="healthy"),
        pytest.param(xids(13, 31, 43, 45, 68), [], id="application-xids-only"),
        pytest.param(
            xids(79), [(XID_TAINT_KEY, NO_EXECUTE, "79-fell-off-bus", LATER)], id="xid-79"
        ),
        pytest.param(
            xids(48), [(XID_TAINT_KEY, NO_EXECUTE, "48-double-bit-ecc", LATER)], id="xid-48"
        ),
        pytest.param(
            xids(63, 48), [(XID_TAINT_KEY, NO_EXECUTE, "48-double-bit-ecc", LATER)], id="worst-wins"
        ),
        pytest.param(
            xids(63), [(XID_TAINT_KEY, NO_SCHEDULE, "63-row-remap-pending", LATER)], id="xid-63"
        ),
        pytest.param(
            xids(119), [(XID_TAINT_KEY, NO_EXECUTE, "119-gsp-rpc-timeout", LATER)], id="gsp"
        ),
        pytest.param(
            xids(999), [(XID_TAINT_KEY, NO_SCHEDULE, "999-unclassified", LATER)], id="unknown-xid"
        ),
        pytest.param(
            GpuHealth(ecc=EccCounts(volatile_uncorrectable=2)),
            [(ECC_TAINT_KEY, NO_EXECUTE, "volatile-uncorrectable-2", TS)],
            id="volatile-uncorrectable-ecc",
        ),
        pytest.param(
            GpuHealth(ecc=EccCounts(aggregate_uncorrectable=5)), [], id="aggregate-history-only"
        ),
        pytest.param(
            GpuHealth(remapped_rows=RemappedRows(0, 1, pending=True, failure=False)),
            [(ECC_TAINT_KEY, NO_SCHEDULE, "row-remap-pending", TS)],
            id="row-remap-pending",
        ),
        pytest.param(
            GpuHealth(remapped_rows=RemappedRows(0, 9, pending=True, failure=True)),
            [(ECC_TAINT_KEY, NO_EXECUTE, "row-remap-failure", TS)],
            id="row-remap-failure",
        ),
        pytest.param(
            GpuHealth(retired_pages=RetiredPages(0, 1, pending=True)),
            [(ECC_TAINT_KEY, NO_SCHEDULE, "page-retirement-pending", TS)],
            id="page-retirement-pending",
        ),
        pytest.param(
            GpuHealth(
                xid_events=(XidEvent(94, LATER),),
                remapped_rows=RemappedRows(0, 1, pending=True, failure=False),
            ),
            [
                (XID_TAINT_KEY, NO_SCHEDULE, "94-contained-ecc", LATER),
                (ECC_TAINT_KEY, NO_SCHEDULE, "row-remap-pending", TS),
            ],
            id="xid-and-ecc",
        ),
    ],
)
def test_taints_from_health(health, expected):
    taints = taints_from_health(replace(mig_gpu(), health=health), TS)
    assert [(t.key, t.effect, t.value, t.time_added) for t in taints] == expected
    for taint in taints:
        assert len(taint.value) <= 63 and LABEL_VALUE.match(taint.value)
