"""Images in and out: reading them into model-ready tensors, the pixel conversions, writing PNGs.

The pixel conversions live here, in one place, for every module that draws or writes:
:func:`denormalize` (a normalised model input back to [0, 1]), :func:`to_uint8_rgb` (any
single image to a new uint8 RGB array) and :func:`check_unit_range`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._internal.files import file_mode
from .errors import InvalidInputError

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "check_unit_range",
    "denormalize",
    "load_image",
    "read_rgb",
    "save_png",
    "to_tensor",
    "to_uint8_rgb",
]

# torchvision's ImageNet normalisation (the ``transforms()`` of its pretrained classifiers).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def denormalize(
    x: Tensor, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD
) -> Tensor:
    """Undo ``(image - mean) / std``: a new tensor ``x * std + mean``, for display.

    Args:
        x: a normalised image [C, H, W] or batch [B, C, H, W]; ``C`` equals ``len(mean)``.
        mean: per-channel means used to normalise (default: torchvision's ImageNet values,
            :data:`IMAGENET_MEAN`).
        std: per-channel standard deviations (default: :data:`IMAGENET_STD`).

    Returns:
        A new float tensor of ``x``'s shape, on ``x``'s device, not clipped (a value outside
        [0, 1] means ``mean``/``std`` were not the ones used).

    Example:
        >>> import torch
        >>> import camkit
        >>> image = torch.rand(2, 3, 4, 4)
        >>> x = (image - torch.tensor(camkit.io.IMAGENET_MEAN).view(3, 1, 1)) / torch.tensor(camkit.io.IMAGENET_STD).view(3, 1, 1)
        >>> torch.allclose(camkit.denormalize(x), image, atol=1e-6)
        True
    """
    if not isinstance(x, Tensor) or x.dim() not in (3, 4):
        got = list(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise InvalidInputError(f"denormalize expects a tensor [C, H, W] or [B, C, H, W], got {got}")
    if len(mean) != len(std):
        raise InvalidInputError(f"mean and std must have one value per channel, got {len(mean)} and {len(std)}")
    if x.shape[-3] != len(mean):
        raise InvalidInputError(
            f"the image has {x.shape[-3]} channels (dimension -3 of shape {list(x.shape)}) but mean/std have "
            f"{len(mean)}; pass images channels first"
        )
    shape = (len(mean), 1, 1)
    m = torch.tensor(mean, dtype=torch.float32, device=x.device).view(shape)
    s = torch.tensor(std, dtype=torch.float32, device=x.device).view(shape)
    return x.float() * s + m


def to_uint8_rgb(image: Any) -> np.ndarray:
    """Convert an image to a new uint8 RGB array [H, W, 3]; the input is never modified.

    Accepts a uint8 array [H, W, 3] (or [H, W] grayscale), a PIL image, or a float tensor
    [3, H, W] (or [1, H, W]) with values in [0, 1].

    Example:
        >>> import torch
        >>> from camkit import to_uint8_rgb
        >>> to_uint8_rgb(torch.ones(3, 1, 2)).tolist()
        [[[255, 255, 255], [255, 255, 255]]]
    """
    if isinstance(image, Tensor):
        if image.dim() == 4:
            raise InvalidInputError("pass individual images, not batches (use camkit.functional.overlay_batch)")
        if image.dim() != 3 or image.shape[0] not in (1, 3):
            raise InvalidInputError(f"a tensor image must be [3, H, W] or [1, H, W], got shape {list(image.shape)}")
        if image.dtype == torch.uint8:
            arr = image.detach().cpu().numpy()
        else:
            arr = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
        arr = np.repeat(arr, 3, axis=0) if arr.shape[0] == 1 else arr
        return np.ascontiguousarray(arr.transpose(1, 2, 0))
    if hasattr(image, "convert") and hasattr(image, "size"):  # PIL.Image
        return np.asarray(image.convert("RGB"), dtype=np.uint8).copy()
    arr = np.asarray(image)
    if arr.dtype != np.uint8:
        raise InvalidInputError(
            f"a numpy image must be uint8 [H, W, 3], got dtype {arr.dtype}; scale floats with "
            "(img * 255).round().astype('uint8') or pass a float tensor [3, H, W]"
        )
    if arr.ndim == 2:
        return np.repeat(arr[:, :, None], 3, axis=2)
    if arr.ndim == 3 and arr.shape[2] == 3:
        return arr.copy()
    if arr.ndim == 4:
        raise InvalidInputError("pass individual images, not batches (use camkit.functional.overlay_batch)")
    raise InvalidInputError(f"a numpy image must be [H, W, 3] or [H, W], got shape {list(arr.shape)}")


def check_unit_range(image: Tensor) -> None:
    """Refuse a float image outside [0, 1] (a normalised input, most likely); uint8 images pass.

    Example:
        >>> import torch
        >>> from camkit.io import check_unit_range
        >>> check_unit_range(torch.rand(3, 2, 2))
        >>> try:
        ...     check_unit_range(torch.full((3, 2, 2), -2.0))
        ... except ValueError as err:
        ...     print(str(err)[:41])
        the image's values span [-2, -2], outside
    """
    if image.dtype == torch.uint8 or image.numel() == 0:
        return
    low, high = float(image.min()), float(image.max())
    if low < -1e-3 or high > 1 + 1e-3:
        raise InvalidInputError(
            f"the image's values span [{low:.3g}, {high:.3g}], outside [0, 1]: it looks normalised, and would be "
            "clipped and oversaturated; pass camkit.denormalize(x) (ImageNet mean/std by default), or "
            "overlay(image, heatmap, mean=..., std=...) with the values used to normalise it"
        )


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


def _fit(rgb: np.ndarray, size: int | Sequence[int], fit: str, resize: int | None) -> np.ndarray:
    """Resize (and centre-crop) a uint8 RGB image [H, W, 3] to ``size``."""
    import cv2

    height, width = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    if fit == "squash":
        return to_uint8_rgb(to_tensor(rgb, size=(height, width)).mul(255).round().to(torch.uint8))
    if fit != "crop":
        raise InvalidInputError(f"fit must be 'crop' (keep the aspect ratio) or 'squash', got {fit!r}")
    h0, w0 = rgb.shape[:2]
    if resize is None:  # the smallest scale at which the image covers the crop
        scale = max(height / h0, width / w0)
        new_h, new_w = max(height, int(h0 * scale)), max(width, int(w0 * scale))
    else:  # torchvision's Resize(int): the shorter side to `resize`, the longer one truncated
        if h0 <= w0:
            new_h, new_w = resize, int(resize * w0 / h0)
        else:
            new_h, new_w = int(resize * h0 / w0), resize
        if new_h < height or new_w < width:
            raise InvalidInputError(
                f"resize={resize} gives a {new_h}x{new_w} image, smaller than the {height}x{width} crop; "
                "make resize at least the crop size"
            )
    if (new_h, new_w) != (h0, w0):
        shrink = new_h * new_w < h0 * w0
        rgb = cv2.resize(rgb, (new_w, new_h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    top = round((new_h - height) / 2.0)  # torchvision's CenterCrop offsets
    left = round((new_w - width) / 2.0)
    return np.ascontiguousarray(rgb[top : top + height, left : left + width])


def load_image(
    path: str | os.PathLike[str],
    size: int | Sequence[int] | None = None,
    mean: Sequence[float] | None = IMAGENET_MEAN,
    std: Sequence[float] | None = IMAGENET_STD,
    fit: str = "crop",
    resize: int | None = None,
) -> tuple[Tensor, np.ndarray]:
    """Load an image file for a model, keeping its aspect ratio by default.

    With ``fit="crop"`` (the default) the image is scaled, aspect ratio kept, until it covers
    ``size``, then the centre ``size`` is cut out, like torchvision's classification presets
    (``Resize`` of the shorter side, then ``CenterCrop``). Give ``resize`` to scale the shorter
    side to a set length first: ``size=224, resize=256`` is torchvision's ImageNet preset.
    ``fit="squash"`` resizes to ``size`` exactly, distorting non-square images (what ``load_image`` did before).

    Args:
        path: an image file (see :func:`read_rgb`).
        size: ``(height, width)`` or an int for a square; ``None`` keeps the file's size.
        mean: per-channel mean for the model input (ImageNet's by default; ``None`` for none).
        std: per-channel standard deviation (with ``mean``).
        fit: ``"crop"`` (keep the aspect ratio, centre-crop) or ``"squash"``.
        resize: with ``fit="crop"``, the shorter side's length before cropping.

    Returns:
        ``(x, rgb)``: the model input [1, 3, H, W] and the same pixels as a uint8 RGB image
        [H, W, 3] to overlay maps on.

    Example:
        >>> import numpy as np, tempfile, os
        >>> from camkit import load_image, save_png
        >>> path = os.path.join(tempfile.mkdtemp(), "a.png")
        >>> save_png(path, np.zeros((8, 16, 3), np.uint8))  # 8 high, 16 wide
        >>> x, rgb = load_image(path, size=4)  # scaled to 4 x 8, then the centre 4 x 4
        >>> tuple(x.shape), rgb.shape
        ((1, 3, 4, 4), (4, 4, 3))
    """
    rgb = read_rgb(path)
    if resize is not None and fit != "crop":
        raise InvalidInputError("resize= applies to fit='crop' only; with fit='squash' give size= alone")
    if size is not None:
        rgb = _fit(rgb, size, fit, resize)
    elif resize is not None:
        raise InvalidInputError("resize= needs size= (the crop); e.g. size=224, resize=256")
    x = to_tensor(rgb, mean=mean, std=std)
    return x[None], rgb


def save_png(path: str | os.PathLike[str], image: Any) -> None:
    """Write an RGB image (anything :func:`camkit.to_uint8_rgb` accepts) as a PNG.

    The file is written under a temporary name and renamed, so it is never left half-written;
    it gets the permissions ``open()`` would give (``0o666`` less the process umask).

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
        os.fchmod(fd, file_mode())  # what open() would give, not mkstemp's private 0o600
        with os.fdopen(fd, "wb") as handle:
            handle.write(buf.tobytes())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
