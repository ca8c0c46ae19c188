"""Granting placements: the two-step grant (quota, then devices) for one placement or a batch's.

A `GrantRun` collects the placements to reserve — a unary Allocate's one, or the reserving
items of an AllocateBatch one after another as each is solved — and writes them together:

- `add`, as each item is solved: the tenant's bound on live reservations (`maxReservations`,
  app/reservation_limit.py) counting the run's earlier grants; its quota checked against the
  ledger of its tree as read once for the run plus the run's earlier grants (app/quota_grants.py),
  so a refusal is decided in order, before the next item is solved, as one by one; then the
  placement is held pending in this process's Holdings, so the next item's solve (and every
  concurrent one) avoids it. A refused placement raises and holds nothing.
- `write`, once: the quota tickets of every admitted placement in one compare-and-set per ledger,
  the devices of all of them in ONE `ReservationStore.reserve` call (one round trip per shard),
  then one ledger step per ledger to bind the tickets of the granted placements to their
  reservations and one to drop the others'; the pending placements become the reservations (or
  are dropped).

Each placement ends in its own outcome — its reservations, or `QuotaExceeded` (a ledger that
changed since the run read it refused it), `Conflict` (a device was taken meanwhile),
`Unavailable`, `DeadlineExceeded` (the deadline passed before the write) — and nothing of a
failed placement stays held: no device, no quota ticket, no pending hold.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from services.allocator.app.live_reservations import Holdings, PendingRun
from services.allocator.app.quota_grants import QuotaAsk, QuotaTally
from services.allocator.app.quotas import Assigned, Grant, QuotaExceeded, QuotaGuard
from services.allocator.app.reservation_limit import ReservationLimit
from services.allocator.core import ClusterSnapshot
from services.allocator.reservations.model import (
    Reservation,
    ReservationStore,
    ReserveOutcome,
    ReserveRequest,
)
from services.common.deadline import Deadline
from services.common.errors import DeadlineExceeded, GpuallocError

__all__ = ["GrantRun"]

log = logging.getLogger("gpualloc.quota")


@dataclass(slots=True)
class _Placement:
    requests: Sequence[ReserveRequest]
    quota: int | None  # its index in the tally (None: no quotas)
    pending: str | int  # its Holdings token, or its item in the run's PendingRun
    limits: contextlib.ExitStack | None = None  # the reservation limit's count, if bounded

    def close(self) -> None:
        if self.limits is not None:
            self.limits.close()


class GrantRun:
    """One pass of grants; `add` each placement, then `write` once (the run is then done)."""

    def __init__(
        self,
        store: ReservationStore,
        holdings: Holdings,
        quotas: QuotaGuard | None,
        limit: ReservationLimit,
    ) -> None:
        self._store = store
        self._holdings = holdings
        self._quotas = quotas
        self._limit = limit
        self._tally = QuotaTally(quotas) if quotas is not None else None
        self._placements: list[_Placement] = []
        self._run: PendingRun | None = None  # the placements of one allocation, pending

    def __len__(self) -> int:
        return len(self._placements)

    def add(
        self,
        snapshot: ClusterSnapshot,
        requests: Sequence[ReserveRequest],
        *,
        limit: int | None = None,
        checked: bool = True,
        assigned: Assigned | None = None,
    ) -> int:
        """Admit a placement (its requests, one per scope, all of one owner and lease) and
        hold it pending: its index among the run's outcomes. Raises ResourceExhausted (the
        owner's tenant's `limit` on live reservations) or QuotaExceeded, holding nothing.
        `checked` False: counted against the quota without a check (a consolidation's
        replacement). `snapshot`: the view the requests were built on (what they count);
        `assigned`: the flavors its flavor search assigned, which its devices are charged to
        (QuotaGuard.usage; the ledger entries keep the amounts, so release, QuotaStatus and
        preemption count them there too)."""
        if limit is None and self._tally is None and len(requests) == 1:
            allocations = requests[0].allocations
            if len(allocations) == 1:  # the common case, unbounded and without quotas
                run = self._run
                if run is None:
                    run = self._run = self._holdings.pending_run()
                held = self._holdings.hold_in_run(run, requests[0].node, allocations[0])
                self._placements.append(_Placement(requests, None, held))
                return len(self._placements) - 1
        owner = requests[0].owner
        limits = None
        if limit is not None:  # counted while in flight (none to count without a bound)
            limits = contextlib.ExitStack()
            limits.enter_context(self._limit.granting(owner, len(requests), limit))
        quota: int | None = None
        try:
            if self._tally is not None and self._quotas is not None:
                amounts = tuple(
                    self._quotas.usage(snapshot, request.node, request.allocations, owner, assigned)
                    for request in requests
                )
                admitted = self._tally.admit(
                    QuotaAsk(owner, amounts, requests[0].lease_seconds, checked)
                )
                if isinstance(admitted, tuple):
                    raise QuotaExceeded(admitted)
                quota = admitted
            # Held for this process's other solves while the store decides (live_reservations).
            pending: str | int
            if len(requests) == 1 and len(requests[0].allocations) == 1:  # the common case
                if self._run is None:
                    self._run = self._holdings.pending_run()
                request = requests[0]
                pending = self._holdings.hold_in_run(
                    self._run, request.node, request.allocations[0]
                )
            else:  # the scopes of one placement repeat its allocations: each once
                placed = {id(a): a for request in requests for a in request.allocations}
                pending = self._holdings.hold_pending(
                    [request.node for request in requests], tuple(placed.values())
                )
        except BaseException:
            if limits is not None:
                limits.close()
            raise
        self._placements.append(_Placement(requests, quota, pending, limits))
        return len(self._placements) - 1

    def write(
        self, deadline: Deadline, ended: Sequence[Deadline | None] | None = None
    ) -> list[ReserveOutcome]:
        """Take every placement's quota and devices; one outcome per placement, in order.
        `ended`: per placement, its caller's own deadline where it has one (a combined unary
        call, app/combining.py): a placement whose caller's deadline passed, or whose client
        went away, before the write is not written (DeadlineExceeded), as a unary Allocate's
        write is refused then."""
        outcomes: list[ReserveOutcome | None] = [None] * len(self._placements)
        try:
            self._write(deadline, outcomes, ended)
        finally:  # what did not become reservations is not held any more, whatever happened
            self._settle(outcomes)
            for placement in self._placements:
                if placement.limits is not None:
                    placement.limits.close()
            self._placements = []
        return [outcome for outcome in outcomes if outcome is not None]

    def abandon(self) -> None:
        """Give up the placements not written: their pending holds and counts go."""
        self._settle([None] * len(self._placements))
        for placement in self._placements:
            placement.close()
        self._placements = []

    def _settle(self, outcomes: Sequence[ReserveOutcome | None]) -> None:
        """The pending placements become their reservations, or are dropped (not a list)."""
        run, self._run = self._run, None
        items: list[Sequence[Reservation] | None] = [None] * len(run) if run is not None else []
        others: list[tuple[str, Sequence[Reservation] | None]] = []
        for placement, outcome in zip(self._placements, outcomes, strict=True):
            got = outcome if isinstance(outcome, list) else None
            if isinstance(placement.pending, int):
                items[placement.pending] = got
            else:
                others.append((placement.pending, got))
        if run is not None:
            self._holdings.settle_run(run, items)
        if others:
            self._holdings.settle_all(others)

    def _write(
        self,
        deadline: Deadline,
        outcomes: list[ReserveOutcome | None],
        ended: Sequence[Deadline | None] | None,
    ) -> None:
        if self._tally is None and ended is None:  # no quotas, no caller's own deadline
            try:  # every placement is written
                if deadline.passed():
                    raise DeadlineExceeded("reserve: ran out of time")
                outcomes[:] = self._store.reserve([p.requests for p in self._placements])
            except GpuallocError as error:  # nothing was written (or the call failed whole)
                outcomes[:] = [error] * len(outcomes)
            return
        granted: list[tuple[int, Grant | None]] = []
        try:
            if deadline.passed():
                raise DeadlineExceeded("reserve: ran out of time")
            taken = self._tally.take() if self._tally is not None else []
            late: list[Grant | None] = []  # taken for callers that ended meanwhile: given back
            for index, placement in enumerate(self._placements):
                got = taken[placement.quota] if placement.quota is not None else None
                own = ended[index] if ended is not None else None
                if isinstance(got, tuple):
                    outcomes[index] = QuotaExceeded(got)
                elif own is not None and own.passed():
                    outcomes[index] = DeadlineExceeded(_ENDED)
                    late.append(got)
                else:
                    granted.append((index, got))
            self._abandon(late)
            reserved = self._store.reserve([self._placements[i].requests for i, _ in granted])
        except GpuallocError as error:  # nothing was written (or the store call failed whole)
            self._abandon([grant for _, grant in granted])
            for index, outcome in enumerate(outcomes):
                outcomes[index] = outcome or error
            return
        bound: list[tuple[Grant, Sequence[Reservation]]] = []
        failed: list[Grant | None] = []
        for (index, grant), outcome in zip(granted, reserved, strict=True):
            outcomes[index] = outcome
            if isinstance(outcome, GpuallocError):
                failed.append(grant)
            elif grant is not None:
                bound.append((grant, outcome))
        self._abandon(failed)
        if bound and self._tally is not None:
            try:
                self._tally.bind(bound)
            except GpuallocError as error:  # the tickets cover the reservations until they expire
                log.warning("quota tickets not bound, left to expire: %s", error)

    def _abandon(self, grants: Sequence[Grant | None]) -> None:
        held = [grant for grant in grants if grant is not None]
        if held and self._tally is not None:
            self._tally.abandon(held)


_ENDED = "reserve: the call ended (its deadline passed or its client went away) before the write"
