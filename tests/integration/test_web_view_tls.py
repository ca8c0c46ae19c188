"""The web view under mutual TLS and an access policy (issue 28): `gpualloc serve`'s
start_web_view gives it the gRPC port's certificate and policy, so it is HTTPS taking the same
identities, a client certificate or a bearer JWT, bound to roles by the same policy.

A real headless Chromium (tests/web_browser.py) trusts exactly the server's certificate
(`--ignore-certificate-errors-spki-list`) and sends a scheduler's token as every request's
`Authorization` header (DevTools' Network.setExtraHTTPHeaders, as a login proxy would add it):
the fleet draws and Explain answers; without the header the page says why it is refused.
Python's TLS client checks the table of identities: a reader's certificate, tokens, an unbound
certificate, none.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from services.allocator.adapters.web.server import WebView
from services.allocator.bootstrap import start_web_view
from services.allocator.config import AllocatorSettings
from services.common.config import ServerSettings
from services.common.dra.limits import DocumentLimits
from services.common.errors import FailedPrecondition
from tests.e2e.allocator_harness import ROOT
from tests.security_fixtures import AGENT_SUBJECT, SecuredFleet, policy_with, secured_fleet
from tests.web_browser import chromium_driver, paste_and_explain

CLAIM = (ROOT / "examples" / "claims" / "one-h100.yaml").read_text()
QUOTAS = """\
  quota:
    resources: [{name: gpus, deviceClassNames: [gpu.nvidia.com]}]
  tenants:
  - {name: team-a, cohort: shared, quotas: [{resource: gpus, nominal: 4}]}
  - name: team-b
  - {name: team-c, cohort: shared, quotas: [{resource: gpus, nominal: 8}]}
  - name: tools
    allowAdminAccess: true
  - name: hpc
"""


@dataclass(frozen=True)
class SecuredWeb:
    fleet: SecuredFleet
    web: WebView

    def request(
        self, path: str, *, who: str | None = None, token: str = "", body: str = ""
    ) -> tuple[int, str]:
        """(status, body) of GET `path` (POST with `body`) as `who`'s certificate and/or with
        `token` as the bearer."""
        context = ssl.create_default_context(cafile=str(self.fleet.directory / "ca.crt"))
        if who is not None:
            folder = self.fleet.directory / who
            context.load_cert_chain(str(folder / "tls.crt"), str(folder / "tls.key"))
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self.web.port, context=context, timeout=30
        )
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            connection.request("POST" if body else "GET", path, body or None, headers)
            reply = connection.getresponse()
            return reply.status, reply.read().decode()
        finally:
            connection.close()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredWeb]:
    directory = tmp_path_factory.mktemp("secured-web")
    with secured_fleet(directory, policy=policy_with(QUOTAS)) as fleet:
        server = ServerSettings(
            tls_cert_file=str(directory / "server" / "tls.crt"),
            tls_key_file=str(directory / "server" / "tls.key"),
            tls_client_ca_file=str(directory / "ca.crt"),
            auth_policy_file=str(fleet.policy_file),
        )
        settings = replace(AllocatorSettings(), server=server, web_listen_address="127.0.0.1:0")
        web = start_web_view(fleet.cluster.allocator, settings, DocumentLimits())
        assert web is not None
        try:
            yield SecuredWeb(fleet, web)
        finally:
            web.close()


# case -> (certificate, token: "scheduler" | "agent" | "expired" | "", path, status, text)
IDENTITIES = {
    "reader-certificate-reads-the-fleet": ("reader", "", "/fleet", 200, 'data-node="h100-node-1"'),
    "reader-certificate-explains": ("reader", "", "/explain", 200, "ALLOCATED"),
    "scheduler-token-reads-the-page": (None, "scheduler", "/", 200, "show their tenant only"),
    "no-identity-is-unauthenticated": (None, "", "/", 401, "needs an identity"),
    "unbound-certificate-is-denied": ("stranger", "", "/fleet", 403, "not bound to any role"),
    "agent-token-may-not-read-reservations": (None, "agent", "/fleet", 403, "reservations.read"),
    "expired-token-is-unauthenticated": (None, "expired", "/fleet", 401, "expired"),
}


@pytest.mark.parametrize(
    ("who", "token", "path", "status", "text"),
    [pytest.param(*case, id=name) for name, case in IDENTITIES.items()],
)
def test_the_web_view_takes_the_grpc_ports_identities(
    secured: SecuredWeb, who: str | None, token: str, path: str, status: int, text: str
) -> None:
    assert secured.web.url.startswith("https://127.0.0.1:")
    bearer = {
        "": "",
        "scheduler": secured.fleet.token(),
        "agent": secured.fleet.token(AGENT_SUBJECT),
        "expired": secured.fleet.token(expires_in=-120),
    }[token]
    body = CLAIM if path == "/explain" else ""
    got, answer = secured.request(path, who=who, token=bearer, body=body)
    assert got == status, answer
    assert text in answer, answer


# case -> (certificate, token, the tenants whose quota rows the panel shows)
QUOTA_VIEWERS = {
    "a-tenants-certificate-sees-its-own-quota": ("scheduler-a", "", {"team-a"}),
    "a-tenants-token-sees-its-own-quota": (None, "scheduler", {"team-c"}),
    "an-admin-sees-every-tenants-quota": ("admin", "", {"team-a", "team-c"}),
    "a-reader-of-no-tenant-sees-none": ("reader", "", set()),
}


@pytest.mark.parametrize(
    ("who", "token", "tenants"),
    [pytest.param(*case, id=name) for name, case in QUOTA_VIEWERS.items()],
)
def test_the_quotas_panel_shows_what_quota_status_would(
    secured: SecuredWeb, who: str | None, token: str, tenants: set[str]
) -> None:
    """The panel follows QuotaStatus's rule for the request's own identity."""
    bearer = secured.fleet.token() if token else ""
    for path in ("/", "/fleet"):
        status, body = secured.request(path, who=who, token=bearer)
        assert status == 200 and '<div class="quotas"><h2>Quotas</h2>' in body
        shown = {t for t in ("team-a", "team-b", "team-c") if f'<tr data-tenant="{t}">' in body}
        assert shown == tenants, body
        if not tenants:
            assert "shown to the identities of their own tenant" in body
    if tenants == {"team-a"}:
        assert "<td>team-a</td><td>gpus</td><td>shared</td><td>4</td><td>0</td>" in body


def test_plain_http_to_the_https_port_gets_no_page(secured: SecuredWeb) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", secured.web.port, timeout=10)
    try:
        with pytest.raises((http.client.HTTPException, OSError)):
            connection.request("GET", "/")
            connection.getresponse().read()
    finally:
        connection.close()
    assert secured.request("/fleet", who="reader")[0] == 200  # and the server goes on


def _spki_hash(certificate: Path) -> str:
    """Chromium's --ignore-certificate-errors-spki-list entry: base64 SHA-256 of the key."""
    key = x509.load_pem_x509_certificate(certificate.read_bytes()).public_key()
    der = key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


@pytest.mark.browser
@pytest.mark.timeout(180)
def test_a_browser_sees_the_fleet_over_tls_with_a_token(
    secured: SecuredWeb, tmp_path: Path
) -> None:
    spki = _spki_hash(secured.fleet.directory / "server" / "tls.crt")
    driver = chromium_driver(
        arguments=(f"--ignore-certificate-errors-spki-list={spki}", f"--user-data-dir={tmp_path}")
    )
    try:
        driver.get(secured.web.url)  # no identity yet: refused, saying why
        refused = WebDriverWait(driver, 30).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, ".outcome.error")
        )
        assert "401" in refused[0].text and "needs an identity" in refused[0].text
        driver.execute_cdp_cmd("Network.enable", {})
        bearer = {"Authorization": f"Bearer {secured.fleet.token()}"}
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": bearer})
        driver.get(secured.web.url)
        WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".gpu"))
        assert driver.current_url.startswith("https://")
        quotas = driver.find_elements(By.CSS_SELECTOR, ".quotas tr[data-tenant]")
        assert [q.get_attribute("data-tenant") for q in quotas] == ["team-c"]  # the token's
        assert "ALLOCATED" in paste_and_explain(driver, CLAIM)
    finally:
        driver.quit()


def test_served_with_identities_it_may_listen_beyond_loopback(secured: SecuredWeb) -> None:
    """Without GPUALLOC_INSECURE a non-loopback web view is refused unless it is HTTPS with
    the policy's identities (test_a_non_loopback_address_needs_insecure: plain HTTP)."""
    service = secured.fleet.cluster.allocator.service
    web = WebView(service, replace(secured.web.settings, listen_address="0.0.0.0:0"))
    try:
        assert web.url.startswith("https://") and not web.settings.insecure
    finally:
        web.close()
    without_policy = replace(secured.web.settings, listen_address="0.0.0.0:0", authenticator=None)
    with pytest.raises(FailedPrecondition, match="GPUALLOC_INSECURE"):
        WebView(service, without_policy)
