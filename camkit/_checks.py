"""Input checks shared by the explainers and the metrics (one place for one message)."""

from __future__ import annotations

import torch
from torch import Tensor

from .errors import InvalidInputError

__all__ = ["check_broadcasts", "check_image_batch"]


def check_image_batch(x: object) -> None:
    """Raise :class:`InvalidInputError` unless ``x`` is a floating-point tensor [B, C, H, W].

    Example:
        >>> import torch
        >>> from camkit._checks import check_image_batch
        >>> check_image_batch(torch.zeros(1, 3, 2, 2))
        >>> check_image_batch(torch.zeros(3, 2, 2))
        Traceback (most recent call last):
        ...
        camkit.errors.InvalidInputError: x must be a batch [B, C, H, W], got shape [3, 2, 2] (add a batch dimension with x[None])
    """
    if not isinstance(x, Tensor):
        raise InvalidInputError(f"x must be a tensor [B, C, H, W], got {type(x).__name__}")
    if x.dim() != 4:
        hint = " (add a batch dimension with x[None])" if x.dim() == 3 else ""
        raise InvalidInputError(f"x must be a batch [B, C, H, W], got shape {list(x.shape)}{hint}")
    if not x.is_floating_point():
        raise InvalidInputError(f"x must be a floating-point tensor, got dtype {x.dtype}")


def check_broadcasts(baseline: Tensor, x: Tensor, *, what: str, hint: str) -> None:
    """Raise :class:`InvalidInputError` unless ``baseline`` broadcasts to exactly ``x``'s shape.

    Example:
        >>> import torch
        >>> from camkit._checks import check_broadcasts
        >>> check_broadcasts(torch.zeros(3, 1, 1), torch.zeros(2, 3, 4, 4), what="input", hint="pass [C, H, W]")
    """
    try:
        shape = torch.broadcast_shapes(baseline.shape, x.shape)
    except RuntimeError:
        shape = None
    if shape != x.shape:
        raise InvalidInputError(
            f"the baseline has shape {list(baseline.shape)}, which does not broadcast to the {what} "
            f"{list(x.shape)}; {hint}"
        )
