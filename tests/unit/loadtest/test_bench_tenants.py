"""The fair sharing benchmark (loadtest/bench_tenants.py): its streams offer the load they say,
and each mode runs its rules through the real AllocatorService on a small DynamicMIG fleet."""

from __future__ import annotations

import pytest

import loadtest.bench_tenants as bench


@pytest.mark.parametrize(
    "busy_load",
    [pytest.param(0.4, id="busy-at-40-percent"), pytest.param(0.7, id="busy-at-70-percent")],
)
def test_a_busy_tenant_offers_its_load(busy_load: float) -> None:
    steps, duration = 2000, 45
    jobs = bench.streams(7, steps, duration, 96, busy_load)
    for tenant in bench.TENANTS:
        minutes = {j.arrives for j in jobs if j.tenant == tenant}
        busy = max(minutes) - min(minutes)  # an upper bound of its busy minutes: idle ones too
        offered = sum(float(j.kind.share) * duration for j in jobs if j.tenant == tenant)
        per_busy_minute = offered / (busy * 0.5)  # busy about half the time
        assert 0.6 * busy_load * 96 < per_busy_minute < 1.6 * busy_load * 96, tenant


@pytest.fixture(scope="module")
def small_runs() -> dict[str, bench.ModeResult]:
    slices, nodes = bench.fleet(24)
    jobs = bench.streams(1, 90, 15, 24)  # seed 1: ten preemptions in the preemption mode
    return {m: bench.simulate(m, jobs, slices, nodes, 90) for m in bench.MODES}


def test_every_mode_places_jobs_and_holds_at_most_the_fleet(
    small_runs: dict[str, bench.ModeResult],
) -> None:
    for mode, result in small_runs.items():
        assert result.placed > 0, mode
        assert 0 < result.utilization <= 1, mode
        assert sum(result.used_share.values()) == pytest.approx(result.utilization), mode
        assert all(0 <= v <= 1 for v in result.nominal_served.values()), mode


def test_only_the_preempting_modes_preempt(small_runs: dict[str, bench.ModeResult]) -> None:
    """Each reclaiming Allocate revoked or moved at least one running job; only the modes
    with preemption (classical and fair sharing) make any."""
    for mode in ("static", "borrowing"):
        assert small_runs[mode].preemptions == small_runs[mode].moves == 0, mode
    assert not small_runs["borrowing"].reclaim_seconds
    for mode in ("preemption", "fair-sharing"):
        preemption = small_runs[mode]
        assert preemption.reclaim_seconds, mode
        assert preemption.preemptions + preemption.moves >= len(preemption.reclaim_seconds)


def test_the_strict_shortfall_splits_into_lumps_and_the_unserved(
    small_runs: dict[str, bench.ModeResult],
) -> None:
    """nominal_served = 1 - lumps - unserved per tenant (the rows' worst_lumps and
    worst_unserved): the shortfall no queued job could fill within nominal, and the rest."""
    for mode, result in small_runs.items():
        for tenant in bench.TENANTS:
            parts = 1 - result.lumps[tenant] - result.unserved[tenant]
            assert result.nominal_served[tenant] == pytest.approx(parts), (mode, tenant)
        assert 0 < result.demand_bound <= 1, mode
