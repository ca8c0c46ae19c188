"""create_server builds a production-shaped server: health, reflection, limits, deadlines, drain.

Real servers on port 0, real channels, grpcio's own health and reflection clients.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from services.common.config import ServerSettings
from services.common.deadline import UNBOUNDED, Deadline
from services.common.errors import DeadlineExceeded, FailedPrecondition
from services.common.grpc_server import (
    ServiceRegistration,
    call_deadline,
    create_server,
    serve_until_signal,
)
from services.common.health import Health, ServingStatus, graceful_shutdown
from tests.conftest import GrpcChannelFactory, ServedGrpc

ECHO = "gpualloc.test.v1.Echo"
SLOW = "gpualloc.test.v1.Slow"
HEALTH_NAME = "grpc.health.v1.Health"
REFLECTION_NAME = "grpc.reflection.v1alpha.ServerReflection"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _generic(
    name: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
) -> ServiceRegistration:
    return ServiceRegistration(
        name,
        lambda servicer, server: server.add_generic_rpc_handlers((servicer,)),
        grpc.method_handlers_generic_handler(name, handlers),
    )


def _echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    return request


def _remaining_stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    yield repr(call_deadline(context).left()).encode()  # a stream: no server cap


def _echo_service(
    max_call_seconds: float | None = None, seen: list[Deadline] | None = None
) -> ServiceRegistration:
    """Echo, and Remaining: sleeps for the request's seconds, then answers the time left of
    the call's deadline (capped at `max_call_seconds`, as a servicer caps it), kept in `seen`."""

    def remaining(request: bytes, context: grpc.ServicerContext) -> bytes:
        deadline = call_deadline(context, max_call_seconds)
        if seen is not None:
            seen.append(deadline)
        time.sleep(float(request or b"0"))
        deadline.check("echo")
        return repr(deadline.left()).encode()

    return _generic(
        ECHO,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(_echo),
            "Remaining": grpc.unary_unary_rpc_method_handler(remaining),
            "RemainingStream": grpc.unary_stream_rpc_method_handler(_remaining_stream),
        },
    )


class SlowServicer:
    """A call that stays in flight until the test releases it."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def slow(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.started.set()
        assert self.release.wait(timeout=10)
        return b"done"

    def registration(self) -> ServiceRegistration:
        return _generic(SLOW, {"Slow": grpc.unary_unary_rpc_method_handler(self.slow)})


def _check(served: ServedGrpc, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(served.channel)
    response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    status: int = response.status
    return status


# --- health -----------------------------------------------------------------------------------


@pytest.mark.parametrize("service", [pytest.param(n, id=n or "overall") for n in (ECHO, SLOW, "")])
def test_health_reports_every_registered_service_serving(
    grpc_channel_factory: GrpcChannelFactory, service: str
) -> None:
    served = grpc_channel_factory([_echo_service(), SlowServicer().registration()])
    assert _check(served, service) == SERVING


def test_health_answers_not_found_for_an_unknown_service(
    grpc_channel_factory: GrpcChannelFactory,
) -> None:
    served = grpc_channel_factory([_echo_service()])
    with pytest.raises(grpc.RpcError) as caught:
        _check(served, "gpualloc.nope.v1.Nope")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert served.health.status("gpualloc.nope.v1.Nope") is ServingStatus.UNKNOWN_SERVICE


def test_health_set_not_serving_affects_only_that_service(
    grpc_channel_factory: GrpcChannelFactory,
) -> None:
    served = grpc_channel_factory([_echo_service(), SlowServicer().registration()])
    served.health.set_not_serving(SLOW)
    assert (_check(served, SLOW), _check(served, ECHO), _check(served, "")) == (
        NOT_SERVING,
        SERVING,
        SERVING,
    )
    served.health.set_serving(SLOW)
    assert _check(served, SLOW) == SERVING


def test_graceful_shutdown_reports_not_serving_and_drains_in_flight_call(
    grpc_channel_factory: GrpcChannelFactory,
) -> None:
    slow = SlowServicer()
    served = grpc_channel_factory([_echo_service(), slow.registration()])
    in_flight = served.unary(f"/{SLOW}/Slow").future(b"", timeout=10)
    assert slow.started.wait(timeout=5)
    watch = health_pb2_grpc.HealthStub(served.channel).Watch(
        health_pb2.HealthCheckRequest(service=SLOW), timeout=10
    )
    assert next(watch).status == SERVING

    stopper = threading.Thread(target=graceful_shutdown, args=(served.server, served.health, 5.0))
    stopper.start()
    assert next(watch).status == NOT_SERVING  # pushed to the open Watch stream
    watch.cancel()
    assert served.health.status(ECHO) is ServingStatus.NOT_SERVING
    assert served.health.status("") is ServingStatus.NOT_SERVING
    served.health.set_serving(ECHO)  # ignored while draining
    assert served.health.status(ECHO) is ServingStatus.NOT_SERVING
    assert stopper.is_alive()  # still draining the slow call

    slow.release.set()
    assert in_flight.result(timeout=5) == b"done"
    stopper.join(timeout=5)
    assert not stopper.is_alive()


def test_serve_until_signal_drains_on_sigterm_and_restores_handlers(
    grpc_channel_factory: GrpcChannelFactory,
) -> None:
    slow = SlowServicer()
    served = grpc_channel_factory([slow.registration()])
    in_flight = served.unary(f"/{SLOW}/Slow").future(b"", timeout=10)
    assert slow.started.wait(timeout=5)
    seen_during_drain: list[ServingStatus] = []

    def terminate_then_release() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not served.health.shutting_down and time.monotonic() < deadline:
            time.sleep(0.01)
        seen_during_drain.append(served.health.status(SLOW))
        slow.release.set()

    before = signal.getsignal(signal.SIGTERM)
    helper = threading.Timer(0.1, terminate_then_release)
    helper.start()
    received = serve_until_signal(served.server, served.health, grace_seconds=5.0)
    helper.join()

    assert received == signal.SIGTERM
    assert seen_during_drain == [ServingStatus.NOT_SERVING]
    assert in_flight.result(timeout=5) == b"done"
    assert signal.getsignal(signal.SIGTERM) == before


def test_serve_until_signal_returns_when_server_stops_by_itself(
    grpc_channel_factory: GrpcChannelFactory,
) -> None:
    served = grpc_channel_factory([_echo_service()])
    threading.Timer(0.1, lambda: served.server.stop(None)).start()
    assert serve_until_signal(served.server, served.health, grace_seconds=1.0) is None


# --- reflection -------------------------------------------------------------------------------


def test_reflection_lists_registered_services_health_and_reflection(
    grpc_channel_factory: GrpcChannelFactory,
) -> None:
    served = grpc_channel_factory([_echo_service(), SlowServicer().registration()])
    database = ProtoReflectionDescriptorDatabase(served.channel)
    assert sorted(database.get_services()) == sorted([ECHO, SLOW, HEALTH_NAME, REFLECTION_NAME])


# --- limits -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "code"),
    [
        pytest.param(900, grpc.StatusCode.OK, id="under-limit"),
        pytest.param(4096, grpc.StatusCode.RESOURCE_EXHAUSTED, id="over-limit"),
    ],
)
def test_request_size_limit(
    grpc_channel_factory: GrpcChannelFactory, size: int, code: grpc.StatusCode
) -> None:
    settings = ServerSettings(max_receive_message_bytes=1024)
    echo = grpc_channel_factory([_echo_service()], settings).unary(f"/{ECHO}/Echo")
    try:
        assert echo(b"x" * size, timeout=5) == b"x" * size
        got = grpc.StatusCode.OK
    except grpc.RpcError as error:
        got = error.code()
    assert got == code


def test_response_size_limit(grpc_channel_factory: GrpcChannelFactory) -> None:
    settings = ServerSettings(max_receive_message_bytes=8192, max_send_message_bytes=1024)
    echo = grpc_channel_factory([_echo_service()], settings).unary(f"/{ECHO}/Echo")
    with pytest.raises(grpc.RpcError) as caught:
        echo(b"x" * 4096, timeout=5)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_busy_address_fails_with_failed_precondition(
    grpc_channel_factory: GrpcChannelFactory,
) -> None:
    served = grpc_channel_factory([_echo_service()])
    with pytest.raises(FailedPrecondition) as caught:
        create_server(served.target, [_echo_service()], ServerSettings())
    assert caught.value.message == (
        f"cannot listen on {served.target}: the address is in use or not local"
    )


def test_duplicate_registration_is_refused() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        create_server("127.0.0.1:0", [_echo_service(), _echo_service()], ServerSettings())


# --- deadlines --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_call_seconds", "client_timeout", "upper_bound"),
    [
        pytest.param(3.0, None, 3.0, id="no-client-deadline-capped-by-server"),
        pytest.param(30.0, 2.0, 2.0, id="client-deadline-shorter"),
        pytest.param(2.0, 20.0, 2.0, id="server-cap-shorter"),
    ],
)
def test_the_call_deadline_is_the_shorter_of_client_deadline_and_server_cap(
    grpc_channel_factory: GrpcChannelFactory,
    max_call_seconds: float,
    client_timeout: float | None,
    upper_bound: float,
) -> None:
    served = grpc_channel_factory([_echo_service(max_call_seconds)])
    remaining = served.unary(f"/{ECHO}/Remaining")
    seconds = float(remaining(b"", timeout=client_timeout))
    assert upper_bound - 1.0 < seconds <= upper_bound + 0.05  # grpc adds a few ms of slack


def test_check_raises_deadline_exceeded_once_the_cap_is_spent(
    grpc_channel_factory: GrpcChannelFactory,
) -> None:
    remaining = grpc_channel_factory([_echo_service(0.01)]).unary(f"/{ECHO}/Remaining")
    with pytest.raises(grpc.RpcError) as caught:
        remaining(b"0.05", timeout=5)
    assert (caught.value.code(), caught.value.details()) == (
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "echo: ran out of time",
    )


@pytest.mark.parametrize(
    ("client_timeout", "expected"),
    [
        pytest.param(None, "None", id="no-client-deadline-no-bound"),
        pytest.param(2.0, "bounded", id="client-deadline"),
    ],
)
def test_streams_are_bounded_by_the_client_deadline_only(
    grpc_channel_factory: GrpcChannelFactory, client_timeout: float | None, expected: str
) -> None:
    settings = ServerSettings(max_call_seconds=0.5)
    stream = grpc_channel_factory([_echo_service()], settings).unary_stream(
        f"/{ECHO}/RemainingStream"
    )
    [answer] = list(stream(b"", timeout=client_timeout))
    if expected == "None":
        assert answer == b"None"
    else:
        assert 1.0 < float(answer) <= 2.05


def test_the_deadlines_event_is_set_when_the_call_ends(
    grpc_channel_factory: GrpcChannelFactory,
) -> None:
    seen: list[Deadline] = []
    remaining = grpc_channel_factory([_echo_service(seen=seen)]).unary(f"/{ECHO}/Remaining")
    remaining(b"", timeout=5)
    [deadline] = seen
    assert deadline.cancelled is not None and deadline.cancelled.wait(5)
    assert deadline.passed()  # work still going on for the call stops


def test_an_unbounded_deadline_never_runs_out() -> None:
    assert UNBOUNDED.left() is None
    assert not UNBOUNDED.bounded and not UNBOUNDED.passed()
    UNBOUNDED.check()  # no call, no deadline: never raises


@pytest.mark.parametrize(
    ("make", "left", "passed"),
    [
        pytest.param(lambda: Deadline.after(None), None, False, id="after-none-is-unbounded"),
        pytest.param(lambda: Deadline.after(0.0), 0.0, True, id="after-zero-has-passed"),
        pytest.param(lambda: Deadline.after(60.0), 60.0, False, id="after-a-minute"),
        pytest.param(lambda: Deadline.after(60.0).answering(), 59.9, False, id="answering-margin"),
        pytest.param(
            lambda: Deadline.after(0.5).answering(), 0.45, False, id="margin-at-most-10pc"
        ),
    ],
)
def test_deadline_values(make: Callable[[], Deadline], left: float | None, passed: bool) -> None:
    deadline = make()
    if left is None:
        assert deadline.left() is None
    else:
        seconds = deadline.left()
        assert seconds is not None and left - 0.05 <= seconds <= left
    assert deadline.passed() is passed


def test_a_cancelled_deadline_has_passed_but_check_only_counts_time() -> None:
    ended = threading.Event()
    deadline = Deadline.after(60.0, ended)
    assert not deadline.passed()
    ended.set()
    assert deadline.passed() and deadline.answering().passed()
    deadline.check()  # the time is not up: check raises only for time (the search stops)
    with pytest.raises(DeadlineExceeded, match="commit: ran out of time"):
        Deadline.after(0.0).check("commit")


def test_health_object_can_be_shared_and_owned_by_the_caller() -> None:
    health = Health()
    server, port = create_server("127.0.0.1:0", [_echo_service()], ServerSettings(), health=health)
    try:
        assert port > 0
        assert health.status(ECHO) is ServingStatus.SERVING
        assert health.status("") is ServingStatus.SERVING
    finally:
        server.stop(None).wait()
