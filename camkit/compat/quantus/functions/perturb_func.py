"""Quantus's perturbation functions: the names, and camkit's own code where camkit has it.

camkit's metric classes compute each metric's default perturbation themselves (with Quantus's
keywords and draws), so passing Quantus's default function of a metric as ``perturb_func`` is
the same as leaving it unset. :func:`batch_baseline_replacement_by_indices` and
:func:`no_perturbation` are camkit's implementations and can be called; every other name is a
marker that a metric recognises as its default and that raises
:class:`~camkit.compat.quantus.NotTranslatedError` when called directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._install import NotTranslatedError

# No __all__, as in Quantus: ``from quantus.functions.perturb_func import *`` also gives ``np``, which
# scripts written for Quantus rely on.


def batch_baseline_values(value: Any, arr: np.ndarray, shape: tuple[int, ...], **kwargs: Any) -> np.ndarray:
    """Quantus's baseline of each row of ``arr`` [B, F], filled to ``shape`` ([B, ...]).

    A number; ``"black"``, ``"white"``, ``"mean"`` (each row's minimum, maximum, mean);
    ``"uniform"`` (one draw per row between ``uniform_low`` and ``uniform_high``, default 0 and
    1, from numpy's global generator); or an array of ``shape``.

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
    table: dict[str, Callable[[], np.ndarray]] = {
        "black": lambda: arr.min(axis=1),
        "white": lambda: arr.max(axis=1),
        "mean": lambda: arr.mean(axis=1),
        "uniform": lambda: np.random.uniform(kwargs.get("uniform_low", 0.0), kwargs.get("uniform_high", 1.0), shape[0]),
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


baseline_replacement_by_blur = _marker("baseline_replacement_by_blur")
baseline_replacement_by_indices = _marker("baseline_replacement_by_indices")
baseline_replacement_by_mask = _marker("baseline_replacement_by_mask")
baseline_replacement_by_shift = _marker("baseline_replacement_by_shift")
batch_gaussian_noise = _marker("batch_gaussian_noise")
batch_uniform_noise = _marker("batch_uniform_noise")
batched_translation = _marker("batched_translation")
gaussian_noise = _marker("gaussian_noise")
noisy_linear_imputation = _marker("noisy_linear_imputation")
perturb_batch = _marker("perturb_batch")
rotation = _marker("rotation")
translation_x_direction = _marker("translation_x_direction")
translation_y_direction = _marker("translation_y_direction")
uniform_noise = _marker("uniform_noise")
