"""The OpenTelemetry settings the deploy files give the allocator really export its telemetry.

An OTLP endpoint alone exports nothing (the exporters default to `none`), and `otlp` needs the
exporter package the image installs (the `otlp` extra). So the allocator is run here, for real,
with the variables of docker-compose.yml (`OTEL_TRACES_EXPORTER=otlp` in the shell) and of the
production overlay's ConfigMap, the endpoint pointed at an OTLP/gRPC collector stand-in started
here, and the test checks that the collector receives the allocator's spans and metrics under
the service name the deploy files give it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from protos.allocator.v1 import allocator_pb2, allocator_pb2_grpc
from services.allocator.app.inventory_feed import StaticFeed
from services.allocator.bootstrap import build_allocator
from services.allocator.config import AllocatorSettings
from services.common.config import ServerSettings
from services.common.grpc_server import create_server
from services.common.health import Health
from services.serve import DEMO_CLASSES, DEMO_PATHS
from tests.unit.deploy.manifests import ROOT, yaml_documents
from tests.unit.deploy.test_compose import environment, services

pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc", reason="the `otlp` extra")
trace_grpc = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc")
trace_pb2 = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
metrics_grpc = pytest.importorskip(
    "opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc"
)
metrics_pb2 = pytest.importorskip("opentelemetry.proto.collector.metrics.v1.metrics_service_pb2")


ONE_GPU = json_format.ParseDict(
    {"claims": [{"name": "c", "requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "count": "1"}}]}]},
    allocator_pb2.AllocateRequest(),
)  # fmt: skip


@dataclass
class Collector:
    """What an OTLP collector received: (service.name, span name) and (service.name, metric)."""

    spans: set[tuple[str, str]] = field(default_factory=set)
    metrics: set[tuple[str, str]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _service_name(resource: Any) -> str:
    values = {str(a.key): str(a.value.string_value) for a in resource.attributes}
    return values.get("service.name", "")


class _Traces(trace_grpc.TraceServiceServicer):  # type: ignore[misc,name-defined]
    def __init__(self, collector: Collector) -> None:
        self._collector = collector

    def Export(self, request: Any, context: Any) -> Any:
        with self._collector.lock:
            for resource_spans in request.resource_spans:
                name = _service_name(resource_spans.resource)
                for scope in resource_spans.scope_spans:
                    self._collector.spans |= {(name, span.name) for span in scope.spans}
        return trace_pb2.ExportTraceServiceResponse()


class _Metrics(metrics_grpc.MetricsServiceServicer):  # type: ignore[misc,name-defined]
    def __init__(self, collector: Collector) -> None:
        self._collector = collector

    def Export(self, request: Any, context: Any) -> Any:
        with self._collector.lock:
            for resource_metrics in request.resource_metrics:
                name = _service_name(resource_metrics.resource)
                for scope in resource_metrics.scope_metrics:
                    self._collector.metrics |= {(name, m.name) for m in scope.metrics}
        return metrics_pb2.ExportMetricsServiceResponse()


@pytest.fixture
def collector() -> Iterator[tuple[Collector, str]]:
    received = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_grpc.add_TraceServiceServicer_to_server(_Traces(received), server)
    metrics_grpc.add_MetricsServiceServicer_to_server(_Metrics(received), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield received, f"http://127.0.0.1:{port}"
    server.stop(None).wait()


def compose_environment() -> dict[str, str]:
    return environment(services()["allocator-1"], {"OTEL_TRACES_EXPORTER": "otlp",
                                                   "OTEL_METRICS_EXPORTER": "otlp"})  # fmt: skip


def production_environment() -> dict[str, str]:
    base = ROOT / "deploy" / "k8s" / "base"
    (config,) = [d for d in yaml_documents(base / "config.yaml") if d["kind"] == "ConfigMap"]
    (patch,) = yaml_documents(ROOT / "deploy" / "k8s" / "overlays" / "production" / "config.yaml")
    (deployment,) = [
        d for d in yaml_documents(base / "allocator.yaml") if d["kind"] == "Deployment"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {**config["data"], **patch["data"]}
    env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})  # not Secrets
    return {k: str(v) for k, v in env.items()}


@pytest.mark.parametrize(
    "deploy_environment",
    [
        pytest.param(compose_environment, id="docker-compose-with-otel-profile"),
        pytest.param(production_environment, id="kubernetes-production-overlay"),
    ],
)
def test_the_allocator_exports_spans_and_metrics_to_the_configured_collector(
    deploy_environment: Any, collector: tuple[Collector, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    received, endpoint = collector
    env = {k: v for k, v in deploy_environment().items() if k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint  # the collector stand-in, not the real host
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # the OTLP exporters read os.environ themselves
    settings = replace(AllocatorSettings(), device_classes=DEMO_CLASSES)
    app = build_allocator(settings, StaticFeed.from_paths(DEMO_PATHS), environ=env)
    server, port = create_server(
        "127.0.0.1:0", [app.registration], ServerSettings(), health=Health(),
        interceptors=app.interceptors(),
    )  # fmt: skip
    server.start()
    try:
        assert app.wait_ready(10), "the allocator never got the demo inventory"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = allocator_pb2_grpc.AllocatorStub(channel).Allocate(ONE_GPU, timeout=10)
        assert reply.outcome == allocator_pb2.OUTCOME_ALLOCATED
    finally:
        server.stop(None).wait()
        app.close()  # shuts the SDK down, which flushes spans and metrics to the collector
    service = env["OTEL_SERVICE_NAME"]
    assert service == "gpualloc-allocator"
    assert any(name == service and "Allocate" in span for name, span in received.spans), (
        received.spans
    )
    assert (service, "gpualloc.rpc.server.duration") in received.metrics, received.metrics
