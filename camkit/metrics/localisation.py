"""Localisation measures against a ground-truth region: how much of a map lies on the object.

Maps are [B, T], [B, H, W] or [B, D, H, W]; regions are bool masks of the maps' shape (or
[B, 1, *S]), or boxes [B, 4] on images, exactly as :func:`camkit.metrics.pointing_game`
reads them (see :func:`camkit.metrics.region_masks`). Every measure is per map, needs no
model, costs one pass over the map (one sort for the rank measures), and gives NaN where it
is undefined: an empty region, a map that holds NaN, or (for the ratios) a map summing to zero.

Ties between map values are ordered as :func:`camkit.metrics.deletion_curve` orders them:
the position nearer the start of the flattened map comes first.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InvalidInputError
from ._common import average_ranks, check_maps, nan_maps, pixel_ranks
from .pointing import region_masks

__all__ = [
    "attribution_localisation",
    "focus",
    "region_auc",
    "relevance_mass_accuracy",
    "relevance_rank_accuracy",
    "top_k_intersection",
]


def _prepare(maps: Tensor, regions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Flat float maps [B, N], flat bool masks [B, N], and the rows to set to NaN [B]."""
    maps = check_maps(maps)
    masks = region_masks(regions, maps)
    flat = maps.flatten(1)
    inside = masks.flatten(1)
    undefined = nan_maps(maps) | ~inside.any(dim=1)
    return flat, inside, undefined


def _nan_where(values: Tensor, undefined: Tensor) -> Tensor:
    return torch.where(undefined, torch.full_like(values, float("nan")), values)


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    """num / den, NaN where den is 0."""
    safe = torch.where(den == 0, torch.ones_like(den), den)
    return _nan_where(num / safe, den == 0)


def relevance_mass_accuracy(maps: Tensor, regions: Tensor) -> Tensor:
    """Share of the relevance that lies inside the region (Arras et al. 2022, CLEVR-XAI).

    ``sum(map[inside]) / sum(map)`` per map. Meant for non-negative maps; on signed maps
    negative relevance outside the region can push it above 1.

    Args:
        maps: saliency maps [B, T], [B, H, W] or [B, D, H, W].
        regions: bool masks [B, *S] (or [B, 1, *S]), or boxes [B, 4] on images.

    Returns:
        Float tensor [B]; NaN for an empty region, a map summing to 0 or holding NaN.

    Example:
        >>> import torch
        >>> from camkit.metrics import relevance_mass_accuracy
        >>> maps = torch.tensor([[[1.0, 3.0], [0.0, 4.0]]])
        >>> relevance_mass_accuracy(maps, torch.tensor([[[False, True], [False, True]]]))
        tensor([0.8750])
    """
    flat, inside, undefined = _prepare(maps, regions)
    share = _ratio((flat * inside).sum(dim=1), flat.sum(dim=1))
    return _nan_where(share, undefined)


def relevance_rank_accuracy(maps: Tensor, regions: Tensor) -> Tensor:
    """Share of the K most relevant positions that lie in the region, K = the region's size
    (Arras et al. 2022, CLEVR-XAI).

    Args:
        maps: saliency maps [B, T], [B, H, W] or [B, D, H, W].
        regions: bool masks [B, *S] (or [B, 1, *S]), or boxes [B, 4] on images.

    Returns:
        Float tensor [B] in [0, 1]; NaN for an empty region or a map holding NaN.

    Example:
        >>> import torch
        >>> from camkit.metrics import relevance_rank_accuracy
        >>> maps = torch.tensor([[4.0, 3.0, 2.0, 1.0]])  # a signal [B, T]
        >>> relevance_rank_accuracy(maps, torch.tensor([[True, False, True, False]]))  # top-2 = {0, 1}: one inside
        tensor([0.5000])
    """
    flat, inside, undefined = _prepare(maps, regions)
    size = inside.sum(dim=1)
    in_top = pixel_ranks(flat) < size[:, None]
    share = (in_top & inside).sum(dim=1) / size.clamp(min=1)
    return _nan_where(share.float(), undefined)


def top_k_intersection(maps: Tensor, regions: Tensor, k: int, *, concept_influence: bool = False) -> Tensor:
    """Share of the ``k`` most relevant positions that lie in the region (Theiner et al. 2022).

    ``|top_k(map) ∩ region| / k``; with ``concept_influence=True`` it is divided by the
    region's share of the map, ``|region| / N``, so that a map that ignores the region
    scores 1 on average whatever the region's size.

    Args:
        maps: saliency maps [B, T], [B, H, W] or [B, D, H, W].
        regions: bool masks [B, *S] (or [B, 1, *S]), or boxes [B, 4] on images.
        k: positions to take, 1 <= k <= N (the positions of one map).
        concept_influence: divide by the region's share of the map.

    Returns:
        Float tensor [B]; NaN for an empty region or a map holding NaN.

    Example:
        >>> import torch
        >>> from camkit.metrics import top_k_intersection
        >>> maps = torch.tensor([[[4.0, 3.0], [2.0, 1.0]]])
        >>> region = torch.tensor([[[True, False], [False, False]]])
        >>> top_k_intersection(maps, region, k=2), top_k_intersection(maps, region, k=2, concept_influence=True)
        (tensor([0.5000]), tensor([2.]))
    """
    flat, inside, undefined = _prepare(maps, regions)
    n = flat.shape[1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise InvalidInputError(f"k must be an int from 1 to the {n} positions of a map, got {k!r}")
    share = ((pixel_ranks(flat) < k) & inside).sum(dim=1) / k
    if concept_influence:
        share = share * n / inside.sum(dim=1).clamp(min=1)
    return _nan_where(share.float(), undefined)


def attribution_localisation(
    maps: Tensor, regions: Tensor, *, weighted: bool = False, positive_only: bool = False
) -> Tensor:
    """Share of the (positive) relevance inside the region (Kohlbrenner et al. 2020).

    ``mu = sum(map[inside]) / sum(map)``, with the map clipped at 0 first when
    ``positive_only``; ``weighted=True`` multiplies by the region's share of the map
    ``|region| / N`` (as Quantus 0.6.0 weights it). A share above 1 (negative relevance
    outside the region) is undefined and gives NaN, as in Quantus.

    Args:
        maps: saliency maps [B, T], [B, H, W] or [B, D, H, W].
        regions: bool masks [B, *S] (or [B, 1, *S]), or boxes [B, 4] on images.
        weighted: multiply by ``|region| / N``.
        positive_only: clip the maps at 0 before summing.

    Returns:
        Float tensor [B]; NaN for an empty region, a map summing to 0 or holding NaN, a share above 1.

    Example:
        >>> import torch
        >>> from camkit.metrics import attribution_localisation
        >>> maps = torch.tensor([[[1.0, 3.0], [0.0, 4.0]]])
        >>> region = torch.tensor([[[False, True], [False, False]]])
        >>> attribution_localisation(maps, region), attribution_localisation(maps, region, weighted=True)
        (tensor([0.3750]), tensor([0.0938]))
    """
    flat, inside, undefined = _prepare(maps, regions)
    if positive_only:
        flat = flat.clamp(min=0)
    share = _ratio((flat * inside).sum(dim=1), flat.sum(dim=1))
    if weighted:
        share = share * inside.sum(dim=1) / flat.shape[1]
    return _nan_where(share, undefined | (share > 1))


def region_auc(maps: Tensor, regions: Tensor) -> Tensor:
    """Area under the ROC curve of the map as a detector of the region (Fawcett 2006).

    Every position is a sample: the region's are positives, the others negatives, the map
    value the score. Computed exactly as the Mann-Whitney statistic
    ``(sum of the positives' ranks - P (P + 1) / 2) / (P * Q)`` with tied values given their
    mean rank (a tie between a positive and a negative counts one half), which equals the
    trapezoidal area under scikit-learn's ``roc_curve``. One sort per map.

    Args:
        maps: saliency maps [B, T], [B, H, W] or [B, D, H, W].
        regions: bool masks [B, *S] (or [B, 1, *S]), or boxes [B, 4] on images.

    Returns:
        Float tensor [B] in [0, 1] (float64 for float64 maps, else float32); NaN for a region that
        is empty or covers the whole map (no negatives), or a map holding NaN.

    Example:
        >>> import torch
        >>> from camkit.metrics import region_auc
        >>> maps = torch.tensor([[0.9, 0.1, 0.8, 0.4]])
        >>> region_auc(maps, torch.tensor([[True, False, False, True]]))  # positives 0.9, 0.4; negatives 0.1, 0.8
        tensor([0.7500])
    """
    flat, inside, undefined = _prepare(maps, regions)
    ranks = average_ranks(flat.double()) + 1  # 1-based, ascending
    pos = inside.sum(dim=1).double()
    neg = flat.shape[1] - pos
    u = (ranks * inside).sum(dim=1) - pos * (pos + 1) / 2
    area = _ratio(u, pos * neg).to(torch.float64 if maps.dtype == torch.float64 else torch.float32)
    return _nan_where(area, undefined)


def focus(maps: Tensor, parts: Tensor) -> Tensor:
    """Share of the positive relevance on the mosaic's parts of the explained class (Arias-Duart et al. 2022).

    The input is a mosaic: its extent split in two along every spatial axis, halves of
    ``S // 2`` and ``S - S // 2`` positions, gives 2 parts for a signal, 4 for an image, 8
    for a volume, each part taken from another input. ``parts`` [B, P] says, per mosaic,
    which parts show the class being explained (1) and which do not (0), in row-major order
    of the parts: for an image top-left, top-right, bottom-left, bottom-right (Quantus's
    ``custom_batch``). Focus = ``sum(relu(map) on those parts) / sum(relu(map))``.

    Args:
        maps: saliency maps of mosaics [B, T], [B, H, W] or [B, D, H, W].
        parts: [B, 2], [B, 4] or [B, 8] of 0 and 1 (bool or numbers).

    Returns:
        Float tensor [B] in [0, 1]; NaN for a map with no positive relevance or holding NaN.

    Example:
        >>> import torch
        >>> from camkit.metrics import focus
        >>> maps = torch.tensor([[[1.0, 0.0], [2.0, -5.0]]])  # a 2x2 mosaic of 1x1 parts
        >>> focus(maps, torch.tensor([[1, 0, 0, 1]]))  # the class at top-left and bottom-right
        tensor([0.3333])
    """
    maps = check_maps(maps)
    batch, *spatial = maps.shape
    count = 2 ** len(spatial)
    if not isinstance(parts, Tensor) or parts.shape != (batch, count):
        got = list(parts.shape) if isinstance(parts, Tensor) else type(parts).__name__
        raise InvalidInputError(
            f"parts must be [B, {count}] (which of the mosaic's {count} parts show the class, 0 or 1) "
            f"for maps {list(maps.shape)}, got {got}"
        )
    if min(spatial) < 2:
        raise InvalidInputError(f"a mosaic needs at least 2 positions along every axis, got maps {list(maps.shape)}")
    index = torch.zeros(spatial, dtype=torch.long, device=maps.device)
    for axis, size in enumerate(spatial):  # part index: one bit per axis, the first axis most significant
        second = (torch.arange(size, device=maps.device) >= size // 2).long()
        shape = [1] * len(spatial)
        shape[axis] = size
        index = index * 2 + second.view(shape)
    chosen = parts.to(maps.device).bool()[:, index.flatten()]  # [B, N]
    positive = maps.flatten(1).clamp(min=0)
    share = _ratio((positive * chosen).sum(dim=1), positive.sum(dim=1))
    return _nan_where(share, nan_maps(maps))
