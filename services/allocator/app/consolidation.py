"""Consolidation as the service executes it: a replacement names the reservation it replaces.

The planner (core/preemption.py `plan_consolidation`, core/moves.py) chooses who moves and to
which device; the service reserves each replacement for the moved reservation's owner before
revoking the original (app/service.py `_replace`), labelled with `MOVED_FROM_LABEL`.
"""

from __future__ import annotations

__all__ = ["MOVED_FROM_LABEL"]

MOVED_FROM_LABEL = "gpualloc.dev/moved-from"  # on a replacement: the reservation it replaces
