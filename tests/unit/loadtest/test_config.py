"""ghz config files: every key the runner supports, every key it refuses, and our own files.

The repository's configs (loadtest/ghz/*.json) are also checked against the generated request
classes, so a renamed proto field breaks this test rather than a load test nobody runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from loadtest.ghzlike.config import (
    MAX_INT32,
    SUPPORTED_KEYS,
    UNSUPPORTED_KEYS,
    ConfigError,
    load_config,
    parse_config,
    parse_go_duration,
)
from loadtest.ghzlike.templates import CallData, TemplateError, has_actions, render
from protos.allocator.v1 import allocator_pb2

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = sorted((ROOT / "loadtest" / "ghz").glob("*.json"))
BASE = {"call": "pkg.Svc/Method", "host": "127.0.0.1:50051"}

# ghz key, JSON value, LoadConfig field, parsed value
SUPPORTED = [
    ("insecure", True, "insecure", True),
    ("cacert", "pki/ca.crt", "cacert", "pki/ca.crt"),
    ("cname", "gpualloc.test", "cname", "gpualloc.test"),
    ("concurrency", 8, "concurrency", 8),
    ("connections", 2, "connections", 2),
    ("total", 1000, "total", 1000),
    ("duration", "1m30s", "duration", 90.0),
    ("max-duration", "250ms", "max_duration", 0.25),
    ("duration-stop", "WAIT", "duration_stop", "wait"),
    ("rps", 200, "rps", 200),
    ("timeout", "2s", "timeout", 2.0),
    ("connect-timeout", "500ms", "connect_timeout", 0.5),
    ("keepalive", "30s", "keepalive", 30.0),
    ("data", {"a": "b"}, "data", {"a": "b"}),
    ("data", [{"a": "1"}, {"a": "2"}], "data", [{"a": "1"}, {"a": "2"}]),
    ("metadata", {"x-gpualloc-owner": "load"}, "metadata", {"x-gpualloc-owner": "load"}),
    ("reflect-metadata", {"auth": "t"}, "reflect_metadata", {"auth": "t"}),
    ("name", "run", "name", "run"),
    ("tags", {"env": "ci"}, "tags", {"env": "ci"}),
    ("skipFirst", 10, "skip_first", 10),
    ("count-errors", True, "count_errors", True),
    ("cpus", 4, "cpus", 4),
    ("format", "pretty", "format", "pretty"),
    ("format", "html", "format", "html"),
    (
        "proto",
        "protos/allocator/v1/allocator.proto",
        "proto",
        "protos/allocator/v1/allocator.proto",
    ),
    ("import-paths", [".", "vendor"], "import_paths", (".", "vendor")),
    ("output", "out/r.json", "output", "out/r.json"),
    ("disable-template-data", True, "disable_template_data", True),
    ("disable-template-functions", True, "disable_template_functions", True),
    ("call", "pkg.Svc.Method", "call", "pkg.Svc.Method"),
    ("host", "10.0.0.1:9", "host", "10.0.0.1:9"),
]


@pytest.mark.parametrize(
    ("key", "value", "field", "parsed"),
    [pytest.param(*row, id=f"{row[0]}-{i}") for i, row in enumerate(SUPPORTED)],
)
def test_every_supported_key_is_read(key: str, value: Any, field: str, parsed: Any) -> None:
    config = parse_config({**BASE, key: value})
    assert getattr(config, field) == parsed


def test_the_table_covers_every_supported_key() -> None:
    together = {"data-file", "metadata-file", "cert", "key"}  # tested on their own below
    covered = {row[0] for row in SUPPORTED} | together
    assert covered == set(SUPPORTED_KEYS)


def test_client_certificate_and_key_are_read_together() -> None:
    config = parse_config({**BASE, "cert": "c/tls.crt", "key": "c/tls.key"})
    assert (config.cert, config.key, config.insecure) == ("c/tls.crt", "c/tls.key", False)


def test_defaults_are_ghz_s() -> None:
    config = parse_config(BASE)
    assert (config.total, config.concurrency, config.connections) == (200, 50, 1)
    assert (config.timeout, config.connect_timeout, config.rps) == (20.0, 10.0, 0)
    assert (config.insecure, config.duration_stop, config.format) == (False, "close", "summary")


def test_files_are_read_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "d.json").write_text('{"from": "file"}')
    (tmp_path / "m.json").write_text('{"k": "v"}')
    monkeypatch.chdir(tmp_path)
    for raw in (
        {**BASE, "data": {"from": "inline"}, "data-file": "d.json", "metadata-file": "m.json"},
        {**BASE, "data-file": "d.json", "data": {"from": "inline"}, "metadata-file": "m.json"},
    ):
        config = parse_config(raw)
        assert config.data == {"from": "file"}, "ghz: data-file wins over data"
        assert config.metadata == {"k": "v"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param({"call": "a.B/C"}, "host: required", id="host-required"),
        pytest.param({"host": "h:1"}, "call: required", id="call-required"),
        pytest.param({**BASE, "concurency": 5}, "concurency: not a ghz config key", id="typo"),
        pytest.param({**BASE, "protoset": "x.bin"}, "protoset: the ghz option is not supported",
                     id="protosets-are-not-read"),
        pytest.param({**BASE, "import-paths": "."}, "import-paths: must be an array of strings",
                     id="import-paths-are-an-array"),
        pytest.param({**BASE, "load-schedule": "step"}, "load-schedule: the ghz option",
                     id="load-schedules-are-not-run"),
        pytest.param({**BASE, "async": True}, "async: the ghz option", id="async"),
        pytest.param({**BASE, "concurrency": 2, "connections": 3},
                     "number of connections cannot be greater than concurrency",
                     id="more-connections-than-workers"),
        pytest.param({**BASE, "duration": "10"}, "duration: '10' is not a Go duration",
                     id="duration-needs-a-unit"),
        pytest.param({**BASE, "total": -1}, "total: must be a non-negative integer",
                     id="negative-total"),
        pytest.param({**BASE, "insecure": "yes"}, "insecure: must be true or false",
                     id="booleans-are-json-booleans"),
        pytest.param({**BASE, "format": "xml"}, "format: must be one of", id="unknown-format"),
        pytest.param({**BASE, "insecure": True, "cacert": "ca.crt"},
                     "insecure: a plaintext run cannot use cacert", id="insecure-with-a-ca"),
        pytest.param({**BASE, "cert": "tls.crt"}, "cert: a client certificate (cert) and its key",
                     id="cert-without-key"),
        pytest.param({**BASE, "key": "tls.key"}, "cert: a client certificate (cert) and its key",
                     id="key-without-cert"),
        pytest.param({**BASE, "skipTLS": True}, "skipTLS: the ghz option is not supported",
                     id="skip-tls-is-not-possible"),
        pytest.param({**BASE, "data": "@"}, "unsupported type for Data", id="stdin-data"),
        pytest.param({**BASE, "data": []}, "data array must not be empty", id="empty-array"),
        pytest.param({**BASE, "data": [1]}, "data array contains unsupported type",
                     id="array-of-non-objects"),
        pytest.param({**BASE, "metadata": {"a": 1}}, "metadata: must be an object of string",
                     id="metadata-values-are-strings"),
        pytest.param({**BASE, "data-file": "/nonexistent/d.json"}, "data-file: cannot read",
                     id="missing-data-file"),
    ],
)  # fmt: skip
def test_bad_configs_are_refused_naming_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match="^<config>: .*") as caught:
        parse_config(raw)
    assert message in str(caught.value)


@pytest.mark.parametrize("key", [pytest.param(k, id=k) for k in UNSUPPORTED_KEYS])
def test_unsupported_ghz_keys_set_to_ghz_s_default_are_accepted(key: str) -> None:
    default = UNSUPPORTED_KEYS[key][0]
    assert parse_config({**BASE, key: default}).call == BASE["call"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("0", 0.0, id="zero"),
        pytest.param("10s", 10.0, id="seconds"),
        pytest.param("1.5h", 5400.0, id="fractional-hours"),
        pytest.param("1m30s", 90.0, id="compound"),
        pytest.param("250ms", 0.25, id="milliseconds"),
        pytest.param("100us", 1e-4, id="microseconds"),
        pytest.param("5ns", 5e-9, id="nanoseconds"),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text, "d") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "10", "1x", "1s2", 5])
def test_bad_go_durations(text: Any) -> None:
    with pytest.raises(ConfigError, match="^d: "):
        parse_go_duration(text, "d")


@pytest.mark.parametrize(
    ("raw", "calls", "stop_after"),
    [
        pytest.param({"total": 10}, 10, 0.0, id="total-only"),
        pytest.param({"total": 10, "duration": "5s"}, MAX_INT32, 5.0, id="duration-ignores-total"),
        pytest.param({"total": 10, "max-duration": "5s"}, 10, 5.0, id="max-duration-keeps-total"),
    ],
)
def test_total_and_durations_combine_as_in_ghz(
    raw: dict[str, Any], calls: int, stop_after: float
) -> None:
    config = parse_config({**BASE, **raw})
    assert (config.total_calls, config.stop_after) == (calls, stop_after)


def test_overrides_are_checked_like_the_file() -> None:
    config = parse_config({**BASE, "concurrency": 4})
    assert config.with_overrides(concurrency=8, rps=None).concurrency == 8
    with pytest.raises(ConfigError, match="connections"):
        config.with_overrides(connections=5)


# --- the repository's config files -----------------------------------------------------------

REQUESTS: dict[str, type[Message]] = {
    "grpc.health.v1.Health/Check": health_pb2.HealthCheckRequest,
    "gpualloc.allocator.v1.Allocator/Allocate": allocator_pb2.AllocateRequest,
    "gpualloc.allocator.v1.Allocator/AllocateBatch": allocator_pb2.AllocateBatchRequest,
    "gpualloc.allocator.v1.Allocator/Explain": allocator_pb2.ExplainRequest,
}


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in CONFIGS])
def test_our_configs_are_ghz_configs_using_reflection(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # data-file paths are relative to the repository root, as for ghz
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert not {"proto", "protoset", "import-paths"} & set(raw), "server reflection only"
    config = load_config(path)
    assert config.insecure and config.host == "127.0.0.1:50051"
    request_class = REQUESTS[config.call]
    for item in config.data if isinstance(config.data, list) else [config.data]:
        text = json.dumps(item)
        if has_actions(text):
            text = render(text, CallData("g0c0", 0, config.call, "M", "S", "In", "Out"))
        json_format.Parse(text, request_class())


def test_the_configs_cover_allocate_reserve_explain_and_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(ROOT)
    by_name = {p.stem: load_config(p) for p in CONFIGS}
    assert {"allocate", "allocate-reserve", "explain", "health"} <= set(by_name)
    reserve = by_name["allocate-reserve"].data
    assert reserve["reserve"] is True and reserve["leaseTtl"].endswith("s")


# --- templates ----------------------------------------------------------------------------------

CALL = CallData("g3c1", 42, "gpualloc.allocator.v1.Allocator.Allocate", "Allocate", "Allocator",
                "AllocateRequest", "AllocateResponse")  # fmt: skip


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        pytest.param("{{.WorkerID}}/{{ .RequestNumber }}", "g3c1/42", id="fields"),
        pytest.param("{{.MethodName}} {{.ServiceName}} {{.InputName}}",
                     "Allocate Allocator AllocateRequest", id="method-names"),
        pytest.param("{{.IsClientStreaming}}", "false", id="booleans-as-go-prints-them"),
        pytest.param("no actions", "no actions", id="plain-text"),
    ],
)  # fmt: skip
def test_templates_render_call_data(template: str, expected: str) -> None:
    assert render(template, CALL) == expected


@pytest.mark.parametrize(
    ("template", "length"),
    [
        pytest.param("{{.UUID}}", 36, id="uuid-field"),
        pytest.param("{{newUUID}}", 36, id="new-uuid"),
        pytest.param("{{randomString 8}}", 8, id="random-string"),
        pytest.param("{{.TimestampUnixNano}}", 19, id="timestamp-ns"),
    ],
)
def test_generated_values_have_their_shape(template: str, length: int) -> None:
    assert len(render(template, CALL)) == length


def test_random_int_stays_below_its_maximum() -> None:
    assert {int(render("{{randomInt 1 3}}", CALL)) for _ in range(50)} <= {1, 2}


@pytest.mark.parametrize(
    ("template", "functions"),
    [
        pytest.param("{{.Nope}}", True, id="unknown-field"),
        pytest.param("{{upper .WorkerID}}", True, id="sprig-functions"),
        pytest.param("{{newUUID}}", False, id="functions-disabled"),
    ],
)
def test_unsupported_template_actions_are_errors(template: str, functions: bool) -> None:
    with pytest.raises(TemplateError, match=r"\{\{"):
        render(template, CALL, functions=functions)
