"""The pure inventory state: applied slices joined with NVML reports, generations, staleness.

Inputs are the real samples in tests/data (an OpenShift Tesla T4 ResourceSlice, nvidia-smi XML
of a Tesla T4 and of an A100 with MIG), adjusted with `replace` where a case needs the report to
describe the sliced GPUs (same UUID, or same PCI bus id in NVML's spelling).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from services.common.dra.model import (
    AttributeValue,
    Device,
    DeviceID,
    DeviceTaint,
    Node,
    ResourceSlice,
    TaintEffect,
)
from services.common.dra.parse import load_objects
from services.common.errors import InvalidArgument, NotFound
from services.inventory.adapters.sources.nvidia_smi_xml import parse_nvidia_smi_xml
from services.inventory.core.health import XID_TAINT_KEY
from services.inventory.core.persistent import ChunkedLog
from services.inventory.core.report import Gpu, NodeReport, XidEvent
from services.inventory.core.state import (
    CLUSTER_SCOPE,
    InventoryState,
    apply,
    changes_since,
    delete_slices,
    mark_stale,
    record_report,
    refresh_observed,
    restore,
)
from services.inventory.core.view import UNREACHABLE_TAINT_KEY, DeviceSource
from tests.builders import device, slice_

DATA = Path(__file__).parents[2] / "data"
T4_SLICE_FILE = DATA / "resourceslices" / "openshift-v1.35_2x-tesla-t4_condensed.yaml"
T4_XML = DATA / "nvidia-smi-xml" / "tesla-t4_turing_drv515_telegraf.xml"
A100_MIG_XML = DATA / "nvidia-smi-xml" / "a100-sxm4-40gb_mig-2x3g.20gb_drv510.47.03_netdata.xml"


def _load_slice() -> ResourceSlice:
    (loaded,) = load_objects(T4_SLICE_FILE.read_text(), str(T4_SLICE_FILE))
    assert isinstance(loaded, ResourceSlice)
    return loaded


T4_SLICE = _load_slice()
NODE = T4_SLICE.node_name or ""
POOL = T4_SLICE.pool.name
DRIVER = T4_SLICE.driver
UUID_0 = "GPU-da96f367-6e47-8dc4-fd29-4f0b97b9f174"  # gpu-0 of the slice, at 0000:00:04.0
UUID_1 = "GPU-204349eb-0405-e927-278b-8804172f1be3"  # gpu-1, at 0000:00:05.0
TTL = 120.0


def t4_report(*gpus: Gpu) -> NodeReport:
    report = parse_nvidia_smi_xml(T4_XML.read_text(), NODE, str(T4_XML))
    return replace(report, gpus=gpus or report.gpus)


T4_GPU = t4_report().gpus[0]  # GPU-d37e67a5-…, 0000:00:1e.0: not in the slice


def gpu(index: int, uuid: str, pci: str, *xids: int) -> Gpu:
    health = replace(
        T4_GPU.health, xid_events=tuple(XidEvent(x, "2026-01-01T00:00:00Z") for x in xids)
    )
    return replace(T4_GPU, index=index, minor=index, uuid=uuid, pci_bus_id=pci, health=health)


def slice_device(resource_slice: ResourceSlice, name: str) -> Device:
    return next(d for d in resource_slice.devices if d.name == name)


def dev(name: str, pool: str = POOL) -> DeviceID:
    return DeviceID(DRIVER, pool, name)


def with_device(resource_slice: ResourceSlice, name: str, **changes: object) -> ResourceSlice:
    devices = tuple(
        replace(d, **changes) if d.name == name else d  # type: ignore[arg-type]
        for d in resource_slice.devices
    )
    return replace(resource_slice, devices=devices)


def legacy_pci_attributes(resource_slice: ResourceSlice) -> ResourceSlice:
    """gpu-1 as NVIDIA DRA v25.3-v25.8 published it: `pcieBusID`, no uuid to join on."""
    attributes = dict(slice_device(resource_slice, "gpu-1").attributes)
    del attributes["uuid"], attributes["resource.kubernetes.io/pciBusID"]
    attributes["pcieBusID"] = AttributeValue.string("00000000:00:05.0")
    return with_device(resource_slice, "gpu-1", attributes=attributes)


def ingest(report: NodeReport, *slices: ResourceSlice) -> InventoryState:
    state, _ = apply(InventoryState(), slices or (T4_SLICE,))
    state, _ = record_report(state, report, observed_at=1000.0)
    return state


# --- join ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JoinCase:
    report: NodeReport
    matched: tuple[DeviceID, ...]
    synthesized: tuple[DeviceID, ...]
    slices: tuple[ResourceSlice, ...] = (T4_SLICE,)
    warning: str = ""


NVML_POOL = f"{NODE}-nvml"
JOIN_CASES = {
    "by-uuid": JoinCase(
        t4_report(gpu(0, UUID_0, "0000:00:04.0"), gpu(1, UUID_1, "0000:00:05.0")),
        (dev("gpu-0"), dev("gpu-1")),
        (),
    ),
    "by-pci-bus-id-when-the-uuid-differs": JoinCase(
        t4_report(gpu(0, "GPU-other", "0000:00:05.0")),
        (dev("gpu-1"),),
        (),
        warning="joined to GPU-other by PCI bus id 0000:00:05.0",
    ),
    "by-legacy-pcie-bus-id-attribute-in-nvml-spelling": JoinCase(
        t4_report(gpu(0, "GPU-other", "0000:00:05.0")),
        (dev("gpu-1"),),
        (),
        slices=(legacy_pci_attributes(T4_SLICE),),
    ),
    "uncovered-gpu-becomes-a-device-of-the-nvml-pool": JoinCase(
        t4_report(), (), (dev("gpu-0", NVML_POOL),)
    ),
    "covered-and-uncovered-gpus-side-by-side": JoinCase(
        t4_report(gpu(0, UUID_0, "0000:00:04.0"), gpu(7, "GPU-extra", "0000:00:1e.0")),
        (dev("gpu-0"),),
        (dev("gpu-7", NVML_POOL),),
    ),
}


@pytest.mark.parametrize("case", JOIN_CASES.values(), ids=JOIN_CASES.keys())
def test_reports_join_slice_devices_by_uuid_else_pci_bus_id(case: JoinCase) -> None:
    view = ingest(case.report, *case.slices).view(NODE)
    assert view is not None
    assert view.matched == case.matched
    assert view.synthesized == case.synthesized
    synthesized = [d for d in view.devices if d.source is DeviceSource.NODE_REPORT]
    assert [d.id for d in synthesized] == list(case.synthesized)
    assert all(d.pool_generation == 1 for d in synthesized)
    assert any(case.warning in w for w in view.warnings) if case.warning else not view.warnings


def test_an_uncovered_mig_gpu_becomes_partitions_with_a_counter_set() -> None:
    report = parse_nvidia_smi_xml(A100_MIG_XML.read_text(), "a100-node", str(A100_MIG_XML))
    state, _ = record_report(InventoryState(), report, observed_at=1000.0)
    view = state.view("a100-node")
    assert view is not None
    assert view.synthesized and {d.pool for d in view.synthesized} == {"a100-node-nvml"}
    assert all("-mig-" in d.device for d in view.synthesized)
    assert [c.counter_set.name for c in view.counter_sets] == ["gpu-0-counter-set"]
    assert view.topology is not None
    [a100] = view.topology.gpus
    assert a100.device is None and set(a100.partitions) == set(view.synthesized)


def test_the_topology_names_the_devices_each_gpu_backs() -> None:
    report = t4_report(gpu(0, UUID_0, "0000:00:04.0"), gpu(7, "GPU-extra", "0000:00:1e.0"))
    view = ingest(report).view(NODE)
    assert view is not None and view.topology is not None
    assert {g.uuid: g.device for g in view.topology.gpus} == {
        UUID_0: dev("gpu-0"),
        "GPU-extra": dev("gpu-7", NVML_POOL),
    }


# --- health taints ---------------------------------------------------------------------------

FOUR_TAINTS = tuple(DeviceTaint(f"example.com/t{i}", TaintEffect.NO_SCHEDULE) for i in range(4))


@dataclass(frozen=True)
class TaintCase:
    xids: tuple[int, ...]
    published: tuple[DeviceTaint, ...]
    expected: tuple[tuple[str, str, TaintEffect], ...]  # (key, value, effect) on gpu-0
    warning: str = ""


TAINT_CASES = {
    "fatal-xid-taints-noexecute": TaintCase(
        (79,), (), ((XID_TAINT_KEY, "79-fell-off-bus", TaintEffect.NO_EXECUTE),)
    ),
    "application-xid-leaves-the-gpu-untainted": TaintCase((13,), (), ()),
    "health-taint-replaces-a-published-taint-of-the-same-key": TaintCase(
        (48,),
        (DeviceTaint(XID_TAINT_KEY, TaintEffect.NO_SCHEDULE, "old"),),
        ((XID_TAINT_KEY, "48-double-bit-ecc", TaintEffect.NO_EXECUTE),),
    ),
    "at-most-four-taints-published-ones-kept": TaintCase(
        (79,),
        FOUR_TAINTS,
        tuple((t.key, t.value, t.effect) for t in FOUR_TAINTS),
        warning="at most 4 taints, dropped gpu.nvidia.com/xid=79-fell-off-bus:NoExecute",
    ),
}


@pytest.mark.parametrize("case", TAINT_CASES.values(), ids=TAINT_CASES.keys())
def test_health_becomes_taints_on_the_joined_devices(case: TaintCase) -> None:
    published = with_device(T4_SLICE, "gpu-0", taints=case.published)
    state = ingest(t4_report(gpu(0, UUID_0, "0000:00:04.0", *case.xids)), published)
    view = state.view(NODE)
    assert view is not None
    [effective] = view.slices
    taints = slice_device(effective, "gpu-0").taints
    assert [(t.key, t.value, t.effect) for t in taints] == list(case.expected)
    assert slice_device(effective, "gpu-1") is slice_device(published, "gpu-1")  # untouched
    assert any(case.warning in w for w in view.warnings) if case.warning else not view.warnings


# --- generations and staleness ---------------------------------------------------------------


def test_a_report_equal_but_for_its_time_only_refreshes_liveness() -> None:
    report = t4_report()
    state = ingest(report)
    again, change = record_report(state, replace(report, timestamp="2030-01-01T00:00:00Z"), 2000.0)
    assert change is None and again.generation == state.generation
    assert again.view(NODE) is state.view(NODE)
    record = again.entries[NODE].record
    assert record is not None and record.observed_at == 2000.0
    assert record.report.timestamp == report.timestamp  # the view stays the one published


def test_the_nvml_pool_generation_bumps_when_its_device_set_changes() -> None:
    two = t4_report(gpu(3, "GPU-a", "0000:00:1e.0"), gpu(4, "GPU-b", "0000:00:1f.0"))
    state = ingest(two)
    state, _ = record_report(state, t4_report(gpu(3, "GPU-a", "0000:00:1e.0")), 1001.0)
    view = state.view(NODE)
    assert view is not None
    assert [(d.id.device, d.pool_generation) for d in view.devices if d.id.pool == NVML_POOL] == [
        ("gpu-3", 2)
    ]
    state, _ = record_report(state, t4_report(gpu(3, "GPU-a", "0000:00:1e.0", 79)), 1002.0)
    view = state.view(NODE)
    assert view is not None and {
        d.pool_generation for d in view.devices if d.id.pool == NVML_POOL
    } == {2}


def test_a_stale_report_taints_only_nvml_derived_devices_unreachable() -> None:
    report = t4_report(gpu(0, UUID_0, "0000:00:04.0"), gpu(7, "GPU-extra", "0000:00:1e.0"))
    state = ingest(report)
    same, change = mark_stale(state, now=1000.0 + TTL, ttl=TTL)
    assert change is None and same.generation == state.generation
    stale, change = mark_stale(state, now=1000.0 + TTL + 1, ttl=TTL)
    assert change is not None and change.nodes == {NODE} and change.reason == "stale"
    view = stale.view(NODE)
    assert view is not None
    tainted = {d.id: [t.key for t in d.device.taints] for d in view.devices}
    assert tainted == {
        dev("gpu-0"): [],
        dev("gpu-1"): [],
        dev("gpu-7", NVML_POOL): [UNREACHABLE_TAINT_KEY],
    }
    [(device_id, (taint,))] = view.taints
    assert (device_id, taint.effect, taint.time_added) == (
        dev("gpu-7", NVML_POOL),
        TaintEffect.NO_SCHEDULE,
        "1970-01-01T00:18:40Z",  # observed at 1000 s + the 120 s TTL
    )
    again, change = mark_stale(stale, now=5000.0, ttl=TTL)
    assert change is None and again.generation == stale.generation
    fresh, change = record_report(again, report, observed_at=5000.0)
    assert change is not None and fresh.generation == stale.generation + 1
    view = fresh.view(NODE)
    assert view is not None and not view.taints


def test_staleness_of_a_fully_covered_node_changes_no_taint_and_no_generation() -> None:
    state = ingest(t4_report(gpu(0, UUID_0, "0000:00:04.0")))
    stale, change = mark_stale(state, now=10_000.0, ttl=TTL)
    assert change is None and stale.generation == state.generation
    record = stale.entries[NODE].record
    assert record is not None and record.stale
    assert refresh_observed(stale, 20_000.0).entries[NODE].record.observed_at == 20_000.0  # type: ignore[union-attr]


# --- apply / delete / log --------------------------------------------------------------------


def test_slices_and_nodes_apply_in_one_generation_and_reapplying_is_a_no_op() -> None:
    node = Node(NODE, {"zone": "a"})
    state, change = apply(InventoryState(), [T4_SLICE], [node])
    assert change is not None and (state.generation, change.nodes) == (1, frozenset({NODE}))
    view = state.view(NODE)
    assert view is not None and view.node.labels == {"zone": "a"}
    same, change = apply(state, [T4_SLICE], [node])
    assert change is None and same is state


def test_a_slice_that_moves_to_another_node_changes_both_nodes() -> None:
    first = slice_("s", device("gpu-0")).node("node-a").pool("p").build()
    moved = replace(first, node_name="node-b")
    state, _ = apply(InventoryState(), [first])
    state, change = apply(state, [moved])
    assert change is not None and change.nodes == {"node-a", "node-b"}
    assert state.node_keys() == {"node-b"}
    assert state.slice_keys == {"s": "node-b"}


def test_cluster_wide_slices_live_under_the_cluster_key() -> None:
    shared = slice_("shared", device("nic-0")).all_nodes().pool("fabric").build()
    state, change = apply(InventoryState(), [shared])
    assert change is not None and change.nodes == {CLUSTER_SCOPE}
    assert state.slices_of(CLUSTER_SCOPE) == (shared,)


def test_duplicate_names_in_one_request_are_invalid_and_nothing_is_applied() -> None:
    other = replace(T4_SLICE, pool=replace(T4_SLICE.pool, generation=2))
    with pytest.raises(InvalidArgument) as info:
        apply(InventoryState(), [T4_SLICE, other])
    assert info.value.field_path == "slices[1].metadata.name"


@dataclass(frozen=True)
class SyncCase:
    upsert: tuple[str, ...]  # slice names applied (on node "n-<name>")
    delete: tuple[str, ...]
    expected: tuple[str, ...]  # slice names after
    changed: frozenset[str] | None  # the change's node keys; None: no change


SYNC_CASES = {
    "apply-and-delete-in-one-generation": SyncCase(
        ("c",), ("a",), ("b", "c"), frozenset({"n-a", "n-c"})
    ),
    "missing-names-are-ignored": SyncCase((), ("nope",), ("a", "b"), None),
    "a-name-in-both-is-replaced-not-deleted": SyncCase(("a",), ("a",), ("a", "b"), None),
    "delete-only": SyncCase((), ("a", "b", "a"), (), frozenset({"n-a", "n-b"})),
}


@pytest.mark.parametrize("case", SYNC_CASES.values(), ids=SYNC_CASES.keys())
def test_apply_with_delete_is_one_atomic_change(case: SyncCase) -> None:
    def named(name: str) -> ResourceSlice:
        return slice_(name, device("gpu-0")).node(f"n-{name}").pool(f"p-{name}").build()

    state, _ = apply(InventoryState(), [named("a"), named("b")])
    after, change = apply(state, [named(n) for n in case.upsert], delete=case.delete)
    assert sorted(after.slices) == list(case.expected)
    if case.changed is None:
        assert change is None and after is state
    else:
        assert change is not None and change.nodes == case.changed
        assert after.generation == state.generation + 1
        assert set(after.slice_keys) == set(case.expected)


def test_deleting_a_missing_slice_deletes_nothing() -> None:
    state, _ = apply(InventoryState(), [T4_SLICE])
    with pytest.raises(NotFound):
        delete_slices(state, [T4_SLICE.name, "nope"])
    gone, change = delete_slices(state, [T4_SLICE.name])
    assert change is not None and gone.node_keys() == frozenset()


@pytest.mark.parametrize(
    ("since", "expected"),
    [
        pytest.param(7, (8, 9, 10), id="within-the-log"),
        pytest.param(10, (), id="up-to-date"),
        pytest.param(1, None, id="older-than-the-log"),
        pytest.param(-1, None, id="no-generation"),
    ],
)
def test_changes_since_reads_the_bounded_log(since: int, expected: tuple[int, ...] | None) -> None:
    state = InventoryState(log=ChunkedLog(3))  # keeps at least the newest 3 changes
    for index in range(10):
        built = slice_(f"s{index}", device("gpu-0")).node(f"n{index}").pool(f"p{index}").build()
        state, _ = apply(state, [built])
    changes = changes_since(state, since)
    assert (None if changes is None else tuple(c.generation for c in changes)) == expected


def test_restore_rebuilds_the_same_views_at_the_same_generation() -> None:
    report = t4_report(gpu(0, UUID_0, "0000:00:04.0", 79), gpu(7, "GPU-extra", "0000:00:1e.0"))
    state = ingest(report)
    state, _ = mark_stale(state, now=10_000.0, ttl=TTL)
    restored = restore(
        state.generation, state.slices.values(), state.nodes.values(), state.reports.values()
    )
    assert restored.generation == state.generation
    assert restored.view(NODE) == state.view(NODE)
    assert restored.slice_keys == state.slice_keys
    assert changes_since(restored, state.generation - 1) is None  # the log starts empty
