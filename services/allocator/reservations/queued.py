"""When a reservation's work was queued: the `gpualloc.dev/queued-at` label, typed.

A grant's request may say when the work it is for was queued (a Kueue Workload's creation, a
Slurm job's submit time; by default when the call arrived). The reservation keeps it as a
label, so every replica's planner reads it: Kueue's `LowerOrNewerEqualPriority` compares the
preemptor's queued time with each candidate's (docs/tenancy.md). A reservation without the
label (made by Reserve, or before the label existed) was queued when it was reserved.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from services.allocator.reservations.model import Reservation

__all__ = ["QUEUED_AT_LABEL", "queued_at", "with_queued_at"]

QUEUED_AT_LABEL = "gpualloc.dev/queued-at"


def queued_at(reservation: Reservation) -> float:
    """Seconds since the epoch its work was queued (its reservation's time without the label,
    or with one that does not parse)."""
    for name, value in reservation.labels:
        if name == QUEUED_AT_LABEL:
            try:
                return datetime.fromisoformat(value).timestamp()
            except ValueError:
                break
    return reservation.created_at


def with_queued_at(
    labels: Sequence[tuple[str, str]], seconds: float
) -> tuple[tuple[str, str], ...]:
    """`labels` with the queued time (RFC 3339, UTC, microseconds), replacing any given."""
    text = datetime.fromtimestamp(seconds, tz=UTC).isoformat(timespec="microseconds")
    kept = [(name, value) for name, value in labels if name != QUEUED_AT_LABEL]
    return tuple(sorted([*kept, (QUEUED_AT_LABEL, text.replace("+00:00", "Z"))]))
