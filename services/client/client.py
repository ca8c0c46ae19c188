"""`AllocatorClient`: the allocator's RPCs with model values in and small results out.

    with AllocatorClient("127.0.0.1:50051", owner="slurm/job/17") as client:
        claim = claim_from_spec("4 x H100 nvlink", name="job-17")
        placement = client.allocate([claim], reserve=True, idempotency_key="slurm-17")
        if not placement.fits:
            print(client.explain([claim]).reason())

Every call has the client's deadline and retry policy (services/client/calls.py); failures are
the typed errors of services.common.errors (Conflict for ABORTED, NotFound, InvalidArgument with
field paths, ...). A reserving call without an idempotency key gets a generated one, so that a
retry after UNAVAILABLE cannot reserve twice. `lease()` wraps allocate -> reserve -> commit or
release in a context manager (services/client/lease.py). `gang=Gang(n, label)` asks for the
claims on each of n nodes sharing one value of the node label (`Placement.gang`: one
NodePlacement per node); reserve a gang with allocate(reserve=True).
"""

from __future__ import annotations

import copy
import random as random_module
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from google.rpc import status_pb2

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from services.client.calls import Caller, open_channel
from services.client.config import RetryPolicy, TlsConfig
from services.client.lease import Lease
from services.client.mapping import (
    capacity_from_pb,
    duration_to_pb,
    placement_from_pb,
    reservation_change_from_pb,
    reservation_from_pb,
    state_to_pb,
    to_pb_claim_allocations,
)
from services.client.results import (
    Capacity,
    CohortQuota,
    Placement,
    QuotaStatus,
    Reservation,
    ReservationChange,
    ReservationState,
    TenantQuota,
)
from services.client.topology import to_pb_topology_constraints
from services.common.dra.model import DeviceClass, DeviceID, NodeSelector, ResourceClaim
from services.common.errors import GpuallocError
from services.common.grpc_errors import error_from_rpc, error_from_status
from services.common.pb.dra_mapping import (
    to_pb_device_class,
    to_pb_device_id,
    to_pb_node_selector,
    to_pb_resource_claim,
)

__all__ = ["AllocateItem", "AllocatorClient", "Gang", "Policy", "ReservationChanges"]


class Policy(StrEnum):
    """How the allocator chooses among feasible placements (unset: the server's default)."""

    FIRST_FIT = "first-fit"
    BINPACK = "binpack"
    SPREAD = "spread"
    FRAGMENTATION_AWARE = "fragmentation-aware"


_POLICIES = {
    Policy.FIRST_FIT: pb.ALLOCATION_POLICY_FIRST_FIT,
    Policy.BINPACK: pb.ALLOCATION_POLICY_BINPACK,
    Policy.SPREAD: pb.ALLOCATION_POLICY_SPREAD,
    Policy.FRAGMENTATION_AWARE: pb.ALLOCATION_POLICY_FRAGMENTATION_AWARE,
}

ReservationRef = Reservation | str


@dataclass(frozen=True)
class Gang:
    """A multi-node job: the claims on each of `node_count` distinct nodes, all sharing one
    value of the node label `group_by_label` (e.g. `nvidia.com/gpu.clique`; empty: any
    nodes). All or nothing; reserved as one reservation per node."""

    node_count: int
    group_by_label: str = ""


@dataclass(frozen=True)
class AllocateItem:
    """One item of `allocate_many`: the arguments of `allocate`, as values."""

    claims: Sequence[ResourceClaim]
    node_name: str = ""
    node_selector: NodeSelector | None = None
    policy: Policy | None = None
    device_classes: Sequence[DeviceClass] = ()
    explain: bool = False
    reserve: bool = False
    lease_ttl_seconds: float | None = None
    owner: str | None = None
    idempotency_key: str = ""
    labels: Mapping[str, str] | None = None
    gang: Gang | None = None
    priority_class: str = ""
    preempt: bool = False
    queued_at: float | None = None  # when the work was queued (seconds since the epoch)


def _id(reservation: ReservationRef) -> str:
    return reservation if isinstance(reservation, str) else reservation.id


class AllocatorClient:
    """A synchronous client of `gpualloc.allocator.v1.Allocator`; close it (or use `with`)."""

    def __init__(
        self,
        target: str,
        *,
        tls: TlsConfig | None = None,
        token_file: Path | str | None = None,
        deadline_seconds: float = 10.0,
        retry: RetryPolicy | None = None,
        owner: str = "",
        channel: grpc.Channel | None = None,
        sleep: Callable[[float], None] = time.sleep,
        random: Callable[[], float] = random_module.random,
        tenant: str = "",
    ) -> None:
        """`owner` is sent with every call (`x-gpualloc-owner`) unless a call names another;
        `tenant`, the tenant every call acts for (`x-gpualloc-tenant`, when the access policy
        lets the caller: docs/security.md). `tls` and `token_file` (a bearer JWT, TLS only)
        secure the channel (calls.open_channel). Pass `channel` to share one (the client then
        does not close it)."""
        self.target = target
        self.owner = owner
        self.tenant = tenant
        self._owns_channel = channel is None
        self._channel = (
            channel if channel is not None else open_channel(target, tls, token_file=token_file)
        )
        self._stub = allocator_pb2_grpc.AllocatorStub(self._channel)
        self._caller = Caller(
            self._channel,
            deadline_seconds=deadline_seconds,
            retry=retry or RetryPolicy(),
            sleep=sleep,
            random=random,
            tenant=tenant,
        )

    @property
    def channel(self) -> grpc.Channel:
        return self._channel

    def for_tenant(self, tenant: str) -> AllocatorClient:
        """A client on the same channel (it closes nothing) whose every call acts for
        `tenant` ("": the identity's own), with this one's owner, deadline and retries."""
        if tenant == self.tenant:
            return self
        acting = copy.copy(self)
        acting.tenant = tenant
        acting._owns_channel = False
        acting._caller = self._caller.for_tenant(tenant)
        return acting

    def close(self) -> None:
        if self._owns_channel:
            self._channel.close()

    def __enter__(self) -> AllocatorClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- queries ------------------------------------------------------------------------------

    def allocate(
        self,
        claims: Sequence[ResourceClaim],
        *,
        node_name: str = "",
        node_selector: NodeSelector | None = None,
        policy: Policy | None = None,
        device_classes: Sequence[DeviceClass] = (),
        explain: bool = False,
        reserve: bool = False,
        lease_ttl_seconds: float | None = None,
        owner: str | None = None,
        idempotency_key: str = "",
        labels: Mapping[str, str] | None = None,
        gang: Gang | None = None,
        priority_class: str = "",
        preempt: bool = False,
        queued_at: float | None = None,
    ) -> Placement:
        """A placement for the claims together on one node (on each node of a `gang`),
        reserved when `reserve` is set; with `preempt` too, revoking the reservations the
        server's preemption rules choose when that is what makes it fit (docs/tenancy.md).
        `queued_at`: when the work was queued in its batch system (seconds since the epoch;
        unset: when the call arrives)."""
        item = AllocateItem(
            claims,
            node_name=node_name,
            node_selector=node_selector,
            policy=policy,
            device_classes=device_classes,
            explain=explain,
            reserve=reserve,
            lease_ttl_seconds=lease_ttl_seconds,
            owner=owner,
            idempotency_key=idempotency_key,
            labels=labels,
            gang=gang,
            priority_class=priority_class,
            preempt=preempt,
            queued_at=queued_at,
        )
        request = self._allocate_request(item)
        response = self._caller.call(
            self._stub.Allocate, request, read=not reserve, owner=self._owner(owner)
        )
        return placement_from_pb(response)

    def allocate_many(self, items: Sequence[AllocateItem]) -> list[Placement | GpuallocError]:
        """Many allocates in one AllocateBatch call (docs/api.md): placed in order, each seeing
        the reservations of the ones before it; one result per item, the Placement or the
        typed error that item alone failed with (the call itself raises only for what fails
        it whole: UNAVAILABLE after the retries, PERMISSION_DENIED, a batch too large)."""
        requests = [self._allocate_request(item) for item in items]
        owners = {r.owner for r in requests if r.reserve}
        request = pb.AllocateBatchRequest(items=requests)
        response = self._caller.call(
            self._stub.AllocateBatch,
            request,
            read=not owners,
            owner=owners.pop() if len(owners) == 1 else "",  # each item's field otherwise
        )
        return [
            placement_from_pb(result.response)
            if result.HasField("response")
            else error_from_status(
                status_pb2.Status(
                    code=result.error.code,
                    message=result.error.message,
                    details=result.error.details,
                )
            )
            for result in response.items
        ]

    def allocate_stream(
        self,
        items: Iterable[AllocateItem],
        *,
        window: int = 64,
        deadline_seconds: float | None = None,
    ) -> Iterator[Placement | GpuallocError]:
        """Allocates over one AllocateStream call (docs/api.md): the items are sent as they
        come from `items` (a scheduler's queue may be a generator that blocks for its next
        job), at most `window` of them sent and not yet answered, and this yields one result
        per item in order, as the answers come: the Placement, or the typed error that item
        alone failed with. The server places the items it has received together in one pass,
        each seeing the reservations of the ones before it. Iterating raises the typed error
        of the call itself (UNAVAILABLE, RESOURCE_EXHAUSTED when the server has no stream
        left, DEADLINE_EXCEEDED after `deadline_seconds`, None: none); closing the iterator
        early cancels the call, and the server releases the reservations of answers it had
        not sent yet. No retries: a broken stream's unanswered items are for the caller to
        send again (their idempotency keys make that safe)."""
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        room = threading.Semaphore(window)
        ended = threading.Event()

        def requests() -> Iterator[pb.AllocateStreamRequest]:
            for item in items:  # on grpc's thread that sends the requests
                room.acquire()
                if ended.is_set():
                    return
                yield pb.AllocateStreamRequest(item=self._allocate_request(item))

        call = self._stub.AllocateStream(
            requests(), timeout=deadline_seconds, metadata=self._caller.metadata()
        )
        try:
            for response in call:
                room.release()
                result = response.item
                if result.HasField("response"):
                    yield placement_from_pb(result.response)
                else:
                    yield error_from_status(
                        status_pb2.Status(
                            code=result.error.code,
                            message=result.error.message,
                            details=result.error.details,
                        )
                    )
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        finally:
            ended.set()
            room.release()  # the sender, if it waits for room, sees the end
            call.cancel()  # no-op once the call has ended; else the server stops at once

    def _allocate_request(self, item: AllocateItem) -> pb.AllocateRequest:
        request = pb.AllocateRequest(explain=item.explain, reserve=item.reserve)
        _fill_query(
            request,
            item.claims,
            item.node_name,
            item.node_selector,
            item.policy,
            item.device_classes,
            item.gang,
        )
        request.priority_class_name = item.priority_class
        if item.reserve:
            request.preempt = item.preempt
            request.owner = self._owner(item.owner)
            request.idempotency_key = item.idempotency_key or f"client-{uuid.uuid4().hex}"
            request.reservation_labels.update(item.labels or {})
            if item.lease_ttl_seconds is not None:
                request.lease_ttl.CopyFrom(duration_to_pb(item.lease_ttl_seconds))
            if item.queued_at is not None:
                request.queued_time.FromNanoseconds(int(item.queued_at * 1e9))
        return request

    def explain(
        self,
        claims: Sequence[ResourceClaim],
        *,
        node_name: str = "",
        node_selector: NodeSelector | None = None,
        policy: Policy | None = None,
        device_classes: Sequence[DeviceClass] = (),
        max_nodes: int = 0,
        gang: Gang | None = None,
        priority_class: str = "",
        queued_at: float | None = None,
    ) -> Placement:
        """Why the claims fit or not (the same search as allocate, never reserving), and
        which reservations a preempting allocate at `priority_class` (its work queued at
        `queued_at`) would revoke."""
        request = pb.ExplainRequest(
            max_nodes_explained=max_nodes, priority_class_name=priority_class
        )
        if queued_at is not None:
            request.queued_time.FromNanoseconds(int(queued_at * 1e9))
        _fill_query(request, claims, node_name, node_selector, policy, device_classes, gang)
        return placement_from_pb(self._caller.call(self._stub.Explain, request, read=True))

    def capacity(
        self,
        claims: Sequence[ResourceClaim],
        *,
        node_name: str = "",
        node_selector: NodeSelector | None = None,
        policy: Policy | None = None,
        device_classes: Sequence[DeviceClass] = (),
        ignore_reservations: bool = False,
        gang: Gang | None = None,
    ) -> Capacity:
        """How many copies of the claims fit now (or at all, with `ignore_reservations`); with
        `gang`, how many such gangs (Capacity.nodes: the copies per node they come from)."""
        request = pb.CapacityRequest(ignore_reservations=ignore_reservations)
        _fill_query(request, claims, node_name, node_selector, policy, device_classes, gang)
        return capacity_from_pb(self._caller.call(self._stub.Capacity, request, read=True))

    # --- reservations -------------------------------------------------------------------------

    def reserve(
        self,
        placement: Placement,
        *,
        lease_ttl_seconds: float | None = None,
        owner: str | None = None,
        idempotency_key: str = "",
        labels: Mapping[str, str] | None = None,
        priority_class: str = "",
    ) -> list[Reservation]:
        """Take a placement from allocate(); Conflict (ABORTED) when something moved since."""
        who = self._owner(owner)
        request = pb.ReserveRequest(
            node_name=placement.node_name,
            allocations=to_pb_claim_allocations(placement.allocations),
            owner=who,
            idempotency_key=idempotency_key or f"client-{uuid.uuid4().hex}",
            labels=dict(labels or {}),
            priority_class_name=priority_class,
        )
        if lease_ttl_seconds is not None:
            request.lease_ttl.CopyFrom(duration_to_pb(lease_ttl_seconds))
        response = self._caller.call(self._stub.Reserve, request, read=False, owner=who)
        return [reservation_from_pb(r) for r in response.reservations] or [
            reservation_from_pb(response.reservation)
        ]

    def commit(
        self, reservation: ReservationRef, *, owner: str | None = None, fencing_token: int = 0
    ) -> Reservation:
        """Make the reservation permanent until released (idempotent)."""
        who = self._owner(owner)
        request = pb.CommitRequest(
            reservation_id=_id(reservation), fencing_token=fencing_token, owner=who
        )
        response = self._caller.call(self._stub.Commit, request, read=False, owner=who)
        return reservation_from_pb(response.reservation)

    def release(
        self,
        reservation: ReservationRef,
        *,
        owner: str | None = None,
        fencing_token: int = 0,
        allow_missing: bool = False,
    ) -> Reservation | None:
        """Free the devices; None when it was already gone and `allow_missing` is set."""
        who = self._owner(owner)
        request = pb.ReleaseRequest(
            reservation_id=_id(reservation),
            fencing_token=fencing_token,
            owner=who,
            allow_missing=allow_missing,
        )
        response = self._caller.call(self._stub.Release, request, read=False, owner=who)
        return (
            reservation_from_pb(response.reservation) if response.HasField("reservation") else None
        )

    def renew(
        self,
        reservation: ReservationRef,
        *,
        lease_ttl_seconds: float | None = None,
        owner: str | None = None,
        fencing_token: int = 0,
    ) -> Reservation:
        """Extend an uncommitted lease to `lease_ttl_seconds` from now."""
        who = self._owner(owner)
        request = pb.RenewRequest(
            reservation_id=_id(reservation), fencing_token=fencing_token, owner=who
        )
        if lease_ttl_seconds is not None:
            request.lease_ttl.CopyFrom(duration_to_pb(lease_ttl_seconds))
        response = self._caller.call(self._stub.Renew, request, read=False, owner=who)
        return reservation_from_pb(response.reservation)

    def report_device_conditions(
        self,
        reservation: ReservationRef,
        conditions: Sequence[tuple[DeviceID, str, bool]],
        *,
        fencing_token: int = 0,
    ) -> tuple[Reservation, str]:
        """As a device's driver or agent: report (device, condition type, status) for a
        reservation's devices. Returns it as the report left it, and why the report released
        it ("" when it did not: docs/reservations.md, "Binding")."""
        request = pb.ReportDeviceConditionsRequest(
            reservation_id=_id(reservation),
            fencing_token=fencing_token,
            conditions=[
                pb.DeviceCondition(device=to_pb_device_id(d), type=kind, status=status)
                for d, kind, status in conditions
            ],
        )
        response = self._caller.call(self._stub.ReportDeviceConditions, request, read=False)
        released = response.released_reason if response.released else ""
        return reservation_from_pb(response.reservation), released

    def get(self, reservation_id: str) -> Reservation:
        request = pb.GetReservationRequest(reservation_id=reservation_id)
        response = self._caller.call(self._stub.GetReservation, request, read=True)
        return reservation_from_pb(response.reservation)

    def list(
        self,
        *,
        owner: str = "",
        node_name: str = "",
        state: ReservationState | None = None,
        page_size: int = 500,
    ) -> list[Reservation]:
        """Every matching reservation, sorted by id (all pages)."""
        found: list[Reservation] = []
        token = ""
        while True:
            request = pb.ListReservationsRequest(
                owner=owner,
                node_name=node_name,
                state=state_to_pb(state),
                page_size=page_size,
                page_token=token,
            )
            response = self._caller.call(self._stub.ListReservations, request, read=True)
            found.extend(reservation_from_pb(r) for r in response.reservations)
            token = response.next_page_token
            if not token:
                return found

    def watch(
        self, *, owner: str = "", node_name: str = "", seconds: float | None = None
    ) -> ReservationChanges:
        """The changes of the reservations the caller may see, as any replica makes them
        (WatchReservations, docs/api.md), of `owner` and on `node_name` when set: until the
        server ends the stream, `seconds` pass (None: no end), or `cancel()`. Returns once
        the server has registered the stream (its first message), so a list made after this
        call misses nothing; changes are at most once all the same (list again on a `resync`
        change). Not retried: a failure raises its typed error."""
        request = pb.WatchReservationsRequest(owner=owner, node_name=node_name)
        call = self._stub.WatchReservations(
            request, timeout=seconds, metadata=self._caller.metadata()
        )
        changes = ReservationChanges(call, ends=seconds is not None)
        next(changes, None)  # the first HEARTBEAT: registered
        return changes

    def quotas(self, tenants: Sequence[str] = ()) -> tuple[TenantQuota, ...]:
        """The tenants' quotas the caller may see (docs/tenancy.md); [] when none are set."""
        return self.quota_status(tenants).tenants

    def quota_status(self, tenants: Sequence[str] = ()) -> QuotaStatus:
        """The tenants' quotas the caller may see, the cohorts above them (docs/tenancy.md),
        and whether quotas and fair sharing are on."""
        request = pb.QuotaStatusRequest(tenants=list(tenants))
        response = self._caller.call(self._stub.QuotaStatus, request, read=True)
        return QuotaStatus(
            tuple(
                TenantQuota(
                    q.tenant,
                    q.resource,
                    q.cohort,
                    q.nominal,
                    q.used,
                    q.borrowed,
                    q.lent,
                    q.left,
                    q.borrowing_limit,
                    q.lending_limit,
                    q.pending_preemptions,
                    tuple(q.pending_preemption_ids),
                    tuple(q.cohort_path),
                    q.fair_sharing_weight or "1",
                    q.weighted_share,
                    q.dominant_resource,
                    q.decayed_used,
                    q.decayed_usage,
                    q.decayed_at.ToNanoseconds() / 1e9 if q.HasField("decayed_at") else None,
                )
                for q in response.tenants
            ),
            tuple(
                CohortQuota(
                    c.cohort,
                    c.resource,
                    tuple(c.cohort_path),
                    c.nominal,
                    c.subtree_quota,
                    c.used,
                    c.borrowed,
                    c.lent,
                    c.left,
                    c.borrowing_limit,
                    c.lending_limit,
                    c.fair_sharing_weight or "1",
                    c.weighted_share,
                    c.dominant_resource,
                )
                for c in response.cohorts
            ),
            response.enabled,
            response.fair_sharing,
        )

    # --- the lifecycle ------------------------------------------------------------------------

    def lease(
        self,
        claims: Sequence[ResourceClaim],
        *,
        owner: str | None = None,
        idempotency_key: str = "",
        node_name: str = "",
        node_selector: NodeSelector | None = None,
        policy: Policy | None = None,
        lease_ttl_seconds: float = 60.0,
        labels: Mapping[str, str] | None = None,
        commit_on_exit: bool = True,
    ) -> Lease:
        """allocate -> reserve on entry, renewing in the background; commit on a clean exit
        (or release, with `commit_on_exit=False`), release when the block raises."""

        def place() -> Placement:
            return self.allocate(
                claims,
                node_name=node_name,
                node_selector=node_selector,
                policy=policy,
                reserve=True,
                lease_ttl_seconds=lease_ttl_seconds,
                owner=owner,
                idempotency_key=idempotency_key,
                labels=labels,
            )

        def explain() -> Placement:
            return self.explain(
                claims, node_name=node_name, node_selector=node_selector, policy=policy
            )

        return Lease(
            self,
            place,
            owner=self._owner(owner),
            lease_ttl_seconds=lease_ttl_seconds,
            commit_on_exit=commit_on_exit,
            explain=explain,
        )

    def _owner(self, owner: str | None) -> str:
        return self.owner if owner is None else owner


QueryRequest = pb.AllocateRequest | pb.ExplainRequest | pb.CapacityRequest


def _fill_query(
    request: QueryRequest,
    claims: Sequence[ResourceClaim],
    node_name: str,
    node_selector: NodeSelector | None,
    policy: Policy | None,
    device_classes: Sequence[DeviceClass],
    gang: Gang | None = None,
) -> None:
    """Fields 1-7, which AllocateRequest, ExplainRequest and CapacityRequest share."""
    if gang is None:
        request.claims.extend(to_pb_resource_claim(c) for c in claims)
    else:
        request.gang.node_count = gang.node_count
        request.gang.group_by_label = gang.group_by_label
        request.gang.claims_per_node.extend(to_pb_resource_claim(c) for c in claims)
    request.device_classes.extend(to_pb_device_class(c) for c in device_classes)
    request.node_name = node_name
    request.topology_constraints.extend(to_pb_topology_constraints(claims))
    if node_selector is not None:
        request.node_selector.CopyFrom(to_pb_node_selector(node_selector))
    if policy is not None:
        request.policy = _POLICIES[policy]


class ReservationChanges(Iterator[ReservationChange]):
    """An open WatchReservations stream: iterate for its changes; `cancel()` (from any thread)
    ends it. Its deadline, when it was given one (`ends`), and a cancel are normal ends; any
    other failure raises the typed error."""

    def __init__(self, call: Any, *, ends: bool) -> None:
        self._call = call
        self._ends = ends
        self._cancelled = False

    def __next__(self) -> ReservationChange:
        try:
            return reservation_change_from_pb(next(self._call))
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else None
            if self._cancelled or (self._ends and code is grpc.StatusCode.DEADLINE_EXCEEDED):
                raise StopIteration from None
            raise error_from_rpc(error) from None

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()
