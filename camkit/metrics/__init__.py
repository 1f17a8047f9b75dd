"""Faithfulness measures for saliency maps: tensors in, tensors out, batched.

* :func:`deletion_curve`, :func:`insertion_curve`, :func:`auc` (Petsiuk et al. 2018);
* :func:`average_drop`, :func:`increase_in_confidence` (Chattopadhay et al. 2018);
* :func:`pointing_game` (Zhang et al. 2016), :func:`energy_pointing_game` (Wang et al. 2020);
* :func:`road_curve` with :func:`noisy_linear_imputation` (ROAD, Rong et al. 2022);
* :func:`arcc` with :func:`complexity` and :func:`coherency` (pytorch-grad-cam 1.5.7's ARCC);
* :func:`randomization_check` (Adebayo et al. 2018), with :func:`spearman` and :func:`ssim`;
* :class:`MetricAccumulator`, :class:`CurveAccumulator` to aggregate over a dataset.

Perturbation metrics run the model without gradients, in eval mode (every module's flag
restored after), on chunks of at most ``chunk_size`` images; the model is never modified.
"""

from .accumulate import CurveAccumulator, MetricAccumulator
from .arcc import ARCCScores, arcc, coherency, complexity
from .deletion import (
    Baseline,
    auc,
    average_drop,
    blur_baseline,
    deletion_curve,
    increase_in_confidence,
    insertion_curve,
)
from .pointing import energy_pointing_game, pointing_game, region_masks
from .road import noisy_linear_imputation, road_curve
from .sanity import RandomizationResult, randomization_check, spearman, ssim

__all__ = [
    "ARCCScores",
    "Baseline",
    "CurveAccumulator",
    "MetricAccumulator",
    "RandomizationResult",
    "arcc",
    "auc",
    "average_drop",
    "blur_baseline",
    "coherency",
    "complexity",
    "deletion_curve",
    "energy_pointing_game",
    "increase_in_confidence",
    "insertion_curve",
    "noisy_linear_imputation",
    "pointing_game",
    "randomization_check",
    "region_masks",
    "road_curve",
    "spearman",
    "ssim",
]
