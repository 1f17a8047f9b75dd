"""``RefineCAM``: pytorch-grad-cam's product of per-layer CAMs on :class:`camkit.RefineCAM`."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor, nn

from ... import methods as _m
from ...errors import InvalidInputError
from ._cams import GradCAMPlusPlus
from ._support import augmented, camkit_target, layer_list, model_device, multiply_dressed, pop_legacy

__all__ = ["RefineCAM"]


class RefineCAM:
    """The product of ``base_method``'s maps at each target layer (each in [0, 1]), as float32 [B, H, W].

    As in the original, each layer's map is the one-layer CAM's (ReLU, min-max scaled at the
    layer's size, resized, scaled again) and the product is min-max scaled. ``camkit.RefineCAM``
    scales each layer once, after resizing, so its maps differ slightly from these.

    ``base_method`` is one of this package's CAM classes; extra keywords are accepted as the
    original passes them to it (``compute_input_gradient``, ``uses_gradients``), and ignored.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.compat.pytorch_grad_cam import RefineCAM
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
        ...                     nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
        >>> RefineCAM(net, [net[1], net[3]])(torch.rand(2, 3, 8, 8)).shape
        (2, 8, 8)
    """

    def __init__(
        self,
        model: nn.Module,
        target_layers: Any = None,
        reshape_transform: Any = None,
        base_method: type = GradCAMPlusPlus,
        **kwargs: Any,
    ) -> None:
        self.model = model
        self.target_layers = layer_list(target_layers)
        self.reshape_transform = reshape_transform
        self.base: Any = getattr(base_method, "camkit_class", None)
        if self.base is None:
            raise InvalidInputError(
                f"RefineCAM's base_method must be one of camkit.compat.pytorch_grad_cam's CAM classes, got {base_method!r}"
            )
        self.ignores_eigen_smooth = getattr(base_method, "ignores_eigen_smooth", False)
        self.device = model_device(model)

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        return self.forward(*args, **kwargs)

    def forward(
        self, input_tensor: Tensor, targets: Any = None, eigen_smooth: bool = False, aug_smooth: bool = False, **legacy: Any
    ) -> np.ndarray:
        """Maps float32 [B, H, W]; ``targets=None``: each image's top class."""
        pop_legacy(legacy, "RefineCAM")
        explainer = _m.RefineCAM(
            self.model,
            self.target_layers,
            base=self.base,
            reshape=self.reshape_transform,
            eigen_smooth=bool(eigen_smooth and not self.ignores_eigen_smooth),
        )

        def run(x: Tensor) -> np.ndarray:
            x = x.detach().to(self.device)
            raw = explainer.explain(x, camkit_target(targets, x.shape[0])).raw
            return multiply_dressed(raw if isinstance(raw, tuple) else (raw,), tuple(x.shape[2:]))

        return augmented(run, input_tensor) if aug_smooth else run(input_tensor)

    def __enter__(self) -> RefineCAM:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
