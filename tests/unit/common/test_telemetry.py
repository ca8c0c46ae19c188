"""services/common/telemetry.py: which exporters the variables start, and the Prometheus endpoint
(a real HTTP server on a loopback port, read with urllib)."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator

import pytest

from services.common.errors import FailedPrecondition, InvalidArgument
from services.common.telemetry import Telemetry, configure_telemetry


@pytest.fixture
def telemetries() -> Iterator[list[Telemetry]]:
    made: list[Telemetry] = []
    yield made
    for telemetry in made:
        telemetry.shutdown()


def scrape(telemetry: Telemetry) -> str:
    url = f"http://127.0.0.1:{telemetry.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


@pytest.mark.parametrize(
    ("environ", "listen", "enabled", "endpoint"),
    [
        pytest.param({}, "", False, False, id="nothing-asked-nothing-started"),
        pytest.param({"OTEL_METRICS_EXPORTER": "none"}, "", False, False, id="none"),
        pytest.param({}, "127.0.0.1:0", True, True, id="an-address-starts-the-endpoint"),
        pytest.param(
            {"OTEL_METRICS_EXPORTER": "prometheus"}, "127.0.0.1:0", True, True, id="prometheus"
        ),
        pytest.param(
            {"OTEL_METRICS_EXPORTER": "console,prometheus"},
            "127.0.0.1:0",
            True,
            True,
            id="another-exporter-and-prometheus-together",
        ),
        pytest.param({"OTEL_METRICS_EXPORTER": "console"}, "", True, False, id="console-only"),
        pytest.param(
            {"OTEL_SDK_DISABLED": "true"}, "127.0.0.1:0", False, False, id="sdk-disabled-wins"
        ),
    ],
)
def test_exporters_from_the_variables(telemetries, environ, listen, enabled, endpoint):
    telemetry = configure_telemetry(environ, service_name="test", metrics_listen=listen)
    telemetries.append(telemetry)
    assert telemetry.enabled is enabled
    assert (telemetry.metrics_port is not None) is endpoint
    if endpoint:
        telemetry.observe("gpualloc.test.up", lambda: 1, description="up")
        assert 'service_name="test"' in scrape(telemetry)  # target_info, beside the gauge


def test_the_endpoint_serves_its_own_instruments_only(telemetries):
    first = configure_telemetry({}, service_name="a", metrics_listen="127.0.0.1:0")
    second = configure_telemetry({}, service_name="b", metrics_listen="127.0.0.1:0")
    telemetries.extend([first, second])
    first.observe("gpualloc.test.answer", lambda: 42, description="the answer")
    first.rpc_duration.record(3.0, {"rpc.method": "x/Y", "rpc.grpc.status_code": "OK"})
    text = scrape(first)
    assert "gpualloc_test_answer 42.0" in text
    assert 'gpualloc_rpc_server_duration_seconds_count{rpc_grpc_status_code="OK"' in text
    assert "gpualloc_test_answer" not in scrape(second)


def test_shutdown_closes_the_port(telemetries):
    telemetry = configure_telemetry({}, service_name="t", metrics_listen="127.0.0.1:0")
    port = telemetry.metrics_port
    telemetry.shutdown()
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize(
    ("environ", "listen", "field"),
    [
        pytest.param(
            {"OTEL_METRICS_EXPORTER": "prometheus,zipkin"},
            "",
            "OTEL_METRICS_EXPORTER",
            id="unknown-metrics-exporter",
        ),
        pytest.param(
            {"OTEL_TRACES_EXPORTER": "prometheus"},
            "",
            "OTEL_TRACES_EXPORTER",
            id="prometheus-is-no-trace-exporter",
        ),
        pytest.param({}, "9464", "GPUALLOC_METRICS_LISTEN", id="address-without-host"),
        pytest.param({}, "127.0.0.1:http", "GPUALLOC_METRICS_LISTEN", id="port-not-a-number"),
    ],
)
def test_bad_settings_are_named(environ, listen, field):
    with pytest.raises(InvalidArgument) as caught:
        configure_telemetry(environ, service_name="t", metrics_listen=listen)
    assert caught.value.field_path == field


def test_a_busy_port_is_a_precondition_naming_the_setting():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        with pytest.raises(FailedPrecondition) as caught:
            configure_telemetry({}, service_name="t", metrics_listen=address)
    assert "GPUALLOC_METRICS_LISTEN" in str(caught.value)
