"""Generate the committed Python code for every .proto under protos/, or check that it is current.

    python protos/generate.py            regenerate in place
    python protos/generate.py --check    regenerate into a temporary directory and exit 1,
                                         listing the stale files, when the committed code differs

The repository root is the include path, so `protos/common/v1/dra.proto` becomes
`protos/common/v1/dra_pb2.py` and imports read `from protos.common.v1 import dra_pb2` with no
rewriting. Output: `*_pb2.py` and `*_pb2.pyi` (mypy-protobuf) for every file, `*_pb2_grpc.py`
and `*_pb2_grpc.pyi` only for files that define a service, and an `__init__.py` in every
directory, so mypy and pytest see regular packages. The generator is pinned (grpcio-tools and
mypy-protobuf in pyproject's dev extra), so the same sources give byte-identical output.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
_SERVICE_RE = re.compile(r"^\s*service\s+\w+\s*\{", re.MULTILINE)
_DIFF_LINES_SHOWN = 20


def proto_files(proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Every .proto under protos/, sorted, as paths relative to the repository root."""
    return sorted(p.relative_to(ROOT) for p in proto_dir.rglob("*.proto"))


def well_known_include() -> Path:
    """grpc_tools' bundled google/protobuf/*.proto (struct, timestamp, duration, ...)."""
    spec = importlib.util.find_spec("grpc_tools")
    if spec is None or spec.origin is None:
        raise SystemExit("grpcio-tools is not installed: install the dev extra")
    return Path(spec.origin).resolve().parent / "_proto"


def _plugin(name: str) -> str:
    """A protoc plugin from this interpreter's environment (mypy-protobuf installs two)."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: install the dev extra (mypy-protobuf)")
    return found


def protoc_command(out_dir: Path, files: list[Path]) -> list[str]:
    """The grpc_tools.protoc invocation that writes all generated files under out_dir."""
    return [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-I",
        ".",
        "-I",
        str(well_known_include()),
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *(str(f) for f in files),
    ]


def generate(out_dir: Path) -> None:
    """Run protoc into out_dir (which mirrors the repository root), then tidy the result."""
    files = proto_files()
    if not files:
        raise SystemExit("no .proto files under protos/")
    out_dir.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        protoc_command(out_dir, files), cwd=ROOT, capture_output=True, text=True, check=False
    )
    # mypy-protobuf reports each file it writes on stderr; only a non-zero exit is an error.
    if result.returncode != 0:
        raise SystemExit(f"protoc failed:\n{result.stderr}")
    for proto in files:
        if not _SERVICE_RE.search((ROOT / proto).read_text(encoding="utf-8")):
            stem = out_dir / proto.with_suffix("")
            for suffix in ("_pb2_grpc.py", "_pb2_grpc.pyi"):
                Path(f"{stem}{suffix}").unlink(missing_ok=True)
    _ensure_init_files(out_dir / "protos")


def _ensure_init_files(package_root: Path) -> None:
    """An (empty) __init__.py in protos/ and every directory below it that holds code."""
    for directory in [package_root, *sorted(p for p in package_root.rglob("*") if p.is_dir())]:
        if directory.name == "__pycache__":
            continue
        init = directory / "__init__.py"
        if not init.exists():
            init.write_text("", encoding="utf-8")


def generated_files(package_root: Path) -> dict[str, Path]:
    """Generated files and __init__.py files under a protos/ tree, keyed by relative path."""
    found: dict[str, Path] = {}
    for path in sorted(package_root.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        if path.name == "__init__.py" or path.name.endswith(GENERATED_SUFFIXES):
            found[path.relative_to(package_root.parent).as_posix()] = path
    return found


def stale_files(expected_root: Path, actual_root: Path) -> list[tuple[str, str]]:
    """(relative path, what is wrong) for every file that differs between two protos/ trees.

    An __init__.py that the committed tree has and the fresh one lacks is fine (protos/ itself
    may hold hand-written package code); any other extra generated file is stale.
    """
    expected = generated_files(expected_root)
    actual = generated_files(actual_root)
    problems: list[tuple[str, str]] = []
    for name in sorted(expected.keys() | actual.keys()):
        if name not in actual:
            problems.append((name, "missing"))
        elif name not in expected:
            if not name.endswith("__init__.py"):
                problems.append((name, "no longer generated (remove it)"))
        elif name.endswith("__init__.py"):
            continue  # content is ours to choose; existence is what matters
        elif expected[name].read_bytes() != actual[name].read_bytes():
            problems.append((name, _diff_summary(expected[name], actual[name], name)))
    return problems


def _diff_summary(expected: Path, actual: Path, name: str) -> str:
    diff = list(
        difflib.unified_diff(
            actual.read_text(encoding="utf-8").splitlines(),
            expected.read_text(encoding="utf-8").splitlines(),
            fromfile=f"committed/{name}",
            tofile=f"generated/{name}",
            lineterm="",
        )
    )
    added = sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in diff if line.startswith("-") and not line.startswith("---"))
    shown = "\n".join(f"    {line}" for line in diff[:_DIFF_LINES_SHOWN])
    more = (
        f"\n    ... {len(diff) - _DIFF_LINES_SHOWN} more diff lines"
        if len(diff) > _DIFF_LINES_SHOWN
        else ""
    )
    return f"differs (+{added} -{removed} lines)\n{shown}{more}"


def write() -> int:
    """Regenerate in place: write what changed, remove generated files whose .proto is gone."""
    with tempfile.TemporaryDirectory(prefix="gpualloc-protos-") as tmp:
        fresh_root = Path(tmp) / "protos"
        generate(Path(tmp))
        fresh = generated_files(fresh_root)
        committed = generated_files(PROTO_DIR)
        for name, path in fresh.items():
            target = ROOT / name
            if name.endswith("__init__.py") and target.exists():
                continue
            if not target.exists() or target.read_bytes() != path.read_bytes():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
                print(f"wrote {name}")
        for name, path in committed.items():
            if name not in fresh and not name.endswith("__init__.py"):
                path.unlink()
                print(f"removed {name}")
    print(f"generated code for {len(proto_files())} .proto files is up to date")
    return 0


def check() -> int:
    """Regenerate into a temporary directory; 1 (with a report) when protos/ is stale."""
    with tempfile.TemporaryDirectory(prefix="gpualloc-protos-") as tmp:
        generate(Path(tmp))
        problems = stale_files(Path(tmp) / "protos", PROTO_DIR)
    if not problems:
        print(f"generated code is up to date ({len(proto_files())} .proto files)")
        return 0
    print("generated code is stale; run `python protos/generate.py`:", file=sys.stderr)
    for name, what in problems:
        print(f"  {name}: {what}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if committed code is stale")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    if args.check:
        return check()
    return write()


if __name__ == "__main__":
    sys.exit(main())
