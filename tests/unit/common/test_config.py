"""Environment readers accept what operators write and name the variable when they cannot."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from services.common.config import (
    SERVER_SETTINGS,
    ServerSettings,
    env_bool,
    env_bytes,
    env_choice,
    env_duration,
    env_float,
    env_int,
    env_str,
    format_duration,
    settings_table_markdown,
)
from services.common.errors import FieldViolation, InvalidArgument

NAME = "GPUALLOC_X"
Reader = Callable[[dict[str, str]], Any]

GOOD: list[Any] = [
    pytest.param(lambda e: env_str(e, NAME, "d"), None, "d", id="str-unset-is-default"),
    pytest.param(lambda e: env_str(e, NAME, "d"), "  ", "d", id="str-blank-is-default"),
    pytest.param(lambda e: env_str(e, NAME, "d"), " 0.0.0.0:1 ", "0.0.0.0:1", id="str-stripped"),
    pytest.param(lambda e: env_int(e, NAME, 1), "42", 42, id="int"),
    pytest.param(lambda e: env_int(e, NAME, 1), " -3 ", -3, id="int-negative-stripped"),
    pytest.param(lambda e: env_int(e, NAME, 1), "", 1, id="int-empty-is-default"),
    pytest.param(lambda e: env_int(e, NAME, 1, minimum=1, maximum=8), "8", 8, id="int-at-max"),
    pytest.param(lambda e: env_float(e, NAME, 1.0), "0.25", 0.25, id="float"),
    pytest.param(lambda e: env_float(e, NAME, 1.0), "1e3", 1000.0, id="float-exponent"),
    pytest.param(lambda e: env_bool(e, NAME, False), "TRUE", True, id="bool-true-any-case"),
    pytest.param(lambda e: env_bool(e, NAME, False), "yes", True, id="bool-yes"),
    pytest.param(lambda e: env_bool(e, NAME, True), "0", False, id="bool-zero"),
    pytest.param(lambda e: env_bool(e, NAME, True), "off", False, id="bool-off"),
    pytest.param(lambda e: env_choice(e, NAME, "a", ("json", "text")), "JSON", "json", id="choice"),
    pytest.param(lambda e: env_duration(e, NAME, 1.0), "30s", 30.0, id="duration-seconds"),
    pytest.param(lambda e: env_duration(e, NAME, 1.0), "500ms", 0.5, id="duration-millis"),
    pytest.param(lambda e: env_duration(e, NAME, 1.0), "1m30s", 90.0, id="duration-compound"),
    pytest.param(lambda e: env_duration(e, NAME, 1.0), "2h", 7200.0, id="duration-hours"),
    pytest.param(lambda e: env_duration(e, NAME, 1.0), "1.5s", 1.5, id="duration-fraction"),
    pytest.param(lambda e: env_duration(e, NAME, 1.0), "12", 12.0, id="duration-plain-number"),
    pytest.param(lambda e: env_duration(e, NAME, 1.0), "0", 0.0, id="duration-zero"),
    pytest.param(lambda e: env_bytes(e, NAME, 1), "16Mi", 16 * 2**20, id="bytes-binary-suffix"),
    pytest.param(lambda e: env_bytes(e, NAME, 1), "4M", 4_000_000, id="bytes-decimal-suffix"),
    pytest.param(lambda e: env_bytes(e, NAME, 1), "1.5Ki", 1536, id="bytes-fraction-whole"),
    pytest.param(lambda e: env_bytes(e, NAME, 1), "1048576", 1048576, id="bytes-plain"),
]


@pytest.mark.parametrize(("read", "value", "expected"), GOOD)
def test_reader_accepts(read: Reader, value: str | None, expected: Any) -> None:
    environ = {} if value is None else {NAME: value}
    assert read(environ) == expected


BAD: list[Any] = [
    pytest.param(
        lambda e: env_int(e, "GPUALLOC_PORT", 1),
        "GPUALLOC_PORT",
        "x",
        "GPUALLOC_PORT: must be an integer, got 'x'",
        id="int-not-a-number",
    ),
    pytest.param(
        lambda e: env_int(e, NAME, 1),
        NAME,
        "1.5",
        "GPUALLOC_X: must be an integer, got '1.5'",
        id="int-fraction",
    ),
    pytest.param(
        lambda e: env_int(e, NAME, 1, minimum=1),
        NAME,
        "0",
        "GPUALLOC_X: must be >= 1, got '0'",
        id="int-below-min",
    ),
    pytest.param(
        lambda e: env_int(e, NAME, 1, maximum=8),
        NAME,
        "9",
        "GPUALLOC_X: must be <= 8, got '9'",
        id="int-above-max",
    ),
    pytest.param(
        lambda e: env_float(e, NAME, 1.0),
        NAME,
        "nan",
        "GPUALLOC_X: must be a number, got 'nan'",
        id="float-nan",
    ),
    pytest.param(
        lambda e: env_float(e, NAME, 1.0),
        NAME,
        "fast",
        "GPUALLOC_X: must be a number, got 'fast'",
        id="float-word",
    ),
    pytest.param(
        lambda e: env_bool(e, NAME, False),
        NAME,
        "maybe",
        "GPUALLOC_X: must be true or false, got 'maybe'",
        id="bool-maybe",
    ),
    pytest.param(
        lambda e: env_choice(e, NAME, "json", ("json", "text")),
        NAME,
        "xml",
        "GPUALLOC_X: must be one of json, text, got 'xml'",
        id="choice-unknown",
    ),
    pytest.param(
        lambda e: env_duration(e, NAME, 1.0),
        NAME,
        "5 s",
        "GPUALLOC_X: must be a duration like 500ms, 30s, 1m30s or a number of seconds, got '5 s'",
        id="duration-space",
    ),
    pytest.param(
        lambda e: env_duration(e, NAME, 1.0),
        NAME,
        "10d",
        "GPUALLOC_X: must be a duration like 500ms, 30s, 1m30s or a number of seconds, got '10d'",
        id="duration-days-unsupported",
    ),
    pytest.param(
        lambda e: env_duration(e, NAME, 1.0),
        NAME,
        "-1s",
        "GPUALLOC_X: must be a duration like 500ms, 30s, 1m30s or a number of seconds, got '-1s'",
        id="duration-negative-with-unit",
    ),
    pytest.param(
        lambda e: env_duration(e, NAME, 1.0),
        NAME,
        "-2",
        "GPUALLOC_X: must be >= 0, got '-2'",
        id="duration-negative-number",
    ),
    pytest.param(
        lambda e: env_bytes(e, NAME, 1),
        NAME,
        "16MB",
        "GPUALLOC_X: must be a whole number of bytes like 16Mi or 1048576, got '16MB'",
        id="bytes-unknown-suffix",
    ),
    pytest.param(
        lambda e: env_bytes(e, NAME, 1),
        NAME,
        "0.5",
        "GPUALLOC_X: must be a whole number of bytes like 16Mi or 1048576, got '0.5'",
        id="bytes-fraction",
    ),
    pytest.param(
        lambda e: env_bytes(e, NAME, 1, maximum=1024),
        NAME,
        "1Mi",
        "GPUALLOC_X: must be <= 1024, got '1Mi'",
        id="bytes-above-max",
    ),
]


@pytest.mark.parametrize(("read", "name", "value", "message"), BAD)
def test_reader_rejects_with_the_variable_name(
    read: Reader, name: str, value: str, message: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        read({name: value})
    assert caught.value.message == message
    assert caught.value.field_path == name


def test_server_settings_defaults_when_environment_is_empty() -> None:
    assert ServerSettings.from_env({}) == ServerSettings()
    assert ServerSettings().listen_address == "127.0.0.1:50051"
    assert ServerSettings().max_receive_message_bytes == 16 * 2**20


def test_server_settings_from_env_reads_every_variable() -> None:
    environ = {
        "GPUALLOC_LISTEN": "0.0.0.0:6000",
        "GPUALLOC_MAX_WORKERS": "4",
        "GPUALLOC_MAX_RECEIVE_MESSAGE_BYTES": "4Mi",
        "GPUALLOC_MAX_SEND_MESSAGE_BYTES": "2Mi",
        "GPUALLOC_MAX_CONCURRENT_STREAMS": "50",
        "GPUALLOC_MAX_CALL_DURATION": "1m",
        "GPUALLOC_SHUTDOWN_GRACE": "2500ms",
        "GPUALLOC_LOG_LEVEL": "debug",
        "GPUALLOC_LOG_FORMAT": "text",
        "UNRELATED": "ignored",
    }
    assert ServerSettings.from_env(environ) == ServerSettings(
        listen_address="0.0.0.0:6000",
        max_workers=4,
        max_receive_message_bytes=4 * 2**20,
        max_send_message_bytes=2 * 2**20,
        max_concurrent_streams=50,
        max_call_seconds=60.0,
        grace_seconds=2.5,
        log_level="DEBUG",
        log_format="text",
    )


def test_server_settings_reports_every_bad_variable_at_once() -> None:
    environ = {"GPUALLOC_MAX_WORKERS": "many", "GPUALLOC_LOG_FORMAT": "xml"}
    with pytest.raises(InvalidArgument) as caught:
        ServerSettings.from_env(environ)
    assert caught.value.message == (
        "GPUALLOC_MAX_WORKERS: must be an integer, got 'many'; "
        "GPUALLOC_LOG_FORMAT: must be one of json, text, got 'xml'"
    )
    assert caught.value.violations == (
        FieldViolation("GPUALLOC_MAX_WORKERS", "must be an integer, got 'many'"),
        FieldViolation("GPUALLOC_LOG_FORMAT", "must be one of json, text, got 'xml'"),
    )


# --- the settings table -----------------------------------------------------------------------


def test_every_server_setting_field_has_exactly_one_variable() -> None:
    assert list(SERVER_SETTINGS) == [f.name for f in dataclasses.fields(ServerSettings)]
    names = [setting.name for setting in SERVER_SETTINGS.values()]
    assert len(set(names)) == len(names)
    assert all(name.startswith("GPUALLOC_") for name in names)


@pytest.mark.parametrize(
    "field_name", [pytest.param(name, id=name.replace("_", "-")) for name in SERVER_SETTINGS]
)
def test_documented_default_reads_back_as_the_default(field_name: str) -> None:
    setting = SERVER_SETTINGS[field_name]
    shown = setting.show_default(setting.default)
    assert setting.read({setting.name: shown}) == setting.default
    assert getattr(ServerSettings(), field_name) == setting.default
    assert setting.description


def test_settings_table_markdown_has_a_row_per_variable() -> None:
    table = settings_table_markdown()
    lines = table.splitlines()
    assert lines[:2] == ["| Variable | Default | Description |", "|---|---|---|"]
    assert len(lines) == 2 + len(SERVER_SETTINGS)
    assert "| `GPUALLOC_LISTEN` | `127.0.0.1:50051` |" in table
    assert "| `GPUALLOC_MAX_RECEIVE_MESSAGE_BYTES` | `16Mi` |" in table
    assert "| `GPUALLOC_MAX_CALL_DURATION` | `30s` |" in table


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        pytest.param(30.0, "30s", id="whole-seconds"),
        pytest.param(0.5, "500ms", id="sub-second"),
        pytest.param(0.0, "0s", id="zero"),
        pytest.param(90.0, "90s", id="over-a-minute"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert env_duration({NAME: text}, NAME, -1.0) == seconds
