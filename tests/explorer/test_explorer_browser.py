"""The explorer in a real browser: Playwright drives Debian's Chromium (headless) against the app on 127.0.0.1.

Open the page, upload an image, choose a class and a method, click Explain, wait for the overlay;
open the Audit tab on a demo audit, click a row, wait for its saved overlay and the live
re-explanation. Every request the page makes must go to 127.0.0.1. Skips cleanly where
Playwright or /usr/bin/chromium is absent.
"""

from __future__ import annotations

import csv
import os
import re
import socket
from pathlib import Path

import pytest
from explorer_helpers import demo_runs

CHROMIUM = Path(os.environ.get("CAMKIT_CHROMIUM", "/usr/bin/chromium"))

pytest.importorskip("gradio")
sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(not CHROMIUM.is_file(), reason=f"no Chromium at {CHROMIUM}")

TIMEOUT_MS = 90_000  # a loaded CI machine: the first event starts a worker thread and loads the model's graph


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from camkit.explorer import Session
    from camkit.explorer.app import build_app

    runs = demo_runs(tmp_path_factory)
    blocks = build_app(Session("demo", device="cpu"), [runs["audit"]], [runs["evaluation"]])
    port = _free_port()
    blocks.launch(server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/", runs, blocks
    finally:
        blocks.close()


@pytest.fixture(scope="module")
def page(served):
    url = served[0]
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            sync_api.expect.set_options(timeout=TIMEOUT_MS)
            requests: list[str] = []
            page.on("request", lambda request: requests.append(request.url))
            page.goto(url)
            page.requests = requests  # type: ignore[attr-defined]
            yield page
        finally:
            browser.close()


def _image_src(page, selector: str) -> str:
    page.wait_for_selector(f"{selector} img", state="visible")
    return page.locator(f"{selector} img").first.get_attribute("src") or ""


@pytest.mark.heavy
def test_explain_an_uploaded_image_then_browse_the_audit(page, served, tmp_path_factory):
    url, runs, _blocks = served
    shots = tmp_path_factory.mktemp("shots")
    with open(runs["audit"] / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    circle = next(r for r in rows if r["label"] == "circle")

    # Explain: upload, pick a class among the top ones, pick a method, click Explain
    page.locator("input[type=file]").first.set_input_files(str(runs["data"] / circle["key"]))
    option = page.get_by_role("radio", name="square", exact=False)
    option.first.wait_for(state="visible")
    option.first.check()
    target = page.get_by_label("target class index (empty: the predicted class)")
    sync_api.expect(target).to_have_value("1")  # the demo's classes: circle 0, square 1
    method = page.get_by_label("method", exact=True)
    method.click()
    method.fill("gradcam++")
    page.get_by_role("option", name="gradcam++", exact=True).click()
    page.get_by_role("button", name="Explain", exact=True).click()
    # the map file of this very call (gradcam++, class 1) is offered, and the overlay is drawn
    sync_api.expect(page.get_by_role("cell", name="gradcampp-class1.npy").first).to_be_visible()
    label = page.locator('[data-testid="block-label"]', has_text=re.compile(r"^\s*overlay\s*$"))
    overlay = page.locator("div.block").filter(has=label).locator("img").first
    sync_api.expect(overlay).to_be_visible()
    assert "/gradio_api/file=" in (overlay.get_attribute("src") or "")
    page.screenshot(path=str(shots / "explain.png"), full_page=True)

    # Audit: the table, a row clicked, its saved overlay and the live re-explanation
    page.get_by_role("tab", name="Audit").click()
    page.wait_for_selector("#audit-table")
    sync_api.expect(page.locator("#audit-findings")).to_contain_text("attention energy on the watermark region")
    page.locator("#audit-table").get_by_text(circle["key"], exact=True).filter(visible=True).first.click()
    sync_api.expect(page.locator("#audit-note")).to_contain_text(Path(circle["key"]).stem.split("_")[0])
    saved = _image_src(page, "#audit-saved")
    live = _image_src(page, "#audit-live")
    sync_api.expect(page.locator("#audit-live-note")).to_contain_text(f"class {circle['target']}")
    # the live Grad-CAM of the audit's method, layer and class is the saved overlay, pixel for pixel
    # (gradio names served images by a hash of their pixels)
    assert "/gradio_api/file=" in saved and saved.rsplit("/", 2)[1] == live.rsplit("/", 2)[1]
    method = page.locator("#audit-method input")
    method.click()
    method.fill("gradcam++")
    page.get_by_role("option", name="gradcam++", exact=True).click()
    sync_api.expect(page.locator("#audit-live-note")).to_contain_text("live: gradcam++")
    sync_api.expect(page.locator("#audit-live img").first).not_to_have_attribute("src", live)
    page.screenshot(path=str(shots / "audit.png"), full_page=True)

    # Evaluate: the ranking is there
    page.get_by_role("tab", name="Evaluate").click()
    sync_api.expect(page.locator("#evaluate-ranking")).to_contain_text("gradcam++")

    hosts = {request.split("/")[2] for request in page.requests}  # type: ignore[attr-defined]
    assert hosts == {url.split("/")[2]}, f"the page fetched from outside the machine: {sorted(hosts)}"
