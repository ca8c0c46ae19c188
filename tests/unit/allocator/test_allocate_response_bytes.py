"""An Allocate's answer written as bytes (mapping.allocate_response_bytes, BatchReply) is the
answer built field by field (fill_allocate_response): the same bytes on the wire, over
generated answers — MIG-like multi-result allocations, several claims and reservations, gangs,
admin access, tolerations, shares, binding conditions, labels, redacted and committed
reservations, refusals — and an answer with a map field other than labels (a config's opaque
parameters, a consumed capacity) is left to the field-by-field builder."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protos.allocator.v1 import allocator_pb2 as pb
from services.allocator.adapters.grpc.mapping import (
    BatchReply,
    _one_device_answer_bytes,
    _scored,
    _share_field,
    allocate_response,
    allocate_response_bytes,
    batch_item_status,
    fill_allocate_response,
)
from services.allocator.app.messages import Answer, Holder, Outcome, Victim
from services.allocator.core import (
    NO_SUMMARY,
    Explanation,
    FlavorAttempt,
    FlavorMode,
    FlavorReason,
    NodePlacement,
    Policy,
    QuotaRefusal,
    Score,
)
from services.allocator.core.preemption import PreemptionReason
from services.allocator.reservations.model import (
    DeviceCondition,
    Hold,
    Reservation,
    ReservationState,
)
from services.common.dra.model import (
    AllocationResult,
    ConfigSource,
    DeviceAllocationConfiguration,
    DeviceID,
    DeviceRequestAllocationResult,
    DeviceToleration,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    OpaqueDeviceConfiguration,
    ResourceClaim,
    TaintEffect,
    TolerationOperator,
)
from services.common.dra.quantity import Quantity
from services.common.errors import NotFound

# names: short and long (a length of 128+ bytes takes two varint bytes), ASCII and not
TOKENS = [0, 1, 127, 128, 4095, 4096, 16383, 16384]  # fencing tokens at varint edges
NAMES = st.one_of(
    st.sampled_from(["", "gpu", "h100-0000", "gpu.nvidia.com", "mig-1g.10gb", "ünïcødé-∑"]),
    st.text(alphabet="ab-é∑/", min_size=0, max_size=6),
    st.text(alphabet="xyzé", min_size=120, max_size=140),
)
WORDS = st.text(alphabet="abc-", min_size=1, max_size=8)


def pinned(node: str) -> NodeSelector:
    field = NodeSelectorRequirement("metadata.name", "In", (node,))
    return NodeSelector((NodeSelectorTerm(match_fields=(field,)),))


SELECTORS = st.one_of(
    st.none(),
    NAMES.map(pinned),
    st.just(
        NodeSelector(
            (
                NodeSelectorTerm(
                    match_expressions=(NodeSelectorRequirement("zone", "In", ("a", "b")),)
                ),
                NodeSelectorTerm(match_fields=(NodeSelectorRequirement("x", "Exists", ()),)),
                NodeSelectorTerm(),
                NodeSelectorTerm(
                    match_expressions=(NodeSelectorRequirement("", "", ("", "ünï")),),
                    match_fields=(NodeSelectorRequirement("k", "NotIn", ("a",)),),
                ),
            )
        )
    ),
)
TOLERATIONS = st.builds(
    DeviceToleration,
    key=WORDS,
    operator=st.sampled_from(TolerationOperator),
    value=st.sampled_from(["", "v"]),
    effect=st.none() | st.sampled_from(TaintEffect),
    toleration_seconds=st.none() | st.integers(-5, 10**6),
)


@st.composite
def results(draw: st.DrawFn, maps: bool) -> DeviceRequestAllocationResult:
    extras = draw(st.booleans())
    return DeviceRequestAllocationResult(
        request=draw(st.sampled_from(["gpu", "gpu/mig-1g", "ünï"])),
        driver=draw(st.sampled_from(["gpu.nvidia.com", "x"])),
        pool=draw(NAMES),
        device=draw(NAMES),
        admin_access=draw(st.none() | st.booleans()) if extras else None,
        tolerations=tuple(draw(st.lists(TOLERATIONS, max_size=2))) if extras else (),
        share_id=draw(st.none() | st.sampled_from(["", "share-1"])) if extras else None,
        consumed_capacity={"memory": Quantity.parse("10Gi")} if maps else {},
        binding_conditions=tuple(draw(st.lists(WORDS, max_size=2))) if extras else (),
        binding_failure_conditions=tuple(draw(st.lists(WORDS, max_size=2))) if extras else (),
    )


CONFIG = DeviceAllocationConfiguration(
    ConfigSource.FROM_CLASS,
    ("gpu",),
    OpaqueDeviceConfiguration("gpu.nvidia.com", {"sharing": {"strategy": "TimeSlicing"}, "n": 2}),
)


@st.composite
def allocations(draw: st.DrawFn, maps: bool = False) -> AllocationResult:
    config = maps and draw(st.booleans())
    capacity = maps and not config
    found = draw(st.lists(results(False), min_size=0, max_size=3))
    if capacity:
        found.append(draw(results(True)))
    return AllocationResult(
        results=tuple(found), config=(CONFIG,) if config else (), node_selector=draw(SELECTORS)
    )


TIMES = st.one_of(
    st.sampled_from([0.0, 1_796_561_488.793, 1_796_562_088.7934567, 1.5e-9, 59.9999999999]),
    st.floats(min_value=0, max_value=4e9, allow_nan=False),
)


@st.composite
def reservations(draw: st.DrawFn, held: tuple[AllocationResult, ...]) -> Reservation:
    owner = draw(st.sampled_from(["bench", "team-a/job-1", "", "ünï/x/y"]))
    labels = draw(st.dictionaries(WORDS, st.sampled_from(["", "1", "ünï"]), max_size=12))
    committed = draw(st.booleans())
    devices = [r for a in held for r in a.results]
    conditions = tuple(
        DeviceCondition(f"{r.driver}/{r.pool}/{r.device}", t, draw(st.booleans()))
        for r in devices
        for t in r.binding_conditions[: draw(st.integers(0, 1))]
    )
    return Reservation(
        id=draw(st.sampled_from(["res-f0dfd853348300ee170674b676d32a24@h100-0000", "r", ""])),
        owner=owner,
        node=draw(NAMES),
        claim_names=tuple(
            f"{draw(st.sampled_from(['default', 'ns', '']))}/claim-{i}" for i in range(len(held))
        ),
        allocations=held,
        hold=Hold(),
        state=ReservationState.COMMITTED if committed else ReservationState.RESERVED,
        fencing_token=draw(st.one_of(st.integers(0, 2**64 - 1), st.sampled_from(TOKENS))),
        created_at=draw(TIMES),
        expires_at=None if committed else draw(TIMES),
        idempotency_key=draw(st.sampled_from(["", "key-1"])),
        labels=tuple(labels.items()),
        priority_class=draw(st.sampled_from(["", "high"])),
        redacted=draw(st.booleans()),
        conditions=conditions,
    )


HOLDER = Holder(
    "res-9@n", "team-b/x", "n", ReservationState.RESERVED, 12.5, (DeviceID("d", "p", "g"),)
)
REFUSAL = QuotaRefusal("team-a", "gpus", 2000, 8000, 8000, 0, 0, cohort="c")
VICTIM = Victim(HOLDER, "low", PreemptionReason.PRIORITY)
ATTEMPT: FlavorAttempt[None] = FlavorAttempt(
    "gpus", "h100", FlavorMode.NO_FIT, reason=FlavorReason.QUOTA, message="m"
)


@st.composite
def answers(draw: st.DrawFn, maps: bool = False) -> tuple[Answer, bool]:
    """An answer, and whether it is asked as a gang."""
    claims_count = draw(st.integers(1, 3))
    nodes = draw(st.integers(0, 3))
    placements = []
    for node in range(nodes):
        held = tuple(draw(allocations(maps and node == 0)) for _ in range(claims_count))
        score = draw(
            st.none()
            | st.builds(
                Score,
                free_devices=st.integers(0, 8),
                total_devices=st.integers(0, 8),
                free_counters=st.just(Fraction(1)),
            )
        )
        placements.append(NodePlacement(draw(st.none() | NAMES), held, score))
    # reservations repeat the placements' allocation objects (as the service makes them), or
    # hold their own
    reserved = tuple(
        draw(
            reservations(
                p.allocations
                if draw(st.booleans())
                else tuple(draw(allocations()) for _ in range(claims_count))
            )
        )
        for p in placements[: draw(st.integers(0, len(placements)))]
    )
    claims = tuple(
        ResourceClaim(
            name=draw(st.sampled_from(["one-h100", "claim", "ünï"])),
            namespace=draw(st.sampled_from(["default", "ns"])),
            uid=draw(st.sampled_from(["", "uid-1"])),
        )
        for _ in range(claims_count)
    )
    refused = draw(st.booleans())
    answer = Answer(
        outcome=draw(st.sampled_from(Outcome)),
        generation=draw(st.integers(-(2**63), 2**63 - 1)),
        claims=claims,
        placements=tuple(placements),
        policy=draw(st.sampled_from(Policy)),
        explanation=Explanation(NO_SUMMARY) if draw(st.booleans()) else None,
        reservations=reserved,
        holders=(HOLDER,) if refused else (),
        quota=(REFUSAL,) if refused else (),
        preemption=(VICTIM,) if refused and draw(st.booleans()) else (),
        flavors=(ATTEMPT,) if refused else (),
    )
    return answer, draw(st.booleans())


def field_by_field(answer: Answer, gang: bool) -> bytes:
    response = pb.AllocateResponse()
    fill_allocate_response(response, answer, gang=gang)
    return response.SerializeToString()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers())
def test_an_answer_written_as_bytes_is_the_answer_built_field_by_field(
    asked: tuple[Answer, bool],
) -> None:
    answer, gang = asked
    written = allocate_response_bytes(answer, gang=gang)
    assert written is not None
    wire = field_by_field(answer, gang)
    assert allocate_response(answer, gang=gang).SerializeToString() == wire
    if not any(r.labels for r in answer.reservations):  # a map's entries: its table's order
        assert written == wire


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers(maps=True))
def test_an_answer_with_a_map_field_is_built_field_by_field(asked: tuple[Answer, bool]) -> None:
    answer, gang = asked
    shown = answer.placements if gang else answer.placements[:1] * (len(answer.placements) == 1)
    mapped = any(
        a.config or any(r.consumed_capacity for r in a.results)
        for p in shown
        for a in p.allocations
    )
    if mapped:
        assert allocate_response_bytes(answer, gang=gang) is None
    assert allocate_response(answer, gang=gang).SerializeToString() == field_by_field(answer, gang)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(answers(), answers(maps=True), st.just(None)), min_size=1, max_size=6))
def test_a_batch_reply_written_as_bytes_is_the_reply_built_in_place(
    items: list[tuple[Answer, bool] | None],
) -> None:
    """BatchReply: answers as bytes, an answer with a map field in place, errors (None here)."""
    error = batch_item_status(NotFound("reservation res-1 not found"), "items[0]")
    before = pb.AllocateBatchResponse()
    reply = BatchReply()
    for item in items:
        if item is None:
            before.items.add().error.CopyFrom(error)
            reply.add_error(error)
            continue
        answer, gang = item
        allocate_response(answer, gang=gang, into=before.items.add().response)
        written = allocate_response_bytes(answer, gang=gang)
        if written is None:
            fill_allocate_response(reply.add_in_place().response, answer, gang=gang)
        else:
            reply.add_response(written)
        assert len(reply) == len(before.items)
    assert reply.done().SerializeToString() == before.SerializeToString()


@st.composite
def one_device_answers(draw: st.DrawFn) -> tuple[Answer, bool, bool]:
    """The answer most placements give (one claim on one device of one node, at most one
    reservation repeating its allocation), and its near misses, which the general writer
    takes: a result with extras, a second result, a reservation with labels or its own
    (equal) allocation, an explanation, a refusal, a gang. Whether it is the first kind."""
    result = draw(results(False))
    if draw(st.booleans()) and draw(st.booleans()):  # lengths of 4 KiB and more: two-byte prefixes
        result = replace(result, pool=draw(st.text(alphabet="pé", min_size=4000, max_size=4200)))
    plain = not (
        result.admin_access is not None
        or result.tolerations
        or result.share_id is not None
        or result.binding_conditions
        or result.binding_failure_conditions
    )
    more = draw(st.lists(results(False), max_size=1 if draw(st.booleans()) else 0))
    allocation = AllocationResult(results=(result, *more), node_selector=draw(SELECTORS))
    score = draw(
        st.none()
        | st.builds(
            Score,
            free_devices=st.integers(0, 8),
            total_devices=st.integers(0, 8),
            free_counters=st.just(Fraction(1)),
        )
    )
    placement = NodePlacement(draw(st.none() | NAMES), (allocation,), score)
    reserved: tuple[Reservation, ...] = ()
    own = labelled = False
    if draw(st.booleans()):
        own = draw(st.booleans()) and draw(st.booleans())
        held = AllocationResult(allocation.results, (), allocation.node_selector)
        reservation = draw(reservations((held,) if own else (allocation,)))
        labelled = bool(reservation.labels) and draw(st.booleans())
        reserved = (reservation if labelled else replace(reservation, labels=()),)
    explained = draw(st.booleans()) and draw(st.booleans())
    refused = draw(st.booleans()) and draw(st.booleans())
    gang = draw(st.booleans()) and draw(st.booleans())
    answer = Answer(
        outcome=draw(st.sampled_from(Outcome)),
        generation=draw(st.integers(-(2**63), 2**63 - 1)),
        claims=(
            ResourceClaim(
                name=draw(st.sampled_from(["one-h100", "ünï"])),
                namespace=draw(st.sampled_from(["default", "ns"])),
                uid=draw(st.sampled_from(["", "uid-1"])),
            ),
        ),
        placements=(placement,),
        policy=draw(st.sampled_from(Policy)),
        explanation=Explanation(NO_SUMMARY) if explained else None,
        reservations=reserved,
        holders=(HOLDER,) if refused else (),
        quota=(REFUSAL,) if refused else (),
    )
    one = plain and not (more or own or labelled or explained or refused or gang)
    return answer, gang, one


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(one_device_answers())
def test_a_one_device_answer_written_without_loops_is_the_answer_built_field_by_field(
    asked: tuple[Answer, bool, bool],
) -> None:
    """_one_device_answer_bytes (the answer of almost every placement) writes the same bytes
    as the field-by-field builder, and takes only the answers it is for."""
    answer, gang, one = asked
    written = allocate_response_bytes(answer, gang=gang)
    assert written is not None
    if not any(r.labels for r in answer.reservations):  # a map's entries: its table's order
        assert written == field_by_field(answer, gang)
    assert allocate_response(answer, gang=gang).SerializeToString() == field_by_field(answer, gang)
    assert (gang or _one_device_answer_bytes(answer) is not None) == (gang or one)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(one_device_answers(), st.just(None)), min_size=1, max_size=6))
def test_a_batch_reply_of_one_device_answers_is_the_reply_built_in_place(
    items: list[tuple[Answer, bool, bool] | None],
) -> None:
    """BatchReply.add_response's prefixes, for responses below and above 4 KiB."""
    error = batch_item_status(NotFound("reservation res-1 not found"), "items[0]")
    before = pb.AllocateBatchResponse()
    reply = BatchReply()
    for item in items:
        if item is None:
            before.items.add().error.CopyFrom(error)
            reply.add_error(error)
            continue
        answer, gang, _ = item
        allocate_response(answer, gang=gang, into=before.items.add().response)
        written = allocate_response_bytes(answer, gang=gang)
        assert written is not None
        reply.add_response(written)
        assert len(reply) == len(before.items)
    assert reply.done().SerializeToString() == before.SerializeToString()


@pytest.mark.parametrize(
    "outcome", [Outcome.UNSATISFIABLE, Outcome.ALLOCATED], ids=["unsatisfiable", "allocated"]
)
def test_an_item_whose_answer_is_all_defaults_is_still_a_response(outcome: Outcome) -> None:
    """An item's oneof is set even when its response has nothing to write."""
    reply = BatchReply()
    written = allocate_response_bytes(Answer(outcome, 0, ()))
    assert written is not None
    reply.add_response(written)
    item = reply.done().items[0]
    assert item.WhichOneof("result") == "response"


@st.composite
def runs_of_one_device_answers(draw: st.DrawFn) -> list[Answer]:
    """The answers of a run of alike items: one request's, each on a device of one of a few
    nodes (names of any length, empty too), with its own score and reservation id, fencing
    token and times, or no reservation. What _one_device_answer_bytes writes from pieces kept
    across answers (by the values they share)."""
    answer, _, _ = draw(one_device_answers())
    placement = answer.placements[0]
    (allocation,) = placement.allocations
    result = allocation.results[0]
    plain = replace(
        result,
        admin_access=None,
        tolerations=(),
        share_id=None,
        binding_conditions=(),
        binding_failure_conditions=(),
    )
    nodes = draw(st.lists(st.tuples(NAMES, SELECTORS), min_size=1, max_size=3))
    reserved = answer.reservations[0] if answer.reservations else None
    run = []
    for _ in range(draw(st.integers(1, 12))):
        node, selector = draw(st.sampled_from(nodes))
        device = replace(
            plain,
            request=draw(st.sampled_from([plain.request, "gpu"])),
            driver=draw(st.sampled_from([plain.driver, "gpu.nvidia.com"])),
            pool=node,
            device=draw(NAMES),
        )
        placed = AllocationResult((device,), (), selector)
        score = draw(
            st.none()
            | st.builds(
                Score,
                free_devices=st.integers(0, 8),
                total_devices=st.integers(0, 8),
                free_counters=st.just(Fraction(1)),
            )
        )
        reservations: tuple[Reservation, ...] = ()
        if reserved is not None and draw(st.booleans()):
            reservations = (
                replace(
                    reserved,
                    id=draw(
                        st.sampled_from(["res-1@n", "res-f0dfd853348300ee170674b676d3@h100", ""])
                    ),
                    node=node,
                    allocations=(placed,),
                    labels=(),
                    conditions=(),
                    fencing_token=draw(
                        st.one_of(
                            st.integers(0, 2**64 - 1),
                            st.sampled_from(TOKENS),
                        )
                    ),
                    created_at=draw(TIMES),
                    expires_at=draw(st.none() | TIMES),
                    # mostly the run's, now and then another request's (the pieces' key)
                    owner=draw(st.sampled_from([reserved.owner, "bench", "team-a/job-1"])),
                    redacted=draw(st.sampled_from([reserved.redacted, True])),
                    state=draw(st.sampled_from([reserved.state, *ReservationState])),
                    priority_class=draw(st.sampled_from([reserved.priority_class, "high"])),
                    idempotency_key=draw(st.sampled_from([reserved.idempotency_key, "k"])),
                    claim_names=(draw(st.sampled_from([reserved.claim_names[0], "ns/c"])),),
                ),
            )
        run.append(
            replace(
                answer,
                placements=(NodePlacement(node, (placed,), score),),
                reservations=reservations,
                outcome=draw(st.sampled_from([answer.outcome, Outcome.ALLOCATED])),
                generation=draw(st.sampled_from([answer.generation, 7])),
                policy=draw(st.sampled_from([answer.policy, Policy.SPREAD])),
                claims=draw(st.sampled_from([answer.claims, (ResourceClaim("c", "ns", "u"),)])),
                explanation=None,
                holders=(),
                quota=(),
            )
        )
    return run


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs_of_one_device_answers())
def test_a_run_of_one_device_answers_is_written_as_field_by_field(run: list[Answer]) -> None:
    """The pieces _one_device_answer_bytes keeps for the answers of one request on one node
    (and device name length) give each answer of a run its own bytes: those of the builder
    field by field, answer after answer, the same node and request met again."""
    for answer in run + run[::-1]:
        written = _one_device_answer_bytes(answer)
        assert written is not None
        assert written == field_by_field(answer, False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            answers(),
            answers(maps=True),
            one_device_answers().map(lambda asked: (asked[0], asked[1])),
            st.just(None),
        ),
        min_size=0,
        max_size=6,
    )
)
def test_a_batch_reply_sent_serialized_is_the_reply_built_in_place(
    items: list[tuple[Answer, bool] | None],
) -> None:
    """BatchReply.add_answer and .serialized (the bytes AllocateBatch sends as they are): the
    bytes of the reply built in place, with items written as bytes, in place (a map field)
    and errors mixed, labels included (their reply is parsed first: a map's order)."""
    error = batch_item_status(NotFound("reservation res-1 not found"), "items[0]")
    before = pb.AllocateBatchResponse()
    reply = BatchReply()
    for item in items:
        if item is None:
            before.items.add().error.CopyFrom(error)
            reply.add_error(error)
            continue
        answer, gang = item
        allocate_response(answer, gang=gang, into=before.items.add().response)
        reply.add_answer(answer, gang=gang)
        assert len(reply) == len(before.items)
    assert reply.serialized() == before.SerializeToString()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            answers().map(lambda asked: asked[0]),
            one_device_answers().map(lambda asked: asked[0]),
            st.just(None),
        ),
        min_size=0,
        max_size=6,
    )
)
def test_a_batch_reply_of_one_device_items_added_in_one_call_is_add_answers(
    items: list[Answer | None],
) -> None:
    """BatchReply.add_one_device (AllocateBatch's item without a gang or audit events) adds
    exactly what add_answer adds for the answers _one_device_answer_bytes writes, and nothing
    (False) for the others, which then go through add_answer: the same reply bytes."""
    error = batch_item_status(NotFound("reservation res-1 not found"), "items[0]")
    general, fast = BatchReply(), BatchReply()
    for answer in items:
        if answer is None:
            general.add_error(error)
            fast.add_error(error)
            continue
        general.add_answer(answer)
        added = fast.add_one_device(answer)
        assert added == (_one_device_answer_bytes(answer) is not None)
        if not added:
            fast.add_answer(answer)
        assert len(fast) == len(general)
    assert fast.serialized() == general.serialized()


@pytest.mark.parametrize(
    ("free", "total", "policy"),
    [
        (0, 8, Policy.BINPACK),
        (7, 8, Policy.BINPACK),
        (8, 8, Policy.BINPACK),
        (3, 8, Policy.SPREAD),
        (0, 8, Policy.SPREAD),
        (1, 3, Policy.FIRST_FIT),
    ],
    ids=[
        "binpack-full",
        "binpack-one-used",
        "binpack-none-used",
        "spread",
        "spread-full",
        "thirds",
    ],
)
def test_a_kept_score_field_is_the_score_field(free: int, total: int, policy: Policy) -> None:
    """_scored (kept by its values) writes _share_field's bytes, the first time and again."""
    assert _scored(free, total, policy) == _share_field(free, total, policy)
    assert _scored(free, total, policy) == _share_field(free, total, policy)
