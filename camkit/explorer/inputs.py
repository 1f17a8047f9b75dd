"""What the explorer takes in: images in any form, and the settings each registered method offers."""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..errors import InvalidInputError
from ..io import read_rgb
from ..registry import get_method

IMAGE_BUTTONS: tuple[Literal["download", "fullscreen"], ...] = ("download", "fullscreen")
"""The corner buttons of every picture in the app: no "share" (it posts to Hugging Face; nothing leaves the machine)."""

__all__ = ["image_hash", "method_settings", "read_image"]

# Constructor arguments that are plumbing (where to look, how to batch), not settings of the method.
_PLUMBING = frozenset({
    "self", "model", "layer", "layers", "call", "output", "keep_mode", "reshape", "input_index", "progress",
    "generator", "batch_size", "max_batch",
    # how a map is computed, not what it shows (equal maps either way)
    "compile", "path", "max_memory",
})  # fmt: skip
_SIMPLE = (bool, int, float, str, type(None))


def method_settings(method: str) -> dict[str, Any]:
    """The settings of a registered method that the explorer offers, with their defaults.

    Those constructor arguments whose defaults are plain values (numbers, booleans, strings,
    ``None``); the layer, the batch sizes and other plumbing are left out.

    Example:
        >>> from camkit.explorer.inputs import method_settings
        >>> method_settings("gradcam"), method_settings("integratedgradients")["steps"]
        ({'eigen_smooth': False}, 50)
    """
    cls = get_method(method)
    found: dict[str, Any] = {}
    for name, param in inspect.signature(cls.__init__).parameters.items():
        if name in _PLUMBING or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.default is not param.empty and isinstance(param.default, _SIMPLE):
            found[name] = param.default
    return found


def read_image(image: Any) -> np.ndarray:
    """A file path, PIL image or uint8 array [H, W] / [H, W, 3] / [H, W, 4] as uint8 RGB [H, W, 3] (a new array).

    Example:
        >>> import numpy as np
        >>> from camkit.explorer.inputs import read_image
        >>> read_image(np.zeros((2, 3), np.uint8)).shape
        (2, 3, 3)
    """
    if isinstance(image, (str, Path)):
        return read_rgb(image)
    if hasattr(image, "convert") and hasattr(image, "size"):  # a PIL image
        return np.array(image.convert("RGB"), dtype=np.uint8)
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            raise InvalidInputError(f"image arrays must be uint8 [H, W, 3]; got {image.dtype.name}; convert it first")
        if image.ndim == 2:
            return np.repeat(image[:, :, None], 3, axis=2)
        if image.ndim == 3 and image.shape[2] in (3, 4) and min(image.shape[:2]) > 0:
            return np.array(image[:, :, :3])
        raise InvalidInputError(f"image arrays must be [H, W] or [H, W, 3]; got {list(image.shape)}")
    raise InvalidInputError(
        f"expected an image file path, a PIL image or a uint8 array; got {type(image).__name__}"
    )


def image_hash(rgb: np.ndarray) -> str:
    """SHA-256 of an image's shape and pixels: the cache key of its explanations."""
    digest = hashlib.sha256(f"{rgb.shape}".encode())
    digest.update(np.ascontiguousarray(rgb).tobytes())
    return digest.hexdigest()
