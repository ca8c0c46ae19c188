"""The web view over real HTTP in front of a real allocator (gRPC on port 0): what it serves,
what it refuses, and what an unauthenticated reader may see. The browser test is
test_web_browser.py."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

import pytest

from protos.allocator.v1 import allocator_pb2 as pb
from services.allocator.adapters.store.memory import MemoryReservationStore
from services.allocator.adapters.web.server import WebSettings, WebView
from services.allocator.bootstrap import start_web_view
from services.allocator.config import AllocatorSettings
from services.common.config import ServerSettings
from services.common.dra.limits import DocumentLimits
from services.common.errors import FailedPrecondition, InvalidArgument
from tests.e2e.allocator_harness import ROOT, allocate_request, owner, serve_allocator

CLAIMS = ROOT / "examples" / "claims"
CLASSES = ROOT / "examples" / "deviceclasses.yaml"  # as `gpualloc serve --demo` loads them


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    text: str


def request(
    web: WebView,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    connection = http.client.HTTPConnection("127.0.0.1", web.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return Reply(
            response.status,
            {k.lower(): v for k, v in response.getheaders()},
            response.read().decode(),
        )
    finally:
        connection.close()


def explain(web: WebView, text: str | bytes) -> Reply:
    body = text.encode() if isinstance(text, str) else text
    return request(web, "POST", "/explain", body, {"Content-Type": "application/yaml"})


@pytest.fixture
def allocator(grpc_channel_factory):
    settings = AllocatorSettings(expire_interval=0.1, device_classes=(str(CLASSES),))
    served = serve_allocator(grpc_channel_factory, MemoryReservationStore(), settings=settings)
    yield served
    served.app.close()


@pytest.fixture
def web_factory(allocator) -> Iterator[Any]:
    started: list[WebView] = []

    def make(**fields) -> WebView:
        web = WebView(allocator.app.service, WebSettings("127.0.0.1:0", **fields))
        web.start()
        started.append(web)
        return web

    yield make
    for web in started:
        web.close()


def test_the_page_shows_every_node_with_its_gpus_and_a_strict_content_policy(web_factory):
    web = web_factory()
    reply = request(web, "GET", "/")
    assert reply.status == 200
    for node in ("a100-node-1", "h100-node-1", "h100-node-2", "l40s-node-1"):
        assert f'data-node="{node}"' in reply.text
    assert reply.text.count('class="gpu free"') == 24
    assert "default-src 'none'" in reply.headers["content-security-policy"]
    assert "<script>" not in reply.text and "style=" not in reply.text  # nothing inline
    assert request(web, "GET", "/web.js").headers["content-type"].startswith("text/javascript")


def test_the_fleet_is_304_until_a_reservation_over_grpc_changes_it(web_factory, allocator):
    web = web_factory()
    first = request(web, "GET", "/fleet")
    etag = first.headers["etag"]
    assert request(web, "GET", "/fleet", headers={"If-None-Match": etag}).status == 304
    reply = allocator.stub.Allocate(
        allocate_request("mig-small-else-medium", reserve=True), metadata=owner("alice")
    )
    (reservation,) = reply.reservations
    after = request(web, "GET", "/fleet", headers={"If-None-Match": etag})
    assert after.status == 200 and after.headers["etag"] != etag
    assert 'data-holder="alice"' in after.text
    assert reservation.id in after.text  # the lease's id, on hover
    assert "lease expires" in after.text


def test_a_commit_over_grpc_redraws_the_lease_as_committed(web_factory, allocator):
    web = web_factory()
    reply = allocator.stub.Allocate(
        allocate_request("one-h100", reserve=True), metadata=owner("bob")
    )
    (reservation,) = reply.reservations
    before = request(web, "GET", "/fleet")
    assert "RESERVED, lease expires" in before.text
    assert 'data-state="reserved"' in before.text and 'data-state="committed"' not in before.text
    allocator.stub.Commit(pb.CommitRequest(reservation_id=reservation.id), metadata=owner("bob"))
    after = request(web, "GET", "/fleet", headers={"If-None-Match": before.headers["etag"]})
    assert after.status == 200
    assert "COMMITTED, no lease (committed)" in after.text
    assert 'data-state="committed"' in after.text and 'data-state="reserved"' not in after.text


EXPLAINED = {
    "a-claim-that-fits": ("mig-small-else-medium.yaml", 200, "ALLOCATED: it fits now, on a100"),
    "a-claim-that-does-not-fit": ("sixteen-h100-one-node.yaml", 200, "UNSATISFIABLE"),
}


@pytest.mark.parametrize("name, status, words", EXPLAINED.values(), ids=EXPLAINED.keys())
def test_explain_answers_a_pasted_claim_file(web_factory, name, status, words):
    reply = explain(web_factory(), (CLAIMS / name).read_text())
    assert (reply.status, words in reply.text) == (status, True), reply.text


REFUSED = {
    "not-yaml": ("a: [", 400, "&lt;pasted claim&gt;:2: document 1: invalid YAML"),
    "an-unknown-kind": ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", 400, "Pod"),
    "no-claim-in-it": (
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: x}\nspec: {}\n",
        400,
        "holds no ResourceClaim",
    ),
    "an-unknown-device-class": (
        (CLAIMS / "one-h100.yaml").read_text().replace("gpu.nvidia.com\n", "gpu.nvida.com\n", 1),
        400,
        "could not retrieve device class gpu.nvida.com",
    ),
}


@pytest.mark.parametrize("text, status, words", REFUSED.values(), ids=REFUSED.keys())
def test_bad_pasted_text_is_refused_with_the_reason(web_factory, text, status, words):
    reply = explain(web_factory(), text)
    assert reply.status == status, reply.text
    assert words in reply.text


def test_a_body_over_the_cap_is_refused_unread(web_factory):
    web = web_factory(max_body_bytes=1024)
    reply = explain(web, b"#" * 2048)
    assert reply.status == 413 and "at most 1,024" in reply.text


def test_the_document_limits_of_every_file_bound_the_pasted_text(web_factory):
    web = web_factory(document_limits=DocumentLimits(max_nodes=10))
    reply = explain(web, (CLAIMS / "mig-small-else-medium.yaml").read_text())
    assert reply.status == 400 and "GPUALLOC_MAX_DOCUMENT_NODES" in reply.text


def test_the_call_duration_bounds_the_search(web_factory):
    web = web_factory(explain_seconds=0.0)
    reply = explain(web, (CLAIMS / "sixteen-h100-one-node.yaml").read_text())
    assert reply.status == 200 and "BUDGET EXHAUSTED" in reply.text


def test_the_cel_budget_of_the_rpc_bounds_an_explain(grpc_channel_factory):
    settings = replace(AllocatorSettings(expire_interval=0.1), max_cel_cost=1000)
    served = serve_allocator(grpc_channel_factory, MemoryReservationStore(), settings=settings)
    web = WebView(served.app.service, WebSettings("127.0.0.1:0"))
    web.start()
    try:
        items = ", ".join(str(i) for i in range(20))
        costly = f"[{items}].all(x, [{items}].all(y, x + y >= 0 && device.driver != ''))"
        text = (CLAIMS / "one-h100.yaml").read_text()
        claim = text + f'        - cel:\n            expression: "{costly}"\n'
        reply = explain(web, claim)
    finally:
        web.close()
        served.app.close()
    assert reply.status == 429, reply.text
    assert "GPUALLOC_MAX_CEL_COST" in reply.text


def test_explains_beyond_the_bound_are_told_to_retry(web_factory):
    web = web_factory(max_explains=0)
    reply = explain(web, (CLAIMS / "one-h100.yaml").read_text())
    assert (reply.status, reply.headers.get("retry-after")) == (503, "1")


def test_connections_beyond_the_bound_get_503_and_a_stalled_one_is_dropped(web_factory):
    web = web_factory(max_connections=1, socket_timeout=0.5)
    stalled = socket.create_connection(("127.0.0.1", web.port))
    try:
        time.sleep(0.1)  # accepted: it holds the only handler thread, sending nothing
        assert request(web, "GET", "/fleet").status == 503
        stalled.settimeout(5)
        assert stalled.recv(1024) == b""  # closed by the server after socket_timeout
    finally:
        stalled.close()
    # its thread is free again once it has finished closing (a moment after the close is seen)
    deadline = time.monotonic() + 5
    status = request(web, "GET", "/fleet").status
    while status == 503 and time.monotonic() < deadline:
        time.sleep(0.05)
        status = request(web, "GET", "/fleet").status
    assert status == 200


def test_a_host_that_is_not_loopback_is_refused_on_loopback(web_factory):
    web = web_factory()
    reply = request(web, "GET", "/", headers={"Host": f"rebound.example:{web.port}"})
    assert reply.status == 421
    assert request(web, "GET", "/", headers={"Host": f"localhost:{web.port}"}).status == 200


def test_a_non_loopback_address_needs_insecure(allocator):
    with pytest.raises(FailedPrecondition, match="GPUALLOC_INSECURE"):
        WebView(allocator.app.service, WebSettings("0.0.0.0:0"))
    web = WebView(allocator.app.service, WebSettings("0.0.0.0:0", insecure=True))
    web.close()


def test_a_busy_port_is_a_clear_error(web_factory, allocator):
    web = web_factory()
    with pytest.raises(InvalidArgument, match="GPUALLOC_WEB_LISTEN: cannot listen"):
        WebView(allocator.app.service, WebSettings(f"127.0.0.1:{web.port}"))


def test_under_a_policy_a_reader_sees_tenants_not_owners_or_ids(web_factory, allocator):
    web = web_factory(tenants_only=True)
    held = [
        allocator.stub.Allocate(
            allocate_request("eight-h100", reserve=True, idempotency_key=f"k{i}"),
            metadata=owner("team-a/alice"),
        )
        .reservations[0]
        .id
        for i in range(2)
    ]
    fleet = request(web, "GET", "/fleet").text
    assert 'data-holder="team-a"' in fleet and "held by tenant team-a" in fleet
    answer = explain(web, (CLAIMS / "eight-h100.yaml").read_text())
    assert answer.status == 200 and "UNSATISFIABLE" in answer.text
    assert "a reservation of tenant team-a" in answer.text
    for text in (fleet, answer.text):
        assert "alice" not in text
        assert not any(reservation_id in text for reservation_id in held)


POLICY_SETTINGS = {
    "development-mode-shows-everything": ("", False),
    "an-access-policy-shows-tenants-only": ("/etc/gpualloc/policy.yaml", True),
}


@pytest.mark.parametrize("policy, tenants_only", POLICY_SETTINGS.values(), ids=POLICY_SETTINGS)
def test_start_web_view_shows_tenants_only_under_a_policy(allocator, policy, tenants_only):
    server = replace(ServerSettings(), auth_policy_file=policy)
    settings = replace(AllocatorSettings(), server=server, web_listen_address="127.0.0.1:0")
    web = start_web_view(allocator.app, settings, DocumentLimits())
    assert web is not None
    try:
        assert web.settings.tenants_only is tenants_only
        scope = "show their tenant only" if tenants_only else "every holder is shown"
        assert scope in request(web, "GET", "/").text
    finally:
        web.close()


def test_no_web_view_unless_it_is_set(allocator):
    assert start_web_view(allocator.app, AllocatorSettings(), DocumentLimits()) is None


def test_the_page_works_without_javascript(web_factory):
    """The form posts url-encoded: the whole page comes back with the answer in it."""
    text = (CLAIMS / "one-h100.yaml").read_text()
    web = web_factory()
    body = urlencode({"claim": text}).encode()
    reply = request(
        web, "POST", "/explain", body, {"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert reply.status == 200
    assert "<!doctype html>" in reply.text and "ALLOCATED" in reply.text
    assert 'data-node="h100-node-1"' in reply.text
