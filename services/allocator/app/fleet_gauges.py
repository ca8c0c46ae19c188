"""The fleet gauges: how many GPUs are free, reserved, committed, per node, pool and model.

Worked out from this process's current view and holdings when a reader collects (a Prometheus
scrape, an OTLP export), never on the request path: one pass over the devices
(core/fleet.py), kept while neither the view nor the holdings changed, so the several gauges of
one scrape, and scrapes of an idle fleet, cost a lookup. The pass costs ~0.1 ms per device
(measured: ~0.7 s for 10,000 GPUs as loadtest/clusters.py lays them out, 31,200 devices; ~7 s
for 80,000), so a busy fleet is recounted at most once per `RECOUNT_FACTOR` times the last
count's duration: counting never takes more than a tenth of a core, and a big fleet's gauges
may be that many seconds old (`gpualloc.fleet.count.duration` says how long the last took).

| name | labels | what |
|---|---|---|
| `gpualloc.fleet.gpus` | node, pool, model, state | GPUs free, reserved, committed, tainted |
| `gpualloc.fleet.gpus.capacity` | node, pool, model | GPUs published, whatever their state |
| `gpualloc.fleet.partitions.free` | node, pool, model, profile | MIG partitions free per profile |
| `gpualloc.fleet.fragmentation` | node | free capacity outside free whole GPUs, 0..1 |
| `gpualloc.fleet.tenant.gpus` | tenant, model, state | GPU equivalents held per tenant |
| `gpualloc.fleet.count.duration` (unit s: `_seconds`) | | how long the last count took |

Cardinality: node-labelled series are bounded by the fleet (a 10,000-node fleet of one model
makes ~40,000 `gpus` series). Owners are not a label: a workload may make a new owner per job
(`team-a/job-4711`); the tenant (services/common/security/principal.py, the owner's part
before the first `/`) is, and only the `MAX_TENANTS` tenants holding the most, the others
summed under `tenant="(other)"`. Every replica reports the same fleet: aggregate with `max`,
not `sum`, across replicas.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from services.allocator.app.cluster_view import ClusterView, ViewSnapshot
from services.allocator.app.live_reservations import Holdings
from services.allocator.core import COMMITTED, RESERVED, STATES, FleetCount, count_fleet
from services.allocator.reservations.hold_kinds import HoldKind
from services.allocator.reservations.model import ReservationState
from services.common.security.principal import tenant_of_owner
from services.common.telemetry import Labelled, Telemetry

__all__ = ["MAX_TENANTS", "OTHER_TENANTS", "FleetGauges"]

MAX_TENANTS = 50
RECOUNT_FACTOR = 10  # a recount waits at least this many times the last count's duration
OTHER_TENANTS = "(other)"


@dataclass(frozen=True, eq=False)
class _Counted:
    view: ViewSnapshot
    version: tuple[int, int]  # the holdings' version and commits
    count: FleetCount
    tenants: dict[tuple[str, str, str], Fraction]
    at: float  # time.monotonic() when counted
    seconds: float  # how long counting took


class FleetGauges:
    """Registers the fleet gauges on a telemetry's meter; thread-safe."""

    def __init__(self, view: ClusterView, holdings: Holdings) -> None:
        self._view = view
        self._holdings = holdings
        self._lock = threading.Lock()
        self._counted: _Counted | None = None

    def register(self, telemetry: Telemetry) -> None:
        gauges: tuple[tuple[str, Callable[[], Labelled], str], ...] = (
            (
                "gpualloc.fleet.gpus",
                self._gpus,
                "GPUs per state: free, reserved, committed, tainted",
            ),
            ("gpualloc.fleet.gpus.capacity", self._capacity, "GPUs published"),
            ("gpualloc.fleet.partitions.free", self._partitions, "MIG partitions free"),
            ("gpualloc.fleet.fragmentation", self._fragmentation, "free capacity not whole"),
            ("gpualloc.fleet.tenant.gpus", self._tenants, "GPU equivalents held per tenant"),
        )
        for name, read, description in gauges:
            telemetry.observe_labelled(name, read, description=description)
        telemetry.observe(
            "gpualloc.fleet.count.duration",
            lambda: self._counted.seconds if self._counted is not None else 0.0,
            unit="s",
            description="how long the last fleet count took",
        )

    def current(self) -> _Counted | None:
        """The counts for the current view and holdings (None before the first view)."""
        view = self._view.current()
        if view is None:
            return None
        version = (self._holdings.version, self._holdings.commits)
        with self._lock:
            counted = self._counted
            now = time.monotonic()
            if counted is None or (
                (counted.view is not view or counted.version != version)
                and now - counted.at >= RECOUNT_FACTOR * counted.seconds
            ):
                counted = self._count(view, version)
                self._counted = counted
            return counted

    def _count(self, view: ViewSnapshot, version: tuple[int, int]) -> _Counted:
        started = time.monotonic()
        by_id = {r.id: r for r in self._holdings.reservations()}

        def committed(owner: str) -> bool:
            found = by_id.get(owner)
            return found is not None and found.state is ReservationState.COMMITTED

        count = count_fleet(view.snapshot, self._holdings.state_for(view), committed)
        tenants: dict[tuple[str, str, str], Fraction] = {}
        for (owner, model), share in count.held.items():
            found = by_id.get(owner)
            if found is None and HoldKind.of(owner) is not HoldKind.PENDING:
                continue
            tenant = tenant_of_owner(found.owner) if found is not None else OTHER_TENANTS
            state = COMMITTED if committed(owner) else RESERVED
            key = (tenant, model, state)
            tenants[key] = tenants.get(key, Fraction(0)) + share
        now = time.monotonic()
        return _Counted(view, version, count, _bounded(tenants), now, now - started)

    def _gpus(self) -> Labelled:
        counted = self.current()
        if counted is None:
            return []
        gpus = counted.count.gpus
        return [  # every state of every (node, pool, model), 0 too: "none free" is a series
            (gpus.get((node, pool, model, state), 0), labels | {"state": state})
            for node, pool, model in sorted(counted.count.capacity())
            for labels in [{"node": node, "pool": pool, "model": model}]
            for state in STATES
        ]

    def _capacity(self) -> Labelled:
        counted = self.current()
        if counted is None:
            return []
        return [
            (count, {"node": node, "pool": pool, "model": model})
            for (node, pool, model), count in sorted(counted.count.capacity().items())
        ]

    def _partitions(self) -> Labelled:
        counted = self.current()
        if counted is None:
            return []
        return [
            (count, {"node": node, "pool": pool, "model": model, "profile": profile})
            for (node, pool, model, profile), count in sorted(counted.count.partitions_free.items())
        ]

    def _fragmentation(self) -> Labelled:
        counted = self.current()
        if counted is None:
            return []
        return [
            (float(score), {"node": node})
            for node, score in sorted(counted.count.fragmentation.items())
        ]

    def _tenants(self) -> Labelled:
        counted = self.current()
        if counted is None:
            return []
        return [
            (float(share), {"tenant": tenant, "model": model, "state": state})
            for (tenant, model, state), share in sorted(counted.tenants.items())
        ]


def _bounded(
    tenants: dict[tuple[str, str, str], Fraction],
) -> dict[tuple[str, str, str], Fraction]:
    """At most MAX_TENANTS tenants by name, those holding the most; the rest summed."""
    totals: dict[str, Fraction] = {}
    for (tenant, _, _), share in tenants.items():
        totals[tenant] = totals.get(tenant, Fraction(0)) + share
    kept = set(sorted(totals, key=lambda t: (-totals[t], t))[:MAX_TENANTS])
    bounded: dict[tuple[str, str, str], Fraction] = {}
    for (tenant, model, state), share in tenants.items():
        key = (tenant if tenant in kept else OTHER_TENANTS, model, state)
        bounded[key] = bounded.get(key, Fraction(0)) + share
    return bounded
