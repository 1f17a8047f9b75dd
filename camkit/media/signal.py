"""Signals from ``.npy`` files: ECG leads, audio channels, sensor axes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import InvalidInputError

__all__ = ["read_signal"]


def read_signal(path: str | os.PathLike[str]) -> np.ndarray:
    """Read a signal saved with ``numpy.save`` as float32 [C, T].

    A 1-D array is one channel ``[1, T]``; a 2-D array is ``[C, T]`` (channels first, as
    ``Conv1d`` takes them). Pickled object arrays are never loaded.

    Example:
        >>> import os, tempfile, numpy as np
        >>> from camkit.media import read_signal
        >>> path = os.path.join(tempfile.mkdtemp(), "ecg.npy")
        >>> np.save(path, np.zeros(500))
        >>> read_signal(path).shape
        (1, 500)
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"no signal file at {path}")
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise InvalidInputError(f"{path.name} could not be read as a .npy array ({err})") from None
    if not isinstance(array, np.ndarray) or not np.issubdtype(array.dtype, np.number):
        raise InvalidInputError(f"{path.name} holds {getattr(array, 'dtype', type(array).__name__)}, not numbers")
    if array.ndim == 1:
        array = array[None]
    if array.ndim != 2 or array.shape[1] == 0:
        raise InvalidInputError(f"{path.name} has shape {list(array.shape)}; a signal is [T] or [C, T]")
    return np.ascontiguousarray(array, dtype=np.float32)
