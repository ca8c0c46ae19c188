"""The real ghz (`make peers`: tools/peers/ghz) and gpualloc-load run the same loadtest/ghz
configs against one `gpualloc serve --demo`, in one run (loadtest/bench_ghz.py, `make bench
ARGS=ghz`): both get answers, and gpualloc-load's report has the real ghz's keys, types and
units, checked on the live reports the same way tests/unit/loadtest checks ghz's recorded one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from loadtest import bench_ghz
from loadtest.smoke import gpualloc_serve
from tests.peers import peer
from tests.unit.loadtest.ghz_shape import (
    REPORT_KEYS,
    check_histogram,
    check_latency_distribution,
    check_totals,
)

DURATION_S = 1.5


@pytest.fixture(scope="module")
def reports() -> Iterator[dict[str, tuple[dict[str, Any], dict[str, Any]]]]:
    peer("ghz")
    with gpualloc_serve(None) as target:
        yield {name: bench_ghz.compare(name, target, DURATION_S) for name in bench_ghz.COMPARED}


@pytest.mark.parametrize("name", bench_ghz.COMPARED)
def test_ghz_and_gpualloc_load_both_get_answers(reports, name):
    ghz, load = reports[name]
    assert ghz["statusCodeDistribution"].get("OK", 0) > 0, ghz["statusCodeDistribution"]
    assert load["statusCodeDistribution"].get("OK", 0) > 0, load["statusCodeDistribution"]
    assert ghz["rps"] > 0 and load["rps"] > 0
    assert bench_ghz.p99_ms(ghz) > 0 and bench_ghz.p99_ms(load) > 0


@pytest.mark.parametrize(
    "check",
    [
        pytest.param(check_totals, id="count-total-average-rps-in-ns-and-per-second"),
        pytest.param(check_latency_distribution, id="latency-distribution-percentiles-in-ns"),
        pytest.param(check_histogram, id="histogram-marks-in-seconds-fastest-to-slowest"),
    ],
)
@pytest.mark.parametrize("tool", ["ghz", "gpualloc-load"])
def test_the_live_reports_hold_ghz_s_relations(reports, tool, check):
    ghz, load = reports["allocate.json"]
    check(ghz if tool == "ghz" else load)


def test_gpualloc_load_s_report_has_the_real_ghz_s_keys_and_types(reports):
    ghz, load = reports["health.json"]
    untagged = [k for k in REPORT_KEYS if k != "tags"]  # no tags: omitted, as ghz omits them
    assert list(ghz) == list(load) == untagged
    assert {k: type(v).__name__ for k, v in load.items() if k != "details"} == {
        k: type(v).__name__ for k, v in ghz.items() if k != "details"
    }
    shared = [k for k in ghz["options"] if k in load["options"]]
    assert {k: (ghz["options"][k], load["options"][k]) for k in ("call", "host", "insecure")} == {
        k: (ghz["options"][k],) * 2 for k in ("call", "host", "insecure")
    }
    assert len(shared) >= 10, sorted(set(ghz["options"]) ^ set(load["options"]))
