"""The allocate -> reserve -> commit/release lifecycle as a context manager.

    with client.lease([claim], owner="slurm/job/17", idempotency_key="slurm-17") as lease:
        start_job(lease.placement)          # the lease is renewed while this runs
    # clean exit: committed (held until released); exception: released

A lease is a reservation with an expiry: if the holder dies, the devices come back by
themselves. While the block runs, a background thread renews every reservation at a third of
its TTL, so a slow job start does not lose the devices; once committed there is nothing left
to renew. `commit_on_exit=False` is for a block that is the whole job: the devices are
released when it ends (call `lease.commit()` inside if the job must outlive a crash of the
caller; `keep()` leaves them reserved, their lease running on, for another process to renew).
A renewal that fails (the lease expired, someone released it) is kept in `lost` and
ends the renewals; the following commit then fails with that reservation's NotFound.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from services.client.errors import Unplaceable
from services.client.results import Placement, Reservation
from services.common.errors import GpuallocError, NotBound

__all__ = ["Lease", "LeaseCalls"]

log = logging.getLogger("gpualloc.client.lease")


class LeaseCalls(Protocol):
    """What a lease asks of its client (client.AllocatorClient): a Protocol here, so that this
    module does not import the client that builds leases."""

    def commit(
        self, reservation: Reservation, *, owner: str | None = None, fencing_token: int = 0
    ) -> Reservation: ...

    def release(
        self,
        reservation: Reservation,
        *,
        owner: str | None = None,
        fencing_token: int = 0,
        allow_missing: bool = False,
    ) -> Reservation | None: ...

    def renew(
        self,
        reservation: Reservation,
        *,
        lease_ttl_seconds: float | None = None,
        owner: str | None = None,
        fencing_token: int = 0,
    ) -> Reservation: ...


class Lease:
    """Reserved devices for the duration of a `with` block (see the module docstring)."""

    def __init__(
        self,
        client: LeaseCalls,
        place: Callable[[], Placement],
        *,
        owner: str,
        lease_ttl_seconds: float,
        commit_on_exit: bool = True,
        explain: Callable[[], Placement] | None = None,
    ) -> None:
        """`place` allocates and reserves; `explain`, when given, is asked why when it did not
        fit (Allocate's own answer carries no reasons unless asked)."""
        self._client = client
        self._place = place
        self._explain = explain
        self.owner = owner
        self.lease_ttl_seconds = lease_ttl_seconds
        self.commit_on_exit = commit_on_exit
        self.placement: Placement | None = None
        self.reservations: tuple[Reservation, ...] = ()
        self.committed = False
        self.kept = False
        self.released = False
        self.lost: GpuallocError | None = None
        self.renewals = 0
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def __enter__(self) -> Lease:
        placement = self._place()
        if not placement.fits:
            raise Unplaceable(self._explain() if self._explain is not None else placement)
        self.placement = placement
        self.reservations = placement.reservations
        self._renewer = threading.Thread(
            target=self._renew_loop, name="gpualloc-lease-renewer", daemon=True
        )
        self._renewer.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is not None or not self.commit_on_exit:
            self.release()
        elif not (self.committed or self.kept):
            self.commit()

    def commit(self) -> tuple[Reservation, ...]:
        """Hold the devices until released (no more renewals needed)."""
        self._stop_renewing()
        self.reservations = tuple(
            self._client.commit(r, owner=self.owner, fencing_token=r.fencing_token)
            for r in self.reservations
        )
        self.committed = True
        return self.reservations

    def wait_bound(
        self,
        timeout_seconds: float,
        *,
        poll_seconds: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> tuple[Reservation, ...]:
        """Wait until no reservation is binding (DRA binding conditions: docs/reservations.md,
        "Binding"): each binding one is renewed every `poll_seconds`, which also reads how it
        stands. A binding that fails raises Preempted (the allocator released it, saying why);
        one not bound within `timeout_seconds` raises NotBound. Call it before starting
        anything on the devices."""
        deadline = clock() + timeout_seconds
        while True:
            waiting = [r for r in self.reservations if r.binding == "binding"]
            if not waiting:
                return self.reservations
            if clock() >= deadline:
                raise NotBound(
                    waiting[0].id,
                    f"reservation {waiting[0].id} not bound within {timeout_seconds:g}s",
                )
            sleep(poll_seconds)
            self.reservations = tuple(
                self._client.renew(
                    r,
                    owner=self.owner,
                    lease_ttl_seconds=self.lease_ttl_seconds,
                    fencing_token=r.fencing_token,
                )
                if r.binding == "binding"
                else r
                for r in self.reservations
            )

    def keep(self) -> tuple[Reservation, ...]:
        """Stop renewing and leave the devices reserved: their lease runs on (to
        `lease_ttl_seconds` from the last renewal) until someone else renews, commits or
        releases them. The block's exit then neither commits nor releases."""
        self._stop_renewing()
        self.kept = True
        return self.reservations

    def release(self) -> None:
        """Free the devices (idempotent: already released or expired is fine)."""
        self._stop_renewing()
        for reservation in self.reservations:
            self._client.release(reservation, owner=self.owner, allow_missing=True)
        self.released = True

    def _stop_renewing(self) -> None:
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()

    def _renew_loop(self) -> None:
        interval = max(self.lease_ttl_seconds / 3.0, 0.01)
        while not self._stop.wait(interval):
            try:
                self.reservations = tuple(
                    self._client.renew(
                        r,
                        lease_ttl_seconds=self.lease_ttl_seconds,
                        owner=self.owner,
                        fencing_token=r.fencing_token,
                    )
                    for r in self.reservations
                )
                self.renewals += 1
            except GpuallocError as error:
                log.warning("lease of %s lost: %s", self.owner, error)
                self.lost = error
                return
