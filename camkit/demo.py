"""``camkit demo``: explain a few bundled images and write overlay PNGs.

This interim demo uses scikit-image's bundled photographs and a torchvision ResNet-18
with *seeded random* weights (nothing is downloaded), so its maps show camkit's
mechanics, not a trained model's reasoning.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import cast

from .cli import command


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="camkit-demo", help="output folder (default: camkit-demo)")


@command("demo", "explain a few bundled images and write overlay PNGs", _add_arguments)
def run(args: argparse.Namespace) -> int:
    import torch
    import torchvision
    from skimage import data

    import camkit

    start = time.perf_counter()
    out = Path(args.out)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    names = ["chelsea", "astronaut", "coffee"]
    images = [getattr(data, n)() for n in names]
    x = torch.stack([camkit.to_tensor(img, size=224, mean=camkit.io.IMAGENET_MEAN, std=camkit.io.IMAGENET_STD) for img in images])
    shown = [camkit.to_tensor(img, size=224) for img in images]
    methods = ["gradcam", "gradcam++", "layercam"]
    for key in methods:
        explainer = cast(camkit.CAMExplainer, camkit.get_method(key)(model, layer="layer4"))  # type: ignore[call-arg]
        explanation = explainer.explain(x)
        for name, image, heat in zip(names, shown, explanation.maps):
            camkit.save_png(out / f"{name}_{key}.png", camkit.overlay(image, heat))
    print(f"wrote {len(names) * len(methods)} overlays to {out.resolve()} in {time.perf_counter() - start:.1f} s")
    print("note: the model has seeded random weights (no download); the maps show the mechanics only.")
    return 0
