"""Client settings: retry classification, backoff, TLS config, environment."""

from __future__ import annotations

import grpc
import pytest

from services.client.calls import is_retryable
from services.client.config import DEFAULT_TARGET, ClientSettings, RetryPolicy, TlsConfig
from services.common.errors import InvalidArgument


@pytest.mark.parametrize(
    ("code", "read", "expected"),
    [
        pytest.param(grpc.StatusCode.UNAVAILABLE, False, True, id="unavailable-write"),
        pytest.param(grpc.StatusCode.UNAVAILABLE, True, True, id="unavailable-read"),
        pytest.param(grpc.StatusCode.DEADLINE_EXCEEDED, True, True, id="deadline-read"),
        pytest.param(
            grpc.StatusCode.DEADLINE_EXCEEDED, False, False, id="deadline-write-may-have-happened"
        ),
        pytest.param(grpc.StatusCode.ABORTED, False, False, id="aborted-never"),
        pytest.param(grpc.StatusCode.ABORTED, True, False, id="aborted-never-even-for-reads"),
        pytest.param(grpc.StatusCode.INVALID_ARGUMENT, True, False, id="invalid-argument-never"),
        pytest.param(grpc.StatusCode.INTERNAL, True, False, id="internal-never"),
    ],
)
def test_which_codes_are_retried(code, read, expected):
    assert is_retryable(code, read=read) is expected


@pytest.mark.parametrize(
    ("retry", "random", "expected"),
    [
        pytest.param(1, 0.5, 0.1, id="first-retry-initial-backoff"),
        pytest.param(2, 0.5, 0.2, id="doubles"),
        pytest.param(3, 0.5, 0.4, id="doubles-again"),
        pytest.param(10, 0.5, 2.0, id="capped"),
        pytest.param(1, 0.0, 0.08, id="jitter-low"),
        pytest.param(1, 1.0, 0.12, id="jitter-high"),
    ],
)
def test_backoff_is_exponential_with_jitter(retry, random, expected):
    assert RetryPolicy().delay(retry, lambda: random) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda: RetryPolicy(max_attempts=0), "retry.max_attempts", id="no-attempts"),
        pytest.param(lambda: RetryPolicy(jitter=2.0), "retry.jitter", id="jitter-over-one"),
        pytest.param(lambda: TlsConfig(client_certificate=b"x"), "tls", id="cert-without-key"),
    ],
)
def test_bad_settings_are_refused(make, message):
    with pytest.raises(InvalidArgument) as raised:
        make()
    assert raised.value.field_path == message


@pytest.mark.parametrize(
    ("environ", "target", "inventory", "deadline", "attempts"),
    [
        pytest.param({}, DEFAULT_TARGET, DEFAULT_TARGET, 10.0, 4, id="defaults"),
        pytest.param(
            {
                "GPUALLOC_ALLOCATOR_ADDR": "alloc:50051",
                "GPUALLOC_INVENTORY_ADDR": "inv:50052",
                "GPUALLOC_CLIENT_DEADLINE": "1500ms",
                "GPUALLOC_CLIENT_RETRIES": "2",
            },
            "alloc:50051",
            "inv:50052",
            1.5,
            2,
            id="all-set",
        ),
        pytest.param(
            {"GPUALLOC_ALLOCATOR_ADDR": "alloc:50051"},
            "alloc:50051",
            "alloc:50051",
            10.0,
            4,
            id="inventory-defaults-to-allocator",
        ),
    ],
)
def test_settings_from_the_environment(environ, target, inventory, deadline, attempts):
    settings = ClientSettings.from_env(environ)
    assert (settings.target, settings.inventory) == (target, inventory)
    assert settings.deadline_seconds == deadline
    assert settings.retry.max_attempts == attempts
    assert settings.tls is None


def test_tls_files_turn_tls_on(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    settings = ClientSettings.from_env(
        {"GPUALLOC_CLIENT_TLS_CA": str(ca), "GPUALLOC_CLIENT_TLS_SERVER_NAME": "allocator"}
    )
    assert settings.tls == TlsConfig(root_certificates=ca.read_bytes(), server_name="allocator")


def test_a_bad_variable_is_named():
    with pytest.raises(InvalidArgument) as raised:
        ClientSettings.from_env({"GPUALLOC_CLIENT_RETRIES": "many"})
    assert raised.value.field_path == "GPUALLOC_CLIENT_RETRIES"
