"""Tokens read by the model's own :class:`~camkit.layers.families.rule.TokenLayout`, not inferred.

Inference from a token count alone (:func:`camkit.functional.infer_token_grid`) cannot tell
``8 x 7 x 7`` from ``2 x 14 x 14`` (392 tokens of a 16x112x112 clip), and reads tokens in
row-major order. A model's configuration settles both: a tubelet and patch size give the grid,
and a token order says how the tokens run over it (Hugging Face's TimeSformer runs patch by
patch, each patch's frames in a row). :func:`layout_grid` finds where ``N`` tokens lie under a
layout; :func:`layout_to_grid` lays them out channel-first ``[B, D, *grid]``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from torch import Tensor

from ..errors import InvalidInputError
from ..functional.tokens import infer_token_grid, tokens_to_grid
from .families.rule import TokenLayout

__all__ = ["TokenLayout", "layout_grid", "layout_to_grid"]


def _fixed_sides(size: tuple[int, ...], strides: tuple[int | None, ...]) -> Iterator[tuple[int | None, ...]]:
    # Each fixed axis's side rounded down or up (a convolution's padding may round either way);
    # a free axis is None.
    options = [
        sorted({side // stride, -(-side // stride)} - {0}) if stride else [None]
        for side, stride in zip(size, strides)
    ]
    return itertools.product(*options)


def layout_grid(count: int, size: tuple[int, ...], layout: TokenLayout) -> tuple[int, tuple[int, ...]] | None:
    """``(prefix, grid)`` of ``count`` tokens of an input of spatial size ``size`` under ``layout``, or ``None``.

    The layout's prefix count is tried first, then none (a layer without the class token);
    a fixed axis's side is the input's divided by its stride, rounded down or up; free axes
    are inferred from what remains (:func:`camkit.functional.infer_token_grid` on those axes
    alone). ``None`` when the tokens fit no such grid (another stage, another rank).

    Example:
        >>> from camkit.layers.token_layout import TokenLayout, layout_grid
        >>> layout_grid(392, (16, 112, 112), TokenLayout(prefix=0, strides=(2, 16, 16)))
        (0, (8, 7, 7))
        >>> layout_grid(1 + 392, (16, 224, 224), TokenLayout(prefix=1, strides=(2, None, None)))
        (1, (8, 7, 7))
        >>> layout_grid(100, (16, 112, 112), TokenLayout(prefix=0, strides=(2, 16, 16))) is None
        True
    """
    if len(layout.strides) != len(size) or any(s is not None and s < 1 for s in layout.strides):
        return None
    for prefix in dict.fromkeys(p for p in (layout.prefix, 0) if p is not None):
        rest = count - prefix
        if rest < 1:
            continue
        for sides in _fixed_sides(size, layout.strides):
            fixed = math.prod(s for s in sides if s is not None)
            free = [axis for axis, side in enumerate(sides) if side is None]
            if rest % fixed:
                continue
            if not free:
                if rest == fixed:
                    return prefix, tuple(int(s) for s in sides if s is not None)
                continue
            try:
                _, *found = infer_token_grid(rest // fixed, tuple(size[axis] for axis in free), prefix=0)
            except InvalidInputError:
                continue
            grid = list(sides)
            for axis, side in zip(free, found):
                grid[axis] = side
            return prefix, tuple(int(s) for s in grid if s is not None)
    return None


def layout_to_grid(tokens: Tensor, prefix: int, grid: tuple[int, ...], order: tuple[int, ...] | None) -> Tensor:
    """Tokens ``[B, N, D]`` that run over ``grid``'s axes in ``order`` (slowest first) to ``[B, D, *grid]``.

    ``order=None`` is row-major. A new contiguous tensor; ``tokens`` is not modified.

    Example:
        >>> import torch
        >>> from camkit.layers.token_layout import layout_to_grid
        >>> t = torch.arange(6.0).view(1, 6, 1)  # 2 frames x 3 patches, each patch's frames in a row
        >>> layout_to_grid(t, 0, (2, 1, 3), (1, 2, 0))[0, 0, :, 0]  # frame 0: tokens 0, 2, 4
        tensor([[0., 2., 4.],
                [1., 3., 5.]])
    """
    order = tuple(range(len(grid))) if order is None else tuple(order)
    if sorted(order) != list(range(len(grid))):
        raise InvalidInputError(f"a token order must list each of the grid's {len(grid)} axes once, got {order}")
    laid = tokens_to_grid(tokens, grid=tuple(grid[axis] for axis in order), prefix=prefix)
    return laid.permute(0, 1, *(2 + order.index(axis) for axis in range(len(grid)))).contiguous()
