"""Quantus's discretisations ``f(a, **kwargs) -> int``: a hash of a coarse copy of the map, equal maps equal hashes."""

from __future__ import annotations

from typing import Any

import numpy as np

# No __all__, as in Quantus: a star import of this module also gives ``np``, which scripts
# written for Quantus (and its own tests) rely on.


def floating_points(a: np.ndarray, **kwargs: Any) -> int:
    """The hash of ``a`` rounded to ``n`` decimals (default 2).

    Example:
        >>> floating_points(np.array([0.111, 0.2])) == floating_points(np.array([0.109, 0.2]))
        True
    """
    return hash(bytes(np.asarray(a).round(decimals=kwargs.get("n", 2))))


def sign(a: np.ndarray, **kwargs: Any) -> int:
    """The hash of the signs of ``a``.

    Example:
        >>> sign(np.array([0.5, -2.0])) == sign(np.array([3.0, -0.1]))
        True
    """
    return hash(bytes(np.sign(np.asarray(a))))


def top_n_sign(a: np.ndarray, **kwargs: Any) -> int:
    """The hash of the signs of the first ``n`` entries (default 5) of ``a``.

    Example:
        >>> top_n_sign(np.array([1.0, -1.0, 5.0]), n=2) == top_n_sign(np.array([2.0, -3.0, -5.0]), n=2)
        True
    """
    return hash(bytes(np.sign(np.asarray(a))[: kwargs.get("n", 5)]))


def rank(a: np.ndarray, **kwargs: Any) -> int:
    """The hash of the order of ``a``'s entries, largest first.

    Example:
        >>> rank(np.array([1.0, 3.0, 2.0])) == rank(np.array([0.0, 9.0, 5.0]))
        True
    """
    return hash(bytes(np.argsort(np.asarray(a))[::-1]))
