"""``sobel_cam``: pytorch-grad-cam's edge-map baseline, the Sobel gradient magnitude of an image, in torch."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import InvalidInputError

__all__ = ["sobel_cam"]

# ITU-R BT.601 luma in 16-bit fixed point, as OpenCV 5 converts uint8 RGB to grey
_LUMA = (19596, 38470, 7470)
_SHIFT = 16
_SOBEL_X = ((-1.0, 0.0, 1.0), (-2.0, 0.0, 2.0), (-1.0, 0.0, 1.0))


def sobel_cam(img: np.ndarray) -> np.ndarray:
    """The mean of the absolute horizontal and vertical Sobel derivatives of an RGB image's luma.

    The original's OpenCV pipeline, step for step: uint8 RGB to grey (``(19596 R + 38470 G +
    7470 B + 2^15) >> 16``, OpenCV 5's fixed point), 3x3 Sobel derivatives with the border mirrored without repeating
    the edge pixel, each absolute value saturated to 255, then ``(|gx| + |gy|) / 2`` rounded half
    to even. The input is not modified.

    Args:
        img: an RGB image [H, W, 3], uint8 (as the original requires).

    Returns:
        The edge map [H, W], uint8.

    Raises:
        InvalidInputError: if ``img`` is not a uint8 array [H, W, 3] of at least 2 x 2 pixels.

    Example:
        >>> import numpy as np
        >>> from camkit.compat.pytorch_grad_cam.sobel_cam import sobel_cam
        >>> img = np.zeros((4, 4, 3), np.uint8); img[:, 2:] = 255
        >>> sobel_cam(img)[0].tolist()
        [0, 128, 128, 0]
    """
    if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        got = f"{img.dtype} {img.shape}" if isinstance(img, np.ndarray) else type(img).__name__
        raise InvalidInputError(f"sobel_cam expects an RGB image, a uint8 array [H, W, 3]; got {got}")
    if min(img.shape[:2]) < 2:
        raise InvalidInputError(f"sobel_cam needs at least 2 x 2 pixels to mirror the border; got {img.shape[:2]}")
    rgb = torch.from_numpy(np.ascontiguousarray(img)).to(torch.int64)
    weights = torch.tensor(_LUMA, dtype=torch.int64)
    gray = ((rgb * weights).sum(-1) + (1 << (_SHIFT - 1))) >> _SHIFT
    padded = F.pad(gray.to(torch.float64)[None, None], (1, 1, 1, 1), mode="reflect")
    kx = torch.tensor(_SOBEL_X, dtype=torch.float64)
    kernels = torch.stack([kx, kx.T])[:, None]
    grads = F.conv2d(padded, kernels)[0].abs().clamp_max(255)  # exact integers: no rounding needed
    return torch.round(grads.mean(0)).to(torch.uint8).numpy()
