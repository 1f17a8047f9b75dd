"""Localisation measures: the pointing game (Zhang et al. 2016) and its energy-based
variant (Wang et al. 2020, Score-CAM), on signals, images and volumes.

Maps are [B, T], [B, H, W] or [B, D, H, W]. Regions are given either as masks or, on
images, as boxes:

* masks: a bool tensor shaped like the maps ([B, T], [B, H, W], [B, D, H, W]), or with a
  channel axis of one ([B, 1, *S], as segmentation labels often come), True inside the
  region. A mask of another rank (an image's [B, H, W] for volume maps) is refused.
* boxes, images only: a tensor [B, 4] of ``(x0, y0, x1, y1)`` in pixels, **x1 and y1
  exclusive** (as slice bounds: the box ``(0, 0, 2, 1)`` covers the pixels in row 0,
  columns 0 and 1). Pixel ``(row i, column j)`` is inside when ``x0 <= j < x1`` and
  ``y0 <= i < y1``; fractional or out-of-image coordinates act as such thresholds. An
  empty box contains nothing. For a signal's interval or a volume's box, build the mask
  with slices: ``m = torch.zeros(B, D, H, W, dtype=torch.bool); m[:, z0:z1, y0:y1, x0:x1] = True``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..errors import InvalidInputError
from ._common import MAP_SHAPES, check_maps, nan_maps

__all__ = ["energy_pointing_game", "energy_score", "pointing_game", "pointing_score", "region_masks"]

_KINDS = {2: "signals", 3: "images", 4: "volumes or videos"}


def _box_masks(regions: Tensor, maps: Tensor) -> Tensor:
    """Bool masks [B, H, W] of boxes [B, 4] on image maps [B, H, W]."""
    if regions.dtype == torch.bool or regions.is_complex():
        raise InvalidInputError(f"boxes must hold pixel coordinates, got dtype {regions.dtype}")
    _, height, width = maps.shape
    box = regions.to(torch.float64 if regions.dtype == torch.float64 else torch.float32)
    rows = torch.arange(height, device=maps.device, dtype=box.dtype)
    cols = torch.arange(width, device=maps.device, dtype=box.dtype)
    x0, y0, x1, y1 = (box[:, i, None] for i in range(4))
    in_rows = (rows >= y0) & (rows < y1)  # [B, H]
    in_cols = (cols >= x0) & (cols < x1)  # [B, W]
    return in_rows[:, :, None] & in_cols[:, None, :]


def region_masks(regions: Tensor, maps: Tensor) -> Tensor:
    """Bool masks [B, *S] of ``regions`` on the maps' grid.

    ``regions`` are masks [B, *S] or [B, 1, *S] (bool), or on image maps boxes [B, 4];
    see the module docstring.

    Example:
        >>> import torch
        >>> from camkit.metrics import region_masks
        >>> region_masks(torch.tensor([[1, 0, 3, 1]]), torch.zeros(1, 2, 3)).int().tolist()
        [[[0, 1, 1], [0, 0, 0]]]
        >>> volume = torch.zeros(1, 1, 2, 2, 2, dtype=torch.bool); volume[..., 1, :, :] = True
        >>> region_masks(volume, torch.zeros(1, 2, 2, 2)).shape  # [B, 1, D, H, W] masks lose the channel axis
        torch.Size([1, 2, 2, 2])
    """
    batch, *spatial = maps.shape
    rank = maps.dim()
    expected = [batch, *spatial]
    if not isinstance(regions, Tensor):
        what = "boxes [B, 4] or bool masks [B, H, W]" if rank == 3 else f"bool masks {MAP_SHAPES[rank]}"
        raise InvalidInputError(f"regions must be a tensor: {what}, got {type(regions).__name__}")
    regions = regions.to(maps.device)
    if rank == 3 and regions.dim() == 2 and regions.shape == (batch, 4):
        return _box_masks(regions, maps)
    boxes = regions.dim() in (1, 2) and regions.shape[-1] == 4 and regions.dtype != torch.bool
    if rank != 3 and boxes and tuple(regions.shape) != tuple(expected):
        raise InvalidInputError(
            f"boxes [B, 4] are for images; the maps are {_KINDS[rank]} {MAP_SHAPES[rank]} = {expected}: give bool "
            f"masks {expected}, built with slices (see camkit.metrics.pointing), got shape {list(regions.shape)}"
        )
    if regions.dim() == rank + 1 and regions.shape[1] == 1:
        regions = regions[:, 0]  # [B, 1, *S]: a channel axis of one
    if regions.dim() == rank:
        if regions.dtype != torch.bool:
            raise InvalidInputError(
                f"region masks must be bool {MAP_SHAPES[rank]}, got dtype {regions.dtype}; convert with regions > 0.5"
            )
        if tuple(regions.shape) != tuple(expected):
            raise InvalidInputError(f"region masks have shape {list(regions.shape)}, expected the maps' {expected}")
        return regions
    if rank == 3:
        hint = " (one box per image: add a batch dimension with boxes[None])" if regions.dim() == 1 else ""
        raise InvalidInputError(
            f"regions must be boxes [B, 4] (x0, y0, x1, y1 in pixels) or bool masks [B, H, W] with B={batch}, "
            f"got shape {list(regions.shape)}{hint}"
        )
    if tuple(regions.shape) == tuple(spatial):
        hint = f" (one mask for every map? use regions.expand({expected}))"
    else:
        other = _KINDS.get(regions.dim())
        hint = f" (masks of {other} {MAP_SHAPES[regions.dim()]}?)" if other else ""
    raise InvalidInputError(
        f"the maps are {_KINDS[rank]} {MAP_SHAPES[rank]} = {expected}: regions must be bool masks {expected} "
        f"(or {[batch, 1, *spatial]}), got shape {list(regions.shape)}{hint}"
    )


def _near(masks: Tensor, peak: Tensor, radius: int) -> Tensor:
    """Bool [B]: is a region position within Euclidean distance ``radius`` of the peak?

    ``peak`` holds flat indices [B] into masks [B, *S]. Distances are measured in positions
    along every spatial axis, exactly (integer arithmetic), without growing the masks.
    """
    axes = torch.meshgrid(*(torch.arange(size, device=masks.device) for size in masks.shape[1:]), indexing="ij")
    distance2 = torch.zeros(masks.shape[0], masks[0].numel(), dtype=torch.long, device=masks.device)
    for coord in axes:  # one spatial axis at a time: [B, N] of squared steps
        coord = coord.flatten()
        distance2 += (coord[None] - coord[peak][:, None]).square()
    return (masks.flatten(1) & (distance2 <= radius * radius)).any(dim=1)


def pointing_game(maps: Tensor, regions: Tensor, tolerance: int = 0, *, ties: str = "first") -> Tensor:
    """Hit or miss per image: does the map's maximum fall inside the region?

    The maximum is the first position of largest value in row-major order (ties go to the
    top-left one, as ``argmax`` does on the flattened map). With ``tolerance = t > 0`` a hit
    is a maximum within Euclidean distance ``t`` pixels of the region (Zhang et al. use
    15 px at 224x224), measured in positions along every spatial axis: a volume's voxels
    count as cubes, and a video's frame step as one pixel (resample anisotropic volumes
    first, or give a region already grown as you need it). With ``ties="any"`` a map whose
    largest value is held by several positions hits when any of them lies in the region
    (Quantus's rule; exact equality, no tolerance).
    A map holding NaN is a miss, and so is an empty region; to leave NaN maps out of a
    score, drop them with ``~torch.isnan(maps).flatten(1).any(1)``.

    Args:
        maps: saliency maps [B, T], [B, H, W] or [B, D, H, W].
        regions: bool masks like the maps ([B, *S] or [B, 1, *S]), or on images boxes
            [B, 4] (``x0, y0, x1, y1``, x1/y1 exclusive); see the module docstring.
        tolerance: distance in pixels, an int >= 0.
        ties: ``"first"`` (the first maximum in row-major order) or ``"any"`` (any maximum;
            only with ``tolerance=0``).

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
    if ties not in ("first", "any") or (ties == "any" and tolerance > 0):
        raise InvalidInputError(
            f"ties must be 'first' or 'any' (the latter with tolerance=0), got ties={ties!r}, tolerance={tolerance}"
        )
    masks = region_masks(regions, maps)
    flat = torch.nan_to_num(maps.flatten(1), nan=-math.inf)
    peak = flat.argmax(dim=1)
    if ties == "any":
        hit = (masks.flatten(1) & (flat == flat.gather(1, peak[:, None]))).any(dim=1)
    elif tolerance > 0:
        hit = _near(masks, peak, tolerance)
    else:
        hit = masks.flatten(1).gather(1, peak[:, None])[:, 0]
    return hit & ~nan_maps(maps)


def energy_pointing_game(maps: Tensor, regions: Tensor) -> Tensor:
    """Share of each map's energy inside its region (Wang et al. 2020).

    ``sum(map inside) / sum(map)`` per image, for non-negative maps (camkit's maps are in
    [0, 1]). A map that sums to zero, or holds NaN, gives NaN; an empty region gives 0.

    Args:
        maps: non-negative saliency maps [B, T], [B, H, W] or [B, D, H, W].
        regions: bool masks like the maps ([B, *S] or [B, 1, *S]), or on images boxes
            [B, 4] (``x0, y0, x1, y1``, x1/y1 exclusive).

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


def _region_present(maps: Tensor, regions: Tensor, present: Tensor | None) -> Tensor:
    """Bool [B]: as given, else whether each region covers at least one position of the maps' grid."""
    if present is not None:
        return present.to(maps.device)
    return region_masks(regions, check_maps(maps)).flatten(1).any(dim=1)


def pointing_score(maps: Tensor, regions: Tensor, present: Tensor | None = None) -> Tensor:
    """The pointing game as a score per map: 1.0 a hit, 0.0 a miss, NaN where it is undefined.

    Undefined: the map has no region (``present`` False; by default, a region that covers no
    position) or holds NaN. Use it to average hits over images that have a region, leaving
    the others out: ``pointing_score(maps, regions).nanmean()``.

    Args:
        maps: saliency maps [B, T], [B, H, W] or [B, D, H, W].
        regions: as in :func:`pointing_game` (bool masks, or boxes [B, 4] on images).
        present: bool [B], which maps have a region (for boxes, whose emptiness the coordinates
            do not say); ``None``: a region covering at least one position.

    Returns:
        Tensor [B] in the maps' dtype, on their device.

    Example:
        >>> import torch
        >>> from camkit.metrics import pointing_score
        >>> maps = torch.zeros(3, 2, 2); maps[:, 0, 1] = 1.0; maps[2, 1, 1] = float("nan")
        >>> masks = torch.zeros(3, 2, 2, dtype=torch.bool); masks[0, 0, 1] = True; masks[1, 1, 0] = True
        >>> pointing_score(maps, masks).tolist()  # a hit, a miss, a region-less map with NaN
        [1.0, 0.0, nan]
    """
    hit = pointing_game(maps, regions).to(maps.dtype)
    undefined = ~_region_present(maps, regions, present) | torch.isnan(maps).flatten(1).any(1)
    return torch.where(undefined, torch.full_like(hit, float("nan")), hit)


def energy_score(maps: Tensor, regions: Tensor, present: Tensor | None = None) -> Tensor:
    """:func:`energy_pointing_game` per map, NaN where the map has no region.

    ``present`` says which maps have a region (by default, those whose region covers at least
    one position); the others get NaN rather than a share of 0, so that they can be left out
    of a mean (``nanmean``). Maps summing to zero or holding NaN give NaN too.

    Args:
        maps: non-negative saliency maps [B, T], [B, H, W] or [B, D, H, W].
        regions: as in :func:`energy_pointing_game` (bool masks, or boxes [B, 4] on images).
        present: bool [B], which maps have a region; ``None``: a region covering a position.

    Returns:
        Float tensor [B] in [0, 1] (or NaN) on the maps' device.

    Example:
        >>> import torch
        >>> from camkit.metrics import energy_score
        >>> maps = torch.tensor([[[1.0, 3.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]])
        >>> masks = torch.tensor([[[False, True], [False, False]], [[False, False], [False, False]]])
        >>> energy_score(maps, masks).tolist()
        [0.75, nan]
    """
    share = energy_pointing_game(maps, regions)
    return torch.where(_region_present(maps, regions, present), share, torch.full_like(share, float("nan")))
