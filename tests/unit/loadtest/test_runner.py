"""The runner against a real allocator on port 0: reflection, reports, errors, pacing, cycles.

The server is the real allocator (embedded store) over the example cluster, served by
services.common.grpc_server with health and reflection, as `gpualloc serve` serves it. Runs are
tiny (tens of calls), and no assertion depends on how fast this machine is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from loadtest.ghzlike.cli import execute, main
from loadtest.ghzlike.config import ConfigError, parse_config
from loadtest.ghzlike.html import SECTIONS, SUMMARY_FIELDS
from loadtest.smoke import ROOT
from protos.allocator.v1 import allocator_pb2, allocator_pb2_grpc
from services.allocator.app.inventory_feed import StaticFeed
from services.allocator.bootstrap import build_allocator
from services.allocator.config import AllocatorSettings
from services.common.config import ServerSettings
from services.common.grpc_server import create_server
from services.common.health import Health
from services.serve import DEMO_CLASSES, DEMO_PATHS
from tests.unit.loadtest.ghz_shape import check_report

ALLOCATE = "gpualloc.allocator.v1.Allocator/Allocate"
H100 = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'


def claim(cel: str = H100) -> dict[str, Any]:
    exactly = {"deviceClassName": "gpu.nvidia.com", "count": "1", "selectors": [{"cel": cel}]}
    return {"name": "load", "requests": [{"name": "gpu", "exactly": exactly}]}


@pytest.fixture(scope="module")
def allocator() -> Iterator[str]:
    settings = replace(AllocatorSettings(), device_classes=DEMO_CLASSES)
    app = build_allocator(settings, StaticFeed.from_paths(DEMO_PATHS), environ={})
    health = Health()
    server, port = create_server(
        "127.0.0.1:0", [app.registration], ServerSettings(), health=health,
        interceptors=app.interceptors(),
    )  # fmt: skip
    server.start()
    app.attach_health(health)
    assert app.wait_ready(10)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None).wait()
        app.close()


def config_for(host: str, **raw: Any) -> Any:
    base = {"call": ALLOCATE, "host": host, "insecure": True, "concurrency": 4, "total": 50,
            "data": {"claims": [claim()]}}  # fmt: skip
    return parse_config({**base, **raw})


def test_allocate_by_reflection_gives_a_ghz_report_of_50_ok_calls(allocator: str) -> None:
    report, outcome = execute(config_for(allocator, name="allocate"))
    assert report["statusCodeDistribution"] == {"OK": 50}
    assert report["errorDistribution"] == {}
    assert report["count"] == len(report["details"]) == 50
    assert report["endReason"] == "normal"
    assert report["options"]["call"] == ALLOCATE and report["options"]["total"] == 50
    assert outcome.processes == 1 and outcome.client_cpu_seconds > 0
    check_report(report)


def test_health_check_with_the_dotted_call_form(allocator: str) -> None:
    config = config_for(allocator, call="grpc.health.v1.Health.Check", data={}, total=20)
    report, _ = execute(config)
    assert report["statusCodeDistribution"] == {"OK": 20}


def test_failing_calls_fill_the_error_distribution(allocator: str) -> None:
    config = config_for(allocator, total=12, data={"claims": [claim("device.nope(")]})
    report, _ = execute(config)
    assert report["statusCodeDistribution"] == {"InvalidArgument": 12}
    ((error, count),) = report["errorDistribution"].items()
    assert count == 12
    assert error.startswith("rpc error: code = InvalidArgument desc = ")
    assert "selectors[0].cel" in error
    # as in ghz: no successful call, so no latency statistics
    assert report["latencyDistribution"] is None and report["histogram"] is None
    assert (report["fastest"], report["slowest"]) == (0, 0)
    counted, _ = execute(replace(config, count_errors=True))
    assert sum(b["count"] for b in counted["histogram"]) == 12


def test_array_data_goes_round_robin_and_templates_render(allocator: str) -> None:
    l40s = 'device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA L40S")'
    data = [{"claims": [claim()]}, {"claims": [claim(l40s)], "owner": "w-{{.WorkerID}}"},
            {"claims": [claim("device.nope(")]}]  # fmt: skip
    report, _ = execute(config_for(allocator, total=30, data=data))
    assert report["statusCodeDistribution"] == {"InvalidArgument": 10, "OK": 20}


def test_rps_paces_the_run(allocator: str) -> None:
    # call k is not sent before (k+1)/rps: in 0.5 s at 40/s at most 20 calls can be made
    report, _ = execute(
        config_for(allocator, rps=40, duration="500ms", **{"duration-stop": "wait"})
    )
    assert 5 <= report["count"] <= 20
    assert report["endReason"] == "timeout"
    assert report["options"]["rps"] == 40 and report["options"]["duration"] == 500_000_000


def test_a_duration_without_total_stops_with_reason_timeout(allocator: str) -> None:
    report, _ = execute(config_for(allocator, duration="300ms", **{"duration-stop": "wait"}))
    assert report["endReason"] == "timeout" and report["count"] > 0
    assert report["options"]["total"] == 2**31 - 1  # as ghz echoes it


def test_worker_processes_split_the_calls(allocator: str) -> None:
    report, outcome = execute(config_for(allocator, total=40, cpus=2))
    assert outcome.processes == 2
    assert report["statusCodeDistribution"] == {"OK": 40}
    assert report["options"]["CPUs"] == 2


def test_release_cycle_leaves_no_reservation(allocator: str) -> None:
    data = {"claims": [claim()], "reserve": True, "leaseTtl": "60s", "owner": "load-{{.WorkerID}}"}
    report, _ = execute(config_for(allocator, total=24, data=data), cycle="release")
    assert report["statusCodeDistribution"].get("OK", 0) >= 20  # a few may lose a race: ABORTED
    assert set(report["statusCodeDistribution"]) <= {"OK", "Aborted"}
    with grpc.insecure_channel(allocator) as channel:
        listed = allocator_pb2_grpc.AllocatorStub(channel).ListReservations(
            allocator_pb2.ListReservationsRequest(), timeout=5
        )
    assert list(listed.reservations) == []


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param({"call": "nope.Service/Call"}, "no service 'nope.Service'",
                     id="unknown-service"),
        pytest.param({"call": "gpualloc.allocator.v1.Allocator/Nope"}, "has no method 'Nope'",
                     id="unknown-method"),
        pytest.param({"data": {"claimz": []}},
                     "data: not a valid gpualloc.allocator.v1.AllocateRequest",
                     id="data-that-is-not-the-request"),
        pytest.param({"data": {"owner": "{{.Nope}}"}}, "CallData has no field", id="bad-template"),
        pytest.param({"call": "gpualloc.inventory.v1.Inventory/WatchInventory"},
                     "streams; the Python runner calls unary methods only",
                     id="streaming-methods-are-refused"),
    ],
)  # fmt: skip
def test_setup_problems_are_config_errors(
    allocator: str, raw: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        execute(config_for(allocator, **raw))


def test_an_unreachable_host_is_a_config_error() -> None:
    config = config_for("127.0.0.1:1", **{"connect-timeout": "200ms"})
    with pytest.raises(ConfigError, match="cannot connect to 127.0.0.1:1 within 0.2s"):
        execute(config)


def test_the_command_writes_the_report_and_the_plot(allocator: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"call": ALLOCATE, "insecure": True, "host": "unused:1",
                                  "data": {"claims": [claim()]}}))  # fmt: skip
    out, png = tmp_path / "out" / "r.json", tmp_path / "out" / "r.png"
    argv = ["--config", str(config), allocator, "-n", "20", "-c", "2", "-O", "pretty",
            "-o", str(out), "--png", str(png), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["statusCodeDistribution"] == {"OK": 20}
    assert report["options"]["host"] == allocator and report["options"]["concurrency"] == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_exits_2_on_a_bad_config(tmp_path: Path, capsys: Any) -> None:
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"call": ALLOCATE, "host": "h:1", "protoset": "x.bin"}))
    assert main(["--config", str(config)]) == 2
    assert "protoset: the ghz option is not supported" in capsys.readouterr().err


PROTO = "protos/allocator/v1/allocator.proto"


def test_proto_and_import_paths_resolve_the_method_without_reflection(
    allocator: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "r.json"
    argv = ["--call", ALLOCATE, allocator, "--insecure", "-n", "5", "--proto", PROTO,
            "--import-paths", ".", "-O", "json", "-o", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["count"] == 5 and "Unimplemented" not in report["statusCodeDistribution"]
    assert report["options"]["proto"] == PROTO
    assert report["options"]["import-paths"] == ["protos/allocator/v1", ".", "."], "ghz's order"


def test_a_proto_protoc_refuses_exits_2_with_protoc_s_message(
    allocator: str, tmp_path: Path, capsys: Any
) -> None:
    broken = tmp_path / "broken.proto"
    broken.write_text('syntax = "proto3";\nmessage {\n')
    argv = ["--call", ALLOCATE, allocator, "--insecure", "--proto", str(broken)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "proto: protoc cannot compile" in err and "broken.proto" in err


def test_html_report_has_ghz_s_sections(allocator: str, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    argv = ["--call", HEALTH, allocator, "--insecure", "-n", "5", "-O", "html", "-o", str(out),
            "--name", "<health>", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    page = out.read_text()
    assert re.findall(r"<h3>(.*?)</h3>", page) == list(SECTIONS)
    assert re.findall(r"<tr><th>(.*?)</th><td>", page)[:6] == list(SUMMARY_FIELDS)
    assert "<title>ghz - &lt;health&gt;</title>" in page, "the name is escaped"
    assert "<tr><td>OK</td><td>5</td><td>100.00 %</td></tr>" in page


HEALTH = "grpc.health.v1.Health/Check"


def _run_flags(argv: list[str], tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "r.json"
    assert main([*argv, "-O", "json", "-o", str(out), "--no-progress"]) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def test_ghz_flag_only_form_as_in_the_readme(allocator: str, tmp_path: Path) -> None:
    """`ghz --insecure --call grpc.health.v1.Health/Check -n N HOST`: no --config needed."""
    report = _run_flags(
        ["--insecure", "--call", HEALTH, "-n", "30", "-c", "3", allocator], tmp_path
    )
    assert report["statusCodeDistribution"] == {"OK": 30}
    assert (report["options"]["host"], report["options"]["total"]) == (allocator, 30)
    assert report["endReason"] == "normal"


def test_total_without_duration_overrides_the_files_duration(
    allocator: str, tmp_path: Path
) -> None:
    """-n alone stops after n calls even though the file says 30s; -z still wins over -n."""
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"call": HEALTH, "insecure": True, "host": allocator,
                                  "duration": "30s"}))  # fmt: skip
    counted = _run_flags(["--config", str(config), "-n", "12", "-c", "2"], tmp_path)
    assert counted["count"] == 12 and counted["endReason"] == "normal"
    timed = _run_flags(["--config", str(config), "-n", "12", "-z", "300ms"], tmp_path)
    assert timed["endReason"] == "timeout"


def test_data_and_tags_flags_reach_the_report(allocator: str, tmp_path: Path) -> None:
    data = json.dumps({"claims": [claim()]})
    argv = ["--insecure", "--call", ALLOCATE, "-n", "4", "-c", "2", "-d", data,
            "--tags", '{"store": "embedded"}', allocator]  # fmt: skip
    report = _run_flags(argv, tmp_path)
    assert report["statusCodeDistribution"] == {"OK": 4}
    assert report["tags"] == {"store": "embedded"}


def test_the_plot_title_names_the_target_and_the_store() -> None:
    from loadtest.ghzlike.plot import plot_title

    report = {"options": {"call": HEALTH, "host": "10.0.0.5:50051"}, "count": 5, "rps": 2.0,
              "tags": {"store": "redis+cluster"}}  # fmt: skip
    assert plot_title(report) == (
        f"{HEALTH} on 10.0.0.5:50051, store redis+cluster: 5 calls, 2 calls/s"
    )
    untagged = {**report, "tags": None}
    assert "10.0.0.5:50051, store not stated" in plot_title(untagged)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["--insecure", "127.0.0.1:1"], "--call: required without --config", id="no-call"
        ),  # fmt: skip
        pytest.param(
            ["--insecure", "--call", HEALTH], "host: required without --config", id="no-host"
        ),  # fmt: skip
        pytest.param(
            ["--insecure", "--call", HEALTH, "-d", "{", "h:1"], "-d: not JSON", id="data-not-json"
        ),  # fmt: skip
        pytest.param(
            ["--insecure", "--call", HEALTH, "--tags", "[1]", "h:1"],
            "--tags",
            id="tags-not-an-object",
        ),  # fmt: skip
    ],
)
def test_flag_only_mistakes_exit_2(argv: list[str], message: str, capsys: Any) -> None:
    assert main([*argv, "--no-progress"]) == 2
    assert message in capsys.readouterr().err
