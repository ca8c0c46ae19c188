"""`gpualloc serve --demo` as a newcomer runs it: a real process, both services on one port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from protos.allocator.v1 import allocator_pb2, allocator_pb2_grpc
from protos.inventory.v1 import inventory_pb2, inventory_pb2_grpc
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("gpualloc.inventory.v1.Inventory", "gpualloc.allocator.v1.Allocator")


WEB_PORT = free_port()  # the web view `--demo` turns on, here on a port of the test's


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[str], grpc.Channel]]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    log_file = log_path.open("w")
    env = {**os.environ, "GPUALLOC_LOG_FORMAT": "text", "GPUALLOC_REDIS_URL": ""}
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "services.cli", "serve", "--demo"),
            *("--listen", f"127.0.0.1:{port}", "--web-listen", f"127.0.0.1:{WEB_PORT}"),
        ],
        cwd=ROOT,
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        text=True,
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + 30
    while True:
        try:
            status = health.Check(
                health_pb2.HealthCheckRequest(service=SERVICES[1]), timeout=1
            ).status
            if status == health_pb2.HealthCheckResponse.SERVING:
                break
        except grpc.RpcError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait(10)
            log_file.close()
            pytest.fail(f"gpualloc serve did not become healthy:\n{log_path.read_text()}")
        time.sleep(0.2)
    yield process, channel
    channel.close()
    if process.poll() is None:
        process.kill()
        process.wait(10)
    log_file.close()


@pytest.mark.parametrize("service", ["", *SERVICES], ids=["server", "inventory", "allocator"])
def test_health_reports_serving(served, service):
    _, channel = served
    response = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=5
    )
    assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_both_services(served):
    _, channel = served
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    response = next(stub.ServerReflectionInfo(iter([request]), timeout=5))
    names = {s.name for s in response.list_services_response.service}
    assert names >= {*SERVICES, "grpc.health.v1.Health"}


def test_demo_inventory_is_loaded(served):
    _, channel = served
    got = inventory_pb2_grpc.InventoryStub(channel).GetInventory(
        inventory_pb2.GetInventoryRequest(omit_topology=True), timeout=5
    )
    names = [n.node.name for n in got.inventory.nodes]
    assert names == ["a100-node-1", "h100-node-1", "h100-node-2", "l40s-node-1"]


def test_allocate_and_release_through_the_shared_view(served):
    _, channel = served
    stub = allocator_pb2_grpc.AllocatorStub(channel)
    request = json_format.Parse(
        """{"claims": [{"name": "job", "requests": [{"name": "gpus", "exactly": {
             "deviceClassName": "gpu.nvidia.com", "count": "8",
             "selectors": [{"cel": "device.attributes['gpu.nvidia.com'].architecture == 'Hopper'"}]
            }}]}], "reserve": true, "owner": "test"}""",
        allocator_pb2.AllocateRequest(),
    )
    first = stub.Allocate(request, timeout=10)
    second = stub.Allocate(request, timeout=10)
    assert first.outcome == second.outcome == allocator_pb2.OUTCOME_ALLOCATED
    assert {first.node_name, second.node_name} == {"h100-node-1", "h100-node-2"}
    third = stub.Allocate(request, timeout=10)
    assert third.outcome == allocator_pb2.OUTCOME_UNSATISFIABLE
    for response in (first, second):
        stub.Release(
            allocator_pb2.ReleaseRequest(reservation_id=response.reservations[0].id, owner="test"),
            timeout=5,
        )
    assert stub.Allocate(request, timeout=10).outcome == allocator_pb2.OUTCOME_ALLOCATED


@pytest.mark.parametrize(
    ("product", "outcome"),
    [
        pytest.param("NVIDIA H100 80GB HBM3", allocator_pb2.OUTCOME_ALLOCATED, id="nvswitch-h100"),
        pytest.param("NVIDIA L40S", allocator_pb2.OUTCOME_UNSATISFIABLE, id="pcie-only-l40s"),
    ],
)
def test_nvlink_constraint_uses_the_demo_topology(served, product, outcome):
    """The demo seeds `topo -m` output; NVLINK_CONNECTED holds on the NV18 H100 boards only."""
    _, channel = served
    stub = allocator_pb2_grpc.AllocatorStub(channel)
    selector = f"device.attributes['gpu.nvidia.com'].productName == '{product}'"
    request = json_format.ParseDict(
        {
            "claims": [
                {
                    "name": "job",
                    "requests": [
                        {
                            "name": "gpus",
                            "exactly": {
                                "deviceClassName": "gpu.nvidia.com",
                                "count": "4",
                                "selectors": [{"cel": selector}],
                            },
                        }
                    ],
                }
            ],
            "topologyConstraints": [
                {"kind": "TOPOLOGY_CONSTRAINT_KIND_NVLINK_CONNECTED", "minNvlinkLinks": 12}
            ],
            "explain": True,
        },
        allocator_pb2.AllocateRequest(),
    )
    response = stub.Allocate(request, timeout=10)
    assert response.outcome == outcome
    if outcome == allocator_pb2.OUTCOME_ALLOCATED:
        assert response.node_name.startswith("h100-node-")
    else:
        assert "NVLink" in " ".join(response.explanation.messages)


@pytest.mark.parametrize(
    "policy",
    [
        "ALLOCATION_POLICY_FIRST_FIT",
        "ALLOCATION_POLICY_BINPACK",
        "ALLOCATION_POLICY_SPREAD",
        "ALLOCATION_POLICY_FRAGMENTATION_AWARE",
    ],
)
def test_every_policy_places_a_mig_first_available_claim(served, policy):
    _, channel = served
    stub = allocator_pb2_grpc.AllocatorStub(channel)
    small = "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'"
    request = json_format.ParseDict(
        {
            "claims": [
                {
                    "name": "inference",
                    "requests": [
                        {
                            "name": "mig",
                            "firstAvailable": [
                                {
                                    "name": "small",
                                    "deviceClassName": "mig.nvidia.com",
                                    "selectors": [{"cel": small}],
                                },
                                {"name": "whole", "deviceClassName": "gpu.nvidia.com"},
                            ],
                        }
                    ],
                }
            ],
            "policy": policy,
        },
        allocator_pb2.AllocateRequest(),
    )
    response = stub.Allocate(request, timeout=10)
    assert response.outcome == allocator_pb2.OUTCOME_ALLOCATED
    [result] = response.allocations[0].allocation.results
    assert (response.node_name, result.request) == ("a100-node-1", "mig/small")


def test_first_fit_with_a_node_limit_still_prefers_the_first_subrequest(served):
    """Under FIRST_FIT a node that can only give a fallback must not end the search while a
    later node gives the first choice (the restricted path: budget.maxNodes)."""
    _, channel = served
    stub = allocator_pb2_grpc.AllocatorStub(channel)
    l40s = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA L40S'"
    request = json_format.ParseDict(
        {
            "claims": [
                {
                    "name": "job",
                    "requests": [
                        {
                            "name": "gpu",
                            "firstAvailable": [
                                {
                                    "name": "l40s",
                                    "deviceClassName": "gpu.nvidia.com",
                                    "selectors": [{"cel": l40s}],
                                },
                                {"name": "any", "deviceClassName": "gpu.nvidia.com"},
                            ],
                        }
                    ],
                }
            ],
            "policy": "ALLOCATION_POLICY_FIRST_FIT",
            "budget": {"maxNodes": 10},
        },
        allocator_pb2.AllocateRequest(),
    )
    response = stub.Allocate(request, timeout=10)
    [result] = response.allocations[0].allocation.results
    assert (response.node_name, result.request) == ("l40s-node-1", "gpu/l40s")


# Last: it stops the module's server.
def test_the_demo_serves_the_web_view_of_its_fleet(served):
    with urllib.request.urlopen(f"http://127.0.0.1:{WEB_PORT}/", timeout=10) as response:
        page = response.read().decode()
    assert response.status == 200
    for node in ("a100-node-1", "h100-node-1", "h100-node-2", "l40s-node-1"):
        assert f'data-node="{node}"' in page


def test_a_busy_demo_web_port_is_a_warning_not_a_failure(tmp_path):
    """`make run` twice: the second has no web view (its port is the first's) but serves."""
    from services.serve import DEMO_WEB_LISTEN

    host, _, port = DEMO_WEB_LISTEN.rpartition(":")
    holder = socket.socket()
    try:
        holder.bind((host, int(port)))
        holder.listen()
    except OSError:
        pass  # busy already: the condition under test holds anyway
    grpc_port = free_port()
    env = {**os.environ, "GPUALLOC_LOG_FORMAT": "text", "GPUALLOC_REDIS_URL": ""}
    env.pop("GPUALLOC_WEB_LISTEN", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.cli",
            "serve",
            "--demo",
            "--listen",
            f"127.0.0.1:{grpc_port}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "serving inventory and allocator" in line:
                break
        assert any("no web view" in line and "--web-listen" in line for line in lines), lines
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=20)  # drains and closes its output
        holder.close()


def test_sigterm_shuts_down_cleanly(served):
    process, _ = served
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0
