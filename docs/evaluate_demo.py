"""Evaluate six methods on the demo: writes the guide's figures (docs/img/evaluate_demo.json) and its screenshot.

Run from the repository root: ``.venv/bin/python docs/evaluate_demo.py`` (a few minutes on a CPU).

The data are the demo's held-out shapes (``camkit.bundled.shapes.write_split``, the seed of ``camkit
demo``), the model the bundled demo CNN (``--model demo``), the localisation region the shape's
box (``object``). ``camkit evaluate`` runs the six cheap methods of its default set beside the
three controls with the default metrics; ``docs/img/evaluate_demo.json`` keeps the summary the
guide quotes (every statistic, without the timings), and ``docs/img/evaluate_report.png`` is the
report as headless Chromium draws it (skipped when Chromium is missing).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "img"
IMAGES = 60
METHODS = ("gradcam", "gradcam++", "xgradcam", "layercam", "saliency", "inputxgradient")
TIMINGS = ("seconds", "seconds_rank0", "images_this_run", "data", "corrupt_parts_redone", "camkit_version")


def run(root: Path, images: int = IMAGES, progress: bool = True) -> dict[str, Any]:
    """Write the demo data under ``root/data``, evaluate into ``root/out``; return the summary."""
    import camkit
    from camkit.bundled.model import CAM_LAYER
    from camkit.bundled.shapes import write_split
    from camkit.demo.run import DEMO_SEED

    manifest = write_split(root / "data", "marked", images, DEMO_SEED)
    return camkit.evaluate(manifest, "demo", out=root / "out", methods=list(METHODS), layer=CAM_LAYER, device="cpu",
                           batch_size=20, progress=progress)  # fmt: skip


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without what changes from run to run (timings, paths, the version)."""
    return {k: v for k, v in summary.items() if k not in TIMINGS}


def screenshot(report: Path, png: Path) -> bool:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        return False
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", f"--screenshot={png.resolve()}", "--window-size=1280,2400",
             report.resolve().as_uri()],
            check=False, capture_output=True, timeout=180,
        )  # fmt: skip
    return png.is_file()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="keep the data and the run in this folder (default: a temporary one)")
    args = parser.parse_args()
    root = Path(args.keep or tempfile.mkdtemp())
    summary = run(root)
    OUT.mkdir(exist_ok=True)
    (OUT / "evaluate_demo.json").write_text(json.dumps(figures(summary), indent=1, sort_keys=True) + "\n")
    print(summary["verdict"]["text"])
    if screenshot(root / "out" / "report.html", OUT / "evaluate_report.png"):
        print(f"wrote {OUT / 'evaluate_report.png'}")
    print(f"wrote {OUT / 'evaluate_demo.json'}; the run is in {root}")


if __name__ == "__main__":
    main()
