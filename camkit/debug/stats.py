"""The statistics the training monitors record: of one layer output, of one gradient.

Each is a batched reduction on the tensor's own device, returned as one vector, so a monitor
moves a whole step's values to the CPU at once.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._internal import syncs as _syncs

__all__ = ["activation_stats", "gradient_stats", "std_mean"]


def std_mean(t: Tensor) -> tuple[Tensor, Tensor]:
    """``torch.std_mean(t, correction=0)`` from reductions that vectorise.

    On the CPU ``std_mean`` (and ``count_nonzero``) run about 10x slower than a mean and a norm
    over the same tensor (resnet50's block outputs, measured); two passes also avoid the
    cancellation of the one-pass formula.
    """
    mean = t.mean()
    if t.numel() == 0:
        return mean, mean
    return torch.linalg.vector_norm(t - mean) / math.sqrt(t.numel()), mean


def activation_stats(y: Tensor, kind: str | None = None, eps: float = 0.01) -> Tensor:
    """The :class:`ActivationMonitor` statistics of one tensor, as a vector on its device.

    Args:
        y: any floating tensor; dim 1 is the unit (channel) dim for ``dead``.
        kind: ``"sigmoid"``, ``"tanh"`` or ``None`` (saturation NaN).
        eps: saturation margin.

    Returns:
        [7] tensor: mean, std, min, max, zeros, dead, saturation.

    Example:
        >>> import torch
        >>> from camkit.debug import activation_stats
        >>> [round(v, 4) for v in activation_stats(torch.tensor([[0.0, 2.0], [0.0, 4.0]])).tolist()[:6]]
        [1.5, 1.6583, 0.0, 4.0, 0.5, 0.5]
    """
    y = y if y.dtype == torch.float64 else y.float()
    count = max(y.numel(), 1)
    nan = torch.full((), math.nan, dtype=y.dtype, device=y.device)
    std, mean = std_mean(y)
    if _syncs.reads_are_free(mean) and not math.isnan(float(mean)):
        nonzero = y.sign().abs_().sum()  # |sign| is 1 off zero (sign(NaN) is 0: hence the check)
    else:
        nonzero = torch.count_nonzero(y).to(y.dtype)
    zeros = 1 - nonzero / count
    if y.dim() >= 2 and y.numel() > 0:
        # per unit (dim 1) minimum and maximum, reduced in place of the tensor: the global ones,
        # and the dead units (only zeros: minimum and maximum both 0)
        others = (0, *range(2, y.dim()))
        low, high = y.amin(dim=others), y.amax(dim=others)
        lo, hi = low.min(), high.max()
        dead = ((low == 0) & (high == 0)).sum() / low.numel()
    else:
        lo, hi = torch.aminmax(y)
        dead = nan
    if kind == "sigmoid":
        saturation = ((y < eps) | (y > 1 - eps)).sum() / y.numel()
    elif kind == "tanh":
        saturation = (y.abs() > 1 - eps).sum() / y.numel()
    else:
        saturation = nan
    return torch.stack([mean, std, lo, hi, zeros.to(y.dtype), dead.to(y.dtype), saturation.to(y.dtype)])


def gradient_stats(grad: Tensor, vanishing_below: float, exploding_above: float) -> Tensor:
    """The :class:`~camkit.debug.GradientMonitor` statistics of one gradient, as a vector on its device.

    Args:
        grad: the gradient reaching a layer's output (float64 stays float64, others become float32).
        vanishing_below, exploding_above: flag thresholds on the norm.

    Returns:
        [7] tensor: norm, mean, std, max_abs, param_norm (NaN: filled in per step by the
        monitor), vanishing, exploding.

    Example:
        >>> import torch
        >>> from camkit.debug.stats import gradient_stats
        >>> [round(v, 4) for v in gradient_stats(torch.tensor([3.0, -4.0]), 1e-6, 1e3).tolist()]
        [5.0, -0.5, 3.5, 4.0, nan, 0.0, 0.0]
    """
    g = grad if grad.dtype == torch.float64 else grad.float()
    norm = torch.linalg.vector_norm(g)
    std, mean = std_mean(g)
    low, high = torch.aminmax(g)
    nan = torch.full((), math.nan, dtype=g.dtype, device=g.device)
    return torch.stack(
        [
            norm,
            mean,
            std,
            torch.maximum(-low, high),  # max |g| without a copy of |g|
            nan,
            (norm < vanishing_below).to(g.dtype),
            ((norm > exploding_above) | ~torch.isfinite(norm)).to(g.dtype),
        ]
    )
