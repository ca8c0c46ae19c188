"""gpualloc.allocator.v1.Allocator over the AllocatorService: translate, call, translate back.

No logic and no try/except here: the service raises typed errors, which the server's error
interceptor maps to status codes. `ACCESS` says what each method needs; the auth interceptor
checks it before a method runs and leaves the call's principal for `current_principal`. The
principal decides the owner a call acts as (`Principal.owner`: under a policy
`<tenant>/<name>`, in development mode the `x-gpualloc-owner` header, else the request's
`owner`, else `anonymous`) and what it sees of other tenants (app/tenancy.py). Grants, commits,
renewals and releases are audit events; the holder of a conflict or a preemption an error
names is named as the caller may see it (`visible_errors`: another tenant's as `tenant X`).
Identity and time enter here and travel down as values: each method makes the call's Deadline
(`call_deadline`: the client's deadline capped at `max_call_seconds`, cancelled when the call
ends) and passes it to the service.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import replace

import grpc

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from services.allocator.adapters.grpc.mapping import (
    BatchReply,
    ClaimReader,
    allocate_response,
    batch_item_status,
    capacity_response,
    claims_path,
    device_conditions_from_pb,
    explain_response,
    lease_from_pb,
    proto_field_paths,
    query_from_pb,
    queued_from_pb,
    quota_status_response,
    request_digest,
    reservation_change_to_pb,
    reservation_state_from_pb,
    reservation_to_pb,
    reserve_claims_from_pb,
    seconds_from_pb,
)
from services.allocator.adapters.grpc.stream_inbox import Inbox
from services.allocator.app.batch import BatchItem, ItemResult, allocate_batch
from services.allocator.app.combining import Combiner
from services.allocator.app.messages import Answer, LeaseOptions, Query
from services.allocator.app.reservation_watch import ReservationWatch
from services.allocator.app.service import AllocatorService
from services.allocator.app.telemetry import AllocatorMetrics
from services.allocator.app.tenancy import (
    shown_as_is,
    visible_answer,
    visible_errors,
    visible_reservation,
    watched_changes,
)
from services.allocator.reservations.model import NODE_SEPARATOR, Reservation
from services.common.deadline import Deadline
from services.common.errors import GpuallocError, InvalidArgument, PermissionDenied
from services.common.grpc_errors import SerializedReply
from services.common.grpc_server import call_deadline
from services.common.security.audit import audit_enabled
from services.common.security.edge import (
    OWNER_METADATA,
    AccessRule,
    asks_admin_access,
    audit_call,
    current_principal,
    rule,
)
from services.common.security.policy import Access, authorize
from services.common.security.principal import DEVELOPMENT_ANONYMOUS, Permission, Principal

__all__ = [
    "ACCESS",
    "ANONYMOUS",
    "MAX_STREAM_PASS_ITEMS",
    "MAX_STREAM_WAITING_BYTES",
    "OWNER_METADATA",
    "SERVICE_NAME",
    "AllocatorServicer",
]

SERVICE_NAME = "gpualloc.allocator.v1.Allocator"
_log = logging.getLogger(__name__)
ANONYMOUS = DEVELOPMENT_ANONYMOUS


def _placing(request: pb.AllocateRequest) -> Access:
    permission = Permission.RESERVATIONS_CREATE if request.reserve else Permission.PLACEMENTS_READ
    return Access("", permission, admin_access=request.reserve and asks_admin_access(request))


def _placing_batch(request: pb.AllocateBatchRequest) -> Access:
    """What the batch's items need together: reserving if any item reserves, admin access if
    a reserving item asks for it (each item's owner is checked as it is mapped)."""
    reserving = [item for item in request.items if item.reserve]
    permission = Permission.RESERVATIONS_CREATE if reserving else Permission.PLACEMENTS_READ
    return Access("", permission, admin_access=any(asks_admin_access(i) for i in reserving))


def _reporting(request: pb.ReportDeviceConditionsRequest) -> Access:
    """A node's agent reports for the reservations of its node (the node an id names), as it
    reports the node itself; an operator (report-any-node) for any."""
    node = request.reservation_id.rpartition(NODE_SEPARATOR)[2]
    return Access("", Permission.INVENTORY_REPORT_OWN, node=node)


def _reserving(request: pb.ReserveRequest) -> Access:
    return Access("", Permission.RESERVATIONS_CREATE, admin_access=asks_admin_access(request))


_PREFIX = f"/{SERVICE_NAME}/"
ACCESS: dict[str, AccessRule] = {
    _PREFIX + "Allocate": _placing,
    _PREFIX + "AllocateBatch": _placing_batch,
    # each item is authorized as it is placed (_authorized_item): a reserving item needs
    # reservations.create (and admin access where it asks for it), a denied one fails alone
    _PREFIX + "AllocateStream": rule(Permission.PLACEMENTS_READ),
    _PREFIX + "Explain": rule(Permission.PLACEMENTS_READ),
    _PREFIX + "Capacity": rule(Permission.PLACEMENTS_READ),
    _PREFIX + "Reserve": _reserving,
    _PREFIX + "Commit": rule(Permission.RESERVATIONS_UPDATE),
    _PREFIX + "Renew": rule(Permission.RESERVATIONS_UPDATE),
    _PREFIX + "Release": rule(Permission.RESERVATIONS_UPDATE),
    _PREFIX + "GetReservation": rule(Permission.RESERVATIONS_READ),
    _PREFIX + "ListReservations": rule(Permission.RESERVATIONS_READ),
    _PREFIX + "QuotaStatus": rule(Permission.PLACEMENTS_READ),
    _PREFIX + "WatchReservations": rule(Permission.RESERVATIONS_READ),
    _PREFIX + "ReportDeviceConditions": _reporting,
}
"""What each method needs (a method missing here is denied under a policy)."""


def _audit_denied_item(context: grpc.ServicerContext, error: PermissionDenied, item: int) -> None:
    """An AllocateBatch or AllocateStream item denied on its own (an owner its caller may not
    name; on the stream also a right the item needs): `call.denied` as the auth interceptor
    logs a denied unary Allocate, with the item's index (`item`: its place in the batch, its
    stream index)."""
    audit_call(
        context,
        "call.denied",
        code=grpc.StatusCode.PERMISSION_DENIED.name,
        reason=error.message,
        item=item,
    )


def _audit(context: grpc.ServicerContext, event: str, reservation: Reservation) -> None:
    audit_call(
        context,
        event,
        reservation=reservation.id,
        owner=reservation.owner,
        node=reservation.node,
        devices=reservation.hold.devices,
        state=reservation.state.value,
    )


class AllocatorServicer(allocator_pb2_grpc.AllocatorServicer):
    def __init__(
        self,
        service: AllocatorService,
        watch: ReservationWatch,
        *,
        claims: ClaimReader | None = None,
        max_call_seconds: float | None = None,
        watch_heartbeat_seconds: float = 15.0,
        metrics: AllocatorMetrics | None = None,
        combiner: Combiner | None = None,
    ) -> None:
        """`claims` reads the requests' claim messages (its memo is this servicer's: a new,
        default-sized ClaimReader when not given). Each call's deadline — the client's, at
        most `max_call_seconds` — goes down to the service as a value (call_deadline).
        `watch`: the process's reservation changes (WatchReservations), a HEARTBEAT after
        `watch_heartbeat_seconds` of silence. `metrics`: AllocateStream's items and passes.
        `combiner`: places concurrent unary Allocates together (app/combining.py); None: each
        alone."""
        self._service = service
        self._claims = claims if claims is not None else ClaimReader()
        self._max_call_seconds = max_call_seconds
        self._watch = watch
        self._watch_heartbeat_seconds = watch_heartbeat_seconds
        self._metrics = metrics
        self._combiner = combiner

    def _deadline(self, context: grpc.ServicerContext) -> Deadline:
        return call_deadline(context, self._max_call_seconds)

    def Allocate(
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        principal = current_principal(context)
        try:
            query, lease = self._item(request, principal)
            # mapped and authorized here; placed alone or with the calls waiting with it —
            # except a call that may wait for a future inventory generation: a pass must not
            # wait with it (the calls behind it would wait too, past the isolation bound on
            # such waits), so it is placed alone, as before combining
            combined = self._combiner is not None and query.min_generation <= 0
            placing = self._combiner if combined and self._combiner else self._service
            answer = placing.allocate(query, lease, deadline=self._deadline(context))
        except Exception:
            # proto field paths and the holders this caller may see: rewrites of errors
            # only, so entered on the way out (two generator context managers on every
            # call cost ~5 us), re-raising the error inside them
            with proto_field_paths(claims_path(request)), self._errors_shown_to(principal):
                raise
        return self._answered(context, answer, principal, gang=request.HasField("gang"))

    def AllocateBatch(  # type: ignore[override]  # the reply comes serialized
        self, request: pb.AllocateBatchRequest, context: grpc.ServicerContext
    ) -> SerializedReply:
        """Each item as an Allocate (app/batch.py): mapped, authorized for its owner, audited
        and shown as one; an item's error is its own status, not the call's (a denied item's
        `call.denied` event is its own too, with its index). The reply is its items' bytes as
        they were written (BatchReply.serialized), sent as they are (SerializedReply: read it
        with AllocateBatchResponse.FromString(reply.data) in process)."""
        principal = current_principal(context)
        known: dict[bytes, BatchItem] = {}  # identical items map once (a queue of alike jobs)

        def item(entry: pb.AllocateRequest) -> Callable[[], BatchItem]:
            def make() -> BatchItem:
                signature = entry.SerializeToString(deterministic=True)
                found = known.get(signature)
                if found is not None:
                    return found
                with proto_field_paths(claims_path(entry)), self._errors_shown_to(principal):
                    query, lease = self._item(entry, principal)
                known[signature] = mapped_item = BatchItem(query, lease, signature)
                return mapped_item

            return make

        reply = BatchReply()  # items written as bytes, parsed into the reply in one go
        mapped: dict[int, tuple[pb.BatchItemStatus, int]] = {}  # id(error) -> status, its path
        items: list[Callable[[], BatchItem]] = []
        gangs: list[bool] = []
        for entry in request.items:  # one pass: each entry's wrapper made once
            items.append(item(entry))
            gangs.append(entry.HasField("gang"))
        any_gang = any(gangs)  # else no item's place in the reply to look up
        audited = audit_enabled()  # looked up once per call, not once per item
        # no gang item and no audit events: an answer _one_device_answer_bytes writes names
        # nothing of anyone's (shown_as_is), so _answered_item would add it as it is
        plain = not any_gang and not audited

        def shown(result: ItemResult) -> None:
            if isinstance(result, Answer):
                if plain and reply.add_one_device(result):
                    return
                gang = any_gang and gangs[len(reply)]
                self._answered_item(context, result, principal, audited, gang=gang, reply=reply)
                return
            if isinstance(result, PermissionDenied):
                _audit_denied_item(context, result, len(reply))
            path = f"items[{len(reply)}]"
            seen = mapped.get(id(result))  # the items not reached share one error: map it once
            if seen is None:
                status = batch_item_status(self._error_shown(result, principal), path)
                mapped[id(result)] = (status, len(path))
            else:
                first, prefix = seen
                message = path + first.message[prefix:]
                status = pb.BatchItemStatus(code=first.code, message=message, details=first.details)
            reply.add_error(status)

        allocate_batch(self._service, items, deadline=self._deadline(context), on_result=shown)
        return SerializedReply(reply.serialized())

    def AllocateStream(
        self, requests: Iterator[pb.AllocateStreamRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.AllocateStreamResponse]:
        """AllocateBatch over a long-lived stream. A reader thread (stream_inbox.Inbox) reads
        the requests as they come; this loop takes every one waiting (at least one, at most
        MAX_STREAM_PASS_ITEMS) and places them in one pass, an AllocateBatch of them, then
        sends their answers in request order. Each item is authorized on its own (the call
        needs only placements.read); each pass has its own deadline: the stream's, at most
        max_call_seconds from the pass's start. The client's half-close ends the stream once
        every item read is answered; when the call ends otherwise (cancel, deadline, the
        client gone), the items read but not placed are dropped and the reservations of items
        whose answers were not handed to gRPC are released (_withdrawn)."""
        principal = current_principal(context)
        stream = call_deadline(context, None)  # the client's deadline; set when the call ends
        counted = self._metrics.stream_items if self._metrics is not None else None
        inbox: Inbox[pb.AllocateStreamRequest] = Inbox(
            requests,
            MAX_STREAM_PASS_ITEMS,
            read=(lambda: counted.add(1)) if counted else None,
            size=pb.AllocateStreamRequest.ByteSize,
            byte_bound=MAX_STREAM_WAITING_BYTES,
        )
        context.add_callback(inbox.close)
        inbox.start()
        index = 0  # the stream position of the pass's first item
        try:
            while arrived := inbox.take(MAX_STREAM_PASS_ITEMS):
                if self._metrics is not None:
                    self._metrics.stream_pass_items.record(len(arrived))
                answered = self._stream_pass(arrived, index, principal, context, stream)
                handed = 0
                try:
                    for response, _ in answered:
                        if not context.is_active():
                            return
                        handed += 1
                        yield response
                finally:  # a return above, or grpc closed this generator: the call ended
                    self._withdrawn(context, [a for _, a in answered[handed:] if a is not None])
                index += len(arrived)
        finally:
            inbox.close()

    def _stream_pass(
        self,
        arrived: list[pb.AllocateStreamRequest | InvalidArgument],
        first: int,
        principal: Principal,
        context: grpc.ServicerContext,
        stream: Deadline,
    ) -> list[tuple[pb.AllocateStreamResponse, Answer | None]]:
        """One pass of AllocateStream: `arrived` (stream positions `first`, `first + 1`, ...)
        as one allocate_batch, each answer on the wire with the Answer it came from."""
        known: dict[bytes, BatchItem] = {}  # identical items map once, as AllocateBatch's

        def item(entry: pb.AllocateStreamRequest | InvalidArgument) -> Callable[[], BatchItem]:
            def make() -> BatchItem:
                if isinstance(entry, InvalidArgument):
                    raise entry
                request = entry.item
                signature = request.SerializeToString(deterministic=True)
                found = known.get(signature)
                if found is not None:
                    return found
                if not principal.development:  # as the AuthInterceptor checks an Allocate
                    authorize(principal, replace(_placing(request), method="AllocateStream"))
                with proto_field_paths(claims_path(request)), self._errors_shown_to(principal):
                    query, lease = self._item(request, principal)
                known[signature] = mapped_item = BatchItem(query, lease, signature)
                return mapped_item

            return make

        answered: list[tuple[pb.AllocateStreamResponse, Answer | None]] = []

        def shown(result: ItemResult) -> None:
            index = first + len(answered)
            response = pb.AllocateStreamResponse(index=index)
            if isinstance(result, Answer):
                entry = arrived[len(answered)]
                assert not isinstance(entry, InvalidArgument)  # it was placed
                gang = entry.item.HasField("gang")
                into = response.item.response  # built in place: not copied there after
                self._answered(context, result, principal, gang=gang, into=into)
                answered.append((response, result if result.reservations else None))
                return
            if isinstance(result, PermissionDenied):
                _audit_denied_item(context, result, index)
            path = f"requests[{index}].item"
            response.item.error.CopyFrom(
                batch_item_status(self._error_shown(result, principal), path)
            )
            answered.append((response, None))

        allocate_batch(
            self._service,
            [item(entry) for entry in arrived],
            deadline=_pass_deadline(stream, self._max_call_seconds),
            on_result=shown,
        )
        return answered

    def _withdrawn(self, context: grpc.ServicerContext, answers: list[Answer]) -> None:
        """Release the reservations of answers the call ended before sending: no client will
        learn of them (an answer handed to gRPC is the client's, as a unary reply is)."""
        deadline = Deadline.after(self._max_call_seconds or _WITHDRAW_SECONDS)
        for answer in answers:
            for reservation in answer.reservations:
                try:
                    self._service.release(
                        reservation.id,
                        reservation.owner,
                        reservation.fencing_token,
                        allow_missing=True,
                        deadline=deadline,
                    )
                except GpuallocError as error:  # its lease still expires
                    _log.warning(
                        "AllocateStream: could not release %s after its call ended: %s",
                        reservation.id,
                        error.message,
                    )
                    continue
                audit_call(
                    context,
                    "reservation.release",
                    reservation=reservation.id,
                    owner=reservation.owner,
                    node=reservation.node,
                    reason="the AllocateStream call ended before its answer was sent",
                )

    def _item(
        self, request: pb.AllocateRequest, principal: Principal
    ) -> tuple[Query, LeaseOptions | None]:
        """An AllocateRequest as the service takes it: the query, and the lease when it
        reserves (the owner the principal may act as)."""
        query = query_from_pb(request, self._claims)
        if not request.reserve:
            return query, None
        lease = lease_from_pb(
            principal.owner(request.owner),
            request.lease_ttl if request.HasField("lease_ttl") else None,
            request.idempotency_key,
            request.reservation_labels,
            request_digest(request) if request.idempotency_key else "",
            request.priority_class_name,
            request.preempt,
            principal.max_reservations,
            queued_from_pb(request, time.time()),
        )
        return query, lease

    def _answered(
        self,
        context: grpc.ServicerContext,
        answer: Answer,
        principal: Principal,
        *,
        gang: bool,
        into: pb.AllocateResponse | None = None,
    ) -> pb.AllocateResponse:
        """An Allocate's answer on the wire (`gang`: in the gang fields, as asked; `into`: the
        empty message to write it in, as allocate_response), its preemptions and grants
        audited."""
        return allocate_response(self._granted(context, answer, principal), gang=gang, into=into)

    def _answered_item(
        self,
        context: grpc.ServicerContext,
        answer: Answer,
        principal: Principal,
        audited: bool,
        *,
        gang: bool,
        reply: BatchReply,
    ) -> None:
        """An AllocateBatch item's answer, as `_answered`'s, added to `reply` (as bytes, or
        field by field when it cannot be: BatchReply.add_answer). `audited`: audit_enabled(),
        looked up once per call; without audit events and with nothing to hide (shown_as_is)
        the answer goes as it is, as `_granted` would give it."""
        if (audited and answer.reservations) or not shown_as_is(answer):
            answer = self._granted(context, answer, principal)
        reply.add_answer(answer, gang=gang)

    def _granted(
        self, context: grpc.ServicerContext, answer: Answer, principal: Principal
    ) -> Answer:
        """`answer` as `principal` may see it, its preemptions and grants audited."""
        if answer.reservations and audit_enabled():  # off: no events to build (a batch's 64)
            for victim in answer.preemption:
                audit_call(
                    context,
                    "reservation.preempt",
                    reservation=victim.holder.reservation_id,
                    owner=victim.holder.owner,
                    node=victim.holder.node,
                    reason=victim.reason,
                )
            for reservation in answer.reservations:
                _audit(context, "reservation.grant", reservation)
        return self._visible(answer, principal)

    def Explain(
        self, request: pb.ExplainRequest, context: grpc.ServicerContext
    ) -> pb.ExplainResponse:
        principal = current_principal(context)
        with proto_field_paths(claims_path(request)):
            answer = self._service.explain(
                query_from_pb(request, self._claims),
                request.max_nodes_explained,
                _quota_owner(principal),
                request.priority_class_name,
                queued_at=queued_from_pb(request, time.time()),
                deadline=self._deadline(context),
            )
        answer = self._visible(answer, principal)
        gang = request.HasField("gang")
        return explain_response(answer, request.max_nodes_explained or 10, gang=gang)

    def Capacity(
        self, request: pb.CapacityRequest, context: grpc.ServicerContext
    ) -> pb.CapacityResponse:
        owner = _quota_owner(current_principal(context))
        with proto_field_paths(claims_path(request)):
            answer = self._service.capacity(
                query_from_pb(request, self._claims),
                request.ignore_reservations,
                owner,
                deadline=self._deadline(context),
            )
        return capacity_response(answer)

    def Reserve(
        self, request: pb.ReserveRequest, context: grpc.ServicerContext
    ) -> pb.ReserveResponse:
        principal = current_principal(context)
        lease = lease_from_pb(
            principal.owner(request.owner),
            request.lease_ttl if request.HasField("lease_ttl") else None,
            request.idempotency_key,
            request.labels,
            priority_class=request.priority_class_name,
            max_reservations=principal.max_reservations,
        )
        claims = reserve_claims_from_pb(request.allocations)
        with self._errors_shown_to(principal):
            reservations = self._service.reserve(
                request.node_name, claims, lease, deadline=self._deadline(context)
            )
        for reservation in reservations:
            _audit(context, "reservation.grant", reservation)
        messages = [reservation_to_pb(r) for r in reservations]
        return pb.ReserveResponse(reservation=messages[0], reservations=messages)

    def Commit(self, request: pb.CommitRequest, context: grpc.ServicerContext) -> pb.CommitResponse:
        deadline = self._deadline(context)
        with self._errors_shown_to(current_principal(context)):
            owner = self._owner(context, request.reservation_id, request.owner, deadline)
            reservation = self._service.commit(
                request.reservation_id, owner, request.fencing_token, deadline=deadline
            )
        _audit(context, "reservation.commit", reservation)
        return pb.CommitResponse(reservation=reservation_to_pb(reservation))

    def Renew(self, request: pb.RenewRequest, context: grpc.ServicerContext) -> pb.RenewResponse:
        deadline = self._deadline(context)
        with self._errors_shown_to(current_principal(context)):
            reservation = self._service.renew(
                request.reservation_id,
                self._owner(context, request.reservation_id, request.owner, deadline),
                seconds_from_pb(request.lease_ttl if request.HasField("lease_ttl") else None),
                request.fencing_token,
                deadline=deadline,
            )
        _audit(context, "reservation.renew", reservation)
        return pb.RenewResponse(reservation=reservation_to_pb(reservation))

    def Release(
        self, request: pb.ReleaseRequest, context: grpc.ServicerContext
    ) -> pb.ReleaseResponse:
        deadline = self._deadline(context)
        with self._errors_shown_to(current_principal(context)):
            released = self._service.release(
                request.reservation_id,
                self._owner(context, request.reservation_id, request.owner, deadline),
                request.fencing_token,
                request.allow_missing,
                deadline=deadline,
            )
        response = pb.ReleaseResponse()
        if released is not None:
            _audit(context, "reservation.release", released)
            response.reservation.CopyFrom(reservation_to_pb(released))
        return response

    def ReportDeviceConditions(
        self, request: pb.ReportDeviceConditionsRequest, context: grpc.ServicerContext
    ) -> pb.ReportDeviceConditionsResponse:
        conditions = device_conditions_from_pb(request.conditions)
        reservation, released = self._service.report_device_conditions(
            request.reservation_id,
            conditions,
            request.fencing_token,
            deadline=self._deadline(context),
        )
        audit_call(
            context,
            "reservation.conditions",
            reservation=reservation.id,
            owner=reservation.owner,
            node=reservation.node,
            conditions=[f"{c.device} {c.type}={c.status}" for c in conditions],
            released=released,
        )
        shown = visible_reservation(reservation, current_principal(context))  # an agent: held
        return pb.ReportDeviceConditionsResponse(
            reservation=reservation_to_pb(shown),
            released=bool(released),
            released_reason=released.removeprefix("binding:").strip(),
        )

    def GetReservation(
        self, request: pb.GetReservationRequest, context: grpc.ServicerContext
    ) -> pb.GetReservationResponse:
        principal = current_principal(context)
        with self._errors_shown_to(principal):
            reservation = self._service.get(
                request.reservation_id, deadline=self._deadline(context)
            )
        shown = visible_reservation(reservation, principal)
        return pb.GetReservationResponse(reservation=reservation_to_pb(shown))

    def ListReservations(
        self, request: pb.ListReservationsRequest, context: grpc.ServicerContext
    ) -> pb.ListReservationsResponse:
        principal = current_principal(context)
        page, token = self._service.list_reservations(
            owner=principal.qualified(request.owner),
            node=request.node_name,
            state=reservation_state_from_pb(request.state),
            page_size=request.page_size,
            page_token=request.page_token,
            deadline=self._deadline(context),
        )
        return pb.ListReservationsResponse(
            reservations=[reservation_to_pb(visible_reservation(r, principal)) for r in page],
            next_page_token=token,
        )

    def QuotaStatus(
        self, request: pb.QuotaStatusRequest, context: grpc.ServicerContext
    ) -> pb.QuotaStatusResponse:
        principal = current_principal(context)
        asked = list(request.tenants)
        if not principal.sees_all_tenants:
            own = principal.tenant or ""
            others = sorted(set(asked) - {own})
            if others:
                raise PermissionDenied(
                    f"QuotaStatus: identity {principal.name} may see only its own tenant's "
                    f"quotas ({own or 'none'}), not {', '.join(others)}"
                )
            asked = [own] if own else []
            if not asked:
                return pb.QuotaStatusResponse()
        rows, enabled = self._service.quota_status(asked)
        # the cohorts above the tenants shown (their aggregates name no reservation): a tenant
        # sees the tree it borrows from; every cohort for a caller that sees every tenant
        cohorts = self._service.cohort_status(asked) if enabled else []
        fair = enabled and self._service.fair_sharing
        return quota_status_response(rows, enabled, cohorts, fair)

    def WatchReservations(
        self, request: pb.WatchReservationsRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.WatchReservationsResponse]:
        shown = watched_changes(
            current_principal(context), owner=request.owner, node=request.node_name
        )
        changes = self._watch.watch(
            shown, heartbeat_seconds=self._watch_heartbeat_seconds, is_active=context.is_active
        )
        for change in changes:
            yield reservation_change_to_pb(change)

    def _owner(
        self,
        context: grpc.ServicerContext,
        reservation_id: str,
        requested: str,
        deadline: Deadline,
    ) -> str:
        """The owner a change of a reservation acts as: the caller's, or — for a principal
        that may act on every tenant's reservations — the reservation's own."""
        principal = current_principal(context)
        if principal.sees_all_tenants and not principal.development:
            return self._service.get(reservation_id, deadline=deadline).owner
        return principal.owner(requested)

    def _visible(self, answer: Answer, principal: Principal) -> Answer:
        return visible_answer(answer, principal, self._service.holdings.owner_of)

    def _errors_shown_to(self, principal: Principal) -> AbstractContextManager[None]:
        return visible_errors(principal, self._service.holdings.owner_of)

    def _error_shown(self, error: GpuallocError, principal: Principal) -> GpuallocError:
        """An item's error as the caller may see it (`visible_errors`, as a value)."""
        try:
            with self._errors_shown_to(principal):
                raise error
        except GpuallocError as shown:
            return shown


MAX_STREAM_PASS_ITEMS = 64
"""The most items of an AllocateStream placed in one pass, and the most read ahead while a
pass runs (the reader then stops reading: gRPC's flow control holds the client)."""
MAX_STREAM_WAITING_BYTES = 4 * 1024 * 1024
"""The most bytes of requests an AllocateStream reads ahead while a pass runs: with the message
the reader has in hand (at most max_receive_message_length), what one stream can make the
server hold, whatever its clients send (64 requests of 16 MiB would otherwise be 1 GiB)."""
_WITHDRAW_SECONDS = 10.0  # releasing what a call that ended left, without a max_call_seconds


def _pass_deadline(stream: Deadline, cap: float | None) -> Deadline:
    """A pass's deadline: the stream's, at most `cap` seconds from now; the stream's end."""
    at = stream.at
    if cap is not None:
        capped = time.monotonic() + cap
        at = capped if at is None else min(at, capped)
    return Deadline(at, stream.cancelled)


def _quota_owner(principal: Principal) -> str:
    """The owner whose tenant's quota Explain checks: the caller's, if it may hold any."""
    if principal.development:
        return principal.owner()
    return principal.owner() if principal.tenant is not None else ""
