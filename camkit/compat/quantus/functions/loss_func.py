"""Quantus's loss function ``mse(a, b, batched=False, normalise_mse=False)``."""

from __future__ import annotations

from typing import Any

import numpy as np

# No __all__, as in Quantus: a star import of this module also gives ``np``, which scripts
# written for Quantus (and its own tests) rely on.


def mse(a: np.ndarray, b: np.ndarray, batched: bool = False, **kwargs: Any) -> Any:
    """Mean squared error along the last axis (``batched=True``: one value per row) or the first.

    With ``normalise_mse=True`` the mean of ``a^2 - 2ab + b^2`` (the same value, summed
    term by term).

    Example:
        >>> float(mse(np.array([1.0, 3.0]), np.array([0.0, 1.0])))
        2.5
    """
    a, b = np.asarray(a), np.asarray(b)
    axis = -1 if batched else 0
    if kwargs.get("normalise_mse", False):
        return np.average(a**2 - 2 * a * b + b**2, axis=axis)
    return np.average((a - b) ** 2, axis=axis)
