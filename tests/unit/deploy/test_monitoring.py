"""deploy/k8s/monitoring offline: the PodMonitor scrapes the servers' metrics ports, the alerts and
the Grafana dashboard are well formed, and their PromQL has no visible mistake.

That every metric and label they name is one a real server exports is shown against a running
`gpualloc serve --demo` in tests/integration/test_metrics_endpoint.py.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deploy.monitoring import (
    DASHBOARD,
    MONITORING,
    alerts,
    dashboard,
    every_expr,
    monitoring_object,
    promql_problems,
    validate_prometheus_operator,
)
from tests.unit.deploy.test_k8s import METRICS_PORT, by_kind, containers, kustomization, render

GRID_COLUMNS = 24
PANEL_TYPES = {"row", "stat", "timeseries", "table", "bargauge", "gauge"}


@pytest.mark.parametrize("kind", ["PodMonitor", "PrometheusRule"])
def test_operator_objects_validate_against_their_schema(kind: str) -> None:
    validate_prometheus_operator(monitoring_object(kind))


def first_rule(rules: dict[str, Any]) -> dict[str, Any]:
    rule: dict[str, Any] = rules["spec"]["groups"][0]["rules"][0]
    return rule


def first_endpoint(monitor: dict[str, Any]) -> dict[str, Any]:
    endpoint: dict[str, Any] = monitor["spec"]["podMetricsEndpoints"][0]
    return endpoint


@pytest.mark.parametrize(
    ("kind", "edit"),
    [
        pytest.param(
            "PrometheusRule", lambda o: first_rule(o).update(fro="5m"), id="misspelt-field"
        ),
        pytest.param(
            "PrometheusRule", lambda o: first_rule(o).update({"for": "5 min"}), id="bad-duration"
        ),
        pytest.param(
            "PrometheusRule",
            lambda o: first_rule(o)["labels"].update(severity="page"),
            id="unknown-severity",
        ),
        pytest.param(
            "PodMonitor",
            lambda o: first_endpoint(o).update(targetPort=9464),
            id="podmonitor-unknown-field",
        ),
    ],
)
def test_the_operator_schemas_reject_what_the_operator_would_drop(kind: str, edit: Any) -> None:
    broken = copy.deepcopy(monitoring_object(kind))
    edit(broken)
    with pytest.raises(pytest.fail.Exception):
        validate_prometheus_operator(broken)


def test_the_pod_monitor_scrapes_both_servers_on_their_metrics_port() -> None:
    monitor = monitoring_object("PodMonitor")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    expressions = {
        e["key"]: set(e["values"]) for e in monitor["spec"]["selector"]["matchExpressions"]
    }
    assert expressions == {
        "app.kubernetes.io/name": {"gpualloc"},
        "app.kubernetes.io/component": {"allocator", "inventory"},
    }
    for name in ("gpualloc-allocator", "gpualloc-inventory"):
        (container,) = containers(by_kind("Deployment")[name])
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports[endpoint["port"]] == METRICS_PORT
    assert endpoint["path"] == "/metrics"


def test_alert_names_are_unique_and_say_what_to_look_at() -> None:
    names = [rule["alert"] for rule in alerts()]
    assert len(names) == len(set(names))
    for rule in alerts():
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


@pytest.mark.parametrize(("where", "expr"), [pytest.param(w, e, id=w) for w, e in every_expr()])
def test_promql_has_no_visible_mistake(where: str, expr: str) -> None:
    assert promql_problems(expr) == [], where


def test_promtool_checks_the_alert_rules(tmp_path: Path) -> None:
    """Prometheus' own parser on the PrometheusRule's groups (as the Operator hands them to
    Prometheus), so an expression only Prometheus would reject is caught too."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: apt-get install prometheus (.ci/run installs it)")
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        yaml.safe_dump({"groups": monitoring_object("PrometheusRule")["spec"]["groups"]})
    )
    checked = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in checked.stdout


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        pytest.param("sum(rate(gpualloc_fleet_gpus[5m]))", "no counter", id="rate-of-a-gauge"),
        pytest.param('max(gpualloc_fleet_gpus{state="free"}', "unbalanced", id="unbalanced"),
        pytest.param("histogram_quantile(0.9, x)", "_bucket", id="quantile-of-no-histogram"),
        pytest.param("rate(gpualloc_a_total[5 m])", "no duration", id="bad-range"),
    ],
)
def test_the_promql_check_catches_mistakes(expr: str, problem: str) -> None:
    assert any(problem in found for found in promql_problems(expr))


def test_the_dashboard_is_a_grafana_dashboard_with_a_datasource_variable() -> None:
    board = dashboard()
    assert board["uid"] and board["title"] and isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["type"] in PANEL_TYPES and panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids)), panel["title"]
        assert all(target["expr"].strip() for target in panel["targets"])


def test_dashboard_panels_fit_the_grid_without_overlapping() -> None:
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard()["panels"]:
        grid = panel["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= GRID_COLUMNS
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = panel["title"]


def test_the_kustomization_ships_the_dashboard_to_grafana_unchanged() -> None:
    spec = kustomization(MONITORING)
    for entry in spec["resources"]:
        assert (MONITORING / entry).exists(), entry
    objects = {o["kind"]: o for o in render(MONITORING)}
    config_map = objects["ConfigMap"]
    assert config_map["metadata"]["name"] == "gpualloc-dashboard"  # a stable name, no hash
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["gpualloc.json"]) == json.loads(DASHBOARD.read_text())
    for kind in ("PodMonitor", "PrometheusRule"):
        assert objects[kind]["metadata"]["namespace"] == "gpualloc"
        validate_prometheus_operator(objects[kind])
