"""AllocateBatch: many independent Allocates in one call, as a scheduler's pass sends its queue.

Each item is an Allocate in all but transport — its own claims, owner, idempotency key,
priority class and reserve flag — and gets the answer it would get sent on its own, in order:
items run in request order on this thread, each solved on the holdings the items before it left
(an item with `reserve` holds its devices before the next item is solved; an item without it
holds nothing, exactly as a unary Allocate). So a batch gives the same answers as the same items
sent one by one in order, which is what the tests check.

What a batch saves over one call per item:

- consecutive reserving items are one *run* (`AllocatorService.allocate_run`): each is solved
  with the earlier items' placements held pending in this process, and the run is written
  together — the quota tickets in one compare-and-set per ledger, the devices in one store call,
  one round trip per shard (app/granting.py). An item the run cannot finish on its own (it may
  preempt, its quota refuses it, its key is busy, another writer took its devices) takes the
  unary path after the items before it are written;
- consecutive items without `reserve` that ask the same thing (`BatchItem.signature`, the
  request's bytes) with no reserving item between them share one solve: one by one they would
  get the same answer from the same state, since an Allocate without `reserve` changes nothing;
- the gRPC floor is paid once.

Each item ends in its own result: the Answer (ALLOCATED, UNSATISFIABLE, QUOTA_EXCEEDED with
preemption victims, BUDGET_EXHAUSTED) or the typed error it met — a bad item (its request does
not map, its owner may not be named, its store write conflicts past the retries) fails alone
and the items after it still run, and nothing of it is left reserved (a run's placement is all
or nothing, and a failed one's quota ticket and pending hold are dropped). The call's deadline is
shared, less the part kept for the reply (REPLY_SHARE): every item's search stops before it
(BUDGET_EXHAUSTED, as a unary Allocate), and once it has passed — or the client went away — the
items not reached answer DeadlineExceeded without being solved.

An item may carry its own deadline (`BatchItem.deadline`: a unary Allocate combined with others
into one pass, app/combining.py): it is then solved under its own deadline instead of the call's,
and once that has passed — or its client went away — it answers DeadlineExceeded without being
solved, while the items after it go on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from services.allocator.app.messages import Answer, LeaseOptions, Outcome, Query
from services.common.deadline import UNBOUNDED, Deadline
from services.common.errors import DeadlineExceeded, GpuallocError, InvalidArgument

__all__ = [
    "MAX_BATCH_ITEMS",
    "MAX_RUN_ITEMS",
    "Allocating",
    "BatchItem",
    "ItemResult",
    "allocate_batch",
    "turn_missed",
]

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
    deadline: Deadline | None = None
    """The item's own deadline (a combined unary call's), in place of the batch's; None: the
    batch's."""


ItemResult = Answer | GpuallocError
"""An item's answer, or the typed error it failed with."""


class Allocating(Protocol):
    """What a batch needs of the service (`AllocatorService`): the unary Allocate, and a run
    of consecutive reserving items."""

    def allocate(
        self, query: Query, lease: LeaseOptions | None = None, *, deadline: Deadline = UNBOUNDED
    ) -> Answer: ...

    def allocate_run(
        self,
        items: Sequence[tuple[Query, LeaseOptions]],
        *,
        deadline: Deadline = UNBOUNDED,
        deadlines: Sequence[Deadline] | None = None,
    ) -> list[Answer | GpuallocError]: ...


def allocate_batch(
    service: Allocating,
    items: Sequence[Callable[[], BatchItem]],
    *,
    deadline: Deadline = UNBOUNDED,
    on_result: Callable[[ItemResult], None] | None = None,
) -> list[ItemResult]:
    """One result per item, in order. Each item is a thunk so that mapping it from the wire
    (which may raise InvalidArgument or PermissionDenied) fails that item only. `on_result`
    sees each result as it is decided, in order (the servicer turns it into its reply there, so
    that the deadline covers that work too and the reply can still be sent). Raises
    InvalidArgument for a batch over MAX_BATCH_ITEMS."""
    if len(items) > MAX_BATCH_ITEMS:
        raise InvalidArgument.at(
            "items", f"a batch carries at most {MAX_BATCH_ITEMS} items, not {len(items)}"
        )
    results: list[ItemResult] = []
    deadline = _answering(deadline)
    mapped = _Mapped(items)

    def decided(result: ItemResult) -> None:
        results.append(result)
        if on_result is not None:
            on_result(result)

    answered: dict[bytes, tuple[Answer, Deadline]] = {}  # non-reserving answers since the last
    # reserving item, each with the deadline it was solved under
    index = 0
    while index < len(items):
        if deadline.passed():
            not_reached = DeadlineExceeded(  # one error for them all: cheap to answer
                f"not reached: the call's deadline passed after {index} of {len(items)} items"
            )
            for _ in range(index, len(items)):
                decided(not_reached)
            break
        item = mapped[index]
        if isinstance(item, GpuallocError):
            decided(item)
            index += 1
            continue
        if item.deadline is not None and item.deadline.passed():
            decided(turn_missed(item.deadline))
            index += 1
            continue
        if item.lease is None:
            decided(_answer(service, item, answered, item.deadline or deadline))
            index += 1
            continue
        reserving, own = mapped.reserving_from(index)
        if own:  # combined calls: each its own
            deadlines = [d or deadline for d in own]
            done = service.allocate_run(reserving, deadline=deadline, deadlines=deadlines)
        else:
            done = service.allocate_run(reserving, deadline=deadline)
        results += done  # not through `decided`: a call less per item of a run
        if on_result is not None:
            for result in done:
                on_result(result)
        answered.clear()  # they may have reserved (or revoked): later items solve again
        index += len(done)  # fewer than the run's: the deadline passed (the loop's check says so)
    return results


def _answer(
    service: Allocating,
    item: BatchItem,
    answered: dict[bytes, tuple[Answer, Deadline]],
    deadline: Deadline,
) -> ItemResult:
    """A non-reserving item's answer: an identical earlier one's (unless another deadline than
    this item's cut that one's search short), or its own solve."""
    shared = answered.get(item.signature)
    if shared is not None:
        answer, solved_under = shared
        if solved_under is deadline or answer.outcome is not Outcome.BUDGET_EXHAUSTED:
            return answer
    try:
        answer = service.allocate(item.query, None, deadline=deadline)
    except GpuallocError as error:
        return error
    if item.signature:
        answered[item.signature] = (answer, deadline)
    return answer


def turn_missed(deadline: Deadline) -> DeadlineExceeded:
    """The error of an item whose call ended (its deadline passed, or its client went away)
    before its turn in a batch run or a combined pass: it was not solved, nothing is held."""
    if deadline.cancelled is not None and deadline.cancelled.is_set():
        return DeadlineExceeded("cancelled: the call ended before its turn to be placed")
    return DeadlineExceeded("the call's deadline passed before its turn to be placed")


class _Mapped:
    """The batch's items mapped from the wire as they are reached (once each)."""

    def __init__(self, items: Sequence[Callable[[], BatchItem]]) -> None:
        self._items = items
        self._mapped: list[BatchItem | GpuallocError | None] = [None] * len(items)

    def __getitem__(self, index: int) -> BatchItem | GpuallocError:
        found = self._mapped[index]
        if found is None:
            found = self._mapped[index] = self._map(index)
        return found

    def reserving_from(
        self, index: int
    ) -> tuple[list[tuple[Query, LeaseOptions]], list[Deadline | None] | None]:
        """The reserving items from `index` on, up to the first that is not one (at most
        MAX_RUN_ITEMS): their queries and leases, and their own deadlines (None when none has
        one: the batch's for all). The items mapped here, not through __getitem__ (a call less
        per item)."""
        run: list[tuple[Query, LeaseOptions]] = []
        deadlines: list[Deadline | None] = []
        mapped = self._mapped
        own = False
        for at in range(index, min(len(mapped), index + MAX_RUN_ITEMS)):
            item = mapped[at]
            if item is None:
                item = mapped[at] = self._map(at)
            if isinstance(item, GpuallocError) or item.lease is None:
                break
            run.append((item.query, item.lease))
            deadlines.append(item.deadline)
            own = own or item.deadline is not None
        return run, deadlines if own else None

    def _map(self, index: int) -> BatchItem | GpuallocError:
        try:
            return self._items[index]()
        except GpuallocError as error:
            return error


MAX_RUN_ITEMS = 512
"""Reserving items written together at most: a larger run is written in parts (its holds stay
pending while it is solved, and one store call carries it)."""


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
