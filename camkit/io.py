"""Reading images into model-ready tensors and writing PNGs."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .errors import InvalidInputError
from .overlay import to_uint8_rgb

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "load_image", "read_rgb", "save_png", "to_tensor"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def read_rgb(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an image file as uint8 RGB [H, W, 3].

    Grayscale is repeated to three channels, alpha is dropped (composited on black), and
    16-bit images are scaled to 8 bits. Unreadable files raise :class:`InvalidInputError`
    with the reason.

    Example:
        >>> import numpy as np, tempfile, os
        >>> from camkit.io import read_rgb, save_png
        >>> path = os.path.join(tempfile.mkdtemp(), "a.png")
        >>> save_png(path, np.zeros((2, 3, 3), np.uint8))
        >>> read_rgb(path).shape
        (2, 3, 3)
    """
    import cv2

    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"no image file at {path}")
    if path.stat().st_size == 0:
        raise InvalidInputError(f"{path} is empty (0 bytes)")
    data = np.fromfile(str(path), dtype=np.uint8)
    img = cv2.imdecode(data, cv2.IMREAD_UNCHANGED)
    if img is None:
        raise InvalidInputError(f"{path} could not be decoded as an image (not an image, or truncated)")
    if img.dtype == np.uint16:
        img = (img.astype(np.float32) / 257.0).round().astype(np.uint8)
    elif img.dtype != np.uint8:
        lo, hi = float(img.min()), float(img.max())
        img = ((img.astype(np.float32) - lo) / (hi - lo if hi > lo else 1.0) * 255).round().astype(np.uint8)
    if img.ndim == 2:
        return np.repeat(img[:, :, None], 3, axis=2)
    if img.shape[2] == 4:
        alpha = img[:, :, 3:4].astype(np.float32) / 255.0
        img = (img[:, :, :3].astype(np.float32) * alpha).round().astype(np.uint8)
    elif img.shape[2] == 1:
        img = np.repeat(img, 3, axis=2)
    return np.ascontiguousarray(img[:, :, ::-1])


def to_tensor(
    image: Any,
    size: int | Sequence[int] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> Tensor:
    """Turn an RGB image into a float tensor [3, H, W]: resized, scaled to [0, 1], normalised.

    Args:
        image: anything :func:`camkit.to_uint8_rgb` accepts.
        size: ``(height, width)``, or an int for a square; resizing uses area interpolation
            when shrinking and bilinear when enlarging.
        mean: per-channel mean subtracted after scaling to [0, 1] (give ``std`` too).
        std: per-channel standard deviation divided by after subtracting ``mean``.

    Example:
        >>> import numpy as np
        >>> from camkit.io import to_tensor
        >>> to_tensor(np.full((4, 4, 3), 255, np.uint8), size=2, mean=(0.5,) * 3, std=(0.5,) * 3)[:, 0, 0].tolist()
        [1.0, 1.0, 1.0]
    """
    import cv2

    arr = to_uint8_rgb(image)
    if size is not None:
        height, width = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        shrink = height * width < arr.shape[0] * arr.shape[1]
        arr = cv2.resize(arr, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    x = torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1).float() / 255.0
    if (mean is None) != (std is None):
        raise InvalidInputError("give both mean and std, or neither")
    if mean is not None and std is not None:
        x = (x - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    return x


def load_image(
    path: str | os.PathLike[str],
    size: int | Sequence[int] | None = None,
    mean: Sequence[float] | None = IMAGENET_MEAN,
    std: Sequence[float] | None = IMAGENET_STD,
) -> tuple[Tensor, np.ndarray]:
    """Load an image file for a model.

    Returns:
        ``(x, rgb)``: the model input [1, 3, H, W] (normalised with ``mean``/``std``;
        ImageNet's by default, ``None`` for none), and the resized uint8 RGB image
        [H, W, 3] to overlay maps on.

    Example:
        >>> import numpy as np, tempfile, os
        >>> from camkit import load_image, save_png
        >>> path = os.path.join(tempfile.mkdtemp(), "a.png")
        >>> save_png(path, np.zeros((8, 8, 3), np.uint8))
        >>> x, rgb = load_image(path, size=4)
        >>> tuple(x.shape), rgb.shape
        ((1, 3, 4, 4), (4, 4, 3))
    """
    rgb = read_rgb(path)
    x = to_tensor(rgb, size=size, mean=mean, std=std)
    shown = (to_tensor(rgb, size=size) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    return x[None], shown


def save_png(path: str | os.PathLike[str], image: Any) -> None:
    """Write an RGB image (anything :func:`camkit.to_uint8_rgb` accepts) as a PNG.

    The file is written under a temporary name and renamed, so it is never left half-written.

    Example:
        >>> import os, tempfile
        >>> import numpy as np
        >>> import camkit
        >>> path = os.path.join(tempfile.mkdtemp(), "red.png")
        >>> camkit.save_png(path, np.full((4, 6, 3), (255, 0, 0), np.uint8))
        >>> camkit.read_rgb(path)[0, 0].tolist(), camkit.read_rgb(path).shape
        ([255, 0, 0], (4, 6, 3))
    """
    import cv2

    arr = to_uint8_rgb(image)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ok, buf = cv2.imencode(".png", np.ascontiguousarray(arr[:, :, ::-1]))
    if not ok:
        raise InvalidInputError(f"could not encode an image of shape {arr.shape} as PNG")
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".png", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(buf.tobytes())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
