"""The real ghz (`make peers`: tools/peers/ghz) and gpualloc-load run the same loadtest/ghz
configs against one `gpualloc serve --demo`, in one run (loadtest/bench_ghz.py, `make bench
ARGS=ghz`): both get answers, and gpualloc-load's report has the real ghz's keys, types and
units, checked on the live reports the same way tests/unit/loadtest checks ghz's recorded one."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtest import bench_ghz
from loadtest.ghzlike.html import SUMMARY_FIELDS
from loadtest.peers import peer_binary
from loadtest.smoke import ROOT, gpualloc_serve
from tests.peers import peer
from tests.unit.loadtest.ghz_shape import (
    REPORT_KEYS,
    check_histogram,
    check_latency_distribution,
    check_totals,
)

DURATION_S = 1.5


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    peer("ghz")
    with gpualloc_serve(None) as address:
        yield address


@pytest.fixture(scope="module")
def reports(target: str) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    return {name: bench_ghz.compare(name, target, DURATION_S) for name in bench_ghz.COMPARED}


def _both(flags: list[str], target: str, out: Path) -> tuple[str, str]:
    """The same flags to the real ghz and to gpualloc-load: each one's `-o` output."""
    written = []
    for tool in (str(peer_binary("ghz")), str(ROOT / ".venv" / "bin" / "gpualloc-load")):
        path = out / f"{Path(tool).name}.out"
        done = subprocess.run([tool, *flags, "-z", "0.5s", "-o", str(path), target], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert done.returncode == 0, (tool, done.stderr)
        written.append(path.read_text(encoding="utf-8"))
    return written[0], written[1]


def test_proto_and_import_paths_flags_mean_the_same_to_both(target, tmp_path):
    proto = "protos/allocator/v1/allocator.proto"
    flags = ["--config", "loadtest/ghz/explain.json", "--proto", proto, "--import-paths", ".",
             "-O", "json"]  # fmt: skip
    ghz, load = (json.loads(text) for text in _both(flags, target, tmp_path))
    assert ghz["statusCodeDistribution"].get("OK", 0) > 0
    assert load["statusCodeDistribution"].get("OK", 0) > 0
    keys = ("proto", "import-paths")
    assert {k: load["options"][k] for k in keys} == {k: ghz["options"][k] for k in keys}


def _html_outline(page: str) -> dict[str, list[str]]:
    summary = page[page.index("<h3>Summary</h3>") : page.index("<h3>Histogram</h3>")]
    status = page[page.index("<h3>Status distribution</h3>") : page.index("<h3>Data</h3>")]
    return {
        "title": re.findall(r"<title>(.*?)</title>", page),
        "sections": re.findall(r"<h3>(.*?)</h3>", page),
        "summary": re.findall(r"<th>(.*?)</th>", summary),
        "status-columns": re.findall(r"<th>(.*?)</th>", status),
        "downloads": re.findall(r'id="(dl[A-Z]+)"', page),
    }


def test_html_reports_have_the_same_sections_and_summary_fields(target, tmp_path):
    flags = ["--config", "loadtest/ghz/health.json", "-O", "html"]
    ghz, load = _both(flags, target, tmp_path)
    assert _html_outline(load) == _html_outline(ghz)
    assert _html_outline(load)["summary"] == list(SUMMARY_FIELDS)


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
