"""gpualloc.allocator.v1.Allocator over the AllocatorService: translate, call, translate back.

No logic and no try/except here: the service raises typed errors, which the server's error
interceptor maps to status codes. The caller's owner comes from the `x-gpualloc-owner` call
metadata (set by a trusted proxy or the client library), else the request's `owner` field,
else `anonymous`.
"""

from __future__ import annotations

import grpc

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from services.allocator.adapters.pb_mapping import (
    allocate_response,
    capacity_response,
    claims_path,
    explain_response,
    lease_from_pb,
    proto_field_paths,
    query_from_pb,
    reservation_state_from_pb,
    reservation_to_pb,
    reserve_claims_from_pb,
    seconds_from_pb,
)
from services.allocator.service import AllocatorService

__all__ = ["ANONYMOUS", "OWNER_METADATA", "SERVICE_NAME", "AllocatorServicer", "caller_owner"]

SERVICE_NAME = "gpualloc.allocator.v1.Allocator"
OWNER_METADATA = "x-gpualloc-owner"
ANONYMOUS = "anonymous"


def caller_owner(context: grpc.ServicerContext, field: str) -> str:
    """The owner a call acts as: metadata first, then the request field, else anonymous."""
    for key, value in context.invocation_metadata():
        if key == OWNER_METADATA and isinstance(value, str) and value:
            return value
    return field or ANONYMOUS


class AllocatorServicer(allocator_pb2_grpc.AllocatorServicer):
    def __init__(self, service: AllocatorService) -> None:
        self._service = service

    def Allocate(
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        with proto_field_paths(claims_path(request)):
            query = query_from_pb(request)
            lease = None
            if request.reserve:
                lease = lease_from_pb(
                    caller_owner(context, request.owner),
                    request.lease_ttl if request.HasField("lease_ttl") else None,
                    request.idempotency_key,
                    request.reservation_labels,
                )
            answer = self._service.allocate(query, lease)
        return allocate_response(answer)

    def Explain(
        self, request: pb.ExplainRequest, context: grpc.ServicerContext
    ) -> pb.ExplainResponse:
        with proto_field_paths(claims_path(request)):
            answer = self._service.explain(query_from_pb(request), request.max_nodes_explained)
        return explain_response(answer, request.max_nodes_explained or 10)

    def Capacity(
        self, request: pb.CapacityRequest, context: grpc.ServicerContext
    ) -> pb.CapacityResponse:
        with proto_field_paths(claims_path(request)):
            answer = self._service.capacity(query_from_pb(request), request.ignore_reservations)
        return capacity_response(answer)

    def Reserve(
        self, request: pb.ReserveRequest, context: grpc.ServicerContext
    ) -> pb.ReserveResponse:
        lease = lease_from_pb(
            caller_owner(context, request.owner),
            request.lease_ttl if request.HasField("lease_ttl") else None,
            request.idempotency_key,
            request.labels,
        )
        claims = reserve_claims_from_pb(request.allocations)
        reservations = self._service.reserve(request.node_name, claims, lease)
        messages = [reservation_to_pb(r) for r in reservations]
        return pb.ReserveResponse(reservation=messages[0], reservations=messages)

    def Commit(self, request: pb.CommitRequest, context: grpc.ServicerContext) -> pb.CommitResponse:
        reservation = self._service.commit(
            request.reservation_id, caller_owner(context, request.owner), request.fencing_token
        )
        return pb.CommitResponse(reservation=reservation_to_pb(reservation))

    def Renew(self, request: pb.RenewRequest, context: grpc.ServicerContext) -> pb.RenewResponse:
        reservation = self._service.renew(
            request.reservation_id,
            caller_owner(context, request.owner),
            seconds_from_pb(request.lease_ttl if request.HasField("lease_ttl") else None),
            request.fencing_token,
        )
        return pb.RenewResponse(reservation=reservation_to_pb(reservation))

    def Release(
        self, request: pb.ReleaseRequest, context: grpc.ServicerContext
    ) -> pb.ReleaseResponse:
        released = self._service.release(
            request.reservation_id,
            caller_owner(context, request.owner),
            request.fencing_token,
            request.allow_missing,
        )
        response = pb.ReleaseResponse()
        if released is not None:
            response.reservation.CopyFrom(reservation_to_pb(released))
        return response

    def GetReservation(
        self, request: pb.GetReservationRequest, context: grpc.ServicerContext
    ) -> pb.GetReservationResponse:
        reservation = self._service.get(request.reservation_id)
        return pb.GetReservationResponse(reservation=reservation_to_pb(reservation))

    def ListReservations(
        self, request: pb.ListReservationsRequest, context: grpc.ServicerContext
    ) -> pb.ListReservationsResponse:
        page, token = self._service.list_reservations(
            owner=request.owner,
            node=request.node_name,
            state=reservation_state_from_pb(request.state),
            page_size=request.page_size,
            page_token=request.page_token,
        )
        return pb.ListReservationsResponse(
            reservations=[reservation_to_pb(r) for r in page], next_page_token=token
        )
