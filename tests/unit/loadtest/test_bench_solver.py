"""How the solver bench (loadtest/bench_solver.py) times: under the allocator server's own
collector policy, CPython's settings restored after; the p99s of every solve, and beside them
of the solves no collection landed in, those counted apart; one row's columns and totals. No
timing is asserted (targets live in the bench itself, never in tests)."""

from __future__ import annotations

import gc

import pytest

from loadtest.bench_solver import Collections, Timed, run, server_gc
from services.common.gc_policy import GcPolicy


def test_the_timed_parts_run_under_the_servers_collector_policy() -> None:
    before = gc.get_threshold()
    with server_gc():
        inside = gc.get_threshold()
        frozen = gc.get_freeze_count()
    assert inside == (GcPolicy().young_threshold, *before[1:])
    assert frozen > 0  # what was built before the timed parts is frozen, as in the server
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_settings_come_back_when_a_row_fails() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError, match="row failed"), server_gc():
        raise RuntimeError("row failed")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_one_row_reports_its_columns_and_the_totals_of_before() -> None:
    report = run(quick=True, rows="^1000/eight-gpus$").to_json()
    assert report["setup"]["solves_per_kind"] == 300
    assert report["setup"]["gc"] == "server policy (GcPolicy)"
    rows = {row["name"]: row for row in report["rows"]}
    assert list(rows) == ["1000/setup", "1000/eight-gpus"]
    row = rows["1000/eight-gpus"]
    assert (row["capacity_total"], row["unsat"], row["cel_excess"]) == (72, 0, 0)
    assert row["batch_claims_s"] > 0
    for column in ("median_ms", "p99_ms", "pinned_median_ms", "pinned_p99_ms", "batch_again_ms"):
        assert row[column] > 0
    assert row["p99_no_gc_ms"] > 0 and row["pinned_p99_no_gc_ms"] > 0
    assert 0 <= row["gc_solves"] <= 2 * 300
    assert (row["gc_solve_ms"] > 0) == (row["gc_solves"] > 0)
    assert row["batch_gcs"] >= 0


def test_a_solve_a_collection_lands_in_counts_in_the_p99_and_apart() -> None:
    timed = Timed()
    for ms in (1.0, 2.0, 3.0):
        timed.add(ms / 1000, collected=False)
    timed.add(50 / 1000, collected=True)
    assert timed.p99_no_gc_ms() == 3.0  # the solves no collection landed in
    assert timed.p99_ms() == 50.0  # every solve: what a caller sees
    assert timed.median_ms() == 2.5  # every solve
    with Collections() as collections:
        gc.collect()
    gc.collect()
    assert collections.count == 1  # while in use only
