"""Typed errors raised by a servicer reach a real client as the right status, with details.

Every test runs a real server on port 0 and calls it over a real channel. The test service is a
generic handler with bytes in and out, so no generated proto is needed: the request names the
case whose error the servicer raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from services.common.errors import (
    AlreadyExists,
    Conflict,
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    GpuallocError,
    InvalidArgument,
    NotBound,
    NotFound,
    ParseError,
    PermissionDenied,
    Preempted,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from services.common.grpc_errors import (
    CONFLICT_REASON,
    CONFLICT_RESOURCE_TYPE,
    DOMAIN,
    MAX_CONFLICT_DETAILS,
    MAX_MESSAGE_CHARS,
    MAX_VIOLATION_CHARS,
    MAX_VIOLATION_DETAILS,
    STATUS_CODES,
    RemoteError,
    SerializedReply,
    error_from_rpc,
    status_code_of,
    to_rpc_status,
)
from services.common.grpc_server import ServiceRegistration
from tests.conftest import GrpcChannelFactory

SERVICE = "gpualloc.test.v1.Errors"
RAISE = f"/{SERVICE}/Raise"
STREAM_THEN_RAISE = f"/{SERVICE}/StreamThenRaise"
ABORT = f"/{SERVICE}/Abort"


class InvalidSelector(InvalidArgument):
    """Stands for a core's own subclass: it must inherit its base's mapping."""


@dataclass(frozen=True)
class Case:
    error: Exception
    code: grpc.StatusCode
    message: str


CASES: dict[str, Case] = {
    "invalid-argument": Case(
        InvalidArgument.at('spec.devices[3].attributes["x"]', "must be a string"),
        grpc.StatusCode.INVALID_ARGUMENT,
        'spec.devices[3].attributes["x"]: must be a string',
    ),
    "invalid-argument-path-added-to-message": Case(
        InvalidArgument("bad claim", [FieldViolation("spec.requests[0].name", "empty")]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "spec.requests[0].name: bad claim",
    ),
    "invalid-argument-subclass": Case(
        InvalidSelector.at("spec.selectors[0].cel.expression", "undeclared reference to 'x'"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "spec.selectors[0].cel.expression: undeclared reference to 'x'",
    ),
    "parse-error": Case(
        ParseError("mapping values are not allowed here", "slices.yaml", 7),
        grpc.StatusCode.INVALID_ARGUMENT,
        "slices.yaml:7: mapping values are not allowed here",
    ),
    "not-found": Case(
        NotFound("reservation r-1 not found"),
        grpc.StatusCode.NOT_FOUND,
        "reservation r-1 not found",
    ),
    "already-exists": Case(
        AlreadyExists("reservation r-1 exists"),
        grpc.StatusCode.ALREADY_EXISTS,
        "reservation r-1 exists",
    ),
    "conflict": Case(
        Conflict("devices moved", ["gpu.nvidia.com/node-a/gpu-0", "gpu.nvidia.com/node-a/gpu-1"]),
        grpc.StatusCode.ABORTED,
        "devices moved",
    ),
    "conflict-on-many-counters": Case(
        Conflict(
            "counters moved", [f"gpu.nvidia.com/node-a/gpu-0/memory-slice-{i}" for i in range(40)]
        ),
        grpc.StatusCode.ABORTED,
        "counters moved",
    ),
    "permission-denied": Case(
        PermissionDenied("owner mismatch"), grpc.StatusCode.PERMISSION_DENIED, "owner mismatch"
    ),
    "unauthenticated": Case(
        Unauthenticated("no client certificate"),
        grpc.StatusCode.UNAUTHENTICATED,
        "no client certificate",
    ),
    "failed-precondition": Case(
        FailedPrecondition("pool node-a is incomplete"),
        grpc.StatusCode.FAILED_PRECONDITION,
        "pool node-a is incomplete",
    ),
    "not-bound": Case(
        NotBound("res-1@node-a", "reservation res-1@node-a is binding: waiting for X"),
        grpc.StatusCode.FAILED_PRECONDITION,
        "reservation res-1@node-a is binding: waiting for X",
    ),
    "preempted-by-a-failed-binding": Case(
        Preempted(
            "res-1@node-a", "binding: binding failed", "reservation res-1@node-a was released"
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "reservation res-1@node-a was released",
    ),
    "resource-exhausted": Case(
        ResourceExhausted("search budget of 100000 steps used up"),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "search budget of 100000 steps used up",
    ),
    "unavailable": Case(
        Unavailable("redis at 127.0.0.1:6379 unreachable"),
        grpc.StatusCode.UNAVAILABLE,
        "redis at 127.0.0.1:6379 unreachable",
    ),
    "deadline-exceeded": Case(
        DeadlineExceeded("solver ran out of time"),
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "solver ran out of time",
    ),
}

UNEXPECTED: dict[str, Exception] = {
    "value-error": ValueError("secret internal detail"),
    "key-error": KeyError("secret internal detail"),
    "bare-gpualloc-error": GpuallocError("secret internal detail"),
}


def _raise(request: bytes, context: grpc.ServicerContext) -> bytes:
    name = request.decode()
    raise CASES[name].error if name in CASES else UNEXPECTED[name]


def _stream_then_raise(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    yield b"first"
    raise NotFound("second is gone")


def _abort(request: bytes, context: grpc.ServicerContext) -> bytes:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, "no token")


def _registration() -> ServiceRegistration:
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "Raise": grpc.unary_unary_rpc_method_handler(_raise),
        "StreamThenRaise": grpc.unary_stream_rpc_method_handler(_stream_then_raise),
        "Abort": grpc.unary_unary_rpc_method_handler(_abort),
    }
    return ServiceRegistration(
        SERVICE,
        lambda servicer, server: server.add_generic_rpc_handlers((servicer,)),
        grpc.method_handlers_generic_handler(SERVICE, handlers),
    )


@pytest.fixture
def call(grpc_channel_factory: GrpcChannelFactory) -> Callable[[str], grpc.RpcError]:
    """Call Raise with a case name; return the RpcError the client got."""
    raise_ = grpc_channel_factory([_registration()]).unary(RAISE)

    def failing_call(name: str) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as caught:
            raise_(name.encode(), timeout=5)
        return caught.value

    return failing_call


def _details(error: grpc.RpcError) -> list[Any]:
    status = rpc_status.from_call(error)
    assert status is not None, "no google.rpc.Status in the trailers"
    unpacked = []
    for packed in status.details:
        for kind in (
            error_details_pb2.BadRequest,
            error_details_pb2.ErrorInfo,
            error_details_pb2.ResourceInfo,
        ):
            if packed.Is(kind.DESCRIPTOR):
                message = kind()
                packed.Unpack(message)
                unpacked.append(message)
    return unpacked


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in CASES])
def test_typed_error_reaches_client_with_its_status(
    call: Callable[[str], grpc.RpcError], name: str
) -> None:
    error = call(name)
    assert error.code() == CASES[name].code
    assert error.details() == CASES[name].message


def test_every_table_row_is_exercised() -> None:
    assert {type(case.error) for case in CASES.values()} >= set(STATUS_CODES)


@pytest.mark.parametrize(
    "name", [pytest.param(name, id=f"unexpected-{name}") for name in UNEXPECTED]
)
def test_unexpected_exception_is_internal_with_generic_message_and_logged_traceback(
    call: Callable[[str], grpc.RpcError], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="services.common.grpc_errors"):
        error = call(name)
    assert error.code() == grpc.StatusCode.INTERNAL
    message = error.details()
    assert message is not None
    assert message.startswith("internal error (ref ")
    assert "secret" not in message
    reference = message.removeprefix("internal error (ref ").split(")")[0]
    [record] = [r for r in caplog.records if reference in r.getMessage()]
    assert record.exc_info is not None
    assert record.exc_info[1] is UNEXPECTED[name]


def test_invalid_argument_carries_bad_request_field_violations(
    call: Callable[[str], grpc.RpcError],
) -> None:
    [bad_request] = _details(call("invalid-argument"))
    assert isinstance(bad_request, error_details_pb2.BadRequest)
    assert [(v.field, v.description) for v in bad_request.field_violations] == [
        ('spec.devices[3].attributes["x"]', "must be a string")
    ]


def test_parse_error_carries_source_and_line(call: Callable[[str], grpc.RpcError]) -> None:
    [info] = _details(call("parse-error"))
    assert isinstance(info, error_details_pb2.ErrorInfo)
    assert (info.reason, info.domain, dict(info.metadata)) == (
        "PARSE_ERROR",
        DOMAIN,
        {"source": "slices.yaml", "line": "7"},
    )


def test_conflict_carries_error_info_and_one_resource_per_device(
    call: Callable[[str], grpc.RpcError],
) -> None:
    info, *resources = _details(call("conflict"))
    assert isinstance(info, error_details_pb2.ErrorInfo)
    assert (info.reason, info.domain) == (CONFLICT_REASON, DOMAIN)
    assert info.metadata["conflicts"] == "gpu.nvidia.com/node-a/gpu-0,gpu.nvidia.com/node-a/gpu-1"
    assert [(r.resource_type, r.resource_name) for r in resources] == [
        (CONFLICT_RESOURCE_TYPE, "gpu.nvidia.com/node-a/gpu-0"),
        (CONFLICT_RESOURCE_TYPE, "gpu.nvidia.com/node-a/gpu-1"),
    ]


def test_many_conflicts_are_capped_and_counted(call: Callable[[str], grpc.RpcError]) -> None:
    info, *resources = _details(call("conflict-on-many-counters"))
    assert isinstance(info, error_details_pb2.ErrorInfo)
    assert len(info.metadata["conflicts"].split(",")) == len(resources) == MAX_CONFLICT_DETAILS
    assert info.metadata["more"] == str(40 - MAX_CONFLICT_DETAILS)


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in CASES])
def test_error_from_rpc_rebuilds_the_typed_error(
    call: Callable[[str], grpc.RpcError], name: str
) -> None:
    sent = CASES[name].error
    assert isinstance(sent, GpuallocError)
    rebuilt = error_from_rpc(call(name))
    # The client knows the base type of a subclass, never the server's private subclass.
    expected_type = InvalidArgument if isinstance(sent, InvalidSelector) else type(sent)
    assert type(rebuilt) is expected_type
    assert rebuilt.message == CASES[name].message
    if isinstance(sent, InvalidArgument):
        assert isinstance(rebuilt, InvalidArgument)
        assert rebuilt.violations == sent.violations
    if isinstance(sent, ParseError):
        assert isinstance(rebuilt, ParseError)
        assert (rebuilt.source, rebuilt.line) == (sent.source, sent.line)
    if isinstance(sent, Conflict):
        assert isinstance(rebuilt, Conflict)
        assert rebuilt.conflicts == sent.conflicts[:MAX_CONFLICT_DETAILS]
    if isinstance(sent, NotBound | Preempted):  # ErrorInfo RESERVATION_BINDING / _PREEMPTED
        assert isinstance(rebuilt, NotBound | Preempted)
        assert rebuilt.reservation_id == sent.reservation_id


def test_error_from_rpc_keeps_untyped_codes_as_remote_error(
    call: Callable[[str], grpc.RpcError],
) -> None:
    rebuilt = error_from_rpc(call("value-error"))
    assert isinstance(rebuilt, RemoteError)
    assert rebuilt.code == grpc.StatusCode.INTERNAL
    assert rebuilt.message.startswith("internal error (ref ")


def test_error_from_rpc_of_unreachable_server_is_unavailable(
    grpc_channel_factory: GrpcChannelFactory,
) -> None:
    served = grpc_channel_factory([_registration()])
    served.server.stop(None).wait()
    with pytest.raises(grpc.RpcError) as caught:
        served.unary(RAISE)(b"not-found", timeout=5)
    assert type(error_from_rpc(caught.value)) is Unavailable


def test_error_raised_mid_stream_ends_stream_with_its_status(
    grpc_channel_factory: GrpcChannelFactory,
) -> None:
    responses = grpc_channel_factory([_registration()]).unary_stream(STREAM_THEN_RAISE)(
        b"", timeout=5
    )
    assert next(responses) == b"first"
    with pytest.raises(grpc.RpcError) as caught:
        next(responses)
    assert (caught.value.code(), caught.value.details()) == (
        grpc.StatusCode.NOT_FOUND,
        "second is gone",
    )


def _reply(request: bytes, context: grpc.ServicerContext) -> Any:
    return SerializedReply(b"as written") if request == b"serialized" else request


def test_a_reply_written_serialized_is_sent_as_it_is(
    grpc_channel_factory: GrpcChannelFactory,
) -> None:
    """A unary servicer may return its reply serialized (SerializedReply, as AllocateBatch
    does): its bytes go on the wire as they are; any other reply through the handler's own
    serializer."""
    handler: grpc.RpcMethodHandler[Any, Any] = grpc.unary_unary_rpc_method_handler(
        _reply, response_serializer=lambda reply: b"serialized: " + reply
    )
    registration = ServiceRegistration(
        SERVICE,
        lambda servicer, server: server.add_generic_rpc_handlers((servicer,)),
        grpc.method_handlers_generic_handler(SERVICE, {"Reply": handler}),
    )
    reply = grpc_channel_factory([registration]).unary(f"/{SERVICE}/Reply")
    assert reply(b"serialized", timeout=5) == b"as written"
    assert reply(b"a message", timeout=5) == b"serialized: a message"


def test_servicer_abort_keeps_its_own_status(grpc_channel_factory: GrpcChannelFactory) -> None:
    abort = grpc_channel_factory([_registration()]).unary(ABORT)
    with pytest.raises(grpc.RpcError) as caught:
        abort(b"", timeout=5)
    assert (caught.value.code(), caught.value.details()) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "no token",
    )


@pytest.mark.parametrize(
    ("error", "code"),
    [
        pytest.param(InvalidSelector("x"), grpc.StatusCode.INVALID_ARGUMENT, id="subclass"),
        pytest.param(ParseError("x"), grpc.StatusCode.INVALID_ARGUMENT, id="parse-error"),
        pytest.param(Conflict("x"), grpc.StatusCode.ABORTED, id="conflict"),
        pytest.param(GpuallocError("x"), None, id="bare-base"),
        pytest.param(ValueError("x"), None, id="not-ours"),
    ],
)
def test_status_code_of(error: Exception, code: grpc.StatusCode | None) -> None:
    assert status_code_of(error) == code


_MANY = [FieldViolation(f"spec.devices[{i}].{'x' * 500}", "y" * 1000) for i in range(40)]


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(NotFound(f"reservation {'r' * 8000} not found"), id="long-not-found"),
        pytest.param(InvalidArgument("z" * 20000, _MANY), id="forty-long-violations"),
        pytest.param(ParseError("bad", "s" * 5000, 3), id="long-parse-source"),
    ],
)
def test_a_status_fits_the_trailers_a_client_accepts(error: GpuallocError) -> None:
    code = status_code_of(error)
    assert code is not None
    status = to_rpc_status(error, code)
    assert len(status.message) <= MAX_MESSAGE_CHARS + 30
    assert status.message.endswith("characters)")  # cut, saying how long it was
    # grpc-message (ASCII here) + grpc-status-details-bin (base64): under 7 of the 8 KiB
    assert len(status.message) + 4 * len(status.SerializeToString()) // 3 < 7 * 1024
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            assert len(bad.field_violations) == MAX_VIOLATION_DETAILS
            assert "and 25 more violations" in bad.field_violations[-1].description
            assert all(len(v.field) <= MAX_VIOLATION_CHARS + 30 for v in bad.field_violations)
