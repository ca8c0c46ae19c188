"""A real browser on the web view: Debian's headless Chromium driven by Selenium.

`chromium_driver()` starts /usr/bin/chromium through Debian's chromedriver (chromium-driver,
always the browser's own version; nothing is downloaded: the driver's path is given, so
Selenium Manager is not used). tests/integration/test_web_browser.py uses it; run as a script
it draws the README's screenshot of the demo fleet with a few reservations and an Explain:

    .venv/bin/python -m tests.web_browser docs/figures/web-view.png
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from protos.allocator.v1 import allocator_pb2 as pb
from protos.allocator.v1 import allocator_pb2_grpc
from protos.common.v1 import dra_pb2
from services.allocator.adapters.web.server import WebSettings, WebView
from services.bridges import local_cluster
from tests.e2e.allocator_harness import ROOT, pb_claims

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def missing_browser() -> str | None:
    """Why no browser test can run here (None: it can)."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).exists() and not shutil.which(Path(path).name):
            return f"{path} is missing: apt-get install {package} (make test installs it)"
    return None


def chromium_driver(
    width: int = 1400, height: int = 1000, arguments: Sequence[str] = ()
) -> WebDriver:
    """Headless Chromium (with `arguments` added); the test FAILS (never skips) when it or its
    driver is missing."""
    missing = missing_browser()
    if missing is not None:
        pytest.fail(missing, pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if Path(CHROMIUM).exists() else str(shutil.which("chromium"))
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
        *arguments,
    ):
        options.add_argument(argument)
    driver_path = CHROMEDRIVER if Path(CHROMEDRIVER).exists() else shutil.which("chromedriver")
    return webdriver.Chrome(service=Service(str(driver_path)), options=options)


@dataclass
class DemoWeb:
    """The demo cluster (inventory + allocator in process), its web view, a gRPC stub."""

    cluster: local_cluster.LocalCluster
    web: WebView
    stub: allocator_pb2_grpc.AllocatorStub

    def reserve(self, claim: str, owner: str, idempotency_key: str = "") -> pb.AllocateResponse:
        """Allocate(reserve) examples/claims/<claim>.yaml, or a `profile:<MIG profile>` slice."""
        claims = mig_claim(claim.split(":", 1)[1]) if claim.startswith("profile:") else None
        request = pb.AllocateRequest(
            claims=claims or pb_claims(claim), reserve=True, idempotency_key=idempotency_key
        )
        response: pb.AllocateResponse = self.stub.Allocate(
            request, metadata=(("x-gpualloc-owner", owner),), timeout=30
        )
        return response


def mig_claim(profile: str) -> list[dra_pb2.ResourceClaim]:
    """One MIG slice of `profile` (e.g. `3g.20gb`)."""
    selector = f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"
    exactly = dra_pb2.ExactDeviceRequest(
        device_class_name="mig.nvidia.com",
        count=1,
        selectors=[dra_pb2.DeviceSelector(cel=selector)],
    )
    request = dra_pb2.DeviceRequest(name="slice", exactly=exactly)
    return [dra_pb2.ResourceClaim(name=f"mig-{profile}", namespace="default", requests=[request])]


@contextmanager
def demo_web() -> Iterator[DemoWeb]:
    cluster = local_cluster.start()
    web = WebView(cluster.allocator.service, WebSettings("127.0.0.1:0"))
    web.start()
    channel = grpc.insecure_channel(cluster.target)
    try:
        yield DemoWeb(cluster, web, allocator_pb2_grpc.AllocatorStub(channel))
    finally:
        channel.close()
        web.close()
        cluster.close()


def paste_and_explain(driver: WebDriver, text: str, timeout: float = 30.0) -> str:
    """Type `text` into the Explain box, press Explain; the answer's outcome line."""
    box = driver.find_element(By.ID, "claim")
    box.clear()
    box.send_keys(text)
    driver.find_element(By.ID, "explain-button").click()
    outcome = WebDriverWait(driver, timeout).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "#explain-result .outcome")
    )
    return str(outcome[0].text)


def draw_screenshot(path: Path) -> None:
    """The demo fleet with a few holders, MIG slices among them, and an Explain answer."""
    with demo_web() as demo:
        demo.reserve("eight-h100", "team-a/train-llm", idempotency_key="shot-1")
        demo.reserve("four-nvlink-gpus", "team-b/finetune", idempotency_key="shot-2")
        for i in range(3):
            demo.reserve("mig-small-else-medium", "team-c/notebooks", idempotency_key=f"mig-{i}")
        demo.reserve("profile:3g.20gb", "team-d/eval", idempotency_key="mig-3g")
        demo.reserve("profile:2g.10gb", "team-c/notebooks", idempotency_key="mig-2g")
        demo.reserve("profile:4g.20gb", "team-a/train-llm", idempotency_key="mig-4g")
        demo.reserve("two-gpus-same-pcie-root", "team-b/inference", idempotency_key="shot-3")
        driver = chromium_driver(1440, 1050)
        try:
            driver.get(demo.web.url)
            WebDriverWait(driver, 10).until(
                lambda d: len(d.find_elements(By.CSS_SELECTOR, ".slot")) >= 4
            )
            claim = (ROOT / "examples" / "claims" / "sixteen-h100-one-node.yaml").read_text()
            paste_and_explain(driver, claim)
            path.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(path))
        finally:
            driver.quit()


if __name__ == "__main__":
    draw_screenshot(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/figures/web-view.png"))
