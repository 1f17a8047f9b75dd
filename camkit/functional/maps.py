"""Pure operations on saliency maps: upsampling and per-map min-max normalisation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InvalidInputError

__all__ = ["FLAT_RTOL", "flat_maps", "normalize_maps", "upsample_maps"]

#: Relative spread under which a map counts as constant: 64 float32 epsilons of its magnitude.
FLAT_RTOL = 64 * torch.finfo(torch.float32).eps


def upsample_maps(maps: Tensor, size: tuple[int, int]) -> Tensor:
    """Resize maps [..., h, w] to ``size`` (bilinear, ``align_corners=False``).

    Any number of leading dimensions is kept. Maps already at ``size`` are returned as they are.

    Example:
        >>> import torch
        >>> from camkit.functional import upsample_maps
        >>> upsample_maps(torch.tensor([[[0.0, 1.0]]]), (1, 4))
        tensor([[[0.0000, 0.2500, 0.7500, 1.0000]]])
    """
    if maps.dim() < 2:
        raise InvalidInputError(f"maps must be at least 2-D [..., H, W], got shape {list(maps.shape)}")
    size = (int(size[0]), int(size[1]))
    if tuple(maps.shape[-2:]) == size:
        return maps
    lead = maps.shape[:-2]
    flat = maps.reshape(-1, 1, *maps.shape[-2:])
    out = F.interpolate(flat, size=size, mode="bilinear", align_corners=False)
    return out.reshape(*lead, *size)


def normalize_maps(maps: Tensor) -> tuple[Tensor, Tensor]:
    """Min-max normalise each map [..., H, W] to [0, 1]; never modifies ``maps``.

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
    if maps.dim() < 2:
        raise InvalidInputError(f"maps must be at least 2-D [..., H, W], got shape {list(maps.shape)}")
    low = maps.amin(dim=(-2, -1), keepdim=True)
    span = maps.amax(dim=(-2, -1), keepdim=True) - low
    flat = span <= 0
    out = (maps - low) / span.masked_fill(flat, 1.0)
    return out.masked_fill_(flat, 0.0), flat[..., 0, 0]  # out is new: filled in place, one pass


def flat_maps(maps: Tensor, rtol: float = FLAT_RTOL) -> Tensor:
    """Which maps [..., H, W] are constant up to float rounding: a bool tensor [...].

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
    if maps.dim() < 2:
        raise InvalidInputError(f"maps must be at least 2-D [..., H, W], got shape {list(maps.shape)}")
    high = maps.amax(dim=(-2, -1))
    low = maps.amin(dim=(-2, -1))
    scale = torch.maximum(high.abs(), low.abs())
    return (high - low) <= rtol * scale
