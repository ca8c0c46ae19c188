"""The allocator's use cases: Allocate, Explain, Capacity and the reservation life cycle.

Every answer is computed from two local, lock-free reads — the current inventory view
(`ClusterView`) and this process's copy of the live reservations (`Holdings`, as an
AllocatedState for that view) — so Allocate never waits for Redis or the inventory.

Reserving is optimistic: the placement's holds (`reservations/holds.py`) are checked and taken
atomically by the store. When the store answers Conflict, the local copy of that node's reservations
is refreshed and Allocate(reserve) solves again, at most `reserve_retries` more times, then the
Conflict goes to the client (ABORTED, naming the devices). Reserve (a placement the client
sends) is not retried: the client must allocate again. While the store decides, the placement
is pending in `Holdings`, so this process's concurrent solves already avoid it.

A gang (`Query.gang`: the same claims on N nodes of one domain) is solved by the core's
`solve_gang` on the same state. An answer's placement is one shape either way (`Answer.placements`,
one NodePlacement per node: a single node is a gang of one), reserved as one reservation per
scope (app/gang_answers.py), all or nothing (one placement of `store.reserve`),
with the same retries on Conflict.

Time: every use case takes the call's `Deadline` (services.common.deadline) as a value —
the servicer makes it from the gRPC call; in-process callers pass their own or get UNBOUNDED.
It bounds every wait — the search (`SearchBudget.cancelled`, a little before the deadline so
that BUDGET_EXHAUSTED still reaches the client; stopped at once when the client cancels),
waiting for an inventory generation, back-off — and a store call does not start once the
deadline has passed.
"""

from __future__ import annotations

import collections
import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from opentelemetry import trace
from opentelemetry.metrics import Counter

from services.allocator.app.batch import turn_missed
from services.allocator.app.capacity_count import count_capacity
from services.allocator.app.cluster_view import ClusterView, ViewSnapshot
from services.allocator.app.consolidation import MOVED_FROM_LABEL
from services.allocator.app.device_classes import with_inline
from services.allocator.app.flavor_search import search_flavors, units_within_flavors
from services.allocator.app.gang_answers import (
    members_of_reservations,
    placement_requests,
    reserve_request,
)
from services.allocator.app.granting import GrantRun
from services.allocator.app.holders import blocking_holders
from services.allocator.app.live_reservations import Holdings
from services.allocator.app.messages import (
    Answer,
    CapacityAnswer,
    Holder,
    LeaseOptions,
    Outcome,
    Query,
    Victim,
    claim_ref,
)
from services.allocator.app.paging import decode_token, encode_token, query_hash
from services.allocator.app.placing import PlacementSearch
from services.allocator.app.preemption_plans import (
    Proposal,
    Relocation,
    Standing,
    Trials,
    propose,
)
from services.allocator.app.quotas import QuotaExceeded, QuotaGuard, assigned_by
from services.allocator.app.reservation_limit import ReservationLimit
from services.allocator.app.telemetry import AllocatorMetrics
from services.allocator.core import (
    Allocated,
    AllocatedState,
    CohortStatus,
    Explanation,
    NodePlacement,
    Policy,
    QuotaRefusal,
    SolveResult,
    Summary,
    SummaryKind,
    TenantStatus,
)
from services.allocator.reservations.binding import (
    DEFAULT_BINDING_TIMEOUT_SECONDS,
    MAX_DEVICE_CONDITIONS,
    Binding,
    binding_of,
    binding_revocation,
    is_pool_hold,
    merge_conditions,
)
from services.allocator.reservations.holds import device_key, placement_holds
from services.allocator.reservations.model import (
    DeviceCondition,
    Hold,
    Preempted,
    Reservation,
    ReservationState,
    ReservationStore,
    ReserveRequest,
    device_conflict_key,
    reserved,
)
from services.allocator.reservations.queued import with_queued_at
from services.common.deadline import UNBOUNDED, Deadline
from services.common.dra.model import (
    AllocationResult,
    DeviceClass,
)
from services.common.dra.names import label_name_errors
from services.common.errors import (
    Conflict,
    DeadlineExceeded,
    FailedPrecondition,
    GpuallocError,
    InvalidArgument,
    NotBound,
    NotFound,
    PermissionDenied,
)
from services.common.security.principal import tenant_of_owner

__all__ = ["AllocatorService", "ServiceLimits"]

_MAX_CONFLICTS = 8
_UNTRACED = contextlib.nullcontext(trace.INVALID_SPAN)  # reentrant: shared by every call
_DEFAULT_PAGE = 100
_MAX_PAGE = 1000


@dataclass(frozen=True)
class ServiceLimits:
    """The service's knobs (from AllocatorSettings)."""

    lease_seconds: float = 300.0
    max_lease_seconds: float = 86_400.0
    reserve_retries: int = 3
    max_generation_wait: float = 10.0  # seconds a call may wait for min_inventory_generation
    max_capacity_units: int = 1024  # units counted per node at most
    max_nodes_explained: int = 10
    max_consolidation_nodes: int = 16  # nodes a consolidation tries (app/consolidation.py)
    binding_timeout_seconds: float = DEFAULT_BINDING_TIMEOUT_SECONDS  # reservations/binding.py


@dataclass(frozen=True)
class Decision:
    """What one attempt of a call decided: the answer (ALLOCATED: the placement to reserve),
    the query it is for (pinned to the flavors chosen), the preemption that would make it
    fit, and the flavors assigned (flavored resource -> flavor), which its grant is charged
    to (none: charged by the selection rule, QuotaGuard.usage)."""

    answer: Answer
    query: Query
    proposal: Proposal | None = None
    assigned: Mapping[str, str] = field(default_factory=dict)


class AllocatorService:
    def __init__(
        self,
        view: ClusterView,
        holdings: Holdings,
        store: ReservationStore,
        solver: PlacementSearch,
        classes: Mapping[str, DeviceClass],
        *,
        limits: ServiceLimits = ServiceLimits(),
        metrics: AllocatorMetrics | None = None,
        tracer: trace.Tracer | None = None,
        quotas: QuotaGuard | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`clock`: seconds since the epoch, as the store's (binding timeouts)."""
        self._clock = clock
        self.view = view
        self.quotas = quotas
        self.holdings = holdings
        self.store = store
        self.solver = solver
        self.classes = dict(classes)
        self.limits = limits
        self._metrics = metrics
        self._tracer = tracer or trace.NoOpTracer()
        self._traced = not isinstance(self._tracer, trace.NoOpTracer)
        self._keys = _KeyedLocks()
        self._placing = threading.Lock()  # one batch run solving at a time (allocate_run)
        self._reservation_limit = ReservationLimit(holdings.reservations)

    def _span(self, name: str) -> contextlib.AbstractContextManager[trace.Span]:
        """A span around part of a call (the current span while it runs); with telemetry off
        (the no-op tracer) one shared do-nothing span: the API's no-op span would still be
        made and put in the context and taken out again, ~9 us of every call's CPU."""
        if self._traced:
            return self._tracer.start_as_current_span(name)
        return _UNTRACED

    # --- Allocate / Explain / Capacity -------------------------------------------------------

    def allocate(
        self, query: Query, lease: LeaseOptions | None = None, *, deadline: Deadline = UNBOUNDED
    ) -> Answer:
        """Place the claims (or the gang); with `lease`, reserve the placement too, one
        reservation per node, retrying on Conflict. Calls with the same owner and idempotency
        key run one after another in this process, so a duplicate sent concurrently finds the
        first one's reservations instead of reserving other devices."""
        if lease is None or not lease.idempotency_key:
            return self._allocate(query, lease, deadline)
        with self._keys.held((lease.owner, lease.idempotency_key)):
            return self._allocate(query, lease, deadline)

    def _allocate(self, query: Query, lease: LeaseOptions | None, deadline: Deadline) -> Answer:
        lease_seconds = self._lease_seconds(lease.lease_seconds, "lease_ttl") if lease else 0.0
        if lease is not None:
            self._check_priority_class(lease.priority_class)
        if lease is not None and lease.idempotency_key:
            known = self.holdings.find_idempotent(lease.owner, lease.idempotency_key)
            if known:
                _check_replay(query, known, lease)
                return self._reserved_answer(query, known, self.view.require(0).generation)
        if lease is not None and lease.queued_at is not None:  # kept on the reservation
            lease = replace(lease, labels=with_queued_at(lease.labels, lease.queued_at))
        attempts = 1 + (self.limits.reserve_retries if lease is not None else 0)
        conflict: Conflict | None = None
        revoked: tuple[Victim, ...] = ()
        names = tuple(claim_ref(claim.namespace, claim.name) for claim in query.claims)
        for attempt in range(attempts):
            if attempt and not (revoked and attempt == 1):
                _back_off(attempt, deadline)
            view, state = self._read(query, deadline)
            answer = self._answer(view, state, query, deadline, explain=query.explain)
            if lease is None:
                return answer
            decision = self._decide(view, state, query, answer, lease, revoked, deadline)
            answer, proposal = decision.answer, decision.proposal
            if answer.outcome is Outcome.ALLOCATED:
                requests = placement_requests(
                    view.snapshot, answer.placements, names, lease, lease_seconds
                )
                try:
                    reservations = self._store_reserve(
                        requests,
                        view,
                        deadline,
                        limit=lease.max_reservations,
                        assigned=decision.assigned,
                    )
                except QuotaExceeded as refused:  # the take's check: the ledger's own word
                    answer = replace(answer, outcome=Outcome.QUOTA_EXCEEDED, quota=refused.refusals)
                    proposal = self._proposal(
                        view,
                        state,
                        decision.query,
                        answer,
                        lease,
                        revoked,
                        deadline,
                        assigned=decision.assigned,
                    )
                except Conflict as error:
                    conflict = error
                    self._count(self._metrics.conflicts if self._metrics else None)
                    found = [self.holdings.refresh(request.node) for request in requests]
                    if self._drifted(error, requests, view, any(found)):
                        self.holdings.rebuild()
                    continue
                else:
                    return self._held(query, answer, reservations, lease, revoked, view)
            if proposal is None or revoked or not lease.preempt:
                return replace(answer, preemption=proposal.victims) if proposal else answer
            try:
                revoked = self._revoke(proposal, lease.owner, deadline)
            except Conflict as error:  # a move's device was taken: nothing was revoked
                conflict = error
        self._count(self._metrics.aborted if self._metrics else None)
        assert conflict is not None
        raise _bounded(conflict)

    def _held(
        self,
        query: Query,
        answer: Answer,
        reservations: Sequence[Reservation],
        lease: LeaseOptions,
        revoked: tuple[Victim, ...],
        view: ViewSnapshot,
    ) -> Answer:
        """A reserving Allocate's answer once the store reserved."""
        if lease.idempotency_key:  # the store may answer with another replica's first call
            _check_same_request(reservations, lease)
        if _same_placement(reservations, answer.placements):
            return _with_reservations(answer, tuple(reservations), revoked)
        # The store answered (idempotency key) with an earlier call's reservations: the
        # answer is what is held.
        held = self._reserved_answer(query, reservations, view.generation)
        return replace(held, preemption=revoked, flavors=answer.flavors)

    def explain(
        self,
        query: Query,
        max_nodes: int = 0,
        owner: str = "",
        priority_class: str = "",
        *,
        queued_at: float | None = None,
        deadline: Deadline = UNBOUNDED,
    ) -> Answer:
        """Allocate's search with reasons recorded, plus the reservations that blocked it;
        with `owner`, a placement found is checked against its tenant's quota too, and one not
        found (or refused by the quota) comes with the preemption that would make it fit (for
        a grant of `priority_class` whose work was queued at `queued_at`)."""
        view, state = self._read(query, deadline)
        answer = self._answer(view, state, query, deadline, explain=True)
        if owner and self.quotas is not None:
            lease = LeaseOptions(owner, priority_class=priority_class, queued_at=queued_at)
            decision = self._decide(view, state, query, answer, lease, (), deadline, checked=False)
            explanation = decision.answer.explanation or answer.explanation
            answer = replace(decision.answer, explanation=explanation)
            if decision.proposal is not None:
                answer = replace(answer, preemption=decision.proposal.victims)
        shown = max_nodes or self.limits.max_nodes_explained
        return _with_holders(answer, blocking_holders(answer, self.holdings.reservations(), shown))

    def capacity(
        self,
        query: Query,
        ignore_reservations: bool = False,
        owner: str = "",
        *,
        deadline: Deadline = UNBOUNDED,
    ) -> CapacityAnswer:
        """How many units fit; with `owner` of a limited tenant, also its quotas and how many
        units its quota headroom allows (each unit counted as the first placement would)."""
        view, state = self._read(query, deadline)
        if ignore_reservations:
            state = AllocatedState(view.snapshot)
        counted = self._count_units(view, state, query, deadline)
        if not owner or self.quotas is None or not self.quotas.model.enabled:
            return counted
        rows = tuple(self.quotas.status([tenant_of_owner(owner)]))
        if not rows:
            return counted
        left = {row.resource: row.left for row in rows}
        tenant = self.quotas.model.quota_of(tenant_of_owner(owner))
        per_flavor = None
        if tenant is not None and any(r.base for r in self.quotas.model.resources):
            per_flavor = units_within_flavors(
                self._trials(view, state, query, owner, deadline),
                query,
                tenant,
                self.quotas.model,
                with_inline(self.classes, query.device_classes),
                left,
                lambda pinned: self._count_units(view, state, pinned, deadline).total,
            )
        if per_flavor is not None:
            return replace(counted, quota=rows, within_quota=min(counted.total, per_flavor))
        first = self._answer(view, state, query, deadline, explain=False)
        within = 0
        if first.outcome is Outcome.ALLOCATED:
            unit = self._placement_usage(view, query, first, owner)
            bounds = [left.get(name, 0) // amount for name, amount in unit.items() if amount > 0]
            within = min([counted.total, *bounds])
        return replace(counted, quota=rows, within_quota=within)

    def _count_units(
        self, view: ViewSnapshot, state: AllocatedState, query: Query, deadline: Deadline
    ) -> CapacityAnswer:
        with self._span("capacity"):
            return count_capacity(
                self.solver,
                view.snapshot,
                state,
                with_inline(self.classes, query.device_classes),
                query,
                deadline.answering(),
                generation=view.generation,
                max_units=self.limits.max_capacity_units,
            )

    # --- AllocateBatch's reserving items (app/batch.py) ----------------------------------------

    def allocate_run(
        self,
        items: Sequence[tuple[Query, LeaseOptions]],
        *,
        deadline: Deadline = UNBOUNDED,
        deadlines: Sequence[Deadline] | None = None,
    ) -> list[Answer | GpuallocError]:
        """Consecutive reserving items of a batch, each answered as `allocate` answers it when
        the items are sent one by one in order: solved one after another, each on the holdings
        with the earlier items' placements held (identical consecutive items in one shared
        search: `_answers`), and written together — quota tickets in one compare-and-set per
        ledger, devices in one store call (app/granting.py). While a run is solved no other run
        of this process solves (`_placing`): it would pick the same devices. An item this pass
        does not finish — its answer is not a placement while quotas are on (a preemption may
        be due) or it is UNSATISFIABLE after the run's placements (the holders it names must
        include them), its quota refuses it, its idempotency key is busy, or another writer took its
        devices — goes through `allocate` once the items before it are written. Items not
        started when the deadline passes are left out (the list is then shorter).

        `deadlines`: each item's own (combined unary calls, app/combining.py), in place of
        `deadline` for that item: it is solved under its own, and one whose deadline passed (or
        whose client went away) before its turn answers DeadlineExceeded unsolved while the
        others go on; `deadline` still ends the run."""
        own = list(deadlines) if deadlines is not None else [deadline] * len(items)
        if len(own) != len(items):
            raise ValueError("allocate_run: one deadline per item")
        results: list[Answer | GpuallocError | None] = []
        while len(results) < len(items) and not deadline.passed():
            run = _Run(self._grant_run())
            try:
                with self._placing:
                    unary = self._solve_run(run, items, results, deadline, own)
                self._write_run(run, results, deadline)
            finally:  # after a failure (a bug): nothing of the run stays pending or locked
                run.grants.abandon()
                run.keys.close()
            if unary:  # after the items before it are written
                query, lease = items[len(results)]
                results.append(self._allocate_caught(query, lease, own[len(results)]))
        return [result for result in results if result is not None]

    def _solve_run(
        self,
        run: _Run,
        items: Sequence[tuple[Query, LeaseOptions]],
        results: list[Answer | GpuallocError | None],
        deadline: Deadline,
        own: Sequence[Deadline],
    ) -> bool:
        """Solve items from `len(results)` on into `run` (their results placeholders until it
        is written) until the end, the deadline, or an item for the unary path (True). `own`:
        each item's deadline; identical items solved together search under the earliest of
        theirs (_run_item solves an item again under its own if that cut it short)."""
        ahead: list[Answer] = []  # the next identical items' answers, solved together
        ahead_view: ViewSnapshot | None = None
        while len(results) < len(items) and not deadline.passed():
            position = len(results)
            query, lease = items[position]
            mine = own[position]
            if mine is not deadline and mine.passed():  # its caller's time ran out first
                results.append(turn_missed(mine))
                ahead = []
                continue
            if ahead and not _alike(items[position - 1][0], query):
                ahead = []
            same = 1  # identical items from here on: solved together when `ahead` is empty
            searching = mine
            while (
                not ahead
                and position + same < len(items)
                and _alike(items[position + same][0], query)
            ):
                searching = _earlier(searching, own[position + same])
                same += 1
            try:
                step = self._run_item(run, query, lease, ahead, ahead_view, same, searching, mine)
            except GpuallocError as error:
                results.append(error)
                ahead = []
                continue
            if step is None:
                return True
            if isinstance(step, _Placed):
                results.append(None)
                run.placed.append((position, step))
                ahead_view = step.view
            else:
                results.append(step)
                ahead = []
        return False

    def _run_item(
        self,
        run: _Run,
        query: Query,
        lease: LeaseOptions,
        ahead: list[Answer],
        ahead_view: ViewSnapshot | None,
        same: int,
        deadline: Deadline,
        own: Deadline,
    ) -> Answer | _Placed | None:
        """One reserving item: its final answer (an idempotent replay; no placement and no
        quotas), its placement added to the run, or None (the unary path answers it). `ahead`:
        answers solved for it and the identical items after it on `ahead_view` (consumed here;
        when empty, refilled for `same` identical items under `deadline`, the earliest of
        theirs); cleared when this item does not take its answer's placement. `own`: the
        item's deadline (a search cut short by an earlier one is done again under it)."""
        lease_seconds = self._lease_seconds(lease.lease_seconds, "lease_ttl")
        self._check_priority_class(lease.priority_class)
        if lease.idempotency_key:
            held = run.keys.enter_context(
                self._keys.held((lease.owner, lease.idempotency_key), blocking=False)
            )
            if not held:  # another call's, or this run's: after the run, one at a time
                return None
            known = self.holdings.find_idempotent(lease.owner, lease.idempotency_key)
            if known:
                _check_replay(query, known, lease)
                ahead.clear()
                return self._reserved_answer(query, known, self.view.require(0).generation)
        state: AllocatedState | None = None
        if ahead and ahead_view is not None:
            view, answer = ahead_view, ahead.pop(0)
        else:
            view, state = self._read(query, deadline)
            answers = self._answers(view, state, query, deadline, explain=query.explain, count=same)
            answer, ahead[:] = answers[0], answers[1:]
            if (
                answer.outcome is Outcome.BUDGET_EXHAUSTED
                and deadline is not own
                and not own.answering().passed()
            ):  # another item's deadline cut the shared search: this one's own decides
                answer = self._answers(view, state, query, own, explain=query.explain)[0]
        if lease.queued_at is not None:  # kept on the reservation
            lease = replace(lease, labels=with_queued_at(lease.labels, lease.queued_at))
        if self.quotas is not None:
            state = state or self.holdings.state_for(view)
            decision = self._decide(view, state, query, answer, lease, (), deadline)
            if decision.answer is not answer:
                ahead.clear()  # another flavor's placement: the next items solve again
            if decision.proposal is not None:
                ahead.clear()
                return None  # a preemption to make room: the unary path carries it out
            answer = decision.answer
        if answer.outcome is not Outcome.ALLOCATED:
            ahead.clear()
            if self.quotas is not None:
                return None  # it may preempt
            if answer.outcome is Outcome.UNSATISFIABLE and run.placed:
                return None  # the holders it names are the store's: the run's, once written
            return answer
        names = tuple(claim_ref(claim.namespace, claim.name) for claim in query.claims)
        requests = placement_requests(view.snapshot, answer.placements, names, lease, lease_seconds)
        try:
            assigned = decision.assigned if self.quotas is not None else None
            run.grants.add(view.snapshot, requests, limit=lease.max_reservations, assigned=assigned)
        except QuotaExceeded:
            ahead.clear()
            return None  # the unary path answers it, with the preemption that would make room
        except BaseException:
            ahead.clear()  # its placement is not held: the next items solve again
            raise
        return _Placed(query, lease, answer, requests, view, own)

    def _write_run(
        self, run: _Run, results: list[Answer | GpuallocError | None], deadline: Deadline
    ) -> None:
        """Write the run's placements and put each item's answer in `results`; items that
        lost their devices to another writer, or whose ledger refused them on a second read,
        go through `allocate` after all of them."""
        if not run.placed:
            run.keys.close()
            return
        with self._span("reserve") as span:
            span.set_attribute("gpualloc.batch.placements", len(run.placed))
            # Solving stopped at the deadline (kept before the call's own for the reply): what
            # was solved is written, unless the client went away.
            # A combined call's own deadline (allocate_run's `deadlines`) is its caller's: its
            # placement is not written once that call has ended, as a unary write is refused.
            own = [p.deadline if p.deadline is not deadline else None for _, p in run.placed]
            ended = own if any(each is not None for each in own) else None
            outcomes = run.grants.write(Deadline(None, deadline.cancelled), ended)
        again: list[tuple[int, _Placed]] = []
        for (index, placed), outcome in zip(run.placed, outcomes, strict=True):
            if not isinstance(outcome, GpuallocError):  # its reservations: the common case
                try:
                    results[index] = self._held(
                        placed.query, placed.answer, outcome, placed.lease, (), placed.view
                    )
                except GpuallocError as error:
                    results[index] = error
            elif isinstance(outcome, Conflict):
                self._count(self._metrics.conflicts if self._metrics else None)
                found = [self.holdings.refresh(request.node) for request in placed.requests]
                if self._drifted(outcome, placed.requests, placed.view, any(found)):
                    self.holdings.rebuild()
                again.append((index, placed))
            elif isinstance(outcome, QuotaExceeded):
                again.append((index, placed))
            else:
                results[index] = outcome
        run.placed = []
        run.keys.close()  # the unary path takes each key itself
        for index, placed in again:
            results[index] = self._allocate_caught(placed.query, placed.lease, placed.deadline)

    def _allocate_caught(
        self, query: Query, lease: LeaseOptions, deadline: Deadline
    ) -> Answer | GpuallocError:
        try:
            return self.allocate(query, lease, deadline=deadline)
        except GpuallocError as error:
            return error

    # --- the reservation life cycle ----------------------------------------------------------

    def reserve(
        self,
        node: str,
        claims: Sequence[tuple[str, AllocationResult]],
        lease: LeaseOptions,
        *,
        deadline: Deadline = UNBOUNDED,
    ) -> list[Reservation]:
        """Reserve a placement the client sends (`(claim name, allocation)` pairs on `node`)."""
        if not node:
            raise InvalidArgument.at("node_name", "must not be empty")
        if not claims:
            raise InvalidArgument.at("allocations", "must not be empty")
        lease_seconds = self._lease_seconds(lease.lease_seconds, "lease_ttl")
        self._check_priority_class(lease.priority_class)
        self.holdings.require_synced()
        view = self.view.require(0)
        allocations = tuple(allocation for _, allocation in claims)
        holds = placement_holds(view.snapshot, node, allocations)
        names = tuple(name for name, _ in claims)
        requests = _requests(holds, names, allocations, lease, lease_seconds)
        try:
            reservations = self._store_reserve(
                requests, view, deadline, limit=lease.max_reservations
            )
        except Conflict as conflict:
            self._count(self._metrics.conflicts if self._metrics else None)
            for scope in holds:
                self.holdings.refresh(scope)
            raise _bounded(conflict) from None
        for request, reservation in zip(requests, reservations, strict=True):
            if lease.idempotency_key and set(reservation.hold.devices) != set(request.hold.devices):
                raise FailedPrecondition(
                    f"idempotency key {lease.idempotency_key!r} was first used for another "
                    f"placement (reservation {reservation.id}): use a new key"
                )
        return reservations

    def commit(
        self,
        reservation_id: str,
        owner: str,
        fencing_token: int = 0,
        *,
        deadline: Deadline = UNBOUNDED,
    ) -> Reservation:
        deadline.check("commit")
        current = self._known(reservation_id)
        if current is not None and current.owner == owner:
            self._require_bound(current)
            if self.quotas is not None:  # the ledger first: its entry must outlive the lease
                self.quotas.committing(current)
        reservation = self.store.commit(reservation_id, owner, fencing_token)
        self.holdings.committed(reservation)
        return reservation

    def renew(
        self,
        reservation_id: str,
        owner: str,
        lease_seconds: float | None = None,
        fencing_token: int = 0,
        *,
        deadline: Deadline = UNBOUNDED,
    ) -> Reservation:
        seconds = self._lease_seconds(lease_seconds, "lease_ttl")
        deadline.check("renew")
        if fencing_token:  # gone: the store's renew below says how (expired, preempted)
            with contextlib.suppress(NotFound):
                _check_fence(self.store.get(reservation_id), owner, fencing_token)
        current = self._known(reservation_id)
        if current is not None and current.owner == owner and _waits_for_binding(current):
            self._settle(self.store.get(reservation_id))  # timed out: the renew answers so
        if self.quotas is not None:  # the ledger first: its entry must outlive the lease
            self.quotas.renewing(reservation_id, owner, seconds)
        reservation = self.store.renew(reservation_id, owner, seconds)
        self.holdings.committed(reservation)
        return reservation

    def release(
        self,
        reservation_id: str,
        owner: str,
        fencing_token: int = 0,
        allow_missing: bool = False,
        *,
        deadline: Deadline = UNBOUNDED,
    ) -> Reservation | None:
        """Free the reservation; returns it as this allocator last saw it (None when missing
        and allowed). A reservation unknown here is read from the store first."""
        deadline.check("release")
        current = self._known(reservation_id)
        try:
            self.store.release(reservation_id, owner, fencing_token)
        except (NotFound, Preempted):  # a preempted one is missing too, with who took it
            if allow_missing:
                return None
            raise
        self.holdings.removed([reservation_id])
        if self.quotas is not None:
            self.quotas.released([reservation_id], owner)
        return current

    # --- binding (DRA device binding conditions: reservations/binding.py) -----------------

    def binding(self, reservation: Reservation) -> Binding:
        return binding_of(reservation, self.limits.binding_timeout_seconds)

    def report_device_conditions(
        self,
        reservation_id: str,
        conditions: Sequence[DeviceCondition],
        fencing_token: int = 0,
        *,
        deadline: Deadline = UNBOUNDED,
    ) -> tuple[Reservation, str]:
        """Record the conditions (the caller is the device's driver or agent, whoever holds
        the reservation) and settle the binding: a failure condition True, or the timeout
        passed, releases the reservation. Returns the reservation as the report left it and
        why it was released ("" when it was not)."""
        deadline.check("report device conditions")
        if not conditions:
            raise InvalidArgument.at("conditions", "must not be empty")
        current = self.store.get(reservation_id)
        held = {device_key(r.device_id) for a in current.allocations for r in a.results}
        if len(conditions) > MAX_DEVICE_CONDITIONS * len(held):
            raise InvalidArgument.at(
                "conditions",
                f"{len(conditions)} conditions for {len(held)} devices: at most "
                f"{MAX_DEVICE_CONDITIONS} a device",
            )
        seen: set[tuple[str, str]] = set()
        for index, condition in enumerate(conditions):
            path = f"conditions[{index}]"
            if condition.device not in held:
                raise InvalidArgument.at(
                    f"{path}.device",
                    f"reservation {reservation_id} holds no device {condition.device!r}",
                )
            problems = label_name_errors(condition.type)
            if problems:
                raise InvalidArgument.at(
                    f"{path}.type", f"{condition.type!r}: {'; '.join(problems)}"
                )
            if (condition.device, condition.type) in seen:
                raise InvalidArgument.at(
                    f"{path}.type", f"{condition.type!r} twice for device {condition.device}"
                )
            seen.add((condition.device, condition.type))
        types = collections.Counter(
            c.device for c in merge_conditions(current.conditions, conditions)
        )
        for device, count in types.items():
            if count > MAX_DEVICE_CONDITIONS:
                raise InvalidArgument.at(
                    "conditions",
                    f"device {device} would have {count} condition types: at most "
                    f"{MAX_DEVICE_CONDITIONS} (as a ResourceClaim's status.devices[].conditions)",
                )
        reported = self.store.report_conditions(reservation_id, fencing_token, conditions)
        self.holdings.committed(reported)  # same holds, new conditions: this copy shows them
        return reported, self._settle(reported)

    def sweep_bindings(self) -> None:
        """Release the reservations whose binding timed out (the janitor calls this)."""
        now = self._clock()
        for reservation in self.holdings.reservations():
            if not _waits_for_binding(reservation):
                continue
            binding = self.binding(reservation)
            if binding.deadline is not None and now >= binding.deadline:
                with contextlib.suppress(NotFound, FailedPrecondition):  # gone meanwhile
                    self._settle(self.store.get(reservation.id))

    def _require_bound(self, reservation: Reservation) -> None:
        """Commit only what is bound: a reservation still binding answers NotBound; one
        whose binding failed is released first (the store's commit then says so)."""
        if not _waits_for_binding(reservation):
            return
        fresh = self.store.get(reservation.id)
        self._settle(fresh)
        binding = self.binding(fresh)
        if binding.binding and not binding.timed_out(self._clock()):
            waiting = ", ".join(f"{device} {condition}" for device, condition in binding.waiting)
            raise NotBound(
                reservation.id,
                f"reservation {reservation.id} is binding: waiting for {waiting} to be "
                "reported True; commit once it is bound",
            )

    def _settle(self, reservation: Reservation) -> str:
        """Release `reservation` if its binding failed or timed out; returns why ("": not)."""
        if reservation.state is ReservationState.COMMITTED:
            return ""  # bound when committed: later conditions change nothing
        binding = self.binding(reservation)
        if binding.failed is None and not binding.timed_out(self._clock()):
            return ""
        why = binding_revocation(binding)
        pools = [  # the placement's network-attached pools' reservations go with it
            r
            for r in self.holdings.reservations()
            if is_pool_hold(r)
            and r.owner == reservation.owner
            and r.allocations == reservation.allocations
        ]
        gone = []
        for each in (reservation, *pools):
            try:
                self.store.revoke(each.id, each.fencing_token, why)
                gone.append(each.id)
            except NotFound:  # gone meanwhile (another replica settled it, say)
                continue
            except FailedPrecondition:  # committed (so bound) or granted anew meanwhile: stays
                if each is reservation:
                    return ""
        self.holdings.removed([reservation.id, *gone])
        if self.quotas is not None:
            self.quotas.released([reservation.id, *gone], reservation.owner)
        if self._metrics is not None and reservation.id in gone:  # counted once, by the revoker
            reason = "failed" if binding.failed is not None else "timed_out"
            self._metrics.binding_failures.add(1, {"reason": reason})
        return why

    def reservation_usage(self, reservation: Reservation) -> dict[str, int]:
        """What a held reservation counts against its tenant's quota (on the current view)."""
        current = self.view.current()
        if self.quotas is None or current is None:
            return {}
        return self.quotas.usage(
            current.snapshot, reservation.node, reservation.allocations, reservation.owner
        )

    def quota_status(self, tenants: Sequence[str] = ()) -> tuple[list[TenantStatus], bool]:
        """Each tenant's standing (those given, else every tenant with quotas), with its
        pending preemptions (revoked, the holder not told yet: the store's count), and whether
        quotas are enforced."""
        if self.quotas is None or not self.quotas.model.enabled:
            return [], False
        rows = self.quotas.status(tenants)
        pending = self.store.pending_preemptions(sorted({row.tenant for row in rows}))
        return [
            replace(
                row,
                pending_preemptions=pending[row.tenant].count,
                pending_preemption_ids=pending[row.tenant].ids,
            )
            if row.tenant in pending
            else row
            for row in rows
        ], True

    @property
    def fair_sharing(self) -> bool:
        """Whether preemption goes by fair sharing (the policy's spec.quota.fairSharing)."""
        return self.quotas is not None and self.quotas.model.fair_sharing.enabled

    def cohort_status(self, tenants: Sequence[str] = ()) -> list[CohortStatus]:
        """The cohorts on the given tenants' paths, with their standing (every cohort when no
        tenant is given); [] when quotas are not enforced."""
        if self.quotas is None or not self.quotas.model.enabled:
            return []
        return self.quotas.cohort_status(tenants)

    def _known(self, reservation_id: str) -> Reservation | None:
        """The reservation as this allocator last saw it, else as the store has it; None when
        gone (the store's own step then says how: released, expired, preempted)."""
        found = self.holdings.get(reservation_id)
        if found is not None:
            return found
        try:
            return self.store.get(reservation_id)
        except NotFound:
            return None

    def get(self, reservation_id: str, *, deadline: Deadline = UNBOUNDED) -> Reservation:
        deadline.check("get")
        return self.store.get(reservation_id)

    def list_reservations(
        self,
        owner: str = "",
        node: str = "",
        state: ReservationState | None = None,
        page_size: int = 0,
        page_token: str = "",
        *,
        deadline: Deadline = UNBOUNDED,
    ) -> tuple[list[Reservation], str]:
        """One page of live reservations sorted by id, and the next page's token ("" at end)."""
        if page_size < 0:
            raise InvalidArgument.at("page_size", f"must not be negative, got {page_size}")
        size = min(page_size or _DEFAULT_PAGE, _MAX_PAGE)
        query = query_hash(owner, node, state)
        after = decode_token(page_token, query)
        deadline.check("list")
        found = sorted(
            (
                r
                for r in self.store.list(owner=owner, node=node)
                if (state is None or r.state is state) and r.id > after
            ),
            key=lambda r: r.id,
        )
        page = found[:size]
        more = len(found) > size
        return page, encode_token(page[-1].id, query) if more else ""

    # --- internals ---------------------------------------------------------------------------

    def _drifted(
        self,
        conflict: Conflict,
        requests: Sequence[ReserveRequest],
        view: ViewSnapshot,
        found: bool,
    ) -> bool:
        """After the nodes' refreshes: whether the state solved against disagrees with the
        store. A device the store holds must now be in use in the state (whether the refresh,
        an event or another caller's refresh brought its holder); without device conflicts
        (counters, capacity), whether the refreshes found nothing that explains the conflict."""
        ids = {
            device_conflict_key(device_key(result.device_id)): result.device_id
            for request in requests
            for allocation in request.allocations
            for result in allocation.results
        }
        taken = [ids[key] for key in conflict.conflicts if key in ids]
        if not taken:
            return not found
        state = self.holdings.state_for(view)
        return not all(state.in_use(device) for device in taken)

    def _read(self, query: Query, deadline: Deadline) -> tuple[ViewSnapshot, AllocatedState]:
        self.holdings.require_synced()
        wait = 0.0
        if query.min_generation > 0:
            left = deadline.answering().left()
            wait = min(self.limits.max_generation_wait, left if left is not None else 1e9)
        view = self.view.require(query.min_generation, wait)
        return view, self.holdings.state_for(view)

    def _answer(
        self,
        view: ViewSnapshot,
        state: AllocatedState,
        query: Query,
        deadline: Deadline,
        *,
        explain: bool,
    ) -> Answer:
        """The solver's answer to `query` (a gang's with `solve_gang`) on this view and state."""
        return self._answers(view, state, query, deadline, explain=explain)[0]

    def _answers(
        self,
        view: ViewSnapshot,
        state: AllocatedState,
        query: Query,
        deadline: Deadline,
        *,
        explain: bool,
        count: int = 1,
    ) -> list[Answer]:
        """The answers to `count` identical queries, each on `state` with the placements of
        the ones before it held (one shared search: PlacementSearch.place_many); the list ends
        with the first that is not ALLOCATED."""
        classes = with_inline(self.classes, query.device_classes)
        policy = query.policy or self.solver.policy
        started = time.perf_counter()
        with self._span("solve") as span:
            span.set_attribute("gpualloc.inventory.generation", view.generation)
            span.set_attribute("gpualloc.placement.nodes", query.node_count)
            searching = deadline.answering()
            results: list[SolveResult | None]
            if count > 1:
                span.set_attribute("gpualloc.batch.items", count)
            kept: list[AllocatedState] = []
            try:
                results = list(
                    self.solver.place_many(
                        view.snapshot,
                        state,
                        classes,
                        query,
                        count,
                        searching,
                        explain=explain,
                        keep=kept.append,
                    )
                )
            except DeadlineExceeded:
                results = [None]
            else:
                if kept:  # the placements held in one state: the next state may start there
                    placed = [
                        allocation
                        for result in results
                        if isinstance(result, Allocated)
                        for placement in result.placements
                        for allocation in placement.allocations
                    ]
                    self.holdings.offer(state, kept[0], placed)
            elapsed = (time.perf_counter() - started) / len(results)
            span.set_attribute("gpualloc.outcome", type(results[-1]).__name__)
        return [self._answered(view, query, policy, result, elapsed, explain) for result in results]

    def _answered(
        self,
        view: ViewSnapshot,
        query: Query,
        policy: Policy,
        result: SolveResult | None,
        elapsed: float,
        explain: bool,
    ) -> Answer:
        """A solve's result (None: the deadline cut it short) as an Answer (made at once, not
        through `replace`: a batch makes one per item)."""
        if self._metrics is not None:
            self._metrics.solve_duration.record(elapsed)
        if isinstance(result, Allocated):
            return Answer(
                Outcome.ALLOCATED,
                generation=view.generation,
                claims=query.claims,
                placements=result.placements,
                policy=policy,
                explanation=result.explanation,
                stats=result.stats,
                cel_cache_hits=result.stats.cel_profile_hits,
                elapsed_seconds=elapsed,
            )
        if result is None:
            return Answer(
                Outcome.BUDGET_EXHAUSTED,
                generation=view.generation,
                claims=query.claims,
                policy=policy,
                elapsed_seconds=elapsed,
                explanation=Explanation(
                    summary=Summary(SummaryKind.DEADLINE), budget_exhausted=True
                ),
            )
        outcome = Outcome.BUDGET_EXHAUSTED if result.budget_exhausted else Outcome.UNSATISFIABLE
        answer = Answer(
            outcome,
            generation=view.generation,
            claims=query.claims,
            policy=policy,
            explanation=result.explanation,
            stats=result.stats,
            cel_cache_hits=result.stats.cel_profile_hits,
            elapsed_seconds=elapsed,
        )
        holders = blocking_holders(answer, self.holdings.reservations(), 3)
        return _with_holders(answer, holders)

    def _store_reserve(
        self,
        requests: Sequence[ReserveRequest],
        view: ViewSnapshot,
        deadline: Deadline,
        *,
        checked: bool = True,
        limit: int | None = None,
        assigned: Mapping[str, str] | None = None,
    ) -> list[Reservation]:
        """One placement through a grant run of one (app/granting.py): within the tenant's
        bound on live reservations (`limit`), its quota (step one), then the devices (step
        two). `checked` False: counted without a check (a consolidation's replacement).
        `assigned`: the flavors its devices are charged to (Decision.assigned)."""
        deadline.check("reserve")
        run = self._grant_run()
        run.add(view.snapshot, requests, limit=limit, checked=checked, assigned=assigned)
        with self._span("reserve") as span:
            span.set_attribute("gpualloc.node", requests[0].node)
            [outcome] = run.write(deadline)
        return reserved(outcome)

    def _grant_run(self) -> GrantRun:
        return GrantRun(self.store, self.holdings, self.quotas, self._reservation_limit)

    def _decide(
        self,
        view: ViewSnapshot,
        state: AllocatedState,
        query: Query,
        answer: Answer,
        lease: LeaseOptions,
        revoked: tuple[Victim, ...],
        deadline: Deadline,
        *,
        checked: bool = True,
    ) -> Decision:
        """What to reserve for `lease.owner` (or why not) and the preemption that would make
        it fit. A grant its tenant's quota charges to flavors: Kueue's flavor assignment
        (app/flavor_search.py). Else the solver's `answer`, checked against the quota here
        unless the reserve's take will (`checked`), and the planner's proposal when it does
        not fit."""
        if self.quotas is None:
            return Decision(answer, query)
        trials = self._trials(view, state, query, lease.owner, deadline)
        model = self.quotas.model
        flavored = model.quota_of(tenant_of_owner(lease.owner)) is not None and any(
            r.base for r in model.resources
        )
        choice = (
            search_flavors(
                trials,
                query,
                lease,
                self._standing(lease.owner),
                with_inline(self.classes, query.device_classes),
                first=answer,
                now=_queued(lease),
                max_consolidation_nodes=self.limits.max_consolidation_nodes,
            )
            if flavored
            else None
        )
        if choice is None:
            if not checked and answer.outcome is Outcome.ALLOCATED:
                refusals = self.quotas.check(lease.owner, trials.counts(answer))
                if refusals:
                    answer = replace(answer, outcome=Outcome.QUOTA_EXCEEDED, quota=refusals)
            proposal = self._proposal(view, state, query, answer, lease, revoked, deadline)
            return Decision(answer, query, proposal)
        flavors = tuple(attempt.bare() for attempt in choice.tried)
        found = choice.chosen.found if choice.chosen is not None else None
        if found is None:  # every flavor NoFit: the solver's own answer, refused
            refused = _refused(answer, self.quotas.check(lease.owner, trials.counts(answer)))
            return Decision(replace(refused, flavors=flavors), query)
        proposal = None if revoked else found.proposal
        return Decision(
            replace(found.answer, flavors=flavors), found.query, proposal, found.assigned
        )

    # --- preemption --------------------------------------------------------------------------

    def _proposal(
        self,
        view: ViewSnapshot,
        state: AllocatedState,
        query: Query,
        answer: Answer,
        lease: LeaseOptions,
        revoked: tuple[Victim, ...],
        deadline: Deadline,
        *,
        assigned: Mapping[str, str] | None = None,
    ) -> Proposal | None:
        """The fewest reservations whose revocation makes `query` fit for `lease.owner`
        (app/preemption_plans.py), or None. Only for an answer that is UNSATISFIABLE or
        QUOTA_EXCEEDED, under quotas, and once per call. `assigned`: the flavors `query` is
        pinned to (what its placement is charged to)."""
        if self.quotas is None or revoked:
            return None
        if answer.outcome not in (Outcome.UNSATISFIABLE, Outcome.QUOTA_EXCEEDED):
            return None
        trials = self._trials(view, state, query, lease.owner, deadline)
        return propose(
            replace(trials, counts=trials.counts_on(assigned or {})),
            query,
            lease,
            self._standing(lease.owner),
            now=_queued(lease),
            max_consolidation_nodes=self.limits.max_consolidation_nodes,
        )

    def _trials(
        self,
        view: ViewSnapshot,
        state: AllocatedState,
        query: Query,
        owner: str,
        deadline: Deadline,
    ) -> Trials:
        """This call's means of trying placements (solves on trial states, what they count)."""

        def solve(on: Query, trial: AllocatedState) -> Answer:
            return self._answer(view, trial, on, deadline, explain=False)

        def counts(found: Answer) -> dict[str, int]:
            return self._placement_usage(view, query, found, owner)

        def charged(found: Answer, assigned: Mapping[str, str]) -> dict[str, int]:
            return self._placement_usage(view, query, found, owner, assigned)

        return Trials(view, state, solve, counts, deadline, charged)

    def _standing(self, owner: str) -> Standing:
        """The quota around `owner`, read when first needed."""
        quotas = self.quotas
        assert quotas is not None
        return Standing(
            quotas.model,
            owner,
            lambda: quotas.entries_around(owner),
            self.holdings.reservations,
            self.reservation_usage,
        )

    def _revoke(self, proposal: Proposal, by: str, deadline: Deadline) -> tuple[Victim, ...]:
        """Revoke the victims (each only if its fencing token is the one chosen: a stale one
        fails the call with FAILED_PRECONDITION, nothing more is revoked); free their quota.
        A consolidation first reserves every replacement (`_replace`); if one of their devices
        was taken meanwhile, nothing is revoked and Conflict is raised (the caller tries
        again). A moved reservation found gone meanwhile (released) loses its replacement."""
        deadline.check("preempt")
        replacements = self._replace(proposal.moves, deadline)
        done: list[Reservation] = []
        try:
            for reservation in proposal.reservations:
                new = replacements.get(reservation.id)
                told = by if new is None else f"{by}; moved to reservation {new.id} on {new.node}"
                try:
                    self.store.revoke(reservation.id, reservation.fencing_token, told)
                except NotFound:  # gone meanwhile: freed anyway, and nobody to move
                    if new is not None:
                        self._drop_replacements([replacements.pop(reservation.id)])
                done.append(reservation)
        except BaseException:
            kept = {r.id for r in done}
            self._drop_replacements([n for i, n in replacements.items() if i not in kept])
            raise
        finally:
            self.holdings.removed([r.id for r in done])
            reasons = {v.holder.reservation_id: v.reason for v in proposal.victims}
            for reservation in done:
                if self._metrics is not None:
                    labels = {
                        "tenant": tenant_of_owner(reservation.owner),
                        "reason": reasons.get(reservation.id, ""),
                    }
                    self._metrics.preemptions.add(1, labels)
            if self.quotas is not None:
                for reservation in done:
                    self.quotas.released([reservation.id], reservation.owner)
        return tuple(
            replace(v, replacement_id=replacements[v.holder.reservation_id].id)
            if v.holder.reservation_id in replacements
            else v
            for v in proposal.victims
        )

    def _replace(self, moves: Sequence[Relocation], deadline: Deadline) -> dict[str, Reservation]:
        """Reserve each move's replacement for the moved reservation's owner, before the
        original is revoked: the same claims, idempotency key, labels (plus
        `gpualloc.dev/moved-from`) and priority class, leased (the lease the original had
        left, or the default lease for a committed one): the holder adopts it with Commit or
        Renew, else it lapses, so no GPU stays held for a holder that requeued instead. Quota:
        an entry added without a check (the holder's usage is counted twice until the
        original is revoked: over-counting, never under-counting). Old id -> replacement;
        Conflict (the ones made released) when a device was taken, or when the store answers
        with a reservation it already had (the owner's idempotency key on that node)."""
        made: dict[str, Reservation] = {}
        known = {r.id for r in self.holdings.reservations()}
        view = self.view.require(0)
        for move in moves:
            deadline.check("consolidate")
            old = move.reservation
            left = (old.expires_at or 0.0) - time.time()
            committed = old.state is ReservationState.COMMITTED or old.expires_at is None
            hold = placement_holds(view.snapshot, move.node, [move.allocation])[move.node]
            request = ReserveRequest(
                owner=old.owner,
                node=move.node,
                claim_names=old.claim_names,
                allocations=(move.allocation,),
                hold=hold,
                lease_seconds=self.limits.lease_seconds if committed else max(1.0, left),
                idempotency_key=old.idempotency_key,
                labels=(*old.labels, (MOVED_FROM_LABEL, old.id)),
                request_digest=old.request_digest,
                priority_class=old.priority_class,
            )
            try:
                new = self._store_reserve(
                    [request], view, deadline, checked=False, assigned=self._assigned_of(old)
                )[0]
            except BaseException:
                self._drop_replacements(list(made.values()))
                raise
            if new.id in known or any(new.id == r.id for r in made.values()):
                self._drop_replacements(list(made.values()))  # not `new`: it is not ours
                # No ids: the caller is the preemptor, and both reservations are another owner's.
                raise Conflict(
                    f"a reservation of tenant {tenant_of_owner(old.owner)} cannot move to "
                    f"{move.node}: one with its idempotency key is there"
                )
            made[old.id] = new
        return made

    def _assigned_of(self, reservation: Reservation) -> dict[str, str] | None:
        """The flavors `reservation`'s grant was charged to, as its ledger entry holds them
        (a moved reservation's replacement is charged alike); None when no entry covers it."""
        if self.quotas is None:
            return None
        recorded = self.quotas.recorded(reservation)
        return assigned_by(self.quotas.model, recorded) if recorded is not None else None

    def _drop_replacements(self, reservations: Sequence[Reservation]) -> None:
        for reservation in reservations:
            with contextlib.suppress(NotFound, Preempted):
                self.store.release(reservation.id, reservation.owner, reservation.fencing_token)
            if self.quotas is not None:
                self.quotas.released([reservation.id], reservation.owner)
        self.holdings.removed([r.id for r in reservations])

    def _placement_usage(
        self,
        view: ViewSnapshot,
        query: Query,
        answer: Answer,
        owner: str,
        assigned: Mapping[str, str] | None = None,
    ) -> dict[str, int]:
        """What reserving `answer` would count against `owner`'s tenant's quota (on the
        flavors `assigned`, where its devices are theirs)."""
        assert self.quotas is not None
        lease = LeaseOptions(owner)
        names = tuple(claim_ref(claim.namespace, claim.name) for claim in query.claims)
        requests = placement_requests(view.snapshot, answer.placements, names, lease, 1.0)
        total: dict[str, int] = {}
        for request in requests:
            usage = self.quotas.usage(
                view.snapshot, request.node, request.allocations, owner, assigned
            )
            for name, amount in usage.items():
                total[name] = total.get(name, 0) + amount
        return total

    def _reserved_answer(
        self, query: Query, reservations: Sequence[Reservation], generation: int
    ) -> Answer:
        """The answer of a reserving Allocate: the placement as the store holds it (which, for
        an idempotent retry, is the first call's), its nodes sorted by name."""
        return Answer(
            Outcome.ALLOCATED,
            generation=generation,
            claims=query.claims,
            placements=members_of_reservations(reservations),
            policy=query.policy or self.solver.policy,
            reservations=tuple(reservations),
        )

    def _check_priority_class(self, name: str) -> None:
        if not name:
            return
        known = self.quotas.model.priority_classes if self.quotas is not None else {}
        if name not in known:
            listed = (
                ", ".join(sorted(known)) or "none: the access policy defines no priority classes"
            )
            raise InvalidArgument.at(
                "priority_class_name", f"unknown priority class {name!r} (known: {listed})"
            )

    def _lease_seconds(self, requested: float | None, path: str) -> float:
        if requested is None:
            return self.limits.lease_seconds
        if requested <= 0:
            raise InvalidArgument.at(path, f"must be positive, got {requested:g}s")
        if requested > self.limits.max_lease_seconds:
            raise InvalidArgument.at(
                path, f"must be at most {self.limits.max_lease_seconds:g}s, got {requested:g}s"
            )
        return requested

    @staticmethod
    def _count(counter: Counter | None) -> None:
        if counter is not None:
            counter.add(1)


@dataclass(slots=True)
class _Placed:
    """A batch item solved and added to its run, waiting for the run's write (one per item:
    not frozen, whose __init__ sets each field through object.__setattr__)."""

    query: Query
    lease: LeaseOptions
    answer: Answer
    requests: Sequence[ReserveRequest]
    view: ViewSnapshot
    deadline: Deadline  # the item's own (allocate_run's `deadlines`)


@dataclass
class _Run:
    """A batch's run of reserving items: the grants, the items placed, the keys held."""

    grants: GrantRun
    placed: list[tuple[int, _Placed]] = field(default_factory=list)  # (result index, item)
    keys: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)


def _alike(one: Query, other: Query) -> bool:
    """Whether two items ask the same: at once when they are one object (AllocateBatch maps
    byte-identical items once), else by value (a dataclass's == builds a tuple of every field
    of both, even for one object)."""
    return one is other or one == other


class _KeyedLocks:
    """One lock per key while anyone holds or waits for it (then forgotten)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[object, tuple[threading.Lock, int]] = {}

    @contextmanager
    def held(self, key: object, *, blocking: bool = True) -> Iterator[bool]:
        """Hold `key`'s lock for the block; not `blocking`: yields whether it was free (the
        block then runs without it when it was not)."""
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        acquired = lock.acquire(blocking)
        try:
            yield acquired
        finally:
            if acquired:
                lock.release()
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)


def _requests(
    holds: Mapping[str, Hold],
    claim_names: tuple[str, ...],
    allocations: tuple[AllocationResult, ...],
    lease: LeaseOptions,
    lease_seconds: float,
) -> list[ReserveRequest]:
    """One store request per scope of the placement (the node's first)."""
    return [
        reserve_request(lease, lease_seconds, scope, claim_names, allocations, hold)
        for scope, hold in holds.items()
    ]


_BACKOFF_SECONDS = 0.002


def _earlier(one: Deadline, other: Deadline) -> Deadline:
    """The deadline that comes first (`one` when they are the same or both unbounded)."""
    if other.at is None or (one.at is not None and one.at <= other.at):
        return one
    return other


def _back_off(attempt: int, deadline: Deadline) -> None:
    """Sleep a random share of 2 ms x 2^attempt before solving again after a conflict.

    Callers that lost the same race would otherwise solve again at once, see the same refreshed
    state, pick the same next devices and collide again; the jitter spreads them so each retry
    sees the reservations of those that went first. Bounded by the call's remaining time.
    """
    pause = random.uniform(0, _BACKOFF_SECONDS * 2**attempt)
    left = deadline.left()
    time.sleep(pause if left is None else min(pause, left / 4))


def _bounded(conflict: Conflict) -> Conflict:
    """The conflict as a client sees it: at most _MAX_CONFLICTS keys (a MIG placement can
    collide on dozens of counters; every key becomes a status detail, and gRPC clients refuse
    trailers over 8 KiB by default)."""
    keys = conflict.conflicts
    if len(keys) <= _MAX_CONFLICTS:
        return conflict
    shown = ", ".join(keys[:_MAX_CONFLICTS])
    return Conflict(
        f"reservation conflict on {len(keys)} devices and counters: {shown}, "
        f"and {len(keys) - _MAX_CONFLICTS} more",
        keys[:_MAX_CONFLICTS],
        conflict.holders,
    )


def _queued(lease: LeaseOptions) -> float:
    """When the grant's work was queued: as its request says, else now (a request arriving
    now is newer than every reservation held)."""
    return time.time() if lease.queued_at is None else lease.queued_at


def _refused(answer: Answer, refusals: Sequence[QuotaRefusal]) -> Answer:
    """The solver's answer when no flavor is taken: never ALLOCATED (QUOTA_EXCEEDED with the
    quota's refusals, else UNSATISFIABLE: the flavors' attempts say why)."""
    if answer.outcome is not Outcome.ALLOCATED:
        return answer
    if refusals:
        return replace(answer, outcome=Outcome.QUOTA_EXCEEDED, quota=tuple(refusals))
    return replace(answer, outcome=Outcome.UNSATISFIABLE)


def _with_holders(answer: Answer, holders: tuple[Holder, ...]) -> Answer:
    return replace(answer, holders=holders) if holders != answer.holders else answer


def _with_reservations(
    answer: Answer, reservations: tuple[Reservation, ...], preemption: tuple[Victim, ...]
) -> Answer:
    """`replace(answer, reservations=..., preemption=...)` at a fraction of its cost (a batch
    makes one per reserving item): Answer is frozen, so its __init__ sets each of its fields
    through object.__setattr__, and it has no __post_init__ to run; a new object with the
    same attributes, two of them changed, is what `replace` would make."""
    held: Answer = object.__new__(Answer)
    held.__dict__.update(answer.__dict__, reservations=reservations, preemption=preemption)
    return held


def _same_placement(reservations: Sequence[Reservation], members: Sequence[NodePlacement]) -> bool:
    """Whether a gang's reservations hold exactly the members' allocations."""
    if len(reservations) == 1 and len(members) == 1:  # one node's (members_of_reservations')
        reservation, member = reservations[0], members[0]
        if "/" not in reservation.node:
            return reservation.node == member.node and reservation.allocations == member.allocations
    held = {m.node: m.allocations for m in members_of_reservations(reservations)}
    return held == {m.node: m.allocations for m in members}


def _check_same_request(known: Sequence[Reservation], lease: LeaseOptions) -> None:
    """A reused idempotency key must come with the request it was first used for: a retry, not
    a new request that would silently get the first one's devices (FAILED_PRECONDITION)."""
    first = known[0]
    if (
        first.request_digest
        and lease.request_digest
        and first.request_digest != lease.request_digest
    ):
        raise FailedPrecondition(
            f"idempotency key {lease.idempotency_key!r} was first used for another request "
            f"(reservation {first.id}): retry with the same request, or use a new key"
        )


def _check_replay(query: Query, known: Sequence[Reservation], lease: LeaseOptions) -> None:
    """A repeated key must repeat its request, and still hold every node of its placement:
    a gang whose members were partly released or expired is not returned as ALLOCATED."""
    _check_same_request(known, lease)
    key = lease.idempotency_key
    members = members_of_reservations(known)
    if len(members) != query.node_count:
        raise FailedPrecondition(
            f"idempotency key {key!r} holds {len(members)} node reservation(s), not a "
            f"placement on {query.node_count}: release them or allocate with a new key"
        )


def _waits_for_binding(reservation: Reservation) -> bool:
    """Whether the reservation may be binding: a node's, leased, with a device that has
    binding conditions."""
    if reservation.state is not ReservationState.RESERVED or is_pool_hold(reservation):
        return False
    return any(r.binding_conditions for a in reservation.allocations for r in a.results)


def _check_fence(reservation: Reservation, owner: str, fencing_token: int) -> None:
    if reservation.owner != owner:
        raise PermissionDenied(f"reservation {reservation.id} belongs to another owner")
    if fencing_token != reservation.fencing_token:
        raise FailedPrecondition(
            f"reservation {reservation.id}: fencing token {fencing_token} is stale "
            f"(current {reservation.fencing_token})"
        )
