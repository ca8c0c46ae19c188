"""The ids of holds that are not reservations yet, as typed values (reservations/hold_kinds.py)."""

from __future__ import annotations

import pytest

from services.allocator.reservations.hold_kinds import HoldKind


@pytest.mark.parametrize(
    ("hold_id", "kind"),
    [
        pytest.param(HoldKind.PENDING.id(7), HoldKind.PENDING, id="a-pending-placement"),
        pytest.param(HoldKind.TICKET.id("ab12"), HoldKind.TICKET, id="a-quota-ticket"),
        pytest.param("res-1@n1", None, id="a-reservation"),
        pytest.param("other:1", None, id="an-unknown-prefix-is-a-reservation-id"),
        pytest.param("pending", None, id="no-colon-no-kind"),
    ],
)
def test_hold_kind_of_an_id(hold_id: str, kind: HoldKind | None) -> None:
    assert HoldKind.of(hold_id) is kind


def test_the_ids_keep_their_stored_spelling() -> None:
    """Ledger entries outlive a deploy: a ticket written before reads as one after."""
    assert (HoldKind.PENDING.id(1), HoldKind.TICKET.id("x")) == ("pending:1", "ticket:x")
