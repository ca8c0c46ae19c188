"""docs/upgrade.md, docs/compatibility.md and docs/capacity-planning.md claim only what is so:
every test they cite exists, every version in the compatibility table is the one the code, the
test data and (when installed) the binaries of the suite have, every figure of the capacity plan
is one docs/performance.md measured, and the manifests they describe say what they say."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common.dra.parse import RESOURCE_API_VERSIONS
from services.inventory.adapters.sources.kube_slices import VERSIONS
from services.inventory.core.view import PCI_BUS_ID_ATTRIBUTES

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
UPGRADE = (DOCS / "upgrade.md").read_text()
COMPATIBILITY = (DOCS / "compatibility.md").read_text()
CAPACITY = (DOCS / "capacity-planning.md").read_text()
PERFORMANCE = (DOCS / "performance.md").read_text()


def _cited_tests(text: str) -> list[tuple[str, str | None]]:
    """(file, test name or None) for `tests/x.py`, `tests/x.py::name` and a following `::name`."""
    cited: list[tuple[str, str | None]] = []
    last = ""
    for match in re.finditer(r"`(tests/[\w/]+\.py)?(?:::(\w+))?`", text):
        path, name = match.groups()
        if path is None and name is None:
            continue
        last = path or last
        cited.append((last, name))
    return cited


CITED = sorted(set(_cited_tests(UPGRADE) + _cited_tests(COMPATIBILITY)), key=str)


@pytest.mark.parametrize(("path", "name"), CITED, ids=[f"{p}::{n or ''}" for p, n in CITED])
def test_every_cited_test_exists(path: str, name: str | None) -> None:
    source = (ROOT / path).read_text()
    if name is not None:
        assert re.search(rf"^def {name}\(", source, re.MULTILINE), f"{path} has no {name}"


def test_the_upgrade_guide_cites_tests() -> None:
    assert len(_cited_tests(UPGRADE)) >= 15


# --- the capacity plan quotes performance.md --------------------------------------------------

QUOTED = [
    "312,400 devices",
    "1.3 GiB resident",
    "8-107 KiB",
    "0.15 / 0.36",
    "~0.5 ms",
    "~1.3 ms",
    "~0.2 ms",
    "1,990",
    "791",
    "1,644",
    "4,891",
    "~12 ms of server CPU per second at 1,000 nodes, ~1%",
    "0.5 s / 4.9 s / 46 s",
    "0.5-0.7 s at 10,000 GPUs",
    "8.6 s when every free MIG",
    "596 MiB after ingest, 1.17 GiB peak",
    "19.3 s",
    "Server CPU is ~1.4 ms per update",
    "tops out near 720",
    "4.4 s, 21 parts",
    "248.5",
    "287.0",
]


@pytest.mark.parametrize("figure", QUOTED)
def test_each_capacity_figure_is_a_measured_one(figure: str) -> None:
    assert figure in CAPACITY, f"capacity-planning.md no longer quotes {figure!r}"
    assert figure in PERFORMANCE, f"performance.md does not say {figure!r}"


def test_the_capacity_plan_quotes_only_listed_figures() -> None:
    """A number with a unit in the plan is one quoted above, or on a line marked derived."""
    for line in CAPACITY.splitlines():
        for number in re.findall(r"(\d[\d,.]*)(?: ?(?:ms|s|MiB|GiB|KiB|RPS))\b", line):
            listed = any(number in figure for figure in QUOTED) or number == "30"  # --interval
            assert listed or "derived" in line, f"{number!r} in {line!r}"


def _manifest(path: str, kind: str) -> dict[str, Any]:
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all((ROOT / path).read_text()) if d]
    return next(d for d in docs if d["kind"] == kind)


def _memory_limit(path: str) -> str:
    text = (ROOT / path).read_text()
    return str(re.findall(r"limits:\s*\n(?:\s+cpu: .*\n)?\s+memory: (\S+)", text)[0])


def test_the_manifests_say_what_the_docs_say() -> None:
    allocator = _manifest("deploy/k8s/base/allocator.yaml", "Deployment")["spec"]["strategy"]
    assert allocator == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    inventory = _manifest("deploy/k8s/base/inventory.yaml", "Deployment")["spec"]["strategy"]
    assert inventory == {"type": "Recreate"}
    assert _memory_limit("deploy/k8s/base/allocator.yaml") == "1Gi"
    assert _memory_limit("deploy/k8s/overlays/production/allocator.yaml") == "2Gi"
    assert _memory_limit("deploy/k8s/base/inventory.yaml") == "1Gi"
    assert _memory_limit("deploy/k8s/overlays/production/inventory.yaml") == "4Gi"
    agent = (ROOT / "services" / "inventory" / "cli" / "agent.py").read_text()
    assert '"--interval", type=float, default=30.0' in agent


# --- the compatibility table ------------------------------------------------------------------


def test_kubernetes_api_versions_are_the_decoders() -> None:
    assert RESOURCE_API_VERSIONS == ("resource.k8s.io/v1", "resource.k8s.io/v1beta2")
    assert VERSIONS == ("v1", "v1beta2")
    assert "`resource.k8s.io/v1` (Kubernetes 1.34); `v1beta2`" in COMPATIBILITY
    assert "`v1beta1` (converted to the v1 shape)" in COMPATIBILITY
    assert (
        "`k8s.io/dynamic-resource-allocation` v0.34.9"
        in (DOCS / "dra-compatibility.md").read_text()
    )
    assert 'KUBERNETES_VERSION = "1.34"' in (ROOT / "tests/unit/deploy/manifests.py").read_text()


def test_pinned_packages_are_the_ones_named() -> None:
    constraints = (ROOT / "constraints.txt").read_text()
    assert "kubernetes==37.0.2" in constraints and "`kubernetes` 37.0.2" in COMPATIBILITY
    assert "kubernetes-validate==1.37.0" in constraints
    assert 'requires-python = ">=3.11"' in (ROOT / "pyproject.toml").read_text()


def test_nvidia_driver_samples_are_the_versions_named() -> None:
    t4 = (ROOT / "tests/data/resourceslices/openshift-v1.35_2x-tesla-t4_condensed.yaml").read_text()
    assert "driverVersion: {version: 580.126.20}" in t4 and "driver 580.126.20" in COMPATIBILITY
    example = (ROOT / "examples/cluster/h100-node-1.yaml").read_text()
    assert "driverVersion: {version: 580.95.5}" in example and "driver 580.95.5" in COMPATIBILITY
    assert "pcieBusID" in PCI_BUS_ID_ATTRIBUTES
    xml = sorted(p.name for p in (ROOT / "tests/data/nvidia-smi-xml").glob("*.xml"))
    assert [re.findall(r"drv(\d+)", n) for n in xml] == [["590"], ["510"], ["515"]]


def test_bridge_versions_are_the_samples_and_the_code() -> None:
    kueue = ROOT / "tests/data/kueue"
    versions = {
        line.split()[1]
        for p in kueue.glob("*.yaml")
        for line in p.read_text().splitlines()
        if line.startswith("apiVersion: kueue")
    }
    assert versions == {"kueue.x-k8s.io/v1beta2"}
    assert "kueue.x-k8s.io/v1beta2" in (ROOT / "services/bridges/kueue/objects.py").read_text()
    assert "ff69552e" in (kueue / "PROVENANCE.md").read_text() and "ff69552e" in COMPATIBILITY
    slurm = (ROOT / "tests/data/slurm/PROVENANCE.md").read_text()
    assert "284c3b95" in slurm and "284c3b95" in COMPATIBILITY


def _version_of(command: list[str]) -> str:
    if shutil.which(command[0]) is None:
        pytest.skip(f"{command[0]} is not installed")
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def test_the_slurm_the_suite_runs_is_the_one_named() -> None:
    found = re.search(r"slurm(?:-wlm)? (\d+\.\d+\.\d+)", _version_of(["slurmctld", "-V"]))
    assert found is not None and f"| Slurm | {found[1]} " in COMPATIBILITY


def test_the_redis_the_suite_runs_is_the_one_named() -> None:
    found = re.search(r"v=(\d+\.\d+\.\d+)", _version_of(["redis-server", "--version"]))
    assert found is not None and f"the suite runs {found[1]}" in COMPATIBILITY
    assert int(found[1].split(".")[0]) >= 7  # Functions
