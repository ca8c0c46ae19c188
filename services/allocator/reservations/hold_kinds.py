"""What an id in the allocated state or the quota ledger names when it is not a reservation's.

The allocated state's owners are reservation ids, and so are the quota ledger's entries, but
for two kinds of hold that are not reservations yet: a placement this process is reserving now
(the live holdings' `pending` token, held for its own solves until the store answers) and a
quota grant being made (the ledger's `ticket` entry, bound to the reservations once they
exist). Each is `<kind>:<suffix>`; a reservation id never has that form.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["HoldKind"]


class HoldKind(StrEnum):
    PENDING = "pending"  # a placement being reserved (services/allocator/app/live_reservations.py)
    TICKET = "ticket"  # a quota grant being made (services/allocator/app/quotas.py)

    def id(self, suffix: object) -> str:
        """The id of a hold of this kind."""
        return f"{self.value}:{suffix}"

    @classmethod
    def of(cls, hold_id: str) -> HoldKind | None:
        """The kind `hold_id` names; None: a reservation's id."""
        kind, colon, _ = hold_id.partition(":")
        if not colon:
            return None
        return next((k for k in cls if k.value == kind), None)
