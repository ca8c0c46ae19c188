"""The Kueue objects gpualloc reads as its quotas, put to a real kube-apiserver with Kueue's CRDs
and Kueue's own validating webhooks (tests/control_plane.py: Kueue v0.17.0's manager and CRDs,
the version gpualloc reads its objects as).

Each object is created with `dryRun=All` and `fieldValidation=Strict` (as `kubectl apply
--dry-run=server --validate=strict`): nothing is stored, every check runs. So:

- the example files (examples/security/kueue/) and every object of the mapping table
  (tests/unit/common/test_kueue_quota.py's MAPPING) are real Kueue objects: Kueue accepts them;
- every row of the validation table that breaks one of Kueue's rules is refused by Kueue too,
  and every row gpualloc refuses only because it cannot honour the field (`Not honoured by
  gpualloc`, a ResourceFlavor not given) is one Kueue accepts: gpualloc is as strict as Kueue,
  and stricter only where it says so.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes  # the `kube` extra (make install): a real import, never a skip
import pytest
import yaml

from tests.control_plane import ControlPlane, control_plane_in
from tests.peers import peer
from tests.unit.bridges.support import ROOT
from tests.unit.common.test_kueue_quota import DEFAULT_FLAVOR, INVALID, MAPPING, documents

pytestmark = pytest.mark.timeout(300)

EXAMPLES = ROOT / "examples" / "security" / "kueue"
NOT_API_OBJECTS = {"Configuration"}  # Kueue reads it from a file at start, not from the API

# Rows of INVALID whose objects Kueue accepts: what gpualloc refuses there is its own rule (it
# cannot honour the field, a flavor is missing, one file holds an object twice).
KUEUE_ACCEPTS = {
    "stop-policy-hold-is-refused",
    "flavor-not-given",
    "a-resource-gpualloc-does-not-allocate",
    "a-mig-name-that-is-no-profile",
    "flavor-topology-is-refused",
    "cohorts-in-a-cycle",
    "a-cohort-named-as-a-cluster-queue",
    "a-config-map-that-is-not-kueues",
    "a-workload-priority-class-and-a-priority-class-of-one-name",
    "duplicate-name",
    "an-excluded-prefix-that-excludes-gpus",
}
# Rows this check cannot put to the API as they stand (why, for the reader).
NOT_PUT = {
    "two-global-defaults": "the apiserver refuses a second default only once the first exists",
    "a-kind-gpualloc-does-not-read": "a Deployment without a spec is refused for its own sake",
    "a-workload-is-not-a-policy-object": "a Workload without a spec is refused for its own sake",
}


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with control_plane_in(tmp_path_factory.mktemp("control-plane"), kueue=True) as started:
        started.register_kueue_validation()
        for namespace in ("team-a", "team-b"):
            started.apply(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
        yield started


def refusal(plane: ControlPlane, document: dict[str, Any]) -> str | None:
    """None when the apiserver (and Kueue's webhooks) would create `document`, else why not."""
    client = kubernetes.dynamic.DynamicClient(plane.api_client())  # type: ignore[no-untyped-call]
    try:
        api = client.resources.get(api_version=document["apiVersion"], kind=document["kind"])
    except kubernetes.dynamic.exceptions.ResourceNotFoundError as error:
        return f"not served: {error}"
    namespace = (document.get("metadata") or {}).get("namespace")
    if api.namespaced and not namespace:
        namespace = "default"
    try:
        client.create(  # type: ignore[no-untyped-call]
            api,
            body=document,
            namespace=namespace,
            query_params=[("dryRun", "All"), ("fieldValidation", "Strict")],
        )
    except kubernetes.client.ApiException as error:
        return str(error.body)
    return None


def _objects(text: str) -> list[dict[str, Any]]:
    found = []
    for document in yaml.safe_load_all(text):
        if not document:
            continue
        if document["kind"] == "List":
            found.extend(document["items"])
        elif document["kind"] not in NOT_API_OBJECTS:
            found.append(document)
    return found


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yml")), ids=lambda p: p.name)
def test_the_example_files_are_kueue_objects(plane: ControlPlane, path: Any) -> None:
    for document in _objects(path.read_text()):
        assert refusal(plane, document) is None, document["metadata"]


@pytest.mark.parametrize("objects", [pytest.param(c[1], id=c[0]) for c in MAPPING])
def test_every_mapped_object_is_a_kueue_object(plane: ControlPlane, objects: str) -> None:
    for document in _objects(objects):
        assert refusal(plane, document) is None, (document["metadata"], refusal(plane, document))


# Rows of only a Configuration put nothing to the API (Kueue checks those when it starts, below).
@pytest.mark.parametrize(
    "objects",
    [pytest.param(c[1], id=c[0]) for c in INVALID if c[0] not in NOT_PUT and _objects(c[1])],
)
def test_kueue_refuses_what_breaks_its_rules_and_accepts_what_gpualloc_only_cannot_honour(
    plane: ControlPlane, objects: str, request: pytest.FixtureRequest
) -> None:
    row = request.node.callspec.id
    documents_put = _objects(documents(DEFAULT_FLAVOR, objects))
    refused = [(d.get("metadata"), refusal(plane, d)) for d in documents_put]
    refused = [(metadata, why) for metadata, why in refused if why is not None]
    if row in KUEUE_ACCEPTS:
        assert not refused, refused
    else:
        assert refused, "Kueue accepted what gpualloc refuses as breaking Kueue's rules"


# --- the Configuration: Kueue's manager loads it from a file and checks it before anything else

# Rows of INVALID whose Configuration Kueue loads: what gpualloc refuses there is its own rule.
KUEUE_LOADS = {
    "transformations-are-refused",
    "an-excluded-prefix-that-excludes-gpus",
    "a-feature-gate-that-changes-a-quota-decision",
}


def _configurations(text: str) -> list[dict[str, Any]]:
    found = []
    for document in yaml.safe_load_all(text):
        if not document:
            continue
        if document["kind"] == "ConfigMap" and "controller_manager_config.yaml" in document["data"]:
            document = yaml.safe_load(document["data"]["controller_manager_config.yaml"])
        if document["kind"] == "Configuration":
            found.append(document)
    return found


def kueue_loads(configuration: dict[str, Any], directory: Path) -> str | None:
    """None when Kueue's manager loads `configuration` (it then stops, for want of a
    kubeconfig), else why it does not."""
    path = directory / "kueue-config.yaml"
    path.write_text(yaml.safe_dump(configuration))
    done = subprocess.run(
        [str(peer("kueue")), "--config", str(path), "--kubeconfig", str(directory / "none")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr
    if "Successfully loaded configuration" in output:
        return None
    assert "Unable to load the configuration" in output, output[-2000:]
    return output[-2000:]


def _with_configurations(rows: list[Any]) -> list[Any]:
    return [pytest.param(c[1], id=c[0]) for c in rows if _configurations(c[1])]


@pytest.mark.parametrize("objects", _with_configurations(MAPPING))
def test_kueue_loads_every_mapped_configuration(objects: str, tmp_path: Path) -> None:
    for configuration in _configurations(objects):
        assert kueue_loads(configuration, tmp_path) is None


@pytest.mark.parametrize("objects", _with_configurations(INVALID))
def test_kueue_refuses_the_configurations_that_break_its_rules(
    objects: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    row = request.node.callspec.id
    why = [kueue_loads(c, tmp_path) for c in _configurations(objects)]
    if row == "two-configurations":  # one file holds one Configuration: each loads alone
        assert why == [None, None]
    elif row in KUEUE_LOADS:
        assert why == [None]
    else:
        assert why and all(why), f"Kueue loaded what gpualloc refuses as breaking its rules: {row}"
