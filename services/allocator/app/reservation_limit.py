"""A tenant's bound on live reservations (the policy's `maxReservations`), on the grant path.

Quotas count what reservations hold; this counts reservations, whatever they hold, so a tenant
allowed adminAccess (whose devices no quota counts) cannot pile up thousands of them. A grant
of `count` reservations for a tenant with a bound is admitted when its live reservations
(this process's copy of the store: app/live_reservations.py) plus the grants of that tenant
in flight here plus `count` stay within the bound, else refused (RESOURCE_EXHAUSTED, naming
the bound). Grants in flight are counted until the store answered, so concurrent calls on one
process never overrun it. Replicas each check against the shared store's reservations as
their copy knows them: N replicas granting at the same moment may overrun it by at most the
grants they have in flight together, never without bound.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from services.allocator.reservations.model import Reservation
from services.common.errors import ResourceExhausted
from services.common.security.principal import tenant_of_owner

__all__ = ["ReservationLimit"]


class ReservationLimit:
    def __init__(self, live: Callable[[], Iterable[Reservation]]) -> None:
        self._live = live
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = {}

    @contextmanager
    def granting(self, owner: str, count: int, limit: int | None) -> Iterator[None]:
        """Admit `count` new reservations of `owner`'s tenant under `limit` for the block."""
        if limit is None:
            yield
            return
        tenant = tenant_of_owner(owner)
        with self._lock:
            held = sum(1 for r in self._live() if tenant_of_owner(r.owner) == tenant)
            in_flight = self._in_flight.get(tenant, 0)
            if held + in_flight + count > limit:
                raise ResourceExhausted(
                    f"tenant {tenant} may hold at most {limit} live reservations (the access "
                    f"policy's maxReservations) and holds {held + in_flight}: release or let "
                    f"some expire first"
                )
            self._in_flight[tenant] = in_flight + count
        try:
            yield
        finally:
            with self._lock:
                left = self._in_flight[tenant] - count
                if left:
                    self._in_flight[tenant] = left
                else:
                    del self._in_flight[tenant]
