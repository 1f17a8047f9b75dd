"""pytorch-grad-cam's CAM-times-image metrics (drop and increase in confidence)."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor

from .perturbation_confidence import PerturbationConfidenceMetric

__all__ = ["CamMultImageConfidenceChange", "DropInConfidence", "IncreaseInConfidence", "multiply_tensor_with_cam"]


def multiply_tensor_with_cam(input_tensor: Tensor, cam: Tensor) -> Tensor:
    """The (normalised) image times the CAM, broadcast over channels."""
    return input_tensor * cam


class CamMultImageConfidenceChange(PerturbationConfidenceMetric):
    """Score of the image times its CAM minus the score of the image, per image (float32 [B])."""

    def __init__(self) -> None:
        super().__init__(multiply_tensor_with_cam)


class DropInConfidence(CamMultImageConfidenceChange):
    """How much the score drops (0 where it rises)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return np.maximum(-super().__call__(*args, **kwargs), 0)


class IncreaseInConfidence(CamMultImageConfidenceChange):
    """1.0 where the score rises, else 0.0."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return np.float32(super().__call__(*args, **kwargs) > 0)
