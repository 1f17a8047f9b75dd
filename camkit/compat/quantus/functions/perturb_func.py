"""Quantus's perturbation functions, computed by camkit, with Quantus's signatures and draws.

camkit's metric classes compute each metric's default perturbation themselves (with Quantus's
keywords and draws), so passing Quantus's default function of a metric as ``perturb_func`` is
the same as leaving it unset. The functions here are camkit's implementations of Quantus's
contract and can be called (the blur, rotation and translations are in
:mod:`.perturb_geometry`); ``noisy_linear_imputation``, ``batched_translation`` and
``perturb_batch`` are markers that a metric recognises as its default and that raise
:class:`~camkit.compat.quantus.NotTranslatedError` when called directly.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._install import NotTranslatedError
from .indices import baseline_values, expand_indices, get_leftover_shape
from .perturb_geometry import baseline_replacement_by_blur, rotation, translation_x_direction, translation_y_direction

# No __all__, as in Quantus: ``from quantus.functions.perturb_func import *`` also gives ``np`` and
# ``Union``, which scripts (and Quantus's own tests) written for Quantus rely on.
Union = typing.Union
_REEXPORTED = (baseline_replacement_by_blur, rotation, translation_x_direction, translation_y_direction)


def batch_baseline_values(value: Any, arr: np.ndarray, shape: tuple[int, ...], **kwargs: Any) -> np.ndarray:
    """Quantus's baseline of each row of ``arr`` [B, F], filled to ``shape`` ([B, ...]).

    A number; ``"black"``, ``"white"``, ``"mean"`` (each row's minimum, maximum, mean);
    ``"uniform"`` (one draw per row between ``uniform_low`` and ``uniform_high``, default 0 and
    1, from numpy's global generator, drawn for every name as Quantus does); or an array of ``shape``.

    Example:
        >>> batch_baseline_values("white", np.array([[1.0, 5.0], [2.0, 3.0]]), (2, 1)).tolist()
        [[5.0], [3.0]]
    """
    if isinstance(value, np.ndarray) and value.ndim > 0:
        if value.shape != tuple(shape):
            raise ValueError(f"a baseline array must have the shape {list(shape)}, got {list(value.shape)}")
        return value
    if isinstance(value, (int, float, np.number)) or (isinstance(value, np.ndarray) and value.ndim == 0):
        return np.full(shape, float(value))
    # Quantus draws the uniform values for every named baseline, used or not: numpy's generator moves the same way
    draws = np.random.uniform(kwargs.get("uniform_low", 0.0), kwargs.get("uniform_high", 1.0), shape[0])
    table: dict[str, Callable[[], np.ndarray]] = {
        "black": lambda: arr.min(axis=1),
        "white": lambda: arr.max(axis=1),
        "mean": lambda: arr.mean(axis=1),
        "uniform": lambda: draws,
    }
    if not isinstance(value, str) or value.lower() not in table:
        raise ValueError(
            f"perturb_baseline must be a number, an array of shape {list(shape)} or one of {sorted(table)}; "
            f"got {value!r} (Quantus 0.6.0 removed 'random': use 'uniform')"
        )
    per_row = table[value.lower()]()
    return np.broadcast_to(per_row.reshape(-1, *(1,) * (len(shape) - 1)), shape).copy()


def batch_baseline_replacement_by_indices(
    arr: np.ndarray, indices: np.ndarray, perturb_baseline: Any, **kwargs: Any
) -> np.ndarray:
    """A copy of ``arr`` [B, F] with each row's ``indices`` [B, I] set to its baseline (see :func:`batch_baseline_values`).

    Example:
        >>> batch_baseline_replacement_by_indices(np.array([[1.0, 2.0, 3.0]]), np.array([[0, 2]]), "mean").tolist()
        [[2.0, 2.0, 2.0]]
    """
    arr, indices = np.asarray(arr), np.asarray(indices)
    if arr.ndim != 2 or indices.ndim != 2:
        raise ValueError(f"arr and indices must be [B, F] and [B, I], got {list(arr.shape)} and {list(indices.shape)}")
    out = arr.copy()
    out[np.arange(arr.shape[0])[:, None], indices] = batch_baseline_values(perturb_baseline, arr, indices.shape, **kwargs)
    return out


def baseline_replacement_by_indices(
    arr: np.ndarray, indices: Any, indexed_axes: Sequence[int], perturb_baseline: Any, **kwargs: Any
) -> np.ndarray:
    """A copy of ``arr`` with ``indices`` over ``indexed_axes`` set to the baseline (Quantus's contract).

    ``indices`` as :func:`~camkit.compat.quantus.functions.indices.expand_indices` takes them; the
    baseline as :func:`~camkit.compat.quantus.functions.indices.baseline_values` makes it, in the
    shape of the axes not indexed (one value per channel with ``indexed_axes=[1, 2]``).

    Example:
        >>> baseline_replacement_by_indices(np.zeros((2, 3)), [1], [1], np.array([7.0, 8.0])).tolist()
        [[0.0, 7.0, 0.0], [0.0, 8.0, 0.0]]
    """
    index = expand_indices(arr, indices, indexed_axes)
    baseline = baseline_values(perturb_baseline, arr, get_leftover_shape(arr, indexed_axes), **kwargs)
    out = arr.copy()
    out[index] = np.expand_dims(baseline, axis=tuple(indexed_axes))
    return out


def baseline_replacement_by_shift(
    arr: np.ndarray, indices: Any, indexed_axes: Sequence[int], input_shift: Any, **kwargs: Any
) -> np.ndarray:
    """A copy of ``arr`` with ``input_shift`` (a baseline, as in :func:`baseline_replacement_by_indices`) added at ``indices``.

    Example:
        >>> baseline_replacement_by_shift(np.ones((1, 3)), [0, 2], [0, 1], -1.0).tolist()
        [[0.0, 1.0, 0.0]]
    """
    index = expand_indices(arr, indices, indexed_axes)
    shift = baseline_values(input_shift, arr, get_leftover_shape(arr, indexed_axes), **kwargs)
    out = arr.copy()
    out[index] = (arr + np.expand_dims(shift, axis=tuple(indexed_axes)).astype(float))[index]
    return out


def baseline_replacement_by_mask(arr: np.ndarray, mask: np.ndarray, perturb_baseline: Any, **kwargs: Any) -> np.ndarray:
    """``arr`` with its values where ``mask`` is true replaced by the baseline (in ``arr``'s shape).

    Example:
        >>> baseline_replacement_by_mask(np.array([1.0, 2.0]), np.array([True, False]), 0.0).tolist()
        [0.0, 2.0]
    """
    if np.shape(arr) != np.shape(mask):
        raise ValueError(f"arr and mask must have one shape, got {np.shape(arr)} and {np.shape(mask)}")
    return np.where(mask, baseline_values(perturb_baseline, arr, tuple(arr.shape), **kwargs), arr)


def _noise_at(arr: np.ndarray, index: Any, noise: np.ndarray) -> np.ndarray:
    out = arr.copy()
    out[index] = (arr + noise)[index]
    return out


def _uniform(lower_bound: float, upper_bound: float | None, shape: tuple[int, ...]) -> np.ndarray:
    if upper_bound is None:
        return np.random.uniform(-lower_bound, lower_bound, size=shape)
    if upper_bound <= lower_bound:
        raise ValueError(f"upper_bound must be larger than lower_bound, got {upper_bound} <= {lower_bound}")
    return np.random.uniform(lower_bound, upper_bound, size=shape)


def gaussian_noise(
    arr: np.ndarray, indices: Any, indexed_axes: Sequence[int], perturb_mean: float = 0.0,
    perturb_std: float = 0.01, **kwargs: Any,
) -> np.ndarray:  # fmt: skip
    """``arr`` plus normal noise (numpy's global generator, one draw per value of ``arr``) at ``indices``.

    Example:
        >>> out = gaussian_noise(np.zeros((1, 4)), [0], [0, 1])
        >>> bool(out[0, 0] != 0 and (out[0, 1:] == 0).all())
        True
    """
    return _noise_at(arr, expand_indices(arr, indices, indexed_axes),
                     np.random.normal(perturb_mean, perturb_std, size=arr.shape))  # fmt: skip


def batch_gaussian_noise(
    arr: np.ndarray, indices: np.ndarray, perturb_mean: float = 0.0, perturb_std: float = 0.01, **kwargs: Any
) -> np.ndarray:
    """:func:`gaussian_noise` on ``arr`` [B, F] at each row's ``indices`` [B, I].

    Example:
        >>> batch_gaussian_noise(np.zeros((2, 3)), np.array([[0], [2]])).nonzero()[1].tolist()
        [0, 2]
    """
    rows = np.arange(arr.shape[0])[:, None]
    return _noise_at(arr, (rows, np.asarray(indices)), np.random.normal(perturb_mean, perturb_std, size=arr.shape))


def uniform_noise(
    arr: np.ndarray, indices: Any, indexed_axes: Sequence[int], lower_bound: float = 0.02,
    upper_bound: float | None = None, **kwargs: Any,
) -> np.ndarray:  # fmt: skip
    """``arr`` plus uniform noise at ``indices``: ``U(-lower_bound, lower_bound)``, or ``U(lower_bound, upper_bound)``.

    Example:
        >>> out = uniform_noise(np.zeros((1, 4)), [1], [0, 1], lower_bound=0.1, upper_bound=0.2)
        >>> bool(0.1 <= out[0, 1] < 0.2 and out[0, 0] == 0)
        True
    """
    return _noise_at(arr, expand_indices(arr, indices, indexed_axes), _uniform(lower_bound, upper_bound, arr.shape))


def batch_uniform_noise(
    arr: np.ndarray, indices: np.ndarray, lower_bound: float = 0.02, upper_bound: float | None = None, **kwargs: Any
) -> np.ndarray:
    """:func:`uniform_noise` on ``arr`` [B, F] at each row's ``indices`` [B, I].

    Example:
        >>> batch_uniform_noise(np.zeros((2, 3)), np.array([[1], [0]])).nonzero()[1].tolist()
        [1, 0]
    """
    rows = np.arange(arr.shape[0])[:, None]
    return _noise_at(arr, (rows, np.asarray(indices)), _uniform(lower_bound, upper_bound, arr.shape))


def no_perturbation(arr: np.ndarray, **kwargs: Any) -> np.ndarray:
    """``arr`` unchanged.

    Example:
        >>> no_perturbation(np.array([1.0])).tolist()
        [1.0]
    """
    return arr


def _marker(name: str, module: str = "perturb_func") -> Callable[..., Any]:
    """A function named as Quantus's ``quantus.functions.<module>.<name>`` that raises when called."""

    def marker(*args: Any, **kwargs: Any) -> Any:
        raise NotTranslatedError(
            f"camkit.compat.quantus does not implement quantus.functions.{module}.{name} as a function"
            + (": a metric whose default it is computes it natively (pass it, or nothing, as perturb_func)"
               if module == "perturb_func" else "")
            + "; call the original Quantus for the function itself"
        )  # fmt: skip

    marker.__name__ = marker.__qualname__ = name
    marker.__doc__ = f"Quantus's ``{name}``: a name only here; raises when called."
    return marker


noisy_linear_imputation = _marker("noisy_linear_imputation")
perturb_batch = _marker("perturb_batch")


def batched_translation(
    arr: np.ndarray, perturb_baseline: Any, perturb_dx: int = 10, direction: str = "x", **kwargs: Any
) -> np.ndarray:
    """A batch of images [B, C, H, W] moved by ``perturb_dx`` positions along W (``"x"``) or H (``"y"``).

    The gap is filled with ``perturb_baseline`` taken per image (:func:`batch_baseline_values`:
    a number, ``"black"``, ``"white"``, ``"mean"``, ``"uniform"`` with one draw per image); a
    positive shift moves the content right (down), a negative one left (up).

    Example:
        >>> batched_translation(np.arange(3.0).reshape(1, 1, 1, 3), 9.0, perturb_dx=1).tolist()
        [[[[9.0, 0.0, 1.0]]]]
    """
    if direction not in ("x", "y"):
        raise ValueError(f"direction must be 'x' or 'y', got {direction!r}")
    arr = np.asarray(arr)
    if arr.ndim != 4:
        raise ValueError(f"batched_translation takes images [B, C, H, W], got an array of shape {list(arr.shape)}")
    axis = 3 if direction == "x" else 2
    fill = batch_baseline_values(perturb_baseline, arr.reshape(arr.shape[0], -1), arr.shape, **kwargs)
    size, shift = arr.shape[axis], int(perturb_dx)
    gap = np.take(fill, np.arange(size - min(abs(shift), size), size), axis=axis)
    joined = np.concatenate([gap, arr] if shift >= 0 else [arr, gap], axis=axis)
    keep = np.arange(size) if shift >= 0 else np.arange(joined.shape[axis] - size, joined.shape[axis])
    return np.take(joined, keep, axis=axis)
