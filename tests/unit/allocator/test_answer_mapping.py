"""An Allocate's answer on the wire (adapters/grpc/mapping.py): what each reservation field
carries, and an answer written in place (a batch item's, `into`) equal to one built alone."""

from __future__ import annotations

import dataclasses

import pytest
from google.protobuf import timestamp_pb2

from protos.allocator.v1 import allocator_pb2 as pb
from protos.common.v1 import dra_pb2
from services.allocator.adapters.grpc.mapping import allocate_response, reservation_to_pb
from services.allocator.app.messages import Answer, Outcome
from services.allocator.app.service import _with_reservations
from services.allocator.core import NodePlacement, Policy
from services.allocator.reservations.model import (
    DeviceCondition,
    Hold,
    Reservation,
    ReservationState,
)
from services.common.dra.model import (
    AllocationResult,
    DeviceRequest,
    DeviceRequestAllocationResult,
    ExactDeviceRequest,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceClaim,
)
from services.common.dra.quantity import Quantity

NODE = "h100-0001"
DRIVER = "gpu.nvidia.com"
PINNED = NodeSelector(
    (NodeSelectorTerm(match_fields=(NodeSelectorRequirement("metadata.name", "In", (NODE,)),)),)
)


def result(device: str, **fields: object) -> DeviceRequestAllocationResult:
    return DeviceRequestAllocationResult("gpu", DRIVER, NODE, device, **fields)  # type: ignore[arg-type]


def allocation(*results: DeviceRequestAllocationResult) -> AllocationResult:
    return AllocationResult(results=results, node_selector=PINNED)


def reservation(*allocations: AllocationResult, **fields: object) -> Reservation:
    made = Reservation(
        id=f"res-1@{NODE}",
        owner="team-a/job-1",
        node=NODE,
        claim_names=tuple(f"default/claim-{i}" for i in range(len(allocations))),
        allocations=allocations,
        hold=Hold(),
        state=ReservationState.RESERVED,
        fencing_token=42,
        created_at=1_796_561_488.793,
        expires_at=1_796_562_088.793,
    )
    return dataclasses.replace(made, **fields)  # type: ignore[arg-type]


def stamp(seconds: float) -> timestamp_pb2.Timestamp:
    message = timestamp_pb2.Timestamp()
    message.FromNanoseconds(round(seconds * 1e9))
    return message


def device(name: str) -> dra_pb2.DeviceID:
    return dra_pb2.DeviceID(driver=DRIVER, pool=NODE, device=name)


def expected(**fields: object) -> pb.Reservation:
    """The message of `reservation()` with `fields` changed."""
    message = pb.Reservation(
        id=f"res-1@{NODE}",
        owner="team-a/job-1",
        tenant="team-a",
        node_name=NODE,
        state=pb.RESERVATION_STATE_RESERVED,
        fencing_token=42,
        created_at=stamp(1_796_561_488.793),
        expires_at=stamp(1_796_562_088.793),
    )
    for name, value in fields.items():
        if name in ("allocations", "devices", "conditions"):
            getattr(message, name).extend(value)
        elif name == "labels":
            message.labels.update(value)  # type: ignore[call-overload]
        elif name == "clear":
            for cleared in value:  # type: ignore[attr-defined]
                message.ClearField(cleared)
        else:
            setattr(message, name, value)
    return message


def claim_allocation(index: int, *results: dra_pb2.DeviceRequestAllocationResult) -> object:
    return pb.ClaimAllocation(
        namespace="default",
        name=f"claim-{index}",
        allocation=dra_pb2.AllocationResult(
            results=results,
            node_selector=dra_pb2.NodeSelector(
                node_selector_terms=[
                    dra_pb2.NodeSelectorTerm(
                        match_fields=[
                            dra_pb2.NodeSelectorRequirement(
                                key="metadata.name", operator="In", values=[NODE]
                            )
                        ]
                    )
                ]
            ),
        ),
    )


def pb_result(name: str, **fields: object) -> dra_pb2.DeviceRequestAllocationResult:
    return dra_pb2.DeviceRequestAllocationResult(
        request="gpu",
        driver=DRIVER,
        pool=NODE,
        device=name,
        **fields,  # type: ignore[arg-type]
    )


CASES = [
    pytest.param(
        reservation(allocation(result("gpu-0"))),
        expected(allocations=[claim_allocation(0, pb_result("gpu-0"))], devices=[device("gpu-0")]),
        id="one-claim-one-device",
    ),
    pytest.param(
        reservation(allocation(result("gpu-3"), result("gpu-1")), allocation(result("gpu-1"))),
        expected(
            allocations=[
                claim_allocation(0, pb_result("gpu-3"), pb_result("gpu-1")),
                claim_allocation(1, pb_result("gpu-1")),
            ],
            devices=[device("gpu-1"), device("gpu-3")],
        ),
        id="devices-sorted-once-each",
    ),
    pytest.param(
        reservation(allocation(result("gpu-0", admin_access=True))),
        expected(
            allocations=[claim_allocation(0, pb_result("gpu-0", admin_access=True))],
        ),
        id="an-admin-access-device-is-not-held",
    ),
    pytest.param(
        reservation(
            allocation(
                result(
                    "gpu-0",
                    share_id="share-1",
                    consumed_capacity={"memory": Quantity.parse("10Gi")},
                    binding_failure_conditions=("Failed",),
                )
            )
        ),
        expected(
            allocations=[
                claim_allocation(
                    0,
                    pb_result(
                        "gpu-0",
                        share_id="share-1",
                        consumed_capacity={"memory": dra_pb2.Quantity(value="10Gi")},
                        binding_failure_conditions=["Failed"],
                    ),
                )
            ],
            devices=[device("gpu-0")],
        ),
        id="a-result-s-optional-fields",
    ),
    pytest.param(
        reservation(allocation(result("gpu-0", binding_conditions=("Attached",)))),
        expected(
            allocations=[claim_allocation(0, pb_result("gpu-0", binding_conditions=["Attached"]))],
            devices=[device("gpu-0")],
            binding=pb.BINDING_PHASE_BINDING,
        ),
        id="binding-while-a-condition-is-not-reported",
    ),
    pytest.param(
        reservation(
            allocation(result("gpu-0", binding_conditions=("Attached",))),
            conditions=(DeviceCondition(f"{DRIVER}/{NODE}/gpu-0", "Attached", True),),
        ),
        expected(
            allocations=[claim_allocation(0, pb_result("gpu-0", binding_conditions=["Attached"]))],
            devices=[device("gpu-0")],
            binding=pb.BINDING_PHASE_BOUND,
            conditions=[pb.DeviceCondition(device=device("gpu-0"), type="Attached", status=True)],
        ),
        id="bound-once-reported",
    ),
    pytest.param(
        reservation(
            allocation(result("gpu-0")),
            state=ReservationState.COMMITTED,
            expires_at=None,
            idempotency_key="key-1",
            labels=(("a", "1"), ("b", "2")),
            priority_class="high",
        ),
        expected(
            allocations=[claim_allocation(0, pb_result("gpu-0"))],
            devices=[device("gpu-0")],
            state=pb.RESERVATION_STATE_COMMITTED,
            idempotency_key="key-1",
            labels={"a": "1", "b": "2"},
            priority_class_name="high",
            clear=["expires_at"],
        ),
        id="committed-with-key-labels-and-class",
    ),
    pytest.param(
        reservation(allocation(result("gpu-0")), redacted=True),
        expected(
            allocations=[claim_allocation(0, pb_result("gpu-0"))],
            devices=[device("gpu-0")],
            clear=["owner"],
        ),
        id="redacted-keeps-the-tenant-only",
    ),
]


@pytest.mark.parametrize(("held", "message"), CASES)
def test_a_reservation_on_the_wire(held: Reservation, message: pb.Reservation) -> None:
    assert reservation_to_pb(held) == message
    shown = reservation_to_pb(held).SerializeToString(deterministic=True)
    assert shown == message.SerializeToString(deterministic=True)


def answer(*reservations: Reservation) -> Answer:
    claims = tuple(
        ResourceClaim(
            name=f"claim-{i}",
            namespace="default",
            uid=f"uid-{i}",
            requests=(DeviceRequest("gpu", ExactDeviceRequest("gpu.nvidia.com")),),
        )
        for i in range(len(reservations[0].allocations))
    )
    return Answer(
        Outcome.ALLOCATED,
        generation=7,
        claims=claims,
        placements=tuple(NodePlacement(r.node, r.allocations) for r in reservations),
        policy=Policy.BINPACK,
        reservations=reservations,
    )


@pytest.mark.parametrize("gang", [False, True], ids=["single-node", "gang"])
def test_an_answer_written_in_place_equals_one_built_alone(gang: bool) -> None:
    """A batch writes each item's answer inside its reply (`into`): the same message."""
    held = answer(reservation(allocation(result("gpu-0")), allocation(result("gpu-1"))))
    alone = allocate_response(held, gang=gang)
    reply = pb.AllocateBatchResponse()
    reply.items.add()  # an earlier item
    in_place = allocate_response(held, gang=gang, into=reply.items.add().response)
    assert in_place is reply.items[1].response
    assert in_place == alone
    wire = in_place.SerializeToString(deterministic=True)
    assert wire == alone.SerializeToString(deterministic=True)
    # the placement's allocations are the reservation's: one message each, copied there
    if not gang:
        assert [a.allocation for a in alone.allocations] == [
            a.allocation for a in alone.reservations[0].allocations
        ]
        assert [a.uid for a in alone.allocations] == ["uid-0", "uid-1"]


def test_the_held_answer_is_the_answer_with_its_reservations() -> None:
    """service._with_reservations makes what dataclasses.replace would."""
    solved = dataclasses.replace(answer(reservation(allocation(result("gpu-0")))), reservations=())
    held = (reservation(allocation(result("gpu-0"))),)
    made = _with_reservations(solved, held, ())
    assert made == dataclasses.replace(solved, reservations=held, preemption=())
    assert made is not solved and solved.reservations == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.generation = 8  # type: ignore[misc]
