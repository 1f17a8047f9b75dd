"""Colour maps and overlays on tensors, batched, on any device (no numpy/OpenCV round trip)."""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import Tensor

from ..errors import InvalidInputError
from .colormaps import anchor_lut, colormap_names

__all__ = ["colorize", "colormap_lut", "overlay_batch"]


@functools.lru_cache(maxsize=32)
def _lut_numpy(name: str) -> np.ndarray:
    own = anchor_lut(name)
    if own is not None:
        return own
    import cv2

    code = getattr(cv2, f"COLORMAP_{name.upper()}", None)
    if code is None:
        known = sorted(k[len("COLORMAP_") :].lower() for k in dir(cv2) if k.startswith("COLORMAP_"))
        raise InvalidInputError(
            f"unknown colormap '{name}'; camkit has: {', '.join(colormap_names())}; OpenCV has: {', '.join(known)}"
        )
    ramp = np.arange(256, dtype=np.uint8).reshape(256, 1)
    bgr = cv2.applyColorMap(ramp, code).reshape(256, 3)
    rgb = bgr[:, ::-1].copy()
    rgb.setflags(write=False)
    return rgb


def colormap_lut(name: str = "jet", device: torch.device | str | None = None) -> Tensor:
    """The 256-entry RGB table of a colormap as uint8 [256, 3].

    ``name`` is one of camkit's anchor-defined tables (diverging ``bwr``, ``seismic``,
    ``rdbu``, ``rdbu_r``, ``rdwhgn``; sequential ``reds``, ``blues``, ``greens``: see
    :mod:`camkit.viz.colormaps`) or any OpenCV colormap (``jet``, ``viridis``, ``turbo``...).

    Example:
        >>> from camkit.functional import colormap_lut
        >>> colormap_lut("jet")[0].tolist(), colormap_lut("jet")[255].tolist()
        ([0, 0, 128], [128, 0, 0])
    """
    return torch.from_numpy(_lut_numpy(name).copy()).to(device)


def colorize(maps: Tensor, colormap: str = "jet") -> Tensor:
    """Colour maps [..., H, W] in [0, 1] into uint8 RGB [..., 3, H, W].

    Values are clipped to [0, 1] and quantised with ``round(v * 255)``, as OpenCV's
    ``applyColorMap`` does for uint8 input.

    Example:
        >>> import torch
        >>> from camkit.functional import colorize
        >>> colorize(torch.zeros(1, 1, 1)).flatten().tolist()
        [0, 0, 128]
    """
    lut = colormap_lut(colormap, maps.device)
    index = (maps.float().clamp(0, 1) * 255).round().long()
    rgb = lut[index]  # [..., H, W, 3]
    return rgb.movedim(-1, -3)


def overlay_batch(images: Tensor, maps: Tensor, alpha: float = 0.5, colormap: str = "jet") -> Tensor:
    """Blend heatmaps over images, batched: ``(1 - alpha) * image + alpha * colour(map)``.

    Args:
        images: float [B, 3, H, W] in [0, 1], or uint8 [B, 3, H, W].
        maps: [B, h, w] in [0, 1]; resized bilinearly to the images' size when needed.
        alpha: weight of the heatmap, in [0, 1].
        colormap: a name :func:`colormap_lut` knows (``"jet"``, ``"viridis"``, ``"bwr"``...).

    Returns:
        uint8 RGB [B, 3, H, W] on the images' device.

    Example:
        >>> import torch
        >>> from camkit.functional import overlay_batch
        >>> overlay_batch(torch.ones(1, 3, 2, 2), torch.zeros(1, 2, 2))[0, :, 0, 0].tolist()
        [128, 128, 192]
    """
    from .maps import upsample_maps

    if images.dim() != 4 or images.shape[1] != 3:
        raise InvalidInputError(f"images must be [B, 3, H, W], got shape {list(images.shape)}")
    if maps.dim() != 3 or maps.shape[0] != images.shape[0]:
        raise InvalidInputError(
            f"maps must be [B, H, W] with B={images.shape[0]}, got shape {list(maps.shape)}"
        )
    if not 0.0 <= alpha <= 1.0:
        raise InvalidInputError(f"alpha must be in [0, 1], got {alpha}")
    base = images.float() * (1 / 255) if images.dtype == torch.uint8 else images.float().clamp(0, 1)
    heat = colorize(upsample_maps(maps.float(), (images.shape[-2], images.shape[-1])), colormap).float() / 255
    blended = (1 - alpha) * base + alpha * heat
    return (blended * 255).round().clamp(0, 255).to(torch.uint8)
