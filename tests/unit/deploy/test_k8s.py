"""deploy/k8s: the kustomize base and the production overlay are valid Kubernetes 1.34 objects and
agree with each other, with the image and with the services' ports.

The base's files are checked one by one (kubectl is not needed for that); when kubectl is on the
PATH, the rendered output of base and overlay is validated as well.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.unit.deploy.manifests import (
    ALLOCATOR_PORT,
    ENV_PREFIXES,
    INVENTORY_PORT,
    ROOT,
    RUNTIME_ENV,
    project_scripts,
    relative,
    validate_kubernetes,
    yaml_documents,
    yaml_files,
)

K8S = ROOT / "deploy" / "k8s"
BASE = K8S / "base"
PRODUCTION = K8S / "overlays" / "production"
IMAGE = "gpualloc"  # the name kustomize's `images:` rewrites to the real registry/tag

KNOWN_KINDS = {
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
    ("v1", "Namespace"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "DaemonSet"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("kueue.x-k8s.io/v1beta2", "AdmissionCheck"),  # deploy/k8s/kueue: the Kueue bridge's check
}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet"}


# --- loading -----------------------------------------------------------------------------------


def kustomization(directory: Path) -> dict[str, Any]:
    (doc,) = yaml_documents(directory / "kustomization.yaml")
    assert isinstance(doc, dict)
    return doc


def base_objects() -> list[dict[str, Any]]:
    return [doc for name in kustomization(BASE)["resources"] for doc in yaml_documents(BASE / name)]


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in base_objects() if o["kind"] == kind}


def workloads() -> list[dict[str, Any]]:
    return [o for o in base_objects() if o["kind"] in WORKLOAD_KINDS]


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    return result


def gpualloc_containers() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for workload in workloads():
        for container in containers(workload):
            if container["image"].split(":")[0] == IMAGE:
                yield workload, container


def env_value(container: dict[str, Any], name: str) -> str:
    (value,) = [e["value"] for e in container.get("env", []) if e["name"] == name]
    assert isinstance(value, str)
    return value


def config() -> dict[str, str]:
    data: dict[str, str] = by_kind("ConfigMap")["gpualloc-config"]["data"]
    return data


def component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["labels"]["app.kubernetes.io/component"])


def workload_params() -> list[Any]:
    return [pytest.param(w, id=f"{w['kind']}-{w['metadata']['name']}".lower()) for w in workloads()]


# --- files -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", [pytest.param(p, id=relative(p).removeprefix("deploy/k8s/")) for p in yaml_files(K8S)]
)
def test_every_manifest_has_a_known_kind(path: Path) -> None:
    for doc in yaml_documents(path):
        assert (doc["apiVersion"], doc["kind"]) in KNOWN_KINDS, f"{relative(path)}: {doc['kind']}"


@pytest.mark.parametrize(
    "directory", [pytest.param(BASE, id="base"), pytest.param(PRODUCTION, id="production")]
)
def test_kustomization_references_existing_files(directory: Path) -> None:
    spec = kustomization(directory)
    for entry in spec.get("resources", []):
        assert (directory / entry).exists(), entry
    for patch in spec.get("patches", []):
        assert (directory / patch["path"]).exists(), patch["path"]
    assert [image["name"] for image in spec.get("images", [])] == [IMAGE]


def test_every_base_object_validates_against_the_kubernetes_schema() -> None:
    for obj in base_objects():
        validate_kubernetes(obj)


def test_production_patches_target_objects_of_the_base() -> None:
    base = {(o["kind"], o["metadata"]["name"]) for o in base_objects()}
    for patch in kustomization(PRODUCTION)["patches"]:
        for doc in yaml_documents(PRODUCTION / patch["path"]):
            assert (doc["kind"], doc["metadata"]["name"]) in base, patch["path"]


# --- containers --------------------------------------------------------------------------------


@pytest.mark.parametrize("workload", workload_params())
def test_containers_are_unprivileged_with_a_read_only_root(workload: dict[str, Any]) -> None:
    pod = workload["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in containers(workload):
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["runAsNonRoot"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("workload", workload_params())
def test_containers_request_resources_and_cap_memory(workload: dict[str, Any]) -> None:
    for container in containers(workload):
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        assert "memory" in container["resources"]["limits"]


@pytest.mark.parametrize("workload", workload_params())
def test_probes_use_ports_the_container_opens(workload: dict[str, Any]) -> None:
    for container in containers(workload):
        ports = {p["containerPort"] for p in container.get("ports", [])}
        names = {p["name"] for p in container.get("ports", [])}
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.get(kind)
            if probe is None:
                continue
            handler = probe.get("grpc") or probe.get("tcpSocket") or probe.get("httpGet")
            if handler is None:
                assert "exec" in probe
                continue
            port = handler["port"]
            assert port in ports or port in names, f"{container['name']} {kind} port {port}"


def test_gpualloc_containers_share_one_image_and_run_project_scripts() -> None:
    seen = list(gpualloc_containers())
    assert {w["metadata"]["name"] for w, _ in seen} == {
        "gpualloc-allocator",
        "gpualloc-inventory",
        "gpualloc-agent",
    }
    for workload, container in seen:
        assert container["image"] == IMAGE, workload["metadata"]["name"]
        assert container["command"][0] in project_scripts()


@pytest.mark.parametrize(
    ("component_name", "script", "port"),
    [
        pytest.param("allocator", "gpualloc-allocator", ALLOCATOR_PORT, id="allocator"),
        pytest.param("inventory", "gpualloc-inventory", INVENTORY_PORT, id="inventory"),
    ],
)
def test_servers_listen_probe_and_serve_on_their_default_port(
    component_name: str, script: str, port: int
) -> None:
    (workload,) = [w for w in workloads() if component(w) == component_name]
    (container,) = containers(workload)
    assert container["command"] == [script]
    assert env_value(container, "GPUALLOC_LISTEN") == f"0.0.0.0:{port}"
    assert [p["containerPort"] for p in container["ports"]] == [port]
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[kind]["grpc"] == {"port": port}
    (service,) = [s for s in by_kind("Service").values() if component(s) == component_name]
    assert [p["port"] for p in service["spec"]["ports"]] == [port]


def test_environment_names_are_gpualloc_or_opentelemetry_settings() -> None:
    assert all(name.startswith(ENV_PREFIXES) for name in config())
    for workload, container in gpualloc_containers():
        for env in container.get("env", []):
            runtime_ok = component(workload) == "agent" and env["name"] in RUNTIME_ENV
            assert env["name"].startswith(ENV_PREFIXES) or runtime_ok, env["name"]
        assert container["envFrom"] == [{"configMapRef": {"name": "gpualloc-config"}}]


# --- wiring between objects ----------------------------------------------------------------------


def test_services_select_a_workload_and_target_its_ports() -> None:
    for service in by_kind("Service").values():
        selector = service["spec"]["selector"]
        (workload,) = [
            w
            for w in workloads()
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        container_ports = {
            p["name"]: p["containerPort"] for c in containers(workload) for p in c["ports"]
        }
        for port in service["spec"]["ports"]:
            assert container_ports[port["targetPort"]] == port["port"]


def test_config_addresses_name_the_services() -> None:
    host, _, port = config()["GPUALLOC_INVENTORY_ADDR"].partition(":")
    inventory = by_kind("Service")[host]
    assert [p["port"] for p in inventory["spec"]["ports"]] == [int(port)] == [INVENTORY_PORT]
    redis_url = urlsplit(config()["GPUALLOC_REDIS_URL"])
    redis = by_kind("Service")[str(redis_url.hostname)]
    assert [p["port"] for p in redis["spec"]["ports"]] == [redis_url.port] == [6379]


def test_workload_selectors_match_their_pod_labels() -> None:
    for workload in workloads():
        selector = workload["spec"]["selector"]["matchLabels"]
        assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()


def test_allocator_scales_with_an_hpa_and_keeps_a_disruption_budget() -> None:
    allocator = by_kind("Deployment")["gpualloc-allocator"]
    assert allocator["spec"]["replicas"] == 3
    hpa = by_kind("HorizontalPodAutoscaler")["gpualloc-allocator"]
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "gpualloc-allocator",
    }
    assert hpa["spec"]["minReplicas"] == allocator["spec"]["replicas"]
    pdb = by_kind("PodDisruptionBudget")["gpualloc-allocator"]
    assert pdb["spec"]["selector"] == allocator["spec"]["selector"]


def test_only_labelled_clients_reach_the_allocator() -> None:
    policy = by_kind("NetworkPolicy")["gpualloc-allocator"]
    allocator = by_kind("Deployment")["gpualloc-allocator"]
    assert policy["spec"]["podSelector"] == allocator["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"gpualloc.dev/client": "true"}}}
    ]
    assert rule["ports"] == [{"protocol": "TCP", "port": ALLOCATOR_PORT}]


def test_inventory_may_only_read_slices_classes_and_nodes() -> None:
    role = by_kind("ClusterRole")["gpualloc-inventory"]
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    wanted = {
        (group, resource, verb)
        for group, resource in [
            ("resource.k8s.io", "resourceslices"),
            ("resource.k8s.io", "deviceclasses"),
            ("", "nodes"),
        ]
        for verb in ("get", "list", "watch")
    }
    assert granted == wanted
    binding = by_kind("ClusterRoleBinding")["gpualloc-inventory"]
    (subject,) = binding["subjects"]
    inventory = by_kind("Deployment")["gpualloc-inventory"]
    assert subject["name"] == inventory["spec"]["template"]["spec"]["serviceAccountName"]
    assert subject["namespace"] == kustomization(BASE)["namespace"]


def test_agent_runs_on_gpu_nodes_with_the_nvidia_runtime() -> None:
    agent = by_kind("DaemonSet")["gpualloc-agent"]
    pod = agent["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    (container,) = pod["containers"]
    assert container["command"] == ["gpualloc-agent"]
    (node_name,) = [e for e in container["env"] if e["name"] == "GPUALLOC_NODE_NAME"]
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    args = container["args"]
    assert args[args.index("--node") + 1] == "$(GPUALLOC_NODE_NAME)"
    assert args[args.index("--inventory") + 1] == "$(GPUALLOC_INVENTORY_ADDR)"


def test_argument_references_name_variables_the_container_defines() -> None:
    for _, container in gpualloc_containers():
        defined = {e["name"] for e in container.get("env", [])} | set(config())
        for arg in container.get("args", []):
            for name in re.findall(r"\$\(([A-Z0-9_]+)\)", arg):
                assert name in defined, f"{container['name']}: $({name}) is not defined"


def test_redis_persists_an_append_only_file_on_a_claim() -> None:
    redis = by_kind("StatefulSet")["gpualloc-redis"]
    (container,) = containers(redis)
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    assert args[args.index("--dir") + 1] == mount["mountPath"]


# --- rendered with kubectl kustomize --------------------------------------------------------------


def render(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]


@pytest.mark.parametrize(
    "directory", [pytest.param(BASE, id="base"), pytest.param(PRODUCTION, id="production")]
)
def test_rendered_output_is_valid_and_namespaced(directory: Path) -> None:
    objects = render(directory)
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    for obj in objects:
        validate_kubernetes(obj)
        if obj["kind"] not in cluster_scoped:
            assert obj["metadata"]["namespace"] == "gpualloc", obj["metadata"]["name"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpualloc"


def test_production_overlay_scales_up_and_uses_the_registry_image() -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render(PRODUCTION)}
    allocator = objects[("Deployment", "gpualloc-allocator")]
    assert (
        allocator["spec"]["replicas"]
        > by_kind("Deployment")["gpualloc-allocator"]["spec"]["replicas"]
    )
    hpa = objects[("HorizontalPodAutoscaler", "gpualloc-allocator")]
    assert hpa["spec"]["minReplicas"] == allocator["spec"]["replicas"]
    images = {
        c["image"]
        for o in objects.values()
        if o["kind"] in WORKLOAD_KINDS
        for c in o["spec"]["template"]["spec"]["containers"]
        if "gpualloc" in c["image"]
    }
    assert images == {"registry.example.com/gpualloc/gpualloc:0.1.0"}
    config_map = objects[("ConfigMap", "gpualloc-config")]["data"]
    assert set(config()) < set(config_map)


# --- OpenTelemetry ---------------------------------------------------------------------------


def test_only_the_allocator_names_itself_to_opentelemetry() -> None:
    # the allocator is the instrumented process (services/allocator/telemetry.py)
    for workload, container in gpualloc_containers():
        otel = [e["name"] for e in container.get("env", []) if e["name"].startswith("OTEL_")]
        assert bool(otel) == (component(workload) == "allocator"), (component(workload), otel)


def test_the_base_exports_nothing_and_production_exports_over_otlp() -> None:
    assert not [name for name in config() if name.startswith("OTEL_")]
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render(PRODUCTION)}
    data = objects[("ConfigMap", "gpualloc-config")]["data"]
    # an endpoint alone exports nothing: the SDK's exporters default to none here
    assert data["OTEL_TRACES_EXPORTER"] == data["OTEL_METRICS_EXPORTER"] == "otlp"
    endpoint = urlsplit(data["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert (endpoint.scheme, endpoint.port) == ("http", 4317)
