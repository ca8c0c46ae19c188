"""The runner's report is ghz's JSON report: keys, order, types, units, arithmetic and bytes.

Checked against real ghz output in tests/data/ghz/ (see PROVENANCE.md): the documentation's
sample report, and the exact JSON string ghz's own reporter test expects. The percentile table
is ghz's `TestReport_latencies`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import grpc
import pytest

from loadtest.ghzlike.report import (
    CallResult,
    Options,
    Report,
    build_report,
    error_text,
    go_status_name,
    go_time,
    report_json,
)
from loadtest.ghzlike.summary import csv_text, summary_text
from tests.unit.loadtest.ghz_shape import (
    GHZ_DATA,
    REPORT_KEYS,
    check_details,
    check_histogram,
    check_latency_distribution,
    check_report,
    check_totals,
    ghz_sample,
)

START_NS = 1_700_000_000_000_000_000
MS = 1_000_000


def sample_results() -> list[CallResult]:
    """20 calls: 17 OK between 2 and 40 ms, 2 Internal and 1 Unavailable."""
    results = []
    for i in range(20):
        latency = (2 + (i * 7) % 38) * MS + i * 1_111
        if i in (4, 11):
            code, details = grpc.StatusCode.INTERNAL, "boom <tag> & more"
        elif i == 15:
            code, details = grpc.StatusCode.UNAVAILABLE, "gone"
        else:
            results.append(CallResult(START_NS + (i + 1) * 5 * MS, latency, "OK"))
            continue
        results.append(
            CallResult(
                START_NS + (i + 1) * 5 * MS,
                latency,
                go_status_name(code),
                error_text(code, details),
            )
        )
    return results


def our_report(**kw: Any) -> dict[str, Any]:
    options = Options(call="gpualloc.allocator.v1.Allocator/Allocate", host="127.0.0.1:1",
                      insecure=True, concurrency=4, total=20, name="run")  # fmt: skip
    run = Report(options=options, total_ns=150 * MS, end_reason="normal", tags={"env": "test"})
    return build_report(sample_results(), run, **kw)


REPORTS = {"ghz-documentation-sample": ghz_sample, "ours": our_report}


def test_top_level_keys_come_in_ghz_order() -> None:
    assert list(our_report()) == list(ghz_sample()) == REPORT_KEYS


@pytest.mark.parametrize("key", [pytest.param(k, id=k) for k in REPORT_KEYS])
def test_each_field_has_the_json_type_ghz_writes(key: str) -> None:
    ours, theirs = our_report()[key], ghz_sample()[key]
    assert type(ours) is type(theirs), f"{key}: {type(ours).__name__} vs {type(theirs).__name__}"


@pytest.mark.parametrize(
    "check",
    [
        pytest.param(check_totals, id="count-total-average-rps-in-ns-and-per-second"),
        pytest.param(check_latency_distribution, id="latency-distribution-percentiles-in-ns"),
        pytest.param(check_histogram, id="histogram-marks-in-seconds-fastest-to-slowest"),
        pytest.param(check_details, id="details-timestamps-ns-go-error-texts"),
    ],
)
@pytest.mark.parametrize("source", [pytest.param(k, id=k) for k in REPORTS])
def test_ghz_relations_between_fields_hold_for_both(source: str, check: Any) -> None:
    check(REPORTS[source]())


def test_numbers_are_what_the_calls_say() -> None:
    report = our_report()
    results = sample_results()
    ok = sorted(r.latency_ns for r in results if not r.error)
    assert (report["count"], report["total"]) == (20, 150 * MS)
    assert abs(report["average"] - sum(r.latency_ns for r in results) / 20) <= 1
    assert (report["fastest"], report["slowest"]) == (ok[0], ok[-1])
    assert report["rps"] == pytest.approx(20 / 0.15)
    assert report["statusCodeDistribution"] == {"Internal": 2, "OK": 17, "Unavailable": 1}
    assert report["errorDistribution"] == {
        "rpc error: code = Internal desc = boom <tag> & more": 2,
        "rpc error: code = Unavailable desc = gone": 1,
    }
    assert sum(b["count"] for b in report["histogram"]) == 17  # errors are not in the latencies
    assert report["details"][0]["timestamp"] == go_time(
        datetime.fromtimestamp(START_NS // 10**9, tz=UTC).astimezone(), nanos=True,
        fraction_ns=5 * MS,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [  # ghz runner/reporter_test.go TestReport_latencies
        pytest.param([15, 20, 35, 40, 50], [15, 20, 35, 40, 50, 50, 50], id="five"),
        pytest.param([3, 6, 7, 8, 8, 10, 13, 15, 16, 20], [3, 7, 8, 15, 16, 20, 20], id="ten"),
        pytest.param(
            [3, 6, 7, 8, 8, 9, 10, 13, 15, 16, 20], [6, 7, 9, 15, 16, 20, 20], id="eleven"
        ),
        pytest.param(
            [2.1, 3.2, 4.5, 6.3, 7.4, 8.5, 9.6, 10.7, 13.8, 15.9, 16.11, 18.17, 20.11, 22.34],
            [3.2, 6.3, 9.6, 16.11, 20.11, 22.34, 22.34],
            id="fourteen-fractional",
        ),
    ],
)
def test_percentiles_are_ghz_s(seconds: list[float], expected: list[float]) -> None:
    results = [CallResult(START_NS, round(s * 1e9), "OK") for s in seconds]
    report = build_report(results, Report(Options(), total_ns=10**10))
    assert [row["latency"] for row in report["latencyDistribution"]] == [
        int(s * 1e9) for s in expected
    ]


def test_histogram_buckets_are_ghz_s() -> None:
    results = [CallResult(START_NS, ms * MS, "OK") for ms in range(1, 11)]
    histogram = build_report(results, Report(Options(), total_ns=10**9))["histogram"]
    assert [b["count"] for b in histogram] == [1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    assert histogram[1]["mark"] == pytest.approx(0.0019) and histogram[-1]["mark"] == 0.01


@pytest.mark.parametrize(
    ("kwargs", "count", "fastest_ms"),
    [
        pytest.param({}, 20, 2, id="defaults"),
        pytest.param({"skip_first": 5}, 15, 6, id="skip-first-drops-the-first-results"),
        pytest.param({"count_errors": True}, 20, 2, id="count-errors-puts-errors-in-the-latencies"),
    ],
)
def test_skip_first_and_count_errors(kwargs: dict[str, Any], count: int, fastest_ms: int) -> None:
    report = our_report(**kwargs)
    assert report["count"] == count
    buckets = sum(b["count"] for b in report["histogram"])
    errors = sum(report["errorDistribution"].values())
    assert buckets == (count if kwargs.get("count_errors") else count - errors)
    assert report["fastest"] // MS == fastest_ms


def test_ghz_output_round_trips_byte_for_byte() -> None:
    pretty = (GHZ_DATA / "pretty.json").read_text(encoding="utf-8")
    assert report_json(json.loads(pretty), pretty=True) == pretty.rstrip("\n")
    compact = (GHZ_DATA / "reporter_test_marshal.json").read_text(encoding="utf-8")
    assert report_json(json.loads(compact), pretty=False) == compact


def test_our_json_is_html_escaped_and_parses_back() -> None:
    text = report_json(our_report(), pretty=False)
    assert "\\u003ctag\\u003e \\u0026 more" in text and "<" not in text
    assert json.loads(text) == our_report() | {"date": json.loads(text)["date"]}


def test_options_echo_has_ghz_s_keys_order_and_omissions() -> None:
    expected = json.loads((GHZ_DATA / "reporter_test_marshal.json").read_text(encoding="utf-8"))
    assert list(Options().to_json().items()) == list(expected["options"].items())


def test_a_run_without_calls_reports_like_ghz() -> None:
    expected = json.loads((GHZ_DATA / "reporter_test_marshal.json").read_text(encoding="utf-8"))
    moment = datetime(2006, 1, 2, 15, 4, tzinfo=timezone(timedelta(hours=-7)))
    report = build_report([], Report(Options(), total_ns=10**10, end_reason="", date=moment))
    assert list(report) == list(expected)
    assert report["date"] == expected["date"]
    for key in ("latencyDistribution", "histogram", "details"):
        assert report[key] is None
    # ghz's Finalize always makes the two maps, so a real run has {} where the test has null
    assert report["errorDistribution"] == report["statusCodeDistribution"] == {}


@pytest.mark.parametrize(
    ("moment", "nanos", "fraction", "text"),
    [
        pytest.param(datetime(2018, 12, 17, 20, 52, 55, tzinfo=UTC), False, None,
                     "2018-12-17T20:52:55Z", id="rfc3339-utc-is-z"),
        pytest.param(datetime(2018, 12, 17, 16, 52, 55, tzinfo=timezone(timedelta(hours=-4))),
                     True, 736930000, "2018-12-17T16:52:55.73693-04:00",
                     id="rfc3339nano-trims-trailing-zeros"),
        pytest.param(datetime(2018, 12, 17, 16, 52, 55, tzinfo=timezone(timedelta(minutes=330))),
                     True, 0, "2018-12-17T16:52:55+05:30", id="rfc3339nano-whole-second"),
    ],
)  # fmt: skip
def test_times_are_written_as_go_writes_them(
    moment: datetime, nanos: bool, fraction: int | None, text: str
) -> None:
    assert go_time(moment, nanos=nanos, fraction_ns=fraction) == text


@pytest.mark.parametrize(
    ("code", "name"),
    [
        pytest.param(grpc.StatusCode.OK, "OK", id="ok"),
        pytest.param(grpc.StatusCode.CANCELLED, "Canceled", id="cancelled-is-spelled-canceled"),
        pytest.param(grpc.StatusCode.DEADLINE_EXCEEDED, "DeadlineExceeded", id="deadline"),
        pytest.param(grpc.StatusCode.INVALID_ARGUMENT, "InvalidArgument", id="invalid-argument"),
        pytest.param(grpc.StatusCode.UNAVAILABLE, "Unavailable", id="unavailable"),
    ],
)
def test_status_names_are_grpc_go_s(code: grpc.StatusCode, name: str) -> None:
    assert go_status_name(code) == name
    assert error_text(code, "x") == f"rpc error: code = {name} desc = x"


def test_every_status_code_has_a_go_name() -> None:
    names = {go_status_name(code) for code in grpc.StatusCode}
    assert len(names) == len(grpc.StatusCode)


def test_summary_and_csv_read_like_ghz_s() -> None:
    report = our_report()
    summary = summary_text(report)
    for line in ("Summary:", "  Name:\t\trun", "  Count:\t20", "  Requests/sec:\t133.33",
                 "Response time histogram:", "Latency distribution:", "  [OK]",
                 "Error distribution:"):  # fmt: skip
        assert line in summary, line
    assert summary.count("∎") > 0 and summary.count(" % in ") == 7
    lines = csv_text(report).strip().splitlines()
    assert lines[0] == "duration (ms),status,error" and len(lines) == 21
    check_report(report)
