"""Who holds the devices a claim could not get: the reservations behind an Explain.

The solver names holders in its IN_USE rejections (`RejectionGroup.holders`: the allocated
state's owners are reservation ids). Counters and capacity shares have no single holder, so for
those the reservations on the closest-miss nodes whose devices, counters or capacity were short
(the NodeMiss reason codes) are named instead. Sorted by expiry (the soonest free first), then
id; at most MAX_HOLDERS.
"""

from __future__ import annotations

from collections.abc import Iterable

from services.allocator.app.messages import Answer, Holder, Outcome
from services.allocator.core import ReasonCode, RejectionGroup
from services.allocator.reservations.model import Reservation

__all__ = ["MAX_HOLDERS", "blocking_holders", "holder", "holder_ids"]

MAX_HOLDERS = 20
_SHORTAGES = frozenset({ReasonCode.IN_USE, ReasonCode.COUNTERS, ReasonCode.CAPACITY})


def blocking_holders(
    answer: Answer, reservations: Iterable[Reservation], max_nodes: int
) -> tuple[Holder, ...]:
    """The live `reservations` that blocked the claims of an unsuccessful `answer`."""
    explanation = answer.explanation
    if explanation is None or answer.outcome is Outcome.ALLOCATED:
        return ()
    ids: set[str] = set()
    for request in explanation.requests:
        for group in request.rejections:
            ids.update(holder_ids(group))
    nodes = {
        miss.node
        for miss in explanation.nodes[:max_nodes]
        if any(reason.code in _SHORTAGES for reason in miss.reasons)
    }
    found = [holder(r) for r in reservations if r.id in ids or r.node in nodes]
    found.sort(key=lambda h: (h.expires_at is None, h.expires_at or 0.0, h.reservation_id))
    return tuple(found[:MAX_HOLDERS])


def holder_ids(group: RejectionGroup) -> tuple[str, ...]:
    """The reservation ids an IN_USE rejection names."""
    return group.holders if group.code is ReasonCode.IN_USE else ()


def holder(reservation: Reservation) -> Holder:
    devices = sorted(
        {
            result.device_id
            for allocation in reservation.allocations
            for result in allocation.results
            if not result.admin_access
        }
    )
    return Holder(
        reservation_id=reservation.id,
        owner=reservation.owner,
        node=reservation.node,
        state=reservation.state,
        expires_at=reservation.expires_at,
        devices=tuple(devices),
    )
