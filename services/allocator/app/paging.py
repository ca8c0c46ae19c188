"""Page tokens of ListReservations: opaque to clients, bound to the filter they were issued for.

A token is the base64url JSON of the last id of the page and a hash of the filter (owner, node,
state); pages are sorted by id, so the next page is every id after it. Reservations created or
released between pages may appear or vanish, as with any live list; none is returned twice.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json

from services.allocator.reservations.model import ReservationState
from services.common.errors import InvalidArgument

__all__ = ["decode_token", "encode_token", "query_hash"]


def query_hash(owner: str, node: str, state: ReservationState | None) -> str:
    text = json.dumps([owner, node, state.value if state else ""])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def encode_token(after: str, query: str) -> str:
    raw = json.dumps({"after": after, "q": query}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str, query: str) -> str:
    """The id a page starts after ("" for the first page); INVALID_ARGUMENT for a token that
    is not ours or was issued for another filter."""
    if not token:
        return ""
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        after, issued_for = data["after"], data["q"]
    except (ValueError, KeyError, TypeError, RecursionError, binascii.Error):
        raise InvalidArgument.at("page_token", "not a page token of this server") from None
    if issued_for != query or not isinstance(after, str):
        raise InvalidArgument.at("page_token", "was issued for a different filter")
    return after
