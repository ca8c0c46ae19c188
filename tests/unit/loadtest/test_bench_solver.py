"""How the solver bench (loadtest/bench_solver.py) times: under the allocator server's own
collector policy, CPython's settings restored after; one row's columns and totals. No timing
is asserted (targets live in the bench itself, never in tests)."""

from __future__ import annotations

import gc

import pytest

from loadtest.bench_solver import run, server_gc
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
    for column in ("median_ms", "p99_ms", "pinned_median_ms", "pinned_p99_ms"):
        assert row[column] > 0
    assert row["p99_ms"] >= row["median_ms"]
    assert row["pinned_p99_ms"] >= row["pinned_median_ms"]
