"""grpc-core's own log lines, routed through the Python logger so JSON logs stay JSON.

grpc-core (C++, absl logging) writes lines such as

    I1204 19:51:28.307551    6462 ssl_transport_security.cc:2563] Handshake failed with ...

straight to file descriptor 2, the stream the servers' JSON log lines go to, so a collector
reading one JSON object per line meets lines it cannot parse. `route_native_stderr` points
descriptor 2 at a pipe: a reader thread logs each grpc-core line as a record of logger
`grpc.core` (the level from its first letter, `source` its file:line) and passes every other
line through unchanged (a child process's own JSON lines, a crash dump); Python's own stderr
and the log handlers keep the real stream.

A failed TLS handshake reaches no servicer and no interceptor (grpcio has no hook for it), and
grpc-core's `Handshake failed` line is all the server learns of it: that line also becomes a
`tls.handshake_failed` audit event (identity `unauthenticated`). grpc-core does not say which
peer it was.

Lines grpc-core writes while the process exits, after the reader thread stopped, may be lost.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from typing import BinaryIO, TextIO

from services.common.security.audit import audit_event

__all__ = ["NATIVE_LOGGER", "native_record", "route_native_stderr"]

NATIVE_LOGGER = "grpc.core"

_LINE = re.compile(
    r"^(?P<level>[DIWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+\s+(?P<source>[\w./+-]+:\d+)\]\s?"
    r"(?P<message>.*)$"
)
_LEVELS = {
    "D": logging.DEBUG,
    "I": logging.INFO,
    "W": logging.WARNING,
    "E": logging.ERROR,
    "F": logging.CRITICAL,
}
_HANDSHAKE_FAILED = "Handshake failed"

_routed = False


def native_record(line: str) -> tuple[int, str, str] | None:
    """(level, source, message) of a grpc-core log line; None for any other line."""
    match = _LINE.match(line.rstrip("\r\n"))
    if match is None:
        return None
    return _LEVELS[match["level"]], match["source"], match["message"]


def route_native_stderr() -> None:
    """Route descriptor 2 through the logger (module docstring); once per process."""
    global _routed
    if _routed:
        return
    _routed = True
    real = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (
            sys.stderr,
            sys.__stderr__,
        ):
            handler.setStream(real)
    sys.stderr = real
    reader = os.fdopen(read_end, "rb")
    threading.Thread(
        target=_forward, args=(reader, real), name="grpc-core-log", daemon=True
    ).start()


def _forward(reader: BinaryIO, real: TextIO) -> None:
    log = logging.getLogger(NATIVE_LOGGER)
    for raw in reader:
        line = raw.decode("utf-8", "replace")
        try:
            record = native_record(line)
            if record is None:
                real.write(line)
                continue
            level, source, message = record
            log.log(level, message, extra={"source": source})
            if message.startswith(_HANDSHAKE_FAILED):
                audit_event(
                    "tls.handshake_failed",
                    None,
                    presented="a TLS handshake that failed (grpc-core names no peer)",
                    reason=message,
                    source=source,
                )
        except Exception:  # noqa: BLE001 - the forwarder must outlive any one bad line
            real.write(line)
