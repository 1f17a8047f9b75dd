"""Quantus's rules for the number of histogram bins of a batch of maps, ``f(a_batch) -> int``.

As in Quantus, ``n`` is the number of axes of one map (``a_batch[0].ndim``), not its size.
"""

from __future__ import annotations

import numpy as np

# No __all__, as in Quantus: a star import of this module also gives ``np``, which scripts
# written for Quantus (and its own tests) rely on.


def _axes(a_batch: np.ndarray) -> int:
    return int(np.asarray(a_batch)[0].ndim)


def freedman_diaconis_rule(a_batch: np.ndarray) -> int:
    """The value range over ``2 IQR / n^(1/3)`` (a width of at least 1e-6).

    Example:
        >>> freedman_diaconis_rule(np.arange(8.0).reshape(2, 4))
        1
    """
    a_batch = np.asarray(a_batch)
    width = max(2 * (np.percentile(a_batch, 75) - np.percentile(a_batch, 25)) / np.power(_axes(a_batch), 1 / 3), 1e-6)
    return int((a_batch.max() - a_batch.min()) / width)


def scotts_rule(a_batch: np.ndarray) -> int:
    """The value range over ``3.5 std / n^(1/3)``.

    Example:
        >>> scotts_rule(np.arange(8.0).reshape(2, 4))
        0
    """
    a_batch = np.asarray(a_batch)
    return int((a_batch.max() - a_batch.min()) / (3.5 * np.std(a_batch) / np.power(_axes(a_batch), 1 / 3)))


def square_root_choice(a_batch: np.ndarray) -> int:
    """``int(sqrt(n))``.

    Example:
        >>> square_root_choice(np.zeros((2, 1, 3, 3)))
        1
    """
    return int(np.sqrt(_axes(a_batch)))


def sturges_formula(a_batch: np.ndarray) -> int:
    """``int(log2(n) + 1)``.

    Example:
        >>> sturges_formula(np.zeros((2, 1, 3, 3)))
        2
    """
    return int(np.log2(_axes(a_batch)) + 1)


def rice_rule(a_batch: np.ndarray) -> int:
    """``int(2 n^(1/3))``.

    Example:
        >>> rice_rule(np.zeros((2, 1, 3, 3)))
        2
    """
    return int(2 * np.power(_axes(a_batch), 1 / 3))
