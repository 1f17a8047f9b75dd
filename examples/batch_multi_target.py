"""Explain a batch for several classes per image from one forward pass, and save a grid.

    python examples/batch_multi_target.py [OUT_DIR]

A [B, K] LongTensor target gives maps [B, K, H, W]: here the top-3 classes of each image.
"""

import sys
from pathlib import Path

import torch
import torchvision
from skimage import data

import camkit
from camkit.functional import overlay_batch

out = Path(sys.argv[1] if len(sys.argv) > 1 else "examples-out")
torch.manual_seed(0)
model = torchvision.models.resnet18(weights=None).eval()



def centre_square(image):
    """The largest centred square of an [H, W, 3] image, so that resizing to 160x160 does not squash it."""
    height, width = image.shape[:2]
    side = min(height, width)
    top, left = (height - side) // 2, (width - side) // 2
    return image[top : top + side, left : left + side]


images = [centre_square(img) for img in (data.chelsea(), data.astronaut(), data.coffee())]
shown = torch.stack([camkit.to_tensor(img, size=160) for img in images])  # [B, 3, H, W] in [0, 1]
mean = torch.tensor(camkit.io.IMAGENET_MEAN).view(1, 3, 1, 1)
std = torch.tensor(camkit.io.IMAGENET_STD).view(1, 3, 1, 1)
x = (shown - mean) / std

with torch.no_grad():
    top3 = model(x).topk(3, dim=1).indices  # [B, 3]

for explainer in (camkit.GradCAM(model, "layer4"), camkit.LayerCAM(model, "layer3")):
    maps = explainer(x, target=top3)  # [B, 3, H, W]
    rows = [overlay_batch(shown, maps[:, k]) for k in range(3)]  # each [B, 3, H, W] uint8
    grid = torch.cat([torch.cat(list(row), dim=2) for row in rows], dim=1)  # [3, 3H, BW]
    path = out / f"top3_{explainer.key}.png"
    camkit.save_png(path, grid)
    print(f"{explainer.key}: maps {tuple(maps.shape)} -> {path}")
