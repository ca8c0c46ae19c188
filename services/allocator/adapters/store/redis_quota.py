"""The quota ledger in Redis: one cohort's entries under one hash tag, so that every step is one
function call on one slot (Redis Cluster included) and a take is atomic with its version check.

Keys and steps: adapters/store/redis_functions.lua (the `quota_*` functions), sharing the
reservation store's connection, library and error mapping (`RedisReservationStore.call_function`).
Times come from the cohort's primary (TIME), never from the client.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from services.allocator.adapters.store.redis_store import RedisReservationStore
from services.allocator.core import ConsumedUsage
from services.allocator.reservations.quota_ledger import (
    ConsumedRead,
    LedgerRead,
    QuotaEntry,
    Ticket,
    TicketBinding,
)

__all__ = ["RedisQuotaLedger"]


class RedisQuotaLedger:
    def __init__(self, store: RedisReservationStore) -> None:
        self._store = store
        self._prefix = store.key_prefix

    def read(self, cohort: str) -> LedgerRead:
        base = self._base(cohort)
        now, version, flat, expiries = self._store.call_function(
            "gpualloc_quota_read", self._keys(base), [base], write=False
        )
        now_ms = int(_text(now))
        expires = {
            _text(expiries[i]): int(float(expiries[i + 1])) for i in range(0, len(expiries), 2)
        }
        entries = []
        for i in range(0, len(flat), 2):
            entry_id = _text(flat[i])
            due = expires.get(entry_id)
            if due is not None and due <= now_ms:
                continue  # expired, not yet pruned (reads do not write)
            doc = json.loads(_text(flat[i + 1]))
            amounts = {str(k): int(v) for k, v in doc["amounts"].items()}
            entries.append(
                QuotaEntry(entry_id, doc["tenant"], amounts, None if due is None else due / 1000)
            )
        entries.sort(key=lambda entry: entry.id)
        return LedgerRead(int(_text(version)), tuple(entries))

    def take(self, cohort: str, version: int, tickets: Sequence[Ticket]) -> bool:
        base = self._base(cohort)
        args = [base, str(version), str(len(tickets))]
        for ticket in tickets:
            args += [ticket.entry.id, _doc(ticket.entry), _ms(ticket.lease_seconds)]
        reply = self._store.call_function(
            "gpualloc_quota_take_many", self._keys(base), args, write=True
        )
        return _text(reply[0]) == "ok"

    def bind(self, cohort: str, bindings: Sequence[TicketBinding]) -> None:
        base = self._base(cohort)
        args = [base, str(len(bindings))]
        for binding in bindings:
            args += [binding.ticket, _ms(binding.lease_seconds), str(len(binding.parts))]
            for part in binding.parts:
                args += [part.id, _doc(part)]
        self._store.call_function("gpualloc_quota_bind_many", self._keys(base), args, write=True)

    def extend(self, cohort: str, entry_id: str, lease_seconds: float) -> bool:
        base = self._base(cohort)
        args = [base, entry_id, _ms(lease_seconds)]
        reply = self._store.call_function(
            "gpualloc_quota_extend", self._keys(base), args, write=True
        )
        return int(reply) == 1

    def commit(self, cohort: str, entry_id: str) -> bool:
        base = self._base(cohort)
        reply = self._store.call_function(
            "gpualloc_quota_commit", self._keys(base), [base, entry_id], write=True
        )
        return int(reply) == 1

    def drop(self, cohort: str, entry_ids: Sequence[str]) -> None:
        if not entry_ids:
            return
        base = self._base(cohort)
        self._store.call_function(
            "gpualloc_quota_drop", self._keys(base), [base, *entry_ids], write=True
        )

    def read_consumed(self, cohort: str) -> ConsumedRead:
        base = self._base(cohort)
        now, version, flat = self._store.call_function(
            "gpualloc_quota_consumed_read", self._keys(base), [base], write=False
        )
        tenants = {}
        for i in range(0, len(flat), 2):
            doc = json.loads(_text(flat[i + 1]))
            amounts = {str(k): float(v) for k, v in doc["amounts"].items()}
            tenants[_text(flat[i])] = ConsumedUsage(amounts, int(doc["at"]) / 1000)
        return ConsumedRead(int(_text(version)), int(_text(now)) / 1000, tenants)

    def put_consumed(self, cohort: str, version: int, tenants: Mapping[str, ConsumedUsage]) -> bool:
        base = self._base(cohort)
        args = [base, str(version)]
        for tenant in sorted(tenants):
            usage = tenants[tenant]
            amounts = {name: usage.amounts[name] for name in sorted(usage.amounts)}
            doc = {"amounts": amounts, "at": round(usage.at * 1000)}
            args += [tenant, json.dumps(doc, separators=(",", ":"))]
        reply = self._store.call_function(
            "gpualloc_quota_consumed_put", self._keys(base), args, write=True
        )
        return int(reply) == 1

    def close(self) -> None:
        pass  # the connection is the reservation store's

    def _base(self, cohort: str) -> str:
        return f"{self._prefix}:{{quota:{cohort}}}:"

    @staticmethod
    def _keys(base: str) -> list[str]:
        return [
            base + "entries",
            base + "expires",
            base + "version",
            base + "consumed",
            base + "consumed-version",
        ]


def _doc(entry: QuotaEntry) -> str:
    amounts = {name: entry.amounts[name] for name in sorted(entry.amounts)}
    return json.dumps({"tenant": entry.tenant, "amounts": amounts}, separators=(",", ":"))


def _ms(seconds: float) -> str:
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"lease_seconds must be > 0, got {seconds}")
    return str(max(1, math.ceil(seconds * 1000)))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
