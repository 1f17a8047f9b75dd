"""DeepLift's Rescale rule for max-pooling of any rank (1-D, 2-D, 3-D); private to :mod:`camkit.methods.attribution.deeplift`.

Also :func:`where_still`, the "input did not move" fallback that the activation rule shares.
A max-pooling call ``F.max_pool1d/2d/3d`` (every ``nn.MaxPool*d`` module calls one) is run with
its indices; the change of each window's output from the reference's is routed to the input
positions that were the window's maximum on the image and on the reference. Indices of
``max_pool{n}d`` are flat over the n spatial axes of each channel, so one scatter serves
every rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._internal import syncs as _syncs

__all__ = ["RescaleMaxPool", "max_pool_call", "max_pool_name", "pool", "where_still"]

_POOLS = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_NAMES = {f"max_pool{n}d": n for n in _POOLS}


def where_still(values: Tensor, change: Tensor, eps: float, fill: Tensor | float | Callable[[], Tensor]) -> Tensor:
    """``values`` with ``fill`` where the input change ``|change| < eps`` (in place on both).

    ``change`` becomes its absolute value. On the CPU one reduction decides first whether any
    entry is that small, which is rare: the mask and its pass are then skipped altogether.
    """
    magnitude = change.abs_()
    if _syncs.reads_are_free(magnitude) and (magnitude.numel() == 0 or float(magnitude.amin()) >= eps):
        return values  # the common case: every input moved from its reference
    still = magnitude < eps
    if callable(fill):
        fill = fill()
    if isinstance(fill, Tensor):
        return torch.where(still, fill, values, out=values)
    return values.masked_fill_(still, fill)


_POOL_ARGS = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")


def max_pool_call(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The arguments of a batched 1-D, 2-D or 3-D max-pooling call without indices, or ``None`` when ``func`` is none.

    The call's rank must be its input's: ``max_pool{n}d`` on a batch [B, C, *S] of n spatial
    axes (an unbatched call gets no rule, and is warned about as one without).
    """
    rank = _NAMES.get(getattr(func, "__name__", "").lstrip("_"))
    if rank is None or len(args) > len(_POOL_ARGS):
        return None
    call = dict(zip(_POOL_ARGS, args), **kwargs)
    x = call.get("input")
    if call.pop("return_indices", False) or not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() != rank + 2:
        return None
    return call


def max_pool_name(x: Tensor) -> str:
    """The name recorded for a max-pooling call on the batch ``x``: ``"max_pool3d"`` for a volume."""
    return f"max_pool{x.dim() - 2}d"


def pool(x: Tensor, call: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """``(values, indices)`` of the max-pooling ``call`` applied to ``x`` [B, C, *S] (its rank's pooling)."""
    params = {k: v for k, v in call.items() if k != "input"}
    values, index = _POOLS[x.dim() - 2](x, **params, return_indices=True)
    return values, index


def _unpool_add(out: Tensor, values: Tensor, index: Tensor) -> Tensor:
    """Add pooled ``values`` [B, C, *s] into ``out`` [B, C, prod(S)] at the flat positions ``index``."""
    return out.scatter_add_(2, index.expand_as(values).flatten(2), values.flatten(2))


def _at(t: Tensor, index: Tensor) -> Tensor:
    """The entries of ``t`` [1 or B, C, *S] at the flat positions ``index`` [B, C, *s]."""
    flat = t.flatten(2).expand(index.shape[0], -1, -1)
    return flat.gather(2, index.flatten(2)).view(index.shape)


class RescaleMaxPool(torch.autograd.Function):
    """DeepLift's rule for max-pooling: the output change, split between the image's and the reference's maxima.

    At an input position ``i`` the multiplier is ``(sum of g * max(y - y0, 0) over the windows
    whose image maximum is i + sum of g * min(y - y0, 0) over those whose reference maximum is
    i) / (x_i - x0_i)``, and the plain gradient where ``|x_i - x0_i| < eps`` (captum's rule).
    Only window maxima receive anything, so each window's share is divided by the input change
    *at its maximum* before it is scattered: every pass but the final scatter runs at the
    pooled size, not the input's.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, ref: Tensor, ref_pool: tuple[Tensor, Tensor], call: dict[str, Any], eps: float) -> Tensor:
        y, index = pool(x, call)
        y0, index0 = ref_pool
        index0 = index0.expand_as(index)
        at_image = _at(ref, index)
        torch.sub(y, at_image, out=at_image)  # x - x0 at each window's image maximum
        at_reference = _at(x, index0).sub_(y0)  # ... and at its reference maximum
        fall = torch.sub(y, y0)
        # the image's maxima: the rise over their input change, or 1 (the plain gradient) where it did not move;
        # the reference's maxima: the fall over their input change, nothing where it did not move
        image_share = where_still(fall.clamp_min(0).div_(at_image), at_image, eps, 1.0)
        reference_share = where_still(fall.clamp_max_(0).div_(at_reference), at_reference, eps, 0.0)
        ctx.save_for_backward(image_share, reference_share, index, index0)
        ctx.input_shape = x.shape
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
        image_share, reference_share, index, index0 = ctx.saved_tensors
        batch, channels, *spatial = ctx.input_shape
        flat = grad.new_zeros(batch, channels, math.prod(spatial))
        _unpool_add(flat, grad * image_share, index)
        _unpool_add(flat, grad * reference_share, index0)
        return flat.view(ctx.input_shape), None, None, None, None
