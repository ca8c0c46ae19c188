"""Where the allocator's CPU goes per claim: the servicer called in process, the parts timed.

    python -m loadtest.profile_service [--mode M] [--calls N] [--threads T] [--scale S]
                                       [--parts] [--cprofile FILE]

What `make bench ARGS=service` measures from outside (claims per second against one pinned
server), this measures from inside, for one row at a time: the bench's inventory
(bench_service.generate_inventory: 10,000 GPUs at scale 1), a real redis-server as the
bench's store, the app built as `gpualloc-allocator` builds it (with its GC policy,
services/common/gc_policy.py), and the servicer's method called directly by `--threads` threads
at once (the bench's client runs 16) — no gRPC transport, so what it reports is the servicer's
own work. Modes: `allocate-reserve-batch-64` (AllocateBatch of 64 one-H100 items with
reserve, the issue 29 row), `allocate-reserve` (unary Allocate(reserve)), `allocate-any-node`
(unary Allocate). A batch's reply is encoded as the server's handler encodes it (a reply the
servicer wrote serialized is taken as it is) and read after the measured calls; reservations
are released after them, untimed. Unary calls go
through the combiner as in the server (app/combining.py; `GPUALLOC_COMBINE_ALLOCATES=false`:
each alone); `combined_passes` says how many passes placed them.

It prints one JSON line: the process's CPU per claim (every thread's, the store's event
threads included) and the wall time per claim. `--parts` adds the CPU of the parts of a
reserving item (each a wrapper around one function that sums its thread CPU over all threads;
nested parts overlap); `--cprofile FILE` writes a cProfile of the first thread's calls.
docs/performance.md ("The per-claim cost of reserving") shows what it found.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from redis.client import PubSub

from loadtest.bench_service import (
    LEASE_SECONDS,
    SEED_DOCUMENT_LIMITS,
    _claim,
    _Redis,
    generate_inventory,
)
from protos.allocator.v1 import allocator_pb2 as pb
from services.allocator.adapters.grpc import mapping
from services.allocator.adapters.grpc import servicer as servicer_module
from services.allocator.adapters.store import redis_store
from services.allocator.app import combining, granting, live_reservations, placing, service
from services.allocator.app.inventory_feed import StaticFeed
from services.allocator.bootstrap import build_allocator
from services.allocator.config import AllocatorSettings
from services.allocator.core import AllocatedState
from services.common.config import read_document_limits
from services.common.gc_policy import GcPolicy
from services.common.grpc_errors import reply_serializer
from services.common.pb.dra_mapping import to_pb_resource_claim
from services.common.security.edge import CallInfo, _current
from services.common.security.principal import development_principal

MODES = ("allocate-reserve-batch-64", "allocate-reserve", "allocate-any-node")
OWNER = "bench"

PARTS: tuple[tuple[Any, str, str], ...] = (
    (servicer_module.AllocatorServicer, "Allocate", "a unary call (servicer Allocate)"),
    (servicer_module.AllocatorServicer, "_item", "  the query (_item)"),
    (servicer_module, "call_deadline", "  the deadline (call_deadline)"),
    (service.AllocatorService, "_read", "  the view and state (_read)"),
    (placing, "solve", "  solve (core solve)"),
    (service.AllocatorService, "_store_reserve", "  the write (_store_reserve)"),
    (placing, "solve_many", "solve (core solve_many)"),
    (service.AllocatorService, "_write_run", "the run's write (_write_run)"),
    (redis_store.RedisReservationStore, "reserve", "  store.reserve"),
    (redis_store.RedisReservationStore, "_grant_batch", "    one shard's pipeline"),
    (redis_store.RedisReservationStore, "_command", "      one command (_command)"),
    (servicer_module.AllocatorServicer, "_answered", "the answer (_answered)"),
    (servicer_module.AllocatorServicer, "_answered_item", "the answer (a batch item's)"),
    (mapping.BatchReply, "add_one_device", "the answer (a batch item's)"),  # its one-device bytes
    (mapping.BatchReply, "add_answer", "  its bytes (BatchReply.add_answer)"),
    (mapping.BatchReply, "done", "the batch reply parsed (BatchReply.done)"),
    (mapping.BatchReply, "serialized", "the batch reply joined (BatchReply.serialized)"),
    (combining.Combiner, "_run", "a pass of combined unary calls (Combiner._run)"),
    (servicer_module, "allocate_response", "  allocate_response"),
    (AllocatedState, "hold_in_place", "  the batch's holds (hold_in_place)"),
    (AllocatedState, "hold_whole_in_place", "  the batch's holds (hold_in_place)"),  # the same
    (live_reservations.Holdings, "state_for", "the next state (state_for)"),
    (live_reservations.Holdings, "hold_pending", "hold_pending"),
    (live_reservations.Holdings, "hold_in_run", "hold_pending"),  # a run's item: the same
    (live_reservations.Holdings, "settle_all", "settle_all (a run's placements settled)"),
    (live_reservations.Holdings, "settle_run", "settle_all (a run's placements settled)"),
    (service, "placement_requests", "store requests (placement_requests)"),
    (granting.GrantRun, "add", "grants.add"),
    (service.AllocatorService, "_held", "_held"),
    (PubSub, "handle_message", "events (pub/sub thread: handle_message)"),
    (redis_store, "_deliver", "  events to Holdings (_deliver)"),
)
"""(owner, attribute, label): the functions `--parts` times (where the caller looks them up)."""


class _Context:
    """What the servicer reads of a grpc.ServicerContext here."""

    def time_remaining(self) -> float:
        return 60.0

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return True

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-gpualloc-owner", OWNER),)

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def is_active(self) -> bool:
        return True


def _timed_parts(spent: dict[str, float]) -> Callable[[], None]:
    """Wrap PARTS to sum their thread CPU in `spent`; returns what puts them back."""
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in PARTS]
    for owner, name, label in PARTS:
        original = getattr(owner, name)

        def timed(*args: Any, _original: Any = original, _label: str = label, **kw: Any) -> Any:
            started = time.thread_time()
            try:
                return _original(*args, **kw)
            finally:
                spent[_label] = spent.get(_label, 0.0) + time.thread_time() - started

        setattr(owner, name, functools.wraps(original)(timed))

    def restore() -> None:
        for owner, name, original in originals:
            setattr(owner, name, original)

    return restore


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=MODES, default=MODES[0])
    parser.add_argument("--calls", type=int, default=64, help="calls in all (over the threads)")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--scale", type=float, default=1.0, help="of the bench's inventory")
    parser.add_argument("--parts", action="store_true")
    parser.add_argument("--cprofile", help="write the first thread's cProfile here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpualloc-profile-") as tmp:
        directory = Path(tmp)
        generate_inventory(directory, args.scale)
        redis = _Redis(directory, set(os.sched_getaffinity(0)))
        environ = {**os.environ, **SEED_DOCUMENT_LIMITS}
        settings = replace(AllocatorSettings.from_env(environ), redis_url=redis.url)
        feed = StaticFeed.from_paths(
            [str(directory / "inventory.json")], read_document_limits(environ)
        )
        app = build_allocator(settings, feed)
        policy = GcPolicy(name="allocator-gc").start()
        try:
            if not app.wait_ready(300):
                raise RuntimeError("the allocator did not load its view within 300 s")
            result = _measure(app.registration.servicer, args)
            passes_before = result.pop("_passes_before")
            if app.combiner is not None:  # passes of unary calls placed together
                result["combined_passes"] = app.combiner.passes - passes_before
        finally:
            policy.stop()
            app.close()
            redis.stop()
    print(json.dumps(result))
    return 0


def _measure(servicer: Any, args: argparse.Namespace) -> dict[str, Any]:
    claim = to_pb_resource_claim(_claim())
    reserving = pb.AllocateRequest(claims=[claim], reserve=True)
    reserving.lease_ttl.seconds = LEASE_SECONDS
    context: Any = _Context()  # a grpc.ServicerContext as far as the servicer reads it
    made: list[str] = []  # reservation ids, released after
    sent: list[bytes] = []  # batch replies as the server sends them, read after
    encode = reply_serializer(pb.AllocateBatchResponse.SerializeToString)  # as grpc's handler

    def call() -> int:
        token = _current.set(CallInfo(development_principal(OWNER), args.mode, context))
        try:
            if args.mode == "allocate-reserve-batch-64":
                batch = pb.AllocateBatchRequest(items=[reserving] * 64)
                sent.append(encode(servicer.AllocateBatch(batch, context)))
                return 64
            if args.mode == "allocate-reserve":
                response = servicer.Allocate(reserving, context)
                made.extend(r.id for r in response.reservations)
                return 1
            servicer.Allocate(pb.AllocateRequest(claims=[claim]), context)
            return 1
        finally:
            _current.reset(token)

    def release() -> None:
        for data in sent:
            for item in pb.AllocateBatchResponse.FromString(data).items:
                if item.HasField("error"):
                    raise RuntimeError(f"an item failed: {item.error}")
                made.extend(r.id for r in item.response.reservations)
        sent.clear()
        for reservation_id in made:
            servicer.Release(pb.ReleaseRequest(reservation_id=reservation_id), context)
        made.clear()

    for _ in range(3):  # lazy caches, as the bench's untimed first call
        call()
    release()
    spent: dict[str, float] = {}
    restore = _timed_parts(spent) if args.parts else (lambda: None)
    claims = [0] * args.threads

    def worker(index: int) -> None:
        profile = cProfile.Profile() if index == 0 and args.cprofile else None
        if profile is not None:
            profile.enable()
        for _ in range(args.calls // args.threads + (index < args.calls % args.threads)):
            claims[index] += call()
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.cprofile)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.threads)]
    combiner = servicer._combiner
    passes_before = combiner.passes if combiner is not None else 0
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        restore()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    release()
    total = max(1, sum(claims))
    result: dict[str, Any] = {
        "mode": args.mode,
        "threads": args.threads,
        "claims": total,
        "cpu_us_per_claim": round(cpu / total * 1e6, 1),
        "wall_us_per_claim": round(wall / total * 1e6, 1),
        "_passes_before": passes_before,
    }
    if spent:
        result["parts_cpu_us_per_claim"] = {
            label: round(seconds / total * 1e6, 1)
            for label, seconds in sorted(spent.items(), key=lambda kv: -kv[1])
        }
    return result


if __name__ == "__main__":
    sys.exit(main())
