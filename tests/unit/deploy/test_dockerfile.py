"""Dockerfile and .dockerignore: a multi-stage build whose final stage is a pinned slim Python,
runs as uid 10001, starts `gpualloc serve`, and gets exactly the files the wheel build needs.

No Docker engine runs in CI, so the image is checked by reading its recipe.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib
from dataclasses import dataclass

import pytest

from tests.unit.deploy.manifests import ALLOCATOR_PORT, INVENTORY_PORT, ROOT, project_scripts

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def instructions() -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    out = []
    for text in logical:
        keyword, _, args = text.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip()))
    return out


def stages() -> list[list[Instruction]]:
    """Instructions grouped by stage (each FROM starts one); global ARGs before it are dropped."""
    grouped: list[list[Instruction]] = []
    for instruction in instructions():
        if instruction.keyword == "FROM":
            grouped.append([])
        if grouped:
            grouped[-1].append(instruction)
    return grouped


def default_arg(name: str) -> str:
    for instruction in instructions():
        if instruction.keyword == "ARG" and instruction.args.startswith(f"{name}="):
            return instruction.args.split("=", 1)[1]
    raise AssertionError(f"no ARG {name}=… in the Dockerfile")


def only(stage: list[Instruction], keyword: str) -> Instruction:
    (found,) = [i for i in stage if i.keyword == keyword]
    return found


def env_of(stage: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in stage:
        if instruction.keyword == "ENV":
            for pair in shlex.split(instruction.args):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def test_build_has_a_builder_stage_and_a_final_stage() -> None:
    builder, final = stages()
    assert builder[0].args.endswith(" AS builder")
    copies_from_builder = [i.args for i in final if i.keyword == "COPY"]
    assert copies_from_builder == ["--from=builder /opt/venv /opt/venv"]


def test_final_stage_is_a_pinned_python_3_11_slim() -> None:
    final = stages()[-1]
    assert final[0].args == "${PYTHON_IMAGE}"
    image = default_arg("PYTHON_IMAGE")
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-[a-z]+)?", image), image


def test_final_stage_runs_as_uid_10001_without_build_tools() -> None:
    final = stages()[-1]
    assert only(final, "USER").args == "10001:10001"
    runs = " ".join(i.args for i in final if i.keyword == "RUN")
    assert "useradd --uid 10001" in runs
    for tool in ("apt-get", "pip ", "gcc", "build-essential", "curl", "wget"):
        assert tool not in runs, f"the final stage must not install {tool.strip()}"


def test_entrypoint_is_the_gpualloc_cli_and_serves_by_default() -> None:
    final = stages()[-1]
    assert only(final, "ENTRYPOINT").args == '["gpualloc"]'
    assert only(final, "CMD").args == '["serve"]'
    assert "gpualloc" in project_scripts()


def test_environment_listens_on_all_interfaces_and_is_read_only_friendly() -> None:
    env = env_of(stages()[-1])
    assert env["GPUALLOC_LISTEN"] == f"0.0.0.0:{ALLOCATOR_PORT}"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PATH"].startswith("/opt/venv/bin:")
    exposed = only(stages()[-1], "EXPOSE").args.split()
    assert exposed == [str(ALLOCATOR_PORT), str(INVENTORY_PORT)]


def installed_extras() -> set[str]:
    runs = " ".join(i.args for i in stages()[0] if i.keyword == "RUN")
    (extras,) = re.findall(r"gpualloc-\*\.whl\)\[([a-z,-]+)\]", runs)
    return set(extras.split(","))


def test_builder_installs_the_wheel_with_its_extras_under_constraints() -> None:
    runs = " ".join(i.args for i in stages()[0] if i.keyword == "RUN")
    assert "pip wheel --no-deps" in runs
    assert "--constraint constraints.txt" in runs
    # NVML for the node agent; the OTLP exporter the deploy files' OTEL_*_EXPORTER=otlp needs;
    # the kubernetes client the inventory's GPUALLOC_KUBE_WATCH=in-cluster needs; the
    # Prometheus endpoint the manifests' GPUALLOC_METRICS_LISTEN opens
    assert installed_extras() == {"agent", "otlp", "prometheus", "kube"}


def test_every_extra_the_image_installs_is_declared() -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        declared = set(tomllib.load(f)["project"].get("optional-dependencies", {}))
    missing = installed_extras() - declared
    assert not missing, f"pyproject.toml declares no extra {sorted(missing)} (pip would ignore it)"


# --- .dockerignore -----------------------------------------------------------------------------


def ignored(path: str) -> bool:
    """Docker's rule: the last pattern matching the path (or one of its parents) decides."""
    verdict = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for raw in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.removeprefix("!").rstrip("/")
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatch(part, pattern[3:]) for part in parts)
        else:
            hit = any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes)
        if hit:
            verdict = not negate
    return verdict


def copied_sources() -> list[str]:
    sources = []
    for instruction in stages()[0]:
        if instruction.keyword == "COPY" and not instruction.args.startswith("--from"):
            *srcs, _dest = instruction.args.split()
            sources += srcs
    return sources


def test_every_copied_source_is_in_the_build_context() -> None:
    for source in copied_sources():
        assert (ROOT / source).exists(), source
        assert not ignored(source), f".dockerignore excludes {source}, which the build copies"


def test_the_wheel_build_gets_every_package_and_the_readme() -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        pyproject = tomllib.load(f)
    needed = [*pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]]
    needed += [pyproject["project"]["readme"], "pyproject.toml"]
    assert set(needed) <= set(copied_sources())


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(".venv/bin/python", id="virtualenv"),
        pytest.param(".git/HEAD", id="git"),
        pytest.param("tests/conftest.py", id="tests"),
        pytest.param("examples/claims/one-h100.yaml", id="examples"),
        pytest.param("services/__pycache__/cli.cpython-311.pyc", id="bytecode"),
        pytest.param("services/common/.mypy_cache/x.json", id="mypy-cache"),
    ],
)
def test_local_state_stays_out_of_the_build_context(path: str) -> None:
    assert ignored(path)
