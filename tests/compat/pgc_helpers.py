"""A small seeded CNN and inputs shared by the pytorch-grad-cam compatibility tests."""

from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """conv(stride 2)-bn-relu, conv-bn-GELU (stride ``stride``), mean pool, linear; logits times ``scale`` plus ``shift``.

    The stride-2 layers put the CAM layers below the input's resolution, so both libraries'
    resize of the maps is exercised; ``scale`` makes gradients large enough that the original's
    epsilons are negligible (or small enough that they are not).
    """

    def __init__(self, scale: float = 1.0, stride: int = 2, shift: float = 0.0, relu_head: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, stride=stride)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 12, 3, padding=1, stride=stride)
        self.bn2 = nn.BatchNorm2d(12)
        self.act2 = nn.ReLU() if relu_head else nn.GELU()
        self.fc = nn.Linear(12, 6)
        self.scale, self.shift = scale, shift
        with torch.no_grad():
            for bn in (self.bn1, self.bn2):
                bn.running_mean.uniform_(-0.2, 0.2)
                bn.running_var.uniform_(0.5, 1.5)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.3, 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.act2(self.bn2(self.conv2(x)))
        return self.fc(x.mean(dim=(2, 3))) * self.scale + self.shift


TARGETS = [1, 4, 2]


def inputs(batch: int = 3) -> torch.Tensor:
    return torch.randn(batch, 3, 20, 16, generator=torch.Generator().manual_seed(1))
