"""Quantus 0.6.0's axiomatic metrics on :mod:`camkit.metrics`."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from camkit import Explainer, metrics
from camkit.errors import InvalidInputError

from ._base import Metric, Result, _as_maps, is_default
from .functions.perturb_func import batch_baseline_replacement_by_indices

__all__ = ["Completeness", "InputInvariance", "NonSensitivity"]


class Completeness(Metric):
    """Quantus's ``Completeness`` on :func:`camkit.metrics.completeness`: one bool per sample.

    Differs from Quantus: Quantus tests ``sum(a) == output_func(f(x) - f(baseline))`` with exact
    float equality, so a complete attribution fails on rounding alone (float32 sums in another
    order). camkit tests ``|gap| <= atol + rtol * |f(x) - f(baseline)|`` (``rtol=1e-5``,
    ``atol=1e-6``; camkit's arguments). ``output_func`` is applied to the score difference, as
    in Quantus. ``perturb_baseline="uniform"`` fills each input with one draw from numpy's global
    generator, as Quantus does.
    """

    softmax_default = False
    takes_predict_kwargs = True
    uniform_order = "whole"  # "uniform": one value per sample for the whole input
    perturb_default = staticmethod(batch_baseline_replacement_by_indices)

    def __init__(
        self, abs: bool = False, normalise: bool = True, output_func: Any = None, perturb_baseline: Any = "black",
        rtol: float = 1e-5, atol: float = 1e-6, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=perturb_baseline, **kwargs)
        self.output_func = output_func
        self.rtol, self.atol = rtol, atol

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        baseline = self.sample_uniform(x) if self.uniform else self.baseline
        perturb = self.perturb_hook()
        if perturb is not None:  # Quantus's baseline input: the function applied to every feature at once
            baseline = perturb(x, torch.arange(x[0].numel(), device=x.device).expand(x.shape[0], -1))
        gap = metrics.completeness(model, x, a, y, baseline=baseline, softmax=softmax, chunk_size=chunk_size)
        total = a.flatten(1).double().sum(dim=1)
        change = total - gap  # f(x) - f(baseline)
        if self.output_func is not None:
            change = torch.as_tensor(self.output_func(change.cpu().numpy()), dtype=torch.float64, device=x.device)
        return [bool(v) for v in torch.isclose(total, change, rtol=self.rtol, atol=self.atol).cpu().tolist()]


class NonSensitivity(Metric):
    """Quantus's ``NonSensitivity`` on :func:`camkit.metrics.non_sensitivity`: one count per sample.

    Equal to Quantus for ``features_in_step=1``; Quantus fails for larger steps (it compares one
    value per step with one per feature), where camkit gives every feature its group's verdict.
    A feature counts as unattributed when ``|a| < eps`` (Quantus: ``a < eps``, the same with its
    default ``abs=True``).
    """

    softmax_default = True
    takes_predict_kwargs = True
    uniform_order = "function"  # "uniform": Quantus's default function draws it, one value per sample and step
    perturb_default = staticmethod(batch_baseline_replacement_by_indices)

    def __init__(
        self, eps: float = 1e-5, features_in_step: int = 1, abs: bool = True, normalise: bool = True,
        perturb_baseline: Any = "black", **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=perturb_baseline, **kwargs)
        self.eps = eps
        self.features_in_step = features_in_step

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        counts = metrics.non_sensitivity(
            model, x, a.expand_as(x), y, eps=self.eps, features_in_step=self.features_in_step, baseline=self.baseline,
            softmax=softmax, chunk_size=chunk_size, perturb=self.perturb_hook(),
        )  # fmt: skip
        return [int(v) for v in counts.tolist()]


class InputInvariance(Metric):
    """Quantus's ``InputInvariance`` on :func:`camkit.metrics.input_invariance`: one bool per sample.

    Differs from Quantus: Quantus copies the model and moves the shift into its first layer's
    bias using one value of that layer's response to the shift, which is wrong wherever the
    layer pads (its border responses differ), so the copy is not the same function and even
    the plain gradient fails. camkit's second model is ``model(x - shift)``, the same function
    exactly. ``explain_func`` must be a function ``f(model=, inputs=, targets=, **kwargs)``
    (a camkit explainer is bound to one model); ``a_batch``, when given, is the first map.

    A ``perturb_func`` other than Quantus's ``baseline_replacement_by_shift`` makes the shifted
    inputs as Quantus makes them: ``perturb_func(arr=x_i, indices=arange(1, F),
    indexed_axes=arange(x_i.ndim), input_shift=..., **perturb_func_kwargs)`` on each input
    ``x_i`` [C, *S] (Quantus's ``perturb_batch`` leaves out the first index); the shift of the
    second model is ``input_shift``, or ``perturb_func_kwargs["input_shift"]`` over it, as Quantus
    reads it from the bound function. With Quantus's own function every value is shifted (Quantus
    leaves the first one as it is).
    """

    softmax_default = False

    def __init__(
        self, abs: bool = False, normalise: bool = False, input_shift: float = -1, atol: float = 1e-4,
        perturb_func: Any = None, perturb_func_kwargs: dict[str, Any] | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(abs=abs, normalise=normalise, perturb_baseline=0.0, **kwargs)
        options = {"input_shift": input_shift, **(perturb_func_kwargs or {})}
        self.input_shift = options["input_shift"]
        self.shift_func = None  # None: every value shifted by input_shift
        if not is_default("InputInvariance", "perturb_func", perturb_func):
            self.shift_func = functools.partial(perturb_func, **options)
        self.atol = atol

    def shifted_inputs(self, x: Tensor) -> Tensor | None:
        """The caller's ``perturb_func`` on each input, called as Quantus's ``perturb_batch`` calls it (None without one)."""
        if self.shift_func is None:
            return None
        arr = (x[:, 0] if getattr(self, "_tabular", False) else x).detach().cpu().numpy().copy()
        indices, axes = np.arange(arr[0].size)[1:], np.arange(arr[0].ndim)
        for i in range(arr.shape[0]):
            arr[i] = self.shift_func(arr=arr[i], indices=indices, indexed_axes=axes)
        return torch.as_tensor(arr, dtype=x.dtype, device=x.device).view_as(x)

    def evaluate(
        self, model: nn.Module, x: Tensor, y: Tensor, a: Tensor, s: Tensor | None, *, softmax: bool, chunk_size: int
    ) -> Result:
        explain_func = self.explain_func
        if explain_func is None or isinstance(explain_func, Explainer):
            raise InvalidInputError(
                "InputInvariance re-explains a shifted model: pass explain_func=f(model=, inputs=, targets=), "
                "e.g. lambda model, inputs, targets: camkit.Saliency(model)(torch.as_tensor(inputs), "
                "torch.as_tensor(targets)).numpy()"
            )

        def explain(net: nn.Module, inputs: Tensor, target: Any) -> Tensor:
            if net is model:
                return a
            out = explain_func(model=net, inputs=inputs.cpu().numpy(), targets=y.cpu().numpy(), **self.explain_func_kwargs)
            return self._preprocess(_as_maps(np.asarray(out), inputs, True))

        values = metrics.input_invariance(
            explain, model, x, y, shift=float(self.input_shift), atol=self.atol, shifted=self.shifted_inputs(x)
        )
        return [bool(v) for v in values.tolist()]
