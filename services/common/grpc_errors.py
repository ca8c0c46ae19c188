"""Typed errors <-> gRPC status, in one table, on both sides of the wire.

Server side: `ErrorMappingInterceptor` wraps every handler so servicers simply raise the errors of
`services.common.errors`; it aborts the call with the status code from `STATUS_CODES` and a
`google.rpc.Status` carrying machine-readable details:

* InvalidArgument -> `google.rpc.BadRequest`, one field violation per bad field path;
* ParseError      -> also `google.rpc.ErrorInfo` (reason PARSE_ERROR, source file and line);
* Conflict        -> `google.rpc.ErrorInfo` (reason RESERVATION_CONFLICT, the conflicting devices
                     joined in metadata["conflicts"]) and one `google.rpc.ResourceInfo` per device.

Any other exception is a bug: the client gets INTERNAL with a generic message and a reference,
the server log gets the traceback under the same reference. Nothing internal leaks to callers.

Client side: `error_from_rpc` turns a `grpc.RpcError` back into the typed error, violations and
conflicts included, so the CLI and the service-to-service clients handle one error tree.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, NoReturn, TypeAlias

import grpc
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
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
    clip,
)

__all__ = [
    "MAX_MESSAGE_CHARS",
    "MAX_VIOLATION_CHARS",
    "MAX_VIOLATION_DETAILS",
    "CONFLICT_REASON",
    "PREEMPTED_REASON",
    "BINDING_REASON",
    "CONFLICT_RESOURCE_TYPE",
    "DOMAIN",
    "DecodedRequests",
    "PARSE_ERROR_REASON",
    "STATUS_CODES",
    "ErrorMappingInterceptor",
    "Handler",
    "HandlerInterceptor",
    "RemoteError",
    "StreamBehavior",
    "UnaryBehavior",
    "WrappedHandlers",
    "error_from_rpc",
    "error_from_status",
    "is_infrastructure_method",
    "rewrap_handler",
    "stream_in_context",
    "status_code_of",
    "to_rpc_status",
]

STATUS_CODES: Mapping[type[GpuallocError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    ParseError: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    Conflict: grpc.StatusCode.ABORTED,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
}
"""The one mapping. Subclasses (e.g. a core's InvalidSelector) inherit their base's code."""

DOMAIN = "gpualloc"
"""`google.rpc.ErrorInfo.domain` of every reason below."""

PARSE_ERROR_REASON = "PARSE_ERROR"
CONFLICT_REASON = "RESERVATION_CONFLICT"
PREEMPTED_REASON = "RESERVATION_PREEMPTED"
BINDING_REASON = "RESERVATION_BINDING"
CONFLICT_RESOURCE_TYPE = "gpualloc.device"

# The client rebuilds the first (most general) type listed for a code.
_ERROR_TYPES: dict[grpc.StatusCode, type[GpuallocError]] = {}
for _type, _code in STATUS_CODES.items():
    _ERROR_TYPES.setdefault(_code, _type)

_INFRASTRUCTURE_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")

_log = logging.getLogger(__name__)


class RemoteError(GpuallocError):
    """A status with no typed counterpart (INTERNAL, UNKNOWN, CANCELLED, ...) from a remote call.

    Not in STATUS_CODES on purpose: if a server lets one escape, its own callers see INTERNAL.
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def is_infrastructure_method(method: str) -> bool:
    """Health and reflection calls, which interceptors should leave alone.

    They are grpcio's own servicers and raise nothing of ours; wrapping Health.Watch would hide
    the attribute that makes it non-blocking (one pool thread per watcher); telemetry should not
    trace probes.
    """
    return method.startswith(_INFRASTRUCTURE_PREFIXES)


def status_code_of(error: BaseException) -> grpc.StatusCode | None:
    """The status code for a typed error (by its nearest mapped base), None for anything else."""
    for cls in type(error).__mro__:
        code = STATUS_CODES.get(cls)
        if code is not None:
            return code
    return None


# --- server side: error -> google.rpc.Status ------------------------------------------------


MAX_MESSAGE_CHARS = 512
"""The longest status message sent. The message travels twice in the trailers (grpc-message and
inside grpc-status-details-bin), which clients cap at 8 KiB by default: an error that echoes a
client's 8,000-character id would otherwise reach the client as RESOURCE_EXHAUSTED (metadata
too large) instead of its own code. Values echoed inside messages are clipped to 200 characters
where they are written (`clip`); this is the bound for everything together."""
MAX_VIOLATION_DETAILS = 16
"""Field violations listed in BadRequest (the rest are counted in the last one)."""
MAX_VIOLATION_CHARS = 100
"""The longest field path or description of one listed violation."""


def to_rpc_status(error: GpuallocError, code: grpc.StatusCode) -> status_pb2.Status:
    """The rich status for a typed error: code, message and the details described above, each
    clipped so that the trailers fit what a client accepts."""
    message = error.message
    details: list[Message] = []
    if isinstance(error, InvalidArgument):
        if error.field_path and error.field_path not in message:
            message = f"{error.field_path}: {message}"
        if error.violations:
            details.append(_bad_request(error.violations))
        if isinstance(error, ParseError):
            details.append(_parse_error_info(error))
    if isinstance(error, Conflict) and error.conflicts:
        details.extend(_conflict_details(error.conflicts))
    if isinstance(error, Preempted):
        metadata = {"reservation": error.reservation_id, "by": clip(error.by, 512)}
        details.append(
            error_details_pb2.ErrorInfo(reason=PREEMPTED_REASON, domain=DOMAIN, metadata=metadata)
        )
    if isinstance(error, NotBound):
        metadata = {"reservation": error.reservation_id}
        details.append(
            error_details_pb2.ErrorInfo(reason=BINDING_REASON, domain=DOMAIN, metadata=metadata)
        )
    if isinstance(error, ResourceExhausted) and error.retry_after_seconds > 0:
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.FromMilliseconds(round(error.retry_after_seconds * 1000))
        details.append(retry)
    status = status_pb2.Status(code=code.value[0], message=clip(message, MAX_MESSAGE_CHARS))
    for detail in details:
        status.details.add().Pack(detail)
    return status


def _bad_request(violations: tuple[FieldViolation, ...]) -> error_details_pb2.BadRequest:
    shown = list(violations[:MAX_VIOLATION_DETAILS])
    if len(violations) > len(shown):
        more = len(violations) - len(shown) + 1
        shown[-1] = FieldViolation("", f"and {more} more violations (the message has the first)")
    return error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(
                field=clip(v.path, MAX_VIOLATION_CHARS),
                description=clip(v.description, MAX_VIOLATION_CHARS),
            )
            for v in shown
        ]
    )


def _parse_error_info(error: ParseError) -> error_details_pb2.ErrorInfo:
    metadata = {"source": clip(error.source, MAX_VIOLATION_CHARS)}
    if error.line is not None:
        metadata["line"] = str(error.line)
    return error_details_pb2.ErrorInfo(reason=PARSE_ERROR_REASON, domain=DOMAIN, metadata=metadata)


MAX_CONFLICT_DETAILS = 16
"""Conflicts listed in the details. A MIG placement can conflict on dozens of counters, and the
details travel in a trailer that clients cap at 8 KiB by default: the rest is counted instead."""


def _conflict_details(conflicts: tuple[str, ...]) -> list[Message]:
    shown = conflicts[:MAX_CONFLICT_DETAILS]
    metadata = {"conflicts": ",".join(shown)}
    if len(conflicts) > len(shown):
        metadata["more"] = str(len(conflicts) - len(shown))
    info = error_details_pb2.ErrorInfo(reason=CONFLICT_REASON, domain=DOMAIN, metadata=metadata)
    resources: list[Message] = [
        error_details_pb2.ResourceInfo(
            resource_type=CONFLICT_RESOURCE_TYPE,
            resource_name=conflict,
            description="changed since the snapshot the placement was computed on",
        )
        for conflict in shown
    ]
    return [info, *resources]


def _abort(error: Exception, context: grpc.ServicerContext, method: str) -> NoReturn:
    """End the call with the status for `error`; always raises (that is how grpc aborts)."""
    code = status_code_of(error) if isinstance(error, GpuallocError) else None
    if isinstance(error, GpuallocError) and code is not None:
        status = to_rpc_status(error, code)
        level = logging.WARNING if code is grpc.StatusCode.UNAVAILABLE else logging.DEBUG
        _log.log(level, "%s failed: %s %s", method, code.name, status.message)
    else:
        already = getattr(context, "code", lambda: None)()  # not in the type stubs
        if already is not None and already is not grpc.StatusCode.OK:
            raise error  # the servicer called context.abort() itself: keep its status
        reference = secrets.token_hex(4)
        _log.error("%s: unexpected error (ref %s)", method, reference, exc_info=error)
        status = status_pb2.Status(
            code=code_pb2.INTERNAL,
            message=f"internal error (ref {reference}); the server log has the details",
        )
    context.abort_with_status(rpc_status.to_status(status))


UnaryBehavior = Callable[[Any, grpc.ServicerContext], Any]
"""A handler answering one response (unary-unary or stream-unary); the request side is opaque."""

StreamBehavior = Callable[[Any, grpc.ServicerContext], Iterator[Any]]
"""A handler answering a stream of responses (unary-stream or stream-stream)."""


class WrappedHandlers:
    """Each (method, handler) an interceptor wraps, wrapped once.

    grpc runs `intercept_service` for every call, but the handler the rest of the chain answers
    for a method does not change; rebuilding the wrapped handler per call cost every call a few
    closures and handler objects per interceptor. Bounded: a chain that did hand out a new
    handler per call only makes this forget and wrap again."""

    _LIMIT = 1024

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, int], tuple[object, grpc.RpcMethodHandler[Any, Any]]] = {}

    def get(
        self,
        method: str,
        handler: grpc.RpcMethodHandler[Any, Any],
        build: Callable[[], grpc.RpcMethodHandler[Any, Any]],
    ) -> grpc.RpcMethodHandler[Any, Any]:
        key = (method, id(handler))
        found = self._by_key.get(key)
        if found is not None and found[0] is handler:  # the same object, not a reused id
            return found[1]
        wrapped = build()
        if len(self._by_key) >= self._LIMIT:
            self._by_key.clear()
        self._by_key[key] = (handler, wrapped)
        return wrapped


Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # generic in the stubs only


class HandlerInterceptor(grpc.ServerInterceptor):
    """The shape every gpualloc interceptor shares: wrap each method's handler once
    (WrappedHandlers), leaving health and reflection alone unless `covers_infrastructure`.
    Subclasses say how in `wrap`."""

    covers_infrastructure = False

    def __init__(self) -> None:
        self._wrapped = WrappedHandlers()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Handler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or (not self.covers_infrastructure and is_infrastructure_method(method)):
            return handler
        return self._wrapped.get(method, handler, lambda: self.wrap(method, handler))

    def wrap(self, method: str, handler: Handler) -> Handler:
        raise NotImplementedError


def stream_in_context(
    variable: ContextVar[Any], value: Any, start: Callable[[], Iterable[Any]]
) -> Iterator[Any]:
    """The responses of a streaming handler (`start()`), with `variable` set to `value` while
    it starts, around each step and while it is closed: a generator's body runs inside
    `next()` (and `close()`), in the context of whoever calls it, so a context variable set
    once before would not be seen there."""
    token = variable.set(value)
    try:
        responses = iter(start())
    finally:
        variable.reset(token)
    try:
        while True:
            token = variable.set(value)
            try:
                response = next(responses)
            except StopIteration:
                return
            finally:
                variable.reset(token)
            yield response
    finally:  # closed early (grpc drops a call's generator when the call ends): the handler's
        close = getattr(responses, "close", None)  # own clean-up sees `variable` too
        if close is not None:
            token = variable.set(value)
            try:
                close()
            finally:
                variable.reset(token)


class SerializedReply:
    """A unary reply its servicer wrote serialized: the message's bytes, as its serializer
    writes them. ErrorMappingInterceptor sends them as they are, instead of the servicer
    parsing them into the message for grpc to serialize it again (an AllocateBatch reply of 64
    answers: ~1.3 us per item to parse, ~1.6 to serialize)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def reply_serializer(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """`serialize` (a unary handler's response serializer), sending a SerializedReply as it is."""

    def encode(reply: Any) -> bytes:
        return reply.data if type(reply) is SerializedReply else serialize(reply)

    return encode


def rewrap_handler(
    handler: grpc.RpcMethodHandler[Any, Any],
    wrap_unary: Callable[[UnaryBehavior], UnaryBehavior],
    wrap_stream: Callable[[StreamBehavior], StreamBehavior],
    *,
    request_deserializer: Callable[[bytes], Any] | None | object = ...,
    response_serializer: Callable[[Any], bytes] | None | object = ...,
) -> grpc.RpcMethodHandler[Any, Any]:
    """The same handler (same (de)serializers, unless `request_deserializer` or
    `response_serializer` is given) with its behavior wrapped; for interceptors."""
    rebuild = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    behavior: Any
    if handler.response_streaming:
        stream = handler.unary_stream or handler.stream_stream
        assert stream is not None
        behavior = wrap_stream(stream)
    else:
        unary = handler.unary_unary or handler.stream_unary
        assert unary is not None
        behavior = wrap_unary(unary)
    deserializer = (
        handler.request_deserializer if request_deserializer is ... else request_deserializer
    )
    serializer = handler.response_serializer if response_serializer is ... else response_serializer
    return rebuild(
        behavior,
        request_deserializer=deserializer,  # type: ignore[arg-type]
        response_serializer=serializer,  # type: ignore[arg-type]
    )


class ErrorMappingInterceptor(HandlerInterceptor):
    """Turns exceptions raised by servicers into statuses (see the module docstring), decodes
    unary requests itself, and sends a unary reply a servicer wrote serialized
    (SerializedReply) as it is.

    Decoding: grpcio (1.85) leaks a stream slot and its memory for every request whose
    deserializer raises — after ~100 undecodable requests a connection refuses new streams
    (REFUSED_STREAM) and the process grows without bound. So the handler is served with raw
    bytes and the request is decoded here, inside the call: an undecodable request is an
    ordinary INVALID_ARGUMENT, logged at DEBUG without a traceback. Health checks get the same
    decoding (their other behaviour is left alone). A handler that takes a stream of requests
    gets them as `DecodedRequests`: each message decoded as it is read, an undecodable one
    raising InvalidArgument from `next()` while the stream goes on (a handler that lets it
    escape fails the call with INVALID_ARGUMENT; AllocateStream answers it as that message's
    own error)."""

    covers_infrastructure = True

    def wrap(self, method: str, handler: Handler) -> Handler:
        one = _decoder(method, handler)
        if is_infrastructure_method(method):
            if handler.request_streaming or handler.response_streaming or one is None:
                return handler  # Health.Watch must stay as grpc built it (non-blocking)
            return rewrap_handler(
                handler, lambda b: _decoding(b, one), lambda b: b, request_deserializer=None
            )
        decode: Callable[[Any], Any] | None = one
        if handler.request_streaming and handler.request_deserializer is not None:
            decode = _stream_decoder(method, handler.request_deserializer)

        def wrap_unary(behavior: UnaryBehavior) -> UnaryBehavior:
            def call(request: Any, context: grpc.ServicerContext) -> Any:
                try:
                    return behavior(decode(request) if decode else request, context)
                except Exception as error:
                    _abort(error, context, method)

            return call

        def wrap_stream(behavior: StreamBehavior) -> StreamBehavior:
            def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                try:
                    yield from behavior(decode(request) if decode else request, context)
                except Exception as error:
                    _abort(error, context, method)

            return call

        serialize = handler.response_serializer
        encode: Any = ...  # a unary reply may come serialized (SerializedReply): sent as is
        if serialize is not None and not handler.response_streaming:
            encode = reply_serializer(serialize)
        if decode is None:
            return rewrap_handler(handler, wrap_unary, wrap_stream, response_serializer=encode)
        return rewrap_handler(
            handler, wrap_unary, wrap_stream, request_deserializer=None, response_serializer=encode
        )


def _decoder(
    method: str, handler: grpc.RpcMethodHandler[Any, Any]
) -> Callable[[bytes], Any] | None:
    """A request decoder raising InvalidArgument, for handlers with one request message."""
    deserialize = handler.request_deserializer
    if deserialize is None or handler.request_streaming:
        return None

    def decode(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception:  # protobuf's DecodeError, or anything a deserializer raises
            name = method.rsplit("/", 1)[-1]
            raise InvalidArgument(
                f"{name}: the request is not a valid protobuf message ({len(raw)} bytes)"
            ) from None

    return decode


class DecodedRequests(Iterator[Any]):
    """A stream of requests decoded inside the call, one message per `next()`: a message that
    does not decode raises InvalidArgument (naming its position in the stream) and the stream
    stays readable — the next `next()` reads the message after it. StopIteration at the
    client's half-close; grpc.RpcError when the call ended (cancelled, deadline), as grpc's own
    request iterator."""

    def __init__(self, raw: Iterator[bytes], deserialize: Callable[[bytes], Any], name: str):
        self._raw = raw
        self._deserialize = deserialize
        self._name = name
        self.read = 0
        """Messages read so far, undecodable ones included."""

    def __iter__(self) -> DecodedRequests:
        return self

    def __next__(self) -> Any:
        raw = next(self._raw)
        position = self.read
        self.read += 1
        try:
            return self._deserialize(raw)
        except Exception:  # protobuf's DecodeError, or anything a deserializer raises
            raise InvalidArgument(
                f"{self._name}: message {position} of the stream is not a valid protobuf "
                f"message ({len(raw)} bytes)"
            ) from None


def _stream_decoder(
    method: str, deserialize: Callable[[bytes], Any]
) -> Callable[[Iterator[bytes]], DecodedRequests]:
    name = method.rsplit("/", 1)[-1]
    return lambda raw: DecodedRequests(raw, deserialize, name)


def _decoding(behavior: UnaryBehavior, decode: Callable[[bytes], Any]) -> UnaryBehavior:
    def call(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            decoded = decode(request)
        except InvalidArgument as error:
            _abort(error, context, "health")
        return behavior(decoded, context)

    return call


# --- client side: grpc.RpcError -> typed error ----------------------------------------------


def error_from_rpc(error: grpc.RpcError) -> GpuallocError:
    """The typed error a failed call stands for; RemoteError when its code has no type."""
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    message = (error.details() if isinstance(error, grpc.Call) else None) or code.name
    return _typed_error(code, message, _unpack_details(error))


def error_from_status(status: status_pb2.Status) -> GpuallocError:
    """The typed error a google.rpc.Status stands for (a batch item's status, whose bytes are
    one), as error_from_rpc reads a failed call's."""
    code = next((c for c in grpc.StatusCode if c.value[0] == status.code), None)
    code = code or grpc.StatusCode.UNKNOWN
    return _typed_error(code, status.message or code.name, _unpack(status.details))


def _typed_error(code: grpc.StatusCode, message: str, details: list[Message]) -> GpuallocError:
    error_type = _ERROR_TYPES.get(code)
    if error_type is None:
        return RemoteError(code, message)
    if error_type is InvalidArgument:
        return _invalid_argument(message, details)
    if error_type is Conflict:
        conflicts = [
            d.resource_name
            for d in details
            if isinstance(d, error_details_pb2.ResourceInfo)
            and d.resource_type == CONFLICT_RESOURCE_TYPE
        ]
        return Conflict(message, conflicts)
    if error_type is FailedPrecondition:
        for d in details:
            if isinstance(d, error_details_pb2.ErrorInfo) and d.reason == PREEMPTED_REASON:
                return Preempted(
                    d.metadata.get("reservation", ""), d.metadata.get("by", ""), message
                )
            if isinstance(d, error_details_pb2.ErrorInfo) and d.reason == BINDING_REASON:
                return NotBound(d.metadata.get("reservation", ""), message)
    return error_type(message)


def _unpack_details(error: grpc.RpcError) -> list[Message]:
    """The known detail messages of the call's google.rpc.Status, in order; [] if none."""
    try:
        status = rpc_status.from_call(error) if isinstance(error, grpc.Call) else None
    except ValueError:  # code/message disagree with the trailer: ignore the trailer
        status = None
    if status is None:
        return []
    return _unpack(status.details)


def _unpack(details: Iterable[Any]) -> list[Message]:
    """The known detail messages of packed `google.protobuf.Any`s, in order."""
    unpacked: list[Message] = []
    for packed in details:
        for message_type in (
            error_details_pb2.BadRequest,
            error_details_pb2.ErrorInfo,
            error_details_pb2.ResourceInfo,
        ):
            if packed.Is(message_type.DESCRIPTOR):
                detail = message_type()
                packed.Unpack(detail)
                unpacked.append(detail)
    return unpacked


def _invalid_argument(message: str, details: list[Message]) -> InvalidArgument:
    violations = [
        FieldViolation(v.field, v.description)
        for d in details
        if isinstance(d, error_details_pb2.BadRequest)
        for v in d.field_violations
    ]
    for d in details:
        if isinstance(d, error_details_pb2.ErrorInfo) and d.reason == PARSE_ERROR_REASON:
            source = d.metadata.get("source", "")
            line_text = d.metadata.get("line", "")
            line = int(line_text) if line_text.isdigit() else None
            where = source + (f":{line}" if line is not None else "")
            bare = message.removeprefix(f"{where}: ") if where else message
            return ParseError(bare, source, line)
    return InvalidArgument(message, violations)
