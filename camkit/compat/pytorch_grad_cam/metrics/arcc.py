"""``ARCC``, ``Complexity``, ``Coherency``: pytorch-grad-cam 1.5.7's ARCC on :func:`camkit.metrics.arcc`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ....metrics.arcc import arcc, arcc_complexity, coherency, pearson_rows
from .._support import camkit_target, to_numpy
from ..utils.model_targets import ClassifierOutputTarget

__all__ = ["ARCC", "Coherency", "Complexity", "batch_pearson_coherency"]


def batch_pearson_coherency(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """The Pearson correlation of each pair of maps ``A[i]``, ``B[i]`` (any shape after the batch axis) [B].

    camkit's correlation (:mod:`camkit.metrics.arcc`), ``cov / (std_a std_b + 1e-8)`` with the
    unbiased estimates, returned in the inputs' float dtype.

    Example:
        >>> import numpy as np
        >>> from camkit.compat.pytorch_grad_cam.metrics.arcc import batch_pearson_coherency
        >>> a = np.array([[0.0, 1.0, 2.0], [1.0, 0.0, 1.0]], np.float32)
        >>> batch_pearson_coherency(a, 2 * a).round(4).tolist()
        [1.0, 1.0]
    """
    a, b = np.asarray(A), np.asarray(B)
    rho = pearson_rows(torch.from_numpy(a.reshape(a.shape[0], -1)), torch.from_numpy(b.reshape(b.shape[0], -1)))
    dtype = np.result_type(a, b)
    return rho.numpy().astype(dtype if np.issubdtype(dtype, np.floating) else np.float64)


def _explainer(cam: Callable[..., np.ndarray]) -> Callable[[Tensor, Any], Tensor]:
    """A compat CAM as camkit's ``explainer(images, target) -> maps`` (class indices back to class targets)."""

    def explain(images: Tensor, target: Any) -> Tensor:
        if isinstance(target, Tensor) or isinstance(target, (list, tuple)):
            target = [ClassifierOutputTarget(int(t)) for t in target]
        elif callable(target):
            raise TypeError("pass per-image targets")
        return torch.from_numpy(cam(images, target)).to(images.device)

    return explain


class Complexity:
    """The mean of each map [B, H, W] (lower is simpler), float32 [B]."""

    def __call__(self, cams: np.ndarray) -> np.ndarray:
        return to_numpy(arcc_complexity(torch.as_tensor(np.asarray(cams, dtype=np.float32))))


class Coherency:
    """``(r + 1) / 2`` with ``r`` the correlation of each map with the map of the image times it, float32 [B]."""

    def __call__(
        self, input_tensor: Tensor, cams: np.ndarray, targets: Sequence[Any], model: nn.Module, base_method: Any
    ) -> np.ndarray:
        maps = torch.as_tensor(np.asarray(cams, dtype=np.float32)).to(input_tensor.device)
        return to_numpy(coherency(input_tensor, maps, _explainer(base_method), camkit_target(targets, len(maps))))


class ARCC:
    """The harmonic mean of coherency, simplicity (1 - complexity) and ROAD, float32 [B], as the original.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit.compat.pytorch_grad_cam import GradCAM
        >>> from camkit.compat.pytorch_grad_cam.metrics.arcc import ARCC
        >>> from camkit.compat.pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
        >>> net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        ...                     nn.Flatten(), nn.Linear(4, 2))
        >>> x, targets = torch.rand(2, 3, 8, 8), [ClassifierOutputTarget(1)] * 2
        >>> cam = GradCAM(net, [net[1]])
        >>> ARCC(cam)(x, cam(x, targets), targets, net).shape
        (2,)
    """

    def __init__(self, base_method: Any, road_percentiles: Sequence[float] = (20, 40, 60, 80)) -> None:
        self.base_method = base_method
        self.road_percentiles = list(road_percentiles)

    def __call__(self, input_tensor: Tensor, grayscale_cams: np.ndarray, targets: Sequence[Any], model: nn.Module) -> np.ndarray:
        maps = torch.as_tensor(np.asarray(grayscale_cams, dtype=np.float32)).to(input_tensor.device)
        scores = arcc(
            model,
            input_tensor,
            maps,
            _explainer(self.base_method),
            camkit_target(targets, len(maps)),
            percentiles=self.road_percentiles,
        )
        return to_numpy(scores.arcc)
