"""Tiny seeded models shared by the tests (no downloads)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class TinyNet(nn.Module):
    """conv-bn-relu(inplace)-conv-relu-pool-linear; CAM layer ``"conv2"``. Input [B, 3, 8, 8]."""

    def __init__(self, classes: int = 5, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(6, classes)
        self.fail = False  # set True to make forward raise after conv2
        with torch.no_grad():  # non-trivial BN statistics
            self.bn1.running_mean.uniform_(-0.2, 0.2)
            self.bn1.running_var.uniform_(0.5, 1.5)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.conv2(x)
        if self.fail:
            raise RuntimeError("boom inside forward")
        x = self.relu2(x)
        return self.fc(torch.flatten(self.pool(x), 1))


class ResBlockNet(nn.Module):
    """A CIFAR-style block whose forward uses ``F.relu`` and an in-place ``out += shortcut``.

    With ``inplace=False`` the same weights compute ``out = out + shortcut`` instead.
    CAM layer ``"bn2"`` is followed by the in-place add.
    """

    def __init__(self, inplace: bool = True, classes: int = 4, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.inplace = inplace
        self.conv0 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, classes)
        with torch.no_grad():
            for bn in (self.bn1, self.bn2):
                bn.running_mean.uniform_(-0.2, 0.2)
                bn.running_var.uniform_(0.5, 1.5)
                bn.weight.uniform_(0.5, 1.5)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.conv0(x))
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.inplace:
            out += x
            out = F.relu(out, inplace=True)
        else:
            out = F.relu(out + x)
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


def tiny_input(batch: int = 3, seed: int = 1, size: int = 8) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, size, size, generator=g)


#: Spatial sizes of the inputs of :class:`RankNet` by rank: a signal, an image, a volume or clip.
RANK_SIZES = {1: (16,), 2: (8, 8), 3: (4, 8, 8)}


class RankNet(TinyNet):
    """:class:`TinyNet` with ``spatial_dims`` 1, 2 or 3: the same layers, names and seeds.

    ``RankNet(2)`` equals ``TinyNet()``. Input [B, 3, *RANK_SIZES[spatial_dims]]; CAM layer ``"conv2"``.
    """

    def __init__(self, spatial_dims: int, classes: int = 5, seed: int = 0) -> None:
        nn.Module.__init__(self)
        conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[spatial_dims]
        norm = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[spatial_dims]
        pool = {1: nn.AdaptiveAvgPool1d, 2: nn.AdaptiveAvgPool2d, 3: nn.AdaptiveAvgPool3d}[spatial_dims]
        torch.manual_seed(seed)
        self.conv1 = conv(3, 4, 3, padding=1)
        self.bn1 = norm(4)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv(4, 6, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool = pool(1)
        self.fc = nn.Linear(6, classes)
        self.fail = False
        with torch.no_grad():
            self.bn1.running_mean.uniform_(-0.2, 0.2)
            self.bn1.running_var.uniform_(0.5, 1.5)


def rank_input(spatial_dims: int, batch: int = 3, seed: int = 1) -> Tensor:
    """A seeded batch [B, 3, *RANK_SIZES[spatial_dims]] for :class:`RankNet`."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, *RANK_SIZES[spatial_dims], generator=g)
