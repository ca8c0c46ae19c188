"""Explain: why devices were rejected, which node came closest, why the chosen node won.

The solver records reasons while it searches (kueue's `Status`, kube-scheduler's Unschedulable
messages) — there is no second solver. Cheap summaries (per-node closest miss) are always kept;
per-device rejection groups are only recorded when the caller asks for an explanation.
Everything a caller sees is sorted, so the same inputs always give the same text.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from services.allocator.core.plan import Alternative, ConstraintKind, ConstraintSpec
from services.allocator.core.scoring import Score
from services.common.dra.model import DeviceID
from services.common.dra.topology_annotation import TopologyKind

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
    "Listener",
    "Recorder",
    "RejectionGroup",
    "RequestExplanation",
    "ConstraintMiss",
    "ConstraintProblem",
    "ConstraintRef",
    "Fact",
    "IncompletePool",
    "note_text",
    "OtherNodes",
    "Picked",
    "SelectorMiss",
    "Shortage",
    "ShortageKind",
    "Taint",
    "TopologyMiss",
    "TopologyProblem",
    "TopologyProblemKind",
    "fact_text",
    "topology_problem_text",
    "topology_text",
    "constraint_text",
    "selector_text",
    "picked_text",
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
    BINDING_DISABLED = "BindingConditionsDisabled"


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
    ReasonCode.BINDING_DISABLED: "unusable: binding conditions are turned off",
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


@dataclass(frozen=True, slots=True)
class SelectorMiss:
    """Selector `index` (its CEL `expression`) is false for the device: a selector of the
    device class `device_class`, or of the request when that is empty."""

    index: int
    expression: str
    device_class: str = ""


def selector_text(miss: SelectorMiss) -> str:
    owner = f"class {miss.device_class} selector" if miss.device_class else "request selector"
    return f"{owner} #{miss.index} `{miss.expression}` is false"


@dataclass(frozen=True, slots=True)
class Picked:
    """The device is already picked in this solve: for another request of the same claim
    (`same_claim`, an admin-access request) or for any other request."""

    same_claim: bool = False


def picked_text(picked: Picked) -> str:
    other = "of the same claim" if picked.same_claim else "in this solve"
    return f"picked for another request {other}"


@dataclass(frozen=True, slots=True)
class OtherNodes:
    """The device matches but is on another node than `node`, the one the query is pinned to
    (None: the network-attached devices)."""

    node: str | None


class ConstraintProblem(StrEnum):
    MISSING = "missing"  # the device lacks the attribute
    DIFFERS = "differs"  # matchAttribute: its value differs from the devices already picked
    REPEATS = "repeats"  # distinctAttribute: its value repeats one already picked
    FEW_SHARE = "few-share"  # matchAttribute: at most `bound` free devices share a value
    FEW_DISTINCT = "few-distinct"  # distinctAttribute: only `bound` distinct values are free


@dataclass(frozen=True, slots=True)
class ConstraintRef:
    """Constraint `index` of a claim: its kind and attribute."""

    index: int
    kind: ConstraintKind
    attribute: str


@dataclass(frozen=True, slots=True)
class ConstraintMiss:
    """Why a device breaks a claim's constraint; `bound`, `needed`: for FEW_SHARE and
    FEW_DISTINCT. `constraint` names the constraint where the context does not (a request's
    rejections; a ConstraintExplanation names it in its head)."""

    problem: ConstraintProblem
    bound: int = 0
    needed: int = 0
    constraint: ConstraintRef | None = None


_CONSTRAINT_WORDS = {
    ConstraintProblem.MISSING: "attribute missing",
    ConstraintProblem.DIFFERS: "value differs from the devices already picked",
    ConstraintProblem.REPEATS: "value repeats one of the devices already picked",
}


def constraint_text(miss: ConstraintMiss) -> str:
    if miss.problem is ConstraintProblem.FEW_SHARE:
        words = f"at most {miss.bound} devices share a value, {miss.needed} needed"
    elif miss.problem is ConstraintProblem.FEW_DISTINCT:
        words = f"only {miss.bound} distinct values, {miss.needed} needed"
    else:
        words = _CONSTRAINT_WORDS[miss.problem]
    ref = miss.constraint
    if ref is None:
        return words
    return f"constraint #{ref.index} ({ref.kind} {ref.attribute}): {words}"


class TopologyProblemKind(StrEnum):
    UNKNOWN = "unknown"  # the node's topology is not known
    NOT_WHOLE_GPU = "not-whole-gpu"  # not a whole GPU of the NVLink topology
    FEW_LINKS = "few-links"  # `count` NVLinks to `device`, fewer than the constraint needs
    NO_NIC = "no-nic"  # no NIC known for its GPU
    NIC_TOO_FAR = "nic-too-far"  # its closest NIC is at relation `value`
    PLACE_UNKNOWN = "place-unknown"  # its PCIe root / NUMA node is not known
    PLACE_DIFFERS = "place-differs"  # its PCIe root / NUMA node `value` differs from `other`
    CLIQUE = "clique"  # bound: the largest free NVLink-connected set is `count`
    NICS = "nics"  # bound: `count` free devices have a NIC close enough
    SHARE_PLACE = "share-place"  # bound: at most `count` free devices share a root / node


@dataclass(frozen=True, slots=True)
class TopologyProblem:
    """Why a device cannot join a topology constraint's set (or why the set cannot grow)."""

    kind: TopologyProblemKind
    count: int = 0
    device: str = ""
    value: str = ""
    other: str = ""


@dataclass(frozen=True, slots=True)
class TopologyMiss:
    """Topology constraint `index` (its kind, minimum NVLinks and farthest NIC relation)
    rules the device out for `problem`."""

    index: int
    kind: TopologyKind
    min_nvlinks: int
    max_nic_relation: str
    problem: TopologyProblem


def _topology_constraint_text(miss: TopologyMiss) -> str:
    if miss.kind is TopologyKind.NVLINK_CONNECTED and miss.min_nvlinks > 1:
        return f"{miss.kind} (>= {miss.min_nvlinks} links)"
    if miss.kind is TopologyKind.GPU_NIC_AFFINITY:
        return f"{miss.kind} (NIC at {miss.max_nic_relation} or closer)"
    return str(miss.kind)


def topology_problem_text(miss: TopologyMiss) -> str:
    p, kind = miss.problem, miss.problem.kind
    place = "PCIe root" if miss.kind is TopologyKind.SAME_PCIE_ROOT else "NUMA node"
    if kind is TopologyProblemKind.UNKNOWN:
        return "the node's topology is not known"
    if kind is TopologyProblemKind.NOT_WHOLE_GPU:
        return "not a whole GPU of the node's NVLink topology"
    if kind is TopologyProblemKind.FEW_LINKS:
        return f"{p.count} NVLinks to {p.device} (needs {miss.min_nvlinks})"
    if kind is TopologyProblemKind.NO_NIC:
        return "no NIC known for its GPU"
    if kind is TopologyProblemKind.NIC_TOO_FAR:
        return f"closest NIC is {p.value} (needs {miss.max_nic_relation} or closer)"
    if kind is TopologyProblemKind.PLACE_UNKNOWN:
        return f"{place} not known"
    if kind is TopologyProblemKind.PLACE_DIFFERS:
        return f"{place} {p.value} differs from {p.other}"
    if kind is TopologyProblemKind.CLIQUE:
        return f"largest free NVLink-connected set is {p.count}"
    if kind is TopologyProblemKind.NICS:
        return f"{p.count} have a NIC at {miss.max_nic_relation} or closer"
    return f"at most {p.count} share a {place}"


def topology_text(miss: TopologyMiss) -> str:
    what = _topology_constraint_text(miss)
    return f"topology constraint #{miss.index} ({what}): {topology_problem_text(miss)}"


@dataclass(frozen=True, slots=True, order=True)
class IncompletePool:
    """A note: pool `pool` was incomplete (`seen` of its newest generation's `slices` seen);
    its devices were used anyway, as upstream does."""

    pool: str
    seen: int
    slices: int


def note_text(note: IncompletePool) -> str:
    return (
        f"pool {note.pool} is incomplete ({note.seen} of {note.slices} slices "
        "of its newest generation seen); its devices were used anyway, as upstream does"
    )


Fact = Shortage | Taint | SelectorMiss | Picked | OtherNodes | ConstraintMiss | TopologyMiss
"""What a rejection is about, as fields; rendered by fact_text at the edges."""


def fact_text(fact: Fact) -> str:
    """The words for a rejection's fact (text: edges only)."""
    if isinstance(fact, Shortage):
        return shortage_text(fact)
    if isinstance(fact, Taint):
        return taint_text(fact)
    if isinstance(fact, SelectorMiss):
        return selector_text(fact)
    if isinstance(fact, Picked):
        return picked_text(fact)
    if isinstance(fact, OtherNodes):
        return f"usable only from other nodes than {fact.node}"
    if isinstance(fact, ConstraintMiss):
        return constraint_text(fact)
    return topology_text(fact)


@dataclass(frozen=True)
class RejectionGroup:
    """`count` devices rejected for the same reason; a few of them as examples.

    `holders`: for IN_USE, the owners the allocated state names for the devices (reservation
    ids), sorted; `fact`: what the reason is about, as fields (the counter or capacity that is
    short, the taint, the false selector, the broken constraint, ...). No text: the edges
    render it (detail_text)."""

    code: ReasonCode
    count: int
    examples: tuple[str, ...]
    holders: tuple[str, ...] = ()
    fact: Fact | None = None

    @property
    def shortage(self) -> Shortage | None:
        return self.fact if isinstance(self.fact, Shortage) else None

    @property
    def taint(self) -> Taint | None:
        return self.fact if isinstance(self.fact, Taint) else None

    @property
    def key(self) -> tuple[ReasonCode, tuple[str, ...], Fact | None]:
        """What makes two groups the same reason (devices of both may be merged)."""
        return (self.code, self.holders, self.fact)

    def message(self) -> str:
        return f"{self.count} {detail_text(self)}{_examples(self)}"


def detail_text(group: RejectionGroup) -> str:
    """The reason of a group in words: `in use by <holders>` for IN_USE, its fact, else the
    detail."""
    if group.fact is not None:
        return fact_text(group.fact)
    if group.code is ReasonCode.IN_USE:
        return held_by(group.holders)
    return phrase(group.code)


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
    notes: tuple[IncompletePool, ...] = ()
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
        lines.extend(note_text(note) for note in self.notes)
        if self.budget_exhausted:
            lines.append("search budget exhausted: the answer may be incomplete")
        return tuple(lines)


_RejectionKey = tuple[int, ReasonCode, tuple[str, ...], Fact | None]
_ProblemKey = tuple[str, int, ConstraintMiss]


class Listener(Protocol):
    """What a search reports to its recorder; a recorder may hand it to a listener instead
    (`Recorder.tape`: one node's events, to stand for its group's, core/replay.py)."""

    def consider(self, alternative: Alternative, claim: str, device: DeviceID) -> None: ...

    def reject(
        self,
        alternative: Alternative,
        device: DeviceID,
        code: ReasonCode,
        fact: Fact | None = None,
        holders: tuple[str, ...] = (),
    ) -> None: ...

    def constraint(
        self,
        claim: str,
        spec: ConstraintSpec,
        device: DeviceID,
        problem: ConstraintMiss,
        values: Iterable[str],
    ) -> None: ...

    def note(self, note: IncompletePool) -> None: ...

    def listed(self, alternative: Alternative) -> None: ...


class Recorder:
    """Collects per-device reasons during one solve (only when an explanation was asked for).

    Devices come one by one (`consider`, `reject`, `constraint`), or in bulk for nodes that
    stand for each other (`add_considered`, `add_rejected`, `add_problem`: a count of devices
    no other call names, with the smallest of them as examples). While `tape` is set, every
    event goes to it instead (core/replay.py records one node's search there)."""

    def __init__(self) -> None:
        self._alternatives: dict[int, Alternative] = {}
        self._claims: dict[int, str] = {}
        self._considered: dict[int, set[DeviceID]] = {}
        self._rejected: dict[_RejectionKey, set[DeviceID]] = {}
        self._constraints: dict[tuple[str, int], ConstraintSpec] = {}
        self._constraint_values: dict[tuple[str, int], set[str]] = {}
        self._constraint_problems: dict[_ProblemKey, set[DeviceID]] = {}
        self._notes: set[IncompletePool] = set()
        self._bulk_considered: dict[int, int] = {}
        self._bulk_rejected: dict[_RejectionKey, _Bulk] = {}
        self._bulk_problems: dict[_ProblemKey, _Bulk] = {}
        self.tape: Listener | None = None

    def consider(self, alternative: Alternative, claim: str, device: DeviceID) -> None:
        if self.tape is not None:
            self.tape.consider(alternative, claim, device)
            return
        self._alternatives[alternative.key] = alternative
        self._claims[alternative.key] = claim
        self._considered.setdefault(alternative.key, set()).add(device)

    def reject(
        self,
        alternative: Alternative,
        device: DeviceID,
        code: ReasonCode,
        fact: Fact | None = None,
        holders: tuple[str, ...] = (),
    ) -> None:
        """`holders`: for IN_USE, who holds the device (`holders(state.owners(device))`);
        `fact`: what the rejection is about (the shortage, the taint, the false selector...)."""
        if self.tape is not None:
            self.tape.reject(alternative, device, code, fact, holders)
            return
        key = (alternative.key, code, holders, fact)
        self._rejected.setdefault(key, set()).add(device)

    def reject_all(
        self,
        alternative: Alternative,
        devices: Iterable[DeviceID],
        code: ReasonCode,
        holders: tuple[str, ...] = (),
    ) -> None:
        """`reject` of several devices for the same reason (and holders), no fact."""
        if self.tape is not None:
            for device in devices:
                self.tape.reject(alternative, device, code, None, holders)
            return
        key = (alternative.key, code, holders, None)
        self._rejected.setdefault(key, set()).update(devices)

    def constraint(
        self,
        claim: str,
        spec: ConstraintSpec,
        device: DeviceID,
        problem: ConstraintMiss,
        values: Iterable[str],
    ) -> None:
        if self.tape is not None:
            self.tape.constraint(claim, spec, device, problem, values)
            return
        self._constraints[(claim, spec.index)] = spec
        self._constraint_values.setdefault((claim, spec.index), set()).update(values)
        self._constraint_problems.setdefault((claim, spec.index, problem), set()).add(device)

    def note(self, note: IncompletePool) -> None:
        if self.tape is not None:
            self.tape.note(note)
            return
        self._notes.add(note)

    def holders_of(
        self, owners: Callable[[DeviceID], Iterable[str]], device: DeviceID
    ) -> tuple[str, ...]:
        """`holders(owners(device))` for an IN_USE rejection; nothing while taping (a tape
        finds each node's holders itself)."""
        return () if self.tape is not None else holders(owners(device))

    def listed(self, alternative: Alternative) -> None:
        """The alternative's candidate list was built from a template's static checks (its
        devices' own events come in bulk)."""
        if self.tape is not None:
            self.tape.listed(alternative)

    # --- in bulk ----------------------------------------------------------------------------

    def add_considered(self, alternative: Alternative, claim: str, count: int) -> None:
        self._alternatives[alternative.key] = alternative
        self._claims[alternative.key] = claim
        self._bulk_considered[alternative.key] = (
            self._bulk_considered.get(alternative.key, 0) + count
        )

    def add_rejected(
        self,
        alternative: Alternative,
        code: ReasonCode,
        fact: Fact | None,
        count: int,
        examples: Iterable[DeviceID],
    ) -> None:
        key = (alternative.key, code, (), fact)
        _add_bulk(self._bulk_rejected, key, count, examples)

    def add_problem(
        self,
        claim: str,
        spec: ConstraintSpec,
        problem: ConstraintMiss,
        values: Iterable[str],
        count: int,
        examples: Iterable[DeviceID],
    ) -> None:
        self._constraints[(claim, spec.index)] = spec
        self._constraint_values.setdefault((claim, spec.index), set()).update(values)
        _add_bulk(self._bulk_problems, (claim, spec.index, problem), count, examples)

    # --- the explanation --------------------------------------------------------------------

    def requests(self) -> tuple[RequestExplanation, ...]:
        grouped: dict[int, list[RejectionGroup]] = {}
        for key in {*self._rejected, *self._bulk_rejected}:
            alternative, code, held, fact = key
            group = _group(
                code, self._rejected.get(key, ()), self._bulk_rejected.get(key), held, fact
            )
            grouped.setdefault(alternative, []).append(group)
        explained = [
            RequestExplanation(
                claim=self._claims[key],
                request=alternative.result_name,
                considered=len(self._considered.get(key, ())) + self._bulk_considered.get(key, 0),
                rejections=_sorted(grouped.get(key, [])),
            )
            for key, alternative in self._alternatives.items()
        ]
        return tuple(sorted(explained, key=lambda r: (r.claim, r.request)))

    def constraints(self) -> tuple[ConstraintExplanation, ...]:
        grouped: dict[tuple[str, int], list[RejectionGroup]] = {}
        for key in {*self._constraint_problems, *self._bulk_problems}:
            claim, index, problem = key
            devices = self._constraint_problems.get(key, ())
            bulk = self._bulk_problems.get(key)
            group = _group(ReasonCode.CONSTRAINT, devices, bulk, fact=problem)
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

    def notes(self) -> tuple[IncompletePool, ...]:
        return tuple(sorted(self._notes))


@dataclass
class _Bulk:
    """Devices counted in bulk: how many, and the smallest few seen (examples)."""

    count: int = 0
    examples: list[DeviceID] = field(default_factory=list)


def _add_bulk(table: dict[Any, _Bulk], key: Any, count: int, examples: Iterable[DeviceID]) -> None:
    found = table.get(key)
    if found is None:
        found = table[key] = _Bulk()
    found.count += count
    found.examples.extend(examples)
    if len(found.examples) > _KEEP:  # only the smallest few can be shown
        found.examples = heapq.nsmallest(MAX_EXAMPLES, set(found.examples))


_KEEP = 64


def _group(
    code: ReasonCode,
    devices: Collection[DeviceID],
    bulk: _Bulk | None = None,
    held: tuple[str, ...] = (),
    fact: Fact | None = None,
) -> RejectionGroup:
    if bulk is None and len(devices) <= MAX_EXAMPLES:
        ordered = sorted(set(devices))  # what nsmallest gives for so few, without its heap
    else:
        ordered = heapq.nsmallest(MAX_EXAMPLES, {*devices, *(bulk.examples if bulk else ())})
    count = len(devices) + (bulk.count if bulk is not None else 0)
    examples = tuple(str(d) for d in ordered)
    return RejectionGroup(code, count, examples, held, fact)


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
