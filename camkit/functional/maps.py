"""Pure operations on saliency maps: upsampling and per-map min-max normalisation.

Maps of any spatial rank go through the same code: a signal's maps are [..., T], an image's
[..., H, W], a volume's or a video's [..., D, H, W]. The functions that reduce over the map
take ``spatial_dims`` (the number of trailing axes that are the map; 2 by default);
:func:`upsample_maps` reads it from ``size``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InvalidInputError

__all__ = ["FLAT_RTOL", "flat_maps", "interpolation_mode", "multiply_maps", "normalize_maps", "upsample_maps"]

#: Relative spread under which a map counts as constant: 64 float32 epsilons of its magnitude.
FLAT_RTOL = 64 * torch.finfo(torch.float32).eps


_MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}


def interpolation_mode(spatial_dims: int) -> str:
    """The linear interpolation mode of ``F.interpolate`` for maps with this many spatial axes.

    Example:
        >>> from camkit.functional import interpolation_mode
        >>> [interpolation_mode(n) for n in (1, 2, 3)]
        ['linear', 'bilinear', 'trilinear']
    """
    try:
        return _MODES[int(spatial_dims)]
    except KeyError:
        raise InvalidInputError(
            f"maps have 1, 2 or 3 spatial axes (a signal, an image, a volume or video), got {spatial_dims}"
        ) from None


def _spatial(maps: Tensor, spatial_dims: int) -> tuple[int, ...]:
    interpolation_mode(spatial_dims)  # checks the rank
    if maps.dim() < spatial_dims:
        axes = ", ".join(["D", "H", "W"][3 - spatial_dims :] if spatial_dims > 1 else ["T"])
        raise InvalidInputError(
            f"maps with {spatial_dims} spatial axes must be [..., {axes}], got shape {list(maps.shape)}"
        )
    return tuple(range(-spatial_dims, 0))


def upsample_maps(maps: Tensor, size: Sequence[int]) -> Tensor:
    """Resize maps [..., *s] to ``size`` with linear interpolation (``align_corners=False``).

    ``size`` has one entry per spatial axis: ``(T,)`` for a signal (linear), ``(H, W)`` for
    an image (bilinear), ``(D, H, W)`` for a volume or a video (trilinear). Any number of
    leading dimensions is kept. Maps already at ``size`` are returned as they are.

    Example:
        >>> import torch
        >>> from camkit.functional import upsample_maps
        >>> upsample_maps(torch.tensor([[[0.0, 1.0]]]), (1, 4))
        tensor([[[0.0000, 0.2500, 0.7500, 1.0000]]])
        >>> upsample_maps(torch.tensor([[0.0, 1.0]]), (4,))
        tensor([[0.0000, 0.2500, 0.7500, 1.0000]])
    """
    size = tuple(int(s) for s in size)
    n = len(size)
    _spatial(maps, n)
    if tuple(maps.shape[maps.dim() - n :]) == size:
        return maps
    lead = maps.shape[: maps.dim() - n]
    flat = maps.reshape(-1, 1, *maps.shape[maps.dim() - n :])
    out = F.interpolate(flat, size=size, mode=interpolation_mode(n), align_corners=False)
    return out.reshape(*lead, *size)


def normalize_maps(maps: Tensor, *, spatial_dims: int = 2) -> tuple[Tensor, Tensor]:
    """Min-max normalise each map [..., *s] to [0, 1]; never modifies ``maps``.

    ``spatial_dims`` trailing axes make one map (1: a signal, 2: an image, 3: a volume).

    Returns:
        ``(normalised, flat)``: ``flat`` is a bool tensor [...] marking maps that were
        constant (all zero, say). Those come out as zeros, never NaN. No host sync.

    Example:
        >>> import torch
        >>> from camkit.functional import normalize_maps
        >>> maps, flat = normalize_maps(torch.tensor([[[1.0, 3.0]], [[2.0, 2.0]]]))
        >>> maps.tolist(), flat.tolist()
        ([[[0.0, 1.0]], [[0.0, 0.0]]], [False, True])
    """
    axes = _spatial(maps, spatial_dims)
    low = maps.amin(dim=axes, keepdim=True)
    span = maps.amax(dim=axes, keepdim=True) - low
    flat = span <= 0
    out = (maps - low) / span.masked_fill(flat, 1.0)
    return out.masked_fill_(flat, 0.0), flat.reshape(flat.shape[: flat.dim() - spatial_dims])  # out is new


def flat_maps(maps: Tensor, rtol: float = FLAT_RTOL, *, spatial_dims: int = 2) -> Tensor:
    """Which maps [..., *s] are constant up to float rounding: a bool tensor [...].

    ``spatial_dims`` trailing axes make one map (1: a signal, 2: an image, 3: a volume).

    A map is flat when its spread ``max - min`` is at most ``rtol`` times its magnitude
    ``max(|max|, |min|)`` (so also when it is all zero). Decide this on the *raw* map, at
    the layer's resolution: min-max normalisation would stretch a spread of 1e-13 into a
    full-contrast picture of rounding noise, and upsampling a 1x1 map would invent a
    gradient. NaN maps are not flat. No host sync.

    Example:
        >>> import torch
        >>> from camkit.functional import flat_maps
        >>> flat_maps(torch.tensor([[[1.44e-6, 1.44e-6 + 1e-13]], [[0.0, 0.0]], [[1.0, 1.001]]])).tolist()
        [True, True, False]
    """
    axes = _spatial(maps, spatial_dims)
    high = maps.amax(dim=axes)
    low = maps.amin(dim=axes)
    scale = torch.maximum(high, -low)  # max(|high|, |low|), as low <= high
    return (high - low) <= rtol * scale


def multiply_maps(maps: Sequence[Tensor], *, spatial_dims: int = 2) -> tuple[Tensor, Tensor]:
    """Fuse maps of the same size by their product, then min-max normalise (RefineCAM's fusion).

    Where :func:`camkit.methods._core.output.finish_maps` averages the layers' maps, a product keeps
    only what every layer shows: a position that one layer rates 0 stays 0. Give each map in
    [0, 1] (already normalised).

    Args:
        maps: maps [..., *s] of one shape, one per layer.
        spatial_dims: trailing axes that make one map (1: a signal, 2: an image, 3: a volume).

    Returns:
        ``(fused, flat)`` as :func:`normalize_maps`: ``flat`` marks products that are constant
        up to float rounding (:func:`flat_maps`: layers that agree nowhere give an all-zero
        product), returned as zeros.

    Example:
        >>> import torch
        >>> from camkit.functional import multiply_maps
        >>> fused, flat = multiply_maps([torch.tensor([[[1.0, 0.5, 0.0]]]), torch.tensor([[[0.5, 1.0, 1.0]]])])
        >>> fused.tolist(), flat.tolist()
        ([[[1.0, 1.0, 0.0]]], [False])
    """
    if not maps:
        raise InvalidInputError("multiply_maps needs at least one map")
    shapes = {tuple(m.shape) for m in maps}
    if len(shapes) != 1:
        raise InvalidInputError(f"maps to multiply must share one shape, got {sorted(shapes)}; upsample them first")
    product = maps[0]
    for other in maps[1:]:
        product = product * other
    flat = flat_maps(product, spatial_dims=spatial_dims)
    fused, _ = normalize_maps(product, spatial_dims=spatial_dims)
    return fused.masked_fill_(flat.view(*flat.shape, *(1,) * spatial_dims), 0.0), flat
