"""docker-compose.yml: services run the project's own console scripts, ports and addresses agree
with the service defaults, and the health check the containers use really speaks gRPC health.

No Docker engine runs in CI, so the file is read as YAML; the health-check program is run for
real against a gRPC server started here.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from concurrent import futures
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.unit.deploy.manifests import (
    ALLOCATOR_PORT,
    ENV_PREFIXES,
    INVENTORY_PORT,
    ROOT,
    optional_module,
    project_scripts,
    yaml_documents,
    yaml_files,
)

COMPOSE = ROOT / "docker-compose.yml"
IMAGE_ENTRYPOINT = ["gpualloc"]  # the Dockerfile's ENTRYPOINT (test_dockerfile checks it)
SERVER_PORTS = {"allocator": ALLOCATOR_PORT, "inventory": INVENTORY_PORT}


def compose() -> dict[str, Any]:
    (doc,) = yaml_documents(COMPOSE)
    assert isinstance(doc, dict)
    return doc


def services() -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose()["services"]
    return result


def gpualloc_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services().items() if str(s.get("image", "")).startswith("gpualloc:")}


def argv(service: dict[str, Any]) -> list[str]:
    return [*service.get("entrypoint", IMAGE_ENTRYPOINT), *service.get("command", [])]


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    assert isinstance(env, dict), "environment must be a mapping"
    return {str(k): str(v) for k, v in env.items()}


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_the_layout_has_redis_inventory_allocator_seed_and_optional_collector() -> None:
    assert set(services()) == {"redis", "inventory", "allocator", "seed", "otel-collector"}
    assert set(gpualloc_services()) == {"inventory", "allocator", "seed"}
    assert services()["otel-collector"]["profiles"] == ["otel"]


def test_every_gpualloc_service_uses_the_one_image_built_here() -> None:
    images = {s["image"] for s in gpualloc_services().values()}
    assert images == {"gpualloc:dev"}
    assert all(s["build"]["context"] == "." for s in gpualloc_services().values())


@pytest.mark.parametrize(
    ("name", "script"),
    [
        pytest.param("inventory", "gpualloc-inventory", id="inventory"),
        pytest.param("allocator", "gpualloc-allocator", id="allocator"),
        pytest.param("seed", "gpualloc", id="seed"),
    ],
)
def test_each_service_runs_a_console_script_of_the_project(name: str, script: str) -> None:
    command = argv(services()[name])
    assert command[0] == script
    assert command[0] in project_scripts()


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in ("inventory", "allocator")])
def test_servers_listen_publish_and_health_check_on_their_default_port(name: str) -> None:
    service = services()[name]
    port = SERVER_PORTS[name]
    assert environment(service)["GPUALLOC_LISTEN"] == f"0.0.0.0:{port}"
    assert service["ports"] == [f"127.0.0.1:{port}:{port}"]
    test = service["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"] and test[-1] == str(port)


def test_allocator_reaches_inventory_and_redis_by_service_name() -> None:
    env = environment(services()["allocator"])
    host, _, port = env["GPUALLOC_INVENTORY_ADDR"].partition(":")
    assert host in services() and int(port) == INVENTORY_PORT
    redis_url = urlsplit(env["GPUALLOC_REDIS_URL"])
    assert (redis_url.scheme, redis_url.hostname, redis_url.port) == ("redis", "redis", 6379)
    assert redis_url.path == "/0"


def test_redis_keeps_an_append_only_file_on_a_volume() -> None:
    redis = services()["redis"]
    assert redis["image"].startswith("redis:7")
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert "redis-data:/data" in redis["volumes"]
    assert "redis-data" in compose()["volumes"]


def test_seed_applies_the_examples_to_the_inventory_once() -> None:
    seed = services()["seed"]
    command = argv(seed)
    assert command[:2] == ["gpualloc", "apply"]
    assert command[command.index("--inventory") + 1] == f"inventory:{INVENTORY_PORT}"
    assert "./examples:/examples:ro" in seed["volumes"]
    applied = [command[i + 1] for i, arg in enumerate(command) if arg == "-f"]
    assert applied and all((ROOT / p.lstrip("/")).exists() for p in applied), applied
    assert seed["restart"] == "no"
    assert seed["depends_on"]["inventory"]["condition"] == "service_healthy"


def test_dependencies_exist_and_wait_for_health() -> None:
    for name, service in services().items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services(), f"{name} depends on unknown {dependency}"
            assert "healthcheck" in services()[dependency]
            assert condition["condition"] == "service_healthy"


def test_containers_are_read_only_and_unprivileged() -> None:
    for name, service in gpualloc_services().items():
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name


def test_environment_names_are_gpualloc_or_opentelemetry_settings() -> None:
    for name, service in gpualloc_services().items():
        for variable in environment(service):
            assert variable.startswith(ENV_PREFIXES), f"{name}: {variable}"


# --- the health check, run for real ---------------------------------------------------------------


@pytest.fixture
def health_server() -> Any:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, port
    server.stop(grace=None).wait()


def run_health_check(port: int) -> int:
    test = services()["allocator"]["healthcheck"]["test"]
    program = test[3]
    done = subprocess.run(
        [sys.executable, "-c", program, str(port)], capture_output=True, timeout=30, check=False
    )
    return done.returncode


@pytest.mark.parametrize(
    ("status", "expected_exit"),
    [
        pytest.param(health_pb2.HealthCheckResponse.SERVING, 0, id="serving-is-healthy"),
        pytest.param(health_pb2.HealthCheckResponse.NOT_SERVING, 1, id="not-serving-is-unhealthy"),
    ],
)
def test_health_check_reports_the_servers_health(
    health_server: Any, status: Any, expected_exit: int
) -> None:
    servicer, port = health_server
    servicer.set("", status)
    assert run_health_check(port) == expected_exit


def test_health_check_fails_when_nothing_listens() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        unused = sock.getsockname()[1]
    assert run_health_check(unused) != 0


# --- settings the deploy files set are settings the code reads -----------------------------------


def deploy_setting_names() -> set[str]:
    """GPUALLOC_* names set by compose, the image and the Kubernetes manifests."""
    names = {"GPUALLOC_LISTEN", "GPUALLOC_LOG_FORMAT"}  # the Dockerfile's ENV
    for service in gpualloc_services().values():
        names |= set(environment(service))
    for path in yaml_files(ROOT / "deploy" / "k8s"):
        for doc in yaml_documents(path):
            if doc.get("kind") == "ConfigMap":
                names |= set(doc.get("data", {}))
            pod = doc.get("spec", {}).get("template", {}).get("spec", {})
            for container in pod.get("containers", []):
                # a variable only passed on as $(NAME) in args is the kubelet's business
                args = " ".join(container.get("args", []))
                names |= {
                    e["name"] for e in container.get("env", []) if f"$({e['name']})" not in args
                }
    return {n for n in names if n.startswith("GPUALLOC_")}


def test_every_gpualloc_setting_in_the_deploy_files_is_read_by_the_services() -> None:
    services_dir = ROOT / "services"
    mains = [services_dir / "allocator" / "config.py", services_dir / "inventory" / "config.py"]
    if not all(p.exists() for p in mains) or optional_module("services.common.config") is None:
        pytest.skip("the services' settings modules have not all landed yet")
    source = "\n".join(p.read_text(encoding="utf-8") for p in Path(services_dir).rglob("*.py"))
    unread = sorted(name for name in deploy_setting_names() if f'"{name}"' not in source)
    assert not unread, f"deploy files set settings no service reads: {unread}"
