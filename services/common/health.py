"""The standard gRPC health service (grpc.health.v1), with per-service status and graceful shutdown.

Kubernetes gRPC probes, grpc_health_probe and load balancers ask `grpc.health.v1.Health/Check`
for a service name ("" means the whole server). `Health` wraps grpcio's reference servicer so the
rest of the code says `set_serving(name)` instead of juggling protobuf enum values, and remembers
which names it manages so shutdown can flip them all.

Shutdown order matters: first every service reports NOT_SERVING (probes and balancers stop
sending new work), then `server.stop(grace)` lets in-flight calls drain before cancelling them.
"""

from __future__ import annotations

import logging
import threading
from enum import Enum

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

__all__ = ["OVERALL", "SERVICE_NAME", "Health", "ServingStatus", "graceful_shutdown"]

SERVICE_NAME: str = health.SERVICE_NAME
"""Full name of the health service itself: `grpc.health.v1.Health`."""

OVERALL = ""
"""The service name that stands for the whole server."""

_log = logging.getLogger(__name__)


class ServingStatus(Enum):
    """What `Check` answers for a name; UNKNOWN_SERVICE means the name was never registered."""

    SERVING = health_pb2.HealthCheckResponse.SERVING
    NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
    UNKNOWN_SERVICE = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class Health:
    """Per-service health of one server. Thread-safe; changes reach open `Watch` streams at once."""

    def __init__(self) -> None:
        self.servicer = health.HealthServicer()
        self._lock = threading.Lock()
        self._statuses: dict[str, ServingStatus] = {OVERALL: ServingStatus.SERVING}
        self._shutting_down = False

    def add_to_server(self, server: grpc.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    def set_serving(self, service: str) -> None:
        self._set(service, ServingStatus.SERVING)

    def set_not_serving(self, service: str) -> None:
        self._set(service, ServingStatus.NOT_SERVING)

    def status(self, service: str) -> ServingStatus:
        """The status `Check` would answer now."""
        with self._lock:
            return self._statuses.get(service, ServingStatus.UNKNOWN_SERVICE)

    @property
    def shutting_down(self) -> bool:
        with self._lock:
            return self._shutting_down

    def enter_graceful_shutdown(self) -> None:
        """Flip every service (and the overall status) to NOT_SERVING, for good."""
        with self._lock:
            self._shutting_down = True
            for service in self._statuses:
                self._statuses[service] = ServingStatus.NOT_SERVING
        self.servicer.enter_graceful_shutdown()

    def _set(self, service: str, status: ServingStatus) -> None:
        with self._lock:
            if self._shutting_down:
                # Once draining, nothing may report SERVING again (the servicer ignores it too).
                return
            self._statuses[service] = status
            self.servicer.set(service, status.value)


def graceful_shutdown(server: grpc.Server, health: Health, grace_seconds: float) -> None:
    """Report NOT_SERVING everywhere, then stop: new calls are refused, in-flight ones drain.

    Returns once the server has stopped: calls still running after `grace_seconds` are cancelled.
    """
    _log.info("shutting down: health NOT_SERVING, draining calls for %.3gs", grace_seconds)
    health.enter_graceful_shutdown()
    server.stop(grace_seconds).wait()
    _log.info("server stopped")
