"""Quantus 0.6.0's ``Infidelity`` and ``SensitivityN`` on :mod:`camkit.metrics` (Yeh's and Ancona's estimators)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from camkit import metrics
from camkit.errors import InvalidInputError

from ._base import Metric, Result, is_default
from .faithfulness import _rows
from .functions.perturb_func import batch_baseline_replacement_by_indices

__all__ = ["Infidelity", "SensitivityN"]


class Infidelity(Metric):
    """Quantus's ``Infidelity`` as Yeh et al.'s sampled estimator (:func:`camkit.metrics.infidelity`).

    Differs from Quantus: Quantus slides each patch over the whole input in raster order,
    the same fixed deletions in every one of its ``n_perturb_samples`` repeats (the repeats are
    identical, so the "expectation" is a single deterministic pass). camkit draws, for each of
    the ``n_perturb_samples`` repeats and each size in ``perturb_patch_sizes``, one square patch
    at a random place (numpy's global generator, one draw per sample and axis), sets it to the
    baseline (``I = (x - baseline) * patch``, Yeh's square removal) and returns
    ``mean (I . a - (f(x) - f(x - I)))^2``. A ``perturb_func`` is called as Quantus calls it on each
    square (``arr=x`` [B, F], ``indices`` its elements [B, C * size^2]), ``I = x - result``. A ``loss_func`` function is called as Quantus calls it,
    ``f(a=score_changes, b=attribution_sums, batched=True)`` on [B, n_perturb_samples] rows, once per
    patch size (Quantus: over one size's patches), and the results averaged over the sizes.
    """

    softmax_default = False
    perturb_default = staticmethod(batch_baseline_replacement_by_indices)
    takes_predict_kwargs = True

    def __init__(
        self, loss_func: Any = "mse", perturb_patch_sizes: list[int] | None = None, n_perturb_samples: int = 10,
        abs: bool = False, normalise: bool = False, perturb_baseline: Any = "black", **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=perturb_baseline, **kwargs)
        if isinstance(loss_func, str) and loss_func != "mse":
            raise InvalidInputError(f"loss_func must be 'mse' or a function, as in Quantus; got {loss_func!r}")
        self.loss_func = None if isinstance(loss_func, str) or is_default("Infidelity", "loss_func", loss_func) else loss_func
        self.perturb_patch_sizes = list(perturb_patch_sizes) if perturb_patch_sizes is not None else [4]
        self.n_perturb_samples = n_perturb_samples

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        batch, spatial = x.shape[0], x.shape[2:]
        canvas = self.baseline(x) if callable(self.baseline) else torch.full_like(x, float(self.baseline))
        removed = x - canvas
        perturbations = []
        for _ in range(self.n_perturb_samples):
            for size in self.perturb_patch_sizes:
                if not 0 < size <= min(spatial):
                    raise InvalidInputError(f"perturb_patch_sizes must fit the input {list(spatial)}, got {size}")
                mask = torch.zeros(batch, 1, *spatial, dtype=torch.bool, device=x.device)
                corners = [np.random.randint(0, n - size + 1, size=batch) for n in spatial]
                for b in range(batch):
                    window: tuple[int | slice, ...] = (b, 0, *(slice(int(c[b]), int(c[b]) + size) for c in corners))
                    mask[window] = True
                perturbations.append(removed * mask if self.perturb_func is None else self._called(x, mask))
        plan = torch.stack(perturbations, dim=1)
        return _rows(
            metrics.infidelity(model, x, a, y, perturbations=plan, softmax=softmax, chunk_size=chunk_size, loss=self._loss())
        )

    def _called(self, x: Tensor, mask: Tensor) -> Tensor:
        """``I = x - perturb_func(arr=x [B, F], indices=the square's elements [B, C * size^d])``, channel by channel."""
        chosen = mask.expand_as(x).reshape(x.shape[0], -1)
        indices = chosen.nonzero()[:, 1].view(x.shape[0], -1)  # each row's elements in order, as Quantus's blocks
        hook = self.perturb_hook()
        assert hook is not None
        return x - hook(x, indices)

    def _loss(self) -> Callable[[Tensor, Tensor], Tensor] | None:
        """``loss_func`` called as Quantus calls it, ``f(a=changes, b=dots, batched=True)``, once per patch size
        (over the ``n_perturb_samples`` draws of that size); the mean over sizes, as Quantus averages them."""
        func, sizes = self.loss_func, len(self.perturb_patch_sizes)
        if func is None:
            return None

        def loss(dots: Tensor, changes: Tensor) -> Tensor:
            rows = [func(a=changes[:, k::sizes].cpu().numpy(), b=dots[:, k::sizes].cpu().numpy(), batched=True)
                    for k in range(sizes)]  # fmt: skip
            return torch.as_tensor(np.mean(np.stack([np.asarray(r, dtype=np.float64) for r in rows], axis=1), axis=1))

        return loss


class SensitivityN(Metric):
    """Quantus's ``SensitivityN`` as Ancona et al. define it (:func:`camkit.metrics.sensitivity_n`).

    Differs from Quantus: Quantus removes features cumulatively (most relevant first), pairs
    each *cumulative* score drop with the attribution of the last step only, and correlates
    those across the samples of the first batch (one value per ``n``, from one draw each).
    camkit draws ``nr_samples`` random subsets of each size ``n = k * features_in_step``
    (``k = 1 .. 0.8 N / features_in_step``, Quantus's grid) per sample, correlates over them for
    each sample, and returns per ``n`` the mean over samples (``[aggregate]`` by default, as
    Quantus). ``nr_samples`` is camkit's argument (Quantus has no draws to count). The subsets
    come from a torch generator on the input's device, seeded by one draw of numpy's global
    generator per batch, so ``np.random.seed(s)`` fixes the result.

    Cost: ``B * nr_samples * K + B`` forward passes for the ``K`` sizes; Quantus's one cumulative
    pass runs ``B * ceil(C * N / features_in_step) + B``, so with the default ``nr_samples=100``
    this runs about ``80 / C`` times Quantus's forwards, and takes about that much longer.
    """

    softmax_default = True
    takes_predict_kwargs = True
    uniform_order = "function"  # "uniform": Quantus's default function draws it, one value per sample and call
    perturb_default = staticmethod(batch_baseline_replacement_by_indices)

    def __init__(
        self, similarity_func: Any = None, n_max_percentage: float = 0.8, features_in_step: int = 1,
        abs: bool = False, normalise: bool = True, return_aggregate: bool = True, perturb_baseline: Any = "black",
        nr_samples: int = 100, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(
            abs=abs, normalise=normalise, return_aggregate=return_aggregate, perturb_baseline=perturb_baseline,
            **kwargs,
        )  # fmt: skip
        self.similarity_func = similarity_func
        self.n_max_percentage = n_max_percentage
        self.features_in_step = features_in_step
        self.nr_samples = nr_samples
        self._curves: list[Tensor] = []

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        top = int(self.n_max_percentage * x[0, 0].numel() // self.features_in_step)
        sizes = [k * self.features_in_step for k in range(1, top + 1)]
        # one numpy draw seeds the subsets' generator on x's device: np.random.seed(s) fixes the result
        generator = torch.Generator(device=x.device).manual_seed(int(np.random.randint(0, 2**62, dtype=np.int64)))
        _, curves = metrics.sensitivity_n(
            model, x, a.expand_as(x), y, sizes=sizes, samples=self.nr_samples, generator=generator,
            baseline=self.baseline, softmax=softmax, chunk_size=chunk_size, similarity=self._similarity(),
            perturb=self.perturb_hook(),
        )  # fmt: skip
        return [[float(v) for v in row] for row in curves.double().cpu().tolist()]

    def _similarity(self) -> Callable[[Tensor, Tensor], Tensor] | None:
        """``similarity_func`` called as Quantus calls it, ``f(a=score_changes, b=attribution_sums, batched=True)``."""
        rows = self.similarity_rows()
        return None if rows is None or is_default("SensitivityN", "similarity_func", self.similarity_func) else (
            lambda sums, changes: rows(changes, sums))  # fmt: skip

    def combine(self, scores: Result) -> Result:
        """Per-sample curves to one curve over ``n``: the mean over samples (NaN rows skipped)."""
        return [float(v) for v in np.nanmean(np.array(scores, dtype=float), axis=0)]
