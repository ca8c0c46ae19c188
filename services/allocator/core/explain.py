"""Explain: why devices were rejected, which node came closest, why the chosen node won.

The solver records reasons while it searches (kueue's `Status`, kube-scheduler's Unschedulable
messages) — there is no second solver. Cheap summaries (per-node closest miss) are always kept;
per-device rejection groups are only recorded when the caller asks for an explanation.
Everything a caller sees is sorted, so the same inputs always give the same text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from services.allocator.core.plan import Alternative, ConstraintSpec
from services.allocator.core.scoring import Score
from services.common.dra.model import DeviceID

__all__ = [
    "NO_SUMMARY",
    "Summary",
    "SummaryKind",
    "summary_text",
    "ConstraintExplanation",
    "Explanation",
    "NodeChoice",
    "NodeMiss",
    "NodeReason",
    "ReasonCode",
    "detail_text",
    "held_by",
    "holders",
    "Recorder",
    "RejectionGroup",
    "RequestExplanation",
    "Shortage",
    "ShortageKind",
    "Taint",
    "phrase",
    "rejection_order",
    "shortage_text",
    "taint_text",
    "tally_reasons",
]

MAX_EXAMPLES = 3  # device ids shown per rejection group
MAX_GROUPS = 8  # rejection groups shown per request
MAX_VALUES = 10  # attribute values shown per constraint


class ReasonCode(StrEnum):
    """Why a device was not used for a (sub)request; values are stable API strings."""

    CLASS_SELECTOR = "ClassSelectorFalse"
    REQUEST_SELECTOR = "RequestSelectorFalse"
    TAINTED = "TaintNotTolerated"
    CAPACITY = "CapacityInsufficient"
    IN_USE = "InUse"
    PICKED = "PickedInThisSolve"
    COUNTERS = "CountersExhausted"
    CONSTRAINT = "ConstraintNotSatisfied"
    EQUIVALENT = "EquivalentFailed"
    OTHER_NODE = "OnOtherNode"
    NO_DEVICES = "NoDevices"
    CLAIM_LIMIT = "ClaimDeviceLimit"


_PHRASES = {
    ReasonCode.CLASS_SELECTOR: "not selected by the class",
    ReasonCode.REQUEST_SELECTOR: "not selected by the request",
    ReasonCode.TAINTED: "tainted",
    ReasonCode.CAPACITY: "short of capacity",
    ReasonCode.IN_USE: "in use",
    ReasonCode.PICKED: "picked for other requests",
    ReasonCode.COUNTERS: "short of counters",
    ReasonCode.CONSTRAINT: "ruled out by constraints",
    ReasonCode.EQUIVALENT: "equivalent to devices that did not fit",
    ReasonCode.OTHER_NODE: "on other nodes",
    ReasonCode.NO_DEVICES: "not on this node",
    ReasonCode.CLAIM_LIMIT: "over the 32-device claim limit",
}


def holders(owners: Iterable[str]) -> tuple[str, ...]:
    """The owners a state names for a device (reservation ids), once each, sorted."""
    return tuple(sorted({owner for owner in owners if owner}))


def held_by(owners: Iterable[str]) -> str:
    """`in use by a, b` for the owners a state knows, else `in use` (text: edges only)."""
    named = holders(owners)
    return f"in use by {', '.join(named)}" if named else "in use"


def phrase(code: ReasonCode) -> str:
    """A few words for `the others are <phrase>`."""
    return _PHRASES[code]


class ShortageKind(StrEnum):
    EXHAUSTED = "exhausted"  # a counter: the device needs more than is free
    OVERDRAWN = "overdrawn"  # a counter: existing allocations already exceed its total
    SHORT = "short"  # a capacity: the allocation needs more than is free
    MISSING = "missing"  # a capacity the request names that the device does not have
    NOT_ALLOWED = "not-allowed"  # a capacity amount its requestPolicy does not allow


@dataclass(frozen=True, slots=True)
class Shortage:
    """A counter (of `counter_set`) or a capacity `name` a device lacks; `needed`, `free`: the
    quantities, as the API writes them (empty where they do not apply)."""

    kind: ShortageKind
    name: str
    counter_set: str = ""
    needed: str = ""
    free: str = ""


def shortage_text(shortage: Shortage) -> str:
    name, kind = shortage.name, shortage.kind
    if kind is ShortageKind.EXHAUSTED:
        return (
            f"counter {name} of set {shortage.counter_set} exhausted "
            f"(needs {shortage.needed}, free {shortage.free})"
        )
    if kind is ShortageKind.OVERDRAWN:
        return f"counter {name} of set {shortage.counter_set} already overdrawn"
    if kind is ShortageKind.MISSING:
        return f"has no capacity {name}"
    if kind is ShortageKind.NOT_ALLOWED:
        return f"capacity {name}: {shortage.needed} is not allowed by its requestPolicy"
    return f"capacity {name}: needs {shortage.needed}, free {shortage.free}"


@dataclass(frozen=True, slots=True)
class Taint:
    """A device taint no toleration of the request tolerates."""

    key: str
    value: str
    effect: str


def taint_text(taint: Taint) -> str:
    return f"tainted {taint.key}={taint.value}:{taint.effect}, not tolerated"


@dataclass(frozen=True)
class RejectionGroup:
    """`count` devices rejected for the same reason; a few of them as examples.

    `holders`: for IN_USE, the owners the allocated state names for the devices (reservation
    ids), sorted; `shortage`: for COUNTERS and CAPACITY, the counter or capacity that is short;
    `taint`: for TAINTED, the taint; `detail`: the free-text part of the reason (empty when
    those say it all)."""

    code: ReasonCode
    detail: str
    count: int
    examples: tuple[str, ...]
    holders: tuple[str, ...] = ()
    shortage: Shortage | None = None
    taint: Taint | None = None

    @property
    def key(self) -> tuple[ReasonCode, str, tuple[str, ...], Shortage | Taint | None]:
        """What makes two groups the same reason (devices of both may be merged)."""
        return (self.code, self.detail, self.holders, self.shortage or self.taint)

    def message(self) -> str:
        return f"{self.count} {detail_text(self)}{_examples(self)}"


def detail_text(group: RejectionGroup) -> str:
    """The reason of a group in words: `in use by <holders>` for IN_USE, the shortage or the
    taint, else the detail."""
    if group.shortage is not None:
        return shortage_text(group.shortage)
    if group.taint is not None:
        return taint_text(group.taint)
    if group.code is ReasonCode.IN_USE and not group.detail:
        return held_by(group.holders)
    return group.detail


def rejection_order(group: RejectionGroup) -> tuple[int, str, str]:
    """Most frequent first, then by reason and by the words for it (a stable order)."""
    return (-group.count, group.code, detail_text(group))


def _examples(group: RejectionGroup) -> str:
    return f" (e.g. {', '.join(group.examples)})" if group.examples else ""


@dataclass(frozen=True)
class RequestExplanation:
    claim: str
    request: str  # `req` or `req/sub`
    considered: int  # distinct devices looked at, on every node searched
    rejections: tuple[RejectionGroup, ...]  # most frequent first

    def message(self) -> str:
        head = f"claim {self.claim}, request {self.request}: {self.considered} devices considered"
        shown = [g.message() for g in self.rejections[:MAX_GROUPS]]
        if len(self.rejections) > MAX_GROUPS:
            shown.append(f"{len(self.rejections) - MAX_GROUPS} more reasons")
        return "; ".join([head, *shown])


@dataclass(frozen=True)
class ConstraintExplanation:
    claim: str
    index: int
    kind: str
    attribute: str
    values: tuple[str, ...]  # every value of the attribute involved in a rejection, sorted
    problems: tuple[RejectionGroup, ...]

    def message(self) -> str:
        head = f"claim {self.claim}, constraint #{self.index} {self.kind} {self.attribute}"
        if self.values:
            more = ", ..." if len(self.values) > MAX_VALUES else ""
            head += f" (values seen: {', '.join(self.values[:MAX_VALUES])}{more})"
        return "; ".join(
            [head, *(f"{g.count} devices: {detail_text(g)}" + _examples(g) for g in self.problems)]
        )


@dataclass(frozen=True, slots=True)
class NodeReason:
    """`count` of the devices a request still lacked on a node are out for `code`."""

    code: ReasonCode
    count: int


@dataclass(frozen=True)
class NodeMiss:
    """How far the search got on one node before it ran out of options."""

    node: str | None
    placed: int  # devices placed, over all claims, at the deepest point
    needed: int  # devices the claims need at least on this node
    claim: str
    request: str
    request_placed: int
    request_needed: int
    reasons: tuple[NodeReason, ...]  # most frequent first
    error: str | None = None
    budget_exhausted: bool = False

    def message(self) -> str:
        where = self.node if self.node is not None else "<any node>"
        if self.error is not None:
            return f"{where}: {self.error}"
        if self.budget_exhausted:
            placed = f"{self.placed} of {self.needed} devices"
            return f"{where}: search budget exhausted after placing {placed}"
        text = (
            f"{where}: {self.request_placed} of {self.request_needed} devices for request "
            f"{self.request} of claim {self.claim}"
        )
        if self.reasons:
            text += "; the others are " + ", ".join(
                f"{phrase(r.code)} ({r.count})" for r in self.reasons
            )
        return text

    def rank(self) -> tuple[int, int, int, str]:
        """Sort key: errors last, then the most devices placed, then node name."""
        return (self.error is not None, -self.placed, -self.request_placed, self.node or "")


@dataclass(frozen=True)
class NodeChoice:
    node: str | None
    score: Score
    feasible_nodes: int
    runner_up: str | None
    runner_up_score: Score | None
    policy: str

    def message(self) -> str:
        where = self.node if self.node is not None else "<any node>"
        text = f"{where} chosen by {self.policy} from {self.feasible_nodes} feasible nodes"
        text += f": {self.score}"
        if self.runner_up_score is not None:
            text += f"; runner-up {self.runner_up}: {self.runner_up_score}"
        return text


class SummaryKind(StrEnum):
    """What an explanation's first line says; its facts are the Summary's fields."""

    NONE = "none"  # no explanation was recorded
    ALLOCATED = "allocated"  # on `node`
    NO_NODE_FITS = "no-node-fits"  # `closest` is the closest miss (`eligible`: restricted)
    NO_ELIGIBLE_NODE = "no-eligible-node"  # the node restriction left no node with devices
    NO_DEVICES = "no-devices"  # no node has any device
    GANG_ALLOCATED = "gang-allocated"  # `count` nodes, in `label`=`domain`, `nodes`
    GANG_NO_FIT = "gang-no-fit"  # no node (with `label`) fits the claims
    GANG_SHORT = "gang-short"  # at most len(`nodes`) fit in one domain (`label`=`domain`)
    DEADLINE = "deadline"  # the call's deadline ran out during the search


@dataclass(frozen=True)
class Summary:
    """An explanation's headline as data; `summary_text` renders it (edges only)."""

    kind: SummaryKind
    node: str | None = None
    closest: NodeMiss | None = None
    eligible: bool = False
    count: int = 0
    label: str | None = None
    domain: str | None = None
    nodes: tuple[str, ...] = ()
    fitting: int = 0  # GANG_SHORT: how many nodes of the best domain fit
    budget_exhausted: bool = False


NO_SUMMARY = Summary(SummaryKind.NONE)


def summary_text(summary: Summary) -> str:
    """The headline's words, as the API and the CLI print them."""
    kind = summary.kind
    if kind is SummaryKind.NONE:
        text = ""
    elif kind is SummaryKind.ALLOCATED:
        text = f"allocated on {summary.node or '<any node>'}"
    elif kind is SummaryKind.NO_NODE_FITS:
        eligible = "eligible " if summary.eligible else ""
        closest = summary.closest.message() if summary.closest is not None else ""
        text = f"no {eligible}node fits the claims; closest: {closest}"
    elif kind is SummaryKind.NO_ELIGIBLE_NODE:
        text = "no node with devices matches the node selector"
    elif kind is SummaryKind.NO_DEVICES:
        text = "no node has any device"
    elif kind is SummaryKind.GANG_ALLOCATED:
        where = f" in {summary.label}={summary.domain}" if summary.label else ""
        text = f"gang of {summary.count} nodes{where}: {', '.join(summary.nodes)}"
    elif kind is SummaryKind.GANG_NO_FIT:
        where = f"no node with label {summary.label} fits" if summary.label else "no node fits"
        text = f"gang of {summary.count} nodes: {where} the claims"
    elif kind is SummaryKind.GANG_SHORT:
        name = f"{summary.label}={summary.domain}" if summary.label else "the cluster"
        text = (
            f"gang of {summary.count} nodes: at most {summary.fitting} nodes fit the claims in "
            f"one domain ({name}: {', '.join(summary.nodes)})"
        )
    else:
        text = "the call's deadline ran out during the search: retry with more time"
    if summary.budget_exhausted:
        text += " (search budget exhausted: a fit may exist)"
    return text


@dataclass(frozen=True)
class Explanation:
    summary: Summary
    nodes: tuple[NodeMiss, ...] = ()  # closest miss first
    requests: tuple[RequestExplanation, ...] = ()
    constraints: tuple[ConstraintExplanation, ...] = ()
    choice: NodeChoice | None = None
    notes: tuple[str, ...] = ()
    budget_exhausted: bool = False

    def lines(self, max_nodes: int = 10) -> tuple[str, ...]:
        """Human-readable lines: summary, node choice or closest misses, requests, notes."""
        lines = [summary_text(self.summary)]
        if self.choice is not None:
            lines.append(self.choice.message())
        lines.extend(miss.message() for miss in self.nodes[:max_nodes])
        if len(self.nodes) > max_nodes:
            lines.append(f"... and {len(self.nodes) - max_nodes} more nodes")
        lines.extend(r.message() for r in self.requests)
        lines.extend(c.message() for c in self.constraints)
        lines.extend(self.notes)
        if self.budget_exhausted:
            lines.append("search budget exhausted: the answer may be incomplete")
        return tuple(lines)


_RejectionKey = tuple[int, ReasonCode, str, tuple[str, ...], Shortage | Taint | None]


class Recorder:
    """Collects per-device reasons during one solve (only when an explanation was asked for)."""

    def __init__(self) -> None:
        self._alternatives: dict[int, Alternative] = {}
        self._claims: dict[int, str] = {}
        self._considered: dict[int, set[DeviceID]] = {}
        self._rejected: dict[_RejectionKey, set[DeviceID]] = {}
        self._constraints: dict[tuple[str, int], ConstraintSpec] = {}
        self._constraint_values: dict[tuple[str, int], set[str]] = {}
        self._constraint_problems: dict[tuple[str, int, str], set[DeviceID]] = {}
        self._notes: set[str] = set()

    def consider(self, alternative: Alternative, claim: str, device: DeviceID) -> None:
        self._alternatives[alternative.key] = alternative
        self._claims[alternative.key] = claim
        self._considered.setdefault(alternative.key, set()).add(device)

    def reject(
        self,
        alternative: Alternative,
        device: DeviceID,
        code: ReasonCode,
        detail: str | Shortage | Taint,
        holders: tuple[str, ...] = (),
    ) -> None:
        """`holders`: for IN_USE, who holds the device (`holders(state.owners(device))`);
        `detail`: for COUNTERS and CAPACITY the Shortage, for TAINTED the Taint."""
        key: _RejectionKey
        if isinstance(detail, Shortage | Taint):
            key = (alternative.key, code, "", holders, detail)
        else:
            key = (alternative.key, code, detail, holders, None)
        self._rejected.setdefault(key, set()).add(device)

    def constraint(
        self,
        claim: str,
        spec: ConstraintSpec,
        device: DeviceID,
        problem: str,
        values: Iterable[str],
    ) -> None:
        self._constraints[(claim, spec.index)] = spec
        self._constraint_values.setdefault((claim, spec.index), set()).update(values)
        self._constraint_problems.setdefault((claim, spec.index, problem), set()).add(device)

    def note(self, text: str) -> None:
        self._notes.add(text)

    def requests(self) -> tuple[RequestExplanation, ...]:
        grouped: dict[int, list[RejectionGroup]] = {}
        for (key, code, detail, held, fact), devices in self._rejected.items():
            grouped.setdefault(key, []).append(_group(code, detail, devices, held, fact))
        explained = [
            RequestExplanation(
                claim=self._claims[key],
                request=alternative.result_name,
                considered=len(self._considered.get(key, ())),
                rejections=_sorted(grouped.get(key, [])),
            )
            for key, alternative in self._alternatives.items()
        ]
        return tuple(sorted(explained, key=lambda r: (r.claim, r.request)))

    def constraints(self) -> tuple[ConstraintExplanation, ...]:
        grouped: dict[tuple[str, int], list[RejectionGroup]] = {}
        for (claim, index, problem), devices in self._constraint_problems.items():
            group = _group(ReasonCode.CONSTRAINT, problem, devices)
            grouped.setdefault((claim, index), []).append(group)
        explained = [
            ConstraintExplanation(
                claim,
                spec.index,
                str(spec.kind),
                spec.attribute,
                tuple(sorted(self._constraint_values.get((claim, spec.index), ()))),
                _sorted(grouped.get((claim, spec.index), [])),
            )
            for (claim, _), spec in self._constraints.items()
        ]
        return tuple(sorted(explained, key=lambda c: (c.claim, c.index)))

    def notes(self) -> tuple[str, ...]:
        return tuple(sorted(self._notes))


def _group(
    code: ReasonCode,
    detail: str,
    devices: Iterable[DeviceID],
    held: tuple[str, ...] = (),
    fact: Shortage | Taint | None = None,
) -> RejectionGroup:
    ordered = sorted(devices)
    examples = tuple(str(d) for d in ordered[:MAX_EXAMPLES])
    shortage = fact if isinstance(fact, Shortage) else None
    taint = fact if isinstance(fact, Taint) else None
    return RejectionGroup(code, detail, len(ordered), examples, held, shortage, taint)


def _sorted(groups: Iterable[RejectionGroup]) -> tuple[RejectionGroup, ...]:
    return tuple(sorted(groups, key=rejection_order))


_SELECTORS = frozenset({ReasonCode.CLASS_SELECTOR, ReasonCode.REQUEST_SELECTOR})


def tally_reasons(tally: Mapping[ReasonCode, int], missing: int) -> tuple[NodeReason, ...]:
    """NodeMiss.reasons: why the devices a request still lacked were not available, most
    frequent first. Devices the selectors did not pick are not "the others" of a request, so
    they only count when nothing else explains the gap; `missing` devices nobody rejected
    simply are not there."""
    relevant = {code: n for code, n in tally.items() if n and code not in _SELECTORS}
    unexplained = missing - sum(relevant.values())
    if unexplained > 0:
        relevant[ReasonCode.NO_DEVICES] = unexplained
    items = sorted(relevant.items(), key=lambda item: (-item[1], item[0]))
    return tuple(NodeReason(code, count) for code, count in items)
