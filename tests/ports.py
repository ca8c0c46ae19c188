"""Free TCP ports for the servers tests start (redis-server, slurmctld, gRPC subprocesses).

A port from `bind(("127.0.0.1", 0))` is an ephemeral one, and so is the local end of every
outgoing connection: between the probe and the server's own bind, a client connection (a Redis
Cluster bus link, a gRPC channel) may take it and the server fails with "Address already in
use". The ports handed out here come from below the kernel's ephemeral range, which outgoing
connections never use, and never twice from one process, so that race is gone.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 20000
_lock = threading.Lock()
_handed_out: set[int] = set()


def _range() -> tuple[int, int]:
    """[low, high) below the ephemeral range, or (0, 0) where the range cannot be read."""
    try:
        first = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return (0, 0)
    return (_LOWEST, first) if first - _LOWEST >= 1000 else (0, 0)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _ephemeral() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_port(*, following: int = 0) -> int:
    """A port P free now, never handed out before by this process; with `following=N`, the N
    ports after it are free (and handed out) too."""
    low, high = _range()
    rng = random.SystemRandom()
    with _lock:
        for _ in range(200):
            port = rng.randrange(low, high - following) if high else _ephemeral()
            block = range(port, port + following + 1)
            if any(p in _handed_out for p in block) or not all(_bindable(p) for p in block):
                continue
            _handed_out.update(block)
            return port
    raise RuntimeError("no free port found in 200 tries")
