"""Both bridges act on a preemption at once: a WatchReservations stream wakes their loop.

Each bridge learns what became of a reservation on its next pass (the Slurm bridge's sync
requeues the job, the Kueue sidecar sends the Workload back to Retry), and a pass comes every
`--interval` / `GPUALLOC_KUEUE_RESYNC`. `follow_preemptions` runs beside that loop and calls
`wake` as soon as gpualloc revokes a reservation of the bridge's own (a PREEMPTED change whose
owner `ours` accepts), so the victim's job stops using the GPUs within the stream's latency
rather than up to an interval later. A RESYNC (changes lost) wakes it too. The passes stay the
truth: the stream is at most once, and an allocator without WatchReservations (UNIMPLEMENTED)
leaves the bridge to its passes alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc

from services.client.client import AllocatorClient
from services.common.errors import GpuallocError
from services.common.grpc_errors import RemoteError

__all__ = ["follow_preemptions", "start_following"]

log = logging.getLogger("gpualloc.bridges")

STREAM_SECONDS = 300.0  # each stream is reopened after this long (proxies drop idle streams)
REOPEN_SECONDS = 5.0  # after a failed stream


def follow_preemptions(
    client: AllocatorClient,
    ours: Callable[[str], bool],
    wake: Callable[[], None],
    stop: threading.Event,
    *,
    stream_seconds: float = STREAM_SECONDS,
    reopen_seconds: float = REOPEN_SECONDS,
) -> None:
    """Until `stop`: call `wake` for every PREEMPTED change of an owner `ours` accepts, and for
    every RESYNC (see the module docstring)."""
    while not stop.is_set():
        try:
            for change in client.watch(seconds=stream_seconds):
                if stop.is_set():
                    return
                if change.kind == "resync" or (change.kind == "preempted" and ours(change.owner)):
                    log.info("reservation %s preempted by %s", change.reservation_id,
                             change.preempted_by or "?")  # fmt: skip
                    wake()
        except GpuallocError as error:
            if stop.is_set():
                return  # the bridge is stopping: its client was closed under the stream
            if isinstance(error, RemoteError) and error.code is grpc.StatusCode.UNIMPLEMENTED:
                log.info("the allocator has no WatchReservations: passes see preemptions")
                return
            log.warning("watching preemptions failed (%s); again in %gs", error, reopen_seconds)
            stop.wait(reopen_seconds)


def start_following(
    client: AllocatorClient,
    ours: Callable[[str], bool],
    wake: Callable[[], None],
    stop: threading.Event,
) -> threading.Thread:
    """`follow_preemptions` on a daemon thread of its own."""
    thread = threading.Thread(
        target=follow_preemptions,
        args=(client, ours, wake, stop),
        name="gpualloc-preemptions",
        daemon=True,
    )
    thread.start()
    return thread
