"""`gpualloc solve`: errors with a next step (file:line, "did you mean"), an empty result when
nothing is left to allocate, and `--emit claims` for replaying the solved state."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
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
from services.common.dra.model import ResourceClaim
from services.common.dra.parse import load_objects
from tests.cli.examples import CLAIMS, CLUSTER

CLAIM = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: job
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: {device_class}
        selectors:
        - cel:
            expression: {expression}
"""
FINE = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA L40S"'


def run(*paths: str, **options: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_solve([*CLUSTER, *paths], stdout=out, stderr=err, **options)
    return code, out.getvalue(), err.getvalue()


def claim_file(tmp_path: Path, device_class: str = "gpu.nvidia.com", expr: str = FINE) -> str:
    path = tmp_path / "claim.yaml"
    path.write_text(CLAIM.format(device_class=device_class, expression=json.dumps(expr)))
    return str(path)


# --- errors name the file, the line and the closest known name -------------------------------


@dataclass(frozen=True)
class Typo:
    device_class: str = "gpu.nvidia.com"
    expression: str = FINE
    node: str | None = None
    expected: tuple[str, ...] = field(default_factory=tuple)


TYPOS = {
    "device-class": Typo(
        device_class="gpu.nvida.com",
        expected=(
            'claim.yaml:10: document 1 (ResourceClaim "job"): '
            "spec.devices.requests[0].exactly.deviceClassName: ",
            'could not retrieve device class gpu.nvida.com (did you mean "gpu.nvidia.com"?)',
        ),
    ),
    "attribute-in-a-selector": Typo(
        expression='device.attributes["gpu.nvidia.com"].productNme == "NVIDIA L40S"',
        expected=(
            'claim.yaml:13: document 1 (ResourceClaim "job"): '
            "spec.devices.requests[0].exactly.selectors[0].cel.expression: ",
            'no such key: productNme (did you mean "productName"?)',
        ),
    ),
    "capacity-in-a-selector": Typo(
        expression='device.capacity["gpu.nvidia.com"].memroy.compareTo(quantity("1Gi")) >= 0',
        expected=('no such key: memroy (did you mean "memory"?)',),
    ),
    "node": Typo(
        node="l40s-nod-1", expected=('node l40s-nod-1 not found (did you mean "l40s-node-1"?)',)
    ),
}


@pytest.mark.parametrize("typo", TYPOS.values(), ids=TYPOS.keys())
def test_a_typo_is_answered_with_where_it_is_and_the_closest_known_name(tmp_path, typo):
    path = claim_file(tmp_path, typo.device_class, typo.expression)

    code, out, err = run(path, node=typo.node)

    assert (code, out) == (EXIT_INVALID, "")
    assert err.startswith("gpualloc solve: ")
    for part in typo.expected:
        assert part in err


# --- nothing to allocate: an empty result, exit 0 ---------------------------------------------


ALLOCATED_CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "held"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com"}}]}},
    "status": {"allocation": {"devices": {"results": [{
        "request": "gpu", "driver": "gpu.nvidia.com", "pool": "l40s-node-1", "device": "gpu-0"}]}}},
}  # fmt: skip

NOTHING = {
    "no-claims-at-all": ([], {}),
    "every-claim-allocated": (["-"], {}),
    "every-claim-allocated-gang": (["-"], {"gang": 2}),
}


@pytest.mark.parametrize(("paths", "options"), NOTHING.values(), ids=NOTHING.keys())
def test_nothing_left_to_allocate_is_an_empty_result_not_an_error(paths, options):
    """As upstream's allocator: no claim to allocate is an empty result."""
    stdin = io.StringIO(yaml.safe_dump(ALLOCATED_CLAIM))
    code, out, err = run(*paths, output="json", stdin=stdin, **options)

    assert (code, err) == (EXIT_ALLOCATED, "")
    report = json.loads(out)
    assert (report["outcome"], report["claims"]) == ("allocated", [])
    assert report.get("gang", {}).get("members", []) == []


def test_nothing_left_to_allocate_in_text() -> None:
    code, out, _ = run()
    assert code == EXIT_ALLOCATED
    assert out.startswith("ALLOCATED nothing: every ResourceClaim has status.allocation already")


def test_capacity_of_nothing_is_still_invalid() -> None:
    code, _, err = run(capacity=True)
    assert code == EXIT_INVALID
    assert "--capacity: no ResourceClaim without status.allocation to count" in err


# --- --emit claims: the solved state, to replay -----------------------------------------------


def emit(*paths: str, output: str = "yaml") -> tuple[int, str, str]:
    return run(*paths, output=output, emit="claims")


def test_emitted_claims_hold_their_devices_when_replayed(tmp_path) -> None:
    """two-claims-together fills h100-node-1; replayed, eight-h100 must go to h100-node-2."""
    code, out, _ = emit(str(CLAIMS / "two-claims-together.yaml"))
    assert code == EXIT_ALLOCATED
    state = tmp_path / "state.yaml"
    state.write_text(out)

    listed = yaml.safe_load(out)
    assert (listed["apiVersion"], listed["kind"]) == ("v1", "List")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["trainer", "evaluator"]
    pools = {
        r["pool"] for i in listed["items"] for r in i["status"]["allocation"]["devices"]["results"]
    }
    assert pools == {"h100-node-1"}

    code, out, _ = run(str(state), str(CLAIMS / "eight-h100.yaml"), output="json")
    assert code == EXIT_ALLOCATED
    assert json.loads(out)["node"] == "h100-node-2"

    code, out, _ = run(str(state), output="json")  # nothing more to allocate
    assert (code, json.loads(out)["claims"]) == (EXIT_ALLOCATED, [])


def test_emitted_claims_keep_earlier_allocations_and_read_back_as_objects() -> None:
    stdin = io.StringIO(yaml.safe_dump(ALLOCATED_CLAIM))
    out, err = io.StringIO(), io.StringIO()
    code = run_solve(
        [*CLUSTER, "-", str(CLAIMS / "one-h100.yaml")],
        output="json",
        emit="claims",
        stdin=stdin,
        stdout=out,
        stderr=err,
    )
    assert code == EXIT_ALLOCATED, err.getvalue()
    held, placed = load_objects(out.getvalue(), "emitted.json")
    assert isinstance(held, ResourceClaim) and isinstance(placed, ResourceClaim)
    assert held.allocation is not None and placed.allocation is not None
    assert [r.device for r in held.allocation.results] == ["gpu-0"]
    assert placed.allocation.results[0].pool == "h100-node-1"
    assert placed.allocation.node_selector is not None  # the node it was placed on


def test_emit_claims_json_and_yaml_are_the_same_objects() -> None:
    claim = str(CLAIMS / "mig-small-else-medium.yaml")
    _, as_json, _ = emit(claim, output="json")
    _, as_yaml, _ = emit(claim, output="yaml")
    assert json.loads(as_json) == yaml.safe_load(as_yaml)


def test_emit_claims_of_an_unsatisfiable_claim_prints_no_objects() -> None:
    code, out, err = emit(str(CLAIMS / "sixteen-h100-one-node.yaml"))
    assert (code, out) == (EXIT_UNSATISFIABLE, "")
    assert err.startswith("UNSATISFIABLE")


REFUSED = {
    "as-text": ({"output": "text"}, "--emit: claims are printed as objects: add -o yaml"),
    "with-a-gang": ({"output": "yaml", "gang": 2}, "--emit: claims cannot be emitted with --gang"),
    "with-capacity": (
        {"output": "yaml", "capacity": True},
        "--emit: claims cannot be emitted with --capacity",
    ),
}


@pytest.mark.parametrize(("options", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_emit_claims_refuses_what_has_no_claims_to_print(options, message) -> None:
    code, out, err = run(str(CLAIMS / "one-h100.yaml"), emit="claims", **options)
    assert (code, out) == (EXIT_INVALID, "")
    assert message in err
