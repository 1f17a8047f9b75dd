"""What the media runs of ``camkit explain`` and ``camkit audit`` share: a batch explained with a rank
mismatch named as such, the volume size ``--size`` asks for, and the refusal of ``--crop``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from .._internal.checks import RANK_KINDS
from ..errors import InvalidInputError
from .explaining import explain_batch

__all__ = ["explain_media_batch", "refuse_crop", "volume_size"]


def explain_media_batch(ctx: dict[str, Any], x: Tensor, choose: Any) -> Any:
    """:func:`~camkit.runs.explaining.explain_batch`, with a forward that fails on the input's rank named as such (one line)."""
    try:
        return explain_batch(ctx["explainer"], x, choose)
    except RuntimeError as err:
        first = next((m for m in ctx["explainer"].model.modules() if isinstance(m, nn.modules.conv._ConvNd)), None)
        rank = next((n for n in (1, 2, 3) if first is not None and f"{n}d" in type(first).__name__), None)
        if rank is None or rank == x.dim() - 2:
            raise
        raise InvalidInputError(
            f"the model takes {RANK_KINDS[rank]} (its first convolution is a {type(first).__name__}), but this input is "
            f"{RANK_KINDS[x.dim() - 2].split(' [')[0]} {list(x.shape)}; pass a model for them "
            f"(PyTorch: {str(err).splitlines()[0][:120]})"
        ) from None


def refuse_crop(crop: Any) -> None:
    """Refuse ``--crop`` for volumes, videos and signals (it applies to images only); ``None`` passes.

    Example:
        >>> from camkit.runs.media import refuse_crop
        >>> refuse_crop(None)
        >>> refuse_crop(224)
        Traceback (most recent call last):
        ...
        camkit.errors.InvalidInputError: --crop applies to images; volumes keep their size unless --size, videos follow the model's preset
    """
    if crop is not None:
        raise InvalidInputError(
            "--crop applies to images; volumes keep their size unless --size, videos follow the model's preset"
        )


def volume_size(size: Sequence[int] | int | None) -> tuple[int, int, int] | None:
    """The (D, H, W) every volume is resized to for ``--size``: N (a cube) or DxHxW; ``None`` keeps each size.

    Example:
        >>> from camkit.runs.media import volume_size
        >>> volume_size(64), volume_size((32, 32)), volume_size((16, 32, 32)), volume_size(None)
        ((64, 64, 64), (32, 32, 32), (16, 32, 32), None)
    """
    if size is None:
        return None
    values = [int(size)] if isinstance(size, int) else [int(s) for s in size]
    if len(values) == 2 and values[0] == values[1]:
        values = values[:1]  # "--size N" arrives as (N, N)
    if len(values) == 1:
        values = values * 3
    if len(values) != 3 or min(values) < 1:
        raise InvalidInputError(f"--size for volumes is N (a cube) or DxHxW, got {'x'.join(map(str, values))}")
    return values[0], values[1], values[2]
