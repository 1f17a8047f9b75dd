"""A tiny seeded classifier for the audit/explain subprocess tests (``--model tinyfactory:tiny``).

The tests put ``tests/`` on ``PYTHONPATH`` so the subprocess can import this module.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Tiny(nn.Module):
    """conv-relu-conv-relu-pool-linear, 3 classes; CAM layer ``"conv2"``. Any input size >= 4 px."""

    def __init__(self, classes: int = 3, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(6, 8, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu2(self.conv2(self.relu1(self.conv1(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def tiny() -> nn.Module:
    """The factory the tests name: ``tinyfactory:tiny``."""
    return Tiny()


def broken() -> nn.Module:
    """A factory that fails, as one whose weights server is down (``--model tinyfactory:broken``)."""
    raise RuntimeError("weights server down")


def tiny_detector() -> nn.Module:
    """A random-init torchvision Faster R-CNN (MobileNetV3 320 FPN) that keeps every box (``tinyfactory:tiny_detector``)."""
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    torch.manual_seed(0)
    return fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=96, box_score_thresh=0.0
    )


def tiny_segmenter() -> nn.Module:
    """A random-init torchvision LRASPP (MobileNetV3-Large), 3 classes (``tinyfactory:tiny_segmenter``)."""
    from torchvision.models.segmentation import lraspp_mobilenet_v3_large

    torch.manual_seed(0)
    return lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=3)
