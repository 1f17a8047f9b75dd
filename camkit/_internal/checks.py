"""Input checks shared by the explainers, the targets and the metrics (one place for one message)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError, InvalidTargetError
from . import syncs as _syncs

__all__ = [
    "ANY_BATCH", "BATCH_SHAPES", "RANK_KINDS", "check_broadcasts", "check_finite", "check_input_batch", "check_logits",
    "check_model_takes", "first_convolution", "per_sample",
]  # fmt: skip


#: What an input batch may be, by its number of dimensions.
BATCH_SHAPES = {3: "[B, C, T]", 4: "[B, C, H, W]", 5: "[B, C, D, H, W]"}
ANY_BATCH = "[B, C, T] (a signal), [B, C, H, W] (an image) or [B, C, D, H, W] (a volume or a video)"


def check_input_batch(x: object) -> None:
    """Raise :class:`InvalidInputError` unless ``x`` is a floating-point batch [B, C, *S] with 1 to 3 spatial axes.

    Example:
        >>> import torch
        >>> from camkit._internal.checks import check_input_batch
        >>> check_input_batch(torch.zeros(1, 3, 2, 2))
        >>> check_input_batch(torch.zeros(2, 1, 16))       # a batch of two one-channel signals
        >>> check_input_batch(torch.zeros(16))
        Traceback (most recent call last):
        ...
        camkit.errors.InvalidInputError: x must be a batch [B, C, T] (a signal), [B, C, H, W] (an image) or [B, C, D, H, W] (a volume or a video), got shape [16] (a single signal? add the batch and channel dimensions with x[None, None])
    """
    if not isinstance(x, Tensor):
        raise InvalidInputError(f"x must be a tensor {ANY_BATCH}, got {type(x).__name__}")
    if x.dim() not in BATCH_SHAPES:
        hint = ""
        if x.dim() == 1:
            hint = " (a single signal? add the batch and channel dimensions with x[None, None])"
        elif x.dim() == 2:
            hint = " (a batch of one-channel signals [B, T]? add the channel dimension with x[:, None])"
        elif x.dim() == 6:
            hint = " (a batch of volumes has one channel axis and three spatial axes at most)"
        raise InvalidInputError(f"x must be a batch {ANY_BATCH}, got shape {list(x.shape)}{hint}")
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
    NaN maps instead (see :func:`camkit.methods._core.output.make_explanation`); call
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
    if math.isfinite(x.sum().item()):  # one reduction: a NaN or an infinity in x would carry into the sum
        return
    finite = torch.isfinite(x).flatten(1).all(dim=1)  # the sum overflowed, or some values are not finite
    if bool(finite.all()):
        return
    bad = (~finite).nonzero().flatten().tolist()
    shown = bad if len(bad) <= 10 else [*bad[:10], "..."]
    raise InvalidInputError(
        f"{what} holds NaN or Inf values in sample(s) {shown} of {x.shape[0]}; clean or drop those images "
        "first (a division by a zero std in preprocessing?)"
    )


def check_logits(output: object, message: str) -> Tensor:
    """``output`` if it is a classifier's logits [B, classes]; else :class:`InvalidInputError` with ``message``.

    ``message`` is the caller's own wording; ``{got}`` in it becomes what arrived: a shape, or a type name.

    Example:
        >>> import torch
        >>> from camkit._internal.checks import check_logits
        >>> check_logits(torch.zeros(2, 3), "want [B, classes], got {got}").shape
        torch.Size([2, 3])
        >>> check_logits((torch.zeros(2, 3),), "want [B, classes], got {got}")
        Traceback (most recent call last):
        ...
        camkit.errors.InvalidInputError: want [B, classes], got tuple
    """
    if not isinstance(output, Tensor) or output.dim() != 2:
        got = list(output.shape) if isinstance(output, Tensor) else type(output).__name__
        raise InvalidInputError(message.format(got=got))
    return output


_RANKED = (nn.modules.conv._ConvNd, nn.modules.batchnorm._NormBase)
#: The inputs of each number of spatial axes, as messages name them.
RANK_KINDS = {1: "signals [B, C, T]", 2: "images [B, C, H, W]", 3: "volumes or videos [B, C, D, H, W]"}


def _rank_of(module: nn.Module) -> int | None:
    # The spatial rank a convolution or a batch/instance norm takes, from its class name.
    name = type(module).__name__
    for n in (1, 2, 3):
        if f"{n}d" in name:
            return n
    return None


_FIND: Any = object()


def check_model_takes(model: nn.Module, x: Tensor, *, first: Any = _FIND) -> None:
    """Raise :class:`InvalidInputError` when the model's first convolution cannot take ``x``'s rank or channels.

    The first convolution in registration order (a stem, a patch embedding) is the evidence.
    A batch of *fewer* spatial axes than it takes is refused: PyTorch would read a [3, 224, 224]
    image given to a ``Conv2d`` model as a batch of one unbatched image and score the wrong
    thing. More axes are allowed (a video model may run a ``Conv2d`` on each frame). With the
    rank equal, the channel count must match. A model without a convolution is not judged.
    ``first``: the model's :func:`first_convolution` when the caller keeps it (else it is looked up).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from camkit._internal.checks import check_model_takes
        >>> check_model_takes(nn.Sequential(nn.Conv3d(1, 4, 3)), torch.zeros(2, 1, 8, 8, 8))
        >>> check_model_takes(nn.Sequential(nn.Conv2d(3, 4, 3)), torch.zeros(3, 8, 8))
        Traceback (most recent call last):
        ...
        camkit.errors.InvalidInputError: the model takes images [B, C, H, W] (its first convolution '0' is a Conv2d), but x is [3, 8, 8], signals [B, C, T] (an unbatched image? add a batch dimension with x[None]); pass a batch of that rank
    """
    found = first_convolution(model) if first is _FIND else first
    if found is None:
        return
    name, module = found
    rank = _rank_of(module)
    if rank is not None:
        _check_takes(name, module, rank, x)


def _check_takes(name: str, module: nn.Module, rank: int, x: Tensor) -> None:
    if rank > x.dim() - 2:
        hint = " (an unbatched image? add a batch dimension with x[None])" if x.dim() == 3 and rank == 2 else ""
        raise InvalidInputError(
            f"the model takes {RANK_KINDS[rank]} (its first convolution '{name}' is a {type(module).__name__}), "
            f"but x is {list(x.shape)}, {RANK_KINDS.get(x.dim() - 2, 'of no supported rank')}{hint}; pass a batch "
            "of that rank"
        )
    lazy = isinstance(module, nn.modules.lazy.LazyModuleMixin)
    if rank == x.dim() - 2 and not lazy and module.in_channels != x.shape[1]:
        raise InvalidInputError(
            f"the model's first convolution '{name}' ({type(module).__name__}) takes {module.in_channels} "
            f"channel(s), but x has {x.shape[1]} (shape {list(x.shape)}); convert the input (a grayscale scan "
            "for an RGB model: x.expand(-1, 3, ...)) or pass the model that takes it"
        )


def first_convolution(model: nn.Module) -> tuple[str, nn.Module] | None:
    """The model's first convolution in registration order, with its dotted name; ``None`` when it has none.

    Example:
        >>> from torch import nn
        >>> from camkit._internal.checks import first_convolution
        >>> first_convolution(nn.Sequential(nn.ReLU(), nn.Conv1d(1, 2, 3)))[0]
        '1'
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.conv._ConvNd):
            return name, module
    return None


def per_sample(value: int | Sequence[int] | Tensor, batch: int, device: torch.device, name: str) -> Tensor:
    """``value`` as a LongTensor [B]: one int for every sample, or one per sample (checked)."""
    index = torch.as_tensor(value, device=device)
    if index.is_floating_point() or index.dtype == torch.bool:
        raise InvalidTargetError(f"{name} must be integers, got dtype {index.dtype}")
    if index.dim() == 0:
        return index.long().expand(batch)
    if index.dim() != 1 or index.shape[0] != batch:
        raise InvalidTargetError(f"{name} must be one int or {batch} ints (one per sample), got shape {list(index.shape)}")
    return index.long()
