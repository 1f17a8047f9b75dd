"""Pure layout functions: turn token sequences and channel-last maps into channel-first grids.

Vision transformers give ``[B, N, D]`` tokens: ``p`` prefix tokens (a class token, a
distillation token, register tokens) followed by the patch tokens in row-major order
(``h * w`` of them for an image, ``t * h * w`` for a video or a volume). Swin-style models
give channel-last maps ``[B, *s, C]``. CAM math needs channel-first grids ``[B, C, *s]``;
these functions do that conversion and nothing else. Every function takes the input's
spatial size with one entry per axis: ``(T,)``, ``(H, W)`` or ``(D, H, W)``.

Which grids fit an input: a grid ``g`` fits the input's size ``S`` when each side is the
input's side divided by a stride, rounded down or up. For an image both sides share one
stride ``s`` (``(floor(H / s), floor(W / s))`` or both ceilings). For a volume or a video
the last two axes share one stride and the first axis (depth or time) has its own, since
video networks stride time and space differently (r3d_18: 8 and 16). A grid fits
*exactly* when every stride divides its side.

Grid inference rule (:func:`infer_token_grid`), for ``N`` tokens:

1. Candidates are ``(p, *g)`` with ``0 <= p <= max_prefix`` and ``prod(g) == N - p``.
2. *Exact* candidates come first; the one with the fewest prefix tokens wins.
3. Otherwise *rounded* candidates are tried, again the fewest prefix tokens first.
4. Among the grids of one prefix count, an image takes the one closest to the input's
   aspect ratio. A volume or video whose tokens fit several grids (``8 x 7 x 7`` and
   ``2 x 14 x 14`` are both 392 tokens of a 16x112x112 clip) is *ambiguous*: it raises
   and asks for the grid, unless only one keeps the aspect ratio of the last two axes.
5. If the number of prefix tokens is known (``prefix=``), only that count is tried.

Channel-last rule (:func:`guess_channels_last`), for a map ``[B, d1, ..., dn+1]`` of an input
with ``n`` spatial axes: it is channel-first when ``(d2, ..., dn+1)`` fits the input and
``(d1, ..., dn)`` does not, channel-last in the opposite case, channel-first (PyTorch's
convention) when neither fits, and *ambiguous* when both fit (e.g. ``C == W`` on a square
input), which raises.
"""

from __future__ import annotations

import functools
import math

from torch import Tensor

from ..errors import InvalidInputError

__all__ = ["channels_last_to_grid", "grid_fits", "guess_channels_last", "infer_token_grid", "tokens_to_grid"]

MAX_PREFIX = 16


_AXES = {1: "(T,)", 2: "(H, W)", 3: "(D, H, W)"}


def _size(input_size: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    if len(input_size) not in _AXES or min(int(side) for side in input_size) < 1:
        raise InvalidInputError(
            f"input_size must be (T,), (H, W) or (D, H, W) with positive sides, got {tuple(input_size)}"
        )
    return tuple(int(side) for side in input_size)


def _sides(side: int, exact: bool) -> dict[int, set[int]]:
    # Every side an integer stride gives, keyed by stride: exact (the stride divides the
    # side), or rounded (floor and ceiling).
    found: dict[int, set[int]] = {}
    for stride in range(1, side + 1):
        if exact:
            if side % stride == 0:
                found[stride] = {side // stride}
        else:
            found[stride] = {side // stride, -(-side // stride)}
    return found


@functools.lru_cache(maxsize=256)
def _grids(size: tuple[int, ...], exact: bool) -> dict[int, tuple[tuple[int, ...], ...]]:
    # Every grid that fits ``size`` (rule in the module docs), keyed by its number of positions.
    found: dict[int, set[tuple[int, ...]]] = {}
    if len(size) == 1:
        planes: set[tuple[int, ...]] = {(t,) for sides in _sides(size[0], exact).values() for t in sides}
    else:
        height, width = size[-2:]
        planes = set()
        for stride in range(1, max(height, width) + 1):
            if exact:
                pairs = [(height // stride, width // stride)] if height % stride == 0 and width % stride == 0 else []
            else:
                pairs = [(height // stride, width // stride), (-(-height // stride), -(-width // stride))]
            planes.update((h, w) for h, w in pairs if h >= 1 and w >= 1)
        if len(size) == 3:
            depths = {d for sides in _sides(size[0], exact).values() for d in sides if d >= 1}
            planes = {(d, *plane) for d in depths for plane in planes}
    for grid in planes:
        if min(grid) >= 1:
            found.setdefault(math.prod(grid), set()).add(grid)
    return {count: tuple(sorted(grids)) for count, grids in found.items()}


def _grid_fits(grid: tuple[int, ...], size: tuple[int, ...]) -> bool:
    return len(grid) == len(size) and grid in _grids(size, False).get(math.prod(grid), ())


def grid_fits(grid: tuple[int, ...] | list[int], input_size: tuple[int, ...] | list[int]) -> bool:
    """Whether a layer's grid (one side per spatial axis) fits the input (rule in the module docs).

    Example:
        >>> from camkit.functional import grid_fits
        >>> grid_fits((7, 7), (224, 224)), grid_fits((2, 7, 7), (16, 112, 112)), grid_fits((62,), (64,))
        (True, True, False)
    """
    return _grid_fits(tuple(int(g) for g in grid), _size(input_size))


def _pick(fits: tuple[tuple[int, ...], ...], size: tuple[int, ...]) -> tuple[int, ...] | None:
    # The grid closest to the input's aspect ratio (of its last two axes); None when that
    # leaves several grids (a volume whose depth could take more or fewer of the tokens).
    if len(size) == 1:
        return fits[0] if len(fits) == 1 else None
    target = math.log(size[-2] / size[-1])
    best = min(abs(math.log(g[-2] / g[-1]) - target) for g in fits)
    closest = [g for g in fits if abs(math.log(g[-2] / g[-1]) - target) == best]
    if len(size) == 2:
        return closest[0]  # images: the first of equally close grids, as always
    return closest[0] if len(closest) == 1 else None


def infer_token_grid(
    num_tokens: int, input_size: tuple[int, ...], *, prefix: int | None = None, max_prefix: int = MAX_PREFIX
) -> tuple[int, ...]:
    """Find ``(prefix, *grid)`` for ``num_tokens`` tokens of an input (rule in the module docs).

    Args:
        num_tokens: N, the token count of the layer's output.
        input_size: the input's spatial size, ``(T,)``, ``(H, W)`` or ``(D, H, W)``.
        prefix: the number of leading non-patch tokens, when known; ``None`` infers it.
        max_prefix: the largest prefix count tried when inferring.

    Returns:
        ``(prefix, h, w)`` for an image (``(prefix, t)``, ``(prefix, d, h, w)`` for the other
        ranks) with ``prefix + prod(grid) == num_tokens``.

    Example:
        >>> from camkit.functional import infer_token_grid
        >>> infer_token_grid(197, (224, 224))        # class token + 14 x 14 patches
        (1, 14, 14)
        >>> infer_token_grid(1 + 4 + 12 * 18, (192, 288))  # class + 4 registers, non-square
        (5, 12, 18)
        >>> infer_token_grid(1 + 8 * 14 * 14, (16, 224, 224), prefix=1)  # a video
        Traceback (most recent call last):
        ...
        camkit.errors.InvalidInputError: 1569 tokens of the 16x224x224 input fit several grids with 1 prefix token(s): 2x28x28, 8x14x14; pass reshape= a callable that turns the layer's output into [B, C, d, h, w], e.g. lambda t: camkit.functional.tokens_to_grid(t, grid=(d, h, w), prefix=p).
    """
    size = _size(input_size)
    counts = [prefix] if prefix is not None else list(range(min(max_prefix, num_tokens - 1) + 1))
    letters = {1: "t", 2: "h, w", 3: "d, h, w"}[len(size)]
    shape = {1: "[B, C, t]", 2: "[B, C, h, w]", 3: "[B, C, d, h, w]"}[len(size)]
    fix = (
        f"pass reshape= a callable that turns the layer's output into {shape}, e.g. "
        f"lambda t: camkit.functional.tokens_to_grid(t, grid=({letters}), prefix=p)."
    )
    for exact in (True, False):
        grids = _grids(size, exact)
        for p in counts:
            fits = grids.get(num_tokens - p, ()) if p >= 0 else ()
            if fits:
                grid = _pick(fits, size)
                if grid is None:
                    shown = ", ".join("x".join(map(str, g)) for g in fits)
                    raise InvalidInputError(
                        f"{num_tokens} tokens of the {'x'.join(map(str, size))} input fit several grids with {p} "
                        f"prefix token(s): {shown}; {fix}"
                    )
                return (p, *grid)
    tried = f"prefix={prefix}" if prefix is not None else f"0 to {counts[-1] if counts else 0} prefix tokens"
    raise InvalidInputError(
        f"cannot arrange {num_tokens} tokens into a grid matching the {'x'.join(map(str, size))} input "
        f"(tried {tried}); {fix}"
    )


def tokens_to_grid(
    tokens: Tensor,
    input_size: tuple[int, ...] | None = None,
    *,
    prefix: int | None = None,
    grid: tuple[int, ...] | None = None,
) -> Tensor:
    """Turn tokens [B, N, D] into a channel-first grid [B, D, *g], dropping prefix tokens.

    Patch tokens are read in row-major order after the ``prefix`` leading tokens (for a
    video: all of frame 0's patches, then frame 1's). The result is a new view-free tensor;
    ``tokens`` is never modified.

    Args:
        tokens: [B, N, D] layer output.
        input_size: the input's spatial size, used to infer the grid (and the prefix count
            when ``prefix`` is None); not needed when ``grid`` is given.
        prefix: leading non-patch tokens (class, distillation, registers); ``None`` infers it.
        grid: the grid when known, one side per spatial axis (``(h, w)``, ``(t, h, w)``);
            the prefix is then ``N - prod(grid)`` unless given.

    Example:
        >>> import torch
        >>> from camkit.functional import tokens_to_grid
        >>> t = torch.arange(7.0).view(1, 7, 1)   # token 0 is a class token, then 2 x 3 patches
        >>> tokens_to_grid(t, (20, 30))[0, 0]
        tensor([[1., 2., 3.],
                [4., 5., 6.]])
        >>> tokens_to_grid(torch.zeros(2, 8 * 7 * 7, 96), grid=(8, 7, 7)).shape
        torch.Size([2, 96, 8, 7, 7])
    """
    if tokens.dim() != 3:
        raise InvalidInputError(f"tokens must be [B, N, D], got shape {list(tokens.shape)}")
    n = tokens.shape[1]
    if grid is not None:
        sides = tuple(int(g) for g in grid)
        if not 1 <= len(sides) <= 3:
            raise InvalidInputError(f"grid must have one side per spatial axis (1 to 3), got {tuple(grid)}")
        count = math.prod(sides)
        p = n - count if prefix is None else prefix
        if p < 0 or p + count != n:
            raise InvalidInputError(
                f"grid {'x'.join(map(str, sides))} with {p} prefix tokens needs {count + max(p, 0)} tokens, got {n}"
            )
    elif input_size is None:
        raise InvalidInputError("tokens_to_grid needs input_size (the input's spatial size) or grid=")
    else:
        p, *rest = infer_token_grid(n, input_size, prefix=prefix)
        sides = tuple(rest)
    k = len(sides)
    return tokens[:, p:].reshape(tokens.shape[0], *sides, tokens.shape[2]).permute(0, k + 1, *range(1, k + 1)).contiguous()


def channels_last_to_grid(maps: Tensor) -> Tensor:
    """[B, *s, C] to [B, C, *s] (a contiguous copy; ``maps`` is not modified).

    Example:
        >>> import torch
        >>> from camkit.functional import channels_last_to_grid
        >>> channels_last_to_grid(torch.zeros(2, 7, 5, 96)).shape
        torch.Size([2, 96, 7, 5])
        >>> channels_last_to_grid(torch.zeros(2, 8, 7, 7, 96)).shape
        torch.Size([2, 96, 8, 7, 7])
    """
    if not 3 <= maps.dim() <= 5:
        raise InvalidInputError(f"channel-last maps must be [B, *s, C] with 1 to 3 axes in s, got shape {list(maps.shape)}")
    k = maps.dim() - 2
    return maps.permute(0, k + 1, *range(1, k + 1)).contiguous()


def guess_channels_last(shape: tuple[int, ...] | list[int], input_size: tuple[int, ...]) -> bool:
    """Decide from shapes alone whether a map [B, d1, ..., dn+1] is channel-last (rule in the module docs).

    ``input_size`` has ``n`` sides, so the map has ``n + 2`` dimensions.

    Raises:
        InvalidInputError: when both layouts fit the input's grid; pass ``reshape=``.

    Example:
        >>> from camkit.functional import guess_channels_last
        >>> guess_channels_last((1, 7, 7, 768), (224, 224)), guess_channels_last((1, 512, 7, 7), (224, 224))
        (True, False)
        >>> guess_channels_last((1, 512, 2, 7, 7), (16, 112, 112))
        False
    """
    size = _size(input_size)
    if len(shape) != len(size) + 2:
        letters = {1: "[B, d1, d2]", 2: "[B, d1, d2, d3]", 3: "[B, d1, d2, d3, d4]"}[len(size)]
        raise InvalidInputError(
            f"expected a {len(size) + 2}-D shape {letters} for a {len(size)}-D input, got {list(shape)}"
        )
    dims = tuple(int(s) for s in shape)
    first = _grid_fits(dims[2:], size)
    last = _grid_fits(dims[1:-1], size)
    if first and last:
        axes = {1: "T", 2: "H, W", 3: "D, H, W"}[len(size)]
        order = ", ".join(str(i) for i in (0, len(size) + 1, *range(1, len(size) + 1)))
        raise InvalidInputError(
            f"the layer output {list(shape)} on a {'x'.join(map(str, size))} input fits both [B, C, {axes}] and "
            f"[B, {axes}, C]; pass reshape= to say which, e.g. reshape=lambda t: t.permute({order}) "
            "for channel-last or reshape=lambda t: t for channel-first."
        )
    return last
