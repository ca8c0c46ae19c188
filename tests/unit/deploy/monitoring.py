"""deploy/k8s/monitoring: the Prometheus Operator objects and the Grafana dashboard, read offline.

The operator's CRDs are not vendored, so PodMonitor and PrometheusRule are checked against a
strict subset of their schemas (monitoring.coreos.com/v1: only the fields we use, by the
operator's names and types; a misspelt field the operator would drop is an error), as
certmanager.py does for cert-manager. The PromQL of the alerts and panels is read for the metric
names and label matchers it uses, which tests/integration/test_metrics_endpoint.py checks
against a real server's /metrics; `promql_problems` catches what a reader can see without a
PromQL parser (unbalanced brackets and quotes, rate() over a gauge, a quantile of no histogram).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.unit.deploy.certmanager import custom_object
from tests.unit.deploy.manifests import ROOT, yaml_documents

MONITORING = ROOT / "deploy" / "k8s" / "monitoring"
DASHBOARD = MONITORING / "gpualloc.json"
API_VERSION = "monitoring.coreos.com/v1"
SEVERITIES = ("critical", "warning", "info")
# Labels Prometheus adds to every series of a PodMonitor target (not on the server's /metrics).
TARGET_LABELS = frozenset({"namespace", "pod", "container", "endpoint", "instance", "job"})

_DURATION = {"type": "string", "pattern": r"^([0-9]+(ms|s|m|h|d|w|y))+$"}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_EXPRESSIONS = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "required": ["key", "operator", "values"],
        "properties": {
            "key": {"type": "string"},
            "operator": {"enum": ["In", "NotIn"]},
            "values": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        },
        "additionalProperties": False,
    },
}


def _object(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return custom_object(API_VERSION, kind, spec)


POD_MONITOR = _object(
    "PodMonitor",
    {
        "type": "object",
        "required": ["selector", "podMetricsEndpoints"],
        "properties": {
            "selector": {
                "type": "object",
                "properties": {"matchLabels": _LABELS, "matchExpressions": _EXPRESSIONS},
                "additionalProperties": False,
            },
            "podMetricsEndpoints": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["port"],
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string", "pattern": "^/"},
                        "interval": _DURATION,
                    },
                    "additionalProperties": False,
                },
            },
        },
        "additionalProperties": False,
    },
)

PROMETHEUS_RULE = _object(
    "PrometheusRule",
    {
        "type": "object",
        "required": ["groups"],
        "properties": {
            "groups": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["name", "rules"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "rules": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "type": "object",
                                "required": ["alert", "expr", "for", "labels", "annotations"],
                                "properties": {
                                    "alert": {"type": "string", "pattern": "^Gpualloc[A-Za-z]+$"},
                                    "expr": {"type": "string", "minLength": 1},
                                    "for": _DURATION,
                                    "labels": {
                                        "type": "object",
                                        "required": ["severity"],
                                        "properties": {"severity": {"enum": list(SEVERITIES)}},
                                        "additionalProperties": {"type": "string"},
                                    },
                                    "annotations": {
                                        "type": "object",
                                        "required": ["summary", "description"],
                                        "properties": {
                                            "summary": {"type": "string"},
                                            "description": {"type": "string"},
                                        },
                                        "additionalProperties": False,
                                    },
                                },
                                "additionalProperties": False,
                            },
                        },
                    },
                    "additionalProperties": False,
                },
            }
        },
        "additionalProperties": False,
    },
)

SCHEMAS = {"PodMonitor": POD_MONITOR, "PrometheusRule": PROMETHEUS_RULE}


def is_prometheus_operator(obj: dict[str, Any]) -> bool:
    return obj.get("apiVersion") == API_VERSION


def validate_prometheus_operator(obj: dict[str, Any]) -> None:
    """Fail the test with the first field the operator's CRD would reject or drop."""
    jsonschema = pytest.importorskip("jsonschema")
    errors = sorted(
        jsonschema.Draft202012Validator(SCHEMAS[obj["kind"]]).iter_errors(obj),
        key=lambda e: list(e.path),
    )
    if errors:
        where = ".".join(str(part) for part in errors[0].path)
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {where}: {errors[0].message}")


def monitoring_object(kind: str) -> dict[str, Any]:
    (found,) = [
        doc
        for path in sorted(MONITORING.glob("*.yaml"))
        for doc in yaml_documents(path)
        if doc.get("kind") == kind
    ]
    assert isinstance(found, dict)
    return found


def alerts() -> list[dict[str, Any]]:
    rules = monitoring_object("PrometheusRule")
    return [rule for group in rules["spec"]["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(Path(DASHBOARD).read_text(encoding="utf-8"))
    return loaded


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target, and the templating queries."""
    found = [
        (panel["title"], target["expr"])
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
    ]
    for variable in dashboard()["templating"]["list"]:
        definition = variable.get("definition", "")
        inner = re.fullmatch(r"label_values\((.*), *\w+\)", definition)
        if inner:
            found.append((f"${variable['name']}", inner.group(1)))
    return found


def every_expr() -> list[tuple[str, str]]:
    """(where, PromQL) of every alert and dashboard query."""
    return [(rule["alert"], rule["expr"]) for rule in alerts()] + dashboard_exprs()


_METRIC = re.compile(r"\b(gpualloc_[a-z0-9_]+)\b(\{[^}]*\})?")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*\"")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def selectors(expr: str) -> list[tuple[str, frozenset[str]]]:
    """(metric name, label names matched) of every gpualloc series selector in `expr`."""
    return [
        (match.group(1), frozenset(name for name, _ in _MATCHER.findall(match.group(2) or "")))
        for match in _METRIC.finditer(expr)
    ]


def promql_problems(expr: str) -> list[str]:
    """What is visibly wrong with `expr` (no PromQL parser here)."""
    problems = []
    bare = _STRING.sub('""', expr)
    if bare.count('"') % 2:
        problems.append("an unclosed string")
    for opening, closing in ("()", "[]", "{}"):
        depth = 0
        for char in bare:
            depth += (char == opening) - (char == closing)
            if depth < 0:
                break
        if depth != 0:
            problems.append(f"unbalanced {opening}{closing}")
    for function, argument in re.findall(r"\b(rate|increase|irate)\(\s*([a-z0-9_]+)", bare):
        if not argument.endswith(("_total", "_count", "_bucket", "_sum")):
            problems.append(f"{function}() of {argument}, which is no counter")
    for quantile in re.finditer(r"histogram_quantile\(", bare):
        if "_bucket" not in bare[quantile.end() :]:
            problems.append("histogram_quantile() of no _bucket series")
    for range_ in re.findall(r"\[([^\]]*)\]", bare):
        if not re.fullmatch(r"(\$__rate_interval|([0-9]+(ms|s|m|h|d|w|y))+)", range_):
            problems.append(f"range [{range_}] is no duration")
    return problems


def grouping_labels(expr: str) -> frozenset[str]:
    """The labels of every `by (...)` and `without (...)` clause of `expr`."""
    return frozenset(
        label.strip()
        for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
        for label in clause.split(",")
        if label.strip()
    )
