"""The store layout dimension of `make bench` (loadtest/bench_store.py): from the measured rows
of each layout x WAIT, the side-by-side ratios and the cluster's target, as `--json` prints them.
(The measuring itself starts servers and Redis Cluster: `make bench ARGS=service`, not a test.)"""

from __future__ import annotations

import pytest

from loadtest.bench_store import _add_layout_ratios
from loadtest.report import BenchReport

PHASE = "allocate-reserve"


def measured(prefix: str, rps: dict[str, float], p99: dict[str, float]) -> BenchReport:
    report = BenchReport("service")
    for case, value in rps.items():
        report.add(f"{prefix}{case}:{PHASE}", rps=value, p99_ms=p99[case], calls=100)
    return report


CASES = {
    "standalone-wait-off": (400.0, 20.0),
    "standalone-wait-on": (300.0, 40.0),
    "cluster-wait-off": (360.0, 25.0),
    "cluster-wait-on": (330.0, 30.0),
}


@pytest.mark.parametrize("prefix", [pytest.param("", id="store-suite"),
                                    pytest.param("store:", id="service-suite")])  # fmt: skip
def test_ratios_of_the_layouts_side_by_side(prefix: str) -> None:
    report = measured(
        prefix, {k: v[0] for k, v in CASES.items()}, {k: v[1] for k, v in CASES.items()}
    )
    _add_layout_ratios(report, [PHASE], prefix)
    ratios = {r["name"]: (r["ratio"], r["p99_ratio"]) for r in report.to_json()["rows"][4:]}
    assert ratios == {
        f"{prefix}cluster/standalone-wait-off:{PHASE}": (0.9, 1.25),
        f"{prefix}cluster/standalone-wait-on:{PHASE}": (1.1, 0.75),
        f"{prefix}standalone-wait-on/off:{PHASE}": (0.75, 2.0),
        f"{prefix}cluster-wait-on/off:{PHASE}": (0.917, 1.2),
    }
    [target] = report.to_json()["targets"]
    assert target == {
        "target": f"{prefix}cluster/standalone-wait-off:{PHASE}: ratio >= 0.85",
        "met": True,
    }


@pytest.mark.parametrize(
    ("cluster_rps", "met"),
    [pytest.param(339.0, False, id="cluster-15%-slower-misses"),
     pytest.param(340.0, True, id="cluster-exactly-15%-slower-meets")],
)  # fmt: skip
def test_the_target_is_the_cluster_within_15_percent_with_wait_off(
    cluster_rps: float, met: bool
) -> None:
    report = measured("", {"standalone-wait-off": 400.0, "cluster-wait-off": cluster_rps},
                      {"standalone-wait-off": 20.0, "cluster-wait-off": 20.0})  # fmt: skip
    _add_layout_ratios(report, [PHASE], "")
    assert report.targets_met() is met


def test_a_case_not_measured_gives_no_ratio_and_an_unmeasured_target() -> None:
    report = measured("", {"standalone-wait-off": 400.0}, {"standalone-wait-off": 20.0})
    _add_layout_ratios(report, [PHASE], "")
    assert [r.name for r in report.rows] == [f"standalone-wait-off:{PHASE}"]
    assert report.to_json()["targets"][0]["met"] is None
