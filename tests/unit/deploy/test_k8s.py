"""deploy/k8s: the kustomize base and the production overlay are valid Kubernetes 1.34 objects and
agree with each other, with the image and with the services' ports.

The base's files are checked one by one (kubectl is not needed for that); when kubectl is on the
PATH, the rendered output of base and overlay is validated as well. cert-manager's Issuer and
Certificate are not in the Kubernetes schemas: they are checked against the strict subset in
certmanager.py. The secure defaults (TLS on every server, the access policy, Redis' password,
the NetworkPolicies) have tests of their own that fail when one is taken out.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from services.allocator.adapters.grpc.servicer import SERVICE_NAME as ALLOCATOR_SERVICE
from tests.unit.deploy.accesspolicy import check_access_policy
from tests.unit.deploy.certmanager import is_cert_manager, validate_cert_manager
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
    ("cert-manager.io/v1", "Issuer"),  # the servers' TLS (base/tls.yaml)
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "PodMonitor"),  # deploy/k8s/monitoring: Prometheus Operator
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet"}
SERVERS = ("allocator", "inventory")
HEALTH_PORT = 8086  # GPUALLOC_HEALTH_LISTEN: plaintext grpc.health.v1 only, for the kubelet
METRICS_PORT = 9464  # GPUALLOC_METRICS_LISTEN: plaintext Prometheus /metrics


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


def env_entry(container: dict[str, Any], name: str) -> dict[str, Any]:
    (entry,) = [e for e in container.get("env", []) if e["name"] == name]
    assert isinstance(entry, dict)
    return entry


def server(component_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Deployment of a server and its one container."""
    (workload,) = [w for w in workloads() if component(w) == component_name]
    (container,) = containers(workload)
    return workload, container


def mounted_file(workload: dict[str, Any], container: dict[str, Any], path: str) -> tuple[Any, str]:
    """The pod volume behind a file path of a container, and the file's path inside it.

    A subPath mount is refused: Kubernetes never updates it, so a renewed certificate or an
    edited policy would not reach the running server.
    """
    for mount in container.get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            assert "subPath" not in mount, f"{path}: subPath mounts are never updated"
            (volume,) = [
                v for v in workload["spec"]["template"]["spec"]["volumes"]
                if v["name"] == mount["name"]
            ]  # fmt: skip
            return volume, path[len(prefix) :]
    raise AssertionError(f"{container['name']}: {path} is on no volume")


def certificates() -> dict[str, dict[str, Any]]:
    """cert-manager Certificates by the Secret they write."""
    return {c["spec"]["secretName"]: c for c in by_kind("Certificate").values()}


def json_patch_files(directory: Path) -> set[Path]:
    """Files a kustomization applies as JSON 6902 patches (lists of operations, not objects)."""
    patches = kustomization(directory).get("patches", [])
    return {directory / p["path"] for p in patches if "target" in p}


def workload_params() -> list[Any]:
    return [pytest.param(w, id=f"{w['kind']}-{w['metadata']['name']}".lower()) for w in workloads()]


# --- files -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", [pytest.param(p, id=relative(p).removeprefix("deploy/k8s/")) for p in yaml_files(K8S)]
)
def test_every_manifest_has_a_known_kind(path: Path) -> None:
    if path in json_patch_files(path.parent):
        (operations,) = yaml_documents(path)
        assert all(op["op"] in {"add", "replace", "remove"} for op in operations)
        return
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


def validate(obj: dict[str, Any]) -> None:
    if is_cert_manager(obj):
        validate_cert_manager(obj)
    else:
        validate_kubernetes(obj)


def test_every_base_object_validates_against_its_schema() -> None:
    for obj in base_objects():
        validate(obj)


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param({"dnsName": ["a"]}, id="misspelt-field"),
        pytest.param({"usages": ["server-auth"]}, id="unknown-usage"),
        pytest.param({"issuerRef": {"name": "x", "kind": "Issuers"}}, id="unknown-issuer-kind"),
        pytest.param({"secretName": None}, id="no-secret-name"),
    ],
)
def test_the_cert_manager_schema_rejects_what_cert_manager_would(obj: dict[str, Any]) -> None:
    certificate = copy.deepcopy(by_kind("Certificate")["gpualloc-allocator"])
    certificate["spec"].update(obj)
    certificate["spec"] = {k: v for k, v in certificate["spec"].items() if v is not None}
    with pytest.raises(pytest.fail.Exception):
        validate_cert_manager(certificate)


def resolve(obj: Any, pointer: str) -> Any:
    for part in pointer.strip("/").split("/"):
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj


def test_production_patches_target_objects_of_the_base() -> None:
    base = {(o["kind"], o["metadata"]["name"]): o for o in base_objects()}
    for patch in kustomization(PRODUCTION)["patches"]:
        if "target" in patch:  # JSON 6902: the operations' paths exist in the target
            target = base[(patch["target"]["kind"], patch["target"]["name"])]
            (operations,) = yaml_documents(PRODUCTION / patch["path"])
            for op in operations:
                parent, _, last = op["path"].rpartition("/")
                container = resolve(target, parent)
                assert last == "-" or last in container or int(last) < len(container), op
            continue
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
    workload, container = server(component_name)
    assert container["command"] == [script]
    assert env_value(container, "GPUALLOC_LISTEN") == f"0.0.0.0:{port}"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "grpc": port,
        "health": HEALTH_PORT,
        "metrics": METRICS_PORT,
    }
    assert env_value(container, "GPUALLOC_METRICS_LISTEN") == f"0.0.0.0:{METRICS_PORT}"
    (service,) = [s for s in by_kind("Service").values() if component(s) == component_name]
    # health and metrics stay in the pod (a PodMonitor scrapes each pod: deploy/k8s/monitoring)
    assert [p["port"] for p in service["spec"]["ports"]] == [port]


@pytest.mark.parametrize(
    ("component_name", "readiness_service"),
    [
        pytest.param("allocator", ALLOCATOR_SERVICE, id="allocator-ready-when-its-service-is"),
        pytest.param("inventory", None, id="inventory"),
    ],
)
def test_probes_use_the_plaintext_health_port_because_kubelet_cannot_do_tls(
    component_name: str, readiness_service: str | None
) -> None:
    _, container = server(component_name)
    assert env_value(container, "GPUALLOC_HEALTH_LISTEN") == f"0.0.0.0:{HEALTH_PORT}"
    for kind in ("startupProbe", "livenessProbe"):
        assert container[kind]["grpc"] == {"port": HEALTH_PORT}
    readiness = {"port": HEALTH_PORT} | (
        {"service": readiness_service} if readiness_service else {}
    )
    assert container["readinessProbe"]["grpc"] == readiness


def interpolation_only(container: dict[str, Any], name: str) -> bool:
    """A variable that exists only to be expanded as $(NAME) into other values (a Secret's key
    spliced into a URL): the kubelet's business, not a setting."""
    values = [str(e.get("value", "")) for e in container.get("env", [])] + container.get("args", [])
    return any(f"$({name})" in value for value in values)


def test_environment_names_are_gpualloc_or_opentelemetry_settings() -> None:
    assert all(name.startswith(ENV_PREFIXES) for name in config())
    for workload, container in gpualloc_containers():
        for env in container.get("env", []):
            runtime_ok = component(workload) == "agent" and env["name"] in RUNTIME_ENV
            spliced = "valueFrom" in env and interpolation_only(container, env["name"])
            assert env["name"].startswith(ENV_PREFIXES) or runtime_ok or spliced, env["name"]
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
    for component_name in SERVERS:
        redis_url = urlsplit(env_value(server(component_name)[1], "GPUALLOC_REDIS_URL"))
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


def test_env_references_name_variables_defined_before_them() -> None:
    # the kubelet expands $(NAME) in env values only from variables listed earlier (or envFrom);
    # a later or unknown one stays the literal text `$(NAME)`
    for workload in workloads():
        for container in containers(workload):
            defined = set(config()) if container.get("envFrom") else set()
            for env in container.get("env", []):
                for name in re.findall(r"\$\(([A-Z0-9_]+)\)", str(env.get("value", ""))):
                    assert name in defined, f"{container['name']} {env['name']}: $({name})"
                defined.add(env["name"])


def test_redis_persists_an_append_only_file_on_a_claim() -> None:
    redis = by_kind("StatefulSet")["gpualloc-redis"]
    (container,) = containers(redis)
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    assert args[args.index("--dir") + 1] == mount["mountPath"]


# --- secure defaults: each test fails when its safeguard is taken out ---------------------------

REDIS_SECRET = {"name": "gpualloc-redis", "key": "password"}


def secret_ref(container: dict[str, Any], name: str) -> dict[str, Any]:
    ref: dict[str, Any] = env_entry(container, name)["valueFrom"]["secretKeyRef"]
    return ref


def test_redis_requires_the_password_from_the_secret() -> None:
    (container,) = containers(by_kind("StatefulSet")["gpualloc-redis"])
    args = container["args"]
    variable = re.fullmatch(r"\$\(([A-Z_]+)\)", args[args.index("--requirepass") + 1])
    assert variable is not None, "requirepass must come from a variable, never from the file"
    assert secret_ref(container, variable[1]) == REDIS_SECRET
    # the readiness probe runs redis-cli, which authenticates with REDISCLI_AUTH
    assert container["readinessProbe"]["exec"]["command"] == ["redis-cli", "ping"]
    assert secret_ref(container, "REDISCLI_AUTH") == REDIS_SECRET


@pytest.mark.parametrize("component_name", [pytest.param(c, id=c) for c in SERVERS])
def test_servers_reach_redis_with_the_password_from_the_secret(component_name: str) -> None:
    _, container = server(component_name)
    url = urlsplit(env_value(container, "GPUALLOC_REDIS_URL"))
    assert url.username == "" and url.password is not None
    variable = re.fullmatch(r"\$\(([A-Z_]+)\)", url.password)
    assert variable is not None, url.password
    assert secret_ref(container, variable[1]) == REDIS_SECRET
    assert "GPUALLOC_REDIS_URL" not in config()  # envFrom values are never $(VAR)-expanded


@pytest.mark.parametrize(
    "directory", [pytest.param(BASE, id="base"), pytest.param(PRODUCTION, id="production")]
)
def test_no_secret_is_shipped(directory: Path) -> None:
    # the Redis password is a Secret the operator creates: none may come from git
    objects = render(directory) if directory == PRODUCTION else base_objects()
    assert not [o for o in objects if o["kind"] == "Secret"]


@pytest.mark.parametrize("component_name", [pytest.param(c, id=c) for c in SERVERS])
def test_servers_serve_tls_with_their_cert_manager_certificate(component_name: str) -> None:
    workload, container = server(component_name)
    assert "GPUALLOC_INSECURE" not in {e["name"] for e in container["env"]} | set(config())
    cert, key = (env_value(container, n) for n in ("GPUALLOC_TLS_CERT", "GPUALLOC_TLS_KEY"))
    (cert_volume, cert_file), (key_volume, key_file) = (
        mounted_file(workload, container, cert),
        mounted_file(workload, container, key),
    )
    assert (cert_file, key_file) == ("tls.crt", "tls.key")  # cert-manager's names
    assert cert_volume == key_volume
    certificate = certificates()[cert_volume["secret"]["secretName"]]
    service = f"gpualloc-{component_name}"
    namespace = kustomization(BASE)["namespace"]
    assert {service, f"{service}.{namespace}.svc"} <= set(certificate["spec"]["dnsNames"])
    assert "server auth" in certificate["spec"]["usages"]
    # renewed well before it ends, with a new key each time (what docs/deploy.md says)
    hours = {k: int(certificate["spec"][k].removesuffix("h")) for k in ("duration", "renewBefore")}
    assert 0 < hours["renewBefore"] < hours["duration"]
    assert certificate["spec"]["privateKey"]["rotationPolicy"] == "Always"
    issuer = by_kind("Issuer")[certificate["spec"]["issuerRef"]["name"]]
    ca_certificate = certificates()[issuer["spec"]["ca"]["secretName"]]
    assert ca_certificate["spec"]["isCA"] is True


def test_the_allocator_requires_client_certificates_from_the_ca() -> None:
    workload, container = server("allocator")
    volume, file = mounted_file(workload, container, env_value(container, "GPUALLOC_TLS_CLIENT_CA"))
    assert file == "ca.crt"  # the CA Issuer's certificate, which cert-manager writes beside
    assert volume["secret"]["secretName"] == "gpualloc-allocator-tls"


def access_policy() -> dict[str, Any]:
    (policy,) = yaml.safe_load_all(by_kind("ConfigMap")["gpualloc-policy"]["data"]["policy.yaml"])
    assert (policy["apiVersion"], policy["kind"]) == ("gpualloc.dev/v1alpha1", "AccessPolicy")
    assert isinstance(policy, dict)
    return policy


def jwt_subjects(role: str) -> set[str]:
    return {
        subject["name"]
        for binding in access_policy()["spec"]["bindings"]
        if role in binding["roles"]
        for subject in binding["subjects"]
        if subject["kind"] == "JWT"
    }


@pytest.mark.parametrize("component_name", [pytest.param(c, id=c) for c in SERVERS])
def test_servers_load_the_access_policy_and_the_jwks_it_names(component_name: str) -> None:
    workload, container = server(component_name)
    volume, file = mounted_file(workload, container, env_value(container, "GPUALLOC_AUTH_POLICY"))
    assert volume["configMap"]["name"] == "gpualloc-policy"
    assert file in by_kind("ConfigMap")["gpualloc-policy"]["data"]
    for jwt in access_policy()["spec"]["authentication"]["jwt"]:
        jwks, _ = mounted_file(workload, container, jwt["jwksFile"])
        assert jwks["configMap"].get("optional", False) is False  # no JWKS: no start, no guess


def service_account_subject(workload: dict[str, Any]) -> str:
    account = workload["spec"]["template"]["spec"]["serviceAccountName"]
    return f"system:serviceaccount:{kustomization(BASE)['namespace']}:{account}"


@pytest.mark.parametrize(
    ("workload_name", "role"),
    [
        pytest.param("gpualloc-agent", "agent", id="agent-reports-with-its-token"),
        pytest.param("gpualloc-allocator", "reader", id="allocator-reads-with-its-token"),
    ],
)
def test_inventory_clients_present_a_projected_token_the_policy_binds(
    workload_name: str, role: str
) -> None:
    (workload,) = [w for w in workloads() if w["metadata"]["name"] == workload_name]
    (container,) = [c for c in containers(workload) if c["image"] == IMAGE]
    volume, file = mounted_file(
        workload, container, env_value(container, "GPUALLOC_CLIENT_TOKEN_FILE")
    )
    (source,) = volume["projected"]["sources"]
    token = source["serviceAccountToken"]
    assert token["path"] == file
    audiences = {
        a for j in access_policy()["spec"]["authentication"]["jwt"] for a in j["audiences"]
    }
    assert token["audience"] in audiences  # never the API server's: useless against it
    assert service_account_subject(workload) in jwt_subjects(role)
    # and it checks the inventory's certificate against the CA, seeing only the CA's certificate:
    # ca.crt beside its own certificate, or that one key of the CA's Secret (never its tls.key)
    ca, ca_file = mounted_file(workload, container, env_value(container, "GPUALLOC_CLIENT_TLS_CA"))
    inventory_ca = by_kind("Issuer")[
        certificates()["gpualloc-inventory-tls"]["spec"]["issuerRef"]["name"]
    ]
    ca_secret = inventory_ca["spec"]["ca"]["secretName"]
    if ca["secret"]["secretName"] == ca_secret:
        assert ca["secret"]["items"] == [{"key": "ca.crt", "path": ca_file}]
    else:
        own = certificates()[ca["secret"]["secretName"]]
        assert (
            own["spec"]["issuerRef"]
            == certificates()["gpualloc-inventory-tls"]["spec"]["issuerRef"]
        )
        assert ca_file == "ca.crt"


def test_the_access_policy_is_well_formed() -> None:
    check_access_policy(access_policy())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        pytest.param(lambda p: p["spec"]["bindings"][0].update(role=["x"]),
                     r"spec.bindings\[0\].role: unknown field", id="misspelt-field"),
        pytest.param(lambda p: p["spec"]["bindings"][0].update(roles=["root"]),
                     "unknown role 'root'", id="unknown-role"),
        pytest.param(lambda p: p["spec"]["bindings"][0]["subjects"][0].pop("issuer"),
                     r"subjects\[0\].issuer: Required value", id="jwt-subject-without-issuer"),
        pytest.param(lambda p: p["spec"]["bindings"][0]["subjects"][0].update(kind="SAN"),
                     "unknown subject kind 'SAN'", id="unknown-subject-kind"),
        pytest.param(lambda p: p["spec"]["bindings"][0].update(tenant="nobody"),
                     "unknown tenant 'nobody'", id="undeclared-tenant"),
        pytest.param(lambda p: p["spec"]["bindings"][0]["subjects"][0].update(issuer="https://x"),
                     "is not in spec.authentication.jwt",
                     id="jwt-subject-of-an-unconfigured-issuer"),
    ],
)  # fmt: skip
def test_the_access_policy_check_catches_typos(edit: Any, message: str) -> None:
    policy = copy.deepcopy(access_policy())
    assert policy["spec"]["bindings"][0]["subjects"][0]["kind"] == "JWT"
    edit(policy)
    with pytest.raises((pytest.fail.Exception, AssertionError), match=message):
        check_access_policy(policy)


def test_the_policy_has_an_admin_and_binds_only_known_roles() -> None:
    roles = {"agent", "inventory-admin", "scheduler", "reader", "admin"}
    bindings = access_policy()["spec"]["bindings"]
    assert all(set(b["roles"]) <= roles for b in bindings)
    assert any("admin" in b["roles"] for b in bindings)
    tenants = {t["name"] for t in access_policy()["spec"]["tenants"]}
    assert all(b["tenant"] in tenants for b in bindings if "tenant" in b)
    admin = by_kind("ServiceAccount")["gpualloc-admin"]
    assert f"system:serviceaccount:gpualloc:{admin['metadata']['name']}" in jwt_subjects("admin")


def ingress_ports(policy: dict[str, Any]) -> dict[int, list[Any]]:
    """Port -> the `from` of the rule admitting it (None: from anywhere)."""
    ports: dict[int, list[Any]] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port["protocol"] == "TCP"
            ports[port["port"]] = rule.get("from")
    return ports


@pytest.mark.parametrize(
    ("name", "port"),
    [
        pytest.param("gpualloc-allocator", ALLOCATOR_PORT, id="allocator"),
        pytest.param("gpualloc-inventory", INVENTORY_PORT, id="inventory"),
    ],
)
def test_servers_admit_only_their_clients_and_the_health_port_from_anywhere(
    name: str, port: int
) -> None:
    policy = by_kind("NetworkPolicy")[name]
    assert policy["spec"]["podSelector"] == by_kind("Deployment")[name]["spec"]["selector"]
    ports = ingress_ports(policy)
    assert set(ports) == {port, HEALTH_PORT, METRICS_PORT}
    assert ports[HEALTH_PORT] is None
    assert ports[port], "the gRPC port must name who may connect"
    # the metrics name tenants: only Prometheus' namespace (by the label nobody can forge)
    (peer,) = ports[METRICS_PORT]
    assert peer == {
        "namespaceSelector": {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}
            ]
        }
    }


def test_the_inventory_admits_only_the_allocators_and_the_agents() -> None:
    peers = ingress_ports(by_kind("NetworkPolicy")["gpualloc-inventory"])[INVENTORY_PORT]
    assert [p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in peers] == [
        "allocator",
        "agent",
    ]
    assert all("namespaceSelector" not in p for p in peers)  # this namespace only


def test_redis_admits_only_the_servers() -> None:
    ports = ingress_ports(by_kind("NetworkPolicy")["gpualloc-redis"])
    assert list(ports) == [6379]
    peers = [p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in ports[6379]]
    assert peers == ["allocator", "inventory"]


def allocator_client_namespaces(policy: dict[str, Any]) -> list[str]:
    (peer,) = ingress_ports(policy)[ALLOCATOR_PORT]
    assert peer["podSelector"] == {"matchLabels": {"gpualloc.dev/client": "true"}}
    (expression,) = peer["namespaceSelector"]["matchExpressions"]
    # the name label is set by the API server and cannot be put on another namespace
    assert (expression["key"], expression["operator"]) == ("kubernetes.io/metadata.name", "In")
    values: list[str] = expression["values"]
    return values


def test_the_allocator_admits_labelled_clients_of_the_named_namespaces_only() -> None:
    assert allocator_client_namespaces(by_kind("NetworkPolicy")["gpualloc-allocator"]) == [
        "gpualloc"
    ]
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render(PRODUCTION)}
    production = objects[("NetworkPolicy", "gpualloc-allocator")]
    assert allocator_client_namespaces(production) == ["gpualloc", "slurm", "kueue-system"]


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
        validate(obj)
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
    # the allocator is the instrumented process (services/allocator/app/telemetry.py)
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


# --- deploy/k8s/kueue: the Kueue admission check as a client of both servers ----------------------

KUEUE = K8S / "kueue"


def kueue_objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (doc["kind"], doc["metadata"]["name"]): doc
        for name in kustomization(KUEUE)["resources"]
        for doc in yaml_documents(KUEUE / name)
    }


def test_kueue_workload_and_certificate_validate_against_their_schemas() -> None:
    objects = kueue_objects()
    validate(objects[("Deployment", "gpualloc-kueue")])
    validate(objects[("Certificate", "gpualloc-kueue")])


def test_kueue_presents_a_certificate_and_a_token_the_policy_binds_alike() -> None:
    objects = kueue_objects()
    workload = objects[("Deployment", "gpualloc-kueue")]
    (container,) = containers(workload)
    cert, key, ca = (
        mounted_file(workload, container, env_value(container, f"GPUALLOC_CLIENT_TLS_{n}"))
        for n in ("CERT", "KEY", "CA")
    )
    assert [f for _, f in (cert, key, ca)] == ["tls.crt", "tls.key", "ca.crt"]
    certificate = objects[("Certificate", "gpualloc-kueue")]
    assert cert[0]["secret"]["secretName"] == certificate["spec"]["secretName"]
    assert "client auth" in certificate["spec"]["usages"]
    assert certificate["spec"]["issuerRef"]["name"] in by_kind("Issuer")  # the base's CA
    token, file = mounted_file(
        workload, container, env_value(container, "GPUALLOC_CLIENT_TOKEN_FILE")
    )
    (source,) = token["projected"]["sources"]
    assert (source["serviceAccountToken"]["audience"], source["serviceAccountToken"]["path"]) == (
        "gpualloc",
        file,
    )
    # whichever of the two the server takes as its identity, it lands in the same binding
    (spiffe,) = certificate["spec"]["uris"]
    account = workload["spec"]["template"]["spec"]["serviceAccountName"]
    subjects = {(s["kind"], s["name"]) for s in kueue_binding()["subjects"]}
    assert subjects == {("SPIFFE", spiffe), ("JWT", f"system:serviceaccount:gpualloc:{account}")}
    assert {"scheduler", "reader"} <= set(kueue_binding()["roles"])  # Allocate; GetInventory
    assert kueue_binding()["actFor"] == ["kueue/*"]  # services/bridges/placing.py: kueue_owner


def kueue_binding() -> dict[str, Any]:
    (binding,) = [b for b in access_policy()["spec"]["bindings"] if b["name"] == "kueue-admission"]
    assert isinstance(binding, dict)
    return binding


def test_the_web_view_is_off_in_every_manifest() -> None:
    """The web view has no login (docs/operations.md, "Web view"): a cluster turns it on
    deliberately, on loopback behind `kubectl port-forward`, never by default."""
    for path in sorted(K8S.rglob("*.yaml")):
        text = path.read_text()
        assert "GPUALLOC_WEB_LISTEN" not in text and "--web-listen" not in text, path
