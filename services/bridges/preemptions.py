"""Both bridges act on a preemption at once: a WatchReservations stream wakes their loop.

Each bridge learns what became of a reservation on its next pass (the Slurm bridge's sync
requeues the job, the Kueue sidecar sends the Workload back to Retry), and a pass comes every
`--interval` / `GPUALLOC_KUEUE_RESYNC`. A `PreemptionFollower` runs beside that loop and calls
`wake` as soon as gpualloc revokes a reservation of the bridge's own (a PREEMPTED change whose
owner `ours` accepts), so the victim's job stops using the GPUs within the stream's latency
rather than up to an interval later. A RESYNC (changes lost) wakes it too. `wake` must be
quick (set an Event): the bridge's loop runs the pass, never the stream's thread.

The passes stay the truth: the stream is at most once. A stream that fails is opened again
after `reopen_seconds`; an allocator without WatchReservations (UNIMPLEMENTED: an older
replica) after `unimplemented_seconds`, the bridge meanwhile left to its passes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc

from services.client.client import AllocatorClient, ReservationChanges
from services.common.grpc_errors import RemoteError

__all__ = ["PreemptionFollower"]

log = logging.getLogger("gpualloc.bridges")


class PreemptionFollower:
    def __init__(
        self,
        client: AllocatorClient,
        ours: Callable[[str], bool],
        wake: Callable[[], None],
        *,
        stream_seconds: float = 300.0,  # reopened this often (proxies drop long streams)
        reopen_seconds: float = 5.0,
        unimplemented_seconds: float = 300.0,
        watching: threading.Event | None = None,
    ) -> None:
        """`watching` is set while a stream is registered with the allocator (changes from
        then on wake the bridge) and cleared when it ends."""
        self._client = client
        self._ours = ours
        self._wake = wake
        self._stream_seconds = stream_seconds
        self._reopen_seconds = reopen_seconds
        self._unimplemented_seconds = unimplemented_seconds
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stream: ReservationChanges | None = None
        self.watching = watching if watching is not None else threading.Event()
        self._thread = threading.Thread(target=self._follow, name="gpualloc-preemptions")
        self._thread.daemon = True

    def start(self) -> PreemptionFollower:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop: the open stream is cancelled (its server slot freed at once), and the thread
        is joined."""
        self._stop.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.cancel()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                stream = self._client.watch(seconds=self._stream_seconds)
                with self._lock:
                    self._stream = stream
                if self._stop.is_set():
                    stream.cancel()
                self.watching.set()
                for change in stream:
                    if change.kind == "resync":
                        log.info("reservation changes were lost: a pass looks at everything")
                        self._call_wake()
                    elif change.kind == "preempted" and self._ours(change.owner):
                        log.info(
                            "reservation %s of %s was preempted by %s",
                            change.reservation_id,
                            change.owner,
                            change.preempted_by,
                        )
                        self._call_wake()
            except Exception as error:  # noqa: BLE001 - logged; the thread must go on
                if self._stop.is_set():
                    return
                if isinstance(error, RemoteError) and error.code is grpc.StatusCode.UNIMPLEMENTED:
                    log.info(
                        "the allocator has no WatchReservations (an older version): passes see "
                        "preemptions; asking again in %gs",
                        self._unimplemented_seconds,
                    )
                    self._stop.wait(self._unimplemented_seconds)
                else:
                    log.warning(
                        "watching for preemptions failed (%s); again in %gs",
                        error,
                        self._reopen_seconds,
                    )
                    self._stop.wait(self._reopen_seconds)
            finally:
                self.watching.clear()
                with self._lock:
                    self._stream = None

    def _call_wake(self) -> None:
        try:
            self._wake()
        except Exception:  # the follower outlives a bug in the bridge's wake-up
            log.exception("waking the bridge for a preemption failed")
