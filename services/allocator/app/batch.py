"""AllocateBatch: many independent Allocates in one call, as a scheduler's pass sends its queue.

Each item is an Allocate in all but transport — its own claims, owner, idempotency key,
priority class and reserve flag — and goes through `AllocatorService.allocate`, the unary path,
unchanged. Items run in request order on this thread, so each one's solve reads the holdings
the earlier items' reservations left (an item with `reserve` holds its devices before the next
item is solved; an item without it holds nothing, exactly as a unary Allocate). So a batch gives
the same answers as the same items sent one by one in order, which is what the tests check.

Opportunistic batching, the part done so far: consecutive items without `reserve` that ask the
same thing (`BatchItem.signature`, the request's bytes) with no reserving item between them
share one solve — one by one they would get the same answer from the same state, since an
Allocate without `reserve` changes nothing. Reserving items are each solved and written on
their own (issue 29 asks for more: ranked candidates reused with the last placement applied,
one store round trip per shard).

Each item ends in its own result: the Answer (ALLOCATED, UNSATISFIABLE, QUOTA_EXCEEDED with
preemption victims, BUDGET_EXHAUSTED) or the typed error it met — a bad item (its request does
not map, its owner may not be named, its store write conflicts past the retries) fails alone
and the items after it still run. A typed error never leaves anything of its item reserved,
since the unary path reserves all or nothing. The call's deadline is shared, less the part kept
for the reply (REPLY_SHARE): every item's search stops before it (BUDGET_EXHAUSTED, as a unary
Allocate), and once it has passed — or the client went away — the items not reached answer
DeadlineExceeded without being solved.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from services.allocator.app.messages import Answer, LeaseOptions, Query
from services.common.deadline import UNBOUNDED, Deadline
from services.common.errors import DeadlineExceeded, GpuallocError, InvalidArgument

__all__ = ["MAX_BATCH_ITEMS", "Allocating", "BatchItem", "ItemResult", "allocate_batch"]

MAX_BATCH_ITEMS = 4096
"""The most items one batch may carry (a larger batch is INVALID_ARGUMENT as a whole)."""


@dataclass(frozen=True)
class BatchItem:
    """One item as the unary Allocate takes it: the query, and the lease when it reserves."""

    query: Query
    lease: LeaseOptions | None = None
    signature: bytes = b""
    """Equal for items asking the same thing (the servicer: the request's bytes); empty: never
    shared. Consecutive non-reserving items with one signature share one solve."""


ItemResult = Answer | GpuallocError
"""An item's answer, or the typed error it failed with."""


class Allocating(Protocol):
    """What a batch needs of the service: `AllocatorService.allocate`."""

    def __call__(
        self, query: Query, lease: LeaseOptions | None = None, *, deadline: Deadline = UNBOUNDED
    ) -> Answer: ...


def allocate_batch(
    allocate: Allocating,
    items: Sequence[Callable[[], BatchItem]],
    *,
    deadline: Deadline = UNBOUNDED,
    on_result: Callable[[ItemResult], None] | None = None,
) -> list[ItemResult]:
    """One result per item, in order. `allocate` is `AllocatorService.allocate`; each item is a
    thunk so that mapping it from the wire (which may raise InvalidArgument or PermissionDenied)
    fails that item only. `on_result` sees each result as it is decided (the servicer turns it
    into its reply there, so that the deadline covers that work too and the reply can still be
    sent). Raises InvalidArgument for a batch over MAX_BATCH_ITEMS."""
    if len(items) > MAX_BATCH_ITEMS:
        raise InvalidArgument.at(
            "items", f"a batch carries at most {MAX_BATCH_ITEMS} items, not {len(items)}"
        )
    results: list[ItemResult] = []
    deadline = _answering(deadline)

    def decided(result: ItemResult) -> None:
        results.append(result)
        if on_result is not None:
            on_result(result)

    answered: dict[bytes, Answer] = {}  # non-reserving answers since the last reserving item
    for index, make in enumerate(items):
        if deadline.passed():
            not_reached = DeadlineExceeded(  # one error for them all: cheap to answer
                f"not reached: the call's deadline passed after {index} of {len(items)} items"
            )
            for _ in range(index, len(items)):
                decided(not_reached)
            break
        try:
            item = make()
            shared = answered.get(item.signature) if item.lease is None else None
            if shared is not None:
                decided(shared)
                continue
            answer = allocate(item.query, item.lease, deadline=deadline)
        except GpuallocError as error:
            decided(error)
            continue
        decided(answer)
        if item.lease is not None:
            answered.clear()  # it may have reserved (or revoked): later items solve again
        elif item.signature:
            answered[item.signature] = answer
    return results


REPLY_SHARE = 0.4
"""Of the time a batch has, the part kept for sending its reply (at most REPLY_SECONDS): the
items stop there. A reply of thousands of answers takes a while to encode and send; with a fifth
of 1.5 s a loaded 2-core CI machine let a 4,096-item call's reply miss its deadline (the items
not reached share one error, so answering them costs little; the reply's encoding dominates)."""
REPLY_SECONDS = 1.0


def _answering(deadline: Deadline) -> Deadline:
    left = deadline.left()
    if left is None or deadline.at is None:
        return deadline
    return Deadline(deadline.at - min(REPLY_SECONDS, left * REPLY_SHARE), deadline.cancelled)
