"""Painting per-unit scores into their boxes on an image's pixel grid.

A vision-language model reads an image as units (its language model's image tokens, or the rows
of a vision feature layer), each covering a box of the original image. A map is made by adding
each unit's score to the pixels its box covers: a pixel is covered by a box ``(y0, x0, y1, x1)``
when its centre ``(i + 0.5, j + 0.5)`` lies in ``[y0, y1) x [x0, x1)``. Within one view (the whole
image, or one tile or crop) the boxes do not overlap, so each pixel receives the unit of each
view that covers it, summed over the views (a LLaVA-NeXT pixel gets its base-image unit plus
its tile's unit). Boxes with a NaN (a newline token that covers no pixel) paint nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import InvalidInputError

__all__ = ["paint"]


def _edges(low: Tensor, high: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """The first and one-past-last pixel whose centre lies in ``[low, high)``, clipped to ``[0, size]``."""
    first = torch.ceil(low - 0.5).clamp(0, size).long()
    stop = torch.ceil(high - 0.5).clamp(0, size).long()
    return first, stop


def paint(scores: Tensor, boxes: Tensor, size: Sequence[int]) -> Tensor:
    """Paint unit scores [T, U] into their boxes [U, 4] on an ``(H, W)`` grid: maps [T, H, W].

    Every rectangle is added through a summed-area table (four corner updates per unit, then two
    cumulative sums, in float64), so the cost is ``T * (U + H * W)`` whatever the boxes' sizes.

    Args:
        scores: [T, U] one score per unit for each of T targets (or [U] for one target).
        boxes: [U, 4] float ``(y0, x0, y1, x1)`` in the image's pixels; NaN rows paint nothing.
        size: ``(H, W)`` of the image.

    Returns:
        float32 [T, H, W] (or [H, W] for [U] scores) on the scores' device.

    Example:
        >>> import torch
        >>> from camkit.vlm.paint import paint
        >>> boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 2.0, 2.0, 4.0], [0.0, 0.0, 2.0, 4.0],
        ...                       [float("nan")] * 4])  # two halves, a whole-image view, a newline
        >>> paint(torch.tensor([1.0, 2.0, 10.0, 99.0]), boxes, (2, 4))
        tensor([[11., 11., 12., 12.],
                [11., 11., 12., 12.]])
    """
    single = scores.dim() == 1
    scores = scores[None] if single else scores
    if scores.dim() != 2 or boxes.dim() != 2 or boxes.shape[-1] != 4 or boxes.shape[0] != scores.shape[1]:
        raise InvalidInputError(
            f"paint needs scores [T, U] and boxes [U, 4], got {list(scores.shape)} and {list(boxes.shape)}"
        )
    height, width = (int(s) for s in size)
    wide = torch.float32 if scores.device.type == "mps" else torch.float64
    keep = ~boxes.isnan().any(dim=1)
    box = boxes[keep].to(scores.device, wide)
    value = scores[:, keep].to(wide)
    r0, r1 = _edges(box[:, 0], box[:, 2], height)
    c0, c1 = _edges(box[:, 1], box[:, 3], width)
    table = torch.zeros(scores.shape[0], (height + 1) * (width + 1), dtype=wide, device=scores.device)
    for rows, cols, sign in ((r0, c0, 1.0), (r0, c1, -1.0), (r1, c0, -1.0), (r1, c1, 1.0)):
        table.index_add_(1, rows * (width + 1) + cols, value * sign)
    maps = table.view(-1, height + 1, width + 1).cumsum(1).cumsum(2)[:, :height, :width]
    maps = maps.float()
    return maps[0] if single else maps
