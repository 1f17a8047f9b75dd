"""Pure layout functions: turn token sequences and channel-last maps into [B, C, h, w] grids.

Vision transformers give ``[B, N, D]`` tokens: ``p`` prefix tokens (a class token, a
distillation token, register tokens) followed by ``h * w`` patch tokens in row-major
order. Swin-style models give channel-last maps ``[B, h, w, C]``. CAM math needs
channel-first grids ``[B, C, h, w]``; these functions do that conversion and nothing else.

Grid inference rule (:func:`infer_token_grid`), for ``N`` tokens and an input of size
``H x W``:

1. Candidates are ``(p, h, w)`` with ``0 <= p <= max_prefix`` and ``h * w == N - p``.
2. *Exact* candidates keep the input's aspect ratio exactly (``h * W == w * H``); the one
   with the fewest prefix tokens wins.
3. Otherwise *rounded* candidates are tried: ``h`` and ``w`` must be ``H / s`` and
   ``W / s`` for one common patch stride ``s``, both rounded down or both rounded up
   (inputs whose sides are not multiples of the patch size). Again the fewest prefix tokens win, and among
   those the grid closest to the input's aspect ratio.
4. If the number of prefix tokens is known (``prefix=``), only that count is tried.

Channel-last rule (:func:`guess_channels_last`), for a 4-D ``[B, d1, d2, d3]`` map: it is
channel-first when ``(d2, d3)`` fits the input and ``(d1, d2)`` does not,
channel-last in the opposite case, channel-first (PyTorch's convention) when neither fits,
and *ambiguous* when both fit (e.g. ``C == W`` on a square input), which raises.
"""

from __future__ import annotations

import functools
import math

from torch import Tensor

from ..errors import InvalidInputError

__all__ = ["channels_last_to_grid", "guess_channels_last", "infer_token_grid", "tokens_to_grid"]

MAX_PREFIX = 16


def _size(input_size: tuple[int, int] | list[int]) -> tuple[int, int]:
    if len(input_size) != 2 or min(int(input_size[0]), int(input_size[1])) < 1:
        raise InvalidInputError(f"input_size must be (H, W) with positive sides, got {tuple(input_size)}")
    return int(input_size[0]), int(input_size[1])


@functools.lru_cache(maxsize=256)
def _grids(height: int, width: int, exact: bool) -> dict[int, tuple[tuple[int, int], ...]]:
    # Every grid an integer patch stride s gives: exact (s divides both sides), or rounded
    # (floor(H/s), floor(W/s)) and (ceil(H/s), ceil(W/s)).
    found: dict[int, set[tuple[int, int]]] = {}
    for stride in range(1, max(height, width) + 1):
        if exact:
            grids = [(height // stride, width // stride)] if height % stride == 0 and width % stride == 0 else []
        else:
            grids = [(height // stride, width // stride), (-(-height // stride), -(-width // stride))]
        for h, w in grids:
            if h >= 1 and w >= 1:
                found.setdefault(h * w, set()).add((h, w))
    return {count: tuple(sorted(grids)) for count, grids in found.items()}


def _grid_fits(h: int, w: int, height: int, width: int) -> bool:
    return (h, w) in _grids(height, width, False).get(h * w, ())


def infer_token_grid(
    num_tokens: int, input_size: tuple[int, int], *, prefix: int | None = None, max_prefix: int = MAX_PREFIX
) -> tuple[int, int, int]:
    """Find ``(prefix, h, w)`` for ``num_tokens`` tokens of an ``H x W`` input (rule in the module docs).

    Args:
        num_tokens: N, the token count of the layer's output.
        input_size: the input image's ``(H, W)``.
        prefix: the number of leading non-patch tokens, when known; ``None`` infers it.
        max_prefix: the largest prefix count tried when inferring.

    Returns:
        ``(prefix, h, w)`` with ``prefix + h * w == num_tokens``.

    Example:
        >>> from camkit.functional import infer_token_grid
        >>> infer_token_grid(197, (224, 224))        # class token + 14 x 14 patches
        (1, 14, 14)
        >>> infer_token_grid(1 + 4 + 12 * 18, (192, 288))  # class + 4 registers, non-square
        (5, 12, 18)
    """
    height, width = _size(input_size)
    counts = [prefix] if prefix is not None else list(range(min(max_prefix, num_tokens - 1) + 1))
    target = math.log(height / width)
    for exact in (True, False):
        grids = _grids(height, width, exact)
        for p in counts:
            fits = grids.get(num_tokens - p, ()) if p >= 0 else ()
            if fits:
                h, w = min(fits, key=lambda hw: abs(math.log(hw[0] / hw[1]) - target))
                return p, h, w
    tried = f"prefix={prefix}" if prefix is not None else f"0 to {counts[-1] if counts else 0} prefix tokens"
    raise InvalidInputError(
        f"cannot arrange {num_tokens} tokens into a grid matching the {height}x{width} input (tried {tried}); "
        "pass reshape= a callable that turns the layer's output into [B, C, h, w], e.g. "
        "lambda t: camkit.functional.tokens_to_grid(t, grid=(h, w), prefix=p)."
    )


def tokens_to_grid(
    tokens: Tensor,
    input_size: tuple[int, int] | None = None,
    *,
    prefix: int | None = None,
    grid: tuple[int, int] | None = None,
) -> Tensor:
    """Turn tokens [B, N, D] into a channel-first grid [B, D, h, w], dropping prefix tokens.

    Patch tokens are read in row-major order after the ``prefix`` leading tokens. The
    result is a new view-free tensor; ``tokens`` is never modified.

    Args:
        tokens: [B, N, D] layer output.
        input_size: the input image's ``(H, W)``, used to infer the grid (and the prefix
            count when ``prefix`` is None); not needed when ``grid`` is given.
        prefix: leading non-patch tokens (class, distillation, registers); ``None`` infers it.
        grid: ``(h, w)`` when known; the prefix is then ``N - h * w`` unless given.

    Example:
        >>> import torch
        >>> from camkit.functional import tokens_to_grid
        >>> t = torch.arange(7.0).view(1, 7, 1)   # token 0 is a class token, then 2 x 3 patches
        >>> tokens_to_grid(t, (20, 30))[0, 0]
        tensor([[1., 2., 3.],
                [4., 5., 6.]])
    """
    if tokens.dim() != 3:
        raise InvalidInputError(f"tokens must be [B, N, D], got shape {list(tokens.shape)}")
    n = tokens.shape[1]
    if grid is not None:
        h, w = int(grid[0]), int(grid[1])
        p = n - h * w if prefix is None else prefix
        if p < 0 or p + h * w != n:
            raise InvalidInputError(
                f"grid {h}x{w} with {p} prefix tokens needs {h * w + max(p, 0)} tokens, got {n}"
            )
    elif input_size is None:
        raise InvalidInputError("tokens_to_grid needs input_size=(H, W) or grid=(h, w)")
    else:
        p, h, w = infer_token_grid(n, input_size, prefix=prefix)
    return tokens[:, p:].reshape(tokens.shape[0], h, w, tokens.shape[2]).permute(0, 3, 1, 2).contiguous()


def channels_last_to_grid(maps: Tensor) -> Tensor:
    """[B, h, w, C] to [B, C, h, w] (a contiguous copy; ``maps`` is not modified).

    Example:
        >>> import torch
        >>> from camkit.functional import channels_last_to_grid
        >>> channels_last_to_grid(torch.zeros(2, 7, 5, 96)).shape
        torch.Size([2, 96, 7, 5])
    """
    if maps.dim() != 4:
        raise InvalidInputError(f"channel-last maps must be [B, h, w, C], got shape {list(maps.shape)}")
    return maps.permute(0, 3, 1, 2).contiguous()


def guess_channels_last(shape: tuple[int, ...] | list[int], input_size: tuple[int, int]) -> bool:
    """Decide from shapes alone whether a 4-D map [B, d1, d2, d3] is channel-last (rule in the module docs).

    Raises:
        InvalidInputError: when both layouts fit the input's grid; pass ``reshape=``.

    Example:
        >>> from camkit.functional import guess_channels_last
        >>> guess_channels_last((1, 7, 7, 768), (224, 224)), guess_channels_last((1, 512, 7, 7), (224, 224))
        (True, False)
    """
    if len(shape) != 4:
        raise InvalidInputError(f"expected a 4-D shape [B, d1, d2, d3], got {list(shape)}")
    height, width = _size(input_size)
    _, d1, d2, d3 = (int(s) for s in shape)
    first = _grid_fits(d2, d3, height, width)
    last = _grid_fits(d1, d2, height, width)
    if first and last:
        raise InvalidInputError(
            f"the layer output {list(shape)} on a {height}x{width} input fits both [B, C, H, W] and "
            "[B, H, W, C]; pass reshape= to say which, e.g. reshape=lambda t: t.permute(0, 3, 1, 2) "
            "for channel-last or reshape=lambda t: t for channel-first."
        )
    return last
