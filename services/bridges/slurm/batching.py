"""The prologs of one moment reserved in one AllocateBatch call, and the inventory kept warm.

Slurm starts jobs in waves: a scheduling pass allocates many, and slurmctld runs their
PrologSlurmctld side by side, so `gpualloc-slurm sync --socket` serves many prologs at once,
each on its own thread. `AllocateBatcher` turns their reserving Allocates into AllocateBatch
calls (docs/api.md): a call that finds no batch in flight is sent at once, unless other
prologs are in the service and not yet queued (`arriving`: still reading Slurm's ids); then it
waits for them, at most GATHER_SECONDS (3 ms). Calls that come while one is in flight wait for
it and go together in the next. A wave of N costs one or two round trips, not N, and a job
that starts alone waits for nobody.
AllocateBatch places its items in order, each seeing the reservations of the ones before it,
and answers each with its own result, so every prolog gets exactly what its own Allocate would
have given it (an error of its item alone is raised in its thread). An allocator without
AllocateBatch (UNIMPLEMENTED) gets one Allocate per prolog from then on.

`BatchingClient` is the AllocatorClient a hook's command runs on in the service: its reserving
`allocate` goes through the batcher; everything else is the client's own.

`WarmInventory` answers the hooks' inventory reads (a node's devices, their UUIDs) from a copy
at most `max_age` old instead of a GetInventory per prolog and per task prolog; the prolog
still reserves the devices in the allocator, which checks them against its own inventory.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from services.bridges.placing import slurm_job_of
from services.client.client import AllocateItem, AllocatorClient
from services.client.inventory import InventoryClient, NodeInventory
from services.client.results import Placement, Reservation
from services.common.errors import GpuallocError
from services.common.grpc_errors import RemoteError

__all__ = [
    "RESERVED_JOBS",
    "SPENT",
    "AllocateBatcher",
    "BatchingClient",
    "Reserved",
    "Spent",
    "WarmInventory",
]

log = logging.getLogger("gpualloc.slurm.batching")

MAX_BATCH = 64
"""Items per AllocateBatch call (the rest wait for the next)."""
GATHER_SECONDS = 0.003
"""How long a prolog that finds nothing queued waits for the others of its wave already in the
service (slurmscriptd starts a scheduling pass's prologs one after the other, 1-5 ms apart
here: without it the first goes alone and the rest wait for its round trip). A fixed wait for
every prolog cost a job that starts alone 3 ms for nothing."""
INVENTORY_MAX_AGE_SECONDS = 10.0


@dataclass
class _Slot:
    item: AllocateItem
    result: Placement | GpuallocError | None = None
    queued: float = field(default_factory=time.monotonic)
    sent: float = 0.0
    answered: float = 0.0
    batch: int = 0


class Spent(threading.local):
    """Where a hook's thread spent its time in the service (the service logs it per hook):
    milliseconds reading Slurm's ids, waiting to be sent (the wave's gathering, a call in
    flight), in the reserving call, and the call's batch size."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.ids_ms = 0.0
        self.waited_ms = 0.0
        self.call_ms = 0.0
        self.batch = 0

    def summary(self) -> str:
        return (
            f"Slurm's ids {self.ids_ms:.1f} ms, waited {self.waited_ms:.1f} ms, "
            f"reserve {self.call_ms:.1f} ms for {self.batch}"
        )


SPENT = Spent()


@dataclass
class AllocateBatcher:
    """Concurrent reserving Allocates sent together (the module docstring)."""

    client: AllocatorClient
    max_batch: int = MAX_BATCH
    gather_seconds: float = GATHER_SECONDS
    batches: int = 0
    """AllocateBatch calls made (and single Allocates, once the allocator has no batches)."""
    _queue: list[_Slot] = field(default_factory=list)
    _busy: bool = False
    _batch_call: bool = True
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _coming: int = 0
    _mine: threading.local = field(default_factory=threading.local)

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """A prolog's whole stay in the service: until its first `allocate` (or its end, when
        it reserves nothing) it counts as coming, and a call about to go alone waits for it."""
        with self._changed:
            self._coming += 1
        self._mine.coming = True
        try:
            yield
        finally:
            self._arrived()

    def _arrived(self) -> None:
        if getattr(self._mine, "coming", False):
            self._mine.coming = False
            with self._changed:
                self._coming -= 1
                self._changed.notify_all()

    def allocate(self, item: AllocateItem) -> Placement:
        """The item's Placement, as `client.allocate` would answer it; its error raised."""
        slot = _Slot(item)
        self._arrived()
        with self._changed:
            self._queue.append(slot)
            while slot.result is None:
                if self._busy:
                    self._changed.wait()
                    continue
                self._busy = True
                if self._coming and len(self._queue) < self.max_batch and self.gather_seconds:
                    self._changed.wait_for(  # the rest of the wave in the service joins it
                        lambda: not self._coming or len(self._queue) >= self.max_batch,
                        self.gather_seconds,
                    )
                batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
                self._changed.release()
                began = time.monotonic()
                results: list[Placement | GpuallocError] = []
                try:
                    results = self._send([s.item for s in batch])
                finally:  # a bug in the call: its items fail with it, none waits forever
                    self._changed.acquire()
                    answered = time.monotonic()
                    for queued in batch:
                        queued.sent, queued.answered, queued.batch = began, answered, len(batch)
                    self._busy = False
                    failed = GpuallocError("the batch's Allocate failed (see the service's log)")
                    for sent, result in zip(batch, results or [failed] * len(batch), strict=True):
                        sent.result = result
                    self._changed.notify_all()
        SPENT.waited_ms += (slot.sent - slot.queued) * 1000
        SPENT.call_ms += (slot.answered - slot.sent) * 1000
        SPENT.batch = max(SPENT.batch, slot.batch)
        if isinstance(slot.result, GpuallocError):
            raise slot.result
        return slot.result

    def _send(self, items: Sequence[AllocateItem]) -> list[Placement | GpuallocError]:
        self.batches += 1
        try:
            if len(items) > 1 and self._batch_call:
                try:
                    return self.client.allocate_many(items)
                except RemoteError as error:
                    if error.code is not grpc.StatusCode.UNIMPLEMENTED:
                        raise
                    log.info("the allocator has no AllocateBatch: one Allocate per prolog")
                    self._batch_call = False
            return [self._one(item) for item in items]
        except GpuallocError as error:  # the whole call failed: every item with it
            return [error] * len(items)

    def _one(self, item: AllocateItem) -> Placement | GpuallocError:
        try:
            return self.client.allocate(
                item.claims,
                node_name=item.node_name,
                node_selector=item.node_selector,
                policy=item.policy,
                device_classes=item.device_classes,
                explain=item.explain,
                reserve=item.reserve,
                lease_ttl_seconds=item.lease_ttl_seconds,
                owner=item.owner,
                idempotency_key=item.idempotency_key,
                labels=item.labels,
                gang=item.gang,
                priority_class=item.priority_class,
                preempt=item.preempt,
                queued_at=item.queued_at,
            )
        except GpuallocError as error:
            return error


RESERVED_JOBS = 4096
"""Jobs whose reservations `Reserved` keeps (a few KiB each)."""


class Reserved:
    """The reservations this service made, by Slurm job: what a job's release frees without
    listing first (the prolog and the job completion script both run in the controller's
    sync). At most `limit` jobs, the oldest forgotten first: with the node Epilog wiring the
    releases come to the compute nodes' services, and this one never hears of them. A job it
    does not know is listed."""

    def __init__(self, limit: int = RESERVED_JOBS) -> None:
        self.limit = limit
        self._by_job: OrderedDict[str, dict[str, Reservation]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, placement: Placement) -> None:
        with self._lock:
            for reservation in placement.reservations:
                job_id = slurm_job_of(reservation.owner)
                if job_id is None:
                    continue
                self._by_job.setdefault(job_id, {})[reservation.node_name] = reservation
                self._by_job.move_to_end(job_id)
            while len(self._by_job) > self.limit:
                self._by_job.popitem(last=False)

    def pop(self, job_id: str, nodes: Collection[str] | None = None) -> list[Reservation] | None:
        """The job's reservations (on `nodes` only, when given), forgotten; None when none
        was made here (list them)."""
        with self._lock:
            held = self._by_job.get(job_id)
            if held is None:
                return None
            if nodes is None or set(held) <= set(nodes):
                del self._by_job[job_id]
                return list(held.values())
            if not set(held) & set(nodes):
                return None
            return [held.pop(node) for node in nodes if node in held]


class BatchingClient(AllocatorClient):
    """An AllocatorClient whose reserving `allocate` goes through a shared AllocateBatcher
    (and what it reserves is remembered in `reserved`)."""

    def __init__(
        self, batcher: AllocateBatcher, reserved: Reserved | None = None, **options: Any
    ) -> None:
        super().__init__(batcher.client.target, channel=batcher.client.channel, **options)
        self._batcher = batcher
        self._reserved = reserved

    def for_job(self) -> BatchingClient:
        """A client for one hook (whose owner it sets) on the same stub, channel and batcher:
        a copy, as building a client's stub costs more than a hook's own work."""
        return copy.copy(self)

    def allocate(self, claims: Sequence[Any], **options: Any) -> Placement:
        if not options.get("reserve"):
            return super().allocate(claims, **options)
        options["owner"] = self._owner(options.get("owner"))
        placement = self._batcher.allocate(AllocateItem(claims, **options))
        if self._reserved is not None and placement.fits:
            self._reserved.add(placement)
        return placement


class WarmInventory(InventoryClient):
    """An InventoryClient whose `node` and `nodes` answer from copies at most `max_age` old,
    read again when older (a read that fails is not kept): the long-running hooks service's,
    so a prolog or task prolog costs no GetInventory."""

    def __init__(
        self,
        target: str,
        *,
        max_age: float = INVENTORY_MAX_AGE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        **options: Any,
    ) -> None:
        super().__init__(target, **options)
        self.max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._copies: dict[tuple[str, bool], tuple[float, list[NodeInventory]]] = {}
        self.reads = 0

    def nodes(self, node_name: str = "", *, topology: bool = True) -> list[NodeInventory]:
        key = (node_name, topology)
        with self._lock:
            found = self._copies.get(key)
            if found is not None and self._clock() - found[0] < self.max_age:
                return list(found[1])
        read = super().nodes(node_name, topology=topology)
        with self._lock:
            self.reads += 1
            now = self._clock()
            self._copies[key] = (now, read)
            if not node_name:  # every node's copy too
                self._copies.update({(n.name, topology): (now, [n]) for n in read})
        return list(read)

    def forget(self) -> None:
        """Read everything anew next time."""
        with self._lock:
            self._copies.clear()
