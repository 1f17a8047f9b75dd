"""numpy arrays in, tensors out, as pytorch-grad-cam's numpy functions take them."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["as_tensor"]


def as_tensor(array: np.ndarray) -> Tensor:
    """A float32 tensor copy of ``array`` with NaNs as zeros (the caller's array is left alone)."""
    return torch.nan_to_num(torch.as_tensor(np.array(array, dtype=np.float32, copy=True)), nan=0.0)
