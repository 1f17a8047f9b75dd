"""Quantus's normalisation functions ``f(a, normalise_axes=None)`` on numpy arrays (all axes by default)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# No __all__, as in Quantus: a star import of this module also gives ``np``, which scripts
# written for Quantus (and its own tests) rely on.


def _axes(a: np.ndarray, normalise_axes: Sequence[int] | None) -> tuple[int, ...]:
    return tuple(range(np.ndim(a))) if normalise_axes is None else tuple(normalise_axes)


def normalise_by_max(a: np.ndarray, normalise_axes: Sequence[int] | None = None) -> np.ndarray:
    """``a / max |a|`` over ``normalise_axes``; an all-zero ``a`` is returned as it is.

    Example:
        >>> normalise_by_max(np.array([1.0, -4.0, 2.0])).tolist()
        [0.25, -1.0, 0.5]
    """
    if np.all(a == 0.0):
        return a
    return np.divide(a, np.max(np.abs(a), axis=_axes(a, normalise_axes), keepdims=True))


def normalise_by_negative(a: np.ndarray, normalise_axes: Sequence[int] | None = None) -> np.ndarray:
    """Positive values divided by the maximum, negative values by ``|minimum|`` (so the range is [-1, 1]).

    Example:
        >>> normalise_by_negative(np.array([2.0, -4.0, 1.0])).tolist()
        [1.0, -1.0, 0.5]
    """
    if np.all(a == 0.0):
        return a
    axes = _axes(a, normalise_axes)
    top = np.max(a, axis=axes, keepdims=True)
    bottom = np.min(a, axis=axes, keepdims=True)
    positive = np.divide(a, top, out=np.zeros(np.shape(a)), where=(top != 0) & (a > 0))
    negative = np.divide(a, -bottom, out=np.zeros(np.shape(a)), where=(bottom != 0) & (a < 0))
    return (positive + negative).astype(np.asarray(a).dtype, copy=False)


def normalise_by_average_second_moment_estimate(a: np.ndarray, normalise_axes: Sequence[int] | None = None) -> np.ndarray:
    """``a`` divided by the root of its mean square over ``normalise_axes`` (left as it is where that is 0).

    Example:
        >>> normalise_by_average_second_moment_estimate(np.array([3.0, -3.0])).tolist()
        [1.0, -1.0]
    """
    if np.all(a == 0.0):
        return a
    axes = _axes(a, normalise_axes)
    root = np.sqrt(np.mean(np.asarray(a) ** 2, axis=axes, keepdims=True))
    return np.asarray(np.divide(a, root, out=np.array(a, dtype=float, copy=True), where=root != 0))


def denormalise(a: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Undo a per-channel ``(x - mean) / std`` of a [C, H, W] image.

    Example:
        >>> denormalise(np.zeros((1, 1, 1)), np.array([0.5]), np.array([2.0])).tolist()
        [[[0.5]]]
    """
    return np.asarray(a) * np.asarray(std).reshape(-1, 1, 1) + np.asarray(mean).reshape(-1, 1, 1)
