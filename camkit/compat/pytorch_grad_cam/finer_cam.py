"""``FinerCAM``: pytorch-grad-cam's Finer-CAM wrapper on :class:`camkit.FinerCAM`."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ... import methods as _m
from ...errors import InvalidInputError
from ...targets.classes import select_output
from ._cams import GradCAM
from ._support import augmented, dress_maps, pop_legacy

__all__ = ["DEFAULT_COMPARISON_CATEGORIES", "FinerCAM"]

#: the rank positions of the rivals compared with by default: the three nearest classes
DEFAULT_COMPARISON_CATEGORIES = (1, 2, 3)


def _comparison_count(categories: Any) -> int:
    """The number of nearest rivals meant by the original's rank positions ``[1, 2, ..., n]``."""
    if categories is None:
        return len(DEFAULT_COMPARISON_CATEGORIES)
    ranks = [int(c) for c in categories]
    if ranks != list(range(1, len(ranks) + 1)):
        raise InvalidInputError(
            f"comparison_categories={ranks}: camkit compares with the n nearest classes, the rank positions "
            "[1, 2, ..., n]; pass such a list (or targets= with FinerWeightedTarget for other rivals)."
        )
    return len(ranks)


class _Rivals(_m.FinerCAM):
    """camkit's Finer-CAM with at most (classes - 1) rivals: the original drops the rank positions past the last class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wanted = self.comparisons

    def _call_model(self, x: Tensor) -> Any:
        output = super()._call_model(x)
        classes = select_output(output, self.output).shape[-1]
        self.comparisons = max(1, min(self.wanted, classes - 1))
        return output


class FinerCAM:
    """Finer-CAM: the base CAM of the target's score minus its nearest rivals', on :class:`camkit.FinerCAM`.

    ``base_method`` is one of this package's gradient CAM classes. Where the rivals' softmax
    probabilities underflow the original divides 0 by its 1e-9 and returns a zero map; camkit
    weighs the rivals by a softmax over them alone.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.compat.pytorch_grad_cam import FinerCAM
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 5))
        >>> with FinerCAM(model=net, target_layers=[net[1]]) as cam:
        ...     cam(input_tensor=torch.rand(2, 3, 8, 8)).shape
        (2, 8, 8)
    """

    def __init__(
        self,
        model: nn.Module,
        target_layers: Any = None,
        reshape_transform: Any = None,
        base_method: type = GradCAM,
        **legacy: Any,
    ) -> None:
        self.base_cam = base_method(model, target_layers, reshape_transform, **legacy)
        self.compute_input_gradient = self.base_cam.compute_input_gradient
        self.uses_gradients = self.base_cam.uses_gradients

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        return self.forward(*args, **kwargs)

    def __enter__(self) -> FinerCAM:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def forward(
        self,
        input_tensor: Tensor,
        targets: Any = None,
        eigen_smooth: bool = False,
        alpha: float = 1,
        comparison_categories: Any = None,
        target_idx: int | None = None,
        aug_smooth: bool = False,
        **legacy: Any,
    ) -> np.ndarray:
        """Maps float32 [B, H, W]; ``target_idx``: the class to explain (default: each image's top class)."""
        pop_legacy(legacy, "FinerCAM")
        if targets is not None:  # explicit targets (FinerWeightedTarget...): the base CAM of them
            return self.base_cam(input_tensor, targets, aug_smooth=aug_smooth, eigen_smooth=eigen_smooth)
        base = getattr(self.base_cam, "camkit_class", None)
        if base is None:
            raise InvalidInputError(
                f"FinerCAM's base_method must be one of camkit.compat.pytorch_grad_cam's gradient CAMs, "
                f"got {type(self.base_cam).__name__}"
            )
        explainer = _Rivals(
            self.base_cam.model,
            self.base_cam.target_layers,
            base=base,
            comparisons=_comparison_count(comparison_categories),
            alpha=float(alpha),
            reshape=self.base_cam.reshape_transform,
        )
        explainer.eigen_smooth = bool(eigen_smooth)

        def run(x: Tensor) -> np.ndarray:
            x = x.detach().to(self.base_cam.device)
            return dress_maps(explainer.explain(x, target_idx).raw, tuple(x.shape[2:]))

        if aug_smooth:
            return augmented(run, input_tensor, self.base_cam.tta_transforms)
        with torch.enable_grad():
            return run(input_tensor)
