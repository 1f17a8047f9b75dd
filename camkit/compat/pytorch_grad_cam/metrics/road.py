"""pytorch-grad-cam's ROAD metrics on :func:`camkit.metrics.noisy_linear_imputation`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from torch import Tensor, nn

from ....metrics.road import noisy_linear_imputation
from .perturbation_confidence import (
    AveragerAcrossThresholds,
    PerturbationConfidenceMetric,
    RemoveLeastRelevantFirst,
    RemoveMostRelevantFirst,
)

__all__ = [
    "NoisyLinearImputer",
    "ROADCombined",
    "ROADLeastRelevantFirst",
    "ROADLeastRelevantFirstAverage",
    "ROADMostRelevantFirst",
    "ROADMostRelevantFirstAverage",
    "neighbors_weights",
]

_PERCENTILES = (10, 20, 30, 40, 50, 60, 70, 80, 90)

#: ROAD's neighbour weights ``((dy, dx), weight)``: 1/6 for the four direct neighbours, 1/12 for the diagonals
neighbors_weights = [
    ((1, 1), 1 / 12), ((0, 1), 1 / 6), ((-1, 1), 1 / 12), ((1, -1), 1 / 12),
    ((0, -1), 1 / 6), ((-1, -1), 1 / 12), ((1, 0), 1 / 6), ((-1, 0), 1 / 6),
]


class NoisyLinearImputer:
    """ROAD's imputation: removed pixels (``mask == 0``) solved as their neighbours' weighted mean, plus noise.

    Called as ``imputer(image [C, H, W], mask [H, W])``; the image is not modified.
    """

    def __init__(self, noise: float = 0.01, weighting: Any = None) -> None:
        self.noise = noise
        self.weighting = weighting

    def __call__(self, img: Tensor, mask: Tensor) -> Tensor:
        return noisy_linear_imputation(img[None], (mask == 0)[None].to(img.device), noise=self.noise)[0]


class ROADMostRelevantFirst(PerturbationConfidenceMetric):
    """Score change when the ``percentile``% most relevant pixels are imputed."""

    def __init__(self, percentile: float = 80) -> None:
        super().__init__(RemoveMostRelevantFirst(percentile, NoisyLinearImputer()))


class ROADLeastRelevantFirst(PerturbationConfidenceMetric):
    """Score change when the ``100 - percentile``% least relevant pixels are imputed."""

    def __init__(self, percentile: float = 20) -> None:
        super().__init__(RemoveLeastRelevantFirst(percentile, NoisyLinearImputer()))


class ROADMostRelevantFirstAverage(AveragerAcrossThresholds):
    """:class:`ROADMostRelevantFirst` averaged over ``percentiles``."""

    def __init__(self, percentiles: Sequence[float] = _PERCENTILES) -> None:
        super().__init__(ROADMostRelevantFirst, percentiles)


class ROADLeastRelevantFirstAverage(AveragerAcrossThresholds):
    """:class:`ROADLeastRelevantFirst` averaged over ``percentiles``."""

    def __init__(self, percentiles: Sequence[float] = _PERCENTILES) -> None:
        super().__init__(ROADLeastRelevantFirst, percentiles)


class ROADCombined:
    """Half the difference of the least- and most-relevant-first averages, per image."""

    def __init__(self, percentiles: Sequence[float] = _PERCENTILES) -> None:
        self.percentiles = list(percentiles)
        self.morf_averager = ROADMostRelevantFirstAverage(percentiles)
        self.lerf_averager = ROADLeastRelevantFirstAverage(percentiles)

    def __call__(self, input_tensor: Tensor, cams: np.ndarray, targets: Sequence[Any], model: nn.Module) -> np.ndarray:
        lerf = self.lerf_averager(input_tensor, cams, targets, model)
        morf = self.morf_averager(input_tensor, cams, targets, model)
        return (lerf - morf) / 2
