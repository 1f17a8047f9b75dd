"""Case 29b: how faithful Grad-CAM, attention rollout, Chefer's rollout and LeGrad are on the demo ViT.

The model is the bundled demo ViT (``camkit/assets/shapes_vit.pt``, trained by
``python -m camkit.demo.train --model vit`` on the demo's shapes, whose marker class, the
circle, carries a corner watermark in 98% of its training images). Measured, whatever it shows:

* **Deletion and insertion AUC** (``camkit.metrics``) on ``N`` images of the ``marked`` test
  split (the training distribution), each explained for its predicted class: the softmax
  probability of that class as the highest-ranked pixels are removed (to 0) or inserted (onto a
  blurred copy), over 32 steps. Lower deletion AUC and higher insertion AUC are better.
* **Pointing game on the watermark**: on the ``swapped`` split (the watermark on every image of
  the other classes, none on circles), the images the model calls "circle" are the ones where
  it followed the shortcut; a hit is a map whose maximum falls in the watermark's box.

Grad-CAM reads the last block's first norm (camkit's default layer for torchvision ViTs);
``RandomCAM`` weights the Grad-CAM layer's channels at random (its map still follows the
activations); a uniform random 8 x 8 map is the floor.
``--smoke``: 8 images and 8 steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

import camkit
from camkit.metrics import auc, deletion_curve, insertion_curve, pointing_game

from ._harness import Context, Goal, Row

TITLE = "Faithfulness on the demo ViT"
ORDER = 30
TEST_SEED = 1
N_IMAGES = 96
STEPS = 32


def methods(model: nn.Module) -> dict[str, Callable[[Tensor, Tensor], Tensor]]:
    """Name -> ``f(x, target) -> maps [B, 64, 64]`` for every method compared."""
    from camkit.bundled.vit import VIT_CAM_LAYER

    built: dict[str, camkit.Explainer] = {
        "Grad-CAM": camkit.GradCAM(model, VIT_CAM_LAYER),
        "AttentionRollout": camkit.AttentionRollout(model),
        "CheferRollout": camkit.CheferRollout(model),
        "LeGrad": camkit.LeGrad(model),
        "RandomCAM (random channel weights)": camkit.RandomCAM(model, VIT_CAM_LAYER, seed=0),
    }
    out: dict[str, Callable[[Tensor, Tensor], Tensor]] = {name: (lambda x, t, e=e: e(x, target=t)) for name, e in built.items()}
    out["random 8x8 map (floor)"] = random_maps
    return out


def random_maps(x: Tensor, target: Tensor) -> Tensor:
    """A seeded uniform random 8 x 8 grid per image, upsampled and normalised like camkit's maps: the floor."""
    g = torch.Generator().manual_seed(0)
    grid = torch.rand(x.shape[0], 8, 8, generator=g)
    maps, _ = camkit.functional.normalize_maps(camkit.functional.upsample_maps(grid, tuple(x.shape[2:])))
    return maps


def faithfulness(model: nn.Module, n: int, steps: int) -> dict[str, dict[str, float]]:
    """Per method: mean deletion AUC, mean insertion AUC, pointing hits / images on the watermark."""
    from camkit.bundled.shapes import CLASSES, MARKER_CLASS, WATERMARK_BOX, make_split, to_batch

    x, _ = to_batch(make_split("marked", n, TEST_SEED))
    with torch.no_grad():
        predicted = model(x).argmax(dim=1)
    swapped, _ = to_batch(make_split("swapped", n, TEST_SEED))
    with torch.no_grad():
        fooled = model(swapped).argmax(dim=1) == CLASSES.index(MARKER_CLASS)
    shortcut = swapped[fooled]
    boxes = torch.tensor(WATERMARK_BOX).expand(shortcut.shape[0], 4)
    marker = torch.full((shortcut.shape[0],), CLASSES.index(MARKER_CLASS))
    out: dict[str, dict[str, float]] = {}
    for name, explain in methods(model).items():
        maps = explain(x, predicted)
        fr, deleted = deletion_curve(model, x, maps, predicted, steps=steps, softmax=True)
        fi, inserted = insertion_curve(model, x, maps, predicted, steps=steps, softmax=True, baseline="blur")
        hits = pointing_game(explain(shortcut, marker), boxes) if len(shortcut) else torch.zeros(0, dtype=torch.bool)
        out[name] = {
            "deletion": float(auc(fr, deleted).mean()),
            "insertion": float(auc(fi, inserted).mean()),
            "hits": float(hits.sum()),
            "fooled": float(len(shortcut)),
            "images": float(n),
        }
    return out


def run(ctx: Context) -> Sequence[Row | Goal]:
    from camkit.bundled.vit import load_shapes_vit

    try:
        model = load_shapes_vit()
    except camkit.InvalidInputError as exc:
        return [Row(TITLE, "demo ViT", note=str(exc))]
    n, steps = (8, 8) if ctx.smoke else (N_IMAGES, STEPS)
    ctx.log(f"  {TITLE}: {n} images, {steps} steps")
    rows: list[Row | Goal] = []
    for name, r in faithfulness(model, n, steps).items():
        note = (
            f"deletion AUC {r['deletion']:.3f} (lower is better), insertion AUC {r['insertion']:.3f} (higher is "
            f"better) over {int(r['images'])} marked test images; pointing game on the watermark "
            f"{int(r['hits'])}/{int(r['fooled'])} of the swapped test images called circle"
        )
        ctx.log(f"    {name}: {note}")
        rows.append(Row(TITLE, name, "demo ViT 64x64", n, ctx.device.type, note=note))
    return rows
