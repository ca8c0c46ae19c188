"""GcPolicy: survivors frozen, cyclic garbage not (services/common/gc_policy.py)."""

from __future__ import annotations

import gc
import time
import weakref

from services.common.gc_policy import GcPolicy


class _Cycle:
    """One object in a reference cycle with itself: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_cyclic_garbage_made_between_freezes_is_collected_not_frozen() -> None:
    policy = GcPolicy(freeze_every=0.02, full_every=3600.0).start()
    try:
        cycle = _Cycle()
        gone = weakref.ref(cycle)
        del cycle  # garbage now, young: no young collection runs before the next freeze
        freezes = gc.get_freeze_count()
        deadline = time.monotonic() + 5
        while gone() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        # frozen, it would wait for the hourly full collection
        assert gone() is None, f"frozen with {gc.get_freeze_count() - freezes} others"
    finally:
        policy.stop()
    assert gc.get_freeze_count() == 0
