"""`gpualloc solve` end to end on the example cluster: outcomes, exit codes, output formats."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.allocator.cli.solve import (
    EXIT_ALLOCATED,
    EXIT_INVALID,
    EXIT_UNSATISFIABLE,
    run_solve,
)
from services.allocator.core import Policy
from tests.fabric import fabric_manifest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = [str(ROOT / "examples" / "cluster"), str(ROOT / "examples" / "deviceclasses.yaml")]
CLAIMS = ROOT / "examples" / "claims"


def solve_json(
    *extra: str, node: str | None = None, stdin: str = ""
) -> tuple[int, dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_solve(
        [*CLUSTER, *extra],
        node=node,
        output="json",
        stdout=out,
        stderr=err,
        stdin=io.StringIO(stdin),
    )
    return code, json.loads(out.getvalue()) if out.getvalue() else {}, err.getvalue()


@pytest.mark.parametrize(
    ("claim", "node", "count"),
    [
        pytest.param("one-h100.yaml", "h100-node-1", 1, id="one-h100-binpacks-on-first-h100-node"),
        pytest.param("eight-h100.yaml", "h100-node-1", 8, id="eight-h100-whole-node"),
        pytest.param("all-l40s.yaml", "l40s-node-1", 4, id="all-mode-takes-every-l40s"),
        pytest.param("mig-small-else-medium.yaml", "a100-node-1", 1, id="mig-first-available"),
        pytest.param(
            # a100-node-1 and l40s-node-1 both keep 2 GPU-equivalents: the name breaks the tie
            "two-gpus-same-pcie-root.yaml",
            "a100-node-1",
            2,
            id="match-attribute-pcie-root",
        ),
    ],
)
def test_example_claims_allocate(claim, node, count):
    code, report, _ = solve_json(str(CLAIMS / claim))
    assert code == EXIT_ALLOCATED
    assert report["outcome"] == "allocated"
    assert report["node"] == node
    [result] = report["claims"]
    devices = result["allocation"]["devices"]["results"]
    assert len(devices) == count
    assert len({d["device"] for d in devices}) == count  # never the same device twice
    assert all(d["pool"] == node for d in devices)


def test_first_available_names_the_subrequest_in_the_result():
    _, report, _ = solve_json(str(CLAIMS / "mig-small-else-medium.yaml"))
    [result] = report["claims"][0]["allocation"]["devices"]["results"]
    assert result["request"] == "mig/small"
    assert "mig-1g5gb" in result["device"]


def test_match_attribute_keeps_devices_on_one_pcie_root():
    _, report, _ = solve_json(str(CLAIMS / "two-gpus-same-pcie-root.yaml"))
    devices = {d["device"] for d in report["claims"][0]["allocation"]["devices"]["results"]}
    slice_doc = yaml.safe_load((ROOT / "examples" / "cluster" / "l40s-node.yaml").read_text())
    roots = {
        d["name"]: d["attributes"]["resource.kubernetes.io/pcieRoot"]["string"]
        for d in slice_doc["spec"]["devices"]
    }
    assert len({roots[d] for d in devices}) == 1


def test_unsatisfiable_claim_exits_3_and_explains_the_closest_node():
    code, report, _ = solve_json(str(CLAIMS / "sixteen-h100-one-node.yaml"))
    assert code == EXIT_UNSATISFIABLE
    assert report["outcome"] == "unsatisfiable"
    assert report["claims"] == []
    assert "8 of 16 devices" in report["explanation"]["summary"]


def test_claims_with_an_allocation_hold_their_devices():
    held = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "held", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "allocationMode": "ExactCount",
                            "count": 8,
                        },
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpus",
                            "driver": "gpu.nvidia.com",
                            "pool": "h100-node-1",
                            "device": f"gpu-{i}",
                        }
                        for i in range(8)
                    ]
                }
            }
        },
    }
    code, report, _ = solve_json("-", str(CLAIMS / "one-h100.yaml"), stdin=yaml.safe_dump(held))
    assert code == EXIT_ALLOCATED
    assert report["node"] == "h100-node-2"


def test_pinned_node_without_a_fit_is_unsatisfiable():
    code, report, _ = solve_json(str(CLAIMS / "one-h100.yaml"), node="l40s-node-1")
    assert code == EXIT_UNSATISFIABLE
    assert report["explanation"]["nodes"][0]["node"] == "l40s-node-1"


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        pytest.param(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: bad}\n"
            "spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, "
            "selectors: [{cel: {expression: 'device.driver =='}}]}}]}}\n",
            "CEL",
            id="cel-syntax-error",
        ),
        pytest.param(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: bad}\n"
            "spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: nope}}]}}\n",
            "nope",
            id="unknown-device-class",
        ),
        pytest.param(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: bad}\n"
            "spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, "
            "count: -1}}]}}\n",
            "spec.devices.requests[0].exactly.count",
            id="negative-count-field-path",
        ),
        pytest.param("kind: [", "<stdin>", id="malformed-yaml-names-stdin"),
    ],
)
def test_invalid_input_exits_2_with_the_reason_on_stderr(stdin, message):
    code, report, err = solve_json("-", stdin=stdin)
    assert code == EXIT_INVALID
    assert report == {}
    assert message in err


def test_text_and_yaml_outputs_through_the_console_script():
    args = [
        sys.executable,
        "-m",
        "services.cli",
        "solve",
        "-f",
        CLUSTER[0],
        "-f",
        CLUSTER[1],
        "-f",
        str(CLAIMS / "eight-h100.yaml"),
    ]
    text = subprocess.run(args, capture_output=True, text=True, check=False, cwd=ROOT)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("ALLOCATED on node h100-node-1")
    as_yaml = subprocess.run(
        [*args, "-o", "yaml"], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert yaml.safe_load(as_yaml.stdout)["outcome"] == "allocated"


# --- topology: NodeTopology files and the claim annotation ------------------------------------

TOPOLOGY = str(ROOT / "examples" / "topology")


def test_topology_constraint_from_the_annotation_with_topology_files():
    code, report, _ = solve_json(TOPOLOGY, str(CLAIMS / "four-nvlink-gpus.yaml"))
    assert code == EXIT_ALLOCATED
    assert report["node"] == "h100-node-1"
    devices = [r["device"] for r in report["claims"][0]["allocation"]["devices"]["results"]]
    assert devices == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]  # one NUMA node, as preferred
    assert (report["score"]["nvlinks"], report["score"]["numaNodes"]) == (6 * 18, 1)
    assert report["score"]["preferredMissed"] == 0


def test_topology_constraint_without_topology_is_unsatisfiable():
    code, report, _ = solve_json(str(CLAIMS / "four-nvlink-gpus.yaml"))
    assert code == EXIT_UNSATISFIABLE
    assert any("topology is not known" in line for line in report["explanation"]["lines"])


def test_topology_explains_the_partial_mesh(tmp_path):
    pinned = solve_json(TOPOLOGY, str(CLAIMS / "four-nvlink-gpus.yaml"), node="a100-node-1")
    code, report, _ = pinned
    assert code == EXIT_UNSATISFIABLE
    text = "\n".join(report["explanation"]["lines"])
    assert "largest free NVLink-connected set is 2" in text


@pytest.mark.parametrize(
    ("files", "message"),
    [
        pytest.param(
            {"bad.yaml": "apiVersion: gpualloc.io/v1alpha1\nkind: NodeTopology\nmetadata: {}\n"},
            "metadata.name",
            id="topology-without-node-name",
        ),
        pytest.param(
            {
                "shape.yaml": "apiVersion: gpualloc.io/v1alpha1\nkind: NodeTopology\n"
                "metadata:\n  name: n1\nspec:\n  gpus: 3\n"
            },
            'shape.yaml:6: document 1 (NodeTopology "n1"): spec.gpus: must be a list',
            id="topology-error-names-file-line-and-object",
        ),
        pytest.param(
            {
                "mixed.yaml": "apiVersion: gpualloc.io/v1alpha1\nkind: NodeTopology\n"
                "metadata: {name: n}\nspec: {}\n---\napiVersion: v1\nkind: Node\n"
                "metadata: {name: n}\n"
            },
            "keep NodeTopology objects in files of their own",
            id="topology-mixed-with-kubernetes-objects",
        ),
        pytest.param(
            {
                "claim.yaml": "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\n"
                "metadata:\n  name: c\n  annotations:\n"
                '    gpualloc.io/topology-constraints: \'[{"kind": "Nope"}]\'\n'
                "spec:\n  devices:\n    requests:\n    - name: g\n      exactly:\n"
                "        deviceClassName: gpu.nvidia.com\n"
            },
            'claim.yaml:6: document 1 (ResourceClaim "c"): '
            'metadata.annotations["gpualloc.io/topology-constraints"][0].kind',
            id="bad-annotation",
        ),
    ],
)
def test_bad_topology_input_exits_2(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    code, _, err = solve_json(*(str(tmp_path / n) for n in files))
    assert code == EXIT_INVALID
    assert message in err


@pytest.mark.parametrize(
    ("policy", "node"),
    [
        pytest.param(Policy.BINPACK, "a100-node-1", id="binpack-ties-break-by-name"),
        pytest.param(
            Policy.FRAGMENTATION_AWARE, "l40s-node-1", id="fragmentation-aware-spares-mig"
        ),
    ],
)
def test_policy_decides_where_whole_gpus_go(policy, node):
    out = io.StringIO()
    code = run_solve(
        [*CLUSTER, str(CLAIMS / "two-gpus-same-pcie-root.yaml")],
        policy=policy,
        output="json",
        stdout=out,
        stderr=io.StringIO(),
    )
    report = json.loads(out.getvalue())
    assert code == EXIT_ALLOCATED and report["node"] == node
    assert report["score"]["freeCapacity"] == 2


# --- device binding conditions -----------------------------------------------------------------

FABRIC = (
    fabric_manifest()
    + """\
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: fabric-gpu}
spec: {selectors: [{cel: {expression: 'device.driver == "gpu.nvidia.com"'}}]}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: composed}
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: fabric-gpu}}]}}
"""
)


def solve_fabric(output: str, *, emit: str = "report", binding: bool = True) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_solve(
        ["-"],
        output=output,
        emit=emit,
        stdout=out,
        stderr=err,
        stdin=io.StringIO(FABRIC),
        binding_conditions=binding,
    )
    return code, out.getvalue() or err.getvalue()


def test_binding_conditions_show_in_the_table_and_the_emitted_claims():
    code, text = solve_fabric("text")
    assert code == EXIT_ALLOCATED, text
    assert "BINDING" in text.splitlines()[2]
    assert "until dra.example.com/attached unless dra.example.com/attach-failed" in text
    code, emitted = solve_fabric("yaml", emit="claims")
    [claim] = yaml.safe_load(emitted)["items"]
    allocation = claim["status"]["allocation"]
    assert allocation["devices"]["results"][0]["bindingConditions"] == ["dra.example.com/attached"]
    assert allocation["devices"]["results"][0]["bindingFailureConditions"] == [
        "dra.example.com/attach-failed"
    ]
    # bindsToNode: pinned to the node, not the slice's fabric selector
    [term] = allocation["nodeSelector"]["nodeSelectorTerms"]
    assert term == {
        "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["composable-1"]}]
    }


def test_binding_conditions_turned_off_leave_such_devices_unallocatable():
    code, text = solve_fabric("text", binding=False)
    assert code == EXIT_UNSATISFIABLE
    assert "unusable: binding conditions are turned off" in text
    env = {**os.environ, "GPUALLOC_DEVICE_BINDING_CONDITIONS": "false"}
    run = subprocess.run(
        [sys.executable, "-m", "services.cli", "solve", "-f", "-"],
        input=FABRIC,
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env=env,
    )
    assert run.returncode == EXIT_UNSATISFIABLE, run.stderr
