"""OpenTelemetry for the allocator: RPC server spans, child spans, and metrics.

Configured once, in bootstrap, from the standard variables (never in the core):

- `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER`: `none` (default), `console`, or `otlp`
  (needs the `opentelemetry-exporter-otlp` package; its own `OTEL_EXPORTER_OTLP_*` variables
  set the endpoint, headers and TLS);
- `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`(`_ARG`) and
  `OTEL_METRIC_EXPORT_INTERVAL` as the SDK reads them; `OTEL_SDK_DISABLED=true` turns it off.

With both exporters `none` (and nothing attached by a test) the API's no-op tracer and meter
are used, so an untraced server pays nothing. Providers are private to the Telemetry object,
not installed globally, so several servers in one process (tests, `gpualloc serve`) do not
fight over them; the current span still lands in the context, which the JSON log lines read.

`TracingInterceptor` gives every RPC except health and reflection a SERVER span (parent taken
from the caller's `traceparent` metadata) and a latency histogram entry labelled with the
method and the status code. The service adds `solve` and `reserve` child spans.

Metrics (instrument names):

| name | kind | what |
|---|---|---|
| `gpualloc.rpc.server.duration` | histogram, ms | per RPC method and status code |
| `gpualloc.reservation.conflicts` | counter | Conflicts met while reserving (retried or not) |
| `gpualloc.reservation.aborted` | counter | calls answered ABORTED after the retries |
| `gpualloc.reservation.lease_expiries` | counter | expiry events seen (every replica sees each) |
| `gpualloc.solve.duration` | histogram, ms | one core solve |
| `gpualloc.cel.evaluations` | observable counter | real CEL evaluations |
| `gpualloc.cel.profile_hits` | observable counter | CEL results served per profile |
| `gpualloc.inventory.generation` | observable gauge | generation of the view solves use |
| `gpualloc.inventory.generation_lag` | observable gauge | generations received, not indexed |
| `gpualloc.inventory.connected` | observable gauge | 1 while the inventory feed is connected |
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry import metrics, trace
from opentelemetry.context import attach, detach
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.propagate import extract
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.common.errors import GpuallocError, InvalidArgument
from services.common.grpc_errors import (
    Handler,
    HandlerInterceptor,
    StreamBehavior,
    UnaryBehavior,
    rewrap_handler,
    status_code_of,
)

__all__ = ["AllocatorMetrics", "Telemetry", "TracingInterceptor", "configure_telemetry"]

_EXPORTERS = ("none", "console", "otlp")
_SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)  # OTel semantic conventions: the codes that make a server span an error


class AllocatorMetrics:
    """The allocator's instruments on one meter (no-op meter: no cost)."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.meter = meter
        self.rpc_duration = meter.create_histogram(
            "gpualloc.rpc.server.duration", unit="ms", description="RPC latency"
        )
        self.conflicts = meter.create_counter(
            "gpualloc.reservation.conflicts", description="reservation conflicts met"
        )
        self.aborted = meter.create_counter(
            "gpualloc.reservation.aborted", description="calls answered ABORTED after retries"
        )
        self.lease_expiries = meter.create_counter(
            "gpualloc.reservation.lease_expiries", description="lease expiry events seen"
        )
        self.solve_duration = meter.create_histogram(
            "gpualloc.solve.duration", unit="ms", description="one core solve"
        )

    def observe(self, name: str, read: Callable[[], float], *, gauge: bool = True) -> None:
        """Report `read()` at each collection, as a gauge or a monotonic counter."""

        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(read())]

        if gauge:
            self.meter.create_observable_gauge(name, callbacks=[callback])
        else:
            self.meter.create_observable_counter(name, callbacks=[callback])


@dataclass
class Telemetry:
    tracer: trace.Tracer
    metrics: AllocatorMetrics
    _shutdowns: list[Callable[[], Any]] = field(default_factory=list)
    enabled: bool = True  # False: no-op tracer and meter

    def interceptors(self) -> list[grpc.ServerInterceptor]:
        """The server interceptors to install: none when telemetry is off (no per-call cost)."""
        return [TracingInterceptor(self.tracer, self.metrics)] if self.enabled else []

    def shutdown(self) -> None:
        """Flush and stop the exporters."""
        for shutdown in self._shutdowns:
            shutdown()
        self._shutdowns.clear()


def configure_telemetry(
    environ: Mapping[str, str],
    *,
    service_name: str = "gpualloc-allocator",
    span_processors: Sequence[SpanProcessor] = (),
    metric_readers: Sequence[MetricReader] = (),
) -> Telemetry:
    """Telemetry from the OTEL_* variables; tests attach in-memory processors and readers."""
    disabled = environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    traces = "none" if disabled else _exporter(environ, "OTEL_TRACES_EXPORTER")
    metric_kind = "none" if disabled else _exporter(environ, "OTEL_METRICS_EXPORTER")
    resource = Resource.create(
        {"service.name": environ.get("OTEL_SERVICE_NAME", "").strip() or service_name}
    )
    shutdowns: list[Callable[[], Any]] = []
    tracer: trace.Tracer = trace.NoOpTracer()
    processors = list(span_processors)
    if traces != "none":
        processors.append(BatchSpanProcessor(_span_exporter(traces)))
    if processors:
        provider = TracerProvider(resource=resource)
        for processor in processors:
            provider.add_span_processor(processor)
        tracer = provider.get_tracer("gpualloc.allocator")
        shutdowns.append(provider.shutdown)
    meter: metrics.Meter = metrics.NoOpMeter("gpualloc.allocator")
    readers = list(metric_readers)
    if metric_kind != "none":
        readers.append(PeriodicExportingMetricReader(_metric_exporter(metric_kind)))
    if readers:
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        meter = meter_provider.get_meter("gpualloc.allocator")
        shutdowns.append(meter_provider.shutdown)
    return Telemetry(tracer, AllocatorMetrics(meter), shutdowns, bool(processors or readers))


def _exporter(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "").strip().lower() or "none"
    if value not in _EXPORTERS:
        raise InvalidArgument.at(name, f"must be one of {', '.join(_EXPORTERS)}, got {value!r}")
    return value


def _otlp(module: str, name: str, variable: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)()
    except ImportError:
        raise InvalidArgument.at(
            variable, "otlp needs the opentelemetry-exporter-otlp package, which is not installed"
        ) from None


def _span_exporter(kind: str) -> Any:
    if kind == "console":
        return ConsoleSpanExporter()
    return _otlp(
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        "OTLPSpanExporter",
        "OTEL_TRACES_EXPORTER",
    )


def _metric_exporter(kind: str) -> Any:
    if kind == "console":
        return ConsoleMetricExporter()
    return _otlp(
        "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
        "OTLPMetricExporter",
        "OTEL_METRICS_EXPORTER",
    )


# --- the server interceptor -------------------------------------------------------------------


def _metadata_getter() -> Any:
    from opentelemetry.propagators.textmap import Getter

    class MetadataGetter(Getter[Mapping[str, str]]):
        def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
            value = carrier.get(key)
            return None if value is None else [value]

        def keys(self, carrier: Mapping[str, str]) -> list[str]:
            return list(carrier)

    return MetadataGetter()


_GETTER = _metadata_getter()


class TracingInterceptor(HandlerInterceptor):
    """A SERVER span and a latency sample for every RPC but health and reflection.

    Runs inside the error-mapping interceptor (create_server puts extra interceptors last), so
    it sees the typed errors themselves and records the status code they will become."""

    def __init__(self, tracer: trace.Tracer, metrics: AllocatorMetrics) -> None:
        super().__init__()
        self._tracer = tracer
        self._metrics = metrics

    def wrap(self, method: str, handler: Handler) -> Handler:
        return rewrap_handler(
            handler,
            lambda b: self._wrap_unary(method, b),
            lambda b: self._wrap_stream(method, b),
        )

    def _wrap_unary(self, method: str, behavior: UnaryBehavior) -> UnaryBehavior:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            with self._span(method, context):
                return behavior(request, context)

        return call

    def _wrap_stream(self, method: str, behavior: StreamBehavior) -> StreamBehavior:
        def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            with self._span(method, context):
                yield from behavior(request, context)

        return call

    def _span(self, method: str, context: grpc.ServicerContext) -> _RpcSpan:
        return _RpcSpan(self._tracer, self._metrics, method, context)


class _RpcSpan:
    """Context manager: the span, its status from the outcome, and the latency sample."""

    def __init__(
        self,
        tracer: trace.Tracer,
        metrics: AllocatorMetrics,
        method: str,
        context: grpc.ServicerContext,
    ) -> None:
        self._tracer = tracer
        self._metrics = metrics
        self._method = method
        self._context = context

    def __enter__(self) -> None:
        service, _, name = self._method.lstrip("/").partition("/")
        carrier = {
            key: value
            for key, value in self._context.invocation_metadata()
            if isinstance(value, str)
        }
        self._token = attach(extract(carrier, getter=_GETTER))
        self._span_cm = self._tracer.start_as_current_span(
            self._method.lstrip("/"),
            kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
            record_exception=False,
            set_status_on_exception=False,
        )
        self._span = self._span_cm.__enter__()
        self._started = time.perf_counter()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: Any
    ) -> None:
        code = grpc.StatusCode.OK
        if error is not None:
            mapped = status_code_of(error) if isinstance(error, GpuallocError) else None
            code = mapped or grpc.StatusCode.INTERNAL
        self._span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code in _SERVER_ERRORS:
            self._span.set_status(Status(StatusCode.ERROR, str(error) if error else code.name))
            if error is not None and code is grpc.StatusCode.INTERNAL:
                self._span.record_exception(error)
        elapsed_ms = (time.perf_counter() - self._started) * 1000
        self._metrics.rpc_duration.record(
            elapsed_ms, {"rpc.method": self._method.lstrip("/"), "rpc.grpc.status_code": code.name}
        )
        self._span_cm.__exit__(kind, error, tb)
        detach(self._token)
