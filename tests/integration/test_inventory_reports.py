"""Node reports over real gRPC: ReportNode joins and taints, GetInventory topology and filters,
watch deltas from reports, heartbeats, bad input, and a restart that resumes from Redis."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest

from protos.common.v1 import dra_pb2
from protos.inventory.v1 import inventory_pb2, inventory_pb2_grpc
from services.common.errors import InvalidArgument
from services.common.grpc_errors import error_from_rpc
from services.common.grpc_server import ServiceRegistration
from services.inventory.adapters.grpc.report_pb import to_pb_node_report
from services.inventory.adapters.grpc.servicer import SERVICE_NAME, InventoryServicer
from services.inventory.adapters.sources.nvidia_smi_xml import parse_nvidia_smi_xml
from services.inventory.adapters.sources.topo_matrix import parse_topo_matrix
from services.inventory.app.service import InventoryService
from services.inventory.bootstrap import InventoryApp, build_inventory
from services.inventory.config import InventorySettings
from services.inventory.core.report import NodeReport, XidEvent
from services.inventory.core.topology import apply_topology

DATA = Path(__file__).resolve().parents[1] / "data"
T4_SLICE = (DATA / "resourceslices" / "openshift-v1.35_2x-tesla-t4_condensed.yaml").read_text()
T4_NODE = "harpatil4220c-g9kfm-gpu-c-rd8r8"
T4_UUID_0 = "GPU-da96f367-6e47-8dc4-fd29-4f0b97b9f174"
A5000_XML = DATA / "nvidia-smi-xml" / "2x-rtx-a5000_drv590.44.01_telegraf.xml"
NV2_TOPO = DATA / "topo" / "2x-gpu_nv2_ml-engineering.txt"
T4_XML = DATA / "nvidia-smi-xml" / "tesla-t4_turing_drv515_telegraf.xml"

pb = inventory_pb2


@dataclass
class Served:
    app: InventoryApp
    stub: inventory_pb2_grpc.InventoryStub


@pytest.fixture
def serve(grpc_channel_factory) -> Iterator[Callable[..., Served]]:
    apps: list[InventoryApp] = []

    def start(
        service: InventoryService | None = None, settings: InventorySettings | None = None
    ) -> Served:
        app = build_inventory(service, settings)
        apps.append(app)
        served = grpc_channel_factory([app.registration])
        return Served(app, inventory_pb2_grpc.InventoryStub(served.channel))

    yield start
    for app in apps:
        app.close()


def a5000_report(node: str = "a5000-node") -> NodeReport:
    report = parse_nvidia_smi_xml(A5000_XML.read_text(), node, str(A5000_XML))
    return apply_topology(report, parse_topo_matrix(NV2_TOPO.read_text(), str(NV2_TOPO)))


def t4_report_with_xid() -> NodeReport:
    """The T4 XML, as if it came from the sliced node's gpu-0, which saw XID 79."""
    report = parse_nvidia_smi_xml(T4_XML.read_text(), T4_NODE, str(T4_XML))
    gpu = report.gpus[0]
    health = replace(gpu.health, xid_events=(XidEvent(79, "2026-01-01T00:00:00Z"),))
    sliced = replace(gpu, uuid=T4_UUID_0, health=health)
    extra = replace(gpu, index=1, minor=5, uuid="GPU-extra", pci_bus_id="0000:00:1f.0")
    return replace(report, gpus=(sliced, extra))


def send(stub: inventory_pb2_grpc.InventoryStub, report: NodeReport) -> pb.ReportNodeResponse:
    return stub.ReportNode(pb.ReportNodeRequest(report=to_pb_node_report(report)))


def ids(devices: object) -> list[str]:
    return [f"{d.pool}/{d.device}" for d in devices]  # type: ignore[attr-defined]


def test_report_node_answers_matched_synthesized_and_taints(serve) -> None:
    stub = serve().stub
    stub.ApplyResourceSlices(pb.ApplyResourceSlicesRequest(manifest=T4_SLICE))
    answer = send(stub, t4_report_with_xid())
    assert answer.generation == 2
    assert ids(answer.matched_devices) == [f"{T4_NODE}/gpu-0"]
    assert ids(answer.synthesized_devices) == [f"{T4_NODE}-nvml/gpu-5"]
    [tainted] = answer.taints
    assert ids([tainted.device]) == [f"{T4_NODE}/gpu-0"]
    assert [(t.key, t.value) for t in tainted.taints] == [("gpu.nvidia.com/xid", "79-fell-off-bus")]
    got = stub.GetInventory(pb.GetInventoryRequest(node_name=T4_NODE, include_slices=True))
    [node] = got.inventory.nodes
    sources = {d.device.name: d.source for d in node.devices}
    assert sources == {
        "gpu-0": pb.DEVICE_SOURCE_RESOURCE_SLICE,
        "gpu-1": pb.DEVICE_SOURCE_RESOURCE_SLICE,
        "gpu-5": pb.DEVICE_SOURCE_NODE_REPORT,
    }
    assert len(node.slices) == 2 and node.HasField("reported_at")


def test_get_inventory_fills_the_topology_from_the_report(serve) -> None:
    stub = serve().stub
    send(stub, a5000_report())
    [node] = stub.GetInventory(pb.GetInventoryRequest()).inventory.nodes
    topology = node.topology
    assert [(e.links, e.a < e.b) for e in topology.nvlink] == [(2, True)]
    assert sorted(g.device.device for g in topology.gpus) == ["gpu-0", "gpu-1"]
    assert {g.cpu_affinity for g in topology.gpus} == {"0-23"}
    [omitted] = stub.GetInventory(pb.GetInventoryRequest(omit_topology=True)).inventory.nodes
    assert not omitted.HasField("topology")


def _filter(name: str, value: str) -> pb.AttributeFilter:
    return pb.AttributeFilter(name=name, value=dra_pb2.DeviceAttribute(string=value))


FILTERS = {
    "by-node": (pb.GetInventoryRequest(node_name=T4_NODE), {T4_NODE: 3}),
    "by-driver-none-match": (pb.GetInventoryRequest(driver="example.com"), {}),
    "by-bare-attribute": (
        pb.GetInventoryRequest(attributes=[_filter("productName", "NVIDIA RTX A5000")]),
        {"a5000-node": 2},
    ),
    "by-qualified-attribute": (
        pb.GetInventoryRequest(attributes=[_filter("gpu.nvidia.com/uuid", T4_UUID_0)]),
        {T4_NODE: 1},
    ),
    "by-standard-attribute": (
        pb.GetInventoryRequest(
            attributes=[_filter("resource.kubernetes.io/pciBusID", "0000:00:05.0")]
        ),
        {T4_NODE: 1},
    ),
}


@pytest.mark.parametrize(("request_", "expected"), FILTERS.values(), ids=FILTERS.keys())
def test_get_inventory_filters_nodes_and_devices(serve, request_, expected) -> None:
    stub = serve().stub
    stub.ApplyResourceSlices(pb.ApplyResourceSlicesRequest(manifest=T4_SLICE))
    send(stub, t4_report_with_xid())
    send(stub, a5000_report())
    got = stub.GetInventory(request_).inventory
    assert {n.node.name: len(n.devices) for n in got.nodes} == expected


def test_watch_deltas_carry_report_changes(serve) -> None:
    stub = serve().stub
    stream = stub.WatchInventory(pb.WatchInventoryRequest(), timeout=10)
    assert next(stream).type == pb.WATCH_EVENT_TYPE_SNAPSHOT
    send(stub, a5000_report())
    delta = next(stream)
    assert delta.type == pb.WATCH_EVENT_TYPE_DELTA
    [node] = delta.delta.upserted_nodes
    assert {d.source for d in node.devices} == {pb.DEVICE_SOURCE_NODE_REPORT}
    assert len(node.slices) == 2 and node.topology.nvlink
    stream.cancel()


def test_an_idle_watch_gets_heartbeats(serve) -> None:
    settings = replace(InventorySettings.from_env({}), watch_heartbeat=0.05)
    stub = serve(InventoryService(), settings).stub
    stream = stub.WatchInventory(pb.WatchInventoryRequest(), timeout=10)
    assert [next(stream).type for _ in range(3)] == [
        pb.WATCH_EVENT_TYPE_SNAPSHOT,
        pb.WATCH_EVENT_TYPE_HEARTBEAT,
        pb.WATCH_EVENT_TYPE_HEARTBEAT,
    ]
    stream.cancel()


def _report_message(**changes: object) -> pb.ReportNodeRequest:
    message = to_pb_node_report(a5000_report())
    for name, value in changes.items():
        if name == "gpus":
            del message.gpus[:]
            message.gpus.extend(value)  # type: ignore[arg-type]
        elif name == "labels":
            message.labels.update(value)  # type: ignore[call-overload]
        else:
            setattr(message, name, value)
    return pb.ReportNodeRequest(report=message)


def _two_gpus_like(**fields: object) -> list[pb.GpuReport]:
    gpus = list(to_pb_node_report(a5000_report()).gpus)
    for field, value in fields.items():
        setattr(gpus[1], field, value)
    return gpus


BAD_REPORTS = {
    "no-report": (pb.ReportNodeRequest(), "report"),
    "no-node-name": (_report_message(node_name=""), "report.node_name"),
    "node-name-not-dns": (_report_message(node_name="Not_A_Node"), "report.node_name"),
    "bad-label-value": (
        _report_message(labels={"zone": "not a label value"}),
        'report.labels["zone"]',
    ),
    "duplicate-gpu-uuid": (
        _report_message(gpus=_two_gpus_like(uuid="GPU-12345678-aaaa-bbbb-cccc-0123456789ab")),
        "report.gpus[1].uuid",
    ),
    "bad-pci-bus-id": (_report_message(gpus=_two_gpus_like(pci_bus_id="nope")), "report"),
    "too-many-gpus": (
        _report_message(
            gpus=[
                pb.GpuReport(uuid=f"GPU-{i}", index=i, pci_bus_id=f"0000:{i:02x}:00.0")
                for i in range(65)
            ]
        ),
        "report.gpus",
    ),
}


@pytest.mark.parametrize(("request_", "path"), BAD_REPORTS.values(), ids=BAD_REPORTS.keys())
def test_bad_reports_are_invalid_argument_and_change_nothing(serve, request_, path) -> None:
    served = serve()
    with pytest.raises(grpc.RpcError) as info:
        served.stub.ReportNode(request_)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = error_from_rpc(info.value)
    assert isinstance(error, InvalidArgument)
    assert error.field_path == path
    assert served.app.service.generation == 0


def test_oversized_and_conflicting_applies_are_invalid_argument(serve) -> None:
    served = serve(InventoryService(max_objects_per_apply=2))
    node = "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n"
    for manifest, path in (
        (T4_SLICE + "---\n" + node + "---\n" + node.replace("n1", "n2"), "slices"),
        (node + "---\n" + node.replace("{name: n1}", "{name: n1, labels: {a: b}}"), "nodes[1]"),
    ):
        with pytest.raises(grpc.RpcError) as info:
            served.stub.ApplyResourceSlices(pb.ApplyResourceSlicesRequest(manifest=manifest))
        error = error_from_rpc(info.value)
        assert isinstance(error, InvalidArgument) and error.field_path.startswith(path)
    assert served.app.service.generation == 0


@pytest.mark.redis
def test_a_restarted_inventory_resumes_generation_and_content_from_redis(serve, redis_url) -> None:
    settings = InventorySettings.from_env({"GPUALLOC_REDIS_URL": redis_url})
    first = serve(settings=settings)
    first.stub.ApplyResourceSlices(pb.ApplyResourceSlicesRequest(manifest=T4_SLICE))
    generation = send(first.stub, t4_report_with_xid()).generation
    before = first.stub.GetInventory(pb.GetInventoryRequest(include_slices=True)).inventory
    first.app.close()
    second = serve(settings=settings)
    after = second.stub.GetInventory(pb.GetInventoryRequest(include_slices=True)).inventory
    assert after.generation == generation == 2
    assert after == before
    stream = second.stub.WatchInventory(
        pb.WatchInventoryRequest(since_generation=generation), timeout=10
    )
    send(second.stub, a5000_report())
    event = next(stream)
    assert (event.type, event.generation) == (pb.WATCH_EVENT_TYPE_DELTA, 3)
    stream.cancel()


def test_a_large_snapshot_comes_in_parts(grpc_channel_factory) -> None:
    service = InventoryService()
    service.report(a5000_report("node-a"))
    service.report(a5000_report("node-b"))
    servicer = InventoryServicer(service, heartbeat_seconds=None, snapshot_part_bytes=1)
    registration = ServiceRegistration(
        SERVICE_NAME, inventory_pb2_grpc.add_InventoryServicer_to_server, servicer
    )
    stub = inventory_pb2_grpc.InventoryStub(grpc_channel_factory([registration]).channel)
    stream = stub.WatchInventory(pb.WatchInventoryRequest(), timeout=10)
    parts = [next(stream), next(stream)]
    assert [(p.type, p.generation, p.more) for p in parts] == [
        (pb.WATCH_EVENT_TYPE_SNAPSHOT, 2, True),
        (pb.WATCH_EVENT_TYPE_SNAPSHOT, 2, False),
    ]
    assert [n.node.name for p in parts for n in p.snapshot.nodes] == ["node-a", "node-b"]
    stream.cancel()
    service.close()
