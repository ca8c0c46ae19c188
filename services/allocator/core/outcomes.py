"""What searching one node of a group found, kept for every later search of the same question.

A node of one template in one free state (groups.py) answers a search alike, whichever node of
the group it is and whenever it is asked (the answer reads only the node's own devices and
counters). So the outcome of one search — fits, with which devices and which node key, or the
closest miss — is kept per (question, template, devices in use) and read back instead of
searching again: by the next item of a batch (batch.py), by the next unit of a Capacity count,
by a gang's exhaustive pass, and by a later solve of the same question while the snapshot lives.
That is the shared feasibility and scoring pass of opportunistic batching (KEP-5598): items with
one signature reuse the ranked outcomes, and only the nodes whose state changed are searched.

The question's signature is what a node's search reads of the plan: per alternative its class,
selectors, count, mode, tolerations, capacity and names; per claim its constraints; the topology
constraints as resolved to requests; the policy; the fragmentation mix. Claim names are not in
it (items of a batch differ by name): a kept miss names its claim by index and is labelled for
the asker. Outcomes are kept only for complete searches (not cut short by the budget, no node
error) and charge the steps the search took, so a budget gives the same answer as without them.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Generic, TypeVar

from services.allocator.core.candidates import SolveContext
from services.allocator.core.explain import NodeMiss
from services.allocator.core.plan import Plan
from services.allocator.core.preferences import TopologyFit
from services.allocator.core.scoring import NodeKey, Score
from services.allocator.core.templates import NodeTemplate

__all__ = [
    "NodeOutcome",
    "OutcomeMemo",
    "kept_memo",
    "outcome_memo",
    "question_memo",
    "signature",
]

_T = TypeVar("_T")
_LIMIT = 2048  # outcomes kept per (template, question); cleared when full
_QUESTIONS = 32  # memos kept per template (outcomes or tapes of a question); the oldest goes


@dataclass(slots=True)
class NodeOutcome:
    """One complete search of a node: `key` (named for the node searched) when it fits, with
    its picks by (alternative key, device index) per claim and its chosen alternative keys per
    request; else the closest miss, if the search found one (its claim by index)."""

    steps: int
    pruned: bool  # ruled out by the cheap check, without a search
    key: NodeKey | None = None
    picks: tuple[tuple[tuple[int, int], ...], ...] = ()
    chosen: tuple[tuple[tuple[int, int], ...], ...] = ()  # per claim: (request, alternative key)
    topology: TopologyFit = TopologyFit()
    fragmentation: Fraction = Fraction(0)
    miss: NodeMiss | None = None
    miss_claim: int = -1
    score: Score | None = None  # the full Score, once some solve needed it

    def miss_on(self, node: str | None, plan: Plan) -> NodeMiss | None:
        """The kept miss, for `node` and labelled with the asking plan's claim."""
        if self.miss is None:
            return None
        label = plan.claims[self.miss_claim].label if self.miss_claim >= 0 else self.miss.claim
        return replace(self.miss, node=node, claim=label)


@dataclass
class OutcomeMemo(Generic[_T]):
    """What one question found on one template, by the template's devices in use: the
    outcome of a search (NodeOutcome), or an explaining search's tape (replay.GroupTape);
    at most `limit` of them (cleared when full)."""

    outcomes: dict[frozenset[int], _T] = field(default_factory=dict)
    limit: int = _LIMIT

    def get(self, used: frozenset[int]) -> _T | None:
        return self.outcomes.get(used)

    def put(self, used: frozenset[int], outcome: _T) -> None:
        if len(self.outcomes) >= self.limit:
            self.outcomes.clear()
        self.outcomes[used] = outcome


def outcome_memo(template: NodeTemplate, question: Hashable) -> OutcomeMemo[NodeOutcome]:
    """The template's memo of search outcomes for `question` (a `signature`), kept with the
    template's caches (at most _QUESTIONS of them, each at most _LIMIT outcomes)."""
    return kept_memo(template, ("outcomes", question))


def question_memo(ctx: SolveContext, template: NodeTemplate) -> OutcomeMemo[NodeOutcome]:
    """`outcome_memo` of the context's question (its `signature`), looked up once per
    template among the context's facts (SolveContext.facts)."""
    memos = ctx.facts.get(_QUESTION_MEMOS)
    if not isinstance(memos, dict):
        memos = ctx.facts[_QUESTION_MEMOS] = {}
    found = memos.get(template)
    if found is None:
        found = memos[template] = outcome_memo(template, signature(ctx))
    assert isinstance(found, OutcomeMemo)
    return found


_QUESTION_MEMOS = "outcomes.question_memo"


def kept_memo(template: NodeTemplate, key: Hashable, limit: int = _LIMIT) -> OutcomeMemo[Any]:
    """The template's memo under `key` (a kind of record and a question), of at most
    `limit` records."""
    memos = template.caches.get(_MEMOS)
    if memos is None:
        memos = template.caches[_MEMOS] = {}
    found = memos.get(key)
    if found is None:
        if len(memos) >= _QUESTIONS:
            memos.pop(next(iter(memos)), None)
        found = memos[key] = OutcomeMemo(limit=limit)
    assert isinstance(found, OutcomeMemo)
    return found


_MEMOS = "outcome-memos"


def signature(ctx: SolveContext) -> Hashable:
    """What one node's search reads of the question (module docstring); worked out once
    among the context's facts (SolveContext.facts)."""
    found = ctx.facts.get(_SIGNATURE)
    if found is None:
        found = ctx.facts[_SIGNATURE] = _signature(ctx)
    return found


_SIGNATURE = "outcomes.signature"


def _signature(ctx: SolveContext) -> Hashable:
    plan = ctx.plan
    alternatives = tuple(
        (
            a.key,
            a.claim_index,
            a.request_index,
            a.sub_index,
            a.request,
            a.subrequest,
            a.device_class.name,
            tuple(s.cel for s in a.device_class.selectors),
            tuple(s.cel for s in a.selectors),
            a.mode,
            a.count,
            a.admin,
            a.tolerations,
            tuple(sorted(a.capacity.items())),
            a.constraints,
        )
        for a in plan.alternatives()
    )
    constraints = tuple(
        tuple((s.kind, s.attribute, s.requests) for s in claim.constraints) for claim in plan.claims
    )
    topology: Any = None
    if ctx.topology is not None:
        topology = tuple(
            (s.index, s.constraint, s.implicit, s.requests) for s in ctx.topology.scoped
        )
    return (ctx.policy, ctx.mix, alternatives, constraints, topology)
