"""torchcam 0.5.0's ``torchcam.utils.overlay_mask``: a colour-mapped mask blended over a PIL image."""

from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import Colormap
from PIL.Image import Image, Resampling, blend, fromarray

__all__ = ["overlay_mask"]


def overlay_mask(img: Image, mask: Image, colormap: Colormap | str = "jet", alpha: float = 0.7) -> Image:
    """Overlay a colour-mapped mask on a background image, as torchcam 0.5.0 does.

    The mask is resized to the image with bicubic resampling, its values squared and
    coloured by the matplotlib ``colormap``; the result is ``alpha * image + (1 - alpha) * colour``.

    Args:
        img: background image (RGB or grayscale)
        mask: mask to be overlaid, grayscale (mode ``"F"`` for a float map in [0, 1])
        colormap: matplotlib colormap (name or object)
        alpha: weight of the background image, in [0, 1)

    Returns:
        the overlaid RGB image

    Raises:
        TypeError: when the arguments are not PIL images
        ValueError: when ``alpha`` is not a float in [0, 1) or the image is neither RGB nor grayscale
    """
    if not isinstance(img, Image) or not isinstance(mask, Image):
        raise TypeError("img and mask arguments need to be PIL.Image")
    if not isinstance(alpha, float) or alpha < 0 or alpha >= 1:
        raise ValueError("alpha argument is expected to be of type float between 0 and 1")
    if len(img.getbands()) not in {1, 3}:
        raise ValueError("img argument needs to be a grayscale or RGB image")
    cmap = colormaps.get_cmap(colormap)
    resized = mask.resize(img.size, resample=Resampling.BICUBIC)
    colour = cmap(np.asarray(resized) ** 2, bytes=True)[:, :, :3]
    if img.mode in {"L", "RGB"} and colour.ndim == 3 and np.isfinite(alpha):
        return blend(fromarray(colour), img.convert("RGB"), alpha)
    # A colour mask gives colours of shape [H, W, 3, 3]: the blend below refuses it (ValueError).
    background = np.asarray(img) if len(img.getbands()) == 3 else np.asarray(img)[..., None].repeat(3, axis=-1)
    return fromarray((alpha * background + (1 - alpha) * colour).astype(np.uint8))
