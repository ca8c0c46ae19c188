"""Step one of many grants at once: one compare-and-set per ledger for a batch's quota tickets.

A `QuotaTally` is the quota ledgers as one grant run sees them (app/granting.py: a unary
Allocate's one placement, or an AllocateBatch's reserving items). `admit` decides a grant in
order, when its item is solved: against the ledger of its tenant's tree as read once for the
run, plus the grants the run admitted before it, so that a refusal is known before the next item
is solved (as one by one, where each grant's take sees the ones before it). `take` then adds the
tickets of every admitted grant of a ledger in ONE compare-and-set at the version read
(`QuotaLedger.take`); a ledger another grant changed meanwhile is read again and the run's grants
of it are checked again, in order (one may now be refused: its outcome says so), up to
`take_attempts` rounds. `bind` and `abandon` finish step two for all of them, one ledger step
each. The rule is the core's (`admit`, core/quota/rule.py); what the tickets mean and why no tenant
goes over quota is app/quotas.py's docstring.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.allocator.app.quotas import Grant, QuotaGuard
from services.allocator.core import QuotaRefusal, add_usage, admit, counted_only
from services.allocator.reservations.hold_kinds import HoldKind
from services.allocator.reservations.model import Reservation
from services.allocator.reservations.quota_ledger import (
    LedgerRead,
    QuotaEntry,
    Ticket,
    TicketBinding,
    usage_by_tenant,
)
from services.common.errors import GpuallocError, Unavailable
from services.common.quota.model import QuotaModel, Usage
from services.common.security.principal import tenant_of_owner

__all__ = ["QuotaAsk", "QuotaTally", "TakeResult"]

log = logging.getLogger("gpualloc.quota")

TakeResult = Grant | tuple[QuotaRefusal, ...] | None
"""Per grant: its Grant (tickets held), the refusals, or None (its tenant is not limited)."""


@dataclass(frozen=True)
class QuotaAsk:
    """One grant's step one: `amounts` per store request of its placement."""

    owner: str
    amounts: tuple[Usage, ...]
    lease_seconds: float
    checked: bool = True  # False: held whatever the quota says (a consolidation's replacement)


@dataclass
class _Ledger:
    read: LedgerRead
    usage: dict[str, dict[str, int]]
    asks: list[int] = field(default_factory=list)  # indices of the admitted asks, in order


class QuotaTally:
    def __init__(self, guard: QuotaGuard) -> None:
        self._guard = guard
        self._model: QuotaModel = guard.model
        self._asks: list[QuotaAsk] = []
        self._tickets: list[QuotaEntry | None] = []  # per admitted ask; None: not limited
        self._ledgers: dict[str, _Ledger] = {}

    def admit(self, ask: QuotaAsk) -> tuple[QuotaRefusal, ...] | int:
        """The refusals, or the ask's index for `take` (admitted: counted for later asks)."""
        quota = self._model.quota_of(tenant_of_owner(ask.owner))
        index = len(self._asks)
        if quota is None:
            self._asks.append(ask)
            self._tickets.append(None)
            return index
        key = self._model.ledger_key(quota)
        ledger = self._ledgers.get(key)
        if ledger is None:
            read = self._guard.ledger.read(key)
            ledger = self._ledgers[key] = _Ledger(read, usage_by_tenant(read.entries))
        wanted = _wanted(ask)
        if ask.checked:
            refusals = admit(self._model, quota.tenant, wanted, ledger.usage)
            if refusals:
                return refusals
        add_usage(ledger.usage, quota.tenant, wanted)
        ledger.asks.append(index)
        self._asks.append(ask)
        self._tickets.append(
            QuotaEntry(
                HoldKind.TICKET.id(secrets.token_hex(12)), quota.tenant, counted_only(wanted), None
            )
        )
        return index

    def take(self) -> list[TakeResult]:
        """Hold every admitted ask's ticket: one compare-and-set per ledger. Per ask, in
        admission order: its Grant, the refusals (a ledger read again refused it), or None.
        Unavailable when a ledger stays contended (nothing of that ledger is held)."""
        results: list[TakeResult] = [None] * len(self._asks)
        grace = self._guard.settings.grace_seconds
        attempts = self._guard.settings.take_attempts
        for key, ledger in self._ledgers.items():
            for attempt in range(attempts):
                if attempt:
                    time.sleep(random.uniform(0, 0.0005 * 2 ** min(attempt, 6)))
                    ledger.read = self._guard.ledger.read(key)
                    held = self._recheck(ledger, results)
                else:
                    held = ledger.asks
                tickets = [
                    Ticket(self._entry(i), self._asks[i].lease_seconds + grace) for i in held
                ]
                if not tickets or self._guard.ledger.take(key, ledger.read.version, tickets):
                    for index in held:
                        ask = self._asks[index]
                        results[index] = Grant(
                            self._entry(index).id,
                            key,
                            self._entry(index).tenant,
                            ask.amounts,
                            ask.lease_seconds,
                        )
                    break
            else:
                raise Unavailable(
                    f"quota ledger of {key} is contended: {attempts} attempts lost to other "
                    "grants; retry"
                )
        return results

    def _recheck(self, ledger: _Ledger, results: list[TakeResult]) -> list[int]:
        """The ledger's admitted asks checked again on a new read, in order: those that still
        fit (refusals recorded in `results` for the others)."""
        usage = usage_by_tenant(ledger.read.entries)
        held = []
        for index in ledger.asks:
            ask, entry = self._asks[index], self._entry(index)
            if ask.checked:
                refusals = admit(self._model, entry.tenant, entry.amounts, usage)
                if refusals:
                    results[index] = refusals
                    continue
            add_usage(usage, entry.tenant, entry.amounts)
            results[index] = None
            held.append(index)
        return held

    def _entry(self, index: int) -> QuotaEntry:
        entry = self._tickets[index]
        assert entry is not None
        return entry

    def bind(self, granted: Sequence[tuple[Grant, Sequence[Reservation]]]) -> None:
        """Step two succeeded for these: one entry per reservation replaces each ticket, one
        ledger step per ledger."""
        grace = self._guard.settings.grace_seconds
        by_ledger: dict[str, list[TicketBinding]] = {}
        for grant, reservations in granted:
            parts = tuple(
                QuotaEntry(reservation.id, grant.tenant, counted_only(amounts), None)
                for reservation, amounts in zip(reservations, grant.amounts, strict=True)
            )
            by_ledger.setdefault(grant.cohort, []).append(
                TicketBinding(grant.ticket, parts, grant.lease_seconds + grace)
            )
        for key, bindings in by_ledger.items():
            self._guard.ledger.bind(key, bindings)

    def abandon(self, grants: Sequence[Grant]) -> None:
        """Step two failed for these: free their tickets (if that fails too, they expire)."""
        by_ledger: dict[str, list[str]] = {}
        for grant in grants:
            by_ledger.setdefault(grant.cohort, []).append(grant.ticket)
        for key, tickets in by_ledger.items():
            try:
                self._guard.ledger.drop(key, tickets)
            except GpuallocError as error:
                log.warning("quota tickets %s left to expire: %s", tickets, error)


def _wanted(ask: QuotaAsk) -> dict[str, int]:
    tenant = tenant_of_owner(ask.owner)
    total: dict[str, dict[str, int]] = {}
    for part in ask.amounts:
        add_usage(total, tenant, part)
    return total.get(tenant, {})
