"""Service benchmark: one allocator server process, a 10,000-GPU inventory, a load client.

    python -m loadtest.bench service [--quick] [--json]

One run measures, against the same server and in the same conditions:

- `health-check`: grpc.health.v1.Health/Check, the floor of what a gRPC call costs here;
- `allocate-any-node`: Allocate of one H100, the allocator choosing among 1,500 nodes under
  BinPack (the plain Allocate; the target row);
- `allocate-pinned`: Allocate of one H100 on a named node (what a scheduler that already
  picked the node asks);
- `allocate-reserve`: Allocate(reserve=true) of one H100, any node, with Redis: each call a
  reservation (a lease) in Redis, kept; the row counts reservations made per second, the
  calls answered ABORTED after the service's retries are counted apart (`aborted`). The phase
  stops at 75% of the H100s even when its time is not up (`calls` says how many it made);
- `release`: Release of every reservation `allocate-reserve` made, measured on its own;
- `reserve-release-cycle`: Allocate(reserve=true) on a named node, then Release (one cycle =
  both calls; RPS counts cycles, i.e. half the calls per second).
- `allocate-batch-{8,64,512}`, `allocate-reserve-batch-64`: AllocateBatch of that many one-H100
  items (issue 29), without and with reserve; RPS counts claims per second, p50/p99 are per
  call. The reserving row stops at 75% of the H100s too and releases its reservations after
  the phase, untimed. Targets: `allocate-reserve-batch-64` >= 3x the Check RPS, and its p99
  <= 64 x the `allocate-reserve` p99 / 4 (`…/p99-rule` <= 1).
- `allocate-stream`, `allocate-reserve-stream`: AllocateStream (issue 29), each client thread
  one stream with STREAM_WINDOW (64) one-H100 items in flight, without and with reserve: the
  server places what has arrived in one pass. RPS counts claims answered per second, p50/p99
  are per item (sent to answered). The reserving row stops at 75% of the H100s and releases its
  reservations after the phase, untimed, as `allocate-reserve-batch-64`.
- `store:<layout>-wait-<off|on>:allocate-reserve`: `allocate-reserve` again with two allocator
  processes (`--workers 2`) on standalone Redis (with one replica) and on a 3-shard Redis
  Cluster (deploy/local/redis-cluster.sh), with GPUALLOC_REDIS_WAIT_REPLICAS 0 and 1, a fresh
  server and key prefix per case (loadtest/bench_store.py's `measure_layouts`), then the ratios
  side by side: `store:cluster/standalone-wait-<mode>:…` and `store:<layout>-wait-on/off:…`
  (RPS ratio `ratio`, p99 ratio `p99_ratio`).

The server is `python -m services.allocator --seed <generated inventory>` (one process); the
client is another process (`python -m loadtest.bench_service --client ...`) running threads
over several connections, so client and server do not share a GIL; with 2+ CPUs the server is
pinned to the first half of them and the client and Redis to the rest, so the RPS measure the
server, not the client's share of the machine. The inventory is generated
from examples/cluster: 1,000 nodes with 8 H100, 250 with 4 L40S, 250 with 4 A100 as DynamicMIG
partitions (10,000 GPUs, ~35,000 devices). Targets (issue 6): Allocate (`allocate-any-node`)
>= 50% and Allocate+Reserve (`allocate-reserve`) >= 30% of the Check RPS of the same run. Issue
17: on the cluster, `allocate-reserve` >= 85% of its RPS on standalone Redis (WAIT off).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loadtest.report import BenchReport, Target, percentile
from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from services.client.calls import open_channel
from services.client.cli_flags import add_client_flags, client_settings
from services.client.config import ClientSettings, TlsConfig
from services.common.dra.model import ResourceClaim, ResourcePool, ResourceSlice
from services.common.dra.serialize import to_dict
from services.common.manifests import load_manifests
from services.common.pb.dra_mapping import to_pb_resource_claim
from services.common.security.devcerts import CertificateAuthority, write_certificate

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "examples" / "cluster"
TEMPLATES = {"h100": "h100-node-1", "l40s": "l40s-node-1", "a100": "a100-node-1"}
NODES = {"h100": 1000, "l40s": 250, "a100": 250}  # 8000 + 1000 + 1000 GPUs
H100_PER_NODE = 8
THREADS = 16
CHANNELS = 8
RESERVE_SHARE = 0.75  # of the H100s: `allocate-reserve` stops there, so every call can fit
LEASE_SECONDS = 600  # outlives the phases: `release` finds every reservation still there


BATCH_PHASES = {
    "allocate-batch-8": 8,
    "allocate-batch-64": 64,
    "allocate-batch-512": 512,
    "allocate-reserve-batch-64": 64,
}
"""AllocateBatch rows (issue 29) and their items per call: `rps` counts claims, not calls."""

STREAM_PHASES = {"allocate-stream": False, "allocate-reserve-stream": True}
"""AllocateStream rows (issue 29) and whether their items reserve: each client thread keeps one
stream open with STREAM_WINDOW one-H100 items in flight; `rps` counts claims answered, p50/p99
are per item (sent to answered)."""
STREAM_WINDOW = int(os.environ.get("GPUALLOC_BENCH_STREAM_WINDOW", "64"))
"""Items a stream thread keeps sent and not yet answered (GPUALLOC_BENCH_STREAM_WINDOW)."""


class _PhaseDone(Exception):
    """A phase with a fixed amount of work (reservations to make or release) is through."""


# --- the inventory ---------------------------------------------------------------------------


def generate_inventory(directory: Path, scale: float = 1.0) -> tuple[int, list[str]]:
    """Write the slices as one JSON List; returns (GPU count, H100 node names)."""
    objects = load_manifests([str(CLUSTER)])
    templates = {
        kind: [o for o in objects if isinstance(o, ResourceSlice) and o.node_name == name]
        for kind, name in TEMPLATES.items()
    }
    items: list[dict[str, Any]] = []
    gpus = 0
    h100_nodes: list[str] = []
    for kind, count in NODES.items():
        for index in range(max(1, int(count * scale))):
            node = f"{kind}-{index:04d}"
            if kind == "h100":
                h100_nodes.append(node)
            for template in templates[kind]:
                items.append(to_dict(_renamed(template, TEMPLATES[kind], node)))
                gpus += sum(
                    1
                    for d in template.devices
                    if d.attributes.get("type") is not None and d.attributes["type"].value == "gpu"
                )
    path = directory / "inventory.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return gpus, h100_nodes


def _renamed(template: ResourceSlice, old: str, new: str) -> ResourceSlice:
    return dataclasses.replace(
        template,
        name=template.name.replace(old, new),
        node_name=new,
        pool=ResourcePool(new, template.pool.generation, template.pool.resource_slice_count),
    )


# --- the server ------------------------------------------------------------------------------


def bench_channel(
    target: str, dial: ClientSettings, options: Sequence[tuple[str, Any]] = ()
) -> grpc.Channel:
    """A channel as the clients of gpualloc dial (services.client.calls.open_channel):
    plaintext, or TLS / mutual TLS / bearer token per `dial` (ClientSettings, e.g. from
    `client_settings(args, environ)`), so one bench can compare mTLS with plaintext."""
    return open_channel(target, dial.tls, token_file=dial.token_file, options=options)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_serving(
    target: str,
    process: subprocess.Popen[bytes],
    timeout: float,
    dial: ClientSettings | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    with bench_channel(target, dial or ClientSettings()) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="gpualloc.allocator.v1.Allocator")
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError("the allocator server exited at start")
            try:
                if stub.Check(request, timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise RuntimeError(f"the allocator server was not serving within {timeout:g}s")


def _cpu_split() -> tuple[set[int], set[int]]:
    """(server CPUs, client and Redis CPUs): halves of what this process may use, so the
    client never steals the server's CPU and RPS measures the server (both halves are all
    CPUs on a single-CPU machine)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return set(cpus), set(cpus)
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


def _pinned(cpus: set[int]) -> Callable[[], None]:
    return lambda: os.sched_setaffinity(0, cpus)


class _Redis:
    def __init__(self, directory: Path, cpus: set[int]) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found on PATH")
        self.port = _free_port()
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(directory)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_pinned(cpus),
        )  # fmt: skip
        time.sleep(0.3)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


# --- the client (runs in its own process) ------------------------------------------------------


def _claim() -> ResourceClaim:
    [claim] = [
        o
        for o in load_manifests([str(ROOT / "examples" / "claims" / "one-h100.yaml")])
        if isinstance(o, ResourceClaim)
    ]
    return claim


def _calls(
    phase: str, nodes: Sequence[str], ids: list[str], max_calls: int, aborted: list[int]
) -> Callable[[Any, random.Random], None]:
    """The call a phase repeats. `ids`: the reservations made (`allocate-reserve` appends,
    `release` takes); `aborted`: one entry per call answered ABORTED."""
    claim = to_pb_resource_claim(_claim())
    check = health_pb2.HealthCheckRequest(service="")
    metadata = (("x-gpualloc-owner", "bench"),)

    def health(channel: Any, rng: random.Random) -> None:
        health_pb2_grpc.HealthStub(channel).Check(check, timeout=10)

    def allocate_pinned(channel: Any, rng: random.Random) -> None:
        request = pb.AllocateRequest(claims=[claim], node_name=rng.choice(nodes))
        response = allocator_pb2_grpc.AllocatorStub(channel).Allocate(request, timeout=30)
        assert response.outcome == pb.OUTCOME_ALLOCATED

    def allocate_any(channel: Any, rng: random.Random) -> None:
        response = allocator_pb2_grpc.AllocatorStub(channel).Allocate(
            pb.AllocateRequest(claims=[claim]), timeout=30
        )
        assert response.outcome == pb.OUTCOME_ALLOCATED

    reserve_any = pb.AllocateRequest(claims=[claim], reserve=True)
    reserve_any.lease_ttl.seconds = LEASE_SECONDS
    taken = iter(range(max_calls))  # next() is atomic under the GIL

    def allocate_reserve(channel: Any, rng: random.Random) -> None:
        if next(taken, None) is None:
            raise _PhaseDone
        stub = allocator_pb2_grpc.AllocatorStub(channel)
        try:
            response = stub.Allocate(reserve_any, metadata=metadata, timeout=30)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.ABORTED:
                aborted.append(1)  # lost every retry of a race: an answer, counted apart
                return
            raise
        assert response.outcome == pb.OUTCOME_ALLOCATED and response.reservations
        ids.append(response.reservations[0].id)

    def release(channel: Any, rng: random.Random) -> None:
        try:
            reservation_id = ids.pop()
        except IndexError:
            raise _PhaseDone from None
        allocator_pb2_grpc.AllocatorStub(channel).Release(
            pb.ReleaseRequest(reservation_id=reservation_id), metadata=metadata, timeout=30
        )

    def reserve_release(channel: Any, rng: random.Random) -> None:
        stub = allocator_pb2_grpc.AllocatorStub(channel)
        request = pb.AllocateRequest(claims=[claim], node_name=rng.choice(nodes), reserve=True)
        request.lease_ttl.seconds = 60
        try:
            response = stub.Allocate(request, metadata=metadata, timeout=30)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.ABORTED:
                aborted.append(1)  # a lost race is an answer too
                return
            raise
        if response.reservations:
            stub.Release(
                pb.ReleaseRequest(reservation_id=response.reservations[0].id),
                metadata=metadata,
                timeout=30,
            )

    def allocate_batch(size: int, reserve: bool) -> Callable[[Any, random.Random], None]:
        """AllocateBatch of `size` one-H100 items; with `reserve`, each item a reservation
        (stopping at `max_calls` claims, as allocate-reserve does), released after the phase."""
        item = reserve_any if reserve else pb.AllocateRequest(claims=[claim])
        request = pb.AllocateBatchRequest(items=[item] * size)

        def call(channel: Any, rng: random.Random) -> None:
            if reserve and next(taken, None) is None:
                raise _PhaseDone
            response = allocator_pb2_grpc.AllocatorStub(channel).AllocateBatch(
                request, metadata=metadata, timeout=60
            )
            for result in response.items:
                if result.HasField("error"):
                    assert result.error.code == grpc.StatusCode.ABORTED.value[0], result.error
                    aborted.append(1)  # a lost race, as allocate-reserve counts it
                    continue
                assert result.response.outcome == pb.OUTCOME_ALLOCATED
                ids.extend(r.id for r in result.response.reservations)

        return call

    batches = {
        name: allocate_batch(size, name.startswith("allocate-reserve"))
        for name, size in BATCH_PHASES.items()
    }
    return {
        "health-check": health,
        "allocate-pinned": allocate_pinned,
        "allocate-any-node": allocate_any,
        "allocate-reserve": allocate_reserve,
        "release": release,
        "reserve-release-cycle": reserve_release,
        **batches,
    }[phase]


def _stream(
    channel: Any,
    reserve: bool,
    window: int,
    until: tuple[float, float],
    taken: Any,
    ids: list[str],
    aborted: list[int],
    latencies: list[float],
) -> float:
    """One AllocateStream with `window` one-H100 items in flight, sending until `until`'s stop
    time (or, with `reserve`, until `taken` runs out); the latencies of the items answered
    between `until`'s warm and stop times (all of them with `reserve`: a fixed amount). Returns
    when this thread's work ended (the last answer's time with `reserve`, else the stop)."""
    warm_until, stop_at = until
    claim = to_pb_resource_claim(_claim())
    item = pb.AllocateRequest(claims=[claim], reserve=reserve)
    if reserve:
        item.lease_ttl.seconds = LEASE_SECONDS
    message = pb.AllocateStreamRequest(item=item)
    room = threading.Semaphore(window)
    sent: deque[float] = deque()  # send times, in order: answers come in request order

    def requests() -> Any:
        while True:
            room.acquire()
            now = time.monotonic()
            if now >= stop_at or (reserve and next(taken, None) is None):
                return  # half-close: the server answers what it has, then ends the stream
            sent.append(now)
            yield message

    responses = allocator_pb2_grpc.AllocatorStub(channel).AllocateStream(
        requests(),
        metadata=(("x-gpualloc-owner", "bench"),),
        timeout=stop_at - time.monotonic() + 120,
    )
    ended = stop_at
    for response in responses:
        now = time.monotonic()
        started = sent.popleft()
        room.release()
        result = response.item
        if result.HasField("error"):
            assert result.error.code == grpc.StatusCode.ABORTED.value[0], result.error
            aborted.append(1)  # a lost race, as allocate-reserve counts it
        else:
            assert result.response.outcome == pb.OUTCOME_ALLOCATED
            ids.extend(r.id for r in result.response.reservations)
        if reserve or (warm_until <= now <= stop_at):
            latencies.append(now - started)
        ended = now
    return min(stop_at, ended) if not reserve else ended


def client_main(argv: Sequence[str]) -> int:
    """`--client TARGET --phase P --seconds S --threads T --nodes-file F [--ids-file I]
    [--max-calls N] [--tls-ca ... --tls-cert ... --tls-key ... --token-file ...]`: one JSON
    line out. `allocate-reserve` writes the ids it made to I, `release` reads them from there.
    TLS flags default to GPUALLOC_CLIENT_TLS_* / GPUALLOC_CLIENT_TOKEN_FILE (cli_flags)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", required=True)
    parser.add_argument("--phase", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--nodes-file", required=True)
    parser.add_argument("--ids-file")
    parser.add_argument("--max-calls", type=int, default=0)
    add_client_flags(parser)
    args = parser.parse_args(argv)
    dial = client_settings(args, os.environ)
    nodes = json.loads(Path(args.nodes_file).read_text())
    ids: list[str] = []
    if args.phase == "release":
        ids = json.loads(Path(args.ids_file).read_text())
    aborted: list[int] = []
    per_call = BATCH_PHASES.get(args.phase, 1)  # claims per call
    max_calls = args.max_calls // per_call if args.max_calls else 0
    streaming = args.phase in STREAM_PHASES
    call = _calls(args.phase if not streaming else "health-check", nodes, ids, max_calls, aborted)
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [bench_channel(args.client, dial, options) for _ in range(CHANNELS)]
    for channel in channels:
        grpc.channel_ready_future(channel).result(timeout=30)
    taken = iter(range(max_calls))  # a reserving stream's items (next() is atomic)
    if streaming:  # one untimed item first: lazy caches
        _stream(channels[0], False, 1, (0.0, time.monotonic() + 1), None, [], aborted, [])
    else:
        call(channels[0], random.Random(-1))  # one untimed call first: lazy caches
    # Time-bound phases warm up for a while; `release` has a fixed amount of work to time.
    # (as a reserving batch phase: it has a fixed amount of claims too, 64 a call).
    fixed = args.phase in ("release", "allocate-reserve-batch-64", "allocate-reserve-stream")
    warm = 0.0 if fixed else min(1.0, args.seconds / 4)
    warm_until = time.monotonic() + warm
    stop_at = warm_until + args.seconds
    latencies: list[list[float]] = [[] for _ in range(args.threads)]
    finished = [stop_at] * args.threads
    errors: list[str] = []

    def worker(index: int) -> None:
        rng = random.Random(index)
        channel = channels[index % len(channels)]
        if streaming:
            reserve, until = STREAM_PHASES[args.phase], (warm_until, stop_at)
            try:
                finished[index] = _stream(
                    channel, reserve, STREAM_WINDOW, until, taken, ids, aborted, latencies[index]
                )
            except Exception as error:  # noqa: BLE001 - reported, not hidden
                errors.append(repr(error)[:200])
            return
        while True:
            started = time.monotonic()
            if started >= stop_at:
                return
            try:
                call(channel, rng)
            except _PhaseDone:
                finished[index] = min(stop_at, time.monotonic())
                return
            except Exception as error:  # noqa: BLE001 - reported, not hidden
                errors.append(repr(error)[:200])
                return
            if started >= warm_until:
                latencies[index].append(time.monotonic() - started)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for channel in channels:
        channel.close()
    done = [x for per in latencies for x in per]
    seconds = max(1e-3, max(finished) - warm_until)  # a phase with a fixed amount may end early
    if args.phase == "allocate-reserve":
        Path(args.ids_file).write_text(json.dumps(ids))
    elif ids:  # a reserving batch phase: give the devices back, untimed, for the next rows
        stub = allocator_pb2_grpc.AllocatorStub(bench_channel(args.client, dial, options))
        for reservation_id in ids:
            stub.Release(
                pb.ReleaseRequest(reservation_id=reservation_id),
                metadata=(("x-gpualloc-owner", "bench"),),
                timeout=30,
            )
    print(
        json.dumps(
            {
                "rps": len(done) * per_call / seconds,  # claims per second
                "seconds": seconds,
                "aborted": len(aborted),
                "p50_ms": percentile(done, 0.5) * 1000,
                "p99_ms": percentile(done, 0.99) * 1000,
                "calls": len(done),
                "errors": errors[:3],
            }
        )
    )
    return 0


def _client(
    target: str,
    phase: str,
    seconds: float,
    nodes_file: Path,
    cpus: set[int],
    threads: int = THREADS,
    max_calls: int = 0,
    client_flags: Sequence[str] = (),
) -> dict[str, Any]:
    """One phase in a client process; `client_flags` (e.g. `--tls-ca F --tls-cert F
    --tls-key F`) make it dial with TLS."""
    command = [
        sys.executable, "-m", "loadtest.bench_service",
        "--client", target, "--phase", phase, "--seconds", str(seconds),
        "--threads", str(threads), "--nodes-file", str(nodes_file),
        "--ids-file", str(nodes_file.with_name("ids.json")), "--max-calls", str(max_calls),
        *client_flags,
    ]  # fmt: skip
    output = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, check=True, preexec_fn=_pinned(cpus)
    )
    result: dict[str, Any] = json.loads(output.stdout.strip().splitlines()[-1])
    if result["errors"]:
        raise RuntimeError(f"{phase}: {result['errors']}")
    return result


# --- the suite -------------------------------------------------------------------------------

PHASES = (
    "health-check",
    "allocate-any-node",
    "allocate-pinned",
    "allocate-reserve",
    "release",
    "reserve-release-cycle",
    "allocate-batch-8",
    "allocate-batch-64",
    "allocate-batch-512",
    "allocate-reserve-batch-64",
    *STREAM_PHASES,
)


SEED_DOCUMENT_LIMITS = {
    "GPUALLOC_MAX_DOCUMENT_BYTES": "64Mi",
    "GPUALLOC_MAX_DOCUMENT_NODES": "20000000",
}
"""The seed file is one JSON List of every slice (~36 MiB, a few million values): over what a
document may be by default, so the bench raises the limits as an operator seeding such a file
would."""

STORE_PHASES = ("allocate-reserve",)
"""Measured again on each store layout x WAIT (issue 17), 2 allocator processes per case."""

MTLS_PHASES = ("health-check", "allocate-any-node", "allocate-reserve")
"""Measured again with mutual TLS and an access policy (issue 14: the cost of identities)."""

BENCH_POLICY = """\
apiVersion: gpualloc.dev/v1alpha1
kind: AccessPolicy
metadata: {name: bench}
spec:
  tenants: [{name: bench}]
  bindings:
  - name: bench-client
    subjects: [{kind: CommonName, name: bench-client}]
    tenant: bench
    roles: [scheduler]
    actFor: ["*"]
"""


def _write_pki(directory: Path) -> list[str]:
    """A CA, a server and a client certificate, and the policy; the server's TLS flags."""
    ca = CertificateAuthority.create("gpualloc bench CA")
    ca.save(directory)
    server = write_certificate(
        directory / "server", ca.issue("server", ip_addresses=("127.0.0.1",), client=False)
    )
    write_certificate(directory / "client", ca.issue("bench-client", server=False))
    (directory / "policy.yaml").write_text(BENCH_POLICY)
    return [
        "--tls-cert", str(server / "tls.crt"), "--tls-key", str(server / "tls.key"),
        "--tls-client-ca", str(directory / "ca.crt"),
        "--auth-policy", str(directory / "policy.yaml"),
    ]  # fmt: skip


def _server(
    directory: Path, port: int, redis_url: str, cpus: set[int], extra: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GPUALLOC_LOG_LEVEL": "WARNING", "GPUALLOC_MAX_WORKERS": "16"}
    # one identity drives the whole server here: its share of calls is all of them
    env["GPUALLOC_MAX_CALLS_PER_CALLER"] = env["GPUALLOC_MAX_CALLS_PER_TENANT"] = str(THREADS)
    env.update(SEED_DOCUMENT_LIMITS)  # the 10,000-GPU seed is ~36 MiB
    return subprocess.Popen(
        [sys.executable, "-m", "services.allocator",
         "--seed", str(directory / "inventory.json"),
         "--listen", f"127.0.0.1:{port}", "--redis-url", redis_url, *extra],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=_pinned(cpus),
    )  # fmt: skip


def _stop(server: subprocess.Popen[bytes]) -> None:
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()


PHASES_VARIABLE = "GPUALLOC_BENCH_SERVICE_PHASES"
"""A comma-separated subset of PHASES to run (plaintext only, no mTLS or store rows): for
quick before/after comparisons of a few rows; unset, every row."""


def run(quick: bool) -> BenchReport:
    seconds = 2.0 if quick else 6.0
    scale = 0.1 if quick else 1.0
    chosen = [p for p in os.environ.get(PHASES_VARIABLE, "").split(",") if p]
    unknown = sorted(set(chosen) - set(PHASES))
    if unknown:
        raise ValueError(f"{PHASES_VARIABLE}: unknown phases {unknown} (known: {list(PHASES)})")
    with tempfile.TemporaryDirectory(prefix="gpualloc-bench-") as tmp:
        directory = Path(tmp)
        gpus, h100_nodes = generate_inventory(directory, scale)
        nodes_file = directory / "nodes.json"
        nodes_file.write_text(json.dumps(h100_nodes))
        server_cpus, client_cpus = _cpu_split()
        redis = _Redis(directory, client_cpus)
        report = BenchReport(
            "service",
            setup={
                "gpus": gpus,
                "nodes": sum(max(1, int(n * scale)) for n in NODES.values()),
                "server": f"1 process, 16 threads, Redis store, cpus {sorted(server_cpus)}",
                "client": f"1 process, {THREADS} threads, {CHANNELS} connections, "
                f"cpus {sorted(client_cpus)} (with Redis)",
                "seconds_per_case": seconds,
                "cpus": os.cpu_count() or 0,
                "mtls": "rows mtls:*: the same server with mutual TLS (ECDSA P-256) and an "
                "AccessPolicy, after the plaintext rows (development mode)",
            },
        )
        max_calls = int(RESERVE_SHARE * H100_PER_NODE * len(h100_nodes))
        tls_flags = _write_pki(directory / "pki")
        try:
            pki = directory / "pki"
            mtls_client = [
                "--tls-ca", str(pki / "ca.crt"),
                "--tls-cert", str(pki / "client" / "tls.crt"),
                "--tls-key", str(pki / "client" / "tls.key"),
            ]  # fmt: skip
            mtls_dial = ClientSettings(
                tls=TlsConfig.from_files(
                    str(pki / "ca.crt"),
                    str(pki / "client" / "tls.crt"),
                    str(pki / "client" / "tls.key"),
                )
            )
            cases = [
                ("", [p for p in PHASES if p in chosen] or PHASES, [], [], None),
                ("mtls:", MTLS_PHASES, tls_flags, mtls_client, mtls_dial),
            ]
            for prefix, phases, extra, client_flags, dial in cases[:1] if chosen else cases:
                port = _free_port()
                server = _server(directory, port, redis.url, server_cpus, extra)
                target = f"127.0.0.1:{port}"
                try:
                    _wait_serving(target, server, timeout=300, dial=dial)
                    for phase in phases:
                        result = _client(
                            target, phase, seconds, nodes_file, client_cpus,
                            max_calls=max_calls, client_flags=client_flags,
                        )  # fmt: skip
                        report.add(
                            prefix + phase,
                            rps=round(result["rps"], 1),
                            p50_ms=round(result["p50_ms"], 2),
                            p99_ms=round(result["p99_ms"], 2),
                            calls=result["calls"],
                            **({"aborted": result["aborted"]} if "reserve" in phase else {}),
                        )
                        if phase == "allocate-reserve" and "release" not in phases:
                            # untimed: its devices back for the reserving rows after it
                            _client(
                                target, "release", seconds, nodes_file, client_cpus,
                                client_flags=client_flags,
                            )  # fmt: skip
                finally:
                    _stop(server)
        finally:
            redis.stop()
        if chosen:
            _add_ratios(report)
            return report
        # the store layout as a dimension: bench_store builds on this module's client and server
        from loadtest.bench_store import CLUSTER, STANDALONE, measure_layouts

        report.setup["store"] = (
            f"rows store:*: allocate-reserve on 2 allocator processes (--workers 2) per case, "
            f"standalone ({STANDALONE}) vs cluster ({CLUSTER}), WAIT off vs on "
            "(GPUALLOC_REDIS_WAIT_REPLICAS=1, 500 ms)"
        )
        measure_layouts(
            report, directory, STORE_PHASES, seconds, (server_cpus, client_cpus), prefix="store:"
        )
    _add_ratios(report)
    return report


def _add_ratios(report: BenchReport) -> None:
    rps = {row.name: float(row.values["rps"]) for row in report.rows if "rps" in row.values}
    check = rps.get("health-check", 0.0)
    if check <= 0:
        return
    for name in PHASES[1:]:
        if name in rps:
            report.add(f"{name}/check", ratio=round(rps[name] / check, 3))
    for name in MTLS_PHASES:
        plain, secured = rps.get(name, 0.0), rps.get(f"mtls:{name}", 0.0)
        if plain > 0 and secured > 0:
            report.add(f"mtls:{name}/plaintext", ratio=round(secured / plain, 3))
    report.targets.append(Target("allocate-any-node/check", "ratio", 0.5, at_least=True))
    report.targets.append(Target("allocate-reserve/check", "ratio", 0.3, at_least=True))
    report.targets.append(Target("allocate-reserve-batch-64/check", "ratio", 3.0, at_least=True))
    p99 = {row.name: float(row.values["p99_ms"]) for row in report.rows if "p99_ms" in row.values}
    unary, batch = p99.get("allocate-reserve", 0.0), p99.get("allocate-reserve-batch-64", 0.0)
    if unary > 0 and batch > 0:  # a 64-item batch's p99 <= 64 x the unary p99 / 4
        report.add("allocate-reserve-batch-64/p99-rule", ratio=round(batch / (16 * unary), 3))
        report.targets.append(Target("allocate-reserve-batch-64/p99-rule", "ratio", 1.0))


if __name__ == "__main__":
    sys.exit(client_main(sys.argv[1:]))
