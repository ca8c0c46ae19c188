"""Log lines: one JSON object per line with trace ids when a span is active, or readable text."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider

from services.common.log import configure_logging, current_trace_ids
from services.common.native_log import native_record

LOGGER = "gpualloc.test.log"


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """configure_logging owns the root logger: put pytest's handlers back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield io.StringIO()
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_json_line_has_the_standard_fields_and_extras(stream: io.StringIO) -> None:
    configure_logging("INFO", "json", stream)
    logging.getLogger(LOGGER).info("reserved %d devices", 2, extra={"claim": "ns/c1"})
    [line] = _lines(stream)
    entry = json.loads(line)
    assert {k: entry[k] for k in ("level", "logger", "msg", "claim")} == {
        "level": "INFO",
        "logger": LOGGER,
        "msg": "reserved 2 devices",
        "claim": "ns/c1",
    }
    assert entry["ts"].endswith("Z") and "T" in entry["ts"]
    assert "trace_id" not in entry


def test_json_line_carries_trace_and_span_of_the_active_span(stream: io.StringIO) -> None:
    configure_logging("INFO", "json", stream)
    tracer = TracerProvider().get_tracer(__name__)
    with tracer.start_as_current_span("allocate") as span:
        logging.getLogger(LOGGER).info("inside")
        context = span.get_span_context()
    entry = json.loads(_lines(stream)[0])
    assert (entry["trace_id"], entry["span_id"]) == (
        f"{context.trace_id:032x}",
        f"{context.span_id:016x}",
    )
    assert current_trace_ids() is None  # the span has ended


def test_json_traceback_stays_inside_one_line(stream: io.StringIO) -> None:
    configure_logging("INFO", "json", stream)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger(LOGGER).exception("failed")
    [line] = _lines(stream)
    entry = json.loads(line)
    assert entry["msg"] == "failed"
    assert "ValueError: boom" in entry["exc"]


def test_text_line_is_readable(stream: io.StringIO) -> None:
    configure_logging("DEBUG", "text", stream)
    logging.getLogger(LOGGER).debug("hello %s", "world", extra={"pool": "node-a"})
    [line] = _lines(stream)
    assert line.endswith(f" DEBUG {LOGGER}: hello world pool=node-a")


def test_level_filters_and_reconfiguring_does_not_duplicate(stream: io.StringIO) -> None:
    configure_logging("INFO", "json", stream)
    configure_logging("WARNING", "json", stream)
    logging.getLogger(LOGGER).info("dropped")
    logging.getLogger(LOGGER).warning("kept")
    assert [json.loads(line)["msg"] for line in _lines(stream)] == ["kept"]


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="log format must be json or text, got 'xml'"):
        configure_logging("INFO", "xml")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            "I1204 19:51:28.307551    6462 ssl_transport_security.cc:2563] Handshake failed\n",
            (logging.INFO, "ssl_transport_security.cc:2563", "Handshake failed"),
            id="grpc-core-info",
        ),
        pytest.param(
            "E1204 19:36:58.644977 1346 chttp2_transport.cc:1403] ipv4:127.0.0.1:45493: goaway",
            (logging.ERROR, "chttp2_transport.cc:1403", "ipv4:127.0.0.1:45493: goaway"),
            id="grpc-core-error",
        ),
        pytest.param('{"ts": "…", "level": "INFO", "msg": "x"}\n', None, id="a-json-line"),
        pytest.param("Traceback (most recent call last):\n", None, id="a-traceback"),
    ],
)
def test_grpc_core_lines_are_recognised(line: str, expected: object) -> None:
    assert native_record(line) == expected
