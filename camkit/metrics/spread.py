"""How a map's energy is spread: its share in the top positions and in the outer frame, at any rank.

:func:`spread_and_border` reads maps [B, *S] (a signal's [B, T], an image's [B, H, W], a volume's
or video's [B, D, H, W]) and needs no model: the audit writes its two values as ``spread`` and
``border`` for images, volumes and videos alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["spread_and_border"]

_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)


def spread_and_border(
    maps: Tensor, top: float = 0.1, frame: float = 0.1, border_axes: Sequence[int] | None = None
) -> tuple[Tensor, Tensor]:
    """Per map [B, *S] (non-negative): the energy share of its top ``top`` positions, and of its outer frame.

    The top share counts the ``ceil(top * N)`` largest of the ``N = S1 * S2 * ...`` positions,
    ``top * N`` rounded to 9 decimals first so that float noise adds no position (10% of 3 x 50
    positions is 15, where ``0.1 * 3 * 50`` computes to 15.000000000000002). The frame is
    ``max(1, round(frame * m))`` positions thick on each side of each axis in ``border_axes``,
    where ``m`` is the smallest of those axes' sizes; the other axes (a video's time) are not
    framed. Both are computed in the maps' dtype (float32 for integer maps). A map summing to
    zero (or to NaN) gives NaN for both.

    Args:
        maps: non-negative maps [B, *S], any number of spatial axes.
        top: the fraction of positions whose share is ``spread``.
        frame: the frame's thickness as a fraction of the smallest framed side.
        border_axes: the axes of ``maps`` (1 to ``maps.dim() - 1``, or negative) that get a
            frame; ``None``: every spatial axis.

    Returns:
        ``(spread, border)``: two tensors [B] in [0, 1] (or NaN), on the maps' device.

    Example:
        >>> import torch
        >>> from camkit.metrics import spread_and_border
        >>> maps = torch.zeros(1, 10, 10, 10); maps[0, 5, 5, 5] = 3.0; maps[0, 0, 5, 5] = 1.0
        >>> [float(v) for v in spread_and_border(maps)]  # every axis framed: the voxel at depth 0 is on the border
        [1.0, 0.25]
        >>> [float(v) for v in spread_and_border(maps, border_axes=(-2, -1))]  # a video's frames: no time border
        [1.0, 0.0]
    """
    _batch, *spatial = maps.shape
    if not maps.is_floating_point():
        maps = maps.to(torch.get_default_dtype())
    axes = range(1, maps.dim()) if border_axes is None else [a % maps.dim() for a in border_axes]
    flat = maps.flatten(1)
    total = flat.sum(dim=1)
    k = max(1, math.ceil(round(top * math.prod(spatial), 9)))
    share = _top_sum(flat, k)
    edge = max(1, round(frame * min(maps.shape[a] for a in axes))) if axes else 0
    inner = maps
    for axis in axes:
        inner = inner.narrow(axis, edge, max(0, maps.shape[axis] - 2 * edge))
    border = total - inner.flatten(1).sum(dim=1)
    nan = torch.full_like(total, float("nan"))
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return torch.where(total > 0, share / safe, nan), torch.where(total > 0, border / safe, nan)


def _top_sum(flat: Tensor, k: int) -> Tensor:
    """Per row of ``flat`` [B, N], the sum of its ``k`` largest values, in ``flat``'s dtype.

    On the CPU numpy's selection (``np.partition``) is about 8x faster than ``Tensor.topk``
    for the 10% of a 224x224 map (1.1 ms against 8.5 ms per batch of 32, one thread); the
    sums agree to rounding. Other devices use ``topk`` (no host transfer).
    """
    if flat.device.type != "cpu" or flat.shape[1] == 0 or flat.dtype not in _NUMPY_FLOATS:
        return flat.topk(k, dim=1, sorted=False).values.sum(dim=1)
    values = flat.detach().numpy()
    cut = values.shape[1] - k
    return torch.from_numpy(np.partition(values, cut, axis=1)[:, cut:].sum(axis=1, dtype=values.dtype))
