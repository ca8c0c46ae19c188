"""OpenTelemetry for the gpualloc servers: RPC server spans, metrics, and a Prometheus endpoint.

Configured once per process, in the composition roots (never in a core), from the standard
variables and one gpualloc setting:

- `OTEL_TRACES_EXPORTER`: `none` (default), `console`, or `otlp` (needs the
  `opentelemetry-exporter-otlp` package; its own `OTEL_EXPORTER_OTLP_*` variables set the
  endpoint, headers and TLS);
- `OTEL_METRICS_EXPORTER`: a comma-separated list of `none` (default), `console`, `otlp` and
  `prometheus`: a pull endpoint, plaintext HTTP `GET /metrics` in the Prometheus text format,
  on `GPUALLOC_METRICS_LISTEN` (default 127.0.0.1:9464, the OpenTelemetry Prometheus port);
  setting `GPUALLOC_METRICS_LISTEN` turns it on by itself, next to any other exporter (OTLP
  and Prometheus see the same instruments);
- `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`(`_ARG`) and
  `OTEL_METRIC_EXPORT_INTERVAL` as the SDK reads them; `OTEL_SDK_DISABLED=true` turns it off.

With every exporter `none` (and nothing attached by a test) the API's no-op tracer and meter
are used, so an untraced server pays nothing. Providers are private to the Telemetry object,
not installed globally, and so is the Prometheus registry, so several servers in one process
(tests) do not fight over them; `gpualloc serve` gives both of its services one Telemetry and
so one endpoint. The current span still lands in the context, which the JSON log lines read.

`TracingInterceptor` gives every RPC except health and reflection a SERVER span (parent taken
from the caller's `traceparent` metadata) and a latency histogram entry labelled with the
method and the status code (`gpualloc.rpc.server.duration`, in seconds: `_seconds` on
/metrics, Prometheus' base unit; `duration_histogram` makes every duration histogram so, with
the same buckets). Each service adds its own
instruments on `Telemetry.meter` (services/allocator/app/telemetry.py, services/inventory/
telemetry.py); gauges are callbacks, worked out when a reader collects (a scrape), not on
the request path.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry import metrics, trace
from opentelemetry.context import attach, detach
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.propagate import extract
from opentelemetry.sdk.metrics import MeterProvider, ObservableGauge
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.common.errors import FailedPrecondition, GpuallocError, InvalidArgument
from services.common.grpc_errors import (
    Handler,
    HandlerInterceptor,
    StreamBehavior,
    UnaryBehavior,
    rewrap_handler,
    status_code_of,
)

__all__ = [
    "DEFAULT_METRICS_LISTEN",
    "METRICS_LISTEN_VARIABLE",
    "DURATION_BUCKETS_SECONDS",
    "Labelled",
    "Telemetry",
    "TracingInterceptor",
    "configure_telemetry",
    "duration_histogram",
]

log = logging.getLogger(__name__)

DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"  # OTEL_METRICS_EXPORTER=prometheus, no address given
METRICS_LISTEN_VARIABLE = "GPUALLOC_METRICS_LISTEN"
_TRACE_EXPORTERS = ("none", "console", "otlp")
_METRIC_EXPORTERS = ("none", "console", "otlp", "prometheus")
# Points one gauge may report per collection (the SDK's default is 2,000, then it folds the
# rest into one overflow point): node-labelled fleet gauges of a 10,000-node fleet fit.
_GAUGE_POINTS = 200_000
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

# Bucket bounds of every duration histogram, in seconds: sub-millisecond solves to the
# longest calls (OpenTelemetry's default bounds, 0 to 10,000, are meant for milliseconds).
DURATION_BUCKETS_SECONDS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)


def duration_histogram(meter: metrics.Meter, name: str, description: str) -> metrics.Histogram:
    """A histogram of durations in seconds (`<name>_seconds` on /metrics)."""
    return meter.create_histogram(
        name,
        unit="s",
        description=description,
        explicit_bucket_boundaries_advisory=DURATION_BUCKETS_SECONDS,
    )


Labelled = Iterable[tuple[float, Mapping[str, str]]]
"""What a labelled gauge's callback returns: (value, attributes) per series."""


@dataclass
class Telemetry:
    """One process's tracer, meter and exporters (the no-op ones when telemetry is off)."""

    tracer: trace.Tracer
    meter: metrics.Meter
    _shutdowns: list[Callable[[], Any]] = field(default_factory=list)
    enabled: bool = True  # False: no-op tracer and meter
    metrics_port: int | None = None  # the Prometheus endpoint's bound port; None: no endpoint

    def __post_init__(self) -> None:
        self.rpc_duration = duration_histogram(
            self.meter, "gpualloc.rpc.server.duration", "RPC latency, per method and status code"
        )

    def interceptors(self) -> list[grpc.ServerInterceptor]:
        """The server interceptors to install: none when telemetry is off (no per-call cost)."""
        return [TracingInterceptor(self.tracer, self.rpc_duration)] if self.enabled else []

    def observe(
        self,
        name: str,
        read: Callable[[], float],
        *,
        description: str,
        gauge: bool = True,
        unit: str = "",
    ) -> None:
        """Report `read()` at each collection, as a gauge or a monotonic counter. The
        description is the metric's HELP (Prometheus wants one on every metric); a unit
        (`s`) becomes its name's suffix (`_seconds`)."""

        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(read())]

        if gauge:
            self.meter.create_observable_gauge(name, [callback], unit=unit, description=description)
        else:
            self.meter.create_observable_counter(
                name, [callback], unit=unit, description=description
            )

    def observe_labelled(
        self, name: str, read: Callable[[], Labelled], *, description: str, unit: str = ""
    ) -> None:
        """A gauge with one series per (value, attributes) that `read()` returns when collected;
        a series it stops returning disappears."""

        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(value, dict(attributes)) for value, attributes in read()]

        self.meter.create_observable_gauge(name, [callback], unit=unit, description=description)

    def shutdown(self) -> None:
        """Flush and stop the exporters (and the Prometheus endpoint)."""
        for shutdown in self._shutdowns:
            shutdown()
        self._shutdowns.clear()


def configure_telemetry(
    environ: Mapping[str, str],
    *,
    service_name: str,
    metrics_listen: str = "",
    metrics_listen_source: str = METRICS_LISTEN_VARIABLE,
    span_processors: Sequence[SpanProcessor] = (),
    metric_readers: Sequence[MetricReader] = (),
) -> Telemetry:
    """Telemetry from the OTEL_* variables and `metrics_listen` (GPUALLOC_METRICS_LISTEN, which
    starts the Prometheus endpoint; `metrics_listen_source` says where the address came from,
    the variable or a flag, for the errors); tests attach in-memory processors and readers.
    Raises InvalidArgument for a bad address, FailedPrecondition when the endpoint cannot
    listen, both naming the source."""
    disabled = environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    traces = () if disabled else _exporters(environ, "OTEL_TRACES_EXPORTER", _TRACE_EXPORTERS)
    metric_kinds = (
        () if disabled else _exporters(environ, "OTEL_METRICS_EXPORTER", _METRIC_EXPORTERS)
    )
    if metrics_listen and not disabled and "prometheus" not in metric_kinds:
        metric_kinds = (*metric_kinds, "prometheus")
    resource = Resource.create(
        {"service.name": environ.get("OTEL_SERVICE_NAME", "").strip() or service_name}
    )
    shutdowns: list[Callable[[], Any]] = []
    tracer: trace.Tracer = trace.NoOpTracer()
    processors = list(span_processors)
    for kind in traces:
        processors.append(BatchSpanProcessor(_span_exporter(kind)))
    if processors:
        provider = TracerProvider(resource=resource)
        for processor in processors:
            provider.add_span_processor(processor)
        tracer = provider.get_tracer("gpualloc")
        shutdowns.append(provider.shutdown)
    meter: metrics.Meter = metrics.NoOpMeter("gpualloc")
    readers = list(metric_readers)
    endpoint: _PrometheusEndpoint | None = None
    for kind in metric_kinds:
        if kind == "prometheus":
            endpoint = _PrometheusEndpoint(
                metrics_listen or DEFAULT_METRICS_LISTEN,
                metrics_listen_source if metrics_listen else "OTEL_METRICS_EXPORTER=prometheus",
            )
            readers.append(endpoint.reader)
        else:
            readers.append(PeriodicExportingMetricReader(_metric_exporter(kind)))
    if readers:
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        meter = meter_provider.get_meter("gpualloc")
        shutdowns.append(meter_provider.shutdown)
    if endpoint is not None:
        endpoint.start()
        shutdowns.append(endpoint.stop)
    return Telemetry(
        tracer,
        meter,
        shutdowns,
        bool(processors or readers),
        endpoint.port if endpoint is not None else None,
    )


def _exporters(environ: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """The exporters a comma-separated variable names (`none`: no others), in order."""
    values = [v.strip().lower() for v in environ.get(name, "").split(",") if v.strip()]
    for value in values:
        if value not in allowed:
            raise InvalidArgument.at(
                name, f"must be one of {', '.join(allowed)} (comma-separated), got {value!r}"
            )
    return tuple(dict.fromkeys(v for v in values if v != "none"))


class _PrometheusEndpoint:
    """OpenTelemetry's Prometheus reader on a private registry, served over plain HTTP by
    prometheus-client's own server (its thread answers `/metrics`; each scrape collects)."""

    def __init__(self, address: str, source: str = METRICS_LISTEN_VARIABLE) -> None:
        self.source = source
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry
        except ImportError:  # pragma: no cover - both are dependencies
            raise InvalidArgument.at(
                "OTEL_METRICS_EXPORTER",
                "prometheus needs the opentelemetry-exporter-prometheus package",
            ) from None
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or int(port) > 65535:
            raise InvalidArgument.at(source, f"must be host:port, got {address!r}")
        self.address = address
        self._host = host.strip("[]")
        self._port = int(port)
        self.registry = CollectorRegistry(auto_describe=True)
        self.reader = PrometheusMetricReader(
            scope_info_enabled=False,  # one scope ("gpualloc"): no otel_scope_* on every series
            registry=self.registry,
            cardinality_limits={ObservableGauge: _GAUGE_POINTS},
        )
        self.port: int | None = None
        self._server: Any = None

    def start(self) -> None:
        from prometheus_client import start_http_server

        try:
            server, _ = start_http_server(self._port, addr=self._host, registry=self.registry)
        except OSError as error:
            raise FailedPrecondition(
                f"cannot listen on {self.address} ({self.source}): in use or not "
                f"local ({error.strerror})"
            ) from None
        self._server = server
        self.port = int(server.server_port)
        log.info(
            "Prometheus metrics on http://%s:%d/metrics",
            self._host,
            self.port,
            extra={"address": self.address, "port": self.port},
        )

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


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

    def __init__(self, tracer: trace.Tracer, duration: metrics.Histogram) -> None:
        super().__init__()
        self._tracer = tracer
        self._duration = duration

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
        return _RpcSpan(self._tracer, self._duration, method, context)


class _RpcSpan:
    """Context manager: the span, its status from the outcome, and the latency sample."""

    def __init__(
        self,
        tracer: trace.Tracer,
        duration: metrics.Histogram,
        method: str,
        context: grpc.ServicerContext,
    ) -> None:
        self._tracer = tracer
        self._duration = duration
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
        elapsed = time.perf_counter() - self._started
        self._duration.record(
            elapsed, {"rpc.method": self._method.lstrip("/"), "rpc.grpc.status_code": code.name}
        )
        self._span_cm.__exit__(kind, error, tb)
        detach(self._token)
