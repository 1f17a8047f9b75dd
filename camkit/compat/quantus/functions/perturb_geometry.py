"""Quantus's blur, rotation and translation perturbations, computed by camkit (numpy and scipy).

Images are channel first, ``[C, H, W]``, as Quantus takes them. Rotations and translations
resample bilinearly (``scipy.ndimage.map_coordinates``), as Quantus's OpenCV calls do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import ndimage

from .indices import baseline_values, expand_indices

__all__ = ["baseline_replacement_by_blur", "rotation", "translation_x_direction", "translation_y_direction"]


def baseline_replacement_by_blur(
    arr: np.ndarray, indices: Any, indexed_axes: Sequence[int], blur_kernel_size: int | Sequence[int] = 15,
    **kwargs: Any,
) -> np.ndarray:  # fmt: skip
    """``arr`` with the values at ``indices`` replaced by the mean of a box around each (zeros outside ``arr``).

    The box spans ``blur_kernel_size`` values along each indexed axis (one size for all, or one per
    axis), ``size // 2`` of them before the position; the other axes are not blurred across.

    Example:
        >>> baseline_replacement_by_blur(np.arange(4.0)[None], [1], [1], blur_kernel_size=3).tolist()
        [[0.0, 1.0, 2.0, 3.0]]
        >>> baseline_replacement_by_blur(np.array([[0.0, 3.0, 6.0]]), [0], [1], blur_kernel_size=3).tolist()
        [[1.0, 3.0, 6.0]]
    """
    axes = sorted(int(a) for a in indexed_axes)
    sizes = [int(k) for k in np.broadcast_to(np.asarray(blur_kernel_size, dtype=int).reshape(-1), (len(axes),))] if (
        np.size(blur_kernel_size) == 1) else [int(k) for k in np.asarray(blur_kernel_size).reshape(-1)]  # fmt: skip
    if len(sizes) != len(axes):
        raise ValueError(f"blur_kernel_size has {len(sizes)} sizes for {len(axes)} indexed axes")
    index = expand_indices(arr, indices, axes)
    points = np.stack(np.broadcast_arrays(*index[axes[0]:]), axis=-1).reshape(-1, len(axes))
    out = arr.copy()
    lead = (slice(None),) * axes[0]
    for point in points:
        window = tuple(
            slice(max(int(p) - k // 2, 0), max(int(p) - k // 2 + k, 0)) for p, k in zip(point, sizes)
        )  # fmt: skip
        total = arr[lead + window].sum(axis=tuple(range(axes[0], axes[0] + len(axes))))
        out[lead + tuple(int(p) for p in point)] = total / np.prod(sizes)
    return out


def _resample(arr: np.ndarray, src_x: np.ndarray, src_y: np.ndarray, fill: float) -> np.ndarray:
    """Each channel of ``arr`` [C, H, W] read at (``src_y``, ``src_x``) [H, W], bilinearly, ``fill`` outside."""
    coords = np.stack([src_y, src_x])
    channels = [ndimage.map_coordinates(np.asarray(c, dtype=float), coords, order=1, mode="grid-constant", cval=fill) for c in arr]
    return np.stack(channels).astype(arr.dtype, copy=False)


def _image(arr: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    if arr.ndim != 3:
        raise ValueError(f"{name} takes one channel-first image [C, H, W], got an array of shape {arr.shape}")
    return np.meshgrid(np.arange(arr.shape[2], dtype=float), np.arange(arr.shape[1], dtype=float))


def rotation(arr: np.ndarray, perturb_angle: float = 10, **kwargs: Any) -> np.ndarray:
    """``arr`` [C, H, W] rotated by ``perturb_angle`` degrees anticlockwise about (W / 2, H / 2), zeros outside.

    Example:
        >>> img = np.zeros((1, 5, 5)); img[0, 2, 4] = 1.0
        >>> np.argwhere(rotation(img, 90.0)[0] > 0.99).tolist()
        [[1, 2]]
    """
    x, y = _image(arr, "rotation")
    cx, cy = arr.shape[2] / 2, arr.shape[1] / 2
    cos, sin = np.cos(np.deg2rad(perturb_angle)), np.sin(np.deg2rad(perturb_angle))
    return _resample(arr, cos * (x - cx) - sin * (y - cy) + cx, sin * (x - cx) + cos * (y - cy) + cy, 0.0)


def _fill(arr: np.ndarray, perturb_baseline: Any, **kwargs: Any) -> float:
    """Quantus's border value of a translation: the first value of the per-channel baseline."""
    return float(np.asarray(baseline_values(perturb_baseline, arr, (arr.shape[0],), **kwargs)).reshape(-1)[0])


def translation_x_direction(arr: np.ndarray, perturb_baseline: Any, perturb_dx: float = 10, **kwargs: Any) -> np.ndarray:
    """``arr`` [C, H, W] moved ``perturb_dx`` pixels along the width, the uncovered part set to the baseline.

    Example:
        >>> translation_x_direction(np.array([[[1.0, 2.0, 3.0]]]), 0.0, perturb_dx=1).tolist()
        [[[0.0, 1.0, 2.0]]]
    """
    x, y = _image(arr, "translation_x_direction")
    return _resample(arr, x - perturb_dx, y, _fill(arr, perturb_baseline, **kwargs))


def translation_y_direction(arr: np.ndarray, perturb_baseline: Any, perturb_dy: float = 10, **kwargs: Any) -> np.ndarray:
    """``arr`` [C, H, W] moved ``perturb_dy`` pixels along the height, the uncovered part set to the baseline.

    Example:
        >>> translation_y_direction(np.array([[[1.0], [2.0]]]), 5.0, perturb_dy=1).tolist()
        [[[5.0], [1.0]]]
    """
    x, y = _image(arr, "translation_y_direction")
    return _resample(arr, x, y - perturb_dy, _fill(arr, perturb_baseline, **kwargs))
