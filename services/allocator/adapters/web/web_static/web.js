// The web view's only script: keep the fleet current, and run Explain without a page reload.
// The server renders every piece of HTML; this file only fetches it (no build step).
"use strict";

const POLL_MS = 250; // a change shows within a second (tests/integration/test_web_browser.py)

function startPolling() {
  const fleet = document.getElementById("fleet");
  const status = document.getElementById("status");
  let etag = "";
  async function poll() {
    try {
      const headers = etag ? { "If-None-Match": etag } : {};
      const response = await fetch("/fleet", { headers, cache: "no-store" });
      if (response.status === 200) {
        etag = response.headers.get("ETag") || "";
        fleet.innerHTML = await response.text();
      }
      const live = response.status === 200 || response.status === 304;
      status.textContent = live ? "live" : "stale (" + response.status + ")";
      status.classList.toggle("stale", !live);
    } catch (error) {
      status.textContent = "disconnected";
      status.classList.add("stale");
    }
    setTimeout(poll, POLL_MS);
  }
  poll();
}

function startExplain() {
  const form = document.getElementById("explain-form");
  const claim = document.getElementById("claim");
  const result = document.getElementById("explain-result");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    result.textContent = "explaining…";
    try {
      const response = await fetch("/explain", {
        method: "POST",
        headers: { "Content-Type": "application/yaml" },
        body: claim.value || claim.placeholder,
      });
      result.innerHTML = await response.text();
    } catch (error) {
      result.textContent = "the allocator did not answer: " + error;
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  startPolling();
  startExplain();
});
