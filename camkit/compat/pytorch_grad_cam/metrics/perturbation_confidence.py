"""pytorch-grad-cam's perturbation-confidence metrics: the target's score after perturbing the image by its CAM."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ...._internal.state import eval_mode
from ....errors import InvalidTargetError

__all__ = [
    "AveragerAcrossThresholds",
    "PerturbationConfidenceMetric",
    "RemoveLeastRelevantFirst",
    "RemoveMostRelevantFirst",
]


def target_scores(model: nn.Module, x: Tensor, targets: Sequence[Callable[[Any], Tensor]]) -> np.ndarray:
    """Each image's target score (float32 numpy [B]), without gradients, the model in eval mode for the call."""
    if len(targets) != x.shape[0]:
        raise InvalidTargetError(f"got {len(targets)} targets for a batch of {x.shape[0]} images; pass one per image")
    with torch.no_grad(), eval_mode(model):
        outputs = model(x)
        return np.array([target(row).detach().cpu().numpy() for target, row in zip(targets, outputs)], dtype=np.float32)


class PerturbationConfidenceMetric:
    """The change of each image's target score when the image is perturbed by its CAM.

    Args:
        perturbation: ``f(image [C, H, W], cam [H, W]) -> image``.

    Called as ``metric(input_tensor, cams, targets, model, return_visualization=False,
    return_diff=True)``: the scores after minus before (float32 [B]), or only after; with
    ``return_visualization`` also the perturbed batch. Unlike the original the model's
    training flags are restored after the call.
    """

    def __init__(self, perturbation: Callable[[Tensor, Tensor], Tensor]) -> None:
        self.perturbation = perturbation

    def __call__(
        self,
        input_tensor: Tensor,
        cams: np.ndarray,
        targets: Sequence[Callable[[Any], Tensor]],
        model: nn.Module,
        return_visualization: bool = False,
        return_diff: bool = True,
    ) -> Any:
        perturbed = torch.stack(
            [
                self.perturbation(image.cpu(), torch.as_tensor(np.asarray(cam))).to(input_tensor.device)
                for image, cam in zip(input_tensor, cams)
            ]
        )
        result = target_scores(model, perturbed, targets)
        if return_diff:
            result = result - target_scores(model, input_tensor, targets)
        return (result, perturbed) if return_visualization else result


def _keep_mask(mask: Tensor, percentile: float | str) -> Tensor:
    """1 where a pixel is kept, 0 where it is removed: below the percentile kept, or Otsu's threshold for ``'auto'``."""
    if percentile == "auto":
        from skimage.filters import threshold_otsu

        levels = np.uint8(mask.cpu().numpy() * 255)
        return torch.from_numpy(np.float32(levels > threshold_otsu(levels))).to(mask.device)
    threshold = np.percentile(mask.cpu().numpy(), float(percentile))
    return (mask < float(threshold)).float()


class RemoveMostRelevantFirst:
    """Impute the pixels whose CAM value is at or above the ``percentile``-th percentile."""

    def __init__(self, percentile: float | str, imputer: Callable[[Tensor, Tensor], Tensor]) -> None:
        self.percentile = percentile
        self.imputer = imputer

    def __call__(self, input_tensor: Tensor, mask: Tensor) -> Tensor:
        return self.imputer(input_tensor, _keep_mask(mask, self.percentile))


class RemoveLeastRelevantFirst(RemoveMostRelevantFirst):
    """Impute the pixels whose CAM value is at or below the ``100 - percentile``-th percentile."""

    def __call__(self, input_tensor: Tensor, mask: Tensor) -> Tensor:
        return super().__call__(input_tensor, 1 - mask)


class AveragerAcrossThresholds:
    """The mean of a metric ``imputer(percentile)`` over ``percentiles``, per image."""

    def __init__(
        self, imputer: Callable[[Any], Any], percentiles: Sequence[float] = (10, 20, 30, 40, 50, 60, 70, 80, 90)
    ):
        self.imputer = imputer
        self.percentiles = list(percentiles)

    def __call__(self, input_tensor: Tensor, cams: np.ndarray, targets: Sequence[Any], model: nn.Module) -> np.ndarray:
        scores = [self.imputer(p)(input_tensor, cams, targets, model) for p in self.percentiles]
        return np.mean(np.array(scores, dtype=np.float32), axis=0)
