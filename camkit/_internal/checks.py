"""Input checks shared by the explainers and the metrics (one place for one message)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InvalidInputError
from . import syncs as _syncs

__all__ = ["check_broadcasts", "check_finite", "check_image_batch"]


def check_image_batch(x: object) -> None:
    """Raise :class:`InvalidInputError` unless ``x`` is a floating-point tensor [B, C, H, W].

    Example:
        >>> import torch
        >>> from camkit._internal.checks import check_image_batch
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
        >>> from camkit._internal.checks import check_broadcasts
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


def check_finite(x: Tensor, *, what: str = "x") -> None:
    """Raise :class:`InvalidInputError` naming the samples of a CPU batch that hold NaN or Inf.

    Only CPU tensors are checked here: reading a device tensor's values would make the host
    wait for the device on every call. On an accelerator the explainers give those samples
    NaN maps instead (see :func:`camkit.methods.base.make_explanation`); call
    ``torch.isfinite(x).all()`` yourself where one sync per batch is acceptable.

    Example:
        >>> import torch
        >>> from camkit._internal.checks import check_finite
        >>> x = torch.zeros(3, 1, 2, 2); x[2, 0, 1, 1] = float("nan")
        >>> check_finite(x)
        Traceback (most recent call last):
        ...
        camkit.errors.InvalidInputError: x holds NaN or Inf values in sample(s) [2] of 3; clean or drop those images first (a division by a zero std in preprocessing?)
    """
    if x.numel() == 0 or not _syncs.reads_are_free(x):
        return
    finite = torch.isfinite(x).flatten(1).all(dim=1)
    if bool(finite.all()):
        return
    bad = (~finite).nonzero().flatten().tolist()
    shown = bad if len(bad) <= 10 else [*bad[:10], "..."]
    raise InvalidInputError(
        f"{what} holds NaN or Inf values in sample(s) {shown} of {x.shape[0]}; clean or drop those images "
        "first (a division by a zero std in preprocessing?)"
    )
