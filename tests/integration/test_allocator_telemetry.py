"""OpenTelemetry of a real allocator server: spans per RPC (not health), children, metrics."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.app.telemetry import configure_telemetry
from services.common.errors import InvalidArgument
from tests.e2e.allocator_harness import allocate_request, owner, serve_allocator

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def traced(grpc_channel_factory):
    spans = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    telemetry = configure_telemetry(
        {}, span_processors=[SimpleSpanProcessor(spans)], metric_readers=[reader]
    )
    served = serve_allocator(grpc_channel_factory, MemoryReservationStore(), telemetry=telemetry)
    yield served, spans, reader
    served.app.close()


def test_allocate_gets_a_server_span_with_solve_and_reserve_children(traced):
    served, spans, _ = traced
    served.check("")  # health: never traced
    served.stub.Allocate(
        allocate_request("one-h100", reserve=True),
        metadata=(*owner("o"), ("traceparent", f"00-{TRACE_ID}-00f067aa0ba902b7-01")),
        timeout=10,
    )
    finished = spans.get_finished_spans()
    by_name = {span.name: span for span in finished}
    assert set(by_name) == {"gpualloc.allocator.v1.Allocator/Allocate", "solve", "reserve"}
    server = by_name["gpualloc.allocator.v1.Allocator/Allocate"]
    assert server.kind is SpanKind.SERVER
    assert f"{server.context.trace_id:032x}" == TRACE_ID  # continues the caller's trace
    assert server.attributes["rpc.method"] == "Allocate"
    assert server.attributes["rpc.grpc.status_code"] == 0
    for child in ("solve", "reserve"):
        assert by_name[child].parent.span_id == server.context.span_id


def test_errors_set_the_status_code_and_rpc_latency_is_recorded(traced):
    served, spans, reader = traced
    with pytest.raises(grpc.RpcError) as caught:
        served.stub.Allocate(allocate_request(), timeout=10)
    assert isinstance(caught.value, grpc.Call)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    [span] = spans.get_finished_spans()
    assert span.attributes["rpc.grpc.status_code"] == 3
    data = reader.get_metrics_data()
    points = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "gpualloc.rpc.server.duration"
        for point in metric.data.data_points
    ]
    assert [dict(p.attributes) for p in points] == [
        {
            "rpc.method": "gpualloc.allocator.v1.Allocator/Allocate",
            "rpc.grpc.status_code": "INVALID_ARGUMENT",
        }
    ]
    assert served.check("") == health_pb2.HealthCheckResponse.SERVING


def test_inventory_generation_and_cel_metrics_are_observed(traced):
    served, _, reader = traced
    served.stub.Allocate(allocate_request("one-h100"), timeout=10)
    data = reader.get_metrics_data()
    values = {
        metric.name: [getattr(p, "value", None) for p in metric.data.data_points]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert values["gpualloc.inventory.generation"] == [1]
    assert values["gpualloc.inventory.generation_lag"] == [0]
    assert values["gpualloc.inventory.connected"] == [1]
    assert values["gpualloc.cel.evaluations"][0] not in (None, 0)


def test_unknown_exporter_is_a_settings_error():
    with pytest.raises(InvalidArgument) as caught:
        configure_telemetry({"OTEL_TRACES_EXPORTER": "zipkin"})
    assert caught.value.field_path == "OTEL_TRACES_EXPORTER"
