"""Inventory benchmark: ingest a generated cluster, then ReportNode updates under a watcher.

    python -m loadtest.bench inventory [--quick]

Cluster: N nodes x 8 H100-like GPUs (N = 10,000, quick: 500). Nine nodes in ten publish a
ResourceSlice (NVIDIA DRA driver attribute set) and report the same GPUs (joined by UUID); every
tenth only reports (its GPUs become devices of the `<node>-nvml` pool). Every report carries an
NV18 all-to-all NVLink topology and NUMA affinity.

Three processes, so that the client's and the watcher's Python do not steal the server's GIL:
the inventory server (the real gRPC server on loopback, embedded repository), the load client
(this process) and one watcher. Measured:

- ingest: ApplyResourceSlices in batches of 500, then one ReportNode per node (64 in flight);
- watch snapshot: a watcher connecting after ingest gets the whole inventory (in parts);
- updates: ReportNode at 1,000/s for 10 s (quick: 2 s), each changing a node's labels and the
  health of one GPU (an XID 79 comes and goes), so every update is a new generation and a delta;
  throughput, and the time from sending an update to the watcher holding the delta (p50/p99,
  CLOCK_MONOTONIC is shared by the processes);
- server memory: resident set after ingest and at the end (VmRSS, VmHWM).
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

import grpc

from loadtest.report import BenchReport, percentile
from protos.inventory.v1 import inventory_pb2, inventory_pb2_grpc
from services.common.config import ServerSettings
from services.common.dra.model import (
    AttributeValue,
    Device,
    DeviceCapacity,
    ResourcePool,
    ResourceSlice,
)
from services.common.dra.quantity import Quantity
from services.common.pb.dra_mapping import to_pb_resource_slice
from services.inventory.adapters.grpc.report_pb import to_pb_node_report
from services.inventory.core.report import (
    CpuRange,
    Gpu,
    GpuHealth,
    GpuLink,
    GpuPair,
    MigMode,
    NodeReport,
    ReportSource,
    TopologyLevel,
    XidEvent,
)

__all__ = ["make_report", "make_slice", "run"]

GPUS_PER_NODE = 8
DRIVER = "gpu.nvidia.com"
SEQ_LABEL = "gpualloc.io/bench-seq"
RATE = 1000.0
APPLY_BATCH = 500
IN_FLIGHT = 64  # during ingest
MAX_IN_FLIGHT = 500  # during updates (the server allows 1,000 streams per connection)
TIMESTAMP = "2026-01-01T00:00:00Z"
_LINKS = tuple(
    GpuPair(a, b, GpuLink(TopologyLevel.NVLINK, 18))
    for a in range(GPUS_PER_NODE)
    for b in range(a + 1, GPUS_PER_NODE)
)


def node_name(index: int) -> str:
    return f"node-{index:05d}"


def _uuid(node: int, gpu: int) -> str:
    return f"GPU-{node:08x}-{gpu:04x}-4000-8000-{node * 8 + gpu:012x}"


def _pci(gpu: int) -> str:
    return f"0000:{0x18 + gpu * 0x11:02x}:00.0"


def make_slice(index: int) -> ResourceSlice:
    name = node_name(index)
    common = {
        "type": AttributeValue.string("gpu"),
        "productName": AttributeValue.string("NVIDIA H100 80GB HBM3"),
        "brand": AttributeValue.string("Nvidia"),
        "architecture": AttributeValue.string("Hopper"),
        "cudaComputeCapability": AttributeValue.version("9.0.0"),
        "driverVersion": AttributeValue.version("580.95.5"),
        "cudaDriverVersion": AttributeValue.version("13.0.0"),
        "addressingMode": AttributeValue.string("HMM"),
    }
    memory = {"memory": DeviceCapacity(Quantity.parse("81559Mi"))}
    devices = tuple(
        Device(
            f"gpu-{g}",
            common
            | {
                "uuid": AttributeValue.string(_uuid(index, g)),
                "resource.kubernetes.io/pciBusID": AttributeValue.string(_pci(g)),
                "resource.kubernetes.io/pcieRoot": AttributeValue.string(f"pci0000:{g // 4}0"),
            },
            memory,
        )
        for g in range(GPUS_PER_NODE)
    )
    return ResourceSlice(
        f"{name}-{DRIVER}-abcde", DRIVER, ResourcePool(name, 1, 1), devices, node_name=name
    )


def make_report(index: int, seq: int = 0, xid: bool = False) -> NodeReport:
    gpus = []
    for g in range(GPUS_PER_NODE):
        health = GpuHealth(ecc_enabled=True)
        if xid and g == 0:
            health = replace(health, xid_events=(XidEvent(79, TIMESTAMP),))
        gpus.append(
            Gpu(
                index=g,
                uuid=_uuid(index, g),
                product_name="NVIDIA H100 80GB HBM3",
                pci_bus_id=_pci(g),
                minor=g,
                brand="Nvidia",
                architecture="Hopper",
                pci_device_id="0x233010DE",
                pcie_root=f"pci0000:{g // 4}0",
                memory_bytes=85_520_809_984,
                cuda_compute_capability="9.0",
                mig_mode=MigMode(False, False),
                numa_node=g // 4,
                cpu_affinity=(CpuRange(52 * (g // 4), 52 * (g // 4) + 51),),
                health=health,
            )
        )
    return NodeReport(
        node=node_name(index),
        timestamp=TIMESTAMP,
        source=ReportSource.NVML,
        gpus=tuple(gpus),
        driver_version="580.95.05",
        cuda_driver_version="13.0",
        labels={"topology.kubernetes.io/zone": f"zone-{index % 4}", SEQ_LABEL: str(seq)},
        gpu_links=_LINKS,
    )


def _report_request(index: int, seq: int = 0, xid: bool = False) -> inventory_pb2.ReportNodeRequest:
    return inventory_pb2.ReportNodeRequest(report=to_pb_node_report(make_report(index, seq, xid)))


# --- the server process ----------------------------------------------------------------------


def _rss_kib() -> dict[str, int]:
    values = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0])
    return values


def _serve(conn: Connection) -> None:
    from services.common.grpc_server import create_server
    from services.inventory.bootstrap import build_inventory
    from services.inventory.config import InventorySettings

    app = build_inventory(settings=InventorySettings.from_env({}))
    server, port = create_server(
        "127.0.0.1:0",
        [app.registration],
        ServerSettings(max_workers=8, max_concurrent_streams=1000),
    )
    server.start()
    conn.send(port)
    while True:
        message = conn.recv()
        if message == "stop":
            break
        conn.send(_rss_kib() | {"generation": app.service.generation, "cpu_s": time.process_time()})
    conn.send(_rss_kib() | {"cpu_s": time.process_time()})
    server.stop(None)
    app.close()


# --- the watcher process ---------------------------------------------------------------------


def _watch(port: int, conn: Connection) -> None:
    with grpc.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 64 * 2**20)]
    ) as channel:
        stub = inventory_pb2_grpc.InventoryStub(channel)
        started = time.monotonic()
        stream = stub.WatchInventory(inventory_pb2.WatchInventoryRequest())
        received: dict[int, float] = {}
        parts = nodes = 0
        stop = threading.Event()

        def stop_on_message() -> None:
            conn.recv()
            stop.set()
            stream.cancel()

        threading.Thread(target=stop_on_message, daemon=True).start()
        try:
            for event in stream:
                now = time.monotonic()
                if event.type == inventory_pb2.WATCH_EVENT_TYPE_SNAPSHOT:
                    parts += 1
                    nodes += len(event.snapshot.nodes)
                    if not event.more:
                        conn.send({"snapshot_s": now - started, "parts": parts, "nodes": nodes})
                    continue
                for node in event.delta.upserted_nodes:
                    seq = node.node.labels.get(SEQ_LABEL)
                    if seq:
                        received.setdefault(int(seq), now)
        except grpc.RpcError:
            if not stop.is_set():
                raise
        conn.send((received, time.process_time()))


# --- the load client -------------------------------------------------------------------------


def _pipelined(calls: Iterator[grpc.Future[Any]], limit: int) -> int:
    """Run the calls with at most `limit` in flight; returns how many failed."""
    in_flight: list[grpc.Future[Any]] = []
    failed = 0
    for call in calls:
        in_flight.append(call)
        if len(in_flight) >= limit:
            failed += in_flight.pop(0).exception() is not None
    for call in in_flight:
        failed += call.exception() is not None
    return failed


def _ingest(stub: inventory_pb2_grpc.InventoryStub, nodes: int) -> dict[str, float]:
    sliced = [i for i in range(nodes) if i % 10 != 9]
    started = time.perf_counter()
    for start in range(0, len(sliced), APPLY_BATCH):
        batch = [to_pb_resource_slice(make_slice(i)) for i in sliced[start : start + APPLY_BATCH]]
        stub.ApplyResourceSlices(inventory_pb2.ApplyResourceSlicesRequest(slices=batch))
    slices_done = time.perf_counter()
    failed = _pipelined(
        (stub.ReportNode.future(_report_request(i)) for i in range(nodes)), IN_FLIGHT
    )
    done = time.perf_counter()
    if failed:
        raise RuntimeError(f"{failed} ReportNode calls failed during ingest")
    return {
        "slices_s": slices_done - started,
        "reports_s": done - slices_done,
        "total_s": done - started,
    }


def _update_requests(
    nodes: int, count: int, first_seq: int
) -> list[inventory_pb2.ReportNodeRequest]:
    """Update `seq` reports node seq % nodes with label seq; XID 79 on its gpu-0 comes on odd
    passes over the nodes and goes on even ones."""
    return [
        _report_request(seq % nodes, seq, xid=(seq // nodes) % 2 == 0)
        for seq in range(first_seq, first_seq + count)
    ]


def _updates(
    stub: inventory_pb2_grpc.InventoryStub,
    requests: list[inventory_pb2.ReportNodeRequest],
    rate: float,
) -> tuple[dict[int, float], float, int]:
    """Send the requests at `rate` per second, at most MAX_IN_FLIGHT unanswered (a server that
    cannot keep up slows the client down instead of collecting refused streams); returns send
    times by seq, elapsed seconds and failures."""
    sent: dict[int, float] = {}
    in_flight: collections.deque[grpc.Future[Any]] = collections.deque()
    failed = 0
    started = time.monotonic()
    for index, request in enumerate(requests):
        delay = started + index / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        while in_flight and (len(in_flight) >= MAX_IN_FLIGHT or in_flight[0].done()):
            failed += in_flight.popleft().exception() is not None
        sent[int(request.report.labels[SEQ_LABEL])] = time.monotonic()
        in_flight.append(stub.ReportNode.future(request))
    failed += sum(f.exception() is not None for f in in_flight)
    return sent, time.monotonic() - started, failed


def run(quick: bool) -> BenchReport:
    nodes = 500 if quick else 10_000
    seconds = 2.0 if quick else 10.0
    report = BenchReport(
        "inventory",
        setup={
            "nodes": nodes,
            "gpus": nodes * GPUS_PER_NODE,
            "seconds": seconds,
            "cpus": os.cpu_count() or 0,
        },
    )
    spawn = multiprocessing.get_context("spawn")
    server_end, server_conn = spawn.Pipe()
    server = spawn.Process(target=_serve, args=(server_conn,), daemon=True)
    server.start()
    port = server_end.recv()
    options = [("grpc.max_receive_message_length", 64 * 2**20)]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        stub = inventory_pb2_grpc.InventoryStub(channel)
        ingest = _ingest(stub, nodes)
        server_end.send("rss")
        after_ingest = server_end.recv()
        report.add("ingest", **ingest, generation=after_ingest["generation"])
        watcher_end, watcher_conn = spawn.Pipe()
        watcher = spawn.Process(target=_watch, args=(port, watcher_conn), daemon=True)
        watcher.start()
        report.add("watch snapshot", **watcher_end.recv())
        phases = _update_phases(stub, server_end, nodes, seconds)
        watcher_end.send("stop")
        received, _ = watcher_end.recv()
        watcher.join(10)
    server_end.send("stop")
    final = server_end.recv()
    server.join(10)
    for rate, sent, elapsed, failed, cpu_ms in phases:
        _add_update_rows(report, f"@{rate:.0f}/s", sent, received, elapsed, failed, cpu_ms)
    report.add(
        "server memory",
        rss_after_ingest_mib=after_ingest["VmRSS"] / 1024,
        rss_end_mib=final["VmRSS"] / 1024,
        peak_mib=final["VmHWM"] / 1024,
    )
    report.targets.extend(_targets())
    return report


Phase = tuple[float, dict[int, float], float, int, float]  # rate, sent, elapsed, failed, cpu


def _update_phases(
    stub: inventory_pb2_grpc.InventoryStub, server: Connection, nodes: int, seconds: float
) -> list[Phase]:
    """Updates at RATE, then at half of it; the server's CPU per update in each."""
    phases = []
    first_seq = 1
    for rate in (RATE, RATE / 2):
        requests = _update_requests(nodes, int(rate * seconds), first_seq)
        first_seq += len(requests)
        server.send("rss")
        cpu_before = server.recv()["cpu_s"]
        sent, elapsed, failed = _updates(stub, requests, rate)
        time.sleep(0.5)  # let the last deltas arrive
        server.send("rss")
        cpu_ms = (server.recv()["cpu_s"] - cpu_before) * 1000 / max(len(sent), 1)
        phases.append((rate, sent, elapsed, failed, cpu_ms))
    return phases


def _add_update_rows(
    report: BenchReport,
    label: str,
    sent: dict[int, float],
    received: dict[int, float],
    elapsed: float,
    failed: int,
    server_cpu_ms: float,
) -> None:
    latencies_ms = [(received[s] - t) * 1000 for s, t in sent.items() if s in received]
    report.add(
        f"updates {label}",
        sent=len(sent),
        failed=failed,
        per_second=len(sent) / elapsed if elapsed else 0.0,
        delivered=len(latencies_ms),
        server_cpu_ms=server_cpu_ms,
    )
    report.add(
        f"update to watcher {label}",
        p50_ms=statistics.median(latencies_ms) if latencies_ms else 0.0,
        p99_ms=percentile(latencies_ms, 0.99),
        max_ms=max(latencies_ms, default=0.0),
    )


def _targets() -> list[Any]:
    from loadtest.report import Target

    return [
        Target("ingest", "total_s", 30.0),
        Target("updates @1000/s", "per_second", 950.0, at_least=True),
        Target("update to watcher @1000/s", "p99_ms", 50.0),
    ]
