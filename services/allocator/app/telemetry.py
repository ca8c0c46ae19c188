"""The allocator's instruments (services/common/telemetry.py configures the exporters).

| name | kind | what |
|---|---|---|
| `gpualloc.rpc.server.duration` | histogram, s | per RPC method and status code (common) |
| `gpualloc.reservation.conflicts` | counter | Conflicts met while reserving (retried or not) |
| `gpualloc.reservation.aborted` | counter | calls answered ABORTED after the retries |
| `gpualloc.reservation.lease_expiries` | counter | expiry events seen (every replica sees each) |
| `gpualloc.reservation.binding_failures` | counter | released: binding failed or timed out |
| `gpualloc.solve.duration` | histogram, s | one core solve |
| `gpualloc.cel.evaluations` | observable counter | real CEL evaluations |
| `gpualloc.cel.profile_hits` | observable counter | CEL results served per profile |
| `gpualloc.inventory.generation` | observable gauge | generation of the view solves use |
| `gpualloc.inventory.generation_lag` | observable gauge | generations received, not indexed |
| `gpualloc.inventory.connected` | observable gauge | 1 while the inventory feed is connected |
| `gpualloc.inventory.disconnects` | counter | times the feed went from connected to not |
| `gpualloc.store.duration` | histogram, s | one store operation, per operation and outcome |
| `gpualloc.store.errors` | counter | store operations that failed (store unreachable, ...) |

The fleet gauges (`gpualloc.fleet.*`) are fleet_metrics.py's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.trace import SpanProcessor

from services.common.telemetry import METRICS_LISTEN_VARIABLE, Telemetry, duration_histogram
from services.common.telemetry import configure_telemetry as _configure

__all__ = ["STORE_OPERATIONS", "AllocatorMetrics", "Telemetry", "configure_telemetry"]

STORE_OPERATIONS = (
    "reserve",
    "commit",
    "renew",
    "release",
    "get",
    "list",
    "live",
    "expire",
)  # what adapters/store/metered.py times, by ReservationStore's method names


class AllocatorMetrics:
    """The allocator's instruments on one telemetry's meter (no-op meter: no cost)."""

    def __init__(self, telemetry: Telemetry) -> None:
        meter = telemetry.meter
        self.telemetry = telemetry
        self.conflicts = meter.create_counter(
            "gpualloc.reservation.conflicts", description="reservation conflicts met"
        )
        self.aborted = meter.create_counter(
            "gpualloc.reservation.aborted", description="calls answered ABORTED after retries"
        )
        self.lease_expiries = meter.create_counter(
            "gpualloc.reservation.lease_expiries", description="lease expiry events seen"
        )
        self.solve_duration = duration_histogram(meter, "gpualloc.solve.duration", "one core solve")
        self.disconnects = meter.create_counter(
            "gpualloc.inventory.disconnects",
            description="times the inventory feed went from connected to unreachable",
        )
        self.store_duration = duration_histogram(
            meter, "gpualloc.store.duration", "one reservation-store operation"
        )
        self.store_errors = meter.create_counter(
            "gpualloc.store.errors", description="reservation-store operations that failed"
        )
        self.preemptions = meter.create_counter(
            "gpualloc.reservation.preemptions",
            description="reservations revoked by preemptions, by the victim's tenant and rule",
        )
        self.binding_failures = meter.create_counter(
            "gpualloc.reservation.binding_failures",
            description="reservations released because their binding failed or timed out",
        )
        self.stream_items = meter.create_counter(
            "gpualloc.allocate_stream.items",
            description="requests read from AllocateStream calls (each an Allocate)",
        )
        self.stream_pass_items = meter.create_histogram(
            "gpualloc.allocate_stream.pass_items",
            unit="{item}",
            description="items of an AllocateStream placed together in one pass",
            explicit_bucket_boundaries_advisory=(1, 2, 4, 8, 16, 32, 64),
        )
        self.combined_pass_items = meter.create_histogram(
            "gpualloc.allocate_combined.pass_items",
            unit="{item}",
            description="unary Allocate calls placed together in one pass (app/combining.py; "
            "its count is the passes, a call placed alone included)",
            explicit_bucket_boundaries_advisory=(1, 2, 4, 8, 16, 32, 64),
        )
        # Counters exist from the start at 0, so rate() and alerts see a series before the
        # first event instead of none.
        for counter in (self.conflicts, self.aborted, self.lease_expiries, self.disconnects):
            counter.add(0)
        for reason in ("failed", "timed_out"):
            self.binding_failures.add(0, {"reason": reason})
        for operation in STORE_OPERATIONS:
            self.store_errors.add(0, {"operation": operation, "outcome": "Unavailable"})


def configure_telemetry(
    environ: Mapping[str, str],
    *,
    service_name: str = "gpualloc-allocator",
    metrics_listen: str = "",
    metrics_listen_source: str = METRICS_LISTEN_VARIABLE,
    span_processors: Sequence[SpanProcessor] = (),
    metric_readers: Sequence[MetricReader] = (),
) -> Telemetry:
    """services.common.telemetry.configure_telemetry, named for the allocator by default."""
    return _configure(
        environ,
        service_name=service_name,
        metrics_listen=metrics_listen,
        metrics_listen_source=metrics_listen_source,
        span_processors=span_processors,
        metric_readers=metric_readers,
    )
