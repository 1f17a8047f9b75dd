"""Rows laid out as captum lays them for its path and sampling methods, and camkit's gradient at a layer on them.

captum's InternalInfluence, NeuronConductance and LayerGradientShap evaluate the model on many
points per example: the path's points step by step (``[alpha_0 batch, alpha_1 batch, ...]``)
or the noisy draws example by example. The targets and the extra forward arguments go with
them, repeated the same way. The gradients at those points are camkit's
(:class:`camkit.LayerGradientXActivation` without the activation factor, :class:`camkit.Saliency`
of a neuron); nothing is computed here but the layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._pack import as_tuple, forward_args

__all__ = ["layer_gradients", "path_points", "repeat_extra", "repeat_target", "step_sum"]


def repeat_extra(extra: Any, copies: int, interleave: bool = False) -> tuple[Any, ...]:
    """captum's extra forward arguments for ``copies`` copies of the batch: each tensor repeated, the rest as it is.

    Step-major (``cat`` of copies) by default, example-major (``repeat_interleave``) with ``interleave``.
    """
    out = []
    for arg in forward_args(extra):
        if isinstance(arg, Tensor) and arg.dim() > 0:
            arg = arg.repeat_interleave(copies, dim=0) if interleave else torch.cat([arg] * copies)
        out.append(arg)
    return tuple(out)


def repeat_target(target: Any, copies: int, interleave: bool = False) -> Any:
    """captum's target for ``copies`` copies of the batch (a list or a tensor of several repeated, a single one kept)."""
    if isinstance(target, list):
        return [t for t in target for _ in range(copies)] if interleave else target * copies
    if isinstance(target, Tensor) and target.numel() > 1:
        return target.repeat_interleave(copies, dim=0) if interleave else target.repeat(copies)
    return target


def path_points(xs: tuple[Tensor, ...], bases: tuple[Tensor, ...], alphas: Tensor) -> tuple[Tensor, ...]:
    """``b + alpha (x - b)`` for each alpha, step-major: [len(alphas) * B, *s] per input."""
    return tuple(torch.cat([b + float(a) * (x - b) for a in alphas]) for x, b in zip(xs, bases))


def step_sum(parts: tuple[Tensor, ...], weights: Tensor, batch: int) -> tuple[Tensor, ...]:
    """Step-major rows [steps * B, ...] weighted by ``weights`` [steps] and summed over the steps: [B, ...]."""
    out = []
    for part in parts:
        steps = part.reshape(-1, batch, *part.shape[1:])
        w = weights.to(device=part.device, dtype=part.dtype).view(-1, *([1] * (steps.dim() - 1)))
        out.append((steps * w).sum(dim=0))
    return tuple(out)


def layer_gradients(method: Any, points: tuple[Tensor, ...], target: Any, extra: Any,
                    to_input: bool) -> tuple[tuple[Tensor, ...], bool]:
    """camkit's gradient of the target score at ``method.layer`` on each row: ``(tensors, several)``."""
    from ._layer import LayerGradientXActivation

    found = LayerGradientXActivation(method.forward_func, method.layer, multiply_by_inputs=False).attribute(
        points, target, extra, attribute_to_layer_input=to_input)
    return as_tuple(found), isinstance(found, tuple)


def chunked_steps(steps: int, batch: int, internal_batch_size: int | None) -> list[range]:
    """The steps in groups of at most ``internal_batch_size // batch`` (captum's ``internal_batch_size``)."""
    per = steps if not internal_batch_size else max(1, internal_batch_size // batch)
    return [range(s, min(s + per, steps)) for s in range(0, steps, per)]


def on_path(run: Callable[[tuple[Tensor, ...], Any, Any, Tensor], tuple[Tensor, ...]], xs: tuple[Tensor, ...],
            bases: tuple[Tensor, ...], target: Any, extra: Any, alphas: Tensor, weights: Tensor,
            internal_batch_size: int | None) -> tuple[Tensor, ...]:
    """``sum_i w_i run(points_i)`` over the path's steps, ``internal_batch_size`` rows at a time.

    ``run(points, target, extra, weights)`` gets a group of steps' points (step-major), their
    target and extra arguments, and returns the weighted sum over that group's steps.
    """
    batch = xs[0].shape[0]
    total: tuple[Tensor, ...] | None = None
    for group in chunked_steps(len(alphas), batch, internal_batch_size):
        points = path_points(xs, bases, alphas[group.start : group.stop])
        part = run(points, repeat_target(target, len(group)), repeat_extra(extra, len(group)),
                   weights[group.start : group.stop])
        total = part if total is None else tuple(t + p for t, p in zip(total, part))
    assert total is not None
    return total
