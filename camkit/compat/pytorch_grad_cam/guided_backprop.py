"""``GuidedBackpropReLUModel``: pytorch-grad-cam's guided backpropagation on :class:`camkit.GuidedBackprop`."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ... import methods as _m
from ...functional.attribution import guided_relu_grad
from ._support import model_device, to_numpy

__all__ = ["GuidedBackpropReLU", "GuidedBackpropReLUModel", "GuidedBackpropReLUasModule"]


class GuidedBackpropReLU(torch.autograd.Function):
    """A ReLU whose backward is guided backpropagation's rule (:func:`camkit.functional.guided_relu_grad`).

    ``GuidedBackpropReLU.apply(x)`` is ``relu(x)`` forward; backward passes ``max(grad, 0)``
    where ``x > 0``. The input is not modified.

    Example:
        >>> import torch
        >>> from camkit.compat.pytorch_grad_cam.guided_backprop import GuidedBackpropReLU
        >>> x = torch.tensor([1.0, -1.0, 2.0], requires_grad=True)
        >>> (GuidedBackpropReLU.apply(x) * torch.tensor([1.0, 1.0, -1.0])).sum().backward()
        >>> x.grad
        tensor([1., 0., 0.])
    """

    @staticmethod
    def forward(ctx: Any, input_img: Tensor) -> Tensor:
        output = torch.relu(input_img)
        ctx.save_for_backward(output)
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> Tensor:
        (output,) = ctx.saved_tensors
        return guided_relu_grad(grad_output, output)


class GuidedBackpropReLUasModule(nn.Module):
    """:class:`GuidedBackpropReLU` as a module (the original swaps it in for ``nn.ReLU``; camkit needs no swap).

    Example:
        >>> import torch
        >>> from camkit.compat.pytorch_grad_cam.guided_backprop import GuidedBackpropReLUasModule
        >>> GuidedBackpropReLUasModule()(torch.tensor([-1.0, 3.0]))
        tensor([0., 3.])
    """

    def forward(self, input_img: Tensor) -> Tensor:
        return GuidedBackpropReLU.apply(input_img)


class GuidedBackpropReLUModel:
    """The guided-backpropagation gradient of the first image, float32 numpy [H, W, C].

    camkit applies the guided ReLU rule to every ReLU the forward calls (modules and
    ``F.relu`` / ``torch.relu`` alike) without replacing modules, and leaves the input's
    ``requires_grad`` and ``.grad`` alone; the original patches ``nn.ReLU`` modules only.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.compat.pytorch_grad_cam import GuidedBackpropReLUModel
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> GuidedBackpropReLUModel(net)(torch.rand(1, 3, 8, 8)).shape
        (8, 8, 3)
    """

    def __init__(self, model: nn.Module, device: Any = None) -> None:
        self.model = model
        if device is None:
            self.device = model_device(model)
        else:
            self.device = torch.device(device)
            self.model = self.model.to(self.device)

    def forward(self, input_img: Tensor) -> Any:
        """The model's output."""
        return self.model(input_img)

    def __call__(self, input_img: Tensor, target_category: int | None = None) -> np.ndarray:
        x = input_img.detach().to(self.device)
        raw = _m.GuidedBackprop(self.model).explain(x, target_category).raw
        return np.ascontiguousarray(to_numpy(raw[0]).transpose(1, 2, 0))
