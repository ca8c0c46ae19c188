"""NodeReport <-> gpualloc.inventory.v1.NodeReport, and the agent pushing it to a real gRPC
server on port 0."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from concurrent import futures
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from protos.common.v1 import topology_pb2
from protos.inventory.v1 import inventory_pb2
from services.inventory.adapters.grpc.report_pb import from_pb_node_report, to_pb_node_report
from services.inventory.adapters.sources.nvidia_smi_xml import parse_nvidia_smi_xml
from services.inventory.cli.agent import main
from services.inventory.core.report import (
    EccCounts,
    MigMode,
    MigProfile,
    RetiredPages,
    XidEvent,
)
from tests.unit.inventory.test_report_json import full_report

DATA = Path(__file__).parents[2] / "data" / "nvidia-smi-xml"
T4 = DATA / "tesla-t4_turing_drv515_telegraf.xml"


def test_full_report_survives_what_the_message_can_carry():
    report = full_report()
    back = from_pb_node_report(to_pb_node_report(report))
    assert back.node == report.node
    assert back.timestamp == report.timestamp
    assert back.labels == report.labels
    assert back.gpu_links == report.gpu_links  # NV18 from the NVLink peers
    assert [(n.name, n.relations) for n in back.nics] == [("mlx5_0", report.nics[0].relations)]
    for sent, got in zip(report.gpus, back.gpus, strict=True):
        migs = tuple(replace(m, index=None) for m in sent.mig_devices)  # no field for the index
        lossless = replace(sent, mig_profiles=got.mig_profiles, mig_devices=migs)
        assert got == lossless
    # MIG profiles keep geometry, SMs and memory; engine counts have no field.
    sent_profile, got_profile = report.gpus[0].mig_profiles[3], back.gpus[0].mig_profiles[3]
    assert got_profile == MigProfile(
        sent_profile.name,
        sent_profile.id,
        sent_profile.slice_count,
        sent_profile.placements,
        memory_mib=None,
        multiprocessors=sent_profile.multiprocessors,
        max_instances=sent_profile.max_instances,
    )


def test_xml_report_defaults_and_folded_xids():
    report = parse_nvidia_smi_xml(T4.read_text(), "n", "t4")
    gpu = replace(
        report.gpus[0],
        minor=None,
        health=replace(
            report.gpus[0].health, xid_events=(XidEvent(79, "2026-01-01T00:00:00Z", 3),)
        ),
    )
    message = to_pb_node_report(replace(report, gpus=(gpu,)))
    assert message.observed_at.ToJsonString() == "2023-04-24T16:22:39Z"  # local time sent as UTC
    assert message.source == "nvidia-smi-xml"
    (gpu_pb,) = message.gpus
    assert gpu_pb.minor_number == -1
    assert gpu_pb.mig_mode == inventory_pb2.MIG_MODE_NOT_SUPPORTED
    assert [e.xid for e in gpu_pb.health.xid_events] == [79, 79, 79]
    (back,) = from_pb_node_report(message).gpus
    assert back.minor is None
    assert back.mig_mode == MigMode(None, None)
    assert back.health.xid_events == (XidEvent(79, "2026-01-01T00:00:00Z", 3),)
    assert back.health.ecc == EccCounts(0, 0, 0, 0)
    assert back.health.retired_pages == RetiredPages(0, 0, False)


def test_pcie_peers_carry_gpu_and_nic_relations():
    message = to_pb_node_report(full_report())
    relations = {
        (p.WhichOneof("peer"), p.gpu_uuid or p.nic_name): p.relation
        for p in message.gpus[1].pcie_peers
    }
    assert relations == {("nic_name", "mlx5_0"): topology_pb2.PCIE_RELATION_SYS}


class RecordingInventory:
    """The ReportNode method of a real Inventory server: keeps what it receives, or refuses."""

    def __init__(self) -> None:
        self.reports: list[inventory_pb2.NodeReport] = []
        self.refuse = 0  # refuse this many calls first
        self.stop_after = 0  # SIGTERM the agent (this process) after this many reports

    def ReportNode(
        self, request: inventory_pb2.ReportNodeRequest, context: grpc.ServicerContext
    ) -> inventory_pb2.ReportNodeResponse:
        if self.refuse:
            self.refuse -= 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "report: not accepted")
        self.reports.append(request.report)
        if len(self.reports) == self.stop_after:
            os.kill(os.getpid(), signal.SIGTERM)
        return inventory_pb2.ReportNodeResponse(generation=len(self.reports))


@pytest.fixture
def inventory() -> Iterator[tuple[RecordingInventory, str]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = RecordingInventory()
    handler = grpc.unary_unary_rpc_method_handler(
        servicer.ReportNode,
        request_deserializer=inventory_pb2.ReportNodeRequest.FromString,
        response_serializer=inventory_pb2.ReportNodeResponse.SerializeToString,
    )
    service = grpc.method_handlers_generic_handler(
        "gpualloc.inventory.v1.Inventory", {"ReportNode": handler}
    )
    server.add_generic_rpc_handlers((service,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def test_agent_pushes_one_report(capsys, inventory):
    servicer, address = inventory
    code = main(["--xml", str(T4), "--inventory", address, "--once", "--node", "n1"])
    assert code == 0
    assert capsys.readouterr() == ("", "")
    (received,) = servicer.reports
    report = from_pb_node_report(received)
    assert report.node == "n1"
    assert [g.uuid for g in report.gpus] == ["GPU-d37e67a5-91dd-3774-a5cb-99096249601a"]


def test_refused_push_exits_1(capsys, inventory):
    servicer, address = inventory
    servicer.refuse = 1
    code = main(["--xml", str(T4), "--inventory", address, "--once"])
    assert code == 1
    assert capsys.readouterr().err == (
        f"gpualloc-agent: ReportNode to {address} failed: INVALID_ARGUMENT: report: not accepted\n"
    )


def test_unreachable_inventory_exits_1_once(capsys):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    code = main(["--xml", str(T4), "--inventory", address, "--once"])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"gpualloc-agent: ReportNode to {address} failed: UNAVAILABLE: ")


def test_periodic_agent_retries_and_stops_on_sigterm(capsys, inventory):
    servicer, address = inventory
    servicer.refuse, servicer.stop_after = 1, 2
    before = signal.getsignal(signal.SIGTERM)
    code = main(["--xml", str(T4), "--inventory", address, "--interval", "0.01"])
    assert code == 0
    assert len(servicer.reports) == 2
    assert capsys.readouterr().err == (
        f"gpualloc-agent: ReportNode to {address} failed: INVALID_ARGUMENT: report: not accepted;"
        " retrying in the next interval\n"
    )
    assert signal.getsignal(signal.SIGTERM) == before  # the agent's handler is gone again
