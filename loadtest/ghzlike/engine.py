"""Driving the load: worker threads, optional worker processes, rate pacing, stop rules.

The model is ghz's (`runner/requester.go`, `worker.go`, `load/pacer.go`):

- `concurrency` workers share `connections` connections (worker w uses connection w mod
  connections) and take request numbers 0, 1, 2, ... from one counter until `total` are taken;
  each worker waits for its reply before its next call (ghz without `--async`).
- `rps` paces the whole run: call k is not sent before start + (k+1)/rps (ConstantPacer).
- `duration` stops taking new calls when it is over; in-flight calls are then cut off by closing
  the connections (`duration-stop: close`, they count as errors), awaited (`wait`) or dropped
  from the report (`ignore`).
- Latency is the blocking call's time: request serialisation, the round trip and response
  parsing (ghz measures from the stats handler's Begin to End, which is nearly the same).

One CPython process serialises protobuf and runs the workers under one GIL, so a fast server
can outrun one client process. `processes` (the config's `cpus`) runs the workers in that many
processes (spawned, so no gRPC state crosses a fork); process p takes the workers w = p mod P and
the request numbers k = p mod P, so numbering, round-robin data and pacing are those of one run.
Every process reports the CPU time it used; `RunOutcome.client_cpu_seconds` says whether the
client, rather than the server, was the limit. Connections are established before the clock
starts (ghz dials lazily, so its first calls also pay the connection setup).
"""

from __future__ import annotations

import itertools
import multiprocessing
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import SynchronizedArray
from typing import Any, Protocol

import grpc

from loadtest.ghzlike.config import ConfigError, LoadConfig, tls_of
from loadtest.ghzlike.method import Method, RequestSource, resolve_from_proto, resolve_method
from loadtest.ghzlike.report import CallResult, error_text, go_status_name
from loadtest.ghzlike.templates import TemplateError
from services.client.calls import open_channel as open_client_channel

__all__ = ["Invoke", "Progress", "RunOutcome", "open_channel", "run_load"]

_START_MARGIN_S = 0.02  # processes start together this long after the last one is ready
_PROGRESS_INTERVAL_S = 0.1


class Invoke(Protocol):
    """One measured unit of load: a call (or a call cycle); raises grpc.RpcError on failure."""

    def __call__(self, request_number: int, worker_id: str) -> None: ...


# (config, method, channel, requests) -> Invoke; `cycle.py` adds gpualloc's release cycle.
InvokeFactory = Callable[[LoadConfig, Method, grpc.Channel, RequestSource], Invoke]


class Progress(Protocol):
    def update(self, done: int, elapsed_s: float) -> None: ...


@dataclass
class RunOutcome:
    """Everything a report needs, from all processes merged."""

    results: list[CallResult]
    start_ns: int  # wall clock, Unix ns
    total_ns: int
    end_reason: str  # normal | timeout | cancel
    processes: int
    client_cpu_seconds: float
    method: str = ""


@dataclass
class _Share:
    """What one process does: its index among `of` processes, and its results."""

    index: int
    of: int
    results: list[CallResult] = field(default_factory=list)
    finish_ns: int = 0
    cpu_seconds: float = 0.0
    timed_out: bool = False
    failure: str = ""


def open_channel(config: LoadConfig, *, own_connection: bool = True) -> grpc.Channel:
    """A channel to `host` as ghz dials it: no message size limits, optional keepalive, TLS
    unless `insecure` (`cacert`, `cert` + `key` for mutual TLS, `cname`); each channel its own
    TCP connection (gRPC Python shares subchannels between equal channels)."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", -1),
        ("grpc.max_send_message_length", -1),
    ]
    if own_connection:
        options.append(("grpc.use_local_subchannel_pool", 1))
    if config.keepalive > 0:
        milliseconds = int(config.keepalive * 1000)
        options += [("grpc.keepalive_time_ms", milliseconds)]
        options += [("grpc.keepalive_timeout_ms", milliseconds)]
    return open_client_channel(config.host, tls_of(config), options=options)


def unary_invoke(
    config: LoadConfig, method: Method, channel: grpc.Channel, requests: RequestSource
) -> Invoke:
    """The plain ghz call: the config's request to the config's method."""
    call = method.callable(channel)
    timeout = config.timeout or None

    def invoke(request_number: int, worker_id: str) -> None:
        call(
            requests.request(request_number, worker_id),
            timeout=timeout,
            metadata=requests.metadata(request_number, worker_id),
        )

    return invoke


def run_load(
    config: LoadConfig,
    *,
    processes: int = 1,
    invoke_factory: InvokeFactory = unary_invoke,
    progress: Progress | None = None,
) -> RunOutcome:
    """Run the load described by `config`; raises ConfigError for a setup problem."""
    if processes < 1:
        raise ConfigError("cpus: must be at least 1")
    processes = min(processes, config.concurrency)
    stop = threading.Event()
    if processes == 1:
        share = _Share(0, 1)
        prepared = _prepare(config, share, invoke_factory)
        start_ns = time.time_ns()
        watcher = _watch_progress(progress, lambda: len(share.results), start_ns, stop)
        try:
            _drive(config, share, prepared, start_ns, stop)
        except KeyboardInterrupt:
            stop.set()
            return _merge(config, [share], start_ns, cancelled=True)
        finally:
            stop.set()
            watcher.join()
        return _merge(config, [share], start_ns, cancelled=False)
    return _run_processes(config, processes, invoke_factory, progress)


# --- one process ---------------------------------------------------------------------------------


@dataclass
class _Prepared:
    channels: dict[int, grpc.Channel]
    invokes: dict[int, Invoke]
    method: str


def _prepare(config: LoadConfig, share: _Share, invoke_factory: InvokeFactory) -> _Prepared:
    """Resolve the method, check the data, connect: everything that may fail before the clock."""
    with open_channel(config, own_connection=False) as reflection_channel:
        _wait_ready(reflection_channel, config)
        method = (
            resolve_from_proto(config)
            if config.proto
            else resolve_method(reflection_channel, config.call, config.reflect_metadata)
        )
    requests = RequestSource(method, config)
    try:
        requests.check()
    except TemplateError as error:
        raise ConfigError(f"data: {error}") from None
    used = sorted({w % config.connections for w in _workers(config, share)})
    channels = {index: open_channel(config) for index in used}
    for channel in channels.values():
        _wait_ready(channel, config)
    invokes = {i: invoke_factory(config, method, ch, requests) for i, ch in channels.items()}
    return _Prepared(channels, invokes, method.descriptor.full_name)


def _wait_ready(channel: grpc.Channel, config: LoadConfig) -> None:
    try:
        grpc.channel_ready_future(channel).result(timeout=config.connect_timeout or None)
    except grpc.FutureTimeoutError:
        raise ConfigError(
            f"host: cannot connect to {config.host} within {config.connect_timeout:g}s"
        ) from None


def _workers(config: LoadConfig, share: _Share) -> range:
    return range(share.index, config.concurrency, share.of)


def _drive(
    config: LoadConfig,
    share: _Share,
    prepared: _Prepared,
    start_ns: int,
    stop: threading.Event,
) -> None:
    """Run this process's workers from `start_ns` (wall clock) until the run is over."""
    cpu_before = time.process_time()
    start = time.monotonic() + (start_ns - time.time_ns()) / 1e9
    hits = _Hits(config, share, start, stop)
    deadline = hits.deadline
    failures: list[BaseException] = []

    def work(worker: int) -> None:
        connection = worker % config.connections
        worker_id = f"g{worker}c{connection}"
        if config.name:
            worker_id = f"{config.name}:{worker_id}"
        try:
            _work(prepared.invokes[connection], worker_id, hits.next, share)
        except BaseException as error:  # a broken template or a bug: stop the run, report it
            failures.append(error)
            stop.set()

    threads = [threading.Thread(target=work, args=(w,)) for w in _workers(config, share)]
    closer = _close_at_deadline(config, prepared, deadline, stop)
    time.sleep(max(0.0, start - time.monotonic()))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    share.finish_ns = time.time_ns()
    share.cpu_seconds = time.process_time() - cpu_before
    stop.set()
    if closer is not None:
        closer.join()
    for channel in prepared.channels.values():
        channel.close()
    if config.duration_stop == "ignore" and deadline is not None:
        cutoff = start_ns + int(config.stop_after * 1e9)
        share.results = [r for r in share.results if r.end_ns <= cutoff]
    if failures:
        share.failure = f"{type(failures[0]).__name__}: {failures[0]}"


class _Hits:
    """The request numbers of this process, each handed out when it is due (ghz's pacer)."""

    def __init__(
        self, config: LoadConfig, share: _Share, start: float, stop: threading.Event
    ) -> None:
        self._counter = itertools.count()
        self._config, self._share, self._start, self._stop = config, share, start, stop
        self._interval = 1.0 / config.rps if config.rps else 0.0
        self.deadline = start + config.stop_after if config.stop_after > 0 else None

    def next(self) -> int | None:
        """The next call's number once it may be sent, or None when the run is over."""
        if self._stop.is_set():
            return None
        number = next(self._counter) * self._share.of + self._share.index
        if number >= self._config.total_calls:
            return None
        now = time.monotonic()
        due = self._start + (number + 1) * self._interval if self._interval else now
        if self.deadline is not None and max(due, now) >= self.deadline:
            self._share.timed_out = True
            return None
        if due > now and self._stop.wait(due - now):
            return None
        return number


def _work(
    invoke: Invoke, worker_id: str, next_hit: Callable[[], int | None], share: _Share
) -> None:
    append = share.results.append
    while (number := next_hit()) is not None:
        began = time.perf_counter_ns()
        try:
            invoke(number, worker_id)
        except ValueError as error:
            if "closed" not in str(error).lower():
                raise
            return  # `duration-stop: close` closed the channel at the deadline: never sent
        except grpc.RpcError as error:
            latency = time.perf_counter_ns() - began
            code, details = _status_of(error)
            append(
                CallResult(time.time_ns(), latency, go_status_name(code), error_text(code, details))
            )
            continue
        latency = time.perf_counter_ns() - began
        append(CallResult(time.time_ns(), latency, "OK"))


def _status_of(error: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    code = getattr(error, "code", None)
    details = getattr(error, "details", None)
    if callable(code) and callable(details):
        return code(), details() or ""
    return grpc.StatusCode.UNKNOWN, str(error)


def _close_at_deadline(
    config: LoadConfig, prepared: _Prepared, deadline: float | None, stop: threading.Event
) -> threading.Thread | None:
    """`duration-stop` close/ignore: close the connections when the duration is over."""
    if deadline is None or config.duration_stop == "wait":
        return None

    def close() -> None:
        if not stop.wait(max(0.0, deadline - time.monotonic())):
            for channel in prepared.channels.values():
                channel.close()

    thread = threading.Thread(target=close, daemon=True)
    thread.start()
    return thread


def _watch_progress(
    progress: Progress | None, done: Callable[[], int], start_ns: int, stop: threading.Event
) -> threading.Thread:
    def watch() -> None:
        while progress is not None and not stop.wait(_PROGRESS_INTERVAL_S):
            progress.update(done(), (time.time_ns() - start_ns) / 1e9)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _merge(
    config: LoadConfig, shares: list[_Share], start_ns: int, *, cancelled: bool
) -> RunOutcome:
    failure = next((s.failure for s in shares if s.failure), "")
    if failure:
        raise ConfigError(f"the run failed: {failure}")
    results = sorted((r for s in shares for r in s.results), key=lambda r: r.end_ns)
    finish_ns = max((s.finish_ns for s in shares), default=0) or time.time_ns()
    reason = "cancel" if cancelled else "timeout" if any(s.timed_out for s in shares) else "normal"
    return RunOutcome(
        results=results,
        start_ns=start_ns,
        total_ns=max(finish_ns - start_ns, 0),
        end_reason=reason,
        processes=len(shares),
        client_cpu_seconds=sum(s.cpu_seconds for s in shares),
        method=config.call,
    )


# --- several processes ---------------------------------------------------------------------------


def _run_processes(
    config: LoadConfig, processes: int, invoke_factory: InvokeFactory, progress: Progress | None
) -> RunOutcome:
    context = multiprocessing.get_context("spawn")
    counts = context.Array("q", processes)
    stop = context.Event()
    pipes = [context.Pipe() for _ in range(processes)]
    children = [
        context.Process(
            target=_child,
            args=(config, index, processes, invoke_factory, child, counts, stop),
            daemon=True,
        )
        for index, (_, child) in enumerate(pipes)
    ]
    for process in children:
        process.start()
    try:
        for parent, _ in pipes:
            kind, value = _receive(parent)
            if kind == "error":
                raise ConfigError(value)
        start_ns = time.time_ns() + int(_START_MARGIN_S * 1e9)
        for parent, _ in pipes:
            parent.send(start_ns)
        done = threading.Event()
        watcher = _watch_progress(progress, lambda: sum(counts[:]), start_ns, done)
        cancelled = False
        try:
            shares = [_receive(parent)[1] for parent, _ in pipes]
        except KeyboardInterrupt:
            cancelled = True
            stop.set()
            shares = [_receive(parent)[1] for parent, _ in pipes]
        done.set()
        watcher.join()
        return _merge(config, shares, start_ns, cancelled=cancelled)
    finally:
        stop.set()
        for process in children:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()


def _receive(pipe: Connection) -> tuple[str, Any]:
    try:
        kind, value = pipe.recv()
    except EOFError:
        raise ConfigError("a load process exited unexpectedly (see its output above)") from None
    return str(kind), value


def _child(
    config: LoadConfig,
    index: int,
    processes: int,
    invoke_factory: InvokeFactory,
    pipe: Connection,
    counts: SynchronizedArray[int],
    stop_all: Any,
) -> None:
    """A worker process: prepare, say ready, wait for the start time, drive, send the share."""
    share = _Share(index, processes)
    try:
        prepared = _prepare(config, share, invoke_factory)
    except Exception as error:  # reported by the parent as the run's error
        pipe.send(("error", str(error)))
        return
    pipe.send(("ready", None))
    start_ns = pipe.recv()
    stop = threading.Event()

    def relay() -> None:
        while not stop.wait(_PROGRESS_INTERVAL_S):
            counts[index] = len(share.results)
            if stop_all.is_set():
                stop.set()

    relay_thread = threading.Thread(target=relay, daemon=True)
    relay_thread.start()
    try:
        _drive(config, share, prepared, start_ns, stop)
    except KeyboardInterrupt:
        stop.set()  # the parent decides; send what there is
    stop.set()
    relay_thread.join()
    pipe.send(("done", share))
