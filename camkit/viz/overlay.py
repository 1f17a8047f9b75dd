"""Heatmap overlays: one image (numpy, PIL or tensor in; uint8 RGB out), or a stack of slices or frames.

:func:`overlay` blends one map over one picture; :func:`blend` blends maps over a stack of grey
or colour images (a volume's slices, a video's frames) at once, and :func:`peak_index` finds
where a map is largest (the slice to show).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import InvalidInputError
from ..functional.overlay import colormap_lut, overlay_batch
from ..io import check_unit_range, denormalize, to_uint8_rgb

__all__ = ["blend", "overlay", "peak_index"]


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


def blend(gray_or_rgb: Tensor, maps: Tensor, alpha: float, colormap: str) -> np.ndarray:
    """Overlays of maps [N, H, W] on images [N, H, W] (grey, [0, 1]) or [N, 3, H, W]: uint8 [N, H, W, 3].

    Images are clipped to [0, 1]; the maps are coloured by ``colormap`` from ``round(v * 255)``
    and weighted by ``alpha``, as in :func:`overlay` (no resizing: the maps are at the images' size).

    Example:
        >>> import torch
        >>> from camkit.viz.overlay import blend
        >>> blend(torch.ones(1, 1, 1), torch.ones(1, 1, 1), 1.0, "jet").tolist()
        [[[[128, 0, 0]]]]
    """
    base = gray_or_rgb[:, None].expand(-1, 3, -1, -1) if gray_or_rgb.dim() == 3 else gray_or_rgb
    return overlay_batch(base.float().clamp(0, 1), maps, alpha=alpha, colormap=colormap).permute(0, 2, 3, 1).numpy()


def peak_index(maps: Tensor) -> tuple[int, ...]:
    """The index of a map's largest value (the first one on ties, in row-major order), one int per axis.

    Example:
        >>> import torch
        >>> from camkit.viz.overlay import peak_index
        >>> volume = torch.zeros(2, 3, 4); volume[1, 2, 0] = 1.0
        >>> peak_index(volume)
        (1, 2, 0)
    """
    flat = int(maps.flatten().argmax())
    return tuple(int(i) for i in np.unravel_index(flat, tuple(maps.shape)))
