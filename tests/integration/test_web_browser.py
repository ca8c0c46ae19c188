"""The web view in a real browser: Debian's headless Chromium (Selenium, tests/web_browser.py)
on the demo cluster served in process, reservations made over real gRPC.

Never skipped: when /usr/bin/chromium or its chromedriver is missing the tests FAIL saying what
to install (`make test` installs both, as .ci/run does); `pytest -m "not browser"` leaves them
out on purpose.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from protos.allocator.v1 import allocator_pb2 as pb
from tests.e2e.allocator_harness import ROOT
from tests.web_browser import DemoWeb, chromium_driver, demo_web, paste_and_explain

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

CLAIMS = ROOT / "examples" / "claims"


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoWeb]:
    with demo_web() as started:
        yield started


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    driver = chromium_driver()  # fails, saying what to install, without Chromium
    yield driver
    driver.quit()


@pytest.fixture
def page(demo: DemoWeb, browser: WebDriver) -> WebDriver:
    browser.get(demo.web.url)
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".node"))
    return browser


def test_the_page_shows_the_demo_fleet(page):
    # Read in one script: a live update may render the fleet again between two WebDriver calls
    # (an element found by one is then stale for the next).
    nodes, gpus, a100 = page.execute_script(
        "const nodes = Array.from(document.querySelectorAll('.node'), e => e.dataset.node);"
        "const a100 = document.querySelector('.node[data-node=\"a100-node-1\"]');"
        "return [nodes, document.querySelectorAll('.gpu').length, a100 ? a100.innerText : ''];"
    )
    assert nodes == ["a100-node-1", "h100-node-1", "h100-node-2", "l40s-node-1"]
    assert gpus == 24
    assert "fragmentation" in a100 and "A100-SXM4-40GB" in a100
    assert page.find_element(By.ID, "status").text == "live"


def test_a_reservation_over_grpc_shows_within_a_second(page, demo):
    response = demo.reserve("mig-small-else-medium", "browser-test", idempotency_key="b-1")
    reserved = time.monotonic()
    device = response.allocations[0].allocation.results[0].device
    selector = f'.slot[data-device="{device}"][data-holder="browser-test"]'
    slot = WebDriverWait(page, 1.0, poll_frequency=0.02).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, selector)
    )[0]
    seen = time.monotonic() - reserved
    assert seen < 1.0
    ActionChains(page).move_to_element(slot).perform()  # what a user hovers over
    hover = slot.get_attribute("title") or ""
    assert device in hover and "held by browser-test" in hover
    assert response.reservations[0].id in hover and "lease expires" in hover
    legend = page.find_element(By.CSS_SELECTOR, '.legend li[data-holder="browser-test"]')
    assert "1 device" in legend.text
    print(f"reservation visible in the browser {seen * 1000:.0f} ms after Allocate returned")


def test_a_release_over_grpc_frees_the_slot_again(page, demo):
    response = demo.reserve("one-h100", "release-test", idempotency_key="b-2")
    (reservation,) = response.reservations
    selector = '.slot[data-holder="release-test"]'
    WebDriverWait(page, 2.0, poll_frequency=0.02).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, selector)
    )
    demo.stub.Release(
        pb.ReleaseRequest(reservation_id=reservation.id),
        metadata=(("x-gpualloc-owner", "release-test"),),
    )
    WebDriverWait(page, 2.0, poll_frequency=0.02).until(
        lambda d: not d.find_elements(By.CSS_SELECTOR, selector)
    )


def test_reserved_and_committed_holders_look_different(page, demo):
    """A reserved device is striped (its lease runs), a committed one solid (issue 28: the
    two looked the same); the legend says which is which."""
    response = demo.reserve("one-h100", "commit-test", idempotency_key="b-3")
    (reservation,) = response.reservations
    selector = '.slot[data-holder="commit-test"]'
    slot = WebDriverWait(page, 2.0, poll_frequency=0.02).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, selector)
    )[0]
    assert "repeating-linear-gradient" in slot.value_of_css_property("background-image")
    owner = (("x-gpualloc-owner", "commit-test"),)
    demo.stub.Commit(pb.CommitRequest(reservation_id=reservation.id), metadata=owner)
    try:
        committed = WebDriverWait(page, 2.0, poll_frequency=0.02).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, f'{selector}[data-state="committed"]')
        )[0]
        assert committed.value_of_css_property("background-image") == "none"
        legend = page.find_element(By.CSS_SELECTOR, ".legend").text
        assert "reserved (lease running)" in legend and "committed" in legend
    finally:
        demo.stub.Release(pb.ReleaseRequest(reservation_id=reservation.id), metadata=owner)


def test_the_legend_names_tainted_with_the_dashed_border_a_tainted_gpu_has(page):
    """A tainted GPU is drawn with a dashed border (issue 28: the legend did not say so)."""
    item = page.find_element(By.CSS_SELECTOR, ".legend li:has(.swatch.tainted)")
    assert item.text.startswith("tainted")
    swatch = item.find_element(By.CSS_SELECTOR, ".swatch.tainted")
    assert swatch.value_of_css_property("border-top-style") == "dashed"
    assert swatch.value_of_css_property("border-top-color") == "rgba(185, 28, 28, 1)"


EXPLAINS = {
    "a-claim-that-does-not-fit": ("sixteen-h100-one-node.yaml", "UNSATISFIABLE", "8 of 16 devices"),
    "a-claim-that-fits": ("mig-small-else-medium.yaml", "ALLOCATED", "a100-node-1"),
}


@pytest.mark.parametrize("name, outcome, words", EXPLAINS.values(), ids=EXPLAINS.keys())
def test_a_pasted_claim_gets_an_explain_answer(page, name, outcome, words):
    shown = paste_and_explain(page, (CLAIMS / name).read_text())
    assert shown.startswith(outcome)
    answer = page.find_element(By.CSS_SELECTOR, "#explain-result .answer").text
    assert words in answer


def test_bad_text_gets_the_parsers_message_not_a_traceback(page):
    shown = paste_and_explain(page, "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\n")
    assert shown.startswith("400: <pasted claim>:")
    assert "Traceback" not in page.page_source


def test_a_missing_browser_fails_saying_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without chromedriver the browser tests fail (issue 28: they were skipped silently)."""
    import tests.web_browser as harness

    monkeypatch.setattr(harness, "CHROMEDRIVER", "/nonexistent/chromedriver")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(pytest.fail.Exception, match="apt-get install chromium-driver"):
        chromium_driver()
