"""``camkit evaluate`` on the demo over six methods, against the six methods' explain time alone.

Both sides use the bundled demo CNN on the same demo images (``camkit.bundled.shapes``, the seed
of ``camkit demo``), already written as PNGs with their manifest. The baseline ("explain alone") runs the six
explainers of the evaluation's default set (Grad-CAM, Grad-CAM++, XGradCAM, LayerCAM, saliency,
input x gradient) over every image in batches of 20 on preprocessed tensors, and nothing else:
the least any evaluation of these methods must do. ``camkit evaluate`` is the whole call: reading
the images, one forward pass for the targets, the six methods and the three controls, the default
metrics (deletion and insertion with 20 steps, average drop, increase in confidence, pointing and
energy pointing game), the sanity gates on 8 images, ``scores.csv``, ``summary.json`` and
``report.html``, each repeat into a fresh folder. No goal is stated for the ratio; the notes give
the evaluation's own split of its time (explaining, each metric, the gates).

``--smoke``: 6 images, 2 methods, 4 steps.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path

import torch

import camkit

from ._harness import Context, Goal, Row, rows_for_timings

TITLE = "camkit evaluate (demo)"
ORDER = 7
METHODS = ("gradcam", "gradcam++", "xgradcam", "layercam", "saliency", "inputxgradient")
EXPLAIN = "explain alone"
CAMKIT = "camkit evaluate"


def run(ctx: Context) -> list[Row | Goal]:
    from camkit.bundled.model import CAM_LAYER, load_shapes_cnn
    from camkit.bundled.shapes import make_split, to_batch, write_split
    from camkit.demo.run import DEMO_SEED

    images, methods, steps = (6, METHODS[:2], 4) if ctx.smoke else (60, METHODS, 20)
    repeats = 1 if ctx.smoke else min(ctx.repeats, 3)
    root = Path(tempfile.mkdtemp(prefix="camkit-bench-evaluate-"))
    try:
        manifest = write_split(root / "data", "marked", images, DEMO_SEED)
        model = load_shapes_cnn().to(ctx.device).eval()
        x, _ = to_batch(make_split("marked", images, DEMO_SEED))
        x = x.to(ctx.device)
        explainers = [camkit.get_method(m)(model, layer=CAM_LAYER) if "cam" in m else camkit.get_method(m)(model)
                      for m in methods]  # type: ignore[call-arg]  # fmt: skip
        runs = itertools.count()
        seconds: dict[str, float] = {}

        def explain() -> None:
            for start in range(0, images, 20):
                chunk = x[start : start + 20]
                with torch.no_grad():
                    target = model(chunk).argmax(dim=1)
                for explainer in explainers:
                    explainer(chunk, target)

        def evaluate() -> None:
            summary = camkit.evaluate(
                manifest, model, out=root / f"out{next(runs)}", methods=list(methods), layer=CAM_LAYER, size=64,
                mean=(0.0,) * 3, std=(1.0,) * 3, device=ctx.device, batch_size=20, steps=steps, progress=False,
            )  # fmt: skip
            seconds.update(summary["seconds_rank0"])

        timings = ctx.time({EXPLAIN: explain, CAMKIT: evaluate}, repeats=repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    split = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])[:6])
    notes = {CAMKIT: f"{len(methods)} methods + 3 controls, default metrics, gates; last run's largest parts: {split}"}
    return rows_for_timings(
        TITLE, timings, reference=EXPLAIN, model=f"demo CNN 64px, {images} images", batch=20, device=ctx.device,
        notes=notes,
    )  # fmt: skip
