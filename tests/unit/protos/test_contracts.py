"""The API contract: naming rules, service names, docs examples, generated code and proto lint."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor, descriptor_pool, json_format, message_factory

from protos import generate, lint

ROOT = Path(__file__).resolve().parents[3]
API_DOC = ROOT / "docs" / "api.md"
SERVICES = {
    "gpualloc.inventory.v1.Inventory": [
        "ApplyResourceSlices",
        "DeleteResourceSlices",
        "ReportNode",
        "GetInventory",
        "WatchInventory",
    ],
    "gpualloc.allocator.v1.Allocator": [
        "Allocate",
        "AllocateBatch",
        "AllocateStream",
        "Explain",
        "Reserve",
        "Commit",
        "Release",
        "Renew",
        "GetReservation",
        "ListReservations",
        "Capacity",
        "QuotaStatus",
        "WatchReservations",
        "ReportDeviceConditions",
    ],
}
_GRPCURL_RE = re.compile(
    r"grpcurl -plaintext -d '(?P<body>.*?)' 127\.0\.0\.1:50051 (?P<service>[\w.]+)/(?P<rpc>\w+)",
    re.DOTALL,
)


def generated_modules() -> list[ModuleType]:
    paths = sorted((ROOT / "protos").rglob("*_pb2.py"))
    names = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in paths]
    return [importlib.import_module(name) for name in names]


def all_enums(module: ModuleType) -> Iterator[descriptor.EnumDescriptor]:
    file: descriptor.FileDescriptor = module.DESCRIPTOR
    yield from file.enum_types_by_name.values()
    pending = list(file.message_types_by_name.values())
    while pending:
        message = pending.pop()
        yield from message.enum_types
        pending.extend(message.nested_types)


def test_every_generated_module_is_found() -> None:
    names = {m.__name__ for m in generated_modules()}
    assert names == {
        "protos.allocator.v1.allocator_pb2",
        "protos.common.v1.dra_pb2",
        "protos.common.v1.topology_pb2",
        "protos.inventory.v1.inventory_pb2",
    }


def test_every_enum_starts_with_unspecified_zero() -> None:
    enums = [enum for module in generated_modules() for enum in all_enums(module)]
    assert len(enums) > 10
    for enum in enums:
        first = enum.values[0]
        prefix = lint.upper_snake(enum.name)
        assert (first.name, first.number) == (f"{prefix}_UNSPECIFIED", 0), enum.full_name
        assert all(v.name.startswith(f"{prefix}_") for v in enum.values), enum.full_name


def test_services_have_the_documented_names_and_rpcs() -> None:
    services = {
        service.full_name: [method.name for method in service.methods]
        for module in generated_modules()
        for service in module.DESCRIPTOR.services_by_name.values()
    }
    assert services == SERVICES


@pytest.mark.parametrize("service", SERVICES)
def test_each_rpc_takes_its_own_request_and_response(service: str) -> None:
    generated_modules()
    for method in descriptor_pool.Default().FindServiceByName(service).methods:
        assert method.input_type.name == f"{method.name}Request"
        assert method.output_type.name == f"{method.name}Response"
    streaming = {
        m.name
        for m in descriptor_pool.Default().FindServiceByName(service).methods
        if m.server_streaming or m.client_streaming
    }
    assert streaming == (
        {"WatchInventory"}
        if service.endswith("Inventory")
        else {"AllocateStream", "WatchReservations"}
    )


def _doc_examples() -> list[re.Match[str]]:
    return list(_GRPCURL_RE.finditer(API_DOC.read_text(encoding="utf-8")))


def test_docs_have_one_grpcurl_example_per_rpc() -> None:
    documented = sorted((m["service"], m["rpc"]) for m in _doc_examples())
    expected = sorted((service, rpc) for service, rpcs in SERVICES.items() for rpc in rpcs)
    assert documented == expected


@pytest.mark.parametrize("example", _doc_examples(), ids=lambda m: m["rpc"])
def test_docs_examples_parse_as_their_request(example: re.Match[str]) -> None:
    generated_modules()
    method = descriptor_pool.Default().FindMethodByName(f"{example['service']}.{example['rpc']}")
    request = message_factory.GetMessageClass(method.input_type)()
    json_format.Parse(example["body"], request)  # raises on any unknown field or bad value


def test_generated_code_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert generate.check() == 0, capsys.readouterr().err


def test_protos_lint_clean() -> None:
    assert lint.builtin_findings(lint.proto_files()) == []


BAD_PROTO = """\
syntax = "proto3";

package acme.widgets;

// Widgets.
service Widgets {
  // Spins.
  rpc Spin(Widget) returns (SpinResponse);
  rpc Stop(StopRequest) returns (StopResponse);
}

// A widget.
message Widget {
  string Name = 1;
}

// Spun.
message SpinResponse {
  // The colour.
  Colour colour = 1;
}

// Stop.
message StopRequest {
  // Why.
  string reason = 1;
}

// Stopped.
message StopResponse {
  // When.
  int64 at = 1;
}

// Colours.
enum Colour {
  // Red.
  RED = 0;
  // Blue.
  COLOUR_BLUE = 1;
}
"""


def test_lint_reports_each_rule_with_file_and_line(tmp_path: Path) -> None:
    proto = tmp_path / "protos" / "bad" / "v1" / "bad.proto"
    proto.parent.mkdir(parents=True)
    proto.write_text(BAD_PROTO, encoding="utf-8")
    findings = [str(f) for f in lint.builtin_findings(lint.proto_files(tmp_path), tmp_path)]
    name = "protos/bad/v1/bad.proto"
    assert findings == [
        f'{name}:3:1: package "acme.widgets" is not gpualloc.<name>.v<N>',
        f'{name}:8:3: rpc "Spin" must take acme.widgets.SpinRequest',
        f'{name}:9:3: rpc "Widgets.Stop" has no leading comment',
        f'{name}:14:3: field "Widget.Name" has no leading comment',
        f'{name}:14:3: field "Widget.Name" is not lower_snake_case',
        f'{name}:36:1: enum "Colour" must start with COLOUR_UNSPECIFIED = 0',
        f'{name}:38:3: enum value "RED" is not prefixed with COLOUR_',
    ]


def test_stale_files_lists_missing_changed_and_leftover_files(tmp_path: Path) -> None:
    fresh, committed = tmp_path / "fresh" / "protos", tmp_path / "committed" / "protos"
    for root in (fresh, committed):
        (root / "a" / "v1").mkdir(parents=True)
        (root / "__init__.py").write_text("")
        (root / "a" / "v1" / "same_pb2.py").write_text("x = 1\n")
    (fresh / "a" / "v1" / "new_pb2.pyi").write_text("y: int\n")
    (fresh / "a" / "v1" / "changed_pb2.py").write_text("z = 2\n")
    (committed / "a" / "v1" / "changed_pb2.py").write_text("z = 1\n")
    (committed / "a" / "v1" / "old_pb2_grpc.py").write_text("")
    (committed / "a" / "v1" / "hand_written.py").write_text("")  # not generated: ignored
    problems = dict(generate.stale_files(fresh, committed))
    assert sorted(problems) == [
        "protos/a/v1/changed_pb2.py",
        "protos/a/v1/new_pb2.pyi",
        "protos/a/v1/old_pb2_grpc.py",
    ]
    assert problems["protos/a/v1/new_pb2.pyi"] == "missing"
    assert problems["protos/a/v1/changed_pb2.py"].startswith("differs (+1 -1 lines)")
    assert "no longer generated" in problems["protos/a/v1/old_pb2_grpc.py"]
