"""The README keeps its promises: its settings table is the code's, and its tour runs.

The tour's live lines (`.venv/bin/gpualloc get|describe|allocate|explain|capacity|...`) run in
order, as a shell runs them, against a real `gpualloc serve --demo` that
GPUALLOC_ALLOCATOR_ADDR points at (the only thing the test adds: the server's free port); they
run first, on the fresh demo fleet, so the README's `get nodes` sample is what the first line
prints.
Every `grpcurl ... -d '{...}' HOST service/Method` call of the README is sent (as grpcurl would,
JSON through the request type) to a real `gpualloc serve --demo`; every offline `gpualloc
solve|inventory` line is run. grpcurl itself is not installable here, so the JSON-to-message
step uses protobuf's json_format, as grpcurl does with reflection.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pool, json_format, message_factory

import protos.allocator.v1.allocator_pb2
import protos.inventory.v1.inventory_pb2  # noqa: F401 - registers the descriptors
from services.settings_doc import settings_markdown
from tests.integration.test_serve import served  # noqa: F401 - the running server fixture

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
_GRPCURL = re.compile(
    r"grpcurl (?P<flags>[^\n]*?)-d '(?P<body>.*?)'\s+(?P<host>\S+)\s+(?P<method>[\w.]+/\w+)",
    re.DOTALL,
)


def test_settings_section_is_generated_from_the_code():
    begin = README.index("<!-- settings:begin")
    start = README.index("\n", begin) + 1
    end = README.index("<!-- settings:end -->")
    assert README[start:end] == settings_markdown(), "run: python -m services.settings_doc"


def test_readme_shows_the_two_commands():
    assert "make run" in README and "make test" in README


_LIVE_VERBS = "get|describe|allocate|explain|capacity|commit|renew|release"


def _live_lines() -> list[str]:
    pattern = rf"^\.venv/bin/(gpualloc (?:{_LIVE_VERBS}) [^\n]+)$"
    return re.findall(pattern, README, re.MULTILINE)


def test_the_tour_uses_the_live_verbs():
    verbs = {line.split()[1] for line in _live_lines()}
    assert verbs >= {"get", "describe", "allocate", "explain", "capacity", "release"}


def test_the_live_tour_runs_in_order(served, tmp_path):  # noqa: F811
    process, _ = served
    args = list(process.args)
    address = args[args.index("--listen") + 1]
    bin_dir = f"{Path(sys.executable).parent}/"
    keep = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_")}
    env = {**keep, "HOME": str(tmp_path), "GPUALLOC_ALLOCATOR_ADDR": address}
    outputs: dict[str, str] = {}
    for line in _live_lines():
        command = bin_dir + line.replace(".venv/bin/", bin_dir)  # line starts "gpualloc "
        done = subprocess.run(
            ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert "Traceback" not in done.stderr, done.stderr
        assert done.returncode == (3 if "sixteen" in line else 0), f"{line}\n{done.stderr}"
        assert done.stdout, line
        outputs[line.split()[1]] = outputs.get(line.split()[1], "") + done.stdout
    sample = README.split(".venv/bin/gpualloc get nodes\n", 1)[1].split("```text\n", 1)[1]
    assert outputs["get"].startswith(sample.split("```", 1)[0])  # the README's sample, as is
    assert "MIG layout:" in outputs["describe"]
    assert re.search(r"reservation/res-\S+ reserved for tour until", outputs["allocate"])
    assert "8 of 16 devices" in outputs["explain"] and "held: tour holds" in outputs["explain"]
    assert "more copies fit" in outputs["capacity"]
    assert re.search(r"reservation/res-\S+ released", outputs["release"])


def _calls() -> list[tuple[str, str, dict[str, str]]]:
    calls = []
    for match in _GRPCURL.finditer(README):
        headers = dict(h.split(": ", 1) for h in re.findall(r"-H '([^']+)'", match["flags"]))
        calls.append((match["method"], match["body"], headers))
    return calls


def test_the_tour_has_grpcurl_calls():
    assert {m for m, _, _ in _calls()} >= {
        "grpc.health.v1.Health/Check",
        "gpualloc.inventory.v1.Inventory/GetInventory",
        "gpualloc.allocator.v1.Allocator/Allocate",
        "gpualloc.allocator.v1.Allocator/Explain",
    }


@pytest.mark.parametrize(("method", "body", "headers"), _calls(), ids=lambda v: None)
def test_each_grpcurl_call_of_the_tour_works(served, method, body, headers):  # noqa: F811
    _, channel = served
    service, name = method.split("/")
    pool = descriptor_pool.Default()
    if service == "grpc.health.v1.Health":
        from grpc_health.v1 import health_pb2  # noqa: F401 - registers the descriptors
    method_descriptor = pool.FindServiceByName(service).FindMethodByName(name)
    request_type = message_factory.GetMessageClass(method_descriptor.input_type)
    response_type = message_factory.GetMessageClass(method_descriptor.output_type)
    request = json_format.Parse(body, request_type())
    call = channel.unary_unary(
        f"/{method}",
        request_serializer=request_type.SerializeToString,
        response_deserializer=response_type.FromString,
    )
    response = call(request, timeout=10, metadata=tuple(headers.items()))
    answer = json_format.MessageToDict(response)
    if name == "Check":
        assert answer["status"] == "SERVING"
    elif name == "GetInventory":
        assert [n["node"]["name"] for n in answer["inventory"]["nodes"]] == ["l40s-node-1"]
    elif name == "Allocate":
        assert answer["outcome"] == "OUTCOME_ALLOCATED"
        assert answer["reservations"][0]["owner"] == "tour"
    elif name == "Explain":
        assert answer["outcome"] == "OUTCOME_UNSATISFIABLE"
        assert "8 of 16 devices" in " ".join(answer["explanation"]["messages"])


def _cli_lines() -> list[str]:
    return re.findall(r"^\.venv/bin/(gpualloc (?:solve|inventory) [^\n]+)$", README, re.MULTILINE)


@pytest.mark.parametrize("line", _cli_lines())
def test_each_offline_cli_line_of_the_tour_runs(line):
    args = shlex.split(line)[1:]
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    expected = 3 if "sixteen" in line else 0
    assert result.returncode == expected, result.stderr
    assert result.stdout
