"""claim_from_spec: the grammar, the claims it builds, and what they get on the example cluster.

Placements are computed by `gpualloc solve` (the allocator's own solver, offline) on
examples/cluster, so the CEL selectors the specs produce are evaluated for real.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from services.allocator.cli.solve import EXIT_ALLOCATED, EXIT_UNSATISFIABLE, run_solve
from services.allocator.core.topology_constraints import TopologyKind as CoreKind
from services.allocator.core.topology_constraints import constraints_from_annotations
from services.client.specs import claim_from_spec, is_mig_profile
from services.client.topology import ANNOTATION
from services.common.dra.serialize import to_dict
from services.common.errors import InvalidArgument

ROOT = Path(__file__).resolve().parents[3]
CLUSTER = [str(ROOT / "examples" / "cluster"), str(ROOT / "examples" / "deviceclasses.yaml")]


def shape(spec: str) -> dict[str, object]:
    """The parts of the claim a spec decides, in a comparable form."""
    claim = claim_from_spec(spec, name="c")
    (request,) = claim.requests
    if request.exactly is not None:
        choices = [
            (
                request.exactly.device_class_name,
                request.exactly.count,
                [s.cel for s in request.exactly.selectors],
            )
        ]
    else:
        choices = [
            (s.device_class_name, s.count, [x.cel for x in s.selectors])
            for s in request.first_available
        ]
    return {
        "choices": choices,
        "first_available": request.exactly is None,
        "match": [c.match_attribute for c in claim.constraints],
        "nvlink": ANNOTATION in claim.annotations,
    }


PRODUCT = "device.attributes['gpu.nvidia.com'].productName.lowerAscii().replace(' ', '_')"
H100 = f"{PRODUCT}.contains('h100')"
A100 = f"{PRODUCT}.contains('a100')"
MEMORY = "device.capacity['gpu.nvidia.com'].memory"


def profile(p: str) -> str:
    return f"device.attributes['gpu.nvidia.com'].profile == '{p}'"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(
            "4 x H100 nvlink",
            {
                "choices": [("gpu.nvidia.com", 4, [H100])],
                "first_available": False,
                "match": [],
                "nvlink": True,
            },
            id="four-h100-nvlink",
        ),
        pytest.param(
            "1 x mig 1g.10gb else 2g.20gb",
            {
                "choices": [
                    ("mig.nvidia.com", 1, [profile("1g.10gb")]),
                    ("mig.nvidia.com", 1, [profile("2g.20gb")]),
                ],
                "first_available": True,
                "match": [],
                "nvlink": False,
            },
            id="mig-small-else-larger",
        ),
        pytest.param(
            "2x a100 else gpu same-pcie-root same-model",
            {
                "choices": [("gpu.nvidia.com", 2, [A100]), ("gpu.nvidia.com", 2, [])],
                "first_available": True,
                "match": ["resource.kubernetes.io/pcieRoot", "gpu.nvidia.com/productName"],
                "nvlink": False,
            },
            id="a100-else-any-gpu-with-dra-constraints",
        ),
        pytest.param(
            "gpu mem>=40Gi",
            {
                "choices": [
                    (
                        "gpu.nvidia.com",
                        1,
                        [f"{MEMORY}.compareTo(quantity('40Gi')) >= 0"],
                    )
                ],
                "first_available": False,
                "match": [],
                "nvlink": False,
            },
            id="count-defaults-to-one-memory-selector",
        ),
        pytest.param(
            "1 x h100 nvlink",
            {
                "choices": [("gpu.nvidia.com", 1, [H100])],
                "first_available": False,
                "match": [],
                "nvlink": False,
            },
            id="nvlink-is-vacuous-for-one-gpu",
        ),
    ],
)
def test_spec_builds_the_claim(spec, expected):
    assert shape(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param("", "empty spec", id="empty"),
        pytest.param("4 x", "no device named", id="count-without-device"),
        pytest.param(
            "2 x mig fast", "'mig' must be followed by a MIG profile", id="mig-without-profile"
        ),
        pytest.param("2 x h100 else", "expected a device after 'else'", id="dangling-else"),
        pytest.param("40 x h100", "count must be between 1 and 32", id="over-the-claim-limit"),
        pytest.param("2 x h100 quickly", "unexpected 'quickly'", id="unknown-option"),
        pytest.param("2 x mig 1g.10gb nvlink", "NVLink connects whole GPUs", id="nvlink-on-mig"),
        pytest.param("1 x gpu mem>=lots", "not a Kubernetes quantity", id="bad-quantity"),
        pytest.param("1 x h100! ", "is not a GPU model", id="bad-model-word"),
    ],
)
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(InvalidArgument) as raised:
        claim_from_spec(spec)
    assert message in raised.value.message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("1g.10gb", True, id="plain"),
        pytest.param("1c.3g.71gb", True, id="compute-instance"),
        pytest.param("1g.10gb+me", True, id="media-extension"),
        pytest.param("h100", False, id="model"),
        pytest.param("10gb", False, id="memory-only"),
    ],
)
def test_mig_profile_names(text, expected):
    assert is_mig_profile(text) is expected


def solve(spec: str, tmp_path: Path) -> tuple[int, dict[str, object]]:
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(to_dict(claim_from_spec(spec, name="job"))))
    out, err = io.StringIO(), io.StringIO()
    code = run_solve(
        [*CLUSTER, str(path)],
        node=None,
        output="json",
        stdout=out,
        stderr=err,
        stdin=io.StringIO(""),
    )
    return code, json.loads(out.getvalue()) if out.getvalue() else {}


@pytest.mark.parametrize(
    ("spec", "node_prefix", "device_part"),
    [
        pytest.param("4 x h100", "h100-node", "gpu-", id="h100-on-an-h100-node"),
        pytest.param(
            "1 x mig 1g.10gb else 2g.20gb", "a100-node", "-mig-1g10gb-", id="mig-first-choice"
        ),
        pytest.param("1 x mig 7g.40gb", "a100-node", "-mig-7g40gb-", id="whole-mig-profile"),
        pytest.param("1 x gpu mem>=60Gi", "h100-node", "gpu-", id="memory-rules-out-a100-and-l40s"),
        pytest.param("2 x l40s same-pcie-root", "l40s-node", "gpu-", id="model-and-root"),
    ],
)
def test_spec_claims_allocate_on_the_example_cluster(spec, node_prefix, device_part, tmp_path):
    code, report = solve(spec, tmp_path)
    assert code == EXIT_ALLOCATED, report
    assert str(report["node"]).startswith(node_prefix)
    results = report["claims"][0]["allocation"]["devices"]["results"]  # type: ignore[index]
    assert all(device_part in r["device"] for r in results)


def test_a_model_no_node_has_is_unsatisfiable(tmp_path):
    code, report = solve("1 x b200", tmp_path)
    assert code == EXIT_UNSATISFIABLE
    assert report["outcome"] == "unsatisfiable"


def test_nvlink_annotation_is_the_one_gpualloc_solve_reads():
    claim = claim_from_spec("4 x h100 nvlink", name="job")
    (constraint,) = constraints_from_annotations([claim])
    assert constraint.kind is CoreKind.NVLINK_CONNECTED
    assert constraint.required


@pytest.mark.parametrize(
    ("spec", "code", "node_prefix"),
    [
        pytest.param("4 x h100 nvlink", EXIT_ALLOCATED, "h100-node", id="nvswitch-node"),
        pytest.param("2 x l40s nvlink", EXIT_UNSATISFIABLE, None, id="no-nvlink-on-l40s"),
    ],
)
def test_nvlink_specs_with_the_example_topology(spec, code, node_prefix, tmp_path):
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(to_dict(claim_from_spec(spec, name="job"))))
    out = io.StringIO()
    topology = str(ROOT / "examples" / "topology")
    result = run_solve(
        [*CLUSTER, topology, str(path)],
        node=None,
        output="json",
        stdout=out,
        stderr=io.StringIO(),
        stdin=io.StringIO(""),
    )
    assert result == code
    if node_prefix:
        assert json.loads(out.getvalue())["node"].startswith(node_prefix)
