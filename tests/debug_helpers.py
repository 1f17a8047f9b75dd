"""Helpers shared by the camkit.debug tests."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def hook_count(model: nn.Module) -> int:
    """Module hooks of every kind plus tensor hooks left on parameters."""
    modules = sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) + len(m._backward_pre_hooks)
        for m in model.modules()
    )
    return modules + sum(len(p._backward_hooks or {}) for p in model.parameters())


class NaNGradFn(torch.autograd.Function):
    """Identity forward; the backward puts one NaN at flat index 3 of sample 0's gradient."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        grad = grad.clone()
        grad[0].view(-1)[3] = float("nan")
        return grad


class Poison(nn.Module):
    """Identity; on call number ``forward_call`` it writes a NaN at output flat index 3 of sample 0,
    on call number ``backward_call`` its backward does the same to the gradient."""

    def __init__(self, forward_call: int | None = None, backward_call: int | None = None) -> None:
        super().__init__()
        self.forward_call = forward_call
        self.backward_call = backward_call
        self.calls = 0

    def forward(self, x: Tensor) -> Tensor:
        call, self.calls = self.calls, self.calls + 1
        if call == self.backward_call:
            return NaNGradFn.apply(x)
        if call == self.forward_call:
            x = x.clone()
            x[0].view(-1)[3] = float("nan")
        return x


class SharedNet(nn.Module):
    """conv -> poison -> conv -> poison (the same Poison module twice) -> pool -> linear. Input [B, 3, 6, 6]."""

    def __init__(self, poison: Poison) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.poison = poison
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        x = self.poison(self.conv1(x))
        x = self.poison(self.conv2(x))
        return self.fc(x.mean(dim=(2, 3)))
