"""Shared pieces of the evaluation tests: the truth model, its data, and a tiny CSV manifest writer.

The truth model's output depends only on the pixels inside a known box: a fixed 3x3 convolution
whose activations are read out inside an inner box only, so the pixels that reach the output are
the inner box grown by one pixel (``BOX``). A faithful map must put its weight there.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

import camkit

SIZE = 16
BOX = (9, 2, 15, 8)  # x0, y0, x1, y1 (exclusive): away from the centre, so the centred Gaussian misses it
READ = (10, 3, 14, 7)  # the activations read out: BOX shrunk by the convolution's one-pixel reach


class TruthModel(nn.Module):
    """Two classes; logit 0 = 0.25 x the sum over 4 channels of relu(conv(x)) averaged inside ``READ``;
    logit 1 = its negative.

    Layer ``"relu"`` is the CAM layer (its activations are non-zero everywhere). Pixels outside
    ``BOX`` never reach the output.
    """

    def __init__(self, size: int = SIZE, box: tuple[int, int, int, int] = READ) -> None:
        super().__init__()
        mask = torch.zeros(1, 1, size, size)
        x0, y0, x1, y1 = box
        mask[..., y0:y1, x0:x1] = 1.0
        self.register_buffer("mask", mask)
        generator = torch.Generator().manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.relu = nn.ReLU()
        self.head = nn.Linear(4, 2)
        with torch.no_grad():
            self.conv.weight.copy_(0.05 + 0.1 * torch.rand(self.conv.weight.shape, generator=generator))
            self.head.weight.copy_(torch.tensor([[0.25] * 4, [-0.25] * 4]))
            self.head.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        a = self.relu(self.conv(x))
        return self.head((a * self.mask).sum(dim=(2, 3)) / self.mask.sum())


def truth_model() -> nn.Module:
    """Factory for ``--model evaluate_helpers:truth_model``."""
    return TruthModel()


def write_manifest(root: Path, images: int, *, size: int = SIZE, box: tuple[int, int, int, int] = BOX,
                   seed: int = 0, masks: bool = False) -> Path:  # fmt: skip
    """Random-texture PNGs and ``manifest.csv`` with the region ``object`` (a box, or mask files)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(images):
        name = f"img{i}.png"
        camkit.save_png(root / name, rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
        if masks:
            mask = np.zeros((size, size, 3), np.uint8)
            mask[box[1] : box[3], box[0] : box[2]] = 255
            camkit.save_png(root / f"mask{i}.png", mask)
            rows.append([name, f"mask{i}.png"])
        else:
            rows.append([name, *box])
    manifest = root / "manifest.csv"
    with open(manifest, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "object_mask"] if masks else ["path", "object_x0", "object_y0", "object_x1", "object_y1"])
        writer.writerows(rows)
    return manifest


class NoScores(nn.Module):
    """Returns a feature map [B, 4, H, W], not scores: ``camkit evaluate`` must refuse it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)


def no_scores() -> nn.Module:
    """Factory for ``--model evaluate_helpers:no_scores``."""
    return NoScores()
