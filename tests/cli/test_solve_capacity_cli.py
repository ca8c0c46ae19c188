"""`gpualloc solve --capacity`: how many more copies of the claims (or gangs of them) fit, offline.

The example cluster: two H100 nodes of 8 GPUs in `topology.kubernetes.io/zone=zone-a`, each in
a rack of its own (`gpualloc.dev/rack`), an A100 node of 4 GPUs in the MIG layout, L40S nodes.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from services.allocator.cli.solve import (
    EXIT_ALLOCATED,
    EXIT_INVALID,
    EXIT_UNSATISFIABLE,
)
from tests.cli.examples import CLAIMS, CLUSTER, ROOT, solve_claim


def capacity(
    claim: str, *, node: str | None = None, gang: int | None = None, label: str = ""
) -> tuple[int, dict[str, Any], str]:
    return solve_claim(claim, node=node, gang=gang, gang_label=label, capacity=True)


@pytest.mark.parametrize(
    ("claim", "options", "code", "total", "per_node"),
    [
        pytest.param(
            "one-h100.yaml", {}, EXIT_ALLOCATED, 16, {"h100-node-1": 8, "h100-node-2": 8},
            id="one-h100-everywhere",
        ),
        pytest.param(
            "one-h100.yaml", {"node": "h100-node-2"}, EXIT_ALLOCATED, 8, {"h100-node-2": 8},
            id="one-h100-pinned",
        ),
        pytest.param(
            "eight-h100.yaml", {}, EXIT_ALLOCATED, 2, {"h100-node-1": 1, "h100-node-2": 1},
            id="eight-h100-one-per-node",
        ),
        pytest.param(
            "mig-small-else-medium.yaml", {}, EXIT_ALLOCATED, 28, {"a100-node-1": 28},
            id="mig-slices-fill-the-a100s",
        ),
        pytest.param(
            "sixteen-h100-one-node.yaml", {}, EXIT_UNSATISFIABLE, 0, {},
            id="never-fits",
        ),
        pytest.param(
            "one-h100.yaml", {"gang": 2, "label": "topology.kubernetes.io/zone"},
            EXIT_ALLOCATED, 8, {"h100-node-1": 8, "h100-node-2": 8},
            id="gangs-of-two-in-one-zone",
        ),
        pytest.param(
            "one-h100.yaml", {"gang": 2, "label": "gpualloc.dev/rack"},
            EXIT_UNSATISFIABLE, 0, {"h100-node-1": 8, "h100-node-2": 8},
            id="no-rack-holds-two-nodes",
        ),
    ],
)  # fmt: skip
def test_capacity_counts_copies_per_node(claim, options, code, total, per_node):
    got, report, err = capacity(claim, **options)
    assert got == code, err
    assert report["capacity"]["total"] == total
    assert report["capacity"]["accuracy"] == "exact"
    assert {n["node"]: n["count"] for n in report["capacity"]["nodes"]} == per_node


def test_capacity_groups_copies_by_gpu_model():
    _, report, _ = capacity("one-h100.yaml")
    assert report["capacity"]["models"] == {"NVIDIA H100 80GB HBM3": 16}


def test_capacity_of_a_gang_names_the_gang():
    _, report, _ = capacity("one-h100.yaml", gang=2, label="topology.kubernetes.io/zone")
    assert report["capacity"]["gang"] == {"nodeCount": 2, "label": "topology.kubernetes.io/zone"}


def test_capacity_with_a_bad_gang_is_invalid():
    code, report, err = capacity("one-h100.yaml", gang=0)
    assert code == EXIT_INVALID
    assert report == {}
    assert "--gang" in err


def test_capacity_text_output_from_the_command_line():
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "solve", "--capacity", "-f", CLUSTER[0],
         "-f", CLUSTER[1], "-f", str(CLAIMS / "one-h100.yaml")],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == EXIT_ALLOCATED, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "CAPACITY 16 more copies of the claims fit"
    assert "h100-node-1  8" in lines
