"""Concurrent unary Allocate calls placed together: opportunistic batching (issue 29).

A unary Allocate pays per call what an AllocateBatch item shares with the items of its pass: a
reserving item's store write is one round trip per shard for the whole run and its quota
tickets one compare-and-set per ledger, identical items share one search (app/batch.py). So calls
that arrive together are placed together, as a database commits the transactions waiting for
the log in one write (group commit) and as kube-scheduler's opportunistic batching (KEP-5598)
schedules compatible pods together:

- a call that finds no pass running runs at once: a pass of one, which is the service's unary
  `allocate` itself in the call's thread (no timer, no waiting for company, nothing added when
  the server is idle);
- a call that arrives while a pass runs waits; when the pass ends, its leader (the caller whose
  thread ran it) answers its own call and hands the lead to the oldest waiting call, whose
  thread runs the next pass with every call waiting then (at most MAX_PASS_ITEMS), in arrival
  order. A leader runs one pass: its own call's latency is that pass and the one before it;
  a call waits for the pass running when it arrived and its own, unless more than
  MAX_PASS_ITEMS arrived before it (the server's handler threads bound how many can wait);
- a pass of several calls is one `allocate_batch` of their items, each with its caller's
  deadline (`BatchItem.deadline`): the answers are the unary answers of the calls sent one by
  one in arrival order, each call is solved under its own deadline, and one whose deadline
  passed (or whose client went away) before its turn answers DeadlineExceeded unsolved, holding
  nothing. A waiting call whose deadline passes, or whose client cancels, leaves the queue
  unsolved (a cancel is seen within NOTICE_SECONDS). An item's typed error is raised in its
  caller's thread; one bad item fails alone.

The calls' identities stay theirs: each is mapped and authorized in its caller's thread before
it joins, and audited and answered there after (the servicer). No grpc here.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from services.allocator.app.batch import (
    Allocating,
    BatchItem,
    ItemResult,
    allocate_batch,
    turn_missed,
)
from services.allocator.app.messages import Answer, LeaseOptions, Query
from services.allocator.app.telemetry import AllocatorMetrics
from services.common.deadline import UNBOUNDED, Deadline
from services.common.errors import GpuallocError

__all__ = ["MAX_PASS_ITEMS", "Combiner"]

MAX_PASS_ITEMS = 64
"""The most calls placed in one pass (as MAX_STREAM_PASS_ITEMS for AllocateStream): a pass's
write is one store call, and its last caller waits for every item before it."""


class Combiner:
    """Places concurrent unary Allocates together (the module's docstring says how)."""

    def __init__(
        self,
        service: Allocating,
        *,
        max_items: int = MAX_PASS_ITEMS,
        metrics: AllocatorMetrics | None = None,
    ) -> None:
        if max_items < 1:
            raise ValueError("a pass places at least one call")
        self._service = service
        self._max_items = max_items
        self._metrics = metrics
        self._lock = threading.Lock()
        self._waiting: deque[_Call] = deque()  # arrival order; the leader's call first
        self._leading = False  # a call's thread is running a pass (then calls wait)
        self.passes = 0
        """Passes run so far, a pass of one included (tests read it; the metrics count too)."""

    def allocate(
        self, query: Query, lease: LeaseOptions | None = None, *, deadline: Deadline = UNBOUNDED
    ) -> Answer:
        """What `AllocatorService.allocate` answers for the call, placed alone or with the
        calls waiting with it; raises the typed error it would raise (DeadlineExceeded when
        the call's deadline passed, or its client went away, before its turn)."""
        with self._lock:
            alone = not self._leading
            if alone:  # no pass running: this call's thread places it now, a pass of one
                self._leading = True
                self.passes += 1
            else:
                call = _Call(BatchItem(query, lease, deadline=deadline), threading.Event())
                self._waiting.append(call)
        if alone:
            try:  # the unary Allocate itself; the lead goes on whatever happens here
                if self._metrics is not None:
                    self._metrics.combined_pass_items.record(1)
                return self._service.allocate(query, lease, deadline=deadline)
            finally:
                self._hand_on()
        if self._follow(call):
            self._lead(call)
        return call.answer()

    @property
    def waiting(self) -> int:
        """Calls waiting for a pass (tests)."""
        with self._lock:
            return len(self._waiting)

    def _follow(self, call: _Call) -> bool:
        """Wait for the call's pass; True when the call leads the next pass instead. A call
        whose deadline passes, or whose client goes away, while it waits leaves unsolved (its
        client's going away is seen within NOTICE_SECONDS)."""
        deadline = call.item.deadline or UNBOUNDED
        while not call.woken.wait(_until_notice(deadline)):
            if not deadline.passed():
                continue
            with self._lock:
                if not call.taken and not call.leads:  # still waiting: it leaves, unsolved
                    self._waiting.remove(call)
                    call.result = turn_missed(deadline)
                    return False
            call.woken.wait()  # its pass has it (or it leads): that ends soon
            break
        return call.leads

    def _lead(self, call: _Call) -> None:
        """Run one pass (the waiting calls, this one first: the lead goes to the oldest), then
        hand the lead on."""
        with self._lock:
            count = min(self._max_items, len(self._waiting))
            taken = [self._waiting.popleft() for _ in range(count)]
            for each in taken:
                each.taken = True
            self.passes += 1
        assert taken[0] is call
        try:
            self._run(taken)
        finally:
            for each in taken[1:]:
                each.woken.set()
            self._hand_on()

    def _hand_on(self) -> None:
        """After a pass: the lead to the oldest waiting call, or to none (the next call to
        come places itself at once)."""
        with self._lock:
            if self._waiting:
                successor = self._waiting[0]
                successor.leads = True
                successor.woken.set()
            else:
                self._leading = False

    def _run(self, taken: list[_Call]) -> None:
        """Decide every taken call's result (a bug's exception included)."""
        try:
            if len(taken) == 1:
                taken[0].result = self._alone(taken[0].item)
                return
            if self._metrics is not None:
                self._metrics.combined_pass_items.record(len(taken))
            items = _alike_signed([c.item for c in taken])
            results = allocate_batch(self._service, [_given(item) for item in items])
            for each, result in zip(taken, results, strict=True):
                each.result = result
        except BaseException as error:  # a bug: every caller of the pass sees it
            for each in taken:
                if each.result is None:
                    each.result = error
            raise

    def _alone(self, item: BatchItem) -> ItemResult:
        """A pass of one waiting call: the unary Allocate (unless its time is already up)."""
        if self._metrics is not None:
            self._metrics.combined_pass_items.record(1)
        deadline = item.deadline or UNBOUNDED
        if deadline.passed():
            return turn_missed(deadline)
        try:
            return self._service.allocate(item.query, item.lease, deadline=deadline)
        except GpuallocError as error:
            return error


class _Call:
    """A unary Allocate waiting in the combiner: its item, then its result."""

    __slots__ = ("item", "leads", "result", "taken", "woken")

    def __init__(self, item: BatchItem, woken: threading.Event) -> None:
        self.item = item
        self.woken = woken  # set when answered or handed the lead
        self.result: ItemResult | BaseException | None = None
        self.taken = False  # in a pass (it will be answered there)
        self.leads = False  # handed the lead: its thread runs the next pass

    def answer(self) -> Answer:
        result = self.result
        if isinstance(result, Answer):
            return result
        assert result is not None
        raise result


NOTICE_SECONDS = 0.05
"""How often a waiting call looks whether its client went away (a cancel sets a flag; its
deadline wakes it by itself)."""


def _until_notice(deadline: Deadline) -> float | None:
    left = deadline.left()
    if deadline.cancelled is None:
        return left
    return NOTICE_SECONDS if left is None else min(left, NOTICE_SECONDS)


def _alike_signed(items: list[BatchItem]) -> list[BatchItem]:
    """The items, those without `reserve` that ask the same query given one signature (so that
    allocate_batch solves them once: an Allocate without `reserve` is answered from its query
    alone). Queries compare by value: the servicer's ClaimReader hands out the same claim
    objects for the same bytes, so equal calls compare by identity, cheaply."""
    queries: list[Query] = []
    signed: list[BatchItem] = []
    for item in items:
        if item.lease is not None or item.signature:
            signed.append(item)
            continue
        index = next((i for i, query in enumerate(queries) if query == item.query), len(queries))
        if index == len(queries):
            queries.append(item.query)
        signed.append(replace(item, signature=b"query %d" % index))
    return signed


def _given(item: BatchItem) -> Callable[[], BatchItem]:
    return lambda: item
