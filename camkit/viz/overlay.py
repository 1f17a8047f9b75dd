"""Heatmap overlays for single images (numpy, PIL or tensor in; uint8 RGB out)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import InvalidInputError
from ..functional.overlay import colormap_lut
from ..io import check_unit_range, denormalize, to_uint8_rgb

__all__ = ["overlay"]


def overlay(
    image: Any,
    heatmap: Any,
    alpha: float = 0.5,
    colormap: str = "jet",
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> np.ndarray:
    """Colour a heatmap and blend it over an image.

    ``out = round((1 - alpha) * image + alpha * colour(heatmap))`` per channel (halves round to
    even), where the
    heatmap is resized to the image (bilinear), clipped to [0, 1] and coloured by an OpenCV
    colormap from ``round(v * 255)``. Channel order is RGB throughout.

    Args:
        image: uint8 [H, W, 3] array, PIL image, or float tensor [3, H, W] in [0, 1]. A float
            tensor outside [0, 1] (a normalised model input) is refused: undo the
            normalisation with :func:`camkit.denormalize`, or give ``mean`` and ``std``.
        heatmap: tensor or array [h, w] with values in [0, 1].
        alpha: the heatmap's weight in [0, 1].
        colormap: an OpenCV colormap name (``"jet"``, ``"turbo"``, ``"viridis"``...) or one of
            :mod:`camkit.viz.colormaps` (``"bwr"``...).
        mean: with ``std``, the per-channel values ``image`` (a float tensor) was normalised
            with; the image is passed through :func:`camkit.denormalize` first.
        std: see ``mean``.

    Returns:
        A new uint8 RGB array [H, W, 3].

    Example:
        >>> import numpy as np
        >>> from camkit import overlay
        >>> overlay(np.full((1, 1, 3), 255, np.uint8), np.ones((1, 1)), alpha=1.0).tolist()
        [[[128, 0, 0]]]
    """
    import cv2

    if not 0.0 <= alpha <= 1.0:
        raise InvalidInputError(f"alpha must be in [0, 1], got {alpha}")
    if (mean is None) != (std is None):
        raise InvalidInputError("give both mean and std (the values the image was normalised with), or neither")
    if mean is not None and std is not None:
        if not isinstance(image, Tensor) or image.dtype == torch.uint8:
            raise InvalidInputError(
                f"mean/std undo a normalisation of a float tensor image [3, H, W]; got {type(image).__name__}"
                + (" of dtype uint8" if isinstance(image, Tensor) else "")
            )
        image = denormalize(image, mean, std)
    if isinstance(image, Tensor):
        check_unit_range(image)
    base = to_uint8_rgb(image)
    heat = heatmap.detach().float().cpu().numpy() if isinstance(heatmap, Tensor) else np.asarray(heatmap, dtype=np.float32)
    if heat.ndim == 3 and heat.shape[0] == 1:
        heat = heat[0]
    if heat.ndim != 2:
        raise InvalidInputError(f"heatmap must be [H, W], got shape {list(heat.shape)}")
    height, width = base.shape[:2]
    if heat.shape != (height, width):
        heat = cv2.resize(heat.astype(np.float32), (width, height), interpolation=cv2.INTER_LINEAR)
    index = np.rint(np.clip(np.nan_to_num(heat, nan=0.0), 0, 1) * 255).astype(np.uint8)
    colour = colormap_lut(colormap).numpy()[index].astype(np.float32)
    blended = (1 - alpha) * base.astype(np.float32) + alpha * colour
    return np.clip(np.rint(blended), 0, 255).astype(np.uint8)
