"""Quantus's index and baseline helpers (``quantus.helpers.utils``), the part its perturbations use.

:func:`expand_indices` turns Quantus's ways of naming positions (flat indices into the indexed
axes, slices, arrays per axis) into a numpy index; :func:`baseline_values` is Quantus's
``perturb_baseline`` of one (unbatched) array. After ``install()``, ``quantus.helpers.utils`` holds
these names; every other name read from it raises :class:`~camkit.compat.quantus.NotTranslatedError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["baseline_values", "expand_indices", "get_baseline_value", "get_leftover_shape"]


def _check_axes(arr: np.ndarray, axes: np.ndarray) -> None:
    consecutive = axes.size > 0 and np.array_equal(axes, np.arange(axes[0], axes[0] + axes.size))
    if not consecutive or not (axes[0] == 0 or axes[-1] == arr.ndim - 1) or axes[-1] >= arr.ndim:
        raise ValueError(
            f"indexed_axes must be consecutive axes of the array ({arr.ndim} axes) that include its first or "
            f"last axis, got {axes.tolist()}"
        )


def expand_indices(arr: np.ndarray, indices: Any, indexed_axes: Sequence[int]) -> tuple[Any, ...]:
    """A numpy index of ``arr`` for ``indices`` over ``indexed_axes`` (the axes before them taken whole).

    ``indices`` is an int or a sequence of ints (positions in the flattened indexed axes), or one
    entry per indexed axis: a slice, or an array (arrays with one axis per indexed axis are used as
    they are; others are crossed as a grid).

    Example:
        >>> arr = np.zeros((2, 3, 4))
        >>> arr[expand_indices(arr, [0, 5], [1, 2])] = 1
        >>> np.argwhere(arr[0]).tolist()
        [[0, 0], [1, 1]]
    """
    axes = np.sort(np.asarray(indexed_axes, dtype=int).reshape(-1))
    _check_axes(arr, axes)
    parts: list[Any] = []
    for idx in [indices] if isinstance(indices, (int, np.integer)) else list(indices):
        if isinstance(idx, slice) and idx == slice(None):
            continue
        if isinstance(idx, slice):
            parts.append(np.arange(idx.start or 0, idx.stop, idx.step or 1))
        elif isinstance(idx, np.ndarray):
            parts.append(idx)
        else:
            try:
                parts.append(int(idx))
            except (TypeError, ValueError):
                raise ValueError(f"unsupported index {idx!r}: use ints, slices or arrays") from None
    if parts and all(isinstance(p, int) for p in parts):
        parts = list(np.unravel_index(np.asarray(parts), tuple(arr.shape[a] for a in axes)))
    elif not all(isinstance(p, np.ndarray) and p.ndim == len(parts) for p in parts):
        parts = list(np.ix_(*[np.asarray(p).reshape(-1) for p in parts]))
    if len(parts) != axes.size:
        raise ValueError(f"indices name {len(parts)} axes, indexed_axes {axes.size}")
    parts = [p.reshape((1,) * (len(parts) - p.ndim) + p.shape) for p in parts]
    return (slice(None),) * int(axes[0]) + tuple(parts)


def get_leftover_shape(arr: np.ndarray, axes: Sequence[int]) -> tuple[int, ...]:
    """The shape of ``arr``'s axes that are not in ``axes``.

    Example:
        >>> get_leftover_shape(np.zeros((3, 4, 5)), [1, 2])
        (3,)
    """
    return tuple(n for i, n in enumerate(arr.shape) if i not in set(axes))


def baseline_values(
    value: Any, arr: np.ndarray, return_shape: Any, patch: np.ndarray | None = None, **kwargs: Any
) -> np.ndarray:
    """Quantus's baseline of one array, in ``return_shape``.

    A number; an array (of ``return_shape``, or a 0-d one); ``"black"``, ``"white"``, ``"mean"``
    (the minimum, maximum, mean of all of ``arr``); ``"uniform"`` (independent draws between
    ``uniform_low`` and ``uniform_high``, default 0 and 1, from numpy's global generator); with a
    ``patch``, ``"neighbourhood_mean"`` and ``"neighbourhood_random_min_max"`` (draws between the
    patch's minimum and maximum).

    Example:
        >>> baseline_values("white", np.array([[1.0, 5.0]]), (2,)).tolist()
        [5.0, 5.0]
    """
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        return np.full(return_shape, value)
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return np.full(return_shape, value)
        if value.shape == tuple(np.atleast_1d(return_shape)):
            return value
        raise ValueError(f"a baseline array of shape {value.shape} does not fit the shape {return_shape}")
    if not isinstance(value, str):
        raise ValueError(f"perturb_baseline must be a number, an array or a name, got {type(value).__name__}")
    low, high = kwargs.get("uniform_low", 0.0), kwargs.get("uniform_high", 1.0)
    table: dict[str, Any] = {
        "mean": arr.mean, "black": arr.min, "white": arr.max,
        "uniform": lambda: np.random.uniform(low, high, size=return_shape),
    }  # fmt: skip
    if patch is not None:
        table["neighbourhood_mean"] = patch.mean
        table["neighbourhood_random_min_max"] = lambda: np.random.uniform(patch.min(), patch.max(), size=return_shape)
    name = value.lower()
    if name not in table:
        removed = " (Quantus 0.6.0 removed 'random': use 'uniform')" if name == "random" else ""
        raise ValueError(f"perturb_baseline must be one of {sorted(table)}, got {value!r}{removed}")
    return np.full(return_shape, table[name]())


get_baseline_value = baseline_values

