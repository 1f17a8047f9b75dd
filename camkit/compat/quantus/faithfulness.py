"""Quantus 0.6.0's faithfulness metrics on :mod:`camkit.metrics`.

As in Quantus, maps are broadcast to the input's shape, so a feature is one element (one
channel of one position); a map with one channel is read the same on every channel.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from camkit import metrics
from camkit.errors import InvalidInputError

from ._base import Metric, Result

__all__ = ["FaithfulnessCorrelation", "FaithfulnessEstimate", "Monotonicity", "MonotonicityCorrelation", "PixelFlipping"]


def _rows(values: Tensor) -> Result:
    return [float(v) for v in values.double().cpu().tolist()]


def _check_similarity(similarity_func: Any, expected: str) -> None:
    if similarity_func is not None and getattr(similarity_func, "__name__", "") != expected:
        raise InvalidInputError(
            f"camkit.compat.quantus computes {expected} only; got similarity_func={similarity_func!r}"
        )


class PixelFlipping(Metric):
    """Quantus's ``PixelFlipping`` on :func:`camkit.metrics.pixel_flipping`.

    Returns each sample's curve (a list of scores), or its area (trapezoid rule over unit
    steps, as Quantus's ``calculate_auc``) with ``return_auc_per_sample=True``. Equal to Quantus
    on the same inputs.
    """

    softmax_default = True

    def __init__(
        self, features_in_step: int = 1, abs: bool = False, normalise: bool = True, return_auc_per_sample: bool = False,
        perturb_baseline: Any = "black", **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=perturb_baseline, **kwargs)
        self.features_in_step = features_in_step
        self.return_auc_per_sample = return_auc_per_sample

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        curves = metrics.pixel_flipping(
            model, x, a.expand_as(x), y, features_in_step=self.features_in_step, baseline=self.baseline,
            softmax=softmax, chunk_size=chunk_size,
        )  # fmt: skip
        if self.return_auc_per_sample:
            return _rows(torch.trapezoid(curves.double(), dx=1.0, dim=1))
        return [[float(v) for v in row] for row in curves.double().cpu().tolist()]


class FaithfulnessCorrelation(Metric):
    """Quantus's ``FaithfulnessCorrelation`` on :func:`camkit.metrics.faithfulness_correlation`.

    The subsets are drawn from numpy's global generator in Quantus's order (with its extra
    ``uniform`` draw per perturbation), so after ``np.random.seed(s)`` the result equals
    Quantus's. ``similarity_func`` must be Pearson's (the default).
    """

    softmax_default = False

    def __init__(
        self, similarity_func: Any = None, nr_runs: int = 100, subset_size: int = 224, abs: bool = False,
        normalise: bool = True, return_aggregate: bool = True, perturb_baseline: Any = "black", **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(
            abs=abs, normalise=normalise, return_aggregate=return_aggregate, perturb_baseline=perturb_baseline,
            **kwargs,
        )  # fmt: skip
        _check_similarity(similarity_func, "correlation_pearson")
        self.nr_runs = nr_runs
        self.subset_size = subset_size

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        batch, features = x.shape[0], x[0].numel()
        runs = []
        for _ in range(self.nr_runs):
            runs.append(np.stack([np.random.choice(features, self.subset_size, replace=False) for _ in range(batch)]))
            np.random.uniform(size=batch)  # Quantus's baseline table draws this on every perturbation
        subsets = torch.as_tensor(np.stack(runs, axis=1), device=x.device)
        return _rows(
            metrics.faithfulness_correlation(
                model, x, a.expand_as(x), y, subsets=subsets, baseline=self.baseline, softmax=softmax,
                chunk_size=chunk_size,
            )
        )  # fmt: skip


class FaithfulnessEstimate(Metric):
    """Quantus's ``FaithfulnessEstimate`` on :func:`camkit.metrics.faithfulness_estimate`; equal to Quantus."""

    softmax_default = False

    def __init__(
        self, similarity_func: Any = None, features_in_step: int = 1, abs: bool = False, normalise: bool = True,
        perturb_baseline: Any = "black", **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=perturb_baseline, **kwargs)
        _check_similarity(similarity_func, "correlation_pearson")
        self.features_in_step = features_in_step

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        return _rows(
            metrics.faithfulness_estimate(
                model, x, a.expand_as(x), y, features_in_step=self.features_in_step, baseline=self.baseline,
                softmax=softmax, chunk_size=chunk_size,
            )
        )  # fmt: skip


class Monotonicity(Metric):
    """Quantus's ``Monotonicity`` on :func:`camkit.metrics.monotonicity` (Arya et al.).

    Differs from Quantus: Quantus starts from the baseline and, at every step, writes the
    *baseline* into the features it should restore, so the input never changes and every
    sample scores True. camkit restores the features' values, as the paper does. Returns
    one bool per sample, as Quantus.
    """

    softmax_default = True

    def __init__(
        self, features_in_step: int = 1, abs: bool = True, normalise: bool = True, perturb_baseline: Any = "black",
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=perturb_baseline, **kwargs)
        self.features_in_step = features_in_step

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        values = metrics.monotonicity(
            model, x, a.expand_as(x), y, features_in_step=self.features_in_step, baseline=self.baseline,
            softmax=softmax, chunk_size=chunk_size,
        )  # fmt: skip
        return [bool(v) for v in values.cpu().tolist()]


class MonotonicityCorrelation(Metric):
    """Quantus's ``MonotonicityCorrelation`` on :func:`camkit.metrics.monotonicity_correlation`.

    ``perturb_baseline="uniform"`` (the default, and the only one supported here) draws, as
    Quantus does, one value per sample and perturbation from numpy's global generator for all
    the features of a step; after ``np.random.seed(s)`` the result equals Quantus's.
    """

    softmax_default = True

    def __init__(
        self, similarity_func: Any = None, eps: float = 1e-5, nr_samples: int = 100, features_in_step: int = 1,
        abs: bool = True, normalise: bool = True, perturb_baseline: Any = "uniform", **kwargs: Any,
    ) -> None:  # fmt: skip
        if perturb_baseline != "uniform":
            raise InvalidInputError(f"MonotonicityCorrelation supports perturb_baseline='uniform' only, got {perturb_baseline!r}")
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=0.0, **kwargs)
        self.perturb_baseline = perturb_baseline
        _check_similarity(similarity_func, "correlation_spearman")
        self.eps = eps
        self.nr_samples = nr_samples
        self.features_in_step = features_in_step

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        batch, step = x.shape[0], self.features_in_step
        count = -(-x[0].numel() // step)
        draws = np.random.uniform(size=(count, self.nr_samples, batch))  # one call per step and sample in Quantus
        fill = torch.as_tensor(draws, device=x.device).permute(2, 0, 1)[..., None].expand(-1, -1, -1, step)
        return _rows(
            metrics.monotonicity_correlation(
                model, x, a.expand_as(x), y, fill=fill, features_in_step=step, eps=self.eps, softmax=softmax,
                chunk_size=chunk_size,
            )
        )  # fmt: skip
