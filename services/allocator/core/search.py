"""Depth-first search with backtracking on one node: upstream's `allocateOne`, made iterative.

The search walks claims in order, their requests in order, and each request's devices one
slot at a time. Two kinds of choice points sit on an explicit stack (no recursion, so large
claims cannot overflow Python's stack):

- a request frame picks the request's alternative: the request itself, or its firstAvailable
  subrequests in order. Subrequest 0 is tried with the whole rest of the search before
  subrequest 1 (upstream). An alternative that would take the claim past 32 devices, given the
  fewest devices the claim's remaining requests need, is skipped (upstream's
  "max size exceeded" signal, decided up front).
- a device frame picks the candidate for one slot. Every successful pick is undone by exactly
  one `_unpick` when the frame is retried or abandoned.

Symmetry breaking keeps common cases from going exponential without changing which solutions
exist: the slots of one request take candidates in list order (later slot, later or equal
candidate), and at one slot a candidate is skipped when an interchangeable one (same
`Equivalence` class, dedicated, non-admin request) has already failed there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from services.allocator.core.candidates import (
    Candidate,
    InvalidPoolMarker,
    NodeCandidates,
    NodeError,
    SolveContext,
    untolerated,
    untolerated_taint,
)
from services.allocator.core.constraints import ConstraintState
from services.allocator.core.explain import (
    ConstraintMiss,
    ConstraintRef,
    Fact,
    NodeMiss,
    Picked,
    ReasonCode,
    Shortage,
    ShortageKind,
    TopologyMiss,
    tally_reasons,
)
from services.allocator.core.leftover import leftover_score
from services.allocator.core.plan import MAX_DEVICES_PER_CLAIM, Alternative
from services.allocator.core.scoring import Score
from services.allocator.core.snapshot import Amount, CounterID, DeviceEntry
from services.allocator.core.topology_constraints import Scoped, TopologyState
from services.common.dra.model import AllocationMode, DeviceID
from services.common.dra.quantity import Quantity, QuantityFormat
from services.common.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument

__all__ = ["BudgetExhausted", "NodeSearch", "Pick", "StepCounter"]

_ZERO = Fraction(0)
_CANCEL_CHECK_EVERY = 1024
_PICKED = Picked()
_PICKED_SAME_CLAIM = Picked(same_claim=True)


class BudgetExhausted(Exception):
    """The step budget ran out before the search finished."""


@dataclass
class StepCounter:
    """Steps shared by every node of one solve, with the budget that bounds them."""

    max_steps: int
    max_steps_per_node: int
    cancelled: Callable[[], bool] | None = None
    steps: int = 0

    def tick(self, node_steps: int) -> None:
        self.steps += 1
        if self.steps > self.max_steps or node_steps > self.max_steps_per_node:
            raise BudgetExhausted
        if (
            self.cancelled is not None
            and self.steps % _CANCEL_CHECK_EVERY == 0
            and self.cancelled()
        ):
            raise DeadlineExceeded("allocation search cancelled")


@dataclass(slots=True)
class Pick:
    """One device chosen for one (sub)request, with what it takes while the search holds it."""

    alternative: Alternative
    entry: DeviceEntry
    consumed: dict[str, Quantity] | None  # capacity share of a multi-allocatable device
    newly_consuming: bool  # this pick started counting the device's counters


@dataclass
class _RequestFrame:
    claim: int
    request: int
    next_alternative: int = 0
    chosen: Alternative | None = None


@dataclass
class _DeviceFrame:
    alternative: Alternative
    slot: int
    cursor: int
    index: int = -1  # position of the current pick in the candidate list
    pick: Pick | None = None
    failed: set[int] = field(default_factory=set)  # equivalence classes that did not work here
    tally: dict[ReasonCode, int] = field(default_factory=dict)


_Frame = _RequestFrame | _DeviceFrame


class NodeSearch:
    """The search state of one node; `run()` returns True when every claim is satisfied."""

    def __init__(
        self,
        ctx: SolveContext,
        candidates: NodeCandidates,
        steps: StepCounter,
        topology: Sequence[Scoped] | None = None,
    ) -> None:
        """`topology`: the topology constraints to enforce (default: the required ones)."""
        self.ctx = ctx
        self.cands = candidates
        self.view = candidates.view
        self.counter = steps
        self.node_steps = 0
        claims = ctx.plan.claims
        self.picks: list[list[Pick]] = [[] for _ in claims]
        self.chosen: list[dict[int, Alternative]] = [{} for _ in claims]
        self.constraints = [[ConstraintState(spec) for spec in c.constraints] for c in claims]
        plan = ctx.topology
        active = topology if topology is not None else (plan.required if plan else [])
        node_topology = ctx.node_topology(self.view)
        self.topology_states = [(s, TopologyState(s.constraint, node_topology)) for s in active]
        self._topology_of: dict[int, list[tuple[Scoped, TopologyState]]] = {}
        self.picked: dict[DeviceID, list[int]] = {}  # dedicated picks: device -> claim indices
        self.sharing: dict[DeviceID, dict[str, Fraction]] = {}  # capacity taken by shared picks
        self.consuming: set[DeviceID] = set()  # devices whose counters this search added
        self.counter_use: dict[CounterID, Amount] = {}
        self.miss: NodeMiss | None = None
        self._rest = [self._rest_minimum(c) for c in range(len(claims))]
        self._totals: dict[CounterID, Amount] | None = None

    @property
    def totals(self) -> dict[CounterID, Amount]:
        """Every counter of the node's slices, with its total (built when first asked: only a
        fit's score reads it, and most searches of an explanation do not fit there)."""
        if self._totals is None:
            self._totals = {
                counter: total
                for node_pool in self.view.pools
                for slice_ in node_pool.pool.slices
                for counter, total in slice_.totals.items()
            }
        return self._totals

    # --- the loop -------------------------------------------------------------------

    def run(self) -> bool:
        stack: list[_Frame] = []
        frame: _Frame | None = self._request_frame(0, 0)
        while frame is not None:
            self.node_steps += 1
            self.counter.tick(self.node_steps)
            if self._advance(frame):
                stack.append(frame)
                frame = self._next(frame)
                continue
            self._note_miss(frame)
            if not stack:
                return False
            frame = stack.pop()
            self._retract(frame)
        return True

    def _request_frame(self, claim: int, request: int) -> _RequestFrame | None:
        claims = self.ctx.plan.claims
        while claim < len(claims):
            if request < len(claims[claim].requests):
                return _RequestFrame(claim, request)
            claim, request = claim + 1, 0
        return None

    def _next(self, frame: _Frame) -> _Frame | None:
        if isinstance(frame, _RequestFrame):
            alternative = frame.chosen
            assert alternative is not None
            if self.cands.count(alternative) > 0:
                return _DeviceFrame(alternative, 0, 0)
            return self._request_frame(frame.claim, frame.request + 1)
        alternative = frame.alternative
        if frame.slot + 1 < self.cands.count(alternative):
            assert frame.pick is not None
            start = frame.index + (0 if frame.pick.entry.multi else 1)
            return _DeviceFrame(alternative, frame.slot + 1, start)
        return self._request_frame(alternative.claim_index, alternative.request_index + 1)

    def _advance(self, frame: _Frame) -> bool:
        if isinstance(frame, _RequestFrame):
            return self._choose_alternative(frame)
        if frame.alternative.mode is AllocationMode.ALL:
            return self._pick_all(frame)
        return self._pick_next(frame)

    def _retract(self, frame: _Frame) -> None:
        if isinstance(frame, _RequestFrame):
            assert frame.chosen is not None
            del self.chosen[frame.claim][frame.request]
            frame.chosen = None
            return
        pick = frame.pick
        assert pick is not None
        self._unpick(pick)
        frame.pick = None
        if _interchangeable(pick.alternative, pick.entry):
            frame.failed.add(self.ctx.equivalence.of(pick.entry))

    # --- request frames -------------------------------------------------------------

    def _choose_alternative(self, frame: _RequestFrame) -> bool:
        alternatives = self.ctx.plan.claims[frame.claim].requests[frame.request].alternatives
        held = len(self.picks[frame.claim])
        while frame.next_alternative < len(alternatives):
            alternative = alternatives[frame.next_alternative]
            frame.next_alternative += 1
            needed = self.cands.count(alternative)
            if held + needed + self._rest[frame.claim][frame.request + 1] > MAX_DEVICES_PER_CLAIM:
                self._note_skipped(alternative, ReasonCode.CLAIM_LIMIT)
                continue
            if alternative.mode is AllocationMode.ALL and needed == 0:
                self._note_skipped(alternative, ReasonCode.NO_DEVICES)
                continue
            frame.chosen = alternative
            self.chosen[frame.claim][frame.request] = alternative
            return True
        return False

    def _rest_minimum(self, claim: int) -> list[int]:
        """Fewest devices requests r.. of the claim need, for every r (one extra 0 at the end)."""
        requests = self.ctx.plan.claims[claim].requests
        rest = [0] * (len(requests) + 1)
        for r in range(len(requests) - 1, -1, -1):
            rest[r] = rest[r + 1] + min(self.cands.count(a) for a in requests[r].alternatives)
        return rest

    # --- device frames --------------------------------------------------------------

    def _pick_next(self, frame: _DeviceFrame) -> bool:
        alternative = frame.alternative
        candidates = self.cands.exact(alternative)
        while frame.cursor < len(candidates):
            candidate = candidates[frame.cursor]
            frame.cursor += 1
            if isinstance(candidate, InvalidPoolMarker):
                pool = candidate.pool
                raise NodeError(
                    FailedPrecondition(f"pool {pool.name} is invalid: {pool.invalid_reason}")
                )
            entry = candidate.entry
            if (
                frame.failed
                and _interchangeable(alternative, entry)
                and self.ctx.equivalence.of(entry) in frame.failed
            ):
                frame.tally[ReasonCode.EQUIVALENT] = frame.tally.get(ReasonCode.EQUIVALENT, 0) + 1
                continue
            pick = self._try(frame, candidate, must=False)
            if pick is not None:
                frame.pick, frame.index = pick, frame.cursor - 1
                return True
        return False

    def _pick_all(self, frame: _DeviceFrame) -> bool:
        if frame.cursor > 0:
            return False  # the order of "all" devices does not matter: no alternatives
        frame.cursor = 1
        candidate = self.cands.all_list(frame.alternative)[frame.slot]
        frame.pick = self._try(frame, candidate, must=True)
        return frame.pick is not None

    def _try(self, frame: _DeviceFrame, candidate: Candidate, *, must: bool) -> Pick | None:
        """Upstream `allocateDevice`: pick the candidate if it passes the dynamic checks."""
        entry = candidate.entry
        newly_consuming = bool(entry.counters) and not self.consuming_device(entry)
        problem = self._problem(frame.alternative, candidate, newly_consuming, must)
        if problem is not None:
            code, detail = problem
            frame.tally[code] = frame.tally.get(code, 0) + 1
            if self.ctx.recorder is not None:
                if code is ReasonCode.IN_USE or detail is None:
                    held = self.ctx.recorder.holders_of(self.ctx.state.owners, entry.id)
                    self.ctx.recorder.reject(frame.alternative, entry.id, code, None, held)
                else:
                    shown = detail.data() if isinstance(detail, _Shortage) else detail
                    self.ctx.recorder.reject(frame.alternative, entry.id, code, shown)
            return None
        pick = Pick(frame.alternative, entry, candidate.consumed, newly_consuming)
        self._apply(pick)
        return pick

    def _problem(
        self,
        alternative: Alternative,
        candidate: Candidate,
        newly_consuming: bool,
        must: bool,
        record: bool = True,
    ) -> tuple[ReasonCode, Fact | _Shortage | None] | None:
        """In use, counters, capacity shares, taints (`All` only), then constraints."""
        entry = candidate.entry
        busy = self._in_use(alternative, entry)
        if busy is not None:
            return busy
        if newly_consuming:
            shortage = self._counter_problem(entry)
            if shortage is not None:
                return ReasonCode.COUNTERS, shortage
        if candidate.consumed is not None:
            short = self._share_problem(entry, candidate.consumed)
            if short is not None:
                return ReasonCode.CAPACITY, short
        if alternative.mode is AllocationMode.ALL:  # `All` lists skip the taint check
            taint = untolerated_taint(entry, alternative.tolerations)
            if taint is not None:
                return ReasonCode.TAINTED, untolerated(taint)
        problem = self._constraint_problem(alternative, entry, must, record)
        if problem is not None:
            return ReasonCode.CONSTRAINT, problem
        topology = self._topology_problem(alternative, entry)
        if topology is not None:
            return ReasonCode.CONSTRAINT, topology
        return None

    def _covering(self, alternative: Alternative) -> list[tuple[Scoped, TopologyState]]:
        found = self._topology_of.get(alternative.key)
        if found is None:
            where = (alternative.claim_index, alternative.request_index)
            found = [(s, state) for s, state in self.topology_states if where in s.requests]
            self._topology_of[alternative.key] = found
        return found

    def _topology_problem(
        self, alternative: Alternative, entry: DeviceEntry
    ) -> TopologyMiss | None:
        for scoped, state in self._covering(alternative):
            problem = state.problem(entry.id)
            if problem is not None:
                return scoped.constraint.miss(scoped.index, problem)
        return None

    def _in_use(
        self, alternative: Alternative, entry: DeviceEntry
    ) -> tuple[ReasonCode, Picked | None] | None:
        """Upstream `deviceInUse` / `allocatingDeviceForClaim` (see docs for shared devices)."""
        state, device_id = self.ctx.state, entry.id
        if entry.multi:
            if not alternative.admin and state.is_exclusive(device_id):
                return ReasonCode.IN_USE, None  # the holders are recorded from the state
            return None
        claims = self.picked.get(device_id)
        if alternative.admin:
            if claims and alternative.claim_index in claims:
                return ReasonCode.PICKED, _PICKED_SAME_CLAIM
            return None
        if state.in_use(device_id):
            return ReasonCode.IN_USE, None
        if claims:
            return ReasonCode.PICKED, _PICKED
        return None

    def consuming_device(self, entry: DeviceEntry) -> bool:
        return entry.id in self.consuming or self.ctx.state.in_use(entry.id)

    def _counter_problem(self, entry: DeviceEntry) -> _Shortage | Shortage | None:
        """Upstream `checkAvailableCounters`: after adding the device, every counter of every
        set in its slice must stay within its total. Picks in this search were checked the
        same way, so only the device's own counters and counters the existing allocations
        already overdraw can fail."""
        state, totals, mine = self.ctx.state, entry.slice.totals, self.counter_use
        for (counter, _), amount in zip(entry.counters, entry.amounts, strict=True):
            used = state.counter_amount(counter)
            if mine:
                used += mine.get(counter, 0)
            if used + amount > totals[counter]:
                return _Shortage(counter, amount, max(0, totals[counter] - used))
        return self.cands.overdrawn(entry.slice)

    def _share_problem(self, entry: DeviceEntry, consumed: dict[str, Quantity]) -> Shortage | None:
        held = self.ctx.state.consumed_capacity(entry.id)
        taken = self.sharing.get(entry.id, {})
        for name, amount in consumed.items():
            used = held.get(name, _ZERO) + taken.get(name, _ZERO)
            limit = entry.device.capacity[name].value.value
            if used + amount.value > limit:
                free = _show(max(_ZERO, limit - used))
                return Shortage(ShortageKind.SHORT, name, needed=str(amount), free=free)
        return None

    def _constraint_problem(
        self, alternative: Alternative, entry: DeviceEntry, must: bool, record: bool
    ) -> ConstraintMiss | None:
        states = self.constraints[alternative.claim_index]
        for index in alternative.constraints:
            problem = states[index].problem(entry.device, entry.id.driver)
            if problem is None:
                continue
            claim = self.ctx.plan.claims[alternative.claim_index]
            spec = states[index].spec
            if must:
                raise NodeError(
                    InvalidArgument.at(
                        f"claims[{claim.index}].spec.devices.constraints[{index}]",
                        f"claim {claim.label}, request {alternative.name}: cannot add device "
                        f"{entry.id} because a claim constraint would not be satisfied",
                    )
                )
            reason, values = problem
            if record and self.ctx.recorder is not None:
                miss = ConstraintMiss(reason)
                self.ctx.recorder.constraint(claim.label, spec, entry.id, miss, values)
            ref = ConstraintRef(index, spec.kind, spec.attribute)
            return ConstraintMiss(reason, constraint=ref)
        return None

    # --- paired apply / undo --------------------------------------------------------

    def _apply(self, pick: Pick) -> None:
        alternative, entry = pick.alternative, pick.entry
        for index in alternative.constraints:
            self.constraints[alternative.claim_index][index].add(entry.device, entry.id.driver)
        for _, state in self._covering(alternative):
            state.add(entry.id)
        if pick.consumed is not None:
            taken = dict(self.sharing.get(entry.id, {}))
            for name, quantity in pick.consumed.items():
                taken[name] = taken.get(name, _ZERO) + quantity.value
            self.sharing[entry.id] = taken
        else:
            self.picked.setdefault(entry.id, []).append(alternative.claim_index)
        if pick.newly_consuming:
            self.consuming.add(entry.id)
            for (counter, _), amount in zip(entry.counters, entry.amounts, strict=True):
                self.counter_use[counter] = self.counter_use.get(counter, 0) + amount
        self.picks[alternative.claim_index].append(pick)

    def _unpick(self, pick: Pick) -> None:
        alternative, entry = pick.alternative, pick.entry
        removed = self.picks[alternative.claim_index].pop()
        assert removed is pick
        if pick.newly_consuming:
            self.consuming.discard(entry.id)
            for (counter, _), amount in zip(entry.counters, entry.amounts, strict=True):
                self.counter_use[counter] -= amount
        if pick.consumed is not None:
            taken = dict(self.sharing[entry.id])
            for name, quantity in pick.consumed.items():
                taken[name] -= quantity.value
            self.sharing[entry.id] = taken
        else:
            self.picked[entry.id].remove(alternative.claim_index)
        for index in alternative.constraints:
            self.constraints[alternative.claim_index][index].remove(entry.device, entry.id.driver)
        for _, state in self._covering(alternative):
            state.remove(entry.id)

    # --- after the search -----------------------------------------------------------

    def score(self) -> Score:
        """What the placement found leaves free on this node (leftover.py)."""
        return leftover_score(self)

    def capacity_taken(self) -> Fraction:
        """How much the placement lowers the node's free capacity (scoring.free_capacity):
        the counter-set share of every device whose counters it starts to consume, plus 1 per
        dedicated device without counters."""
        taken = _ZERO
        for claim in self.picks:
            for pick in claim:
                if pick.newly_consuming:
                    taken += pick.entry.size
                if not pick.alternative.admin and pick.consumed is None and not pick.entry.counters:
                    taken += 1
        return taken

    def ranks(self) -> tuple[int, ...]:
        """The chosen subrequest of every request, claim by claim (0 for `exactly`)."""
        return tuple(chosen[r].sub_index or 0 for chosen in self.chosen for r in range(len(chosen)))

    def counters_used(self) -> dict[CounterID, Amount]:
        """Every counter of the node's slices: what existing allocations and this search use."""
        state, mine = self.ctx.state, self.counter_use
        return {
            counter: state.counter_amount(counter) + mine.get(counter, 0) for counter in self.totals
        }

    # --- closest miss ---------------------------------------------------------------

    def _note_miss(self, frame: _Frame) -> None:
        """Remember the deepest point the search reached, and why it could go no further."""
        if not isinstance(frame, _DeviceFrame) or not self._deeper():
            return
        alternative = frame.alternative
        tally = dict(self.cands.tally(alternative))
        reasons = (
            frame.tally if alternative.mode is AllocationMode.ALL else self._reasons_now(frame)
        )
        for code, count in reasons.items():
            tally[code] = tally.get(code, 0) + count
        self._offer_miss(alternative, frame.slot, self.cands.count(alternative), tally)

    def _reasons_now(self, frame: _DeviceFrame) -> dict[ReasonCode, int]:
        """Why each candidate not placed for this request cannot take the next slot now.

        The frame's own tally only covers the candidates after its start (slots take
        candidates in order), so the whole list is checked again, without recording."""
        alternative = frame.alternative
        placed = {
            p.entry.id for p in self.picks[alternative.claim_index] if p.alternative is alternative
        }
        reasons: dict[ReasonCode, int] = {}
        for candidate in self.cands.exact(alternative):
            if isinstance(candidate, InvalidPoolMarker) or candidate.entry.id in placed:
                continue
            entry = candidate.entry
            newly = bool(entry.counters) and not self.consuming_device(entry)
            problem = self._problem(alternative, candidate, newly, must=False, record=False)
            code = problem[0] if problem is not None else ReasonCode.EQUIVALENT
            reasons[code] = reasons.get(code, 0) + 1
        return reasons

    def _deeper(self) -> bool:
        return self.miss is None or sum(len(p) for p in self.picks) > self.miss.placed

    def _note_skipped(self, alternative: Alternative, code: ReasonCode) -> None:
        tally = dict(self.cands.tally(alternative))
        tally[code] = tally.get(code, 0) + 1
        self._offer_miss(alternative, 0, max(1, self.cands.count(alternative)), tally)

    def _offer_miss(
        self, alternative: Alternative, placed: int, needed: int, tally: dict[ReasonCode, int]
    ) -> None:
        if not self._deeper():
            return
        total = sum(len(p) for p in self.picks)
        claim = self.ctx.plan.claims[alternative.claim_index]
        self.miss = NodeMiss(
            node=self.view.name,
            placed=total,
            needed=self.needed(),
            claim=claim.label,
            request=alternative.result_name,
            request_placed=placed,
            request_needed=needed,
            reasons=tally_reasons(tally, needed - placed),
        )

    def needed(self) -> int:
        return sum(rest[0] for rest in self._rest)


@dataclass(frozen=True, slots=True)
class _Shortage:
    """A counter that would be exhausted; its quantities are only formatted when recorded."""

    counter: CounterID
    needed: Amount
    free: Amount

    def data(self) -> Shortage:
        return _exhausted(self.counter.counter, self.counter.counter_set, self.needed, self.free)


@functools.lru_cache(maxsize=4096)
def _exhausted(counter: str, counter_set: str, needed: Amount, free: Amount) -> Shortage:
    """A counter's shortage as an explanation shows it (memoised: an explanation records the
    same few shortages on every node of a fleet; amounts equal as numbers show alike)."""
    return Shortage(
        ShortageKind.EXHAUSTED,
        counter,
        counter_set=counter_set,
        needed=_show(Fraction(needed)),
        free=_show(Fraction(free)),
    )


def _interchangeable(alternative: Alternative, entry: DeviceEntry) -> bool:
    """Candidates whose failure at a slot proves that their equivalents fail there too: free
    (non-admin picks only take free devices) and dedicated (shares make their state differ)."""
    return not alternative.admin and not entry.multi


@functools.lru_cache(maxsize=4096)
def _show(value: Fraction) -> str:
    """Binary SI for whole multiples of 1024 (memory counters), decimal SI otherwise
    (memoised: explanations show the same few amounts again and again)."""
    whole = value.denominator == 1 and value.numerator % 1024 == 0 and value != 0
    return str(Quantity(value, QuantityFormat.BINARY_SI if whole else QuantityFormat.DECIMAL_SI))
