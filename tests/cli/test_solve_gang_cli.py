"""`gpualloc solve --gang N [--gang-label LABEL]` on the example cluster.

examples/cluster/nodes.yaml puts the two H100 nodes in `topology.kubernetes.io/zone=zone-a`
and every node in a rack of its own (`gpualloc.dev/rack`).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import yaml

from services.allocator.cli.solve import (
    EXIT_ALLOCATED,
    EXIT_INVALID,
    EXIT_UNSATISFIABLE,
)
from tests.cli.examples import CLAIMS, CLUSTER, ROOT, solve_claim

ZONE = "topology.kubernetes.io/zone"


def solve_gang(
    claim: str, count: int | None, label: str = "", node: str | None = None
) -> tuple[int, dict[str, Any], str]:
    return solve_claim(claim, node=node, gang=count, gang_label=label)


@pytest.mark.parametrize(
    ("claim", "count", "label", "domain", "nodes", "gpus"),
    [
        pytest.param(
            "eight-h100.yaml", 2, ZONE, "zone-a", ["h100-node-1", "h100-node-2"], 8, id="zone-a"
        ),
        pytest.param(
            "one-h100.yaml", 2, "", None, ["h100-node-1", "h100-node-2"], 1, id="without-a-label"
        ),
        pytest.param("one-h100.yaml", 1, ZONE, "zone-a", ["h100-node-1"], 1, id="gang-of-one"),
    ],
)
def test_gang_allocates_every_member(claim, count, label, domain, nodes, gpus):
    code, report, _ = solve_gang(claim, count, label)
    assert code == EXIT_ALLOCATED
    assert report["outcome"] == "allocated"
    gang = report["gang"]
    assert (gang["nodeCount"], gang["label"], gang["domain"]) == (count, label or None, domain)
    assert sorted(m["node"] for m in gang["members"]) == nodes
    for member in gang["members"]:
        [result] = member["claims"]
        devices = result["allocation"]["devices"]["results"]
        assert len(devices) == gpus
        assert {d["pool"] for d in devices} == {member["node"]}
    assert report["explanation"]["summary"].startswith(f"gang of {count} nodes")


@pytest.mark.parametrize(
    ("claim", "count", "label", "summary"),
    [
        pytest.param(
            "eight-h100.yaml",
            2,
            "gpualloc.dev/rack",
            "at most 1 nodes fit the claims in one domain",
            id="one-node-per-rack",
        ),
        pytest.param("one-h100.yaml", 3, ZONE, "at most 2 nodes fit", id="two-h100-nodes"),
        pytest.param(
            "one-h100.yaml", 2, "example.com/no-such-label", "no node with label", id="no-label"
        ),
    ],
)
def test_gang_that_does_not_fit_exits_3_with_the_reason(claim, count, label, summary):
    code, report, _ = solve_gang(claim, count, label)
    assert code == EXIT_UNSATISFIABLE
    assert report["outcome"] == "unsatisfiable"
    assert "members" not in report["gang"]
    assert summary in report["explanation"]["summary"]


@pytest.mark.parametrize(
    ("count", "label", "node", "message"),
    [
        pytest.param(0, ZONE, None, "--gang: must be at least 1", id="no-members"),
        pytest.param(None, ZONE, None, "--gang-label: needs --gang", id="label-without-gang"),
        pytest.param(2, ZONE, "h100-node-1", "--node: cannot be combined", id="pinned-node"),
    ],
)
def test_bad_gang_options_exit_2(count, label, node, message):
    code, _, err = solve_gang("one-h100.yaml", count, label, node)
    assert code == EXIT_INVALID
    assert message in err


def test_gang_text_and_yaml_through_the_console_script():
    args = ["--gang", "2", "--gang-label", ZONE, "-f", CLUSTER[0], "-f", CLUSTER[1]]
    args += ["-f", str(CLAIMS / "eight-h100.yaml")]
    base = [sys.executable, "-m", "services.cli", "solve", *args]
    text = subprocess.run(base, capture_output=True, text=True, cwd=ROOT, check=False)
    assert text.returncode == EXIT_ALLOCATED, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"ALLOCATED gang of 2 nodes in {ZONE}=zone-a"
    assert lines[1].split() == ["NODE", "CLAIM", "REQUEST", "DRIVER", "POOL", "DEVICE"]
    assert sum(line.startswith("h100-node-") for line in lines[2:]) == 16
    as_yaml = subprocess.run(
        [*base, "-o", "yaml"], capture_output=True, text=True, check=False, cwd=ROOT
    )
    report = yaml.safe_load(as_yaml.stdout)
    assert report["gang"]["domain"] == "zone-a" and len(report["gang"]["members"]) == 2
