"""`gpualloc.allocator.v1` messages <-> the allocator's values (app/messages.py,
reservations/model.py).

The only allocator module that touches allocator protobuf messages. `*_from_pb` read client
input and raise InvalidArgument with the proto field path (`claims[1].name`,
`allocations[0].allocation.results[2]`); `*_to_pb` never fail.

The core reports field paths of claims in Kubernetes form (`claims[0].spec.devices.requests[0]
.exactly.deviceClassName`); `proto_field_paths()` rewrites them to the request's proto paths
(`claims[0].requests[0].exactly.device_class_name`), so a client can find the field it sent.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from fractions import Fraction

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from protos.allocator.v1 import allocator_pb2 as pb
from protos.common.v1 import dra_pb2, topology_pb2
from services.allocator.app.messages import (
    Accuracy,
    Answer,
    CapacityAnswer,
    GangSpec,
    Holder,
    LeaseOptions,
    Outcome,
    Query,
    claim_ref,
)
from services.allocator.app.reservation_watch import ChangeKind, ReservationChange
from services.allocator.core import (
    NO_SUMMARY,
    CohortStatus,
    ConstraintExplanation,
    Explanation,
    FlavorAttempt,
    FlavorMode,
    FlavorReason,
    NodeMiss,
    NodePlacement,
    PcieRelation,
    Policy,
    QuotaRefusal,
    ReasonCode,
    RejectionGroup,
    RequestExplanation,
    RequestRef,
    Score,
    TenantStatus,
    TopologyConstraint,
    TopologyKind,
)
from services.allocator.reservations.binding import binding_of
from services.allocator.reservations.model import DeviceCondition, Reservation, ReservationState
from services.common.dra.model import (
    AllocationResult,
    DeviceClass,
    DeviceID,
    ResourceClaim,
)
from services.common.dra.names import label_name_errors
from services.common.dra.quantity import Quantity, QuantityFormat
from services.common.errors import FieldViolation, GpuallocError, InvalidArgument, clip
from services.common.grpc_errors import MAX_MESSAGE_CHARS, status_code_of, to_rpc_status
from services.common.pb.dra_mapping import (
    allocation_result_bytes,
    fill_pb_allocation_result,
    from_pb_allocation_result,
    from_pb_device_class,
    from_pb_device_id,
    from_pb_node_selector,
    from_pb_resource_claim,
    has_extras,
    node_selector_field,
    one_device_allocation_pieces,
    to_pb_device_id,
)
from services.common.pb.wire import (
    I64,
    LEN,
    SIZES,
    SIZES_BELOW,
    VARINT,
    cached_string_field,
    counter_field,
    double_field,
    key,
    length_prefixed,
    message_field,
    string_field,
    varint,
    varint_field,
)
from services.common.quota.model import quantity_text
from services.common.security.principal import tenant_of_owner

__all__ = [
    "ClaimReader",
    "request_digest",
    "quota_refusal_to_pb",
    "quota_status_response",
    "BatchReply",
    "allocate_response",
    "allocate_response_bytes",
    "fill_allocate_response",
    "capacity_response",
    "claims_path",
    "explain_response",
    "lease_from_pb",
    "proto_field_paths",
    "query_from_pb",
    "reservation_change_to_pb",
    "reservation_state_from_pb",
    "reservation_to_pb",
    "reserve_claims_from_pb",
]

QueryRequest = pb.AllocateRequest | pb.ExplainRequest | pb.CapacityRequest

_POLICIES = {
    pb.ALLOCATION_POLICY_UNSPECIFIED: None,
    pb.ALLOCATION_POLICY_FIRST_FIT: Policy.FIRST_FIT,
    pb.ALLOCATION_POLICY_BINPACK: Policy.BINPACK,
    pb.ALLOCATION_POLICY_SPREAD: Policy.SPREAD,
    pb.ALLOCATION_POLICY_FRAGMENTATION_AWARE: Policy.FRAGMENTATION_AWARE,
}
_OUTCOMES = {
    Outcome.ALLOCATED: pb.OUTCOME_ALLOCATED,
    Outcome.UNSATISFIABLE: pb.OUTCOME_UNSATISFIABLE,
    Outcome.BUDGET_EXHAUSTED: pb.OUTCOME_BUDGET_EXHAUSTED,
    Outcome.QUOTA_EXCEEDED: pb.OUTCOME_QUOTA_EXCEEDED,
}
_REASONS = {
    ReasonCode.CLASS_SELECTOR: pb.REJECTION_REASON_CLASS_SELECTOR_MISMATCH,
    ReasonCode.REQUEST_SELECTOR: pb.REJECTION_REASON_REQUEST_SELECTOR_MISMATCH,
    ReasonCode.TAINTED: pb.REJECTION_REASON_TAINTED,
    ReasonCode.CAPACITY: pb.REJECTION_REASON_CAPACITY_EXHAUSTED,
    ReasonCode.IN_USE: pb.REJECTION_REASON_IN_USE,
    ReasonCode.PICKED: pb.REJECTION_REASON_PICKED_FOR_OTHER_REQUEST,
    ReasonCode.COUNTERS: pb.REJECTION_REASON_COUNTERS_EXHAUSTED,
    ReasonCode.CONSTRAINT: pb.REJECTION_REASON_CONSTRAINT,
    ReasonCode.EQUIVALENT: pb.REJECTION_REASON_EQUIVALENT,
    ReasonCode.OTHER_NODE: pb.REJECTION_REASON_NODE_MISMATCH,
    ReasonCode.NO_DEVICES: pb.REJECTION_REASON_NODE_MISMATCH,
    ReasonCode.CLAIM_LIMIT: pb.REJECTION_REASON_CLAIM_DEVICE_LIMIT,
    ReasonCode.BINDING_DISABLED: pb.REJECTION_REASON_BINDING_CONDITIONS_DISABLED,
}
_CHANGES = {
    ChangeKind.RESERVED: pb.RESERVATION_CHANGE_KIND_RESERVED,
    ChangeKind.COMMITTED: pb.RESERVATION_CHANGE_KIND_COMMITTED,
    ChangeKind.RENEWED: pb.RESERVATION_CHANGE_KIND_RENEWED,
    ChangeKind.RELEASED: pb.RESERVATION_CHANGE_KIND_RELEASED,
    ChangeKind.EXPIRED: pb.RESERVATION_CHANGE_KIND_EXPIRED,
    ChangeKind.PREEMPTED: pb.RESERVATION_CHANGE_KIND_PREEMPTED,
    ChangeKind.HEARTBEAT: pb.RESERVATION_CHANGE_KIND_HEARTBEAT,
    ChangeKind.CONDITIONS: pb.RESERVATION_CHANGE_KIND_CONDITIONS,
    ChangeKind.BINDING_FAILED: pb.RESERVATION_CHANGE_KIND_BINDING_FAILED,
    ChangeKind.RESYNC: pb.RESERVATION_CHANGE_KIND_RESYNC,
}
_STATES = {
    ReservationState.RESERVED: pb.RESERVATION_STATE_RESERVED,
    ReservationState.COMMITTED: pb.RESERVATION_STATE_COMMITTED,
}
_ACCURACY = {
    Accuracy.EXACT: pb.COUNT_ACCURACY_EXACT,
    Accuracy.LOWER_BOUND: pb.COUNT_ACCURACY_LOWER_BOUND,
}

# --- requests -> values ----------------------------------------------------------------------

_TOPOLOGY_KINDS = {
    pb.TOPOLOGY_CONSTRAINT_KIND_NVLINK_CONNECTED: TopologyKind.NVLINK_CONNECTED,
    pb.TOPOLOGY_CONSTRAINT_KIND_SAME_PCIE_ROOT: TopologyKind.SAME_PCIE_ROOT,
    pb.TOPOLOGY_CONSTRAINT_KIND_SAME_NUMA_NODE: TopologyKind.SAME_NUMA_NODE,
    pb.TOPOLOGY_CONSTRAINT_KIND_GPU_NIC_AFFINITY: TopologyKind.GPU_NIC_AFFINITY,
}


def topology_constraint_from_pb(message: pb.TopologyConstraint, path: str) -> TopologyConstraint:
    """A proto TopologyConstraint; unset enforcement is REQUIRED, unset NIC relation is PXB."""
    kind = _TOPOLOGY_KINDS.get(message.kind)
    if kind is None:
        raise InvalidArgument.at(f"{path}.kind", "must be set to a known topology constraint kind")
    if message.min_nvlink_links < 0:
        raise InvalidArgument.at(f"{path}.min_nvlink_links", "must not be negative")
    relation = PcieRelation.PXB
    if message.max_nic_relation != topology_pb2.PCIE_RELATION_UNSPECIFIED:
        relation = PcieRelation(int(message.max_nic_relation))
    return TopologyConstraint(
        kind=kind,
        requests=tuple(RequestRef(r.request, r.claim) for r in message.requests),
        required=message.enforcement != pb.ENFORCEMENT_PREFERRED,
        min_nvlinks=max(1, message.min_nvlink_links),
        max_nic_relation=relation,
    )


def query_from_pb(request: QueryRequest, claims: ClaimReader | None = None) -> Query:
    """The shared part of Allocate, Explain and Capacity requests; its claims read by `claims`
    (each message afresh without one). Fields a request mostly leaves empty are read only when
    set (every Allocate maps one)."""
    gang = _gang_from_pb(request) if request.HasField("gang") else None
    path = "gang.claims_per_node" if gang is not None else "claims"  # claims_path
    messages = request.gang.claims_per_node if gang is not None else request.claims
    if not messages:
        raise InvalidArgument.at(path, "must not be empty")
    read = tuple(_claim_from_pb(c, f"{path}[{i}]", claims) for i, c in enumerate(messages))
    _check_unique_names(read, path)
    budget = request.budget
    max_steps, max_nodes = budget.max_steps, budget.max_nodes
    if max_steps < 0:
        raise InvalidArgument.at("budget.max_steps", "must not be negative")
    if max_nodes < 0:
        raise InvalidArgument.at("budget.max_nodes", "must not be negative")
    selector = (
        from_pb_node_selector(request.node_selector, "node_selector")
        if request.HasField("node_selector")
        else None
    )
    topology: tuple[TopologyConstraint, ...] = ()
    if request.topology_constraints:
        topology = tuple(
            topology_constraint_from_pb(c, f"topology_constraints[{i}]")
            for i, c in enumerate(request.topology_constraints)
        )
    classes: tuple[DeviceClass, ...] = ()
    if request.device_classes:
        classes = tuple(
            from_pb_device_class(c, f"device_classes[{i}]")
            for i, c in enumerate(request.device_classes)
        )
    return Query(
        claims=read,
        topology_constraints=topology,
        device_classes=classes,
        node=request.node_name,
        node_selector=selector,
        policy=_POLICIES.get(request.policy),
        max_steps=max_steps,
        max_nodes=max_nodes,
        min_generation=request.min_inventory_generation,
        explain=request.explain if isinstance(request, pb.AllocateRequest) else False,
        gang=gang,
    )


class ClaimReader:
    """Reads claim messages as values, each distinct message once: batch systems send the same
    few claim shapes over and over, and reading one costs more than serializing it to look it
    up. Values are immutable, so calls share them; only valid claims are kept (a bad one raises
    with its field path every time). Bounded: at most `max_claims`, the least recently used
    forgotten first, and no claim over `max_claim_bytes` serialized (a client must not be able
    to pin memory with a few huge claims; the defaults keep it under ~4 MiB). The servicer owns
    one; safe to share between threads."""

    def __init__(self, max_claims: int = 512, max_claim_bytes: int = 8192) -> None:
        if max_claims < 1 or max_claim_bytes < 0:
            raise ValueError("max_claims must be >= 1 and max_claim_bytes >= 0")
        self.max_claims = max_claims
        self.max_claim_bytes = max_claim_bytes
        self._read: OrderedDict[bytes, ResourceClaim] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, message: dra_pb2.ResourceClaim, path: str) -> ResourceClaim:
        """The claim of `message`; InvalidArgument at `path` when it is not a valid claim."""
        key = message.SerializeToString(deterministic=True)
        with self._lock:
            claim = self._read.get(key)
            if claim is not None:
                self._read.move_to_end(key)
                return claim
        claim = from_pb_resource_claim(message, path)
        if len(key) <= self.max_claim_bytes:
            with self._lock:
                self._read[key] = claim
                while len(self._read) > self.max_claims:
                    self._read.popitem(last=False)
        return claim

    def kept(self) -> list[bytes]:
        """The serialized claims kept, least recently used first."""
        with self._lock:
            return list(self._read)


def _claim_from_pb(
    message: dra_pb2.ResourceClaim, path: str, claims: ClaimReader | None
) -> ResourceClaim:
    return from_pb_resource_claim(message, path) if claims is None else claims.read(message, path)


def claims_path(request: QueryRequest) -> str:
    """Where the request's claims are: `claims`, or a gang's `gang.claims_per_node`."""
    return "gang.claims_per_node" if request.HasField("gang") else "claims"


def _gang_from_pb(request: QueryRequest) -> GangSpec:
    """The gang's shape; its claims are read as any request's (at `gang.claims_per_node`)."""
    gang = request.gang
    if request.claims:
        raise InvalidArgument.at(
            "claims", "must be empty when gang is set: give the claims in gang.claims_per_node"
        )
    if request.node_name:
        raise InvalidArgument.at(
            "node_name", "must be empty when gang is set: the allocator chooses the gang's nodes"
        )
    if gang.node_count < 1:
        raise InvalidArgument.at("gang.node_count", f"must be at least 1, got {gang.node_count}")
    if gang.group_by_label:
        problems = label_name_errors(gang.group_by_label)
        if problems:
            raise InvalidArgument.at(
                "gang.group_by_label", f"not a label key: {'; '.join(problems)}"
            )
    return GangSpec(node_count=gang.node_count, group_by_label=gang.group_by_label)


def _check_unique_names(claims: Sequence[ResourceClaim], path: str = "claims") -> None:
    seen: set[tuple[str, str]] = set()
    for index, claim in enumerate(claims):
        key = (claim.namespace, claim.name)
        if key in seen:
            raise InvalidArgument.at(
                f"{path}[{index}].name", f"claim {claim.namespace}/{claim.name} appears twice"
            )
        seen.add(key)


def lease_from_pb(
    owner: str,
    lease_ttl: duration_pb2.Duration | None,
    idempotency_key: str = "",
    labels: Mapping[str, str] | None = None,
    request_digest: str = "",
    priority_class: str = "",
    preempt: bool = False,
    max_reservations: int | None = None,
    queued_at: float | None = None,
) -> LeaseOptions:
    return LeaseOptions(
        owner=owner,
        lease_seconds=seconds_from_pb(lease_ttl),
        idempotency_key=idempotency_key,
        labels=tuple(sorted((labels or {}).items())),
        request_digest=request_digest,
        priority_class=priority_class,
        preempt=preempt,
        max_reservations=max_reservations,
        queued_at=queued_at,
    )


MAX_CLOCK_SKEW_SECONDS = 60.0  # a queued time this far ahead of the server's clock is refused


def queued_from_pb(
    request: pb.AllocateRequest | pb.ExplainRequest, now: float, path: str = "queued_time"
) -> float | None:
    """The request's queued time in seconds since the epoch (None when unset); refused when
    out of Timestamp's range or in the future (beyond MAX_CLOCK_SKEW_SECONDS)."""
    if not request.HasField("queued_time"):
        return None
    stamp = request.queued_time
    if not 0 <= stamp.nanos < 1_000_000_000 or not 0 <= stamp.seconds < 253_402_300_800:
        raise InvalidArgument.at(path, "must be a time between 1970 and 9999")
    seconds = stamp.seconds + stamp.nanos / 1e9
    if seconds > now + MAX_CLOCK_SKEW_SECONDS:
        raise InvalidArgument.at(
            path, f"must not be in the future (it is {seconds - now:.0f}s ahead of the server)"
        )
    return seconds


def request_digest(request: pb.AllocateRequest) -> str:
    """What an idempotency key is bound to: the request's placement fields (claims, classes,
    where, how, labels), not its lease, owner, budget or explain flags; deterministic bytes."""
    kept = pb.AllocateRequest()
    kept.CopyFrom(request)
    kept.ClearField("budget")
    kept.ClearField("min_inventory_generation")
    kept.ClearField("explain")
    kept.ClearField("reserve")
    kept.ClearField("lease_ttl")
    kept.ClearField("owner")
    kept.ClearField("idempotency_key")
    kept.ClearField("queued_time")
    return hashlib.sha256(kept.SerializeToString(deterministic=True)).hexdigest()[:32]


def seconds_from_pb(duration: duration_pb2.Duration | None) -> float | None:
    """Seconds of a set Duration; None when unset."""
    if duration is None:
        return None
    return float(duration.seconds) + duration.nanos / 1e9


def reserve_claims_from_pb(
    allocations: Sequence[pb.ClaimAllocation],
) -> list[tuple[str, AllocationResult]]:
    found = []
    for index, item in enumerate(allocations):
        path = f"allocations[{index}]"
        if not item.name:
            raise InvalidArgument.at(f"{path}.name", "must not be empty")
        if not item.HasField("allocation"):
            raise InvalidArgument.at(f"{path}.allocation", "must be set")
        allocation = from_pb_allocation_result(item.allocation, f"{path}.allocation")
        found.append((claim_ref(item.namespace, item.name), allocation))
    return found


def reservation_state_from_pb(value: int) -> ReservationState | None:
    for state, number in _STATES.items():
        if number == value:
            return state
    if value == pb.RESERVATION_STATE_UNSPECIFIED:
        return None
    raise InvalidArgument.at("state", f"unknown reservation state {value}")


# --- core field paths -> proto field paths ---------------------------------------------------

_CAMEL = re.compile(r"(?<=[a-z0-9])([A-Z])")


def proto_path(path: str, claims: str = "claims") -> str:
    """`claims[0].spec.devices.requests[0].exactly.deviceClassName` ->
    `claims[0].requests[0].exactly.device_class_name` (see the module docstring); `claims`
    is where the request's claims are (`gang.claims_per_node` for a gang)."""
    path = re.sub(r"^claims(\[\d+\])(?:\.spec\.devices)?", claims + r"\1", path)
    path = re.sub(r'^classes(\["[^"]*"\])\.spec\.', r"device_classes\1.", path)
    path = path.replace(".cel.expression", ".cel")
    return ".".join(
        part if part.startswith("[") else _CAMEL.sub(lambda m: "_" + m.group(1).lower(), part)
        for part in path.split(".")
    )


@contextmanager
def proto_field_paths(claims: str = "claims") -> Iterator[None]:
    """Rewrite the field paths of an InvalidArgument raised inside to proto paths (`claims`:
    where the request's claims are, see `claims_path`)."""
    try:
        yield
    except InvalidArgument as error:
        if not any(v.path.startswith(("claims[", "classes[")) for v in error.violations):
            raise
        violations = [
            FieldViolation(proto_path(v.path, claims), v.description) for v in error.violations
        ]
        raise InvalidArgument(str(violations[0]), violations) from error


# --- values -> responses ---------------------------------------------------------------------


def batch_item_status(error: GpuallocError, item_path: str) -> pb.BatchItemStatus:
    """A batch item's error as the status an Allocate would have failed with (the same code,
    message and details: services.common.grpc_errors), its field paths under `item_path`."""
    if isinstance(error, InvalidArgument) and error.violations:
        error = InvalidArgument(
            error.message,
            [FieldViolation(f"{item_path}.{v.path}", v.description) for v in error.violations],
        )
    status = to_rpc_status(error, status_code_of(error) or grpc.StatusCode.UNKNOWN)
    message = clip(f"{item_path}: {status.message}", MAX_MESSAGE_CHARS)
    return pb.BatchItemStatus(code=status.code, message=message, details=status.details)


def allocate_response(
    answer: Answer,
    max_nodes: int = 10,
    *,
    gang: bool = False,
    into: pb.AllocateResponse | None = None,
) -> pb.AllocateResponse:
    """`gang`: the request asked for a gang (its placement goes in `gang_placements`, else in
    `node_name` and `allocations`). `into`: an empty message to fill and return (a batch
    item's, inside its reply: built in place, not copied there).

    Written as bytes and parsed into the message once (`allocate_response_bytes`: ~1 us to
    parse against ~20 us field by field for a reservation's answer); an answer holding a map
    field (labels aside) is built field by field (`_fill_allocate_response`)."""
    response = pb.AllocateResponse() if into is None else into
    data = allocate_response_bytes(answer, max_nodes, gang=gang)
    if data is None:
        fill_allocate_response(response, answer, max_nodes, gang=gang)
    else:
        response.SetInParent()  # set even when every field is at its default
        response.MergeFromString(data)
    return response


def fill_allocate_response(
    response: pb.AllocateResponse, answer: Answer, max_nodes: int = 10, *, gang: bool = False
) -> None:
    """allocate_response field by field, into `response` (empty): for an answer
    allocate_response_bytes does not write.

    Built in place, child by child (`add`), each allocation's message made once and copied
    where the response repeats it (its reservations): a message given to a constructor or
    appended is copied, and a batch's reply holds one response per item."""
    response.outcome = _OUTCOMES[answer.outcome]
    response.inventory_generation = answer.generation
    made: dict[int, dra_pb2.AllocationResult] = {}  # the placement's, for its reservations
    single = None if gang else answer.single
    if single is not None:
        response.node_name = single.node or ""
        add = response.allocations.add
        for claim, allocation in zip(answer.claims, single.allocations, strict=False):
            added = add(namespace=claim.namespace, name=claim.name, uid=claim.uid)
            _allocation_into(added.allocation, allocation, made)
        response.score = _score(single.score, answer.policy)
    elif gang and answer.placements:
        response.gang_placements.extend(_node_placement(answer, m) for m in answer.placements)
        response.score = _gang_score(answer, answer.placements)
    for reservation in answer.reservations:
        _fill_reservation(response.reservations.add(), reservation, made)
    # the fields a placement's answer mostly leaves empty are set only when they are not
    if answer.holders:
        response.holders.extend(_holder_to_pb(h) for h in answer.holders)
    if answer.quota:
        response.quota_refusals.extend(quota_refusal_to_pb(r) for r in answer.quota)
    if answer.flavors:
        response.flavors.extend(flavor_attempt_to_pb(a) for a in answer.flavors)
    if answer.preemption:
        response.preemption.CopyFrom(_preemption(answer))
    if answer.explanation is not None:
        response.explanation.CopyFrom(_explanation(answer, max_nodes))


# AllocateResponse's field keys (services.common.pb.wire), by field number
_OUTCOME_FIELDS = {outcome: varint_field(key(1, VARINT), n) for outcome, n in _OUTCOMES.items()}
_NODE_NAME = key(2, LEN)
_ALLOCATIONS = key(3, LEN)
_GANG_PLACEMENTS = key(4, LEN)
_SCORE = key(5, I64)
_EXPLANATION = key(6, LEN)
_RESERVATIONS = key(7, LEN)
_GENERATION = key(8, VARINT)
_HOLDERS = key(9, LEN)
_QUOTA_REFUSALS = key(10, LEN)
_PREEMPTION = key(11, LEN)
_FLAVORS = key(12, LEN)
# ClaimAllocation's
_CLAIM_NAMESPACE, _CLAIM_NAME, _CLAIM_UID, _CLAIM_ALLOCATION = (key(n, LEN) for n in (1, 2, 3, 4))


def allocate_response_bytes(
    answer: Answer, max_nodes: int = 10, *, gang: bool = False
) -> bytes | None:
    """allocate_response's message, serialized, written as bytes (services.common.pb.wire):
    parsed, it is the same message. None when the answer holds a map field other than a
    reservation's labels (an allocation's config or consumed capacity): its order on the wire
    would be the parsed hash table's, not necessarily the one built field by field.

    What an answer repeats (names, a device's entries, a node's selector, a write's times) is
    written once and kept (lru caches keyed by the values: never stale); an allocation the
    reservations repeat (the same object) is written once per answer."""
    if not gang:
        one = _one_device_answer_bytes(answer)
        if one is not None:
            return one
    written: dict[int, bytes] = {}  # ClaimAllocation.allocation fields, by the object's id
    parts = [_OUTCOME_FIELDS[answer.outcome]]
    placements = answer.placements
    if not gang and len(placements) == 1:  # a single node's: node_name and allocations
        single = placements[0]
        parts.append(cached_string_field(_NODE_NAME, single.node or ""))
        claims = answer.claims
        for index, allocation in enumerate(single.allocations):
            if index == len(claims):
                break  # pairs only, as zip (not zip(): it costs more than a field here)
            field = written[id(allocation)] = _allocation_field(allocation)
            if not field:
                return None
            claim = claims[index]
            head = _claim_head(claim.namespace, claim.name, claim.uid)
            parts.append(_ALLOCATIONS + length_prefixed(head + field))
        parts.append(_score_field(single.score, answer.policy))
    elif gang and placements:
        for member in placements:
            if any(allocation_result_bytes(a) is None for a in member.allocations):
                return None
            body = _node_placement(answer, member).SerializeToString()
            parts.append(message_field(_GANG_PLACEMENTS, body))
        parts.append(double_field(_SCORE, _gang_score(answer, placements)))
    if answer.explanation is not None:
        body = _explanation(answer, max_nodes).SerializeToString()
        parts.append(message_field(_EXPLANATION, body))
    for reservation in answer.reservations:
        reserved = _reservation_bytes(reservation, written)
        if reserved is None:
            return None
        parts.append(message_field(_RESERVATIONS, reserved))
    parts.append(varint_field(_GENERATION, answer.generation))
    if answer.holders or answer.quota or answer.preemption or answer.flavors:
        parts.append(_refusal_bytes(answer))
    return b"".join(parts)


def _one_device_answer_bytes(answer: Answer) -> bytes | None:
    """allocate_response_bytes of the answer most placements give, without its loops: one
    claim placed on one device of one node (a result without extras, no config; not asked as
    a gang), at most one reservation, holding the placement's allocation (the same object)
    without labels or conditions, and nothing else (no explanation, holders, refusals). None
    for any other answer.

    The answers of a run of alike items differ only in their node, device, score and
    reservation's id, fencing token and times, and a node takes several of them (8 H100s).
    Everything else (the outcome, node and claim fields, the allocation's request, driver,
    pool and node selector, the reservation's owner, node, state, tenant, priority class and
    idempotency key, the generation, and the nested messages' lengths given the length of the
    device's name) is written once, as the pieces between the varying fields
    (`_one_device_pieces`, kept by those values); per answer the pieces, the device's name and
    the varying fields are joined once. The same bytes as the general writer below
    (tests/unit/allocator/test_allocate_response_bytes.py)."""
    reservations = answer.reservations
    if (
        len(reservations) > 1
        or answer.explanation is not None
        or answer.holders
        or answer.quota
        or answer.preemption
        or answer.flavors
    ):
        return None
    try:  # one of each (a tuple of another length does not unpack)
        (single,) = answer.placements
        (claim,) = answer.claims
        (allocation,) = single.allocations
        (result,) = allocation.results
    except ValueError:
        return None
    if allocation.config or has_extras(result):  # no extras: the device listed (no admin access)
        return None
    selector = allocation.node_selector  # by its bytes (kept by the object): one per node
    selected = b"" if selector is None else node_selector_field(selector)
    device = result.device.encode()
    score = single.score
    scored = (
        _scored(score.free_devices, score.total_devices, answer.policy)
        if score is not None and score.total_devices
        else b""
    )
    pieces_key: tuple[object, ...]
    if not reservations:
        pieces_key = (  # what the pieces depend on (one tuple: it is built per answer)
            answer.outcome,
            single.node,
            claim.namespace,
            claim.name,
            claim.uid,
            answer.generation,
            result.request,
            result.driver,
            result.pool,
            selected,
            len(device),
        )
        pieces = _PIECES.get(pieces_key)
        if pieces is None:
            pieces = _one_device_pieces(pieces_key, answer, len(device))
        return b"".join((pieces[0], device, pieces[1], scored, pieces[7]))
    (reservation,) = reservations
    try:
        (ref,) = reservation.claim_names
        (held,) = reservation.allocations
    except ValueError:
        return None
    if held is not allocation or reservation.labels or reservation.conditions:
        return None
    pieces_key = (  # the same values first, then the reservation's
        answer.outcome,
        single.node,
        claim.namespace,
        claim.name,
        claim.uid,
        answer.generation,
        result.request,
        result.driver,
        result.pool,
        selected,
        len(device),
        ref,
        reservation.owner,
        reservation.redacted,
        reservation.node,
        reservation.state,
        reservation.priority_class,
        reservation.idempotency_key,
    )
    pieces = _PIECES.get(pieces_key)
    if pieces is None:
        pieces = _one_device_pieces(pieces_key, answer, len(device))
    rid = reservation.id.encode()
    size = len(rid)
    id_field = (
        _RESERVATION_ID + (SIZES[size] if size < SIZES_BELOW else varint(size)) + rid
        if size
        else b""
    )
    created_at, expires_at = reservation.created_at, reservation.expires_at
    times = _last_times  # the reservations of a write share their times: the last ones kept
    if times[0] != created_at or times[1] != expires_at:
        times = _keep_times(created_at, expires_at)
    expires, created = times[2], times[3]
    token = reservation.fencing_token  # counter_field's bytes; below 4 KiB without a call
    fencing = (
        _RESERVATION_FENCING_TOKEN + SIZES[token]
        if 0 < token < SIZES_BELOW
        else counter_field(_RESERVATION_FENCING_TOKEN, token)
    )
    size = pieces[8] + len(id_field) + len(expires) + len(fencing) + len(created)
    return b"".join(
        (
            pieces[0],
            device,
            pieces[1],
            scored,
            _RESERVATIONS,
            SIZES[size] if size < SIZES_BELOW else varint(size),
            id_field,
            pieces[2],
            device,
            pieces[3],
            expires,
            fencing,
            pieces[6],
            created,
            pieces[4],
            device,
            pieces[5],
            pieces[7],
        )
    )


def _scored(free: int, total: int, policy: Policy) -> bytes:
    """_share_field, kept by its values (a node's few: its devices free after each answer)."""
    scored = _SCORED.get((free, total, policy))
    if scored is None:
        if len(_SCORED) >= _SCORED_KEPT:
            _SCORED.clear()
        scored = _SCORED[free, total, policy] = _share_field(free, total, policy)
    return scored


_SCORED: dict[tuple[int, int, Policy], bytes] = {}
_SCORED_KEPT = 4096  # (free, total) of nodes of up to ~20 devices, each policy: then started again


def _keep_times(
    created_at: float, expires_at: float | None
) -> tuple[float, float | None, bytes, bytes]:
    """_reservation_times', kept as the last ones (_last_times) with their values."""
    global _last_times
    _last_times = times = (created_at, expires_at, *_reservation_times(created_at, expires_at))
    return times


_last_times: tuple[float, float | None, bytes, bytes] = (math.nan, None, b"", b"")  # none yet


_Pieces = tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, int]
"""_one_device_pieces': the answer's fields before its device's name (up to the name's
length, in its claim's allocation), after it up to the score; with a reservation, the
reservation's fields after its id up to its device's name, after it up to its expiry time,
after its created time up to the name again (in its devices), after that; its idempotency key
field; then the answer's generation field; the size of the reservation's fields but its id,
fencing token and times (the name's twice included)."""

_PIECES: dict[tuple[object, ...], _Pieces] = {}
"""_one_device_pieces', by the values they are written from (_one_device_answer_bytes; the
node selector by its bytes, which node_selector_field keeps by the object: a solve may make a
new, equal selector object per answer): never stale."""
_PIECES_KEPT = 8192  # ~ one per node a request is placed on: then started again


def _one_device_pieces(pieces_key: tuple[object, ...], answer: Answer, size: int) -> _Pieces:
    """The pieces of `answer` (one of _one_device_answer_bytes'), whose device's name is
    `size` bytes long, kept in _PIECES under `pieces_key`."""
    single = answer.placements[0]
    allocation = single.allocations[0]
    result = allocation.results[0]
    claim = answer.claims[0]
    # the ClaimAllocation.allocation field: `allocated`, the name, `after_device`
    before_device, after_device = one_device_allocation_pieces(
        result.request, result.driver, result.pool, allocation.node_selector, size
    )
    body = len(before_device) + size + len(after_device)
    allocated = _CLAIM_ALLOCATION + varint(body) + before_device
    field = len(allocated) + size + len(after_device)
    claim_head = _claim_head(claim.namespace, claim.name, claim.uid)
    placed = (
        _OUTCOME_FIELDS[answer.outcome]
        + cached_string_field(_NODE_NAME, single.node or "")
        + _ALLOCATIONS
        + varint(len(claim_head) + field)
        + claim_head
        + allocated
    )
    generation = varint_field(_GENERATION, answer.generation)
    pieces: _Pieces
    if not answer.reservations:
        pieces = (
            placed,
            after_device,
            b"",
            b"",
            b"",
            b"",
            b"",
            generation,
            0,
        )
    else:
        reservation = answer.reservations[0]
        ref_head = _claim_ref_head(reservation.claim_names[0])
        held = (
            _owner_and_node("" if reservation.redacted else reservation.owner, reservation.node)
            + _RESERVATION_ALLOCATIONS
            + varint(len(ref_head) + field)
            + ref_head
            + allocated
        )
        stated = after_device + _RESERVATION_STATES[reservation.state]
        device_id = _device_head(result.driver, result.pool) + (
            _THIRD + varint(size) if size else b""
        )
        listed = _RESERVATION_DEVICES + varint(len(device_id) + size) + device_id
        tail = _reservation_tail(
            reservation.owner, reservation.priority_class, pb.BINDING_PHASE_UNSPECIFIED
        )
        idempotency_key = string_field(_RESERVATION_IDEMPOTENCY_KEY, reservation.idempotency_key)
        fixed = len(held) + len(stated) + len(listed) + len(tail) + len(idempotency_key)
        pieces = (
            placed,
            after_device,
            held,
            stated,
            listed,
            tail,
            idempotency_key,
            generation,
            fixed + 2 * size,
        )
    if len(_PIECES) >= _PIECES_KEPT:
        _PIECES.clear()
    _PIECES[pieces_key] = pieces
    return pieces


class BatchReply:
    """An AllocateBatchResponse assembled item by item, in order. An item written as bytes
    (`add_response`, `add_error`) waits, and the ones waiting are parsed into the reply in one
    go (one parse per reply, not one per item) or sent as they are (`serialized`); an item
    built field by field (`add_in_place`) goes in place, after the ones waiting (a map field's
    order is its table's: see allocate_response_bytes)."""

    def __init__(self) -> None:
        self._reply = pb.AllocateBatchResponse()
        self._written: list[bytes] = []  # AllocateBatchResponse.items fields, not parsed yet
        self._waiting = 0  # the items in them
        self._labelled = False  # an item written as bytes holds a map (a reservation's labels)

    def add_answer(self, answer: Answer, *, gang: bool = False) -> None:
        """An item whose answer is `answer` (`gang`: as allocate_response): written as bytes
        (_one_device_answer_bytes, else allocate_response_bytes), or in place when it cannot
        be. An answer holding labels is written as bytes too, but then the reply is sent as
        the message parsed from them serializes it (`serialized`): a map's order on the wire
        is its table's."""
        written = None if gang else _one_device_answer_bytes(answer)  # no labels
        if written is None:
            written = allocate_response_bytes(answer, gang=gang)
            if written is None:
                fill_allocate_response(self.add_in_place().response, answer, gang=gang)
                return
            for reservation in answer.reservations:
                if reservation.labels:
                    self._labelled = True
        self.add_response(written)

    def add_one_device(self, answer: Answer) -> bool:
        """add_answer of an answer _one_device_answer_bytes writes (not asked as a gang), and
        True; False, nothing added, for any other. The common item's one call, where
        add_answer's takes three (a batch of 64 one-H100 items' every answer)."""
        written = _one_device_answer_bytes(answer)
        if written is None:
            return False
        size = len(written)  # as add_response
        self._written += (
            _ITEM_HEADS[size] if size < _ITEM_HEADS_BELOW else _item_head(size),
            written,
        )
        self._waiting += 1
        return True

    def __len__(self) -> int:
        return len(self._reply.items) + self._waiting

    def add_response(self, response: bytes) -> None:
        """An item whose answer is `response` (allocate_response_bytes): its prefixes (the
        item's key and length, the response's) written before it, in one piece below 4 KiB
        (`_ITEM_HEADS`), the response not copied (the reply's join copies it once)."""
        size = len(response)
        if size < _ITEM_HEADS_BELOW:
            self._written += (_ITEM_HEADS[size], response)
        else:
            self._written += (_item_head(size), response)
        self._waiting += 1

    def add_error(self, status: pb.BatchItemStatus) -> None:
        """An item that met the error `status`."""
        error = status.SerializeToString()
        self._written.append(_BATCH_ITEMS + length_prefixed(_ITEM_ERROR + length_prefixed(error)))
        self._waiting += 1

    def add_in_place(self) -> pb.AllocateBatchItem:
        """An item to fill: the reply's next, empty."""
        self._parse_written()
        return self._reply.items.add()

    def done(self) -> pb.AllocateBatchResponse:
        """The reply, every item in it."""
        self._parse_written()
        return self._reply

    def serialized(self) -> bytes:
        """The reply serialized: done()'s message's bytes. The items written as bytes joined
        as they are, not parsed (after the ones built in place: the reply has no other field,
        so its bytes are its items' in order); parsed first when one holds labels (add_answer)."""
        if self._labelled:
            return self.done().SerializeToString()
        written = b"".join(self._written)
        if not len(self._reply.items):
            return written
        return self._reply.SerializeToString() + written

    def _parse_written(self) -> None:
        if self._written:
            self._reply.MergeFromString(b"".join(self._written))  # appends to `items`
            self._written.clear()
            self._waiting = 0


_BATCH_ITEMS = key(1, LEN)  # AllocateBatchResponse.items
_ITEM_RESPONSE, _ITEM_ERROR = key(1, LEN), key(2, LEN)  # AllocateBatchItem's oneof


def _item_head(size: int) -> bytes:
    """What goes before an item's response of `size` bytes: AllocateBatchResponse.items' key
    and the item's length, AllocateBatchItem.response's key and the response's length."""
    response = _ITEM_RESPONSE + varint(size)
    return _BATCH_ITEMS + varint(len(response) + size) + response


_ITEM_HEADS_BELOW = SIZES_BELOW
_ITEM_HEADS = tuple(_item_head(size) for size in range(_ITEM_HEADS_BELOW))
"""_item_head of each size below _ITEM_HEADS_BELOW (4 KiB: an answer's), to look up."""


def _refusal_bytes(answer: Answer) -> bytes:
    """Fields 9-12 of an answer: its holders, quota refusals, preemption, flavors."""
    parts = [message_field(_HOLDERS, _holder_to_pb(h).SerializeToString()) for h in answer.holders]
    for refusal in answer.quota:
        parts.append(
            message_field(_QUOTA_REFUSALS, quota_refusal_to_pb(refusal).SerializeToString())
        )
    if answer.preemption:
        parts.append(message_field(_PREEMPTION, _preemption(answer).SerializeToString()))
    for attempt in answer.flavors:
        parts.append(message_field(_FLAVORS, flavor_attempt_to_pb(attempt).SerializeToString()))
    return b"".join(parts)


def _allocation_field(allocation: AllocationResult) -> bytes:
    """ClaimAllocation.allocation set to `allocation`; empty when it holds a map field."""
    body = allocation_result_bytes(allocation)
    return b"" if body is None else _CLAIM_ALLOCATION + length_prefixed(body)


@functools.lru_cache(maxsize=4096)
def _claim_head(namespace: str, name: str, uid: str) -> bytes:
    """A ClaimAllocation's fields before its allocation: the claim's namespace, name, uid."""
    return (
        string_field(_CLAIM_NAMESPACE, namespace)
        + string_field(_CLAIM_NAME, name)
        + string_field(_CLAIM_UID, uid)
    )


def explain_response(
    answer: Answer, max_nodes: int = 10, *, gang: bool = False
) -> pb.ExplainResponse:
    """`gang`: as for allocate_response."""
    single = None if gang else answer.single
    response = pb.ExplainResponse(
        outcome=_OUTCOMES[answer.outcome],
        node_name=single.node or "" if single is not None else "",
        allocations=_claim_allocations(
            answer.claims, single.allocations if single is not None else ()
        ),
        gang_placements=[_node_placement(answer, m) for m in answer.placements if gang],
        inventory_generation=answer.generation,
        holders=[_holder_to_pb(h) for h in answer.holders],
        quota_refusals=[quota_refusal_to_pb(r) for r in answer.quota],
        flavors=[flavor_attempt_to_pb(a) for a in answer.flavors],
    )
    if answer.preemption:
        response.preemption.CopyFrom(_preemption(answer))
    response.explanation.CopyFrom(_explanation(answer, max_nodes))
    return response


_FLAVOR_MODES = {
    FlavorMode.NO_FIT: pb.FLAVOR_MODE_NO_FIT,
    FlavorMode.NO_CANDIDATES: pb.FLAVOR_MODE_NO_CANDIDATES,
    FlavorMode.PREEMPT: pb.FLAVOR_MODE_PREEMPT,
    FlavorMode.RECLAIM: pb.FLAVOR_MODE_RECLAIM,
    FlavorMode.FIT: pb.FLAVOR_MODE_FIT,
}
_FLAVOR_REFUSALS = {
    FlavorReason.UNTOLERATED_TAINT: pb.FLAVOR_REFUSAL_UNTOLERATED_TAINT,
    FlavorReason.NO_DEVICES: pb.FLAVOR_REFUSAL_NO_DEVICES,
    FlavorReason.CHARGED_ELSEWHERE: pb.FLAVOR_REFUSAL_CHARGED_ELSEWHERE,
    FlavorReason.ABOVE_MAX: pb.FLAVOR_REFUSAL_ABOVE_MAX,
    FlavorReason.DEVICES_IN_USE: pb.FLAVOR_REFUSAL_DEVICES_IN_USE,
    FlavorReason.QUOTA: pb.FLAVOR_REFUSAL_QUOTA,
}


def flavor_attempt_to_pb(attempt: FlavorAttempt[None]) -> pb.FlavorAttempt:
    return pb.FlavorAttempt(
        resource=attempt.resource,
        flavor=attempt.flavor,
        mode=_FLAVOR_MODES[attempt.mode],
        borrowing=attempt.borrows,
        reason=_FLAVOR_REFUSALS.get(attempt.reason, pb.FLAVOR_REFUSAL_UNSPECIFIED)
        if attempt.reason is not None
        else pb.FLAVOR_REFUSAL_UNSPECIFIED,
        message=attempt.message,
        chosen=attempt.chosen,
    )


def _preemption(answer: Answer) -> pb.Preemption:
    return pb.Preemption(
        victims=[
            pb.PreemptionVictim(
                holder=_holder_to_pb(victim.holder),
                priority_class_name=victim.priority_class,
                reason=victim.reason,
                moved_to_node=victim.moved_to_node,
                replacement_reservation_id=victim.replacement_id,
            )
            for victim in answer.preemption
        ]
    )


def quota_refusal_to_pb(refusal: QuotaRefusal) -> pb.QuotaRefusal:
    def text(milli: int) -> str:
        return quantity_text(milli, refusal.binary)

    return pb.QuotaRefusal(
        tenant=refusal.tenant,
        resource=refusal.resource,
        cohort=refusal.cohort,
        requested=text(refusal.requested),
        used=text(refusal.used),
        nominal=text(refusal.nominal),
        borrowed=text(refusal.borrowed),
        left=text(refusal.left),
    )


def quota_status_response(
    rows: Sequence[TenantStatus],
    enabled: bool,
    cohorts: Sequence[CohortStatus] = (),
    fair_sharing: bool = False,
) -> pb.QuotaStatusResponse:
    def limit(milli: int | None, binary: bool) -> str:
        return "" if milli is None else quantity_text(milli, binary)

    def decayed(row: TenantStatus) -> str:
        if row.decayed is None:
            return ""
        return quantity_text(round(row.decayed), row.binary)

    def score(value: float | None, configured: bool) -> str:
        if not configured:
            return ""
        return "inf" if value is None else f"{value:.6g}"

    return pb.QuotaStatusResponse(
        enabled=enabled,
        fair_sharing=fair_sharing,
        tenants=[
            pb.TenantQuotaStatus(
                tenant=row.tenant,
                resource=row.resource,
                cohort=row.cohort,
                nominal=quantity_text(row.nominal, row.binary),
                used=quantity_text(row.used, row.binary),
                borrowed=quantity_text(row.borrowed, row.binary),
                lent=quantity_text(row.lent, row.binary),
                left=quantity_text(row.left, row.binary),
                borrowing_limit=limit(row.borrowing_limit, row.binary),
                lending_limit=limit(row.lending_limit, row.binary),
                pending_preemptions=row.pending_preemptions,
                pending_preemption_ids=row.pending_preemption_ids,
                cohort_path=row.path,
                fair_sharing_weight=weight_text(row.weight),
                weighted_share=row.share.rounded(),
                dominant_resource=row.share.dominant,
                decayed_used=decayed(row),
                decayed_usage=score(row.decayed_usage, row.decayed is not None),
                decayed_at=None if row.decayed_at is None else _timestamp(row.decayed_at),
            )
            for row in rows
        ],
        cohorts=[
            pb.CohortQuotaStatus(
                cohort=row.cohort,
                resource=row.resource,
                cohort_path=row.path,
                nominal=quantity_text(row.nominal, row.binary),
                subtree_quota=quantity_text(row.subtree, row.binary),
                used=quantity_text(row.used, row.binary),
                borrowed=quantity_text(row.borrowed, row.binary),
                lent=quantity_text(row.lent, row.binary),
                left=quantity_text(row.left, row.binary),
                borrowing_limit=limit(row.borrowing_limit, row.binary),
                lending_limit=limit(row.lending_limit, row.binary),
                fair_sharing_weight=weight_text(row.weight),
                weighted_share=row.share.rounded(),
                dominant_resource=row.share.dominant,
            )
            for row in cohorts
        ],
    )


def weight_text(weight: Fraction) -> str:
    """A fair-sharing weight as a Kubernetes quantity (`1`, `500m`)."""
    return str(Quantity.of(weight, QuantityFormat.DECIMAL_SI))


def capacity_response(answer: CapacityAnswer) -> pb.CapacityResponse:
    response = _capacity_counts(answer)
    if answer.quota:
        response.quota.extend(quota_status_response(answer.quota, True).tenants)
    if answer.within_quota is not None:
        response.total_within_quota = answer.within_quota
    return response


def _capacity_counts(answer: CapacityAnswer) -> pb.CapacityResponse:
    return pb.CapacityResponse(
        total=answer.total,
        accuracy=_ACCURACY[answer.accuracy],
        nodes=[
            pb.NodeCapacity(node_name=n.node, count=n.count, accuracy=_ACCURACY[n.accuracy])
            for n in answer.nodes
        ],
        models=[
            pb.ModelCapacity(product_name=name, count=count)
            for name, count in sorted(answer.models.items())
        ],
        inventory_generation=answer.generation,
    )


def reservation_change_to_pb(change: ReservationChange) -> pb.WatchReservationsResponse:
    return pb.WatchReservationsResponse(
        kind=_CHANGES[change.kind],
        reservation_id=change.reservation_id,
        node_name=change.node,
        owner=change.owner,
        fencing_token=change.fencing_token,
        preempted_by=change.preempted_by,
    )


def reservation_to_pb(reservation: Reservation) -> pb.Reservation:
    message = pb.Reservation()
    _fill_reservation(message, reservation)
    return message


def _fill_reservation(
    message: pb.Reservation,
    reservation: Reservation,
    made: dict[int, dra_pb2.AllocationResult] | None = None,
) -> None:
    """Write `reservation` into `message`, an empty one (in place, as allocate_response);
    `made`: the allocations' messages already written in this response, by the object's id.
    Fields left at their default are not set (the wire is the same)."""
    message.id = reservation.id
    if not reservation.redacted:
        message.owner = reservation.owner
    message.tenant = tenant_of_owner(reservation.owner)
    message.node_name = reservation.node
    add = message.allocations.add
    for ref, allocation in zip(reservation.claim_names, reservation.allocations, strict=True):
        namespace, _, name = ref.rpartition("/")
        _allocation_into(add(namespace=namespace, name=name).allocation, allocation, made)
    message.state = _STATES[reservation.state]
    message.fencing_token = reservation.fencing_token
    if reservation.idempotency_key:
        message.idempotency_key = reservation.idempotency_key
    add_device = message.devices.add
    for driver, pool, device in _devices(reservation.allocations):
        add_device(driver=driver, pool=pool, device=device)
    if reservation.priority_class:
        message.priority_class_name = reservation.priority_class
    binding = _binding_phase(reservation)
    if binding != pb.BINDING_PHASE_UNSPECIFIED:
        message.binding = binding
    if reservation.labels:
        message.labels.update(reservation.labels)
    if reservation.conditions:
        message.conditions.extend(_condition_to_pb(c) for c in reservation.conditions)
    # as Timestamp.FromNanoseconds(round(seconds * 1e9)) sets them, without its call chain
    stamp = message.created_at
    stamp.seconds, stamp.nanos = divmod(round(reservation.created_at * 1e9), _NANOS)
    if reservation.expires_at is not None:
        stamp = message.expires_at
        stamp.seconds, stamp.nanos = divmod(round(reservation.expires_at * 1e9), _NANOS)


_NANOS = 1_000_000_000  # in a second

# Reservation's field keys (services.common.pb.wire), by field number
_RESERVATION_ID = key(1, LEN)
_RESERVATION_OWNER = key(2, LEN)
_RESERVATION_NODE = key(3, LEN)
_RESERVATION_ALLOCATIONS = key(4, LEN)
_RESERVATION_STATES = {state: varint_field(key(5, VARINT), n) for state, n in _STATES.items()}
_RESERVATION_EXPIRES_AT = key(6, LEN)
_RESERVATION_FENCING_TOKEN = key(7, VARINT)
_RESERVATION_IDEMPOTENCY_KEY = key(8, LEN)
_RESERVATION_CREATED_AT = key(9, LEN)
_RESERVATION_DEVICES = key(11, LEN)
_RESERVATION_LABELS = key(12, LEN)
_RESERVATION_TENANT = key(13, LEN)
_RESERVATION_PRIORITY_CLASS = key(14, LEN)
_RESERVATION_BINDING = key(15, VARINT)
_RESERVATION_CONDITIONS = key(16, LEN)
_FIRST, _SECOND, _THIRD = (key(n, LEN) for n in (1, 2, 3))  # a DeviceID's, a map entry's
_SECONDS, _NANOS_FIELD = key(1, VARINT), key(2, VARINT)  # a Timestamp's


def _reservation_bytes(reservation: Reservation, written: dict[int, bytes]) -> bytes | None:
    """`_fill_reservation`'s message, serialized, written as bytes (as allocate_response_bytes,
    None for a map field). `written`: the ClaimAllocation.allocation fields already written
    for this answer, by the allocation object's id (a reservation repeats the placement's
    objects).

    Written with plain loops and appends: zip(strict=True) and a star-unpacked generator cost
    more than the fields here (64 reservations per AllocateBatch)."""
    refs, allocations = reservation.claim_names, reservation.allocations
    if len(refs) != len(allocations):
        raise ValueError(f"reservation {reservation.id}: claims and allocations differ in number")
    parts = [
        string_field(_RESERVATION_ID, reservation.id),
        _owner_and_node("" if reservation.redacted else reservation.owner, reservation.node),
    ]
    for index, allocation in enumerate(allocations):
        field = written.get(id(allocation)) or _allocation_field(allocation)
        if not field:
            return None
        parts.append(
            _RESERVATION_ALLOCATIONS + length_prefixed(_claim_ref_head(refs[index]) + field)
        )
    parts.append(_RESERVATION_STATES[reservation.state])
    expires, created = _reservation_times(reservation.created_at, reservation.expires_at)
    parts.append(expires)
    parts.append(counter_field(_RESERVATION_FENCING_TOKEN, reservation.fencing_token))
    if reservation.idempotency_key:
        parts.append(string_field(_RESERVATION_IDEMPOTENCY_KEY, reservation.idempotency_key))
    parts.append(created)
    parts.append(_devices_bytes(allocations))
    for label, value in reservation.labels:
        parts.append(_label_field(label, value))
    binding = _binding_phase(reservation)
    parts.append(_reservation_tail(reservation.owner, reservation.priority_class, binding))
    for condition in reservation.conditions:
        body = _condition_to_pb(condition).SerializeToString()
        parts.append(message_field(_RESERVATION_CONDITIONS, body))
    return b"".join(parts)


@functools.lru_cache(maxsize=4096)
def _claim_ref_head(ref: str) -> bytes:
    """A reservation's ClaimAllocation's fields before its allocation, from `namespace/name`."""
    namespace, _, name = ref.rpartition("/")
    return _claim_head(namespace, name, "")


@functools.lru_cache(maxsize=4096)
def _owner_and_node(owner: str, node: str) -> bytes:
    """A reservation's owner (empty: not shown) and node fields."""
    return string_field(_RESERVATION_OWNER, owner) + string_field(_RESERVATION_NODE, node)


@functools.lru_cache(maxsize=1024)
def _reservation_times(created_at: float, expires_at: float | None) -> tuple[bytes, bytes]:
    """A reservation's expires_at field (empty: none) and created_at field (the reservations
    of one write share their times: written once)."""
    expires = b"" if expires_at is None else _timestamp_field(_RESERVATION_EXPIRES_AT, expires_at)
    return expires, _timestamp_field(_RESERVATION_CREATED_AT, created_at)


def _timestamp_field(field_key: bytes, seconds: float) -> bytes:
    """A Timestamp field, as Timestamp.FromNanoseconds(round(seconds * 1e9)) sets it."""
    whole, nanos = divmod(round(seconds * 1e9), _NANOS)
    return message_field(
        field_key, varint_field(_SECONDS, whole) + varint_field(_NANOS_FIELD, nanos)
    )


def _devices_bytes(allocations: Sequence[AllocationResult]) -> bytes:
    """Reservation.devices: `_devices`, each a field."""
    if len(allocations) == 1 and len(allocations[0].results) == 1:  # one claim, one device
        result = allocations[0].results[0]
        if result.admin_access:
            return b""
        return _device_field(result.driver, result.pool, result.device)
    return b"".join(_device_field(*device) for device in _devices(allocations))


def _device_field(driver: str, pool: str, device: str) -> bytes:
    """Reservation.devices' element for a device: the fields a node's devices share (driver,
    pool) written once per node, then the device's name."""
    body = _device_head(driver, pool) + cached_string_field(_THIRD, device)
    return _RESERVATION_DEVICES + length_prefixed(body)


@functools.lru_cache(maxsize=16384)
def _device_head(driver: str, pool: str) -> bytes:
    """A DeviceID's fields before its device's name."""
    return cached_string_field(_FIRST, driver) + cached_string_field(_SECOND, pool)


def _label_field(label: str, value: str) -> bytes:
    """One entry of Reservation.labels (a map entry writes its key and value, even empty)."""
    entry = _FIRST + length_prefixed(label.encode()) + _SECOND + length_prefixed(value.encode())
    return message_field(_RESERVATION_LABELS, entry)


@functools.lru_cache(maxsize=4096)
def _reservation_tail(owner: str, priority_class: str, binding: int) -> bytes:
    """A reservation's tenant, priority class and binding phase fields."""
    return (
        string_field(_RESERVATION_TENANT, tenant_of_owner(owner))
        + string_field(_RESERVATION_PRIORITY_CLASS, priority_class)
        + varint_field(_RESERVATION_BINDING, binding)
    )


def _binding_phase(reservation: Reservation) -> pb.BindingPhase.ValueType:
    if not _has_binding_conditions(reservation.allocations):
        return pb.BINDING_PHASE_UNSPECIFIED  # binding_of's `required` is False: no conditions
    binding = binding_of(reservation, 0.0)  # bound or not does not depend on the timeout
    if not binding.required:
        return pb.BINDING_PHASE_UNSPECIFIED
    return pb.BINDING_PHASE_BOUND if binding.bound else pb.BINDING_PHASE_BINDING


def _has_binding_conditions(allocations: Sequence[AllocationResult]) -> bool:
    for allocation in allocations:  # loops, not any(): one per answer, 64 per batch
        for result in allocation.results:
            if result.binding_conditions:
                return True
    return False


def _condition_to_pb(condition: DeviceCondition) -> pb.DeviceCondition:
    driver, _, rest = condition.device.partition("/")
    pool, _, device = rest.partition("/")
    return pb.DeviceCondition(
        device=to_pb_device_id(DeviceID(driver, pool, device)),
        type=condition.type,
        status=condition.status,
    )


def device_conditions_from_pb(
    messages: Sequence[pb.DeviceCondition],
) -> tuple[DeviceCondition, ...]:
    """ReportDeviceConditions' conditions; the service checks devices and types."""
    conditions = []
    for index, message in enumerate(messages):
        path = f"conditions[{index}]"
        if not message.HasField("device"):
            raise InvalidArgument.at(f"{path}.device", "must be set")
        device = from_pb_device_id(message.device, f"{path}.device")
        conditions.append(DeviceCondition(str(device), message.type, message.status))
    return tuple(conditions)


def _claim_allocations(
    claims: Sequence[ResourceClaim], allocations: Sequence[AllocationResult]
) -> list[pb.ClaimAllocation]:
    messages = []
    for claim, allocation in zip(claims, allocations, strict=False):
        message = pb.ClaimAllocation(namespace=claim.namespace, name=claim.name, uid=claim.uid)
        fill_pb_allocation_result(message.allocation, allocation)
        messages.append(message)
    return messages


def _allocation_into(
    message: dra_pb2.AllocationResult,
    allocation: AllocationResult,
    made: dict[int, dra_pb2.AllocationResult] | None,
) -> None:
    """Write `allocation` into `message` (empty); made once per response and copied after (a
    reservation repeats the placement's allocations: the same objects)."""
    found = made.get(id(allocation)) if made is not None else None
    if found is not None:
        message.CopyFrom(found)
        return
    fill_pb_allocation_result(message, allocation)
    if made is not None:
        made[id(allocation)] = message


def _node_placement(answer: Answer, member: NodePlacement) -> pb.NodePlacement:
    return pb.NodePlacement(
        node_name=member.node or "",
        allocations=_claim_allocations(answer.claims, member.allocations),
        score=_score(member.score, answer.policy),
    )


def _gang_score(answer: Answer, members: Sequence[NodePlacement]) -> float:
    """A gang's score: the mean of its members' (0 for members replayed from reservations)."""
    return sum(_score(m.score, answer.policy) for m in members) / len(members)


def _devices(allocations: Sequence[AllocationResult]) -> list[tuple[str, str, str]]:
    """The devices held, as (driver, pool, device), sorted (as DeviceIDs sort), once each."""
    if len(allocations) == 1 and len(allocations[0].results) == 1:  # one claim, one device
        result = allocations[0].results[0]
        return [] if result.admin_access else [(result.driver, result.pool, result.device)]
    return sorted(
        {(r.driver, r.pool, r.device) for a in allocations for r in a.results if not r.admin_access}
    )


def _holder_to_pb(holder: Holder) -> pb.Holder:
    message = pb.Holder(
        reservation_id=holder.reservation_id,
        owner="" if holder.redacted else holder.owner,
        tenant=tenant_of_owner(holder.owner),
        node_name=holder.node,
        state=_STATES[holder.state],
        devices=[to_pb_device_id(d) for d in holder.devices],
    )
    if holder.expires_at is not None:
        message.expires_at.CopyFrom(_timestamp(holder.expires_at))
    return message


def _score(score: Score | None, policy: Policy) -> float:
    """Higher is better: the used share of the node after the placement (BINPACK, FIRST_FIT),
    the free share (SPREAD)."""
    if score is None or score.total_devices == 0:
        return 0.0
    return _share(score.free_devices, score.total_devices, policy)


def _share(free: int, total: int, policy: Policy) -> float:
    """_score's share of a node with `free` of its `total` (> 0) devices free after it."""
    # int / int is correctly rounded, as float(Fraction(...)) is: the same float, without
    # the Fraction arithmetic (one per answer, 64 per AllocateBatch of 64)
    return (free if policy.rules.scores_free_share else total - free) / total


def _score_field(score: Score | None, policy: Policy) -> bytes:
    """AllocateResponse.score set to _score's (nothing when it is 0.0)."""
    if score is None or score.total_devices == 0:
        return b""
    return _share_field(score.free_devices, score.total_devices, policy)


@functools.lru_cache(maxsize=1024)
def _share_field(free: int, total: int, policy: Policy) -> bytes:
    return double_field(_SCORE, _share(free, total, policy))


def _timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromNanoseconds(round(seconds * 1e9))
    return stamp


# --- explanations ----------------------------------------------------------------------------


def _explanation(answer: Answer, max_nodes: int) -> pb.Explanation:
    explanation = answer.explanation or Explanation(summary=NO_SUMMARY)
    message = pb.Explanation(
        requests=[_request(r) for r in explanation.requests],
        constraints=[_constraint(c) for c in explanation.constraints],
        nodes=[_node(n) for n in explanation.nodes[:max_nodes]],
        messages=explanation.lines(max_nodes),
    )
    stats = answer.stats
    message.stats.CopyFrom(
        pb.SearchStats(
            steps=stats.steps if stats else 0,
            cel_evaluations=stats.cel_evaluations if stats else 0,
            cel_cache_hits=answer.cel_cache_hits,
            nodes_considered=stats.nodes_total if stats else 0,
        )
    )
    message.stats.elapsed.FromTimedelta(timedelta(seconds=answer.elapsed_seconds))
    return message


def _request_ref(claim_label: str, request: str) -> pb.RequestRef:
    return pb.RequestRef(claim=claim_label.rpartition("/")[2], request=request)


def _request(request: RequestExplanation) -> pb.RequestExplanation:
    name, _, sub = request.request.partition("/")
    return pb.RequestExplanation(
        request=_request_ref(request.claim, name),
        sub_request=sub,
        considered=request.considered,
        rejections=[_rejection(g) for g in request.rejections],
    )


def _rejection(group: RejectionGroup) -> pb.RejectionGroup:
    return pb.RejectionGroup(
        reason=_REASONS.get(group.code, pb.REJECTION_REASON_UNSPECIFIED),
        message=group.message(),
        count=group.count,
        example_devices=[_device_id(text) for text in group.examples],
    )


def _device_id(text: str) -> dra_pb2.DeviceID:
    """`driver/pool/device` (a pool name may hold slashes; drivers and devices do not)."""
    driver, _, rest = text.partition("/")
    pool, _, device = rest.rpartition("/")
    return dra_pb2.DeviceID(driver=driver, pool=pool, device=device)


def _constraint(constraint: ConstraintExplanation) -> pb.ConstraintExplanation:
    return pb.ConstraintExplanation(
        source=pb.CONSTRAINT_SOURCE_CLAIM,
        claim=constraint.claim.rpartition("/")[2],
        index=constraint.index,
        rejections=sum(g.count for g in constraint.problems),
        message=constraint.message(),
    )


def _node(miss: NodeMiss) -> pb.NodeExplanation:
    message = pb.NodeExplanation(
        node_name=miss.node or "",
        missing_devices=max(0, miss.request_needed - miss.request_placed),
        message=miss.message(),
    )
    if miss.request:
        message.unsatisfied_requests.append(_request_ref(miss.claim, miss.request))
    return message
