"""Shared pieces of the explorer tests: a real audit and evaluation of the demo model, made once per session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DEMO_IMAGES = 12


def make_demo_runs(root: Path, *, evaluation: bool = True) -> dict[str, Path]:
    """The demo's data (12 images), its Grad-CAM audit (with strategies) and, optionally, an evaluation.

    The same calls as ``camkit demo`` (:func:`camkit.demo.run.run_demo`), on fewer images; about 5 s.
    """
    from camkit.audit import audit
    from camkit.bundled.model import CAM_LAYER, load_shapes_cnn
    from camkit.bundled.shapes import CLASSES, IMAGE_SIZE, write_split
    from camkit.demo.run import DEMO_SEED

    model = load_shapes_cnn()
    manifest = write_split(root / "data", "marked", DEMO_IMAGES, DEMO_SEED)
    common = dict(layer=CAM_LAYER, size=IMAGE_SIZE, mean=(0.0,) * 3, std=(1.0,) * 3, device="cpu",
                  classes=list(CLASSES), progress=False)  # fmt: skip
    audit(manifest, model, out=root / "gradcam", method="gradcam", batch_size=50, workers=0, overlay_format="png",
          **common)  # fmt: skip
    runs = {"data": root / "data", "audit": root / "gradcam"}
    if evaluation:
        from camkit.evaluation.run import evaluate

        evaluate(manifest, model, out=root / "evaluation", methods=["gradcam", "gradcam++"], steps=5, gate_images=2,
                 **common)  # fmt: skip
        runs["evaluation"] = root / "evaluation"
    return runs


_MADE: dict[str, dict[str, Path]] = {}


def demo_runs(tmp_path_factory: Any) -> dict[str, Path]:
    """:func:`make_demo_runs` once per test session (the folders are only read by the tests)."""
    base = str(tmp_path_factory.getbasetemp())
    if base not in _MADE:
        _MADE[base] = make_demo_runs(tmp_path_factory.mktemp("demo"))
    return _MADE[base]
