"""What a caller sees of other tenants' reservations: "held by tenant X", nothing more.

A caller whose principal may not see a reservation in full (another tenant's, without the
all-tenants permission) gets it with its node, devices, state and expiry — what an operator of
the fleet or an Explain needs to understand why GPUs are busy — and without its id, owner,
fencing token, idempotency key, claim names, labels and driver configuration: the handles that
would let it act on, or learn about, another tenant's work. Explain's rejections name such
holders as "a reservation of tenant X". Errors name them the same way (`visible_errors`): a
Reserve refused for a device another tenant holds says "held by tenant X", and a change of a
reservation preempted by another tenant's says "preempted by tenant X", as the watch does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from services.allocator.app.holders import holder_ids
from services.allocator.app.messages import Answer, Holder, Victim
from services.allocator.app.reservation_watch import ChangeKind, ReservationChange, View
from services.allocator.core import Explanation, RejectionGroup, holders
from services.allocator.reservations.binding import BINDING_REVOKED_BY
from services.allocator.reservations.model import Reservation
from services.common.dra.model import AllocationResult
from services.common.errors import Conflict, Preempted
from services.common.security.principal import Principal, tenant_of_owner

__all__ = [
    "visible_answer",
    "visible_errors",
    "visible_holder",
    "visible_reservation",
    "watched_changes",
]


def visible_reservation(reservation: Reservation, viewer: Principal) -> Reservation:
    if viewer.may_see(reservation.owner):
        return reservation
    return replace(
        reservation,
        id="",
        owner=tenant_of_owner(reservation.owner),
        claim_names=tuple("" for _ in reservation.claim_names),
        allocations=tuple(AllocationResult(results=a.results) for a in reservation.allocations),
        fencing_token=0,
        idempotency_key="",
        labels=(),
        redacted=True,
    )


def watched_changes(viewer: Principal, *, owner: str = "", node: str = "") -> View:
    """What a WatchReservations stream of `viewer` is shown: the changes of reservations it
    may see in full (its tenant's; every tenant's for a reader of all tenants), of `owner`
    (within its tenant, as ListReservations qualifies it) and on `node` when set. Another
    tenant's changes are not sent at all: unlike a held device, they explain nothing to the
    viewer. A preemptor of another tenant is named by its tenant only (`tenant X`)."""
    wanted_owner = viewer.qualified(owner)

    def shown(change: ReservationChange) -> ReservationChange | None:
        if wanted_owner and change.owner != wanted_owner:
            return None
        if (node and change.node != node) or not viewer.may_see(change.owner):
            return None
        by = change.preempted_by
        if by and change.kind is not ChangeKind.BINDING_FAILED and not viewer.may_see(by):
            return replace(change, preempted_by=_tenant(by))
        return change

    return shown


def _tenant(owner: str) -> str:
    return f"tenant {tenant_of_owner(owner)}"


@contextmanager
def visible_errors(viewer: Principal, owner_of: Callable[[str], str | None]) -> Iterator[None]:
    """Re-raise a Conflict or Preempted raised inside with the holders and preemptors `viewer`
    may not see named by their tenant only. `owner_of` gives a reservation id's owner; a
    holder whose owner is unknown here is named "another reservation"."""
    try:
        yield
    except Conflict as error:
        if viewer.sees_all_tenants or not error.holders:
            raise
        message = str(error)
        for holder in set(error.holders.values()):
            owner = owner_of(holder)
            if owner is None or not viewer.may_see(owner):
                shown = _tenant(owner) if owner is not None else "another reservation"
                message = message.replace(f"held by reservation {holder}", f"held by {shown}")
        raise Conflict(message, error.conflicts) from None
    except Preempted as error:
        if not error.by or error.by.startswith(BINDING_REVOKED_BY) or viewer.may_see(error.by):
            raise  # a failed binding names the device and condition, no holder
        raise Preempted(error.reservation_id, _tenant(error.by)) from None


def visible_holder(holder: Holder, viewer: Principal) -> Holder:
    if viewer.may_see(holder.owner):
        return holder
    return replace(holder, reservation_id="", owner=tenant_of_owner(holder.owner), redacted=True)


def shown_as_is(answer: Answer) -> bool:
    """Whether visible_answer gives every viewer `answer` itself: it names nothing of anyone's
    (no holders, explanation or preemption)."""
    return not answer.holders and answer.explanation is None and not answer.preemption


def visible_answer(
    answer: Answer, viewer: Principal, owner_of: Callable[[str], str | None]
) -> Answer:
    """`answer` with other tenants' holders and reservation ids hidden. `owner_of` gives the
    owner of a reservation id named in a rejection (None: unknown here, shown as is)."""
    if shown_as_is(answer) or viewer.sees_all_tenants:
        return answer  # nothing of anyone's to hide: the common case of a placement
    explanation = answer.explanation
    if explanation is not None:
        explanation = _visible_explanation(explanation, viewer, owner_of)
    return replace(
        answer,
        holders=tuple(visible_holder(h, viewer) for h in answer.holders),
        explanation=explanation,
        preemption=tuple(_visible_victim(v, viewer) for v in answer.preemption),
    )


def _visible_victim(victim: Victim, viewer: Principal) -> Victim:
    if viewer.may_see(victim.holder.owner):
        return victim
    return replace(victim, holder=visible_holder(victim.holder, viewer), replacement_id="")


def _visible_explanation(
    explanation: Explanation, viewer: Principal, owner_of: Callable[[str], str | None]
) -> Explanation:
    def shown(reservation_id: str) -> str:
        owner = owner_of(reservation_id)
        if owner is None or viewer.may_see(owner):
            return reservation_id
        return f"a reservation of tenant {tenant_of_owner(owner)}"

    def group(g: RejectionGroup) -> RejectionGroup:
        ids = holder_ids(g)
        return replace(g, holders=holders(shown(i) for i in ids)) if ids else g

    requests = tuple(
        replace(r, rejections=tuple(group(g) for g in r.rejections)) for r in explanation.requests
    )
    return replace(explanation, requests=requests)
