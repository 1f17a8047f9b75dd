"""The figures the README and docs/demo.md quote, measured afresh by ``camkit demo``.

``camkit demo`` writes them to ``<out>/figures.json``; ``tests/demo/test_demo_figures.py`` runs the
demo and compares every figure tagged ``<!-- demo:KEY -->`` in README.md and docs/demo.md
with the value under ``KEY`` at the precision the text writes it, so the docs cannot drift
from what the bundled model does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["DEMO_TEST_IMAGES", "model_figures"]

DEMO_TEST_IMAGES = 800  # images per split for the accuracy table (seed: camkit.demo.train.TEST_SEED)
CHECK_IMAGES = 200  # images for the Grad-CAM pointing game and the watermark energy


def model_figures(model: nn.Module) -> dict[str, Any]:
    """Accuracy table, shortcut rates and Grad-CAM checks of ``model``, as fractions in [0, 1].

    Keys (``<class>`` is each name of :data:`camkit.bundled.shapes.CLASSES`):

    * ``train_marker_rate``, ``train_other_rate``: the share of training images of the
      marker class / of the other classes that carry the watermark; ``watermark_area``: the
      watermark box's share of the image.
    * ``<split>`` and ``<split>.<class>`` for the splits ``marked``, ``clean`` and ``swapped``:
      accuracy on :data:`DEMO_TEST_IMAGES` images (seed ``TEST_SEED``), as
      :func:`camkit.demo.train.evaluate` measures it; ``<split>_as_marker`` and
      ``<split>_as_marker.<class>``: the share of non-marker images (of that class) predicted
      as the marker class.
    * ``pointing_game_clean``: Grad-CAM's pointing game on :data:`CHECK_IMAGES` clean images
      (seed ``TEST_SEED + 10``); ``watermark_energy.<class>``: the mean share of Grad-CAM's
      energy inside the watermark box on training-like images (seed ``TEST_SEED + 20``).
    """
    import camkit
    from camkit.metrics import energy_pointing_game, pointing_game

    from ..bundled.model import CAM_LAYER
    from ..bundled.shapes import CLASSES, IMAGE_SIZE, MARKER_CLASS, WATERMARK_BOX, make_split, marker_rates, to_batch
    from .train import TEST_SEED, _predict

    marker = CLASSES.index(MARKER_CLASS)
    rates = marker_rates("train")
    x0, y0, x1, y1 = WATERMARK_BOX
    out: dict[str, Any] = {
        "train_marker_rate": rates[marker],
        "train_other_rate": max(r for c, r in enumerate(rates) if c != marker),
        "watermark_area": (x1 - x0) * (y1 - y0) / IMAGE_SIZE**2,
    }
    model.eval()
    for split in ("marked", "clean", "swapped"):
        x, y = to_batch(make_split(split, DEMO_TEST_IMAGES, TEST_SEED))
        pred = _predict(model, x)
        out[split] = float((pred == y).float().mean())
        others = y != marker
        out[f"{split}_as_marker"] = float((pred[others] == marker).float().mean())
        for c, name in enumerate(CLASSES):
            out[f"{split}.{name}"] = float((pred[y == c] == c).float().mean())
            if c != marker:
                out[f"{split}_as_marker.{name}"] = float((pred[y == c] == marker).float().mean())
    gradcam = camkit.GradCAM(model, CAM_LAYER)
    clean = make_split("clean", CHECK_IMAGES, TEST_SEED + 10)
    maps = gradcam(to_batch(clean)[0])
    out["pointing_game_clean"] = float(pointing_game(maps, torch.tensor([s.object_box for s in clean])).float().mean())
    marked = make_split("marked", CHECK_IMAGES, TEST_SEED + 20)
    x, y = to_batch(marked)
    share = energy_pointing_game(gradcam(x), torch.tensor([s.watermark_box for s in marked]))
    for c, name in enumerate(CLASSES):
        out[f"watermark_energy.{name}"] = float(share[y == c].mean())
    return out
