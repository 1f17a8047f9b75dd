"""Regenerate the explorer's screenshots in docs/img/app_*.png (the guide page docs/guide/app.md and the README).

What it does, as a user would: ``camkit demo`` (the bundled model, its audit), ``camkit evaluate`` on
the demo's images, then ``camkit app --model demo --audit DEMO/gradcam --evaluate DEMO/evaluation``
served on 127.0.0.1, driven in headless Chromium with Playwright: an uploaded image explained, the
Audit tab with a row clicked, the Evaluate tab. Needs the ``app`` extra (Gradio), Playwright and
Chromium at /usr/bin/chromium (or ``--chromium PATH``); a few minutes on a CPU.

    python docs/app_screenshots.py            # writes docs/img/app_explain.png, app_audit.png, app_evaluate.png
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_runs(root: Path, images: int) -> dict[str, Path]:
    """The demo (data, audits) and an evaluation of its Grad-CAM and Grad-CAM++ on the same images."""
    from camkit.bundled.model import CAM_LAYER, load_shapes_cnn
    from camkit.bundled.shapes import CLASSES, IMAGE_SIZE
    from camkit.demo.run import run_demo
    from camkit.evaluation.run import evaluate

    run_demo(root, images=images)
    evaluate(root / "data" / "manifest.csv", load_shapes_cnn(), out=root / "evaluation", methods=["gradcam", "gradcam++"],
             layer=CAM_LAYER, size=IMAGE_SIZE, mean=(0.0,) * 3, std=(1.0,) * 3, device="cpu", classes=list(CLASSES),
             limit=min(images, 60), progress=False)  # fmt: skip
    return {"data": root / "data", "audit": root / "gradcam", "evaluation": root / "evaluation"}


def _choose(page, field, value: str) -> None:
    field.click()
    field.fill(value)
    page.get_by_role("option", name=value, exact=True).click()


def shoot(url: str, runs: dict[str, Path], out: Path, chromium: str) -> list[Path]:
    """Drive the page and write the three screenshots."""
    import csv

    from playwright.sync_api import expect, sync_playwright

    with open(runs["audit"] / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    marked = next(r for r in rows if r["label"] == "circle" and float(r["energy_watermark"]) > 0.2)
    circles = [r for r in rows if r["label"] == "circle" and r["energy_watermark"]]
    top = max(circles, key=lambda r: float(r["energy_watermark"]))  # the first row once sorted
    written = [out / "app_explain.png", out / "app_audit.png", out / "app_evaluate.png"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
        page.set_default_timeout(120_000)
        expect.set_options(timeout=120_000)
        hosts: set[str] = set()
        page.on("request", lambda request: hosts.add(request.url.split("/")[2]))
        page.goto(url)
        # Explain: a watermarked circle, class "circle", Grad-CAM
        page.locator("input[type=file]").first.set_input_files(str(runs["data"] / marked["key"]))
        page.get_by_role("radio", name=re.compile(r"^circle")).first.check()
        _choose(page, page.get_by_label("method", exact=True), "gradcam")
        page.get_by_role("button", name="Explain", exact=True).click()
        expect(page.get_by_role("cell", name="gradcam-class0.npy").first).to_be_visible()
        page.wait_for_timeout(1000)
        page.screenshot(path=str(written[0]), full_page=True)
        # Audit: circles, most attention on the watermark first, the top row clicked, Grad-CAM++ live
        page.get_by_role("tab", name="Audit").click()
        page.wait_for_selector("#audit-table")
        _choose(page, page.get_by_label("Class", exact=True), "circle")
        _choose(page, page.get_by_label("Sort by", exact=True), "energy_watermark")
        page.get_by_label("Descending").check()
        expect(page.locator("#audit-count")).to_have_text(f"{sum(r['label'] == 'circle' for r in rows)} of {len(rows)} images")
        page.wait_for_timeout(3000)
        cell = page.locator("#audit-table").get_by_text(top["key"], exact=True).filter(visible=True).first
        cell.scroll_into_view_if_needed()
        cell.click()
        expect(page.locator("#audit-live-note")).to_contain_text("live: gradcam,")
        _choose(page, page.locator("#audit-method input"), "gradcam++")
        expect(page.locator("#audit-live-note")).to_contain_text("live: gradcam++")
        page.wait_for_timeout(1000)
        page.screenshot(path=str(written[1]), full_page=True)
        # Evaluate
        page.get_by_role("tab", name="Evaluate").click()
        expect(page.locator("#evaluate-ranking")).to_contain_text("gradcam++")
        page.wait_for_timeout(1000)
        page.screenshot(path=str(written[2]), full_page=True)
        browser.close()
    local = url.split("/")[2]
    if hosts != {local}:
        raise SystemExit(f"the page fetched from outside the machine: {sorted(hosts)}")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "img"), help="where the PNGs go (default: docs/img)")
    parser.add_argument("--images", type=int, default=200, help="images of the demo (default: 200, as make demo)")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--demo", help="a folder for the demo and evaluation, reused when it holds them (default: a temporary one)")
    args = parser.parse_args()
    from camkit.explorer import Session
    from camkit.explorer.app import build_app

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.demo) if args.demo else Path(tmp) / "camkit-demo"
        done = (root / "gradcam" / "results.csv").is_file() and (root / "evaluation" / "summary.json").is_file()
        runs = {"data": root / "data", "audit": root / "gradcam", "evaluation": root / "evaluation"}
        if not done:
            runs = make_runs(root, args.images)
        out = Path(args.out).resolve()
        os.chdir(root.parent)  # the page names the folders as a user would give them: camkit-demo/gradcam
        relative = {k: Path(root.name) / v.relative_to(root) for k, v in runs.items()}
        blocks = build_app(Session("demo", device="cpu"), [relative["audit"]], [relative["evaluation"]])
        port = _free_port()
        blocks.launch(server_port=port, prevent_thread_lock=True, quiet=True)
        try:
            for path in shoot(f"http://127.0.0.1:{port}/", runs, out, args.chromium):
                print(f"wrote {path}")
        finally:
            blocks.close()


if __name__ == "__main__":
    main()
