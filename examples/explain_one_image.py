"""Explain one image with Grad-CAM and save the overlay.

    python examples/explain_one_image.py [OUT_DIR]

Uses scikit-image's bundled cat photo and a torchvision ResNet-18. Pass
``weights="DEFAULT"`` to ``resnet18`` where you have internet for a trained model; here the
weights are seeded random so that nothing is downloaded.
"""

import sys
from pathlib import Path

import torch
import torchvision
from skimage import data

import camkit

out = Path(sys.argv[1] if len(sys.argv) > 1 else "examples-out")
torch.manual_seed(0)
model = torchvision.models.resnet18(weights=None)

image = data.chelsea()  # uint8 RGB [H, W, 3]
x = camkit.to_tensor(image, size=224, mean=camkit.io.IMAGENET_MEAN, std=camkit.io.IMAGENET_STD)[None]

explanation = camkit.GradCAM(model, "layer4").explain(x)  # target=None: the top-1 class
print(f"class {explanation.target.item()} score {explanation.scores.item():.3f}, map {tuple(explanation.maps.shape)}")

shown = camkit.to_tensor(image, size=224)  # the resized image in [0, 1], for display
camkit.save_png(out / "cat_gradcam.png", camkit.overlay(shown, explanation.maps[0]))
print(f"wrote {out / 'cat_gradcam.png'}")
