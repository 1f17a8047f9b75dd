"""Quantus 0.6.0's faithfulness metrics on :mod:`camkit.metrics` (``Infidelity`` and ``SensitivityN``
are in :mod:`camkit.compat.quantus.infidelity`).

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

from ._base import Metric, Result, is_default, quantus_baseline
from ._perturbation import Replayed
from .functions.perturb_func import batch_baseline_replacement_by_indices

__all__ = [
    "FaithfulnessCorrelation",
    "FaithfulnessEstimate",
    "Monotonicity",
    "MonotonicityCorrelation",
    "PixelFlipping",
]


def _rows(values: Tensor) -> Result:
    return [float(v) for v in values.double().cpu().tolist()]


class PixelFlipping(Metric):
    """Quantus's ``PixelFlipping`` on :func:`camkit.metrics.pixel_flipping`.

    Returns each sample's curve (a list of scores), or its area (trapezoid rule over unit
    steps, as Quantus's ``calculate_auc``) with ``return_auc_per_sample=True``. Equal to Quantus
    on the same inputs, ``perturb_baseline="uniform"`` included (one draw per sample and step from
    numpy's global generator, as Quantus). Differs with ``"mean"``: Quantus takes the mean of the
    input as perturbed so far at every step (it drifts as features are replaced); camkit each
    sample's mean of the clean input.
    """

    softmax_default = True
    takes_predict_kwargs = True
    uniform_order = "descending"
    perturb_default = staticmethod(batch_baseline_replacement_by_indices)

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
            model, x, a.expand_as(x), y, features_in_step=self.features_in_step, baseline=self.batch_baseline(x, a, self.features_in_step),
            softmax=softmax, chunk_size=chunk_size, perturb=self.perturb_hook(a.expand_as(x), descending=True),
        )  # fmt: skip
        if self.return_auc_per_sample:
            return _rows(torch.trapezoid(curves.double(), dx=1.0, dim=1))
        return [[float(v) for v in row] for row in curves.double().cpu().tolist()]


class FaithfulnessCorrelation(Metric):
    """Quantus's ``FaithfulnessCorrelation`` on :func:`camkit.metrics.faithfulness_correlation`.

    The subsets are drawn from numpy's global generator in Quantus's order (with its extra
    ``uniform`` draw per perturbation when ``perturb_baseline`` is a string, which is that run's
    value per sample with ``"uniform"``), so after ``np.random.seed(s)`` the result equals Quantus's. A ``similarity_func`` is called as
    Quantus calls it, ``f(a=sums, b=drops, batched=True)`` on [B, nr_runs] rows. A ``perturb_func`` is called
    as Quantus calls it, once per run; one that draws from numpy's generator gets Quantus's numbers (it is
    called once as the subsets are drawn, to move the generator as in Quantus, and again from the same
    state when its run is scored).
    """

    softmax_default = False
    takes_predict_kwargs = True
    uniform_order = "runs"  # "uniform": one draw per sample and run (not a stepwise order)
    perturb_default = staticmethod(batch_baseline_replacement_by_indices)

    def __init__(
        self, similarity_func: Any = None, nr_runs: int = 100, subset_size: int = 224, abs: bool = False,
        normalise: bool = True, return_aggregate: bool = True, perturb_baseline: Any = "black", **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(
            abs=abs, normalise=normalise, return_aggregate=return_aggregate, perturb_baseline=perturb_baseline,
            **kwargs,
        )  # fmt: skip
        self.similarity_func = similarity_func
        self.nr_runs = nr_runs
        self.subset_size = subset_size

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        batch, features = x.shape[0], x[0].numel()
        if self.subset_size >= x[0, 0].numel():  # Quantus's check: against the size of one channel
            raise InvalidInputError(
                f"subset_size must be smaller than the input's size per channel, got {self.subset_size} >= "
                f"{x[0, 0].numel()}"
            )
        runs, draws, states = [], [], []
        flat = x.detach().flatten(1).cpu().numpy()
        for _ in range(self.nr_runs):
            runs.append(np.stack([np.random.choice(features, self.subset_size, replace=False) for _ in range(batch)]))
            if self.perturb_func is not None:  # Quantus calls it now: it may draw, between the subsets
                states.append(np.random.get_state())
                self.perturb_func(arr=flat.copy(), indices=runs[-1])  # moves numpy's generator as that call does
            elif isinstance(self.perturb_baseline, str):  # Quantus's table draws this each time
                draws.append(np.random.uniform(*self.uniform_bounds, size=batch))  # "uniform": this run's values
        subsets = torch.as_tensor(np.stack(runs, axis=1), device=x.device)
        fill = torch.as_tensor(np.stack(draws, axis=1), device=x.device) if self.uniform else None
        hook = self.perturb_hook()
        return _rows(
            metrics.faithfulness_correlation(
                model, x, a.expand_as(x), y, subsets=subsets, baseline=self.baseline, fill=fill, softmax=softmax,
                chunk_size=chunk_size, similarity=self.similarity_rows(),
                perturb=None if hook is None else Replayed(hook, states),
            )
        )  # fmt: skip


class FaithfulnessEstimate(Metric):
    """Quantus's ``FaithfulnessEstimate`` on :func:`camkit.metrics.faithfulness_estimate`; equal to Quantus.

    A ``similarity_func`` is called as Quantus calls it, ``f(a=sums, b=drops, batched=True)``.
    """

    softmax_default = False
    takes_predict_kwargs = True
    uniform_order = "descending"
    perturb_default = staticmethod(batch_baseline_replacement_by_indices)

    def __init__(
        self, similarity_func: Any = None, features_in_step: int = 1, abs: bool = False, normalise: bool = True,
        perturb_baseline: Any = "black", **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=perturb_baseline, **kwargs)
        self.similarity_func = similarity_func
        self.features_in_step = features_in_step

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        return _rows(
            metrics.faithfulness_estimate(
                model, x, a.expand_as(x), y, features_in_step=self.features_in_step, baseline=self.batch_baseline(x, a, self.features_in_step),
                softmax=softmax, chunk_size=chunk_size, similarity=self.similarity_rows(),
                perturb=self.perturb_hook(a.expand_as(x), descending=True),
            )
        )  # fmt: skip


class Monotonicity(Metric):
    """Quantus's ``Monotonicity`` on :func:`camkit.metrics.monotonicity` (Arya et al.).

    Differs from Quantus: Quantus starts from the baseline and, at every step, writes the
    *baseline* into the features it should restore, so the input never changes and every
    sample scores True. camkit restores the features' values, as the paper does. Returns
    one bool per sample, as Quantus. ``perturb_baseline="uniform"``: the start is each input filled
    with one draw per sample, as in Quantus, whose per-step draws (written where it should restore
    features) are drawn too, so numpy's generator is left as Quantus leaves it.
    """

    softmax_default = True
    takes_predict_kwargs = True
    uniform_order = "start"  # "uniform": one value per sample for the starting input
    perturb_default = staticmethod(batch_baseline_replacement_by_indices)

    def __init__(
        self, features_in_step: int = 1, abs: bool = True, normalise: bool = True, perturb_baseline: Any = "black",
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=perturb_baseline, **kwargs)
        self.features_in_step = features_in_step

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        baseline = self.baseline
        named = isinstance(self.perturb_baseline, str)
        if self.uniform or (self.perturb_func is not None and named):
            # Quantus's start: perturb_baseline's values, drawn without perturb_func_kwargs (uniform in [0, 1))
            draws = torch.as_tensor(np.random.uniform(0.0, 1.0, size=x.shape[0]), dtype=x.dtype, device=x.device)
            if self.perturb_baseline.lower() == "uniform":
                baseline = draws.view(-1, *(1,) * (x.dim() - 1)).expand_as(x)
        if self.uniform:  # the draws of Quantus's default function at each step (written where nothing changes)
            np.random.uniform(*self.uniform_bounds, size=(-(-x[0].numel() // self.features_in_step), x.shape[0]))
        elif self.perturb_func is not None and not (named and self.perturb_baseline.lower() == "uniform"):
            baseline = quantus_baseline(self.perturb_baseline)
        values = metrics.monotonicity(
            model, x, a.expand_as(x), y, features_in_step=self.features_in_step, baseline=baseline,
            softmax=softmax, chunk_size=chunk_size, perturb=self.perturb_hook(a.expand_as(x), descending=False),
        )  # fmt: skip
        return [bool(v) for v in values.cpu().tolist()]


class MonotonicityCorrelation(Metric):
    """Quantus's ``MonotonicityCorrelation`` on :func:`camkit.metrics.monotonicity_correlation`.

    Every ``perturb_baseline`` Quantus's default perturbation takes here: ``"uniform"`` (the
    default) draws, as Quantus does, one value per sample and perturbation from numpy's global
    generator for all the features of a step (between ``perturb_func_kwargs``' ``uniform_low``
    and ``uniform_high``, default 0 and 1), so after ``np.random.seed(s)`` the result equals
    Quantus's; a number, ``"black"``, ``"white"`` or ``"mean"`` (each sample's minimum, maximum or
    mean) replaces the group by that value, one forward per group (Quantus repeats the same
    forward ``nr_samples`` times; the mean is the same). ``"random"`` and the neighbourhood
    baselines raise, as in Quantus. ``similarity_func`` is called as Quantus calls it,
    ``f(a=sums, b=variances, batched=True)`` on [B, P] rows.
    """

    softmax_default = True
    takes_predict_kwargs = True
    perturb_default = staticmethod(batch_baseline_replacement_by_indices)

    def __init__(
        self, similarity_func: Any = None, eps: float = 1e-5, nr_samples: int = 100, features_in_step: int = 1,
        abs: bool = True, normalise: bool = True, perturb_baseline: Any = "uniform",
        perturb_func_kwargs: dict[str, Any] | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        fill_kwargs = dict(perturb_func_kwargs or {})
        unknown = sorted(set(fill_kwargs) - {"uniform_low", "uniform_high"})
        if unknown or not is_default("MonotonicityCorrelation", "perturb_func", kwargs.get("perturb_func")):
            # the caller's function (or keywords for Quantus's), called as Quantus calls it
            super().__init__(abs=abs, normalise=normalise, perturb_baseline=perturb_baseline,
                             perturb_func_kwargs=perturb_func_kwargs, **kwargs)  # fmt: skip
            self.similarity_func, self.eps, self.nr_samples = similarity_func, eps, nr_samples
            self.features_in_step, self.low, self.high = features_in_step, 0.0, 1.0
            return
        uniform = isinstance(perturb_baseline, str) and perturb_baseline.lower() == "uniform"
        if isinstance(perturb_baseline, str) and perturb_baseline.lower() not in ("uniform", "black", "white", "mean"):
            raise InvalidInputError(
                f"MonotonicityCorrelation's perturbation takes perturb_baseline 'uniform', 'black', 'white', 'mean' "
                f"or a number, as Quantus's does; got {perturb_baseline!r}"
            )
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=0.0 if uniform else perturb_baseline, **kwargs)
        self.perturb_baseline = perturb_baseline
        self.low, self.high = float(fill_kwargs.get("uniform_low", 0.0)), float(fill_kwargs.get("uniform_high", 1.0))
        self.similarity_func = similarity_func
        self.eps = eps
        self.nr_samples = nr_samples
        self.features_in_step = features_in_step

    def fill(self, x: Tensor) -> Tensor:
        """The replacement values [B, P, samples, features_in_step] Quantus's perturbation puts in."""
        batch, step = x.shape[0], self.features_in_step
        count = -(-x[0].numel() // step)
        if isinstance(self.perturb_baseline, str) and self.perturb_baseline.lower() == "uniform":
            # one call of size B per step and sample in Quantus: the same numbers in the same order
            draws = np.random.uniform(self.low, self.high, size=(count, self.nr_samples, batch))
            return torch.as_tensor(draws, device=x.device).permute(2, 0, 1)[..., None].expand(-1, -1, -1, step)
        value = self.baseline(x) if callable(self.baseline) else torch.full_like(x, float(self.baseline))
        return value.flatten(1)[:, :1, None, None].expand(batch, count, 1, step)

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        perturb = self.perturb_hook(a.expand_as(x), descending=False)
        return _rows(
            metrics.monotonicity_correlation(
                model, x, a.expand_as(x), y, fill=None if perturb else self.fill(x), samples=self.nr_samples,
                features_in_step=self.features_in_step, eps=self.eps, softmax=softmax, chunk_size=chunk_size,
                similarity=self.similarity_rows(), perturb=perturb,
            )
        )  # fmt: skip
