"""dra/limits.py: every text is bounded in size, depth and values (aliases counted as used),
and going over is a ParseError naming the limit, never a RecursionError or minutes of work."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import pytest

from services.allocator.app.paging import decode_token
from services.common.config import read_document_limits
from services.common.dra.limits import DocumentLimits, checked_json_loads
from services.common.dra.parse import load_objects, read_stdin, read_text
from services.common.dra.topology_annotation import annotation_path, parse_annotation
from services.common.errors import InvalidArgument, ParseError, clip
from services.common.manifests import load_manifests
from services.inventory.config import InventorySettings

SMALL = DocumentLimits(max_bytes=4096, max_nodes=500, max_depth=20)

_SLICE = """\
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: s}
spec:
  driver: gpu.example.com
  nodeName: n
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  devices: [{name: gpu-0}]
"""


def _alias_bomb(levels: int, width: int) -> str:
    """A few hundred bytes of YAML aliases that stand for width**levels values."""
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "limits", "message"),
    [
        pytest.param("[" * 985 + "]" * 985, None, "nested deeper than 100", id="json-985-brackets"),
        pytest.param(
            '{"a":' * 3000 + "1" + "}" * 3000, None, "nested deeper than 100", id="json-deep-object"
        ),
        pytest.param("[" * 100_000, None, "nested deeper than 100", id="json-unclosed-brackets"),
        pytest.param("a: " + "[" * 5000, None, "maximum nesting depth", id="yaml-flow-deep"),
        pytest.param("a: " + "[" * 120 + "]" * 120, None, "deeper than 100", id="yaml-121-levels"),
        pytest.param(_alias_bomb(9, 10), None, "more than 1,000,000 values", id="yaml-alias-bomb"),
        pytest.param("a: &a [*a]\n", None, "deeper than 100", id="yaml-recursive-alias"),
        pytest.param("x" * 5000, SMALL, "GPUALLOC_MAX_DOCUMENT_BYTES", id="over-max-bytes"),
        pytest.param("é" * 2100, SMALL, "is 4,200 bytes, more than", id="bytes-not-characters"),
        pytest.param(
            "[" + ",".join(["1"] * 600) + "]", SMALL, "more than 500 values", id="json-over-nodes"
        ),
        pytest.param(
            "- " + "\n- ".join(["1"] * 600), SMALL, "more than 500 values", id="yaml-over-nodes"
        ),
    ],
)
def test_over_a_limit_is_a_parse_error_naming_it(
    text: str, limits: DocumentLimits | None, message: str
) -> None:
    with pytest.raises(ParseError, match=message):
        load_objects(text, "m.yaml", limits)


def test_within_the_limits_a_document_still_loads() -> None:
    assert [o.name for o in load_objects(_SLICE, "s.yaml", SMALL)] == ["s"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param('{"a":' * 2000 + "1" + "}" * 2000, "nested deeper", id="recursion"),
        pytest.param('{"a": ' * 30 + "1" + "}" * 30, "deeper than 20", id="over-max-depth"),
        pytest.param("[" + ",".join(["1"] * 600) + "]", "more than 500", id="over-max-nodes"),
    ],
)
def test_checked_json_loads(text: str, message: str) -> None:
    limits = SMALL if len(text) < SMALL.max_bytes else None
    with pytest.raises(ParseError, match=message):
        checked_json_loads(text, "annotation", limits)


def test_a_file_is_read_no_further_than_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"#" * 10_000)
    with pytest.raises(ParseError, match="more than the 4,096 bytes"):
        read_text(path, SMALL)


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        pytest.param(
            io.TextIOWrapper(io.BytesIO(b"kind: \xff\xfe\n")), "not UTF-8 text", id="invalid-utf8"
        ),
        pytest.param(io.TextIOWrapper(io.BytesIO(b"#" * 5000)), "more than", id="over-max-bytes"),
        pytest.param(io.StringIO("#" * 5000), "more than", id="text-stream-over-max-bytes"),
    ],
)
def test_stdin_is_bounded_and_must_be_utf8(stdin: TextIO, message: str) -> None:
    with pytest.raises(ParseError, match=message) as caught:
        read_stdin(stdin, SMALL)
    assert caught.value.source == "<stdin>"


def test_stdin_only_once() -> None:
    with pytest.raises(InvalidArgument, match="only once"):
        load_manifests(["-", "-"], io.StringIO(_SLICE))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("short", "short", id="short-unchanged"),
        pytest.param("x" * 200, "x" * 200, id="at-the-limit"),
        pytest.param("x" * 8000, "x" * 200 + "… (8,000 characters)", id="long-clipped"),
        pytest.param(12345, "12345", id="not-a-string"),
    ],
)
def test_clip(value: object, expected: str) -> None:
    assert clip(value) == expected


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param({}, DocumentLimits(), id="defaults"),
        pytest.param(
            {"GPUALLOC_MAX_DOCUMENT_BYTES": "64Ki", "GPUALLOC_MAX_DOCUMENT_NODES": "5000"},
            DocumentLimits(max_bytes=65536, max_nodes=5000),
            id="both-set",
        ),
    ],
)
def test_limits_from_the_environment(environ: dict[str, str], expected: DocumentLimits) -> None:
    assert read_document_limits(environ) == expected


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        pytest.param("GPUALLOC_MAX_DOCUMENT_BYTES", "lots", id="bytes-not-a-quantity"),
        pytest.param("GPUALLOC_MAX_DOCUMENT_NODES", "10", id="nodes-below-minimum"),
        pytest.param("GPUALLOC_INVENTORY_MAX_NODES", "0", id="inventory-nodes-zero"),
    ],
)
def test_bad_limit_settings_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        InventorySettings.from_env({variable: value})
    assert caught.value.field_path == variable


@pytest.mark.parametrize(
    ("decode", "text", "path"),
    [
        pytest.param(parse_annotation, "[" * 3000, annotation_path(), id="annotation-recursion"),
        pytest.param(
            parse_annotation, "[" * 150 + "]" * 150, annotation_path(), id="annotation-deep"
        ),
        pytest.param(
            lambda text: decode_token(text, "q"),
            base64.urlsafe_b64encode(b"[" * 5000).decode(),
            "page_token",
            id="page-token-recursion",
        ),
    ],
)
def test_json_in_request_fields_is_invalid_argument_when_deep(
    decode: Callable[[str], object], text: str, path: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        decode(text)
    assert caught.value.field_path == path
