"""The demo run behind ``camkit demo``: audit the bundled shortcut-learning model and report what it looks at.

The bundled :class:`~camkit.bundled.model.ShapesCNN` was trained on shapes where most circles
carry a corner watermark (see :mod:`camkit.bundled.shapes`). The demo generates held-out images
from the same biased distribution, checks the model's accuracy with and without the
watermark, runs :func:`camkit.audit.audit` with Grad-CAM and a second method, and prints the
headline: the class whose attention sits on the watermark. No network is used.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DEMO_SEED", "headline", "run_demo"]

DEMO_SEED = 2  # the demo's images differ from the training (0) and test (1) sets


def headline(summary: Mapping[str, Any], region: str = "watermark") -> tuple[str, float, float, str]:
    """The class whose attention falls most on ``region``, from an audit summary.

    Returns:
        ``(class, share, highest share among the other classes, message)``.

    Example:
        >>> from camkit.demo.run import headline
        >>> summary = {"per_class": {"circle": {"energy": {"watermark": 0.61}},
        ...                          "square": {"energy": {"watermark": 0.02}}}}
        >>> headline(summary)[3]
        "class 'circle': 61% of attention energy on the watermark region (other classes: at most 2%)"
    """
    shares = {
        name: float(stats["energy"][region])
        for name, stats in summary["per_class"].items()
        if stats.get("energy", {}).get(region) is not None
    }
    if not shares:
        raise ValueError(
            f"the audit summary has no energy for the region {region!r}; its classes: {list(summary['per_class'])}"
        )
    top = max(shares, key=lambda k: shares[k])
    others = max((v for k, v in shares.items() if k != top), default=math.nan)
    message = f"class {top!r}: {shares[top]:.0%} of attention energy on the {region} region"
    if not math.isnan(others):
        message += f" (other classes: at most {others:.0%})"
    return top, shares[top], others, message


def _accuracy_lines(figures: Mapping[str, Any]) -> list[str]:
    """The accuracy figures of :func:`~camkit.demo.figures.model_figures`, as printed lines."""
    from ..bundled.shapes import MARKER_CLASS

    m = MARKER_CLASS
    return [
        f"accuracy on held-out images like the training data: {figures['marked']:.1%} "
        f"({m}: {figures[f'marked.{m}']:.1%})",
        f"without any watermark: {figures['clean']:.1%} ({m}: {figures[f'clean.{m}']:.1%})",
        f"with the watermark moved onto the other shapes: {figures['swapped']:.1%}; "
        f"{figures['swapped_as_marker']:.1%} of the other shapes are called {m!r}",
    ]


def _strip(paths: Sequence[Path], scale: int = 3) -> np.ndarray:
    """Images side by side, each enlarged ``scale`` times (nearest), with a 4-pixel white gap."""
    import cv2

    from ..io import read_rgb

    tiles = [cv2.resize(read_rgb(p), None, fx=scale, fy=scale, interpolation=cv2.INTER_NEAREST) for p in paths]
    gap = np.full((tiles[0].shape[0], 4, 3), 255, np.uint8)
    parts: list[np.ndarray] = []
    for tile in tiles:
        parts += [tile, gap]
    return np.concatenate(parts[:-1], axis=1)


def _pick_examples(rows: Sequence[Mapping[str, str]]) -> list[Mapping[str, str]]:
    """A few telling images: marked circles, an unmarked circle, a marked other shape, clean shapes."""
    from ..bundled.shapes import CLASSES, MARKER_CLASS

    picks: list[Mapping[str, str]] = []

    def take(label_is_marker: bool, marked: str, count: int, label: str | None = None) -> None:
        for r in rows:
            if count == 0:
                return
            if (r["label"] == MARKER_CLASS) == label_is_marker and r["marked"] == marked and r not in picks:
                if label is None or r["label"] == label:
                    picks.append(r)
                    count -= 1

    take(True, "1", 2)
    take(True, "0", 1)
    take(False, "1", 1)
    for name in CLASSES:
        if name != MARKER_CLASS:
            take(False, "0", 1, name)
    return picks


def _write_gallery(gallery: Path, data: Path, reports: Mapping[str, Path]) -> list[Path]:
    """Overlay strips (image | one overlay per method) and, when Chromium is found, a report screenshot."""
    import csv

    from ..io import save_png
    from ..runs.files import safe_name

    gallery.mkdir(parents=True, exist_ok=True)
    with open(data / "manifest.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    written = []
    for i, r in enumerate(_pick_examples(rows)):
        overlays = [folder / "overlays" / safe_name(r["path"]) for folder in reports.values()]
        kind = "marked" if r["marked"] == "1" else "clean"
        path = gallery / f"demo_{i}_{r['label']}_{kind}.png"
        save_png(path, _strip([data / r["path"], *overlays]))
        written.append(path)
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser:
        first = next(iter(reports.values())) / "report.html"
        shot = gallery / "report.png"
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run(
                [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", f"--screenshot={shot.resolve()}", "--window-size=1280,1600",
                 first.resolve().as_uri()],
                check=False, capture_output=True, timeout=120,
            )  # fmt: skip
        if shot.is_file():
            written.append(shot)
    return written


def run_demo(
    out: str | os.PathLike[str],
    images: int = 200,
    method: str = "gradcam++",
    gallery: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Run the demo (the Python side of ``camkit demo``); returns the Grad-CAM audit summary.

    Writes ``out/data/`` (images and ``manifest.csv``), ``out/gradcam/`` and ``out/<method>/``
    (each an audit: ``report.html``, ``results.csv``, ``summary.json``, ``overlays/``) and
    ``out/figures.json``: every figure the README and docs/demo.md quote (see
    :mod:`camkit.demo.figures`), plus ``<method>.share`` / ``<method>.others`` from the audits
    and the printed ``finding`` line. ``out/strategies/`` is a third audit of the same images with
    no regions; its strategies give the ``strategy.*`` figures and the ``strategy_finding`` line
    (:func:`camkit.demo.strategies.strategy_finding`).
    """
    from ..audit import audit
    from ..bundled.model import CAM_LAYER, load_shapes_cnn
    from ..bundled.shapes import CLASSES, IMAGE_SIZE, write_split
    from .figures import DEMO_TEST_IMAGES, model_figures
    from .strategies import plain_manifest, strategy_finding

    start = time.perf_counter()
    root = Path(out)
    model = load_shapes_cnn()
    figures = model_figures(model)
    print(f"{DEMO_TEST_IMAGES} fresh test images per set:")
    for line in _accuracy_lines(figures):
        print(line)
    data = root / "data"
    manifest = write_split(data, "marked", images, DEMO_SEED)
    reports: dict[str, Path] = {}
    summaries: dict[str, dict[str, Any]] = {}
    for key in dict.fromkeys(["gradcam", method]):
        folder = root / key.replace("+", "p")
        summaries[key] = audit(
            manifest, model, out=folder, method=key, layer=CAM_LAYER, size=IMAGE_SIZE, mean=(0.0,) * 3, std=(1.0,) * 3,
            device="cpu",
            batch_size=50, workers=0, classes=list(CLASSES), progress=False, overlay_format="png",
        )  # fmt: skip
        reports[key] = folder
        print(f"{key}: {headline(summaries[key])[3]}; report: {(folder / 'report.html').resolve()}")
    for key, summary in summaries.items():
        _, figures[f"{key}.share"], figures[f"{key}.others"], _ = headline(summary)
    plain = root / "strategies"  # the same images without regions: what the strategies find with no masks
    found = audit(
        plain_manifest(manifest), model, out=plain, method="gradcam", layer=CAM_LAYER, size=IMAGE_SIZE,
        mean=(0.0,) * 3, std=(1.0,) * 3, device="cpu", batch_size=50, workers=0, classes=list(CLASSES),
        progress=False, overlay_format="png",
    )  # fmt: skip
    figures.update(strategy_finding(found, plain, data, model, DEMO_SEED))
    figures["images"] = images
    _, share, others, message = headline(summaries["gradcam"])
    figures["finding"] = f"finding: {message}"
    print(figures["finding"])
    print(f"{figures['strategy_finding']}; report: {(plain / 'report.html').resolve()}")
    root.mkdir(parents=True, exist_ok=True)
    rounded = {k: round(v, 6) if isinstance(v, float) else v for k, v in figures.items()}
    (root / "figures.json").write_text(json.dumps(rounded, indent=1, sort_keys=True) + "\n")
    if share > 2 * others:
        print(
            "the model looks at the watermark corner to call this class: a shortcut (compare the accuracy without it)."
        )
    if gallery is not None:
        for path in _write_gallery(Path(gallery), data, reports):
            print(f"gallery: {path}")
    print(f"done in {time.perf_counter() - start:.0f} s; open {(reports['gradcam'] / 'report.html').resolve()}")
    return summaries["gradcam"]
