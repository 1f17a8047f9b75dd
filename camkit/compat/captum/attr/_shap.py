"""captum's ``GradientShap`` on :class:`camkit.GradientShap`, on the random draws captum makes, in captum's order.

captum computes GradientShap (and LayerGradientShap) as its NoiseTunnel around a one-draw method,
and draws, for ``B`` examples and ``n`` samples, ``B * n`` rows example by example:

1. per input tensor, the rows' baselines: ``numpy.random.choice(N, B * n)`` from numpy's global
   generator (one draw per input, so the inputs of a tuple take independent rows);
2. per input tensor, the noise: ``torch.normal(0, stdev)`` of the repeated input's shape from torch's
   global generator, in float32, drawn also when the standard deviation is 0;
3. the rows' points on the path: ``numpy.random.uniform(0, 1, B * n)``.

:func:`captum_draws` draws the same numbers in the same order, so a call after the same seeds
gets captum's draws and leaves both generators where captum leaves them. The attribution on
those draws is camkit's: :class:`camkit.GradientShap` with the draws given (one example at a
time), or camkit's layer gradients for LayerGradientShap.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .... import methods as km
from ....methods import Explainer
from .._pack import CaptumInputError, Layout, as_tuple, fit_to
from ._base import Build, NotComputedError, gathered
from ._gradient import _WithDelta

__all__ = ["GradientShap", "ShapDraws", "baseline_distribution", "captum_draws", "on_draws", "path_alpha"]


@dataclass(frozen=True)
class ShapDraws:
    """captum's draws for ``B`` examples and ``n`` samples, example-major rows [B * n, *s_i] per input."""

    starts: tuple[Tensor, ...]  # the baselines drawn for each row
    noise: tuple[Tensor, ...]  # the noise added to each row's copy of its example
    ends: tuple[Tensor, ...]  # each row's noisy copy of its example (input + noise)
    alpha: Tensor  # [B * n] each row's point on the path from its baseline to its noisy copy


def baseline_distribution(baselines: Any, inputs: Any) -> tuple[Tensor | float, ...]:
    """captum's baseline distribution per input: a tensor [N_i, *s_i] (or a number), a callable called first.

    A callable is called with the inputs as given (or with nothing when it takes no argument).
    """
    xs = as_tuple(inputs)
    if callable(baselines) and not isinstance(baselines, Tensor):
        baselines = baselines() if not inspect.signature(baselines).parameters else baselines(inputs)
    items = as_tuple(baselines)
    if len(items) != len(xs) or not isinstance(items[0], Tensor):
        raise CaptumInputError("Baselines distribution has to be provided in a form of a torch.Tensor: one tensor "
                               f"[N, ...] per input ({len(xs)}), got {[type(b).__name__ for b in items]}")
    for b, x in zip(items, xs):
        if isinstance(b, Tensor) and tuple(b.shape[1:]) != tuple(x.shape[1:]):
            raise CaptumInputError(f"a baseline distribution [N, *s] needs the input's example shape {list(x.shape[1:])}, "
                                   f"got {list(b.shape)}")
        if not isinstance(b, (Tensor, int, float)):
            raise CaptumInputError(f"a baseline is a tensor or a number, got {type(b).__name__}")
    return tuple(b if isinstance(b, Tensor) else float(b) for b in items)


def path_alpha(rows: int, like: Tensor) -> Tensor:
    """captum's points on the path: ``numpy.random.uniform(0, 1, rows)`` in ``like``'s dtype and device."""
    return torch.tensor(np.random.uniform(0.0, 1.0, rows), dtype=like.dtype, device=like.device)


def captum_draws(xs: tuple[Tensor, ...], bases: tuple[Tensor | float, ...], n_samples: int,
                 stdevs: float | tuple[float, ...]) -> ShapDraws:
    """captum's baselines, noise and path points for ``n_samples`` rows per example, drawn in captum's order."""
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise CaptumInputError(f"n_samples must be a positive int, got {n_samples!r}")
    spreads = stdevs if isinstance(stdevs, tuple) else (stdevs,) * len(xs)
    if len(spreads) != len(xs):
        raise CaptumInputError(f"The number of input tensors in {len(xs)} must be equal to the number of stdevs "
                               f"values {len(spreads)}")
    rows = xs[0].shape[0] * n_samples
    starts = tuple(_rows_of(b, x, rows) for b, x in zip(bases, xs))
    noise = tuple(torch.normal(0.0, torch.full((rows, *x.shape[1:]), float(s), device=x.device))
                  for x, s in zip(xs, spreads))
    ends = tuple(x.detach().repeat_interleave(n_samples, dim=0) + z for x, z in zip(xs, noise))
    return ShapDraws(starts, noise, ends, path_alpha(rows, xs[0]))


def _rows_of(base: Tensor | float, x: Tensor, rows: int) -> Tensor:
    if isinstance(base, Tensor):
        picked = np.random.choice(base.shape[0], rows).tolist()
        return base.detach()[picked].to(device=x.device, dtype=x.dtype)
    return torch.full((rows, *x.shape[1:]), base, dtype=x.dtype, device=x.device)


class _GivenDraws(km.GradientShap):
    """camkit's GradientShap on draws made beforehand (captum's, for one example) instead of its own."""

    def __init__(self, model: nn.Module, starts: Tensor, alpha: Tensor, noise: Tensor, noisy: bool,
                 **options: Any) -> None:
        super().__init__(model, baselines=starts, samples=len(alpha), stdev=1.0 if noisy else 0.0, seed=0, **options)
        self.given = (torch.arange(len(alpha)), alpha, noise)

    def draws(self, x: Tensor, seed: int) -> tuple[Tensor, Tensor, Tensor]:
        index, alpha, noise = self.given
        return index.to(x.device), alpha.to(x.device, x.dtype), noise.to(x.device, x.dtype)


def _padded(noise: Tensor, x: Tensor) -> Tensor:
    """Packed noise [n, ...] with zeros for the values after the inputs' in ``x`` (an anchor the model never sees)."""
    extra = x.shape[-1] - noise.shape[-1]
    if extra <= 0 or x.dim() != 5:
        return noise
    return torch.cat([noise, noise.new_zeros((*noise.shape[:-1], extra))], dim=-1)


def on_draws(drawn: ShapDraws, n_samples: int, stdevs: float | tuple[float, ...], **options: Any) -> Build:
    """The builder of camkit's GradientShap on one example's rows of ``drawn`` (``example`` counts from 0)."""
    noisy = any(float(s) != 0 for s in (stdevs if isinstance(stdevs, tuple) else (stdevs,)))

    def build(model: nn.Module, layout: Layout, x: Tensor, example: int) -> Explainer:
        rows = slice(example * n_samples, (example + 1) * n_samples)
        starts = fit_to(layout.pack(tuple(s[rows] for s in drawn.starts)), x)
        noise = _padded(layout.pack(tuple(z[rows] for z in drawn.noise)), x)
        return _GivenDraws(model, starts, drawn.alpha[rows], noise, noisy, **options)

    return build


class GradientShap(_WithDelta):
    """captum's ``GradientShap`` on :class:`camkit.GradientShap`, on captum's draws (see the module).

    After the same ``numpy.random.seed`` and ``torch.manual_seed``, a call returns captum's
    attribution and convergence deltas (one per example and sample, example-major).
    """

    delta_key = "draw_gaps"

    def __init__(self, forward_func: Callable[..., Any], multiply_by_inputs: bool = True) -> None:
        super().__init__(forward_func)
        self._multiply = multiply_by_inputs

    def attribute(self, inputs: Any, baselines: Any, n_samples: int = 5, stdevs: float | tuple[float, ...] = 0.0,
                  target: Any = None, additional_forward_args: Any = None,
                  return_convergence_delta: bool = False) -> Any:
        if return_convergence_delta and not self._multiply:
            raise NotComputedError("GradientShap(multiply_by_inputs=False) with return_convergence_delta=True: camkit's "
                                   "per-draw gaps measure the multiplied attribution")
        xs = as_tuple(inputs)
        Layout.of(xs)  # inputs checked before anything is drawn
        drawn = captum_draws(xs, baseline_distribution(baselines, inputs), n_samples, stdevs)
        build = on_draws(drawn, n_samples, stdevs, multiply_by_inputs=self._multiply, draw_gaps=return_convergence_delta)
        raw, explanations = self._run(inputs, target, additional_forward_args, build, one_by_one=True)
        if not return_convergence_delta:
            return raw
        return raw, gathered(explanations, self.delta_key, (raw[0] if isinstance(raw, tuple) else raw).dtype)
