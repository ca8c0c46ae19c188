"""Composition root of the allocator: settings + a feed (+ a store) -> a servable app.

    app = build_allocator(settings, feed)                 # store from settings.redis_url
    server, port = create_server(addr, [app.registration], settings.server,
                                 health=health, interceptors=app.interceptors())
    app.attach_health(health)
    server.start()
    ...
    app.close()

Nothing connects at import time. `build_allocator` starts the background pieces: the view's
builder thread, the feed (which delivers the first snapshot as soon as it has one), and the
holdings' event and janitor threads.

Health: the allocator's service name reports SERVING once it has an inventory view and has
loaded the live reservations, NOT_SERVING before (so a Kubernetes readiness probe waits). The
extra name `gpualloc.allocator.v1.Allocator/inventory` reports whether the inventory feed is
connected: a broken feed does not stop serving (the last view stays valid), it is only
reported there, in the logs (once when it is lost, once when it is back: app/feed_watch.py) and in
the `gpualloc.inventory.connected` and `.disconnects` metrics.

Metrics: with telemetry on, the store is timed (adapters/store/metered.py) and the fleet gauges are
registered (app/fleet_gauges.py); `GPUALLOC_METRICS_LISTEN` serves them all on `/metrics`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from protos.allocator.v1 import allocator_pb2_grpc
from services.allocator.adapters.grpc.mapping import ClaimReader
from services.allocator.adapters.grpc.servicer import ACCESS, SERVICE_NAME, AllocatorServicer
from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.adapters.store.memory_quota import MemoryQuotaLedger
from services.allocator.adapters.store.metered import MeteredStore
from services.allocator.adapters.store.redis_quota import RedisQuotaLedger
from services.allocator.adapters.store.redis_store import RedisReservationStore
from services.allocator.adapters.web.server import WebSettings, WebTls, WebView
from services.allocator.app.cluster_view import ClusterView
from services.allocator.app.combining import Combiner
from services.allocator.app.device_classes import load_device_classes
from services.allocator.app.feed_watch import FeedWatch
from services.allocator.app.fleet_gauges import FleetGauges
from services.allocator.app.inventory_feed import Closeable, InventoryFeed
from services.allocator.app.live_reservations import Holdings
from services.allocator.app.placing import PlacementSearch
from services.allocator.app.quotas import QuotaGuard, QuotaSettings, check_flavor_selectors
from services.allocator.app.reservation_watch import ReservationWatch
from services.allocator.app.service import AllocatorService, ServiceLimits
from services.allocator.app.telemetry import AllocatorMetrics, Telemetry, configure_telemetry
from services.allocator.config import AllocatorSettings
from services.allocator.core import SelectorCache
from services.allocator.reservations.model import (
    ReservationEvent,
    ReservationEventOp,
    ReservationStore,
)
from services.allocator.reservations.quota_ledger import QuotaLedger
from services.common.dra.limits import DocumentLimits
from services.common.dra.model import DeviceClass
from services.common.grpc_server import ServiceRegistration
from services.common.health import Health
from services.common.security.audit import audit_event
from services.common.security.edge import Authenticator
from services.common.security.policy_files import LoadedPolicy, load_policy
from services.common.security.principal import tenant_of_owner
from services.common.security.tls import WatchedFiles
from services.common.telemetry import METRICS_LISTEN_VARIABLE

__all__ = ["FEED_HEALTH_NAME", "AllocatorApp", "build_allocator", "build_store", "start_web_view"]

log = logging.getLogger(__name__)

FEED_HEALTH_NAME = f"{SERVICE_NAME}/inventory"
_HEALTH_POLL_SECONDS = 0.25


@dataclass
class AllocatorApp:
    """A built allocator: its service, its gRPC registration, and what to close."""

    service: AllocatorService
    registration: ServiceRegistration
    telemetry: Telemetry
    feed_connected: Callable[[], bool]
    combiner: Combiner | None = None  # places concurrent unary Allocates together
    _closers: list[Callable[[], None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _healths: list[Health] = field(default_factory=list)

    @property
    def view(self) -> ClusterView:
        return self.service.view

    @property
    def holdings(self) -> Holdings:
        return self.service.holdings

    @property
    def store(self) -> ReservationStore:
        return self.service.store

    def ready(self) -> bool:
        """Serving needs an inventory view and the live reservations."""
        return self.view.current() is not None and self.holdings.synced

    def wait_ready(self, timeout: float) -> bool:
        """Block until ready (start-up, tests); False when `timeout` passed first."""
        deadline = time.monotonic() + timeout
        while not self.ready() and time.monotonic() < deadline:
            self._stop.wait(0.02)
        ready = self.ready()
        for health in self._healths:  # say so now, not at the next health poll
            self._publish_health(health)
        return ready

    def interceptors(self) -> list[grpc.ServerInterceptor]:
        """Pass to create_server: the tracing/metrics interceptor (none with telemetry off)."""
        return self.telemetry.interceptors()

    def attach_health(self, health: Health) -> None:
        """Keep `health` up to date (after create_server, which marks everything SERVING)."""
        self._healths.append(health)
        self._publish_health(health)
        thread = threading.Thread(
            target=self._watch_health, args=(health,), name="allocator-health", daemon=True
        )
        thread.start()

    def _watch_health(self, health: Health) -> None:
        while not self._stop.wait(_HEALTH_POLL_SECONDS):
            self._publish_health(health)

    def _publish_health(self, health: Health) -> None:
        if self.ready():
            health.set_serving(SERVICE_NAME)
        else:
            health.set_not_serving(SERVICE_NAME)
        if self.feed_connected():
            health.set_serving(FEED_HEALTH_NAME)
        else:
            health.set_not_serving(FEED_HEALTH_NAME)

    def close(self) -> None:
        """Stop the feed, the background threads, the store and the exporters (reverse order)."""
        self._stop.set()
        for closer in reversed(self._closers):
            try:
                closer()
            except Exception:
                log.exception("closing the allocator")
        self._closers.clear()


def build_store(settings: AllocatorSettings) -> ReservationStore:
    """Redis when GPUALLOC_REDIS_URL is set, else the embedded store."""
    if settings.redis_url:
        return RedisReservationStore(
            settings.redis_url,
            key_prefix=settings.redis_key_prefix,
            socket_timeout=settings.redis_timeout,
            max_connections=max(16, settings.server.max_workers * 2),
            wait_replicas=settings.redis_wait_replicas,
            wait_timeout=settings.redis_wait_timeout,
        )
    return MemoryReservationStore()


def build_quotas(
    settings: AllocatorSettings,
    store: ReservationStore,
    classes: Mapping[str, DeviceClass],
    selectors: SelectorCache,
) -> QuotaGuard | None:
    """Quotas come with the access policy (its spec.quota and tenants' quotas; reloaded when
    the file changes); their ledger lives in the reservation store's Redis, or in process."""
    policy_file = settings.server.auth_policy_file
    if not policy_file:
        return None

    def load(contents: Sequence[bytes]) -> LoadedPolicy:
        loaded = load_policy(policy_file, contents[0])
        check_flavor_selectors(loaded.policy.quotas, selectors)  # a bad CEL: not loaded
        for note in loaded.policy.kueue.notes() if loaded.policy.kueue else ():
            log.info("access policy %s: %s", policy_file, note)
        return loaded

    watched = WatchedFiles(
        [policy_file],
        load,
        what="access policy (quotas)",
        follow=lambda loaded: loaded.followed,
    )
    backing = store.inner if isinstance(store, MeteredStore) else store
    ledger: QuotaLedger = (
        RedisQuotaLedger(backing)
        if isinstance(backing, RedisReservationStore)
        else MemoryQuotaLedger()
    )
    known = dict(classes)
    return QuotaGuard(
        lambda: watched.current().policy.quotas,
        ledger,
        lambda: known,
        selectors,
        QuotaSettings(grace_seconds=settings.quota_grace_seconds),
    )


def build_allocator(
    settings: AllocatorSettings,
    feed: InventoryFeed,
    store: ReservationStore | None = None,
    *,
    telemetry: Telemetry | None = None,
    environ: Mapping[str, str] | None = None,
    feed_connected: Callable[[], bool] | None = None,
    feed_target: str = "",
    metrics_listen_source: str = METRICS_LISTEN_VARIABLE,
) -> AllocatorApp:
    """Build and start an allocator following `feed`. `store` defaults to `build_store`
    (closed by `app.close()` only when built here); `telemetry` to the OTEL_* variables of
    `environ` (os.environ) and GPUALLOC_METRICS_LISTEN (closed by `app.close()` only when
    built here; `metrics_listen_source` names where its address came from in its errors);
    `feed_connected` says whether the feed is live (default: always), and `feed_target`
    names it in the logs."""
    closers: list[Callable[[], None]] = []
    if telemetry is None:
        telemetry = configure_telemetry(
            os.environ if environ is None else environ,
            metrics_listen=settings.server.metrics_listen_address,
            metrics_listen_source=metrics_listen_source,
        )
        closers.append(telemetry.shutdown)
    built = store is None
    if store is None:
        store = build_store(settings)
        closers.append(store.close)
    metrics = AllocatorMetrics(telemetry)
    if telemetry.enabled:
        store = MeteredStore(store, metrics)

    watch = ReservationWatch()
    closers.append(watch.close)
    own = store.inner if isinstance(store, MeteredStore) else store
    if built and isinstance(own, RedisReservationStore):
        # Every reserve through it is this process's, settled into `holdings` from its
        # answer: the events of its own grants matter only to open WatchReservations streams.
        own.quiet_own_reserves(unless=lambda: watch.watching)

    def on_event(event: ReservationEvent) -> None:
        watch.publish(event)  # WatchReservations streams: never blocks
        if event.op is ReservationEventOp.EXPIRE:
            metrics.lease_expiries.add(1)
            known = holdings.get(event.id)  # still held here: events arrive before removal
            audit_event(
                "reservation.expire",
                None,
                reservation=event.id,
                node=event.node,
                owner=known.owner if known is not None else "",
                tenant=tenant_of_owner(known.owner) if known is not None else "",
                devices=known.hold.devices if known is not None else (),
                fencing_token=event.fencing_token,
            )

    selectors = SelectorCache()
    view = ClusterView(
        min_interval=settings.reindex_interval,
        max_waiters=max(1, settings.server.max_workers // 4),  # the rest serve other calls
        binding_conditions=settings.device_binding_conditions,
    )
    closers.append(view.close)
    sweeps: list[Callable[[], None]] = []  # the service's binding timeouts, once it exists

    def sweep() -> None:
        for each in sweeps:
            each()

    holdings = Holdings(
        store,
        expire_interval=settings.expire_interval,
        refresh_interval=settings.resync_interval,
        on_event=on_event,
        on_sweep=sweep,
    )
    classes = load_device_classes(settings.device_classes)
    quotas = build_quotas(settings, store, classes, selectors)
    if quotas is not None:
        closers.append(quotas.close)
    service = AllocatorService(
        view,
        holdings,
        store,
        PlacementSearch(
            selectors,
            policy=settings.policy,
            max_steps=settings.max_search_steps,
            max_cel_cost=settings.max_cel_cost,
        ),
        classes,
        limits=ServiceLimits(
            lease_seconds=settings.lease_seconds,
            max_lease_seconds=settings.max_lease_seconds,
            reserve_retries=settings.reserve_retries,
            binding_timeout_seconds=settings.binding_timeout,
        ),
        metrics=metrics,
        tracer=telemetry.tracer,
        quotas=quotas,
    )
    sweeps.append(service.sweep_bindings)
    holdings.start()
    closers.append(holdings.close)
    if quotas is not None:
        quotas.start(store, holdings.reservations, service.reservation_usage)
    following: Closeable = feed.follow(view.apply)
    closers.append(following.close)
    connected = feed_connected or (lambda: True)
    feed_watch = FeedWatch(
        connected,
        metrics.disconnects,
        target=feed_target or "the inventory",
        has_view=lambda: view.current() is not None,
    )
    closers.append(feed_watch.close)
    telemetry.observe(
        "gpualloc.cel.evaluations",
        lambda: selectors.evaluations,
        gauge=False,
        description="CEL selector evaluations run (one per distinct device profile)",
    )
    telemetry.observe(
        "gpualloc.cel.profile_hits",
        lambda: selectors.profile_hits,
        gauge=False,
        description="CEL selector results served from a device profile's earlier evaluation",
    )
    telemetry.observe(
        "gpualloc.inventory.generation",
        lambda: _generation(view),
        description="inventory generation of the view solves use",
    )
    telemetry.observe(
        "gpualloc.inventory.generation_lag",
        lambda: max(0, view.received_generation - _generation(view)),
        description="inventory generations received but not indexed yet",
    )
    telemetry.observe(
        "gpualloc.inventory.connected",
        lambda: 1 if connected() else 0,
        description="1 while the inventory feed is connected, else 0",
    )
    FleetGauges(view, holdings).register(telemetry)
    if quotas is not None:
        quotas.register(telemetry)
    combiner = Combiner(service, metrics=metrics) if settings.combine_allocates else None
    registration = ServiceRegistration(
        SERVICE_NAME,
        allocator_pb2_grpc.add_AllocatorServicer_to_server,
        AllocatorServicer(
            service,
            watch,
            claims=ClaimReader(),
            max_call_seconds=settings.server.max_call_seconds,
            watch_heartbeat_seconds=settings.watch_heartbeat,
            metrics=metrics,
            combiner=combiner,
        ),
        ACCESS,
    )
    return AllocatorApp(service, registration, telemetry, connected, combiner, closers)


def start_web_view(
    app: AllocatorApp,
    settings: AllocatorSettings,
    limits: DocumentLimits,
    *,
    reuse_port: bool = False,
) -> WebView | None:
    """Serve the read-only web view of `app` on GPUALLOC_WEB_LISTEN (None when empty); it is
    closed with the app. Tenants only under an access policy; with the gRPC port's TLS and
    policy, HTTPS taking the same identities (adapters/web/server.py)."""
    if not settings.web_listen_address:
        return None
    server = settings.server
    tls = authenticator = None
    if server.tls_cert_file and server.tls_key_file:
        tls = WebTls(server.tls_cert_file, server.tls_key_file, server.tls_client_ca_file)
        if server.auth_policy_file:  # the gRPC port's identities, from the same policy file
            authenticator = Authenticator(server.auth_policy_file)
    web = WebView(
        app.service,
        WebSettings(
            settings.web_listen_address,
            tenants_only=bool(server.auth_policy_file),
            insecure=server.insecure,
            tls=tls,
            authenticator=authenticator,
            document_limits=limits,
            explain_seconds=settings.server.max_call_seconds,
        ),
        reuse_port=reuse_port,
    )
    web.start()
    app._closers.append(web.close)
    return web


def _generation(view: ClusterView) -> int:
    current = view.current()
    return current.generation if current is not None else -1
