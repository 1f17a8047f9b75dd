"""Quantus's complexity functions ``f(a, x, **kwargs) -> float`` of one map ``a`` of the input ``x``."""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

# No __all__, as in Quantus: a star import of this module also gives ``np``, which scripts
# written for Quantus (and its own tests) rely on.


def _flat(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    size = int(np.prod(x.shape if x.ndim == 1 else x.shape[1:]))
    return np.reshape(np.asarray(a), size).astype(np.float64)


def entropy(a: np.ndarray, x: np.ndarray, **kwargs: Any) -> float:
    """The Shannon entropy of ``|a|`` read as a distribution over the input's features (``a`` non-negative).

    Example:
        >>> round(float(entropy(np.ones(4), np.ones(4))), 6) == round(float(np.log(4)), 6)
        True
    """
    flat = _flat(a, x)
    if (flat < 0).any():
        raise ValueError("entropy needs non-negative values: pass abs=True or |a|")
    return float(stats.entropy(pk=flat / np.abs(flat).sum()))


def gini_coeffiient(a: np.ndarray, x: np.ndarray, **kwargs: Any) -> float:
    """The Gini coefficient of ``a`` (plus 1e-7 so an all-zero map is defined), Quantus's spelling.

    Example:
        >>> round(gini_coeffiient(np.array([0.0, 0.0, 0.0, 1.0]), np.ones(4)), 4)
        0.75
    """
    flat = np.sort(_flat(a, x) + 1e-7)
    n = flat.shape[0]
    return float(np.sum((2 * np.arange(1, n + 1) - n - 1) * flat) / (n * flat.sum()))


def discrete_entropy(a: np.ndarray, x: np.ndarray, **kwargs: Any) -> float:
    """The entropy of the histogram of ``a`` over ``n_bins`` bins (default 100).

    Example:
        >>> round(float(discrete_entropy(np.array([0.0, 1.0]), np.ones(2), n_bins=2)), 6) == round(float(np.log(2)), 6)
        True
    """
    counts, _ = np.histogram(np.asarray(a), bins=kwargs.get("n_bins", 100))
    return float(stats.entropy(pk=counts))
