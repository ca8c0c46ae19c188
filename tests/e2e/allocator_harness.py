"""Building blocks for allocator tests over real gRPC: the example cluster, claims, servers.

The GPU view is examples/cluster (two 8x H100 nodes, an A100 node with DynamicMIG partitions
and counters, an L40S node), as the NVIDIA DRA driver publishes it; claims come from
examples/claims. Used by tests/integration/test_allocator_*.py and the end-to-end tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from protos.common.v1 import dra_pb2
from services.allocator.app.inventory_feed import InventoryFeed, StaticFeed
from services.allocator.app.telemetry import Telemetry, configure_telemetry
from services.allocator.bootstrap import AllocatorApp, build_allocator
from services.allocator.config import AllocatorSettings
from services.allocator.reservations.model import (
    ReservationEvent,
    ReservationStore,
    ReserveOutcome,
    ReserveRequest,
)
from services.common.dra.model import DeviceClass, ResourceClaim
from services.common.health import Health
from services.common.manifests import load_manifests
from services.common.pb.dra_mapping import to_pb_device_class, to_pb_resource_claim

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "cluster"
CLAIMS = ROOT / "examples" / "claims"


def claims(*names: str) -> list[ResourceClaim]:
    """Claims from examples/claims/<name>.yaml, in order."""
    found: list[ResourceClaim] = []
    for name in names:
        found.extend(
            o
            for o in load_manifests([str(CLAIMS / f"{name}.yaml")])
            if isinstance(o, ResourceClaim)
        )
    return found


def pb_claims(*names: str) -> list[dra_pb2.ResourceClaim]:
    return [to_pb_resource_claim(c) for c in claims(*names)]


def pb_example_classes(*names: str) -> list[dra_pb2.DeviceClass]:
    """DeviceClasses of examples/deviceclasses.yaml, as protobuf messages."""
    found = load_manifests([str(ROOT / "examples" / "deviceclasses.yaml")])
    by_name = {o.name: o for o in found if isinstance(o, DeviceClass)}
    return [to_pb_device_class(by_name[name]) for name in names]


def cluster_feed() -> StaticFeed:
    return StaticFeed.from_paths([str(CLUSTER)])


class SilentStore:
    """A real store whose change events never reach subscribers: the at-most-once pub/sub of
    Redis losing messages, made deterministic. Every operation is the wrapped store's."""

    def __init__(self, store: ReservationStore) -> None:
        self.inner = store

    def subscribe(self, callback: Callable[[ReservationEvent], None]) -> object:
        return _NoSubscription()

    def reserve(self, placements: Sequence[Sequence[ReserveRequest]]) -> list[ReserveOutcome]:
        return self.inner.reserve(placements)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class _NoSubscription:
    def close(self) -> None:
        return None


@dataclass
class ServedAllocator:
    app: AllocatorApp
    channel: grpc.Channel
    stub: allocator_pb2_grpc.AllocatorStub
    health: Health
    target: str

    def check(self, service: str) -> int:
        stub = health_pb2_grpc.HealthStub(self.channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status)


def serve_allocator(
    grpc_channel_factory,
    store: ReservationStore | None = None,
    *,
    settings: AllocatorSettings | None = None,
    feed: InventoryFeed | None = None,
    telemetry: Telemetry | None = None,
) -> ServedAllocator:
    """An allocator app on 127.0.0.1:0, ready to answer; close `.app` when done."""
    settings = settings or AllocatorSettings(expire_interval=0.1)
    app = build_allocator(
        settings,
        feed or cluster_feed(),
        store,
        telemetry=telemetry or configure_telemetry({}),
    )
    health = Health()
    served = grpc_channel_factory(
        [app.registration], settings.server, health=health, interceptors=app.interceptors()
    )
    app.attach_health(health)
    assert app.wait_ready(10), "allocator not ready"
    return ServedAllocator(
        app, served.channel, allocator_pb2_grpc.AllocatorStub(served.channel), health, served.target
    )


def owner(name: str) -> tuple[tuple[str, str], ...]:
    """Call metadata naming the owner."""
    return (("x-gpualloc-owner", name),)


def allocate_request(*names: str, **fields) -> pb.AllocateRequest:
    return pb.AllocateRequest(claims=pb_claims(*names), **fields)


# --- allocator processes ---------------------------------------------------------------------


def start_allocator_process(
    args: Sequence[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`python -m services.allocator ARGS` with its output in `log_path`."""
    environment = {**os.environ, "GPUALLOC_LOG_FORMAT": "text", **(env or {})}
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "services.allocator", *args],
            cwd=ROOT,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_serving(target: str, timeout: float = 30.0) -> None:
    """Until the allocator at `target` reports SERVING (view and reservations loaded)."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                status = stub.Check(
                    health_pb2.HealthCheckRequest(service="gpualloc.allocator.v1.Allocator"),
                    timeout=1,
                ).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise AssertionError(f"allocator at {target} not serving within {timeout:g}s")
