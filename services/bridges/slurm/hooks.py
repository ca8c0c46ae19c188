"""The per-job hooks served by a long-running process, at Slurm's speed.

A Python start and an import of the client cost 0.6-0.8 s, and Slurm waits on its prologs and
epilogs (issue 31: three per job gated a node at ~0.3 jobs/s). So `gpualloc-slurm sync` (and,
on a compute node, `gpualloc-slurm hooks`) listens on a Unix socket, and the Slurm scripts run
examples/bridges/slurm/gpualloc-hook.py, a client of built-in modules started as
`python3 -I -S` (milliseconds), that hands over its arguments and the job's SLURM_*
environment and prints the answer. When nothing listens, the client runs the `gpualloc-slurm`
command instead (the same work, at the old cost), so the bridge keeps working while the
service restarts.

The protocol: one connection per hook; the client sends `gpualloc-hook 1\n`, then each
argument and then each `NAME=value` of the environment, every one ended by a NUL byte, with
an empty one (a lone NUL) between the arguments and the environment, and closes its side; the
server answers `<code>\0<stdout>\0<stderr>` (UTF-8) and closes. NUL-separated, not JSON: no
argument or variable holds a NUL, and the client then imports nothing but built-in modules
(json and socket take a `python3 -I -S` start from ~25 ms to ~50-80 ms on a loaded machine).

The caller is known by the socket's peer credentials (SO_PEERCRED): the commands that change
reservations (`prolog`, `epilog`) are served only to root, the server's own user and the uids
it is given (Slurm's SlurmUser); `task-prolog` (run as the job's user) to anyone, as it only
reads.

`Releases` is the epilogs' queue, released in batches in arrival order: the job completion
script's answer comes at once and its release follows (a prolog whose GPUs are still held waits,
a bounded time, for the releases queued meanwhile and reserves again); a node Epilog's answer
comes once its release is done (or a bounded time passed): Slurm starts no job on that node
before it answers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import socketserver
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["HookAnswer", "HookServer", "Releases"]

log = logging.getLogger("gpualloc.slurm.hooks")

MAX_REQUEST_BYTES = 1 << 20
REQUEST_TIMEOUT_SECONDS = 10.0
"""How long a client may take to send its request (not how long the answer may take)."""
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class HookAnswer:
    """What the hook client prints and exits with."""

    code: int
    stdout: str = ""
    stderr: str = ""

    def encoded(self) -> bytes:
        return f"{self.code}\0{self.stdout}\0{self.stderr}".encode()


Handler = Callable[[Sequence[str], Mapping[str, str], int], HookAnswer]
"""(argv, the job's environment, the caller's uid) -> the answer."""


MAGIC = b"gpualloc-hook 1\n"


def _request(data: bytes) -> tuple[list[str], dict[str, str]]:
    """argv and environment of a request; ValueError when it is not one."""
    if not data.startswith(MAGIC):
        raise ValueError("not a gpualloc-hook request")
    fields = data[len(MAGIC) :].decode().split("\0")
    if len(fields) < 2 or fields[-1] != "" or "" not in fields[:-1]:
        raise ValueError("arguments and environment not NUL-separated")
    fields.pop()  # after the last NUL
    split = fields.index("")
    argv, variables = fields[:split], fields[split + 1 :]
    if not all("=" in v for v in variables):
        raise ValueError("an environment entry is not NAME=value")
    return argv, dict(v.split("=", 1) for v in variables)


class _Connection(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(REQUEST_TIMEOUT_SECONDS)
        try:
            uid = _PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            )[1]
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
                if len(data) > MAX_REQUEST_BYTES:
                    raise ValueError(f"request over {MAX_REQUEST_BYTES} bytes")
            argv, env = _request(data)
        except (OSError, ValueError) as error:
            answer = HookAnswer(2, stderr=f"gpualloc-slurm: bad hook request: {error}\n")
        else:
            try:
                answer = self.server.handler(argv, env, uid)
            except Exception:  # a bug: the hook fails (exit 3), the server keeps serving
                log.exception("hook %s failed", argv)
                answer = HookAnswer(3, stderr="gpualloc-slurm: internal error (see its log)\n")
        with contextlib.suppress(OSError):
            sock.sendall(answer.encoded())


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, path: str, handler: Handler) -> None:
        self.handler = handler
        super().__init__(path, _Connection)


class HookServer:
    """The hooks' Unix socket at `path` (mode 0666: every job user's TaskProlog connects; the
    handler decides who may do what), served on background threads until `close()`."""

    def __init__(self, path: str | Path, handler: Handler) -> None:
        self.path = str(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # left by a server that died
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._server = _Server(self.path, handler)
        os.chmod(self.path, 0o666)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="slurm-hooks", daemon=True
        )

    def start(self) -> HookServer:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def __enter__(self) -> HookServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()


class Releases:
    """The epilogs' releases, off Slurm's critical path: `submit` returns at once; one worker
    thread runs `release` on every batch of what is queued, in arrival order (a release that
    fails is logged: the next sync pass's sweep, or the lease, frees the GPUs), then `then` on
    the batch, which nobody waits for."""

    def __init__(
        self,
        release: Callable[[Sequence[Any]], None],
        then: Callable[[Sequence[Any]], None] = lambda batch: None,
    ) -> None:
        self._release = release
        self._then = then
        self._queue: list[Any] = []
        self._queued = 0  # how many were ever submitted
        self._done = 0  # how many of those are released (or failed)
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._work, name="slurm-releases", daemon=True)
        self._thread.start()

    def submit(self, item: Any) -> int:
        """Queue `item`; its ticket for `wait_for`."""
        with self._changed:
            self._queue.append(item)
            self._queued += 1
            self._changed.notify_all()
            return self._queued

    @property
    def done(self) -> int:
        """How many releases (of those ever submitted) are done or failed."""
        with self._changed:
            return self._done

    def wait_for_queued(self, timeout: float) -> bool:
        """Until every release submitted so far is done (False: `timeout` passed first)."""
        with self._changed:
            return self.wait_for(self._queued, timeout)

    def wait_for(self, ticket: int, timeout: float) -> bool:
        """Until the release `submit` gave `ticket` (and every one before it: they are done in
        arrival order) is done (False: `timeout` passed first)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._done >= ticket, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Finish what is queued (at most `timeout`), then stop the worker."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join(timeout)

    def _work(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._queue or self._closed)
                batch, self._queue = self._queue, []
                if not batch and self._closed:
                    return
            try:
                self._release(batch)
            except Exception:  # a bug: logged; the sweep still frees the GPUs
                log.exception("releasing %d job(s) failed", len(batch))
            with self._changed:
                self._done += len(batch)
                self._changed.notify_all()
            try:
                self._then(batch)
            except Exception:
                log.exception("after releasing %d job(s)", len(batch))
