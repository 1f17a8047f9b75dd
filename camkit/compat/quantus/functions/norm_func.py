"""Quantus's norms ``f(a)`` of a 1-D array, or of each row of a 2-D one."""

from __future__ import annotations

import numpy as np

# No __all__, as in Quantus: a star import of this module also gives ``np``, which scripts
# written for Quantus (and its own tests) rely on.


def _check(a: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim not in (1, 2):
        raise ValueError(f"{name} takes a 1-D array or [B, F] rows, got shape {list(a.shape)}")
    return a


def fro_norm(a: np.ndarray) -> np.ndarray:
    """The Euclidean norm of ``a`` (per row for a 2-D ``a``), Quantus's ``fro_norm``.

    Example:
        >>> float(fro_norm(np.array([3.0, 4.0])))
        5.0
    """
    return np.linalg.norm(_check(a, "fro_norm"), axis=-1)


def l2_norm(a: np.ndarray) -> np.ndarray:
    """The Euclidean norm of ``a`` (per row for a 2-D ``a``).

    Example:
        >>> float(l2_norm(np.array([3.0, 4.0])))
        5.0
    """
    return np.linalg.norm(_check(a, "l2_norm"), axis=-1)


def linf_norm(a: np.ndarray) -> np.ndarray:
    """The largest ``|a|`` (per row for a 2-D ``a``).

    Example:
        >>> float(linf_norm(np.array([3.0, -4.0])))
        4.0
    """
    return np.linalg.norm(_check(a, "linf_norm"), ord=np.inf, axis=-1)
