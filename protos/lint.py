"""Lint the .proto files under protos/: `buf lint` when installed, plus our own checks.

    python protos/lint.py             both (buf only when `npm ci` installed node_modules/.bin/buf)
    python protos/lint.py --no-buf    the built-in checks only

The built-in checks need nothing but grpcio-tools, so CI without Node still enforces the house
rules. They read protoc's descriptors with source info (comments and line numbers):

- the package is `gpualloc.<name>.v<N>`;
- every service, rpc, message, field, oneof, enum and enum value has a leading comment;
- enum values are prefixed with the enum's UPPER_SNAKE name and the zero value is
  `<ENUM>_UNSPECIFIED`;
- rpc `X` takes `XRequest` and returns `XResponse` of the same package;
- messages and enums are PascalCase, fields lower_snake_case.

Findings print as `file:line:column: message`; the exit status is 1 when there is any.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parent.parent
BUF = ROOT / "node_modules" / ".bin" / "buf"

_PACKAGE_RE = re.compile(r"^gpualloc\.[a-z][a-z0-9_]*\.v[0-9]+$")
_PASCAL_RE = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_SNAKE_RE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
_UPPER_SNAKE_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")

# Field numbers inside descriptor.proto, used to address SourceCodeInfo locations.
_FILE_PACKAGE, _FILE_MESSAGE, _FILE_ENUM, _FILE_SERVICE = 2, 4, 5, 6
_MESSAGE_FIELD, _MESSAGE_NESTED, _MESSAGE_ENUM, _MESSAGE_ONEOF = 2, 3, 4, 8
_ENUM_VALUE = 2
_SERVICE_METHOD = 2

Path_ = tuple[int, ...]


@dataclass(frozen=True, order=True)
class Finding:
    """One lint finding, printed as `file:line:column: message` (1-based)."""

    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"


def upper_snake(name: str) -> str:
    """`PcieRelation` -> `PCIE_RELATION`, `DeviceID` -> `DEVICE_ID`."""
    return _UPPER_SNAKE_BOUNDARY.sub("_", name).upper()


def proto_files(root: Path = ROOT) -> list[Path]:
    """Every .proto under `root`/protos, sorted, relative to `root` (the include path)."""
    return sorted(p.relative_to(root) for p in (root / "protos").rglob("*.proto"))


def well_known_include() -> Path:
    """grpc_tools' bundled google/protobuf/*.proto (struct, timestamp, duration, ...)."""
    spec = importlib.util.find_spec("grpc_tools")
    if spec is None or spec.origin is None:
        raise SystemExit("grpcio-tools is not installed: install the dev extra")
    return Path(spec.origin).resolve().parent / "_proto"


def descriptor_set(files: list[Path], root: Path = ROOT) -> descriptor_pb2.FileDescriptorSet:
    """protoc's descriptors of `files` (relative to `root`), with comments and positions."""
    include = well_known_include()
    with tempfile.TemporaryDirectory(prefix="gpualloc-lint-") as tmp:
        out = Path(tmp) / "descriptors.pb"
        command = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            ".",
            "-I",
            str(include),
            "--include_source_info",
            f"--descriptor_set_out={out}",
            *(str(f) for f in files),
        ]
        result = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise SystemExit(f"protoc failed:\n{result.stderr}")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


class _FileLinter:
    """The built-in checks over one FileDescriptorProto."""

    def __init__(self, file: descriptor_pb2.FileDescriptorProto) -> None:
        self.file = file
        self.locations = {tuple(loc.path): loc for loc in file.source_code_info.location}
        self.findings: list[Finding] = []

    def run(self) -> list[Finding]:
        if not _PACKAGE_RE.match(self.file.package):
            self._add(
                (_FILE_PACKAGE,), f'package "{self.file.package}" is not gpualloc.<name>.v<N>'
            )
        for i, message in enumerate(self.file.message_type):
            self._message(message, (_FILE_MESSAGE, i))
        for i, enum in enumerate(self.file.enum_type):
            self._enum(enum, (_FILE_ENUM, i))
        for i, service in enumerate(self.file.service):
            self._service(service, (_FILE_SERVICE, i))
        return sorted(self.findings)

    def _add(self, path: Path_, message: str) -> None:
        location = self.locations.get(path)
        line, column = (location.span[0] + 1, location.span[1] + 1) if location else (1, 1)
        self.findings.append(Finding(self.file.name, line, column, message))

    def _comment(self, path: Path_, kind: str, name: str) -> None:
        location = self.locations.get(path)
        if location is None or not location.leading_comments.strip():
            self._add(path, f'{kind} "{name}" has no leading comment')

    def _message(self, message: descriptor_pb2.DescriptorProto, path: Path_) -> None:
        if message.options.map_entry:
            return  # the synthetic XxxEntry message of a map<,> field
        self._comment(path, "message", message.name)
        if not _PASCAL_RE.match(message.name):
            self._add(path, f'message "{message.name}" is not PascalCase')
        for i, field in enumerate(message.field):
            field_path = (*path, _MESSAGE_FIELD, i)
            self._comment(field_path, "field", f"{message.name}.{field.name}")
            if not _SNAKE_RE.match(field.name):
                self._add(
                    field_path, f'field "{message.name}.{field.name}" is not lower_snake_case'
                )
        for i, oneof in enumerate(message.oneof_decl):
            if oneof.name.startswith("_"):
                continue  # synthetic oneof of a proto3 `optional` field
            self._comment((*path, _MESSAGE_ONEOF, i), "oneof", f"{message.name}.{oneof.name}")
        for i, nested in enumerate(message.nested_type):
            self._message(nested, (*path, _MESSAGE_NESTED, i))
        for i, enum in enumerate(message.enum_type):
            self._enum(enum, (*path, _MESSAGE_ENUM, i))

    def _enum(self, enum: descriptor_pb2.EnumDescriptorProto, path: Path_) -> None:
        self._comment(path, "enum", enum.name)
        if not _PASCAL_RE.match(enum.name):
            self._add(path, f'enum "{enum.name}" is not PascalCase')
        prefix = upper_snake(enum.name) + "_"
        zero = enum.value[0] if enum.value else None
        if zero is None or zero.number != 0 or zero.name != f"{prefix}UNSPECIFIED":
            self._add(path, f'enum "{enum.name}" must start with {prefix}UNSPECIFIED = 0')
        for i, value in enumerate(enum.value):
            value_path = (*path, _ENUM_VALUE, i)
            self._comment(value_path, "enum value", value.name)
            if not value.name.startswith(prefix):
                self._add(value_path, f'enum value "{value.name}" is not prefixed with {prefix}')

    def _service(self, service: descriptor_pb2.ServiceDescriptorProto, path: Path_) -> None:
        self._comment(path, "service", service.name)
        package = f".{self.file.package}."
        for i, method in enumerate(service.method):
            method_path = (*path, _SERVICE_METHOD, i)
            self._comment(method_path, "rpc", f"{service.name}.{method.name}")
            want_in, want_out = f"{package}{method.name}Request", f"{package}{method.name}Response"
            if method.input_type != want_in:
                self._add(method_path, f'rpc "{method.name}" must take {want_in[1:]}')
            if method.output_type != want_out:
                self._add(method_path, f'rpc "{method.name}" must return {want_out[1:]}')


def builtin_findings(files: list[Path], root: Path = ROOT) -> list[Finding]:
    """Run the built-in checks over `files` (relative to `root`, the include path)."""
    findings: list[Finding] = []
    for file in descriptor_set(files, root).file:
        findings.extend(_FileLinter(file).run())
    return findings


def buf_findings() -> Iterator[str]:
    """`buf lint` output lines (already `file:line:column: message`), or nothing without buf."""
    if not BUF.exists():
        print("buf not installed (run `npm ci` for it); built-in checks only", file=sys.stderr)
        return
    result = subprocess.run(
        [str(BUF), "lint"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    if result.returncode != 0 and not lines:
        lines = [f"buf lint failed with exit status {result.returncode}"]
    yield from lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Lint protos/**/*.proto.")
    parser.add_argument("--no-buf", action="store_true", help="skip buf lint")
    args = parser.parse_args(argv)
    files = proto_files()
    problems = [str(f) for f in builtin_findings(files)]
    if not args.no_buf:
        problems.extend(f"buf: {line}" for line in buf_findings())
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"{len(files)} .proto files lint clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
