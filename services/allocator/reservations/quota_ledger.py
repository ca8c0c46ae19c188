"""The quota ledger: per cohort, the entries that count against its tenants' quotas.

An entry is one grant's amounts for one tenant: a *ticket* while its grant is being made, then
one entry per reservation (named by the reservation id). A leased entry expires by the ledger's
clock; a committed one lasts until dropped. Usage = the sum of a cohort's live entries.

Beside the entries, a ledger keeps each tenant's usage decayed with a half-life (admission fair
sharing): `read_consumed` returns it with the ledger's clock and a version, `put_consumed`
replaces it only if the version is unchanged, so replicas sampling at once write one sample.

The ledger is a compare-and-set store, not a rule engine: `read` returns the cohort's entries and
a version; `take` adds an entry only if the version is unchanged (the version grows with every
take), so a grant checked against a read is added atomically with that check. Entries that
expire or are dropped between the read and the take only lower the usage, which keeps the
check safe. The rule itself lives in the allocator's core (core/quota/rule.py, over the model
of services/common/quota/model.py).

Implementations: `MemoryQuotaLedger` (adapters/store/memory_quota.py: embedded, tests) and
`RedisQuotaLedger` (adapters/store/redis_quota.py: one hash slot per cohort, Redis functions). One
contract suite runs against both (tests/contract/test_quota_ledger.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from services.allocator.core import ConsumedUsage, add_usage
from services.common.quota.model import Usage

__all__ = [
    "ConsumedRead",
    "LedgerRead",
    "QuotaEntry",
    "QuotaLedger",
    "Ticket",
    "TicketBinding",
    "check_lease",
    "usage_by_tenant",
]


@dataclass(frozen=True)
class QuotaEntry:
    id: str  # HoldKind.TICKET's `ticket:<hex>` while a grant is made, then the reservation's id
    tenant: str
    amounts: Usage
    expires_at: float | None  # seconds since the epoch by the ledger's clock; None: committed


@dataclass(frozen=True)
class LedgerRead:
    version: int
    entries: tuple[QuotaEntry, ...]  # live ones only, sorted by id


@dataclass(frozen=True)
class Ticket:
    """Step one of a grant: its entry (id `ticket:<hex>`), held `lease_seconds` from the take."""

    entry: QuotaEntry
    lease_seconds: float


@dataclass(frozen=True)
class TicketBinding:
    """Step two of a grant done: `parts` (one entry per reservation) replace the ticket,
    keeping its expiry (`lease_seconds` from now when the ticket is gone)."""

    ticket: str
    parts: tuple[QuotaEntry, ...]
    lease_seconds: float


@dataclass(frozen=True)
class ConsumedRead:
    """The tenants' decayed usage as last sampled, the ledger's clock now (seconds since the
    epoch) and the version a `put_consumed` must find."""

    version: int
    now: float
    tenants: Mapping[str, ConsumedUsage]


class QuotaLedger(Protocol):
    def read(self, cohort: str) -> LedgerRead: ...

    def take(self, cohort: str, version: int, tickets: Sequence[Ticket]) -> bool:
        """Add every ticket if the cohort's version is still `version` (one compare-and-set,
        for one grant or a batch's); False (nothing added) when another take came first."""
        ...

    def bind(self, cohort: str, bindings: Sequence[TicketBinding]) -> None:
        """Each binding's parts replace its ticket (an entry that exists already, an
        idempotent replay's, is left as it is): one step for a batch's grants."""
        ...

    def extend(self, cohort: str, entry_id: str, lease_seconds: float) -> bool:
        """A leased entry now expires lease_seconds from now; False if absent or committed."""
        ...

    def commit(self, cohort: str, entry_id: str) -> bool:
        """The entry no longer expires; False if absent."""
        ...

    def drop(self, cohort: str, entry_ids: Sequence[str]) -> None: ...

    def read_consumed(self, cohort: str) -> ConsumedRead: ...

    def put_consumed(self, cohort: str, version: int, tenants: Mapping[str, ConsumedUsage]) -> bool:
        """Replace the decayed usage if the version is still `version`; False (nothing
        written) when another sample came first."""
        ...

    def close(self) -> None: ...


def check_lease(lease_seconds: float) -> None:
    if not (math.isfinite(lease_seconds) and lease_seconds > 0):
        raise ValueError(f"lease_seconds must be > 0, got {lease_seconds}")


def usage_by_tenant(entries: Sequence[QuotaEntry]) -> dict[str, dict[str, int]]:
    """tenant -> the sum of its entries' amounts."""
    total: dict[str, dict[str, int]] = {}
    for entry in entries:
        add_usage(total, entry.tenant, entry.amounts)
    return total
