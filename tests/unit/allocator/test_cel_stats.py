"""A solve's CEL statistics are its own: counted on the solve's CelMeter, not as deltas of the
SelectorCache's process-wide counters (which every server thread adds to at once)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from services.allocator.core import (
    AllocatedState,
    ClusterSnapshot,
    SearchBudget,
    SelectorCache,
    SolveResult,
    solve,
)
from services.cel.selectors import CelDevice, CelMeter
from tests.builders import DRIVER, claim, classes, cls, device, slice_, snapshot


def fleet() -> ClusterSnapshot:
    """Two nodes of 8 GPUs, 4 profiles; a fresh snapshot each time (its templates memoise
    solves)."""
    return snapshot(
        *(
            slice_(f"n{n}-gpus", *(device(f"gpu-{i}").attr("index", i % 4) for i in range(8))).node(
                f"node-{n}"
            )
            for n in range(2)
        )
    )


CLASSES = classes(cls("gpu"))  # no class selector: the two solves below share no expression
FIRST = f'device.attributes["{DRIVER}"].index >= 0'
SECOND = f'device.attributes["{DRIVER}"].index < 100'


def _solve(
    selector: str,
    selectors: SelectorCache,
    node: str | None,
    snap: ClusterSnapshot,
    cancelled: Callable[[], bool] | None = None,
) -> SolveResult:
    claims = [claim("c").request("g", "gpu", 2, selector).build()]
    return solve(
        snap,
        AllocatedState(snap),
        CLASSES,
        claims,
        node=node,
        selectors=selectors,
        budget=SearchBudget(cancelled=cancelled),
    )


def _counts(result: SolveResult) -> tuple[int, int]:
    return result.stats.cel_evaluations, result.stats.cel_profile_hits


def _cache(warm: bool, *expressions: str) -> SelectorCache:
    """A cache; warm: each expression already evaluated for every profile (on another
    snapshot, so that no template memo stands in for the solve)."""
    cache = SelectorCache()
    for expression in expressions if warm else ():
        _solve(expression, cache, None, fleet())
    return cache


@pytest.mark.parametrize(
    "node", [pytest.param(None, id="unpinned"), pytest.param("node-1", id="pinned")]
)
@pytest.mark.parametrize(
    ("warm", "expected"),
    [
        pytest.param(False, (4, 0), id="cold-cache-evaluates-each-profile"),
        pytest.param(True, (0, 4), id="warm-cache-hits-each-profile"),
    ],
)
def test_concurrent_solves_each_report_their_own_cel_counts(
    node: str | None, warm: bool, expected: tuple[int, int]
) -> None:
    """(evaluations, memo hits) of each solve, alone and while the other solve runs on the same
    cache in the middle of it: the same. Deltas of the cache's totals would count the other's."""
    alone = {s: _counts(_solve(s, _cache(warm, s), node, fleet())) for s in (FIRST, SECOND)}
    assert alone == {FIRST: expected, SECOND: expected}

    shared, snap = _cache(warm, FIRST, SECOND), fleet()
    totals = shared.evaluations, shared.profile_hits
    second_done = threading.Event()
    looked = threading.Event()

    def wait_for_the_second() -> bool:
        """The first solve's stop check: its first look waits until the second solve has run
        all its evaluations on the shared cache (False: never stop)."""
        if not looked.is_set():
            looked.set()
            assert second_done.wait(10)
        return False

    results: dict[str, SolveResult] = {}

    def first() -> None:
        results[FIRST] = _solve(FIRST, shared, node, snap, wait_for_the_second)

    thread = threading.Thread(target=first)
    thread.start()
    assert looked.wait(10)  # the first solve is under way, before its first evaluation
    results[SECOND] = _solve(SECOND, shared, node, snap)
    second_done.set()
    thread.join(10)

    assert {s: _counts(r) for s, r in results.items()} == alone
    # the process-wide totals (the metrics) still count both
    assert (shared.evaluations - totals[0], shared.profile_hits - totals[1]) == (
        2 * expected[0],
        2 * expected[1],
    )


def test_a_meter_counts_its_own_evaluations_and_memo_hits() -> None:
    selector = SelectorCache().compile(FIRST)
    devices = [
        CelDevice.from_device(DRIVER, device(f"gpu-{i}").attr("index", i % 3).build())
        for i in range(9)
    ]
    meter, other = CelMeter(), CelMeter()
    for entry in devices:
        selector.matches(entry, meter)
    selector.matches(devices[0], other)
    assert (meter.evaluations, meter.profile_hits) == (3, 6)
    assert (other.evaluations, other.profile_hits) == (0, 1)
