"""The typed errors every layer raises; mapped to gRPC status codes once, in grpc_errors.py.

Tree::

    GpuallocError
    ├── InvalidArgument        bad input: a request, a file, a flag (carries the field path)
    │   └── ParseError         input that is not even well-formed YAML/JSON/XML (file, line)
    ├── NotFound               a named object does not exist (reservation, device class, node)
    ├── AlreadyExists          a create that collides with an existing object
    ├── Conflict               optimistic concurrency lost: the devices moved (ABORTED)
    ├── Unauthenticated        the caller proved no identity (no/invalid certificate or token)
    ├── PermissionDenied       the caller may not do this (policy, owner, tenant)
    ├── FailedPrecondition     the system is not in a state to do this (incomplete pool for All)
    ├── ResourceExhausted      a bound was hit: message size, search budget, CEL cost
    ├── Unavailable            a dependency (Redis, inventory) cannot be reached
    └── DeadlineExceeded       the caller's deadline ran out

This module imports nothing but the standard library so that pure cores can raise these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "AlreadyExists",
    "Conflict",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FieldViolation",
    "GpuallocError",
    "InvalidArgument",
    "NotBound",
    "NotFound",
    "ParseError",
    "PermissionDenied",
    "Preempted",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "clip",
]


@dataclass(frozen=True)
class FieldViolation:
    """One bad field: `path` in Kubernetes field-path syntax, e.g. `spec.devices[3].name`."""

    path: str
    description: str

    def __str__(self) -> str:
        return f"{self.path}: {self.description}" if self.path else self.description


class GpuallocError(Exception):
    """Base of every error gpualloc raises on purpose. Anything else reaching a server is a bug."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(GpuallocError):
    """Bad input. `violations` name each offending field; the message names the first."""

    def __init__(self, message: str, violations: Sequence[FieldViolation] = ()) -> None:
        super().__init__(message)
        self.violations: tuple[FieldViolation, ...] = tuple(violations)

    @classmethod
    def at(cls, path: str, description: str) -> InvalidArgument:
        """Bad value at one field path: message `path: description`."""
        violation = FieldViolation(path, description)
        return cls(str(violation), [violation])

    @property
    def field_path(self) -> str:
        return self.violations[0].path if self.violations else ""


class ParseError(InvalidArgument):
    """Input that is not well-formed; `source` is the file name (or `<stdin>`), `line` 1-based."""

    def __init__(self, message: str, source: str = "", line: int | None = None) -> None:
        where = source + (f":{line}" if line is not None else "")
        super().__init__(f"{where}: {message}" if where else message)
        self.source = source
        self.line = line


class NotFound(GpuallocError):
    pass


class AlreadyExists(GpuallocError):
    pass


class Conflict(GpuallocError):
    """The placement is no longer free; `conflicts` lists what moved (`driver/pool/device`).
    `holders`: the reservation id holding each conflicting device key, as the message names
    them (kept in process only: the edge redacts another tenant's before it answers)."""

    def __init__(
        self,
        message: str,
        conflicts: Sequence[str] = (),
        holders: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.conflicts: tuple[str, ...] = tuple(conflicts)
        self.holders: dict[str, str] = dict(holders or {})


class PermissionDenied(GpuallocError):
    pass


class Unauthenticated(GpuallocError):
    """The call carries no identity the server can verify (UNAUTHENTICATED)."""


class FailedPrecondition(GpuallocError):
    pass


class Preempted(FailedPrecondition):
    """A change of a reservation that a preemption revoked: `by` is the owner it went to.
    Travels as FAILED_PRECONDITION with ErrorInfo reason RESERVATION_PREEMPTED, so a holder
    (the Slurm bridge's sync, say) tells it from a stale token without reading the message."""

    def __init__(self, reservation_id: str, by: str, message: str = "") -> None:
        super().__init__(message or f"reservation {reservation_id} was preempted by {by}")
        self.reservation_id = reservation_id
        self.by = by


class NotBound(FailedPrecondition):
    """Commit of a reservation whose devices still wait for binding conditions. Travels as
    FAILED_PRECONDITION with ErrorInfo reason RESERVATION_BINDING: commit again once it is
    bound (a holder tells it from other refusals without reading the message)."""

    def __init__(self, reservation_id: str, message: str) -> None:
        super().__init__(message)
        self.reservation_id = reservation_id


class ResourceExhausted(GpuallocError):
    """A bound was hit. `retry_after_seconds` > 0: the bound is momentary (concurrency), and
    the client may retry after that long (sent as google.rpc.RetryInfo)."""

    def __init__(self, message: str, retry_after_seconds: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class Unavailable(GpuallocError):
    pass


class DeadlineExceeded(GpuallocError):
    pass


def clip(value: object, limit: int = 200) -> str:
    """`value` as text, cut after `limit` characters (then an ellipsis and the full length):
    for error messages that echo what a client sent, since an 8,000-character id must not make
    the error larger than the metadata a client accepts. The one helper for that."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"
