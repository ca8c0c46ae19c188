"""DRA objects from YAML or JSON text, exactly as `kubectl get -o yaml|json` prints them.

Accepted: a single object, a `List` (kind `List`, or a typed list such as `ResourceSliceList`
whose items may omit apiVersion/kind), multi-document YAML streams (`---`) and concatenated JSON
documents (text starting with `{` or `[` is read as JSON only, as kubectl does). Kinds:
ResourceSlice, DeviceClass, ResourceClaim (spec.devices and status.allocation),
ResourceClaimTemplate (its spec.spec, as the ResourceClaim it stamps out) and core/v1 Node (name
and labels). API versions resource.k8s.io/v1 and v1beta2 (same shape); v1beta1 (devices under
`basic`, requests without `exactly`) is converted to the v1 shape first, so its errors use v1
field paths, as the API server's do. Fields of the 1.34 API that gpualloc does not model
(managedFields, creationTimestamp, alpha fields) are ignored; a field that API lacks is an
error, `unknown field "<path>"` with the closest known name, as kubectl's strict validation
(_schema.py). Only `decode_object`, for objects read back from an API server, ignores those
too.

Every object is validated (validate.py). Errors name the source, the line (when it can be found),
the document and the object, then the field path, e.g. `slices.yaml:57: document 2
(ResourceSlice "node-1-gpu"): spec.devices[3].attributes["productName"]: must have exactly one
of int, bool, string, version`. Malformed YAML/JSON raises ParseError;
anything else InvalidArgument with every violation in `.violations`.

Only `read_text` and `read_stdin` do I/O; everything else works on text or decoded values.

This module is the public face; the work lives in private modules by kind: `_parse_documents`
(documents, Lists, kinds, the v1beta1 upgrade, error locations), `_parse_slices` (ResourceSlice,
NodeSelector, Node), `_parse_claims` (DeviceClass, ResourceClaim, templates, allocations) and
`_parse_fields` (typed access to decoded JSON, which they share).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import PurePath
from typing import IO, Any, TextIO

from services.common.dra import validate
from services.common.dra._parse_claims import decode_allocation
from services.common.dra._parse_documents import (
    RESOURCE_API_VERSIONS,
    KubeObject,
    Where,
    decode_document,
    decode_kube_object,
    read_documents,
)
from services.common.dra._parse_fields import Fields, Invalid, json_type
from services.common.dra.limits import DocumentLimits, check_size
from services.common.dra.model import AllocationResult
from services.common.errors import FieldViolation, InvalidArgument, ParseError

__all__ = [
    "RESOURCE_API_VERSIONS",
    "KubeObject",
    "allocation_result_from_dict",
    "Where",
    "decode_object",
    "load_files",
    "load_located_objects",
    "load_objects",
    "read_documents",
    "read_stdin",
    "read_text",
]


def read_text(path: str | PurePath, limits: DocumentLimits | None = None) -> str:
    """The one place that reads a file: its text, or InvalidArgument/ParseError naming it. No
    more than the size limit is read, so a huge file costs no memory."""
    try:
        with open(path, "rb") as file:
            return decode_text(file, str(path), limits)
    except OSError as exc:
        raise InvalidArgument(f"{path}: cannot read: {exc.strerror}") from exc


def read_stdin(stdin: TextIO, limits: DocumentLimits | None = None) -> str:
    """Standard input as text, as `read_text` reads a file: bounded, and invalid UTF-8 is a
    ParseError. A text stream without a byte buffer (a test's StringIO) is read as text."""
    binary = getattr(stdin, "buffer", None)
    if binary is not None:
        return decode_text(binary, "<stdin>", limits)
    limits = limits or DocumentLimits()
    text = str(stdin.read(limits.max_bytes + 1))
    check_size(text, "<stdin>", limits)
    return text


def decode_text(file: IO[bytes], source: str, limits: DocumentLimits | None = None) -> str:
    """At most the size limit of bytes from `file` (one more tells that there is more), as
    UTF-8 text; ParseError naming `source` otherwise."""
    limits = limits or DocumentLimits()
    data = file.read(limits.max_bytes + 1)
    if len(data) > limits.max_bytes:
        raise ParseError(limits.size_message(), source)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", source) from None


def load_files(
    paths: Iterable[str | PurePath], limits: DocumentLimits | None = None
) -> list[KubeObject]:
    """Every object of every file, in order."""
    return [
        obj for path in paths for obj in load_objects(read_text(path, limits), str(path), limits)
    ]


def load_objects(
    text: str,
    source: str = "<input>",
    limits: DocumentLimits | None = None,
    *,
    strict: bool = True,
) -> list[KubeObject]:
    """Every object of a YAML or JSON text (one object, a List, or a stream of documents),
    within `limits` (limits.py; the defaults when None). `strict=False` ignores fields the
    1.34 API lacks instead of refusing them (kubectl's `--validate=ignore`)."""
    return [obj for obj, _ in load_located_objects(text, source, limits, strict=strict)]


def load_located_objects(
    text: str,
    source: str = "<input>",
    limits: DocumentLimits | None = None,
    *,
    strict: bool = True,
) -> list[tuple[KubeObject, Where]]:
    """`load_objects`, each object with where it is: `where.fail(violations)` words a later
    error about it as one found while decoding (`file:line: document N (Kind "name"): ...`,
    the line that of the violation's field path)."""
    located: list[tuple[KubeObject, Where]] = []
    for number, document in read_documents(text, source, limits):
        if document is not None:
            where = Where(source, text, number, strict=strict)
            located.extend(decode_document(document, where))
    return located


def decode_object(data: Mapping[str, Any], source: str = "<object>") -> KubeObject:
    """One already-decoded object (e.g. from a watch event or `json.loads`), validated; fields
    gpualloc does not know are ignored (a newer API server may send them)."""
    return decode_kube_object(dict(data), Where(source, "", 1, strict=False), None, None)


def allocation_result_from_dict(
    data: Mapping[str, Any], path: str = "status.allocation", *, check: bool = True
) -> AllocationResult:
    """An AllocationResult in the shape of ResourceClaim.status.allocation, on its own (as a
    reservation stores it). Errors carry field paths under `path`.

    Without its claim, a result's request is checked as a name only, not against the claim's
    requests. `check=False` skips the validation rules but not the shape checks: for
    allocations this service made (and validated) itself, read back from its own store.
    """
    if not isinstance(data, Mapping):
        detail = f"must be an object, got {json_type(data)}"
        raise validate.violations_error([FieldViolation(path, detail)])
    try:
        allocation = decode_allocation(Fields(data, path))
    except Invalid as exc:
        raise validate.violations_error([exc.violation]) from None
    if check:
        validate.validate_allocation_result(allocation, path)
    return allocation
