"""Localisation measures: the pointing game (Zhang et al. 2016) and its energy-based
variant (Wang et al. 2020, Score-CAM).

Regions are given either as boxes or as masks:

* boxes: a tensor [B, 4] of ``(x0, y0, x1, y1)`` in pixels, **x1 and y1 exclusive** (as
  slice bounds: the box ``(0, 0, 2, 1)`` covers the pixels in row 0, columns 0 and 1).
  Pixel ``(row i, column j)`` is inside when ``x0 <= j < x1`` and ``y0 <= i < y1``;
  fractional or out-of-image coordinates act as such thresholds. An empty box contains
  nothing.
* masks: a bool tensor [B, H, W], True inside the region.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InvalidInputError
from ._common import check_maps, nan_maps

__all__ = ["energy_pointing_game", "pointing_game", "region_masks"]


def region_masks(regions: Tensor, maps: Tensor) -> Tensor:
    """Bool masks [B, H, W] of ``regions`` (boxes [B, 4] or masks [B, H, W]) on the maps' grid.

    Example:
        >>> import torch
        >>> from camkit.metrics import region_masks
        >>> region_masks(torch.tensor([[1, 0, 3, 1]]), torch.zeros(1, 2, 3)).int().tolist()
        [[[0, 1, 1], [0, 0, 0]]]
    """
    batch, height, width = maps.shape
    if not isinstance(regions, Tensor):
        raise InvalidInputError(
            f"regions must be a tensor: boxes [B, 4] or bool masks [B, H, W], got {type(regions).__name__}"
        )
    regions = regions.to(maps.device)
    if regions.dim() == 3:
        if regions.dtype != torch.bool:
            raise InvalidInputError(
                f"region masks must be bool [B, H, W], got dtype {regions.dtype}; convert with regions > 0.5"
            )
        if tuple(regions.shape) != (batch, height, width):
            raise InvalidInputError(
                f"region masks have shape {list(regions.shape)}, expected the maps' [{batch}, {height}, {width}]"
            )
        return regions
    if regions.dim() == 2 and regions.shape == (batch, 4):
        if regions.dtype == torch.bool or regions.is_complex():
            raise InvalidInputError(f"boxes must hold pixel coordinates, got dtype {regions.dtype}")
        box = regions.to(torch.float64 if regions.dtype == torch.float64 else torch.float32)
        rows = torch.arange(height, device=maps.device, dtype=box.dtype)
        cols = torch.arange(width, device=maps.device, dtype=box.dtype)
        x0, y0, x1, y1 = (box[:, i, None] for i in range(4))
        in_rows = (rows >= y0) & (rows < y1)  # [B, H]
        in_cols = (cols >= x0) & (cols < x1)  # [B, W]
        return in_rows[:, :, None] & in_cols[:, None, :]
    hint = " (one box per image: add a batch dimension with boxes[None])" if regions.dim() == 1 else ""
    raise InvalidInputError(
        f"regions must be boxes [B, 4] (x0, y0, x1, y1 in pixels) or bool masks [B, H, W] with B={batch}, "
        f"got shape {list(regions.shape)}{hint}"
    )


def _dilate(masks: Tensor, radius: int) -> Tensor:
    """Masks grown by every pixel within Euclidean distance ``radius`` of them."""
    offsets = torch.arange(-radius, radius + 1, device=masks.device, dtype=torch.float32)
    disk = (offsets[:, None] ** 2 + offsets[None, :] ** 2) <= radius**2
    grown = F.conv2d(masks[:, None].float(), disk.float()[None, None], padding=radius)
    return grown[:, 0] > 0.5


def pointing_game(maps: Tensor, regions: Tensor, tolerance: int = 0) -> Tensor:
    """Hit or miss per image: does the map's maximum fall inside the region?

    The maximum is the first pixel of largest value in row-major order (ties go to the
    top-left one, as ``argmax`` does). With ``tolerance = t > 0`` a hit is a maximum within
    Euclidean distance ``t`` pixels of the region (Zhang et al. use 15 px at 224x224).
    A map holding NaN is a miss, and so is an empty region; to leave NaN maps out of a
    score, drop them with ``~torch.isnan(maps).flatten(1).any(1)``.

    Args:
        maps: saliency maps [B, H, W].
        regions: boxes [B, 4] (``x0, y0, x1, y1``, x1/y1 exclusive) or bool masks [B, H, W];
            see the module docstring.
        tolerance: distance in pixels, an int >= 0.

    Returns:
        Bool tensor [B] on the maps' device.

    Example:
        >>> import torch
        >>> from camkit.metrics import pointing_game
        >>> maps = torch.zeros(2, 4, 4); maps[:, 0, 3] = 1.0
        >>> boxes = torch.tensor([[2, 0, 4, 2], [0, 0, 2, 2]])
        >>> pointing_game(maps, boxes).tolist(), pointing_game(maps, boxes, tolerance=2).tolist()
        ([True, False], [True, True])
    """
    maps = check_maps(maps)
    if isinstance(tolerance, bool) or not isinstance(tolerance, int) or tolerance < 0:
        raise InvalidInputError(f"tolerance must be an int number of pixels >= 0, got {tolerance!r}")
    masks = region_masks(regions, maps)
    if tolerance > 0:
        masks = _dilate(masks, tolerance)
    flat_masks = masks.flatten(1)
    peak = torch.nan_to_num(maps.flatten(1), nan=-math.inf).argmax(dim=1)
    hit = flat_masks.gather(1, peak[:, None])[:, 0]
    return hit & ~nan_maps(maps)


def energy_pointing_game(maps: Tensor, regions: Tensor) -> Tensor:
    """Share of each map's energy inside its region (Wang et al. 2020).

    ``sum(map inside) / sum(map)`` per image, for non-negative maps (camkit's maps are in
    [0, 1]). A map that sums to zero, or holds NaN, gives NaN; an empty region gives 0.

    Args:
        maps: non-negative saliency maps [B, H, W].
        regions: boxes [B, 4] (``x0, y0, x1, y1``, x1/y1 exclusive) or bool masks [B, H, W].

    Returns:
        Float tensor [B] in [0, 1] (or NaN) on the maps' device.

    Example:
        >>> import torch
        >>> from camkit.metrics import energy_pointing_game
        >>> maps = torch.tensor([[[1.0, 3.0], [0.0, 0.0]]])
        >>> energy_pointing_game(maps, torch.tensor([[1, 0, 2, 2]]))
        tensor([0.7500])
    """
    maps = check_maps(maps)
    masks = region_masks(regions, maps)
    total = maps.flatten(1).sum(dim=1)
    inside = (maps * masks).flatten(1).sum(dim=1)
    share = inside / torch.where(total == 0, torch.ones_like(total), total)
    return torch.where(total == 0, torch.full_like(share, float("nan")), share)
