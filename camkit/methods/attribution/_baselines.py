"""Sets of baselines for the attributions that average over several (GradientShap, DeepLiftShap).

A set is given once, when the explainer is built, and read against each input: the same
tensor [N, C, T] is three signal baselines for a signal batch [B, C, T] and one image
baseline [C, H, W] for an image batch [B, C, H, W], so its meaning is settled by the input's
rank, never guessed from the tensor alone.
"""

from __future__ import annotations

from torch import Tensor

from ..._internal.checks import BATCH_SHAPES, check_broadcasts
from ..._internal.syncs import to_device
from ...errors import InvalidInputError

__all__ = ["baseline_hint", "baselines_for", "check_baselines", "rank_shapes"]


def rank_shapes(x: Tensor, lead: str) -> str:
    """``x``'s batch shape with its first axis called ``lead``: ``"[N, C, T]"`` for a signal and ``"N"``.

    Example:
        >>> import torch
        >>> from camkit.methods.attribution._baselines import rank_shapes
        >>> rank_shapes(torch.zeros(2, 3, 4, 8, 8), "N"), rank_shapes(torch.zeros(2, 3, 16), "1")
        ('[N, C, D, H, W]', '[1, C, T]')
    """
    return BATCH_SHAPES[x.dim()].replace("[B", f"[{lead}", 1)


def baseline_hint(x: Tensor) -> str:
    """What one baseline for the batch ``x`` may be, as an error message's advice.

    Example:
        >>> import torch
        >>> from camkit.methods.attribution._baselines import baseline_hint
        >>> baseline_hint(torch.zeros(2, 3, 16))
        'pass [C, T], [1, C, T] or [B, C, T].'
    """
    one = _axes(x)
    return f"pass [{one}], [1, {one}] or [B, {one}]."


def check_baselines(baselines: object) -> None:
    """Refuse a set of baselines that cannot fit any input rank (called when an explainer is built).

    ``None`` or a non-empty tensor of 2 to 5 dimensions: [C, T] (one signal) up to
    [N, C, D, H, W] (several volumes or videos).

    Example:
        >>> import torch
        >>> from camkit.methods.attribution._baselines import check_baselines
        >>> check_baselines(torch.zeros(4, 3, 16))
        >>> check_baselines(torch.zeros(16))
        Traceback (most recent call last):
        ...
        camkit.errors.InvalidInputError: baselines must be a tensor [N, C, *S] (or one baseline [C, *S]) with the input's spatial axes S (T, H W or D H W), got [16]
    """
    if baselines is None:
        return
    if not isinstance(baselines, Tensor) or baselines.dim() not in (2, 3, 4, 5) or baselines.numel() == 0:
        got = list(baselines.shape) if isinstance(baselines, Tensor) else type(baselines).__name__
        raise InvalidInputError(
            "baselines must be a tensor [N, C, *S] (or one baseline [C, *S]) with the input's spatial axes S "
            f"(T, H W or D H W), got {got}"
        )


def baselines_for(baselines: Tensor | None, x: Tensor) -> Tensor:
    """The set of baselines for the batch ``x`` [B, C, *S]: [N, C, *S] on ``x``'s device and dtype.

    ``baselines`` [N, C, *S] is N baselines and [C, *S] one; channels and spatial sides may be
    1 and broadcast. ``None`` is one all-zero input. Another rank is refused, naming the
    shapes that fit ``x``.

    Example:
        >>> import torch
        >>> from camkit.methods.attribution._baselines import baselines_for
        >>> baselines_for(torch.ones(3, 1, 16), torch.zeros(2, 3, 16)).shape  # three signal baselines
        torch.Size([3, 3, 16])
        >>> baselines_for(torch.ones(3, 1, 16), torch.zeros(2, 3, 1, 16)).shape  # one image baseline
        torch.Size([1, 3, 1, 16])
    """
    if baselines is None:
        return x.new_zeros((1, *x.shape[1:]))
    axes = _axes(x)  # "C, T" for a signal
    if baselines.dim() not in (x.dim(), x.dim() - 1):
        raise InvalidInputError(
            f"the baselines have shape {list(baselines.shape)}, but x is {BATCH_SHAPES[x.dim()]} "
            f"{list(x.shape)}; pass baselines {rank_shapes(x, 'N')} or one baseline [{axes}]"
        )
    bases = to_device(baselines.detach(), x.device, x.dtype)
    if bases.dim() == x.dim() - 1:
        bases = bases.unsqueeze(0)
    check_broadcasts(bases[:1], x, what="input", hint=f"pass baselines {rank_shapes(x, 'N')} with x's {axes}.")
    return bases.expand(bases.shape[0], *x.shape[1:])


def _axes(x: Tensor) -> str:
    """The axes of one input of ``x``'s rank: ``"C, T"``, ``"C, H, W"`` or ``"C, D, H, W"``."""
    return BATCH_SHAPES[x.dim()][len("[B, ") : -1]
