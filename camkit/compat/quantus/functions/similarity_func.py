"""Quantus's similarity functions ``f(a, b, batched=False, **kwargs)`` on numpy arrays.

Quantus calls them on flattened maps: one map per argument (1-D), or with ``batched=True`` one
row per sample ([B, F]) and one value per row back. :func:`call_batched` is that call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, List, Union  # noqa: F401, UP035  (List, Union: a star import gives them, as Quantus's)

import numpy as np
from scipy import spatial, stats

# No __all__, as in Quantus: a star import of this module also gives ``np``, which scripts
# written for Quantus (and its own tests) rely on.


def _rows(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"batched=True needs [B, F] rows, got {list(a.shape)} and {list(b.shape)}")
    return a, b


def _per_row(func: Callable[[np.ndarray, np.ndarray], Any], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = _rows(a, b)
    return np.array([func(p, q) for p, q in zip(a, b)], dtype=float)


def correlation_spearman(a: np.ndarray, b: np.ndarray, batched: bool = False, **kwargs: Any) -> Any:
    """Spearman's rank correlation of ``a`` and ``b`` (per row with ``batched=True``).

    Example:
        >>> float(correlation_spearman(np.array([1.0, 2.0, 3.0]), np.array([1.0, 5.0, 9.0])))
        1.0
    """
    if batched:
        return _per_row(lambda p, q: stats.spearmanr(p, q)[0], a, b)
    return stats.spearmanr(a, b)[0]


def correlation_pearson(a: np.ndarray, b: np.ndarray, batched: bool = False, **kwargs: Any) -> Any:
    """Pearson's correlation of ``a`` and ``b`` (per row with ``batched=True``).

    Example:
        >>> round(float(correlation_pearson(np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0, 6.0]))), 6)
        1.0
    """
    if batched:
        return _per_row(lambda p, q: stats.pearsonr(p, q)[0], a, b)
    return stats.pearsonr(a, b)[0]


def correlation_kendall_tau(a: np.ndarray, b: np.ndarray, batched: bool = False, **kwargs: Any) -> Any:
    """Kendall's tau of ``a`` and ``b`` (per row with ``batched=True``).

    Example:
        >>> float(correlation_kendall_tau(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0])))
        -1.0
    """
    if batched:
        return _per_row(lambda p, q: stats.kendalltau(p, q)[0], a, b)
    return stats.kendalltau(a, b)[0]


def distance_euclidean(a: np.ndarray, b: np.ndarray, **kwargs: Any) -> Any:
    """Euclidean distance along the last axis.

    Example:
        >>> float(distance_euclidean(np.array([0.0, 3.0]), np.array([4.0, 0.0])))
        5.0
    """
    return np.sqrt(((np.asarray(a) - np.asarray(b)) ** 2).sum(axis=-1))


def distance_manhattan(a: np.ndarray, b: np.ndarray, **kwargs: Any) -> Any:
    """Manhattan (L1) distance along the last axis.

    Example:
        >>> float(distance_manhattan(np.array([0.0, 3.0]), np.array([4.0, 0.0])))
        7.0
    """
    return np.abs(np.asarray(a) - np.asarray(b)).sum(axis=-1)


def distance_chebyshev(a: np.ndarray, b: np.ndarray, **kwargs: Any) -> float:
    """Chebyshev (L-infinity) distance of two 1-D arrays.

    Example:
        >>> float(distance_chebyshev(np.array([0.0, 3.0]), np.array([4.0, 0.0])))
        4.0
    """
    return float(spatial.distance.chebyshev(a, b))


def lipschitz_constant(a: np.ndarray, b: np.ndarray, c: np.ndarray | None, d: np.ndarray | None, **kwargs: Any) -> Any:
    """``norm_numerator(a, b) / (norm_denominator(c, d) + 1e-10)`` (Manhattan over Euclidean by default).

    Example:
        >>> round(float(lipschitz_constant(np.array([1.0, 1.0]), np.zeros(2), np.array([3.0, 4.0]), np.zeros(2))), 6)
        0.4
    """
    numerator = kwargs.get("norm_numerator", distance_manhattan)
    denominator = kwargs.get("norm_denominator", distance_euclidean)
    if np.shape(a) == ():
        return abs(a - b) / (denominator(c, d) + 1e-10)
    return numerator(a, b) / (denominator(a=c, b=d) + 1e-10)


def abs_difference(a: np.ndarray, b: np.ndarray, **kwargs: Any) -> float:
    """Mean absolute difference.

    Example:
        >>> float(abs_difference(np.array([1.0, 3.0]), np.array([2.0, 1.0])))
        1.5
    """
    return float(np.mean(np.abs(np.asarray(a) - np.asarray(b))))


def squared_difference(a: np.ndarray, b: np.ndarray, **kwargs: Any) -> float:
    """Sum of squared differences.

    Example:
        >>> float(squared_difference(np.array([1.0, 3.0]), np.array([2.0, 1.0])))
        5.0
    """
    return float(np.sum((np.asarray(a) - np.asarray(b)) ** 2))


def cosine(a: np.ndarray, b: np.ndarray, **kwargs: Any) -> float:
    """Cosine distance (one minus the cosine similarity) of two 1-D arrays.

    Example:
        >>> float(cosine(np.array([1.0, 0.0]), np.array([0.0, 1.0])))
        1.0
    """
    return float(spatial.distance.cosine(a, b))


def ssim(a: np.ndarray, b: np.ndarray, batched: bool = False, **kwargs: Any) -> Any:
    """Structural similarity with the pair's value range (per row with ``batched=True``; ``win_size`` passed on).

    Example:
        >>> float(ssim(np.arange(49.0).reshape(7, 7), np.arange(49.0).reshape(7, 7)))
        1.0
    """
    from skimage.metrics import structural_similarity

    def one(p: np.ndarray, q: np.ndarray) -> float:
        span = float(np.abs(max(p.max(), q.max()) - min(p.min(), q.min())))
        return float(structural_similarity(p, q, win_size=kwargs.get("win_size"), data_range=span))

    if batched:
        return [one(np.asarray(p), np.asarray(q)) for p, q in zip(a, b)]
    return one(np.asarray(a), np.asarray(b))


def difference(a: np.ndarray, b: np.ndarray, **kwargs: Any) -> np.ndarray:
    """``a - b``.

    Example:
        >>> difference(np.array([3.0]), np.array([1.0])).tolist()
        [2.0]
    """
    return np.asarray(a) - np.asarray(b)


def call_batched(func: Callable[..., Any], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``func(a, b, batched=True)`` on the maps flattened to rows [B, F], as Quantus calls a similarity; [B] floats.

    Example:
        >>> call_batched(correlation_spearman, np.ones((2, 1, 2, 2)) * [1, 2], np.ones((2, 1, 2, 2)) * [1, 3]).tolist()
        [1.0, 1.0]
    """
    a, b = np.asarray(a), np.asarray(b)
    values = func(a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1), batched=True)
    return np.asarray(values, dtype=float).reshape(a.shape[0])
