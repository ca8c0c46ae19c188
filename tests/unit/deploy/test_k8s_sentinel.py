"""deploy/k8s/overlays/sentinel: the Sentinel layout renders to valid Kubernetes 1.34 objects, and
its parts agree: the store URL names the Sentinel pods and the service they monitor, the quorum
is a majority, WAIT fits the replicas and the timeouts, the policies let replication and
failover through, the start scripts parse. (Running them needs a Kubernetes cluster: the
Sentinel behaviour itself is tested on loopback, tests/contract/test_redis_layouts.py.)"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from services.allocator.config import AllocatorSettings
from services.common.redis_layout import parse_layout
from tests.unit.deploy.certmanager import is_cert_manager, validate_cert_manager
from tests.unit.deploy.manifests import validate_kubernetes, yaml_documents
from tests.unit.deploy.test_k8s import K8S, WORKLOAD_KINDS, base_objects, kustomization, render

SENTINEL = K8S / "overlays" / "sentinel"


def objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in render(SENTINEL)}


def scripts() -> dict[str, str]:
    (config_map,) = [
        d for d in yaml_documents(SENTINEL / "sentinel.yaml") if d["kind"] == "ConfigMap"
    ]
    data: dict[str, str] = config_map["data"]
    return data


def test_rendered_output_is_valid_namespaced_and_labelled() -> None:
    for obj in objects().values():
        if is_cert_manager(obj):
            validate_cert_manager(obj)
            continue
        validate_kubernetes(obj)
        if obj["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding"}:
            assert obj["metadata"]["namespace"] == "gpualloc", obj["metadata"]["name"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpualloc"


def test_patches_target_objects_of_the_base() -> None:
    base = {(o["kind"], o["metadata"]["name"]) for o in base_objects()}
    for patch in kustomization(SENTINEL)["patches"]:
        for doc in yaml_documents(SENTINEL / patch["path"]):
            assert (doc["kind"], doc["metadata"]["name"]) in base, patch["path"]


def test_the_url_names_every_sentinel_pod_and_the_monitored_service() -> None:
    found = objects()
    urls = {server_env(found, name)["GPUALLOC_REDIS_URL"] for name in ("allocator", "inventory")}
    (url,) = urls  # both servers follow the same Sentinels
    assert url.startswith("redis+sentinel://:$(REDIS_PASSWORD)@")  # the base's password kept
    layout = parse_layout(url.replace("$(REDIS_PASSWORD)", "secret"))
    assert layout.password == "secret"
    sentinels = found[("StatefulSet", "gpualloc-sentinel")]
    service = found[("Service", "gpualloc-sentinel")]
    assert layout.kind == "sentinel"
    assert sentinels["spec"]["serviceName"] == service["metadata"]["name"]
    replicas = sentinels["spec"]["replicas"]
    port = service["spec"]["ports"][0]["port"]
    assert layout.nodes == tuple(
        (f"gpualloc-sentinel-{i}.gpualloc-sentinel", port) for i in range(replicas)
    )
    monitor = re.search(r"sentinel monitor (\S+) (\S+) 6379 (\d+)", scripts()["sentinel.sh"])
    assert monitor is not None
    name, _, quorum = monitor.groups()
    assert name == layout.service
    assert f"get-master-addr-by-name {name}" in scripts()["primary.sh"]
    assert replicas // 2 < int(quorum) <= replicas  # a majority decides a failover


def server_env(found: dict[tuple[str, str], dict[str, Any]], name: str) -> dict[str, str]:
    deployment = found[("Deployment", f"gpualloc-{name}")]
    (container,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name
    ]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_the_redis_and_sentinel_pods_keep_the_password() -> None:
    found = objects()
    redis = scripts()["redis.sh"]
    assert '--requirepass "$REDIS_PASSWORD"' in redis and '--masterauth "$REDIS_PASSWORD"' in redis
    assert "sentinel auth-pass gpualloc $REDIS_PASSWORD" in scripts()["sentinel.sh"]
    for kind, name in (("StatefulSet", "gpualloc-redis"), ("StatefulSet", "gpualloc-sentinel")):
        (container,) = found[(kind, name)]["spec"]["template"]["spec"]["containers"]
        secret = {
            e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
            for e in container.get("env", [])
            if "valueFrom" in e
        }
        assert secret.get("REDIS_PASSWORD") == "gpualloc-redis", name


def test_wait_fits_the_replicas_and_the_socket_timeout() -> None:
    found = objects()
    settings = AllocatorSettings.from_env(found[("ConfigMap", "gpualloc-config")]["data"])
    redis = found[("StatefulSet", "gpualloc-redis")]
    assert 1 <= settings.redis_wait_replicas <= redis["spec"]["replicas"] - 1
    assert settings.redis_wait_timeout < settings.redis_timeout


def _ingress_components(policy: dict[str, Any]) -> tuple[set[str], set[int]]:
    (rule,) = policy["spec"]["ingress"]
    components = {
        p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in rule["from"]
    }
    return components, {p["port"] for p in rule["ports"]}


@pytest.mark.parametrize(
    ("policy", "components", "port"),
    [
        pytest.param(
            "gpualloc-redis", {"allocator", "inventory", "redis", "sentinel"}, 6379, id="redis"
        ),
        pytest.param(
            "gpualloc-sentinel",
            {"allocator", "inventory", "redis", "sentinel"},
            26379,
            id="sentinel",
        ),
    ],
)
def test_policies_let_clients_replication_and_failover_through(
    policy: str, components: set[str], port: int
) -> None:
    assert _ingress_components(objects()[("NetworkPolicy", policy)]) == (components, {port})


def test_redis_and_sentinel_pods_run_the_scripts_unprivileged() -> None:
    found = objects()
    names = set(scripts())
    for name in ("gpualloc-redis", "gpualloc-sentinel"):
        workload = found[("StatefulSet", name)]
        assert workload["kind"] in WORKLOAD_KINDS
        pod = workload["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["command"][0] == "sh"
        assert Path(container["command"][1]).name in names
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert "memory" in container["resources"]["limits"]


@pytest.mark.parametrize("name", ["primary.sh", "redis.sh", "sentinel.sh"])
def test_scripts_are_valid_shell(name: str, tmp_path: Path) -> None:
    shell = shutil.which("sh")
    assert shell is not None
    path = tmp_path / name
    path.write_text(scripts()[name])
    done = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
