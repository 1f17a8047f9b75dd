"""Tiny seeded models of the other ranks for the command-line tests (``--model mediafactory:volume_net``).

tests/ is on ``sys.path`` in the test run (and on ``PYTHONPATH`` for subprocesses), so the CLI imports it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RankClassifier(nn.Module):
    """conv-relu-conv-relu-pool-linear in 1-D, 2-D or 3-D; CAM layer ``"conv2"``; any input size >= 4."""

    def __init__(self, spatial_dims: int, channels: int, classes: int = 3, seed: int = 0) -> None:
        super().__init__()
        conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[spatial_dims]
        pool = {1: nn.AdaptiveAvgPool1d, 2: nn.AdaptiveAvgPool2d, 3: nn.AdaptiveAvgPool3d}[spatial_dims]
        torch.manual_seed(seed)
        self.conv1 = conv(channels, 4, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = conv(4, 6, 3, padding=1, stride=2)
        self.relu2 = nn.ReLU()
        self.pool = pool(1)
        self.fc = nn.Linear(6, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu2(self.conv2(self.relu1(self.conv1(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def volume_net() -> nn.Module:
    """One-channel volumes [B, 1, D, H, W], 3 classes."""
    return RankClassifier(3, 1)


def video_net() -> nn.Module:
    """RGB clips [B, 3, T, H, W], 3 classes."""
    return RankClassifier(3, 3)


def signal_net() -> nn.Module:
    """Two-lead signals [B, 2, T], 3 classes."""
    return RankClassifier(1, 2)


def image_net() -> nn.Module:
    """RGB images [B, 3, H, W]: the wrong rank for volumes and videos."""
    return RankClassifier(2, 3)
