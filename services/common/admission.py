"""How many calls of each kind may run at once, so that no caller and no kind of work can
take every thread that serves the others.

A sync gRPC server serves every call from one thread pool. Three things could fill it:

- **Streams** (WatchInventory, WatchReservations) hold a thread for as long as they are open.
  The pool gets `max_streams` threads on top of `max_workers`, and at most `max_streams`
  streams are open at once: unary calls always keep `max_workers` threads (health checks are
  served apart: their Watch does not hold a thread, their Check is quick). One tenant may hold
  at most `per_tenant_streams` of them, so that no tenant takes every stream.
- **One caller** (an identity under an access policy) may have at most `per_caller` unary calls
  in flight, **one tenant** at most `per_tenant`; the next is RESOURCE_EXHAUSTED with a
  RetryInfo (retry after `retry_after` seconds) instead of queueing behind the pool.
- **Waits** for a future inventory generation are bounded where they wait (the allocator's
  view), not here.

Counts are in-process (per server process), which is what a thread pool is.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from services.common.errors import ResourceExhausted

__all__ = ["Admission", "AdmissionLimits"]


@dataclass(frozen=True)
class AdmissionLimits:
    max_streams: int = 32
    per_caller: int = 0  # 0: no limit
    per_tenant: int = 0  # 0: no limit
    retry_after: float = 0.1
    per_tenant_streams: int = 0  # 0: no limit


class Admission:
    """Thread-safe counters of calls in flight, with the limits above."""

    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._streams = 0
        self._callers: Counter[str] = Counter()
        self._tenants: Counter[str] = Counter()
        self._tenant_streams: Counter[str] = Counter()

    @contextmanager
    def stream(self, method: str, tenant: str | None = None) -> Iterator[None]:
        limit, per_tenant = self.limits.max_streams, self.limits.per_tenant_streams
        retry_after = max(1.0, self.limits.retry_after)
        with self._lock:
            if self._streams >= limit:
                raise ResourceExhausted(
                    f"{method}: {self._streams} streams are open, the most this server serves "
                    f"at once (GPUALLOC_MAX_STREAMS={limit}); retry later",
                    retry_after_seconds=retry_after,
                )
            if per_tenant and tenant is not None and self._tenant_streams[tenant] >= per_tenant:
                raise ResourceExhausted(
                    f"{method}: tenant {tenant} already has {per_tenant} streams open, its "
                    f"share (half of GPUALLOC_MAX_STREAMS={limit}); close one or retry later",
                    retry_after_seconds=retry_after,
                )
            self._streams += 1
            if tenant is not None:
                self._tenant_streams[tenant] += 1
        try:
            yield
        finally:
            with self._lock:
                self._streams -= 1
                if tenant is not None:
                    self._tenant_streams[tenant] -= 1
                    if not self._tenant_streams[tenant]:
                        del self._tenant_streams[tenant]

    @contextmanager
    def unary(self, method: str, caller: str, tenant: str | None) -> Iterator[None]:
        """One unary call in flight for its whole block (`enter_unary`, then `leave_unary`)."""
        self.enter_unary(method, caller, tenant)
        try:
            yield
        finally:
            self.leave_unary(caller, tenant)

    def enter_unary(self, method: str, caller: str, tenant: str | None) -> None:
        """Count a unary call in flight, or raise ResourceExhausted when its caller or tenant
        has its share running already; every call counted must be left (`leave_unary`). The
        interceptor's per-call path: a pair of calls, not a generator-based context manager."""
        per_caller, per_tenant = self.limits.per_caller, self.limits.per_tenant
        with self._lock:
            if per_caller and self._callers[caller] >= per_caller:
                raise ResourceExhausted(
                    f"{method}: {caller} already has {per_caller} calls in flight "
                    f"(GPUALLOC_MAX_CALLS_PER_CALLER); retry after the others finish",
                    retry_after_seconds=self.limits.retry_after,
                )
            if per_tenant and tenant is not None and self._tenants[tenant] >= per_tenant:
                raise ResourceExhausted(
                    f"{method}: tenant {tenant} already has {per_tenant} calls in flight "
                    f"(GPUALLOC_MAX_CALLS_PER_TENANT); retry after the others finish",
                    retry_after_seconds=self.limits.retry_after,
                )
            self._callers[caller] += 1
            if tenant is not None:
                self._tenants[tenant] += 1

    def leave_unary(self, caller: str, tenant: str | None) -> None:
        """A call `enter_unary` counted has ended."""
        with self._lock:
            self._callers[caller] -= 1
            if not self._callers[caller]:
                del self._callers[caller]
            if tenant is not None:
                self._tenants[tenant] -= 1
                if not self._tenants[tenant]:
                    del self._tenants[tenant]

    def in_flight(self) -> tuple[int, int]:
        """(open streams, unary calls counted) — for tests and metrics."""
        with self._lock:
            return self._streams, sum(self._callers.values())
